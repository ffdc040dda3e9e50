//! The installed images, `<data-dir>/images/<name>/`: listing, removal and replacement
//! (both refused while a process, i.e. a sandbox's runsc gofer or VMM, has something of the
//! image open), and the agent to put into new ones.

use crate::build::AGENT_PATH;
use crate::cache::unique;
use crate::{Error, IMAGE_CONFIG_FILE, ImageDefaults, Result, valid_name};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageInfo {
    pub name: String,
    pub has_tree: bool,
    pub ext4_bytes: Option<u64>,
    /// Only images made from OCI have one.
    pub config: Option<ImageDefaults>,
}

/// Every image directory (hidden build directories left out), by name.
pub fn list(data_dir: &Path) -> Result<Vec<ImageInfo>> {
    let images = data_dir.join("images");
    let listing = match std::fs::read_dir(&images) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("listing", &images)(e)),
    };
    let mut out = Vec::new();
    for entry in listing {
        let entry = entry.map_err(Error::io("listing", &images))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let dir = entry.path();
        if name.starts_with('.') || !dir.is_dir() {
            continue;
        }
        out.push(ImageInfo {
            has_tree: dir.join("rootfs").is_dir(),
            ext4_bytes: std::fs::metadata(dir.join("rootfs.ext4"))
                .ok()
                .map(|m| m.len()),
            config: read_config(&dir),
            name,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// `config.json` of an image directory, if it has a readable one.
pub fn read_config(dir: &Path) -> Option<ImageDefaults> {
    let bytes = std::fs::read(dir.join(IMAGE_CONFIG_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Removes an image; refused while something uses it.
pub fn remove(data_dir: &Path, name: &str) -> Result<()> {
    if !valid_name(name) {
        return Err(Error::InvalidName(name.into()));
    }
    let images = data_dir.join("images");
    let dir = images.join(name);
    if !dir.is_dir() {
        return Err(Error::NotFound(name.into()));
    }
    refuse_if_used(name, &dir)?;
    // Renamed first: a sandbox starting meanwhile finds no image rather than half of one.
    let doomed = images.join(format!(".rm-{name}-{}-{}", std::process::id(), unique()));
    std::fs::rename(&dir, &doomed).map_err(Error::io("moving away", &dir))?;
    std::fs::remove_dir_all(&doomed).map_err(Error::io("removing", &doomed))
}

/// Moves the finished `work` directory in as `images/<name>`, replacing an older one.
pub(crate) fn replace(images: &Path, name: &str, work: &Path) -> Result<()> {
    let dest = images.join(name);
    if !dest.exists() {
        return std::fs::rename(work, &dest)
            .map_err(Error::io("moving the image into place", &dest));
    }
    refuse_if_used(name, &dest)?;
    let old = images.join(format!(".old-{name}-{}-{}", std::process::id(), unique()));
    std::fs::rename(&dest, &old).map_err(Error::io("moving away", &dest))?;
    if let Err(e) = std::fs::rename(work, &dest) {
        let _ = std::fs::rename(&old, &dest);
        return Err(Error::io("moving the image into place", &dest)(e));
    }
    std::fs::remove_dir_all(&old).map_err(Error::io("removing", &old))
}

fn refuse_if_used(name: &str, dir: &Path) -> Result<()> {
    let users = users_of(dir);
    if users.is_empty() {
        Ok(())
    } else {
        Err(Error::InUse {
            name: name.into(),
            users,
        })
    }
}

/// What uses `dir`: overlay mounts with a lower layer under it (the gVisor runtime mounts
/// one per sandbox over the image's tree), and processes with a file descriptor, working
/// directory or root under it (a VMM with the ext4 open). Processes we may not inspect are
/// not seen: run as the daemon's user (root) for a complete answer. Sandboxes paused to
/// disk have neither and are not seen.
pub fn users_of(dir: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return Vec::new();
    };
    let mut users = overlay_mounts_over(&dir);
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return users;
    };
    for proc_entry in procs.flatten() {
        let Some(pid) = proc_entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let base = proc_entry.path();
        let mut links: Vec<PathBuf> = vec![base.join("cwd"), base.join("root")];
        if let Ok(fds) = std::fs::read_dir(base.join("fd")) {
            links.extend(fds.flatten().map(|fd| fd.path()));
        }
        if links
            .iter()
            .filter_map(|l| std::fs::read_link(l).ok())
            .any(|target| target.starts_with(&dir))
        {
            users.push(format!("process {pid}"));
        }
    }
    users
}

/// Mount points of overlays whose `lowerdir` lies under `dir` (from our mountinfo).
fn overlay_mounts_over(dir: &Path) -> Vec<String> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for line in info.lines() {
        // "id parent dev root mount-point options ... - fstype source super-options"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut right = right.split(' ');
        if right.next() != Some("overlay") {
            continue;
        }
        let options = right.nth(1).unwrap_or("");
        let under = options
            .split(',')
            .filter_map(|o| o.strip_prefix("lowerdir="))
            .flat_map(|l| l.split(':'))
            .any(|l| Path::new(&unescape_mountinfo(l)).starts_with(dir));
        if under {
            let point = left.split(' ').nth(4).map(unescape_mountinfo);
            found.push(format!("overlay mount {}", point.unwrap_or_default()));
        }
    }
    found
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` (octal).
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) if bytes[i] == b'\\' => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The agent of an installed image, to put into new ones: `minimal`'s, else `base`'s, else
/// any image's.
pub fn find_agent(data_dir: &Path) -> Result<PathBuf> {
    let images = data_dir.join("images");
    let rel = AGENT_PATH.trim_start_matches('/');
    let mut candidates = vec![
        images.join("minimal/rootfs").join(rel),
        images.join("base/rootfs").join(rel),
    ];
    if let Ok(all) = list(data_dir) {
        candidates.extend(
            all.iter()
                .map(|i| images.join(&i.name).join("rootfs").join(rel)),
        );
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| Error::Agent {
            path: images.join("minimal/rootfs").join(rel),
            problem:
                "no installed image carries the agent; run `make install` or pass --agent PATH"
                    .into(),
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(super::unescape_mountinfo(r"/a\040b\134c"), "/a b\\c");
        assert_eq!(super::unescape_mountinfo(r"/plain\0"), r"/plain\0");
    }
}
