//! Guest users, read straight from the guest's `/etc/passwd` and `/etc/group` (no NSS: the
//! agent is a static binary and the image is whatever the user brought).

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Largest passwd or group file read; bigger ones are refused, not truncated.
const MAX_DB_FILE: u64 = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("error looking up user '{0}': user: unknown user {0}")]
    Unknown(String),
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} is larger than {MAX_DB_FILE} bytes")]
    TooLarge { path: PathBuf },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    /// The login shell (`/bin/sh` when passwd leaves it empty, as login(1) does).
    pub shell: PathBuf,
    /// Supplementary groups (from /etc/group), the primary group first.
    pub groups: Vec<u32>,
}

/// Where the user databases live (`/etc` in a guest; a test directory in tests).
#[derive(Debug, Clone)]
pub struct UserDb {
    dir: PathBuf,
}

/// One parsed snapshot of passwd and group, for lookups in bulk (ListDir owners).
#[derive(Debug, Default)]
pub struct Snapshot {
    users: Vec<PasswdLine>,
    groups: Vec<GroupLine>,
}

#[derive(Debug, Clone)]
struct PasswdLine {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
    shell: String,
}

#[derive(Debug, Clone)]
struct GroupLine {
    name: String,
    gid: u32,
    members: Vec<String>,
}

impl UserDb {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        UserDb { dir: dir.into() }
    }

    pub fn snapshot(&self) -> Result<Snapshot, UserError> {
        let passwd = read_capped(&self.dir.join("passwd"))?;
        // A missing group file only costs supplementary groups and names.
        let group = match read_capped(&self.dir.join("group")) {
            Ok(s) => s,
            Err(UserError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                String::new()
            }
            Err(e) => return Err(e),
        };
        Ok(Snapshot {
            users: passwd.lines().filter_map(parse_passwd).collect(),
            groups: group.lines().filter_map(parse_group).collect(),
        })
    }

    pub fn lookup(&self, name: &str) -> Result<User, UserError> {
        self.snapshot()?.user(name)
    }
}

impl Snapshot {
    pub fn user(&self, name: &str) -> Result<User, UserError> {
        let line = self
            .users
            .iter()
            .find(|u| u.name == name)
            .ok_or_else(|| UserError::Unknown(name.to_owned()))?;
        Ok(self.user_of(line))
    }

    /// The first passwd entry with this uid (as getpwuid).
    pub fn user_by_uid(&self, uid: u32) -> Result<User, UserError> {
        let line = self
            .users
            .iter()
            .find(|u| u.uid == uid)
            .ok_or_else(|| UserError::Unknown(format!("#{uid}")))?;
        Ok(self.user_of(line))
    }

    /// The gid of a group by name.
    pub fn group_gid(&self, name: &str) -> Option<u32> {
        self.groups.iter().find(|g| g.name == name).map(|g| g.gid)
    }

    fn user_of(&self, line: &PasswdLine) -> User {
        let mut groups = vec![line.gid];
        for g in &self.groups {
            if g.members.contains(&line.name) && !groups.contains(&g.gid) {
                groups.push(g.gid);
            }
        }
        let shell = if line.shell.is_empty() {
            "/bin/sh"
        } else {
            &line.shell
        };
        User {
            name: line.name.clone(),
            uid: line.uid,
            gid: line.gid,
            home: PathBuf::from(&line.home),
            shell: PathBuf::from(shell),
            groups,
        }
    }

    /// Name lookups for every uid/gid, built once.
    pub fn names(&self) -> Names {
        let mut names = Names::default();
        for u in self.users.iter().rev() {
            names.users.insert(u.uid, u.name.clone());
        }
        for g in self.groups.iter().rev() {
            names.groups.insert(g.gid, g.name.clone());
        }
        names
    }
}

/// uid and gid to names; numbers as text when unknown.
#[derive(Debug, Default, Clone)]
pub struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    pub fn owner(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    pub fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

fn read_capped(path: &Path) -> Result<String, UserError> {
    let err = |source| UserError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(err)?;
    let mut text = String::new();
    file.take(MAX_DB_FILE + 1)
        .read_to_string(&mut text)
        .map_err(err)?;
    if text.len() as u64 > MAX_DB_FILE {
        return Err(UserError::TooLarge {
            path: path.to_owned(),
        });
    }
    Ok(text)
}

/// `name:password:uid:gid:gecos:home:shell`; comments and malformed lines are skipped.
fn parse_passwd(line: &str) -> Option<PasswdLine> {
    if line.starts_with('#') {
        return None;
    }
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 || f[0].is_empty() {
        return None;
    }
    Some(PasswdLine {
        name: f[0].to_owned(),
        uid: f[2].parse().ok()?,
        gid: f[3].parse().ok()?,
        home: f[5].to_owned(),
        shell: f[6].to_owned(),
    })
}

/// `name:password:gid:member,member`.
fn parse_group(line: &str) -> Option<GroupLine> {
    if line.starts_with('#') {
        return None;
    }
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 4 || f[0].is_empty() {
        return None;
    }
    Some(GroupLine {
        name: f[0].to_owned(),
        gid: f[2].parse().ok()?,
        members: f[3]
            .split(',')
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_passwd_and_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("passwd"),
            "# comment\nroot:x:0:0:root:/root:/bin/sh\nbroken\nuser:x:1000:1000::/home/user:/bin/bash\n",
        )
        .expect("write passwd");
        std::fs::write(
            dir.path().join("group"),
            "root:x:0:\nuser:x:1000:\nwheel:x:10:user,other\n",
        )
        .expect("write group");
        let db = UserDb::new(dir.path());
        let user = db.lookup("user").expect("user");
        assert_eq!((user.uid, user.gid), (1000, 1000));
        assert_eq!(user.home, PathBuf::from("/home/user"));
        assert_eq!(user.groups, vec![1000, 10]);
        assert!(matches!(db.lookup("nobody"), Err(UserError::Unknown(_))));
        let snap = db.snapshot().expect("snapshot");
        let names = snap.names();
        assert_eq!(names.owner(1000), "user");
        assert_eq!(names.group(10), "wheel");
        assert_eq!(names.owner(4242), "4242");
    }
}
