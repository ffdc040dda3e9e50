//! The volumes of each key: rows (store/volumes.rs), their filesystems (juicefs.rs) and
//! the rules. A volume is its key's alone (another key gets 404, as for a name that does
//! not exist); it is deleted only while no live sandbox mounts it (409); a sandbox's mounts
//! are checked and recorded before it boots.

use super::juicefs::{Juicefs, JuicefsError};
use super::shared::{Shared, SharedError};
use crate::error::Error;
use crate::store::Db;
use crate::store::volumes::{MountRow, VolumeRow};
use crate::util::{now_ms, random_hex};
use sandcell_runtime::VolumeBind;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the idle loop looks at the mounted volumes and renews their leases (a third
/// of [`super::shared::LEASE_MS`]).
pub const IDLE_TICK: Duration = Duration::from_secs(20);
/// A mounted volume that no live sandbox mounts and no content call touched for this long
/// is unmounted: its metadata published to the bucket, its lease released, so that another
/// daemon may mount it.
pub const IDLE_UNMOUNT: Duration = Duration::from_secs(60);

/// How long a lease renewal waits for its volume's lock before leaving it to the next tick.
const RENEW_LOCK_WAIT: Duration = Duration::from_secs(5);

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
    /// The volume's lease or published metadata in the bucket (another daemon holds it,
    /// the bucket is unreachable, ...).
    #[error(transparent)]
    Shared(#[from] SharedError),
    /// A renewal found another daemon's lease on a volume mounted here.
    #[error("volume {0}: another daemon took its lease; not mounted here until it is back")]
    LeaseLost(String),
    #[error("volume {0} is registered on this daemon already")]
    AlreadyHere(String),
    /// The key's own bucket (`storage`) is refused or unusable.
    #[error(transparent)]
    OwnStorage(#[from] super::storage::StorageError),
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
    /// The volumes' leases and published metadata; `Some` with `fs`.
    shared: Option<Shared>,
    /// One lock per volume, so that two creates never mount it twice at once.
    mounting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// When each mounted volume was last used (a sandbox mounting it, a content call).
    used: Mutex<HashMap<String, Instant>>,
    /// Volumes unmounted whose metadata is not published yet (the bucket failed): their
    /// lease is kept (renewed) until it is, so no other daemon mounts older metadata.
    unpublished: Mutex<HashSet<String>>,
    /// Volumes whose lease renewal found another daemon's lease: mounts and content calls
    /// are refused here until this daemon holds it again.
    lost: Mutex<HashSet<String>>,
    /// Opens the credentials of volumes in their key's own bucket.
    ring: Option<Arc<crate::secrets::crypto::KeyRing>>,
    /// The client and bucket of each volume in its key's own bucket, once opened.
    own: Mutex<HashMap<String, (Juicefs, Shared)>>,
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
    /// Volumes off (no bucket).
    pub fn off(db: Db) -> Volumes {
        Volumes {
            db,
            fs: None,
            shared: None,
            mounting: Mutex::new(HashMap::new()),
            used: Mutex::new(HashMap::new()),
            unpublished: Mutex::new(HashSet::new()),
            lost: Mutex::new(HashSet::new()),
            ring: None,
            own: Mutex::new(HashMap::new()),
        }
    }

    /// Volumes on the bucket of `fs` (`None`: off); an error when its S3 client cannot be
    /// made.
    pub fn new(db: Db, fs: Option<Juicefs>) -> Result<Volumes, super::config::ConfigError> {
        let shared = fs.as_ref().map(|fs| {
            let daemon = super::shared::daemon_id(fs.root()).unwrap_or_else(|e| {
                // Unwritable data dir: a per-process id still keeps leases apart.
                let id = format!("daemon-{}", std::process::id());
                tracing::warn!(
                    "volumes: keeping no daemon id in {}: {e}; using {id}",
                    fs.root().display()
                );
                id
            });
            Ok::<_, super::bucket::BucketError>(Shared::new(
                super::bucket::Bucket::new(fs.s3())?,
                daemon,
            ))
        });
        Ok(Volumes {
            fs,
            shared: shared.transpose()?,
            ..Volumes::off(db)
        })
    }

    /// The key ring that seals the credentials of volumes in their key's own bucket.
    pub fn with_key_ring(mut self, ring: Arc<crate::secrets::crypto::KeyRing>) -> Volumes {
        self.ring = Some(ring);
        self
    }

    /// The JuiceFS client and bucket of volume `id`: the operator's, or those of the
    /// key's own bucket recorded with it.
    async fn stores(&self, id: &str) -> Result<(Juicefs, Shared), VolumeError> {
        let (fs, shared) = (self.fs()?, self.shared()?);
        if let Some(s) = self.own.lock().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Ok(s.clone());
        }
        let Some(text) = self.db.volume_by_id(id).await?.and_then(|r| r.storage) else {
            return Ok((fs.clone(), shared.clone()));
        };
        let ring = self.ring.as_deref().ok_or_else(|| {
            super::storage::StorageError::Unreadable(format!("{id} (no key ring)"))
        })?;
        let st = super::storage::VolumeStorage::open(ring, id, &text)?;
        let s3 = st.s3_config(fs.s3());
        // Pinned to the addresses checked now (a name that moved to a private address
        // since the volume was made is refused).
        let pins = st.resolve(fs.s3().storage_allow_private).await?;
        let bucket = super::bucket::Bucket::pinned(&s3, &pins).map_err(SharedError::from)?;
        let pair = (
            fs.for_volume(s3, st.info.prefix.clone()),
            shared.for_volume(bucket, st.info.prefix.clone()),
        );
        self.own
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), pair.clone());
        Ok(pair)
    }

    fn fs(&self) -> Result<&Juicefs, VolumeError> {
        self.fs.as_ref().ok_or(VolumeError::Disabled)
    }

    fn shared(&self) -> Result<&Shared, VolumeError> {
        self.shared.as_ref().ok_or(VolumeError::Disabled)
    }

    fn touch(&self, id: &str) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.insert(id.to_string(), Instant::now());
    }

    /// Mounts the volume on this host (its lock held): takes its lease, brings its
    /// metadata from the bucket when this host has none or older, mounts. A volume mounted
    /// already is only marked used (the idle loop renews its lease).
    async fn ensure_mounted(&self, id: &str) -> Result<std::path::PathBuf, VolumeError> {
        let (fs, shared) = self.stores(id).await?;
        if self.is_lost(id) {
            // Another daemon took the lease: refused until this one holds it again.
            match shared.acquire(id).await {
                Err(SharedError::Held { .. }) => {
                    return Err(VolumeError::LeaseLost(id.to_string()));
                }
                r => r?,
            }
            self.lost
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(id);
        }
        // A mount whose JuiceFS process died (with a `kill -9`ed daemon's service, say) is
        // detached here and mounted again below as any unmounted volume: lease, metadata.
        fs.clear_dead(id)?;
        if !fs.is_mounted(id) {
            // Deleted on another daemon (its record goes with its objects): this daemon's
            // metadata would mount a destroyed filesystem.
            if !shared.has_record(id).await? {
                return Err(VolumeError::NotFound(id.to_string()));
            }
            shared.acquire(id).await?;
            let mounted = match self.sync_meta(id).await {
                Ok(()) => match fs.mark_unpublished(id) {
                    Ok(()) => fs.mount(id).await.map_err(VolumeError::from),
                    Err(e) => Err(e.into()),
                },
                Err(e) => Err(e),
            };
            if let Err(e) = mounted {
                if !fs.is_mounted(id) && !self.is_unpublished(id) {
                    let _ = shared.release(id).await;
                }
                return Err(e);
            }
            self.unpublished_remove(id);
        }
        let data = fs.mount(id).await?;
        self.touch(id);
        Ok(data)
    }

    /// Loads the bucket's published metadata when this host's is missing or older.
    async fn sync_meta(&self, id: &str) -> Result<(), VolumeError> {
        let (fs, shared) = self.stores(id).await?;
        let local = fs.local_generation(id);
        let published = shared.published(id).await?;
        match (local, published) {
            (None, None) => Err(SharedError::NoMetadata(id.to_string()).into()),
            // This daemon's metadata may hold changes never published (a park whose publish
            // failed, a crash while mounted): never replaced, kept in the data dir.
            (Some(l), Some(p)) if p > l && (fs.has_unpublished(id) || self.is_unpublished(id)) => {
                Err(SharedError::Diverged {
                    id: id.to_string(),
                    ours: l,
                    theirs: p,
                }
                .into())
            }
            (l, Some(p)) if l.is_none_or(|l| p > l) => {
                let (dump, g) = shared.fetch(id).await?;
                fs.load(id, &dump).await?;
                fs.set_local_generation(id, g)?;
                tracing::info!(volume = %id, generation = g, "metadata loaded from the bucket");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Publishes the volume's local metadata to the bucket as the next generation, unless
    /// the bucket has a newer one (another daemon's, after our lease was lost): that is
    /// never overwritten.
    async fn publish(&self, id: &str) -> Result<(), VolumeError> {
        let (fs, shared) = self.stores(id).await?;
        let Some(local) = fs.local_generation(id) else {
            return Ok(());
        };
        let published = shared.published(id).await?;
        if let Some(p) = published.filter(|p| *p > local) {
            return Err(SharedError::Diverged {
                id: id.to_string(),
                ours: local,
                theirs: p,
            }
            .into());
        }
        let dump = fs.dump(id).await?;
        let g = local + 1;
        shared.publish(id, dump, g).await?;
        fs.set_local_generation(id, g)?;
        fs.clear_unpublished(id)?;
        // Volumes made before records were kept get theirs now.
        if let Some(row) = self.db.volume_by_id(id).await? {
            shared.write_record(id, &row.token).await?;
        }
        tracing::info!(volume = %id, generation = g, "metadata published to the bucket");
        Ok(())
    }

    /// Unmounts the volume (its lock held), publishes its metadata and releases its lease.
    /// When publishing fails, the lease is kept and the idle loop (or shutdown) tries again.
    async fn park(&self, id: &str) -> Result<(), VolumeError> {
        let (fs, shared) = self.stores(id).await?;
        // Marked before the unmount: a park cut short (the idle loop stopped at shutdown)
        // is finished by `unmount_unused`.
        self.unpublished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string());
        fs.unmount(id).await?;
        self.used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.publish(id).await?;
        self.unpublished_remove(id);
        shared.release(id).await?;
        Ok(())
    }

    fn is_unpublished(&self, id: &str) -> bool {
        let set = self.unpublished.lock().unwrap_or_else(|p| p.into_inner());
        set.contains(id)
    }

    fn unpublished_remove(&self, id: &str) {
        let mut set = self.unpublished.lock().unwrap_or_else(|p| p.into_inner());
        set.remove(id);
    }

    /// Every [`IDLE_TICK`]: renews the leases of the volumes in use, unmounts (and
    /// publishes) those idle for [`IDLE_UNMOUNT`], retries publishing what failed to.
    pub async fn idle_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(IDLE_TICK).await;
            self.idle_tick().await;
        }
    }

    async fn idle_tick(&self) {
        let Ok(fs) = self.fs() else {
            return;
        };
        let mounted = fs.mounted();
        let pending: Vec<String> = {
            let set = self.unpublished.lock().unwrap_or_else(|p| p.into_inner());
            set.iter()
                .filter(|id| !mounted.contains(id))
                .cloned()
                .collect()
        };
        // Every lease first (small calls, short timeouts): a park's dump and PUT never
        // delays another volume's renewal past its lease.
        for id in mounted.iter().chain(&pending) {
            let lock = self.lock_of(id);
            // Held by a park or a delete under way (a mount or a content call holds it for
            // a moment): this volume is renewed at the next tick, the others are not held up.
            let Ok(_held) = tokio::time::timeout(RENEW_LOCK_WAIT, lock.lock()).await else {
                tracing::warn!(volume = %id, "lease not renewed this time: the volume is busy");
                continue;
            };
            if !fs.is_mounted(id) && !self.is_unpublished(id) {
                continue;
            }
            self.renew(id).await;
        }
        for id in mounted {
            let lock = self.lock_of(&id);
            let _held = lock.lock().await;
            if !fs.is_mounted(&id) {
                continue;
            }
            let in_use = match self.db.volume_users(&id).await {
                Ok(users) => !users.is_empty(),
                Err(e) => {
                    tracing::warn!("volume {id}: {e}");
                    true
                }
            };
            let idle_since = {
                let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
                // Found mounted (a daemon restart): counted as used now.
                let at = used.entry(id.clone()).or_insert_with(Instant::now);
                if in_use {
                    *at = Instant::now();
                }
                *at
            };
            // A volume whose lease another daemon took stays as it is until it is re-taken.
            if in_use || idle_since.elapsed() < IDLE_UNMOUNT || self.is_lost(&id) {
                continue;
            }
            match self.park(&id).await {
                Ok(()) => tracing::info!(volume = %id, "unmounted (idle)"),
                Err(e) => tracing::warn!(volume = %id, "unmounting idle: {e}"),
            }
        }
        for id in pending {
            let lock = self.lock_of(&id);
            let _held = lock.lock().await;
            if fs.is_mounted(&id) || !self.is_unpublished(&id) || self.is_lost(&id) {
                continue;
            }
            match self.park(&id).await {
                Ok(()) => tracing::info!(volume = %id, "metadata published (retried)"),
                Err(e) => tracing::warn!(volume = %id, "publishing again: {e}"),
            }
        }
    }

    /// Renews this daemon's lease on the volume (its lock held). When another daemon holds
    /// it, the volume is marked lost: new mounts and content calls are refused here until
    /// the lease is this daemon's again.
    async fn renew(&self, id: &str) {
        let renewed = match self.stores(id).await {
            Ok((_, shared)) => shared.acquire(id).await.map_err(VolumeError::from),
            Err(e) => Err(e),
        };
        let mut lost = self.lost.lock().unwrap_or_else(|p| p.into_inner());
        match renewed {
            Ok(()) => {
                if lost.remove(id) {
                    tracing::info!(volume = %id, "lease taken back");
                }
            }
            Err(VolumeError::Shared(e @ SharedError::Held { .. })) => {
                tracing::error!(
                    volume = %id,
                    "the lease was lost to another daemon ({e}): new mounts and content calls \
                     of this volume are refused here until it is taken back"
                );
                lost.insert(id.to_string());
            }
            Err(e) => tracing::error!(volume = %id, "renewing the lease: {e}"),
        }
    }

    fn is_lost(&self, id: &str) -> bool {
        let lost = self.lost.lock().unwrap_or_else(|p| p.into_inner());
        lost.contains(id)
    }

    /// A new volume of `key_id`: its row, then its filesystem in the bucket (the row goes
    /// again when that fails).
    pub async fn create(
        &self,
        key_id: &str,
        name: &str,
        storage: Option<&super::storage::StorageSpec>,
    ) -> Result<VolumeRow, VolumeError> {
        let base = self.fs()?;
        if !valid_name(name) {
            return Err(VolumeError::InvalidName(name.to_string()));
        }
        let random = |n| random_hex(n).map_err(Error::io("getrandom for a volume"));
        let mut row = VolumeRow {
            id: format!("vol-{}", random(8)?),
            key_id: key_id.to_string(),
            name: name.to_string(),
            token: random(24)?,
            created_at: now_ms(),
            storage: None,
        };
        if let Some(spec) = storage {
            let st = super::storage::validate(spec, &row.id)?;
            let pins = st.resolve(base.s3().storage_allow_private).await?;
            let s3 = st.s3_config(base.s3());
            let bucket = super::bucket::Bucket::pinned(&s3, &pins).map_err(SharedError::from)?;
            st.check(&bucket).await?;
            let ring = self.ring.as_deref().ok_or_else(|| {
                super::storage::StorageError::Unreadable(format!("{} (no key ring)", row.id))
            })?;
            row.storage = Some(st.seal(ring, &row.id)?);
            let shared = self.shared()?.for_volume(bucket, st.info.prefix.clone());
            let fs = base.for_volume(s3, st.info.prefix.clone());
            self.own
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(row.id.clone(), (fs, shared));
            tracing::info!(
                volume = %row.id,
                endpoint = %st.info.endpoint,
                bucket = %st.info.bucket,
                prefix = %st.info.prefix,
                "the key's own bucket answered"
            );
        }
        if !self.db.insert_volume(&row).await? {
            self.forget_own(&row.id);
            return Err(VolumeError::Exists(name.to_string()));
        }
        let (fs, _) = self.stores(&row.id).await?;
        if let Err(e) = fs.format(&row.id).await {
            let _ = self.db.delete_volume_unless_mounted(&row.id).await;
            // The local files go; a format that failed halfway may leave its few setting
            // objects under the prefix in the bucket (logged by the error).
            if let Err(e) = fs.remove_local(&row.id) {
                tracing::warn!("volume {}: {e}", row.id);
            }
            self.forget_own(&row.id);
            return Err(e.into());
        }
        // Published at once, so that another daemon can adopt it before it is ever mounted.
        let published = async {
            self.stores(&row.id)
                .await?
                .1
                .write_record(&row.id, &row.token)
                .await?;
            let lock = self.lock_of(&row.id);
            let _held = lock.lock().await;
            fs.set_local_generation(&row.id, 0)?;
            self.publish(&row.id).await
        };
        if let Err(e) = published.await {
            let _ = self.db.delete_volume_unless_mounted(&row.id).await;
            if let Err(e) = fs.destroy(&row.id).await {
                tracing::warn!("volume {}: {e}", row.id);
            }
            self.forget_own(&row.id);
            return Err(e);
        }
        tracing::info!("volume {} ({name}) created", row.id);
        Ok(row)
    }

    /// Registers for `key_id` a volume made on another daemon over the same bucket: `token`
    /// must be its content token (checked against its record in the bucket). Its metadata
    /// comes from the bucket at its first mount here.
    pub async fn adopt(
        &self,
        key_id: &str,
        name: &str,
        id: &str,
        token: &str,
    ) -> Result<VolumeRow, VolumeError> {
        self.fs()?;
        if !valid_name(name) {
            return Err(VolumeError::InvalidName(name.to_string()));
        }
        let id_ok = id.len() == 20
            && id.starts_with("vol-")
            && id[4..].bytes().all(|b| b.is_ascii_hexdigit());
        if !id_ok {
            return Err(VolumeError::NotFound(id.to_string()));
        }
        if self.db.volume_by_id(id).await?.is_some() {
            return Err(VolumeError::AlreadyHere(id.to_string()));
        }
        self.shared()?.check_record(id, token).await?;
        let row = VolumeRow {
            id: id.to_string(),
            key_id: key_id.to_string(),
            name: name.to_string(),
            token: token.to_string(),
            created_at: now_ms(),
            storage: None,
        };
        if !self.db.insert_volume(&row).await? {
            return Err(VolumeError::Exists(name.to_string()));
        }
        tracing::info!("volume {id} ({name}) adopted from the bucket");
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
        let (fs, shared) = self.stores(&row.id).await?;
        // Another daemon mounting it keeps it (409); ours is held until the objects go.
        shared.acquire(&row.id).await?;
        if !self.db.delete_volume_unless_mounted(&row.id).await? {
            return Err(in_use().await?);
        }
        // Deleted: changes never published are not kept, the newest metadata is destroyed.
        self.unpublished_remove(&row.id);
        let destroyed = async {
            fs.clear_unpublished(&row.id)?;
            match self.sync_meta(&row.id).await {
                Err(VolumeError::Shared(SharedError::NoMetadata(_))) | Ok(()) => {}
                Err(e) => return Err(e),
            }
            fs.destroy(&row.id).await?;
            shared.forget(&row.id).await?;
            Ok::<_, VolumeError>(())
        };
        if let Err(e) = destroyed.await {
            // The row is gone: the objects left are the operator's to remove.
            tracing::error!("volume {} deleted, but its storage was not: {e}", row.id);
        }
        self.unpublished_remove(&row.id);
        self.forget_own(&row.id);
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
            let host = self.ensure_mounted(&m.volume_id).await?;
            binds.push(VolumeBind {
                host,
                guest: m.path.clone(),
            });
        }
        Ok(binds)
    }

    /// On daemon shutdown, once nothing serves requests: unmounts every volume no live
    /// sandbox mounts (those the content API mounted, and all of them after
    /// `--kill-on-exit`), publishing its metadata and releasing its lease, so no JuiceFS
    /// process outlives the daemon holding a volume nobody uses and another daemon can
    /// mount it. Volumes of sandboxes left running stay mounted for them (their leases
    /// lapse: docs/volumes.md). Failures are logged: shutdown goes on.
    pub async fn unmount_unused(&self) {
        let Some(fs) = self.fs.as_ref() else {
            return;
        };
        for id in fs.mounted() {
            let lock = self.lock_of(&id);
            let _held = lock.lock().await;
            match self.db.volume_users(&id).await {
                Ok(users) if users.is_empty() => match self.park(&id).await {
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
        let pending: Vec<String> = {
            let set = self.unpublished.lock().unwrap_or_else(|p| p.into_inner());
            set.iter().cloned().collect()
        };
        for id in pending.into_iter().filter(|id| !fs.is_mounted(id)) {
            let lock = self.lock_of(&id);
            let _held = lock.lock().await;
            match self.park(&id).await {
                Ok(()) => tracing::info!(volume = %id, "metadata published at shutdown"),
                Err(e) => tracing::warn!(volume = %id, "shutdown: not published: {e}"),
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
        self.fs()?;
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
        self.ensure_mounted(&row.id).await
    }

    /// Whether the bucket answers (a HEAD of the volume's record): a content API change is
    /// refused with a clear 503 during an outage rather than staged or stalled.
    pub async fn check_storage(&self, id: &str) -> Result<(), VolumeError> {
        self.stores(id).await?.1.probe(id).await?;
        Ok(())
    }

    fn forget_own(&self, id: &str) {
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        own.remove(id);
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
