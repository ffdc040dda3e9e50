//! What lets a second daemon mount a volume: the volume's metadata and its single-writer
//! lease travel with the bucket, under `<volume id>/sandcell-meta/`:
//!
//! - `lease.json`: the daemon that has the volume mounted (`holder`, `host`, `expiresMs`),
//!   taken before a mount, refreshed while mounted, deleted at unmount. Another daemon's
//!   mount is refused (409) until it is gone or expired. Taken with S3's conditional PUT
//!   (`If-None-Match: *` / `If-Match: <etag>`) so two daemons racing for it do not both win
//!   (on a server that ignores conditions, the window is the instant between read and write).
//! - `dump.json.gz`: `juicefs dump` of the volume's SQLite metadata, published at unmount in
//!   one PUT (atomic in S3) with its generation as `x-amz-meta-sandcell-generation`; a daemon
//!   whose local metadata is missing or older loads it before mounting.
//! - `volume.json`: the volume's id and the SHA-256 of its content token, so that a key on
//!   another daemon can adopt the volume by showing its token (`POST /volumes` with
//!   `volumeID` and `token`).
//!
//! The model and what happens when a daemon dies: docs/volumes.md.

use super::bucket::{Bucket, BucketError, Condition, Kind};
use crate::util::now_ms;
use sha2::{Digest, Sha256};

/// How long a lease lasts unless refreshed (the idle loop refreshes it every
/// [`super::service::IDLE_TICK`]).
pub const LEASE_MS: i64 = 60_000;

