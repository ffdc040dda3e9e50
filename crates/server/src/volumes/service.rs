//! The volumes of each key: rows (store/volumes.rs), their filesystems (juicefs.rs) and
//! the rules. A volume is its key's alone (another key gets 404, as for a name that does
//! not exist); it is deleted only while no live sandbox mounts it (409); a sandbox's mounts
//! are checked and recorded before it boots.

use super::juicefs::{Juicefs, JuicefsError};
use crate::error::Error;
use crate::store::Db;
use crate::store::volumes::{MountRow, VolumeRow};
use crate::util::{now_ms, random_hex};
use sandcell_runtime::VolumeBind;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Most volumes one sandbox mounts.
pub const MAX_MOUNTS: usize = 8;
/// Where no volume may go: the sandbox's own system mounts and the agent's socket.
const RESERVED: &[&str] = &["/proc", "/dev", "/sys", "/run/sandcell-host"];

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error(
        "volumes are disabled on this daemon: start `sandcell serve` with --s3-endpoint and \
         --s3-bucket (and --s3-access-key-file/--s3-secret-key-file)"
    )]
    Disabled,
    #[error("invalid volume name {0:?}: 1 to 64 of [A-Za-z0-9_-]")]
    InvalidName(String),
    #[error("volume {0:?} doesn't exist or you don't have access to it")]
    NotFound(String),
    #[error("a volume named {0:?} exists already")]
    Exists(String),
    #[error("volume {id} is mounted by sandbox(es) {}: kill them first", .sandboxes.join(", "))]
    InUse { id: String, sandboxes: Vec<String> },
    /// The content API's bearer token is missing or not this volume's.
    #[error(
        "missing or invalid volume token (Authorization: Bearer <token from GET /volumes/{{id}}>)"
    )]
    Unauthorized,
    #[error("invalid volumeMounts: {0}")]
    InvalidMount(String),
    /// An operation the sandbox's volumes rule out (pause, snapshot, fork).
    #[error("{0}")]
    Refused(String),
    /// The bucket or the JuiceFS client failed.
    #[error("volume storage: {0}")]
    Storage(#[from] JuicefsError),
    #[error(transparent)]
    Host(#[from] Error),
}

/// One `volumeMounts` entry of a create.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::ToSchema)]
pub struct VolumeMount {
    /// The volume's name (or id).
    pub name: String,
    /// Absolute path in the sandbox.
    pub path: String,
}

pub struct Volumes {
    db: Db,
    /// `None`: volumes are off (no bucket configured).
    fs: Option<Juicefs>,
    /// One lock per volume, so that two creates never mount it twice at once.
    mounting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A mount path: absolute, plain components only (no `.`, `..`, empty parts), not `/`, not
/// on or under a reserved path.
fn check_path(path: &str) -> Result<(), VolumeError> {
    let bad = |why: &str| VolumeError::InvalidMount(format!("path {path:?} {why}"));
    if !path.starts_with('/') || path.len() > 1024 {
        return Err(bad("must be an absolute path (at most 1024 bytes)"));
    }
    let parts: Vec<&str> = path[1..].split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == ".." || p.contains('\0'))
    {
        return Err(bad(
            "must be a plain path below / (no empty, . or .. parts)",
        ));
    }
    for r in RESERVED {
        if path == *r || path.starts_with(&format!("{r}/")) {
            return Err(bad(&format!("is on the sandbox's own {r}")));
        }
    }
    Ok(())
}

impl Volumes {
    pub fn new(db: Db, fs: Option<Juicefs>) -> Volumes {
        Volumes {
            db,
            fs,
            mounting: Mutex::new(HashMap::new()),
        }
    }

    fn fs(&self) -> Result<&Juicefs, VolumeError> {
        self.fs.as_ref().ok_or(VolumeError::Disabled)
    }

    /// A new volume of `key_id`: its row, then its filesystem in the bucket (the row goes
    /// again when that fails).
    pub async fn create(&self, key_id: &str, name: &str) -> Result<VolumeRow, VolumeError> {
        let fs = self.fs()?;
        if !valid_name(name) {
            return Err(VolumeError::InvalidName(name.to_string()));
        }
        let random = |n| random_hex(n).map_err(Error::io("getrandom for a volume"));
        let row = VolumeRow {
            id: format!("vol-{}", random(8)?),
            key_id: key_id.to_string(),
            name: name.to_string(),
            token: random(24)?,
            created_at: now_ms(),
        };
        if !self.db.insert_volume(&row).await? {
            return Err(VolumeError::Exists(name.to_string()));
        }
        if let Err(e) = fs.format(&row.id).await {
            let _ = self.db.delete_volume_unless_mounted(&row.id).await;
            // The local files go; a format that failed halfway may leave its few setting
            // objects under the prefix in the bucket (logged by the error).
            if let Err(e) = fs.remove_local(&row.id) {
                tracing::warn!("volume {}: {e}", row.id);
            }
            return Err(e.into());
        }
        tracing::info!("volume {} ({name}) created", row.id);
        Ok(row)
    }

    pub async fn get(&self, key_id: &str, id: &str) -> Result<VolumeRow, VolumeError> {
        self.fs()?;
        self.db
            .volume(key_id, id)
            .await?
            .ok_or_else(|| VolumeError::NotFound(id.to_string()))
    }

    pub async fn list(&self, key_id: &str) -> Result<Vec<VolumeRow>, VolumeError> {
        self.fs()?;
        Ok(self.db.volumes_of(key_id).await?)
    }

    /// Deletes the key's volume, its objects in the bucket and its local files; 409 while a
    /// live sandbox mounts it.
    pub async fn delete(&self, key_id: &str, id: &str) -> Result<(), VolumeError> {
        let row = self.get(key_id, id).await?;
        let in_use = || async {
            let sandboxes = self.db.volume_users(&row.id).await?;
            Ok::<_, VolumeError>(VolumeError::InUse {
                id: row.id.clone(),
                sandboxes,
            })
        };
        if !self.db.volume_users(&row.id).await?.is_empty() {
            return Err(in_use().await?);
        }
        let lock = self.lock_of(&row.id);
        let _held = lock.lock().await;
        if !self.db.delete_volume_unless_mounted(&row.id).await? {
            return Err(in_use().await?);
        }
        if let Err(e) = self.fs()?.destroy(&row.id).await {
            // The row is gone: the objects left are the operator's to remove.
            tracing::error!("volume {} deleted, but its storage was not: {e}", row.id);
        }
        tracing::info!("volume {} ({}) deleted", row.id, row.name);
        Ok(())
    }

    /// Checks a create's `volumeMounts` for `key_id`: each volume the key's, each path
    /// valid, no path or volume twice.
    pub async fn resolve_mounts(
        &self,
        key_id: &str,
        mounts: &[VolumeMount],
    ) -> Result<Vec<MountRow>, VolumeError> {
        if mounts.is_empty() {
            return Ok(Vec::new());
        }
        self.fs()?;
        if mounts.len() > MAX_MOUNTS {
            return Err(VolumeError::InvalidMount(format!(
                "at most {MAX_MOUNTS} volumes a sandbox"
            )));
        }
        let (mut paths, mut ids) = (BTreeSet::new(), BTreeSet::new());
        let mut rows = Vec::with_capacity(mounts.len());
        for m in mounts {
            check_path(&m.path)?;
            let vol = self
                .db
                .volume(key_id, &m.name)
                .await?
                .ok_or_else(|| VolumeError::NotFound(m.name.clone()))?;
            if !paths.insert(m.path.clone()) {
                return Err(VolumeError::InvalidMount(format!(
                    "path {:?} twice",
                    m.path
                )));
            }
            if !ids.insert(vol.id.clone()) {
                return Err(VolumeError::InvalidMount(format!(
                    "volume {:?} twice",
                    m.name
                )));
            }
            rows.push(MountRow {
                volume_id: vol.id,
                name: vol.name,
                path: m.path.clone(),
            });
        }
        Ok(rows)
    }

    /// Mounts (on the host, once) the volumes of `mounts`: what the runtime binds in.
    pub async fn bind(&self, mounts: &[MountRow]) -> Result<Vec<VolumeBind>, VolumeError> {
        let mut binds = Vec::with_capacity(mounts.len());
        for m in mounts {
            let lock = self.lock_of(&m.volume_id);
            let _held = lock.lock().await;
            let host = self.fs()?.mount(&m.volume_id).await?;
            binds.push(VolumeBind {
                host,
                guest: m.path.clone(),
            });
        }
        Ok(binds)
    }

    /// On daemon shutdown, once nothing serves requests: unmounts every volume no live
    /// sandbox mounts (those the content API mounted, and all of them after
    /// `--kill-on-exit`), so no JuiceFS process outlives the daemon holding a volume nobody
    /// uses. Volumes of sandboxes left running stay mounted for them. Failures are logged:
    /// shutdown goes on.
    pub async fn unmount_unused(&self) {
        let Some(fs) = self.fs.as_ref() else {
            return;
        };
        for id in fs.mounted() {
            let lock = self.lock_of(&id);
            let _held = lock.lock().await;
            match self.db.volume_users(&id).await {
                Ok(users) if users.is_empty() => match fs.unmount(&id).await {
                    Ok(()) => tracing::info!(volume = %id, "unmounted at shutdown"),
                    Err(e) => tracing::warn!("shutdown: {e}"),
                },
                Ok(users) => tracing::info!(
                    volume = %id,
                    "stays mounted for {} running sandbox(es)",
                    users.len()
                ),
                Err(e) => tracing::warn!("shutdown: volume {id} stays mounted: {e}"),
            }
        }
    }

    /// Whether the sandbox mounts volumes (pause, snapshots and forks refuse those).
    pub async fn refuse_if_mounted(&self, sandbox_id: &str, op: &str) -> Result<(), VolumeError> {
        let mounts = self.db.sandbox_volumes(sandbox_id).await?;
        if mounts.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = mounts.iter().map(|m| m.name.as_str()).collect();
        Err(VolumeError::Refused(format!(
            "sandbox {sandbox_id} mounts volume(s) {}: {op} of a sandbox with volumes is not \
             supported (a snapshot would not hold the volume's content; docs/volumes.md)",
            names.join(", ")
        )))
    }

    /// The content API's volume: `token` must be its content token; it is mounted (once)
    /// and its data directory returned.
    pub async fn content_dir(
        &self,
        id: &str,
        token: &str,
    ) -> Result<std::path::PathBuf, VolumeError> {
        let fs = self.fs()?;
        let row = self
            .db
            .volume_by_id(id)
            .await?
            .filter(|v| crate::util::constant_time_eq(v.token.as_bytes(), token.as_bytes()))
            .ok_or(VolumeError::Unauthorized)?;
        let lock = self.lock_of(&row.id);
        let _held = lock.lock().await;
        // Deleted while we waited: its row is gone.
        if self.db.volume_by_id(&row.id).await?.is_none() {
            return Err(VolumeError::Unauthorized);
        }
        Ok(fs.mount(&row.id).await?)
    }

    fn lock_of(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.mounting.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(id.to_string()).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths_are_checked() {
        assert!(valid_name("my-vol_1"));
        assert!(!valid_name(""));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(&"x".repeat(65)));
        assert!(check_path("/mnt/data").is_ok());
        assert!(check_path("/home/user/work").is_ok());
        for bad in [
            "/",
            "mnt",
            "/mnt/",
            "/mnt//x",
            "/mnt/./x",
            "/a/../b",
            "/proc",
            "/proc/x",
            "/dev/shm",
            "/sys",
            "/run/sandcell-host",
            "/run/sandcell-host/x",
        ] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        assert!(check_path("/procx").is_ok());
    }
}