#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    #[error(
        "volume {id} is mounted by another daemon ({holder} on {host}, lease expires in {secs} s \
         unless renewed): a volume is mounted by one daemon at a time"
    )]
    Held {
        id: String,
        holder: String,
        host: String,
        secs: u64,
    },
    #[error("volume {0}: no metadata for it in the bucket (never published, or not a volume)")]
    NoMetadata(String),
    #[error("volume {0}: the token does not match the volume's record in the bucket")]
    BadToken(String),
    #[error(
        "volume {id}: the bucket has metadata generation {theirs}, newer than this daemon's \
         {ours} (another daemon mounted it after this one's lease lapsed): not overwritten; \
         this daemon's changes since generation {ours} are kept in its data dir only"
    )]
    Diverged { id: String, ours: u64, theirs: u64 },
    #[error("volume {id}: {what}")]
    Corrupt { id: String, what: String },
    #[error(transparent)]
    Bucket(#[from] BucketError),
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Lease {
    holder: String,
    host: String,
    expires_ms: i64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    #[serde(rename = "volumeID")]
    volume_id: String,
    token_sha256: String,
}

#[derive(Debug, Clone)]
pub struct Shared {
    bucket: Bucket,
    /// This daemon: a random id kept in its data dir.
    daemon: String,
    host: String,
    /// The folder the volume's files are under: its id in the operator's bucket
    /// (`None`), the prefix the key chose in its own (volumes/storage.rs).
    root: Option<String>,
}

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Shared {
    pub fn new(bucket: Bucket, daemon: String) -> Shared {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        Shared {
            bucket,
            daemon,
            host,
            root: None,
        }
    }

    /// The same daemon's view of a volume in another bucket, its files under `root/`.
    pub fn for_volume(&self, bucket: Bucket, root: String) -> Shared {
        Shared {
            bucket,
            daemon: self.daemon.clone(),
            host: self.host.clone(),
            root: Some(root),
        }
    }

    fn key(&self, id: &str, name: &str) -> String {
        let root = self.root.as_deref().unwrap_or(id);
        format!("{root}/sandcell-meta/{name}")
    }

    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// Takes (or renews) this daemon's lease on the volume; `Held` when another daemon has
    /// an unexpired one.
    pub async fn acquire(&self, id: &str) -> Result<(), SharedError> {
        let k = self.key(id, "lease.json");
        let cond = match self.bucket.get(&k).await? {
            None => Condition::Absent,
            Some(obj) => {
                if let Ok(l) = serde_json::from_slice::<Lease>(&obj.body) {
                    let now = now_ms();
                    if l.holder != self.daemon && l.expires_ms > now {
                        return Err(SharedError::Held {
                            id: id.to_string(),
                            holder: l.holder,
                            host: l.host,
                            secs: ((l.expires_ms - now) as u64).div_ceil(1000),
                        });
                    }
                }
                obj.etag.map_or(Condition::None, Condition::Matches)
            }
        };
        let lease = Lease {
            holder: self.daemon.clone(),
            host: self.host.clone(),
            expires_ms: now_ms() + LEASE_MS,
        };
        let body = serde_json::to_vec(&lease).unwrap_or_default();
        match self.bucket.put(&k, body, None, &cond, Kind::Small).await {
            Ok(()) => Ok(()),
            // Another daemon wrote it between our read and write: report who.
            Err(BucketError::Precondition { .. }) => match self.bucket.get(&k).await? {
                Some(obj) => {
                    let l: Lease =
                        serde_json::from_slice(&obj.body).map_err(|e| SharedError::Corrupt {
                            id: id.to_string(),
                            what: format!("its lease: {e}"),
                        })?;
                    // This daemon's own (a renewal racing a mount here): held.
                    if l.holder == self.daemon {
                        return Ok(());
                    }
                    Err(SharedError::Held {
                        id: id.to_string(),
                        holder: l.holder,
                        host: l.host,
                        secs: (l.expires_ms.saturating_sub(now_ms()).max(0) as u64).div_ceil(1000),
                    })
                }
                None => Err(SharedError::Corrupt {
                    id: id.to_string(),
                    what: "its lease changed twice while we took it".into(),
                }),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// One HEAD in the volume's prefix: `Unreachable` when the bucket does not answer.
    pub async fn probe(&self, id: &str) -> Result<(), SharedError> {
        self.bucket.head(&self.key(id, "volume.json")).await?;
        Ok(())
    }

    /// Whether the volume's record is in the bucket (gone: the volume was deleted).
    pub async fn has_record(&self, id: &str) -> Result<bool, SharedError> {
        Ok(self
            .bucket
            .head(&self.key(id, "volume.json"))
            .await?
            .is_some())
    }

    /// Gives the lease back if it is still this daemon's.
    pub async fn release(&self, id: &str) -> Result<(), SharedError> {
        let k = self.key(id, "lease.json");
        if let Some(obj) = self.bucket.get(&k).await?
            && serde_json::from_slice::<Lease>(&obj.body).is_ok_and(|l| l.holder == self.daemon)
        {
            self.bucket.delete(&k).await?;
        }
        Ok(())
    }

    /// The generation of the metadata published in the bucket, if any.
    pub async fn published(&self, id: &str) -> Result<Option<u64>, SharedError> {
        Ok(self
            .bucket
            .head(&self.key(id, "dump.json.gz"))
            .await?
            .map(|o| o.generation.unwrap_or(0)))
    }

    /// The published dump (gzip JSON) and its generation.
    pub async fn fetch(&self, id: &str) -> Result<(Vec<u8>, u64), SharedError> {
        let obj = self
            .bucket
            .get_dump(&self.key(id, "dump.json.gz"))
            .await?
            .ok_or_else(|| SharedError::NoMetadata(id.to_string()))?;
        Ok((obj.body, obj.generation.unwrap_or(0)))
    }

    /// Publishes a dump as `generation` (one PUT: another daemon sees the old one or this).
    pub async fn publish(
        &self,
        id: &str,
        dump: Vec<u8>,
        generation: u64,
    ) -> Result<(), SharedError> {
        self.bucket
            .put(
                &self.key(id, "dump.json.gz"),
                dump,
                Some(generation),
                &Condition::None,
                Kind::Dump,
            )
            .await
            .map_err(Into::into)
    }

    /// Records the volume's token hash in the bucket (for adoption by another daemon).
    pub async fn write_record(&self, id: &str, token: &str) -> Result<(), SharedError> {
        let r = Record {
            volume_id: id.to_string(),
            token_sha256: sha256_hex(token),
        };
        let body = serde_json::to_vec(&r).unwrap_or_default();
        self.bucket
            .put(
                &self.key(id, "volume.json"),
                body,
                None,
                &Condition::None,
                Kind::Small,
            )
            .await
            .map_err(Into::into)
    }

    /// Checks that `token` is the volume's, from its record in the bucket.
    pub async fn check_record(&self, id: &str, token: &str) -> Result<(), SharedError> {
        let obj = self
            .bucket
            .get(&self.key(id, "volume.json"))
            .await?
            .ok_or_else(|| SharedError::NoMetadata(id.to_string()))?;
        let r: Record = serde_json::from_slice(&obj.body).map_err(|e| SharedError::Corrupt {
            id: id.to_string(),
            what: format!("its record: {e}"),
        })?;
        let ok = r.volume_id == id
            && crate::util::constant_time_eq(
                r.token_sha256.as_bytes(),
                sha256_hex(token).as_bytes(),
            );
        if ok {
            Ok(())
        } else {
            Err(SharedError::BadToken(id.to_string()))
        }
    }

    /// Removes what this module put under the volume's prefix (after `juicefs destroy`).
    pub async fn forget(&self, id: &str) -> Result<(), SharedError> {
        for name in ["dump.json.gz", "volume.json", "lease.json"] {
            self.bucket.delete(&self.key(id, name)).await?;
        }
        Ok(())
    }
}

/// This daemon's id: random, made once, kept in `<volumes dir>/daemon-id`.
pub fn daemon_id(volumes_dir: &std::path::Path) -> std::io::Result<String> {
    let path = volumes_dir.join("daemon-id");
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(volumes_dir)?;
    let id = format!("daemon-{}", crate::util::random_hex(8)?);
    std::fs::write(&path, &id)?;
    Ok(id)
}
