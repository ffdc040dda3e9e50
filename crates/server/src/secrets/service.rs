//! The secrets of an API key (E2B: of a team): create, update (appends a version), look
//! up, list, delete, and resolve a name to its current value for the egress proxy. Values
//! go in and never come out of the API: only [`Secrets::resolve`] opens one.
//!
//! E2B's bounds: names 1 to 128 of `[A-Za-z0-9_-]`, stored lower-case, `sec_` reserved for
//! ids; metadata at most 32 entries, keys up to 128 bytes, values up to 1024, 8192 bytes
//! in all. Ours: a value is 1 to [`MAX_VALUE`] bytes without CR, LF or NUL (it is sent in
//! HTTP headers), a key holds at most [`MAX_SECRETS_PER_KEY`] secrets, and the latest
//! [`KEEP_VERSIONS`] versions of a secret are kept.

use crate::error::Error;
use crate::secrets::crypto::{self, CryptoError, KeyRing, SecretValue};
use crate::store::Db;
use crate::store::secrets::{SecretRow, VersionRow};
use crate::util::now_ms;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub const MAX_NAME: usize = 128;
pub const MAX_METADATA_ENTRIES: usize = 32;
pub const MAX_METADATA_KEY: usize = 128;
pub const MAX_METADATA_VALUE: usize = 1024;
pub const MAX_METADATA_TOTAL: usize = 8192;
pub const MAX_VALUE: usize = 16 * 1024;
pub const MAX_SECRETS_PER_KEY: i64 = 1000;
pub const KEEP_VERSIONS: i64 = 10;
/// Ids are `sec_` and 24 hex digits; names may not start so.
pub const ID_PREFIX: &str = "sec_";

/// Concurrent updates of one secret retry this often before giving up.
const UPDATE_TRIES: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error(
        "invalid secret name {0:?}: 1 to {MAX_NAME} letters, digits, '-' and '_', not \
         starting with '{ID_PREFIX}' (reserved for secret ids)"
    )]
    InvalidName(String),
    #[error("invalid metadata: {0}")]
    InvalidMetadata(String),
    /// Never carries the value.
    #[error("invalid secret value: {0}")]
    InvalidValue(&'static str),
    #[error("secret {0:?} doesn't exist or you don't have access to it")]
    NotFound(String),
    #[error("secret {0:?} already exists")]
    Exists(String),
    #[error("this key has {MAX_SECRETS_PER_KEY} secrets, the most it may have: delete one first")]
    TooMany,
    #[error("secret {0:?} is being updated concurrently: try again")]
    Contended(String),
    #[error("a daemon runs on this data dir (it holds secrets.key.lock): stop it first")]
    DaemonRunning,
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    #[error(transparent)]
    Host(#[from] Error),
}

type Result<T, E = SecretsError> = std::result::Result<T, E>;

/// A name as stored: lower-case, checked.
pub fn canonical_name(name: &str) -> Result<String> {
    let lower = name.to_ascii_lowercase();
    let ok = (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !lower.starts_with(ID_PREFIX);
    if ok {
        Ok(lower)
    } else {
        Err(SecretsError::InvalidName(
            name.chars().take(MAX_NAME + 8).collect(),
        ))
    }
}

/// Checks metadata against E2B's bounds.
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<()> {
    let bad = |m: String| Err(SecretsError::InvalidMetadata(m));
    if metadata.len() > MAX_METADATA_ENTRIES {
        return bad(format!(
            "{} entries, at most {MAX_METADATA_ENTRIES}",
            metadata.len()
        ));
    }
    let mut total = 0;
    for (k, v) in metadata {
        if k.is_empty() || k.len() > MAX_METADATA_KEY {
            return bad(format!("key of {} bytes: 1 to {MAX_METADATA_KEY}", k.len()));
        }
        if v.len() > MAX_METADATA_VALUE {
            return bad(format!(
                "the value of {k:?} is {} bytes, at most {MAX_METADATA_VALUE}",
                v.len()
            ));
        }
        total += k.len() + v.len();
    }
    if total > MAX_METADATA_TOTAL {
        return bad(format!(
            "{total} bytes of keys and values, at most {MAX_METADATA_TOTAL}"
        ));
    }
    Ok(())
}

/// Checks a value; the error never shows it.
pub fn check_value(value: &SecretValue) -> Result<()> {
    let v = value.expose();
    if v.is_empty() {
        return Err(SecretsError::InvalidValue("it is empty"));
    }
    if v.len() > MAX_VALUE {
        return Err(SecretsError::InvalidValue("longer than 16384 bytes"));
    }
    if v.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
        return Err(SecretsError::InvalidValue(
            "it holds CR, LF or NUL (values are sent in HTTP headers)",
        ));
    }
    Ok(())
}

/// How a path's `{secretID}` (an id or a name, any case) is looked up: both are stored
/// lower-case.
pub fn lookup_key(id_or_name: &str) -> String {
    id_or_name.to_ascii_lowercase()
}

/// A secret's metadata as stored (a JSON object of strings).
pub fn metadata_of(row: &SecretRow) -> BTreeMap<String, String> {
    // Written only by this module from a map of strings.
    serde_json::from_str(&row.metadata).unwrap_or_default()
}

fn metadata_json(metadata: &BTreeMap<String, String>) -> String {
    serde_json::to_string(metadata).unwrap_or_else(|_| "{}".into())
}

/// The daemon's secrets: the database and the key ring that seals them.
#[derive(Clone)]
pub struct Secrets {
    db: Db,
    ring: Arc<KeyRing>,
    /// Held while the daemon runs (see [`crypto::lock_key_ring`]).
    _lock: Option<Arc<std::fs::File>>,
}

impl Secrets {
    pub fn new(db: Db, ring: KeyRing) -> Secrets {
        Secrets {
            db,
            ring: Arc::new(ring),
            _lock: None,
        }
    }

    /// The daemon's secrets: the key ring of `data_dir` (made on the first start), locked
    /// against rotation while the daemon runs.
    pub fn open(db: Db, data_dir: &Path) -> Result<Secrets, CryptoError> {
        let ring = KeyRing::load_or_create(data_dir)?;
        let lock = crypto::lock_key_ring(data_dir)?;
        if lock.is_none() {
            tracing::warn!(
                "another process holds {}/secrets.key.lock: two daemons on one data dir?",
                data_dir.display()
            );
        }
        Ok(Secrets {
            db,
            ring: Arc::new(ring),
            _lock: lock.map(Arc::new),
        })
    }

    /// The key ring, for the other values sealed with it (egress proxy passwords).
    pub fn key_ring(&self) -> Arc<KeyRing> {
        self.ring.clone()
    }

    /// A new secret of key `key_id`, at version 1.
    pub async fn create(
        &self,
        key_id: &str,
        name: &str,
        value: &SecretValue,
        metadata: BTreeMap<String, String>,
    ) -> Result<SecretRow> {
        let name = canonical_name(name)?;
        check_metadata(&metadata)?;
        check_value(value)?;
        if self.db.count_secrets(key_id).await? >= MAX_SECRETS_PER_KEY {
            return Err(SecretsError::TooMany);
        }
        let id = format!(
            "{ID_PREFIX}{}",
            crate::util::random_hex(12).map_err(|e| Error::io("making a secret id")(e))?
        );
        let now = now_ms();
        let row = SecretRow {
            id,
            name,
            metadata: metadata_json(&metadata),
            current_version: 1,
            created_at: now,
            updated_at: now,
        };
        let sealed = self.ring.seal(&row.id, 1, value)?;
        if !self.db.insert_secret(key_id, &row, &sealed).await? {
            return Err(SecretsError::Exists(row.name));
        }
        tracing::info!(
            key = key_id,
            secret = %row.id,
            name = %row.name,
            "secret created (version 1)"
        );
        Ok(row)
    }

    /// Key `key_id`'s secret `id_or_name`.
    pub async fn get(&self, key_id: &str, id_or_name: &str) -> Result<SecretRow> {
        self.db
            .secret_of_key(key_id, &lookup_key(id_or_name))
            .await?
            .ok_or_else(|| SecretsError::NotFound(id_or_name.into()))
    }

    /// A new version with `value` (and new metadata, if given); the secret as it is now.
    pub async fn update(
        &self,
        key_id: &str,
        id_or_name: &str,
        value: &SecretValue,
        metadata: Option<BTreeMap<String, String>>,
    ) -> Result<SecretRow> {
        if let Some(m) = &metadata {
            check_metadata(m)?;
        }
        check_value(value)?;
        let metadata = metadata.as_ref().map(metadata_json);
        for _ in 0..UPDATE_TRIES {
            let row = self.get(key_id, id_or_name).await?;
            let version = row.current_version + 1;
            // The version is sealed into the ciphertext: a lost race reseals for the next.
            let sealed = self.ring.seal(&row.id, version, value)?;
            let now = now_ms();
            if self
                .db
                .append_secret_version(
                    key_id,
                    &row.id,
                    row.current_version,
                    &sealed,
                    metadata.as_deref(),
                    now,
                    KEEP_VERSIONS,
                )
                .await?
            {
                tracing::info!(key = key_id, secret = %row.id, version, "secret updated");
                return self.get(key_id, &row.id).await;
            }
        }
        Err(SecretsError::Contended(id_or_name.into()))
    }

    /// A page of key `key_id`'s secrets after `(created_at, id)`, oldest first.
    pub async fn list(
        &self,
        key_id: &str,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<SecretRow>> {
        Ok(self.db.secrets_of_key(key_id, after, limit).await?)
    }

    /// Deletes key `key_id`'s secret `id_or_name` and all its versions.
    pub async fn delete(&self, key_id: &str, id_or_name: &str) -> Result<()> {
        let row = self.get(key_id, id_or_name).await?;
        if !self.db.delete_secret(key_id, &row.id).await? {
            return Err(SecretsError::NotFound(id_or_name.into()));
        }
        tracing::info!(key = key_id, secret = %row.id, name = %row.name, "secret deleted");
        Ok(())
    }

    /// The current version and value of key `key_id`'s secret `name`, for the egress
    /// proxy; `None` if the key has no such secret.
    pub async fn resolve(&self, key_id: &str, name: &str) -> Result<Option<(i64, SecretValue)>> {
        let Some(v) = self
            .db
            .current_secret_version(key_id, &lookup_key(name))
            .await?
        else {
            return Ok(None);
        };
        let value = self.ring.open(&v.secret_id, v.version, &v.sealed)?;
        Ok(Some((v.version, value)))
    }
}

/// Rotates the secrets key of the daemon whose data dir is `data_dir` (the daemon must be
/// stopped): a new key goes in front of the file, every stored version is resealed under
/// it in one transaction, then the file keeps only the new key. Each step leaves a state
/// the next start reads: the rows name the key that sealed them and the file holds it
/// until no row does. Returns how many versions were resealed.
pub async fn rotate_key(db: &Db, data_dir: &Path) -> Result<usize> {
    let Some(_lock) = crypto::lock_key_ring(data_dir)? else {
        return Err(SecretsError::DaemonRunning);
    };
    let path = data_dir.join(crypto::KEY_FILE);
    let new_line = crypto::generate_key_line()?;
    let mut lines = vec![new_line.clone()];
    lines.extend(crypto::key_lines(&path)?);
    crypto::write_key_file(&path, &lines)?;
    let ring = KeyRing::load(&path)?;
    let resealed: Vec<VersionRow> = db
        .all_secret_versions()
        .await?
        .into_iter()
        .map(|v| {
            let value = ring.open(&v.secret_id, v.version, &v.sealed)?;
            Ok(VersionRow {
                sealed: ring.seal(&v.secret_id, v.version, &value)?,
                ..v
            })
        })
        .collect::<Result<_, CryptoError>>()?;
    db.reseal_secret_versions(&resealed).await?;
    // Egress proxy passwords are sealed with the same ring: under the new key before the
    // old one goes.
    crate::networks::egress_proxy::reseal_all(db, &ring).await?;
    // So are the credentials of volumes in their key's own bucket.
    crate::volumes::storage::reseal_all(db, &ring).await?;
    // The resealed rows on disk before the old key goes: commits are not synced one by one
    // (store/mod.rs, synchronous=NORMAL), and a host crash that rolled them back after the
    // key file lost the old key would leave every secret unreadable.
    db.sync_to_disk().await?;
    crypto::write_key_file(&path, &[new_line])?;
    tracing::info!(
        "secrets key rotated to {}: {} version(s) resealed",
        ring.current_kid(),
        resealed.len()
    );
    Ok(resealed.len())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_are_checked_and_lowered() {
        assert_eq!(canonical_name("OpenAI_Key-2").unwrap(), "openai_key-2");
        assert_eq!(canonical_name(&"a".repeat(128)).unwrap().len(), 128);
        for bad in ["", "a b", "a.b", "a{b}", "é", "sec_x", "SEC_x"] {
            assert!(canonical_name(bad).is_err(), "{bad:?}");
        }
        assert!(canonical_name(&"a".repeat(129)).is_err());
    }

    #[test]
    fn metadata_is_bounded_as_e2b_bounds_it() {
        let m = |n: usize, k: usize, v: usize| -> BTreeMap<String, String> {
            (0..n)
                .map(|i| (format!("{i:0>k$}"), "v".repeat(v)))
                .collect()
        };
        assert!(check_metadata(&m(32, 3, 10)).is_ok());
        assert!(check_metadata(&m(33, 3, 10)).is_err());
        assert!(check_metadata(&m(1, 128, 1024)).is_ok());
        assert!(check_metadata(&m(1, 129, 1)).is_err());
        assert!(check_metadata(&m(1, 3, 1025)).is_err());
        // 8 entries of 4 + 1024 bytes: 8224 > 8192.
        assert!(check_metadata(&m(8, 4, 1024)).is_err());
        assert!(check_metadata(&m(7, 4, 1024)).is_ok());
    }

    #[test]
    fn values_are_checked_without_being_shown() {
        let v = |s: &str| SecretValue::new(s.into());
        assert!(check_value(&v("sk-1")).is_ok());
        for bad in ["", "a\r\nX-Evil: 1", "a\0b"] {
            let e = check_value(&v(bad)).unwrap_err().to_string();
            assert!(bad.is_empty() || !e.contains(bad), "{e}");
        }
        assert!(check_value(&v(&"x".repeat(MAX_VALUE + 1))).is_err());
    }

    async fn secrets() -> (tempfile::TempDir, Db, Secrets) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db.sqlite")).await.unwrap();
        for key in ["key_a", "key_b"] {
            db.insert_test_key(key).await.unwrap();
        }
        let ring = KeyRing::load_or_create(dir.path()).unwrap();
        let s = Secrets::new(db.clone(), ring);
        (dir, db, s)
    }

    #[tokio::test]
    async fn an_update_appends_a_version_and_resolve_gives_the_latest_to_its_key_only() {
        let (_dir, db, s) = secrets().await;
        let v1 = SecretValue::new("one".into());
        let row = s
            .create("key_a", "Api-Key", &v1, BTreeMap::new())
            .await
            .unwrap();
        assert_eq!((row.name.as_str(), row.current_version), ("api-key", 1));
        assert!(matches!(
            s.create("key_a", "API-KEY", &v1, BTreeMap::new()).await,
            Err(SecretsError::Exists(_))
        ));
        // Another key may use the same name; it does not see key_a's.
        s.create(
            "key_b",
            "api-key",
            &SecretValue::new("b".into()),
            BTreeMap::new(),
        )
        .await
        .unwrap();
        let meta = BTreeMap::from([("team".to_string(), "x".to_string())]);
        for i in 2..=12 {
            let v = SecretValue::new(format!("v{i}"));
            let r = s
                .update("key_a", &row.id, &v, (i == 2).then(|| meta.clone()))
                .await
                .unwrap();
            assert_eq!(r.current_version, i);
        }
        let now = s.get("key_a", "API-key").await.unwrap();
        assert_eq!(
            metadata_of(&now),
            meta,
            "an update without metadata keeps it"
        );
        let (version, value) = s.resolve("key_a", "api-key").await.unwrap().unwrap();
        assert_eq!((version, value.expose()), (12, "v12"));
        assert_eq!(
            s.resolve("key_b", "api-key")
                .await
                .unwrap()
                .unwrap()
                .1
                .expose(),
            "b"
        );
        assert!(matches!(
            s.get("key_b", &row.id).await,
            Err(SecretsError::NotFound(_))
        ));
        let kept: Vec<i64> = db
            .all_secret_versions()
            .await
            .unwrap()
            .into_iter()
            .filter(|v| v.secret_id == row.id)
            .map(|v| v.version)
            .collect();
        assert_eq!(kept, (3..=12).collect::<Vec<_>>());
        s.delete("key_a", "api-key").await.unwrap();
        assert!(s.resolve("key_a", "api-key").await.unwrap().is_none());
        assert!(s.resolve("key_b", "api-key").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn rotation_reseals_every_version_and_drops_the_old_key() {
        let (dir, db, s) = secrets().await;
        s.create(
            "key_a",
            "a",
            &SecretValue::new("alpha".into()),
            BTreeMap::new(),
        )
        .await
        .unwrap();
        s.update("key_a", "a", &SecretValue::new("beta".into()), None)
            .await
            .unwrap();
        let held = crypto::lock_key_ring(dir.path()).unwrap().unwrap();
        assert!(matches!(
            rotate_key(&db, dir.path()).await,
            Err(SecretsError::DaemonRunning)
        ));
        drop(held);
        let old_kid = KeyRing::load(&dir.path().join(crypto::KEY_FILE))
            .unwrap()
            .current_kid()
            .to_string();
        assert_eq!(rotate_key(&db, dir.path()).await.unwrap(), 2);
        let ring = KeyRing::load(&dir.path().join(crypto::KEY_FILE)).unwrap();
        assert_ne!(ring.current_kid(), old_kid);
        let versions = db.all_secret_versions().await.unwrap();
        assert!(versions.iter().all(|v| v.sealed.kid == ring.current_kid()));
        let after = Secrets::new(db.clone(), ring);
        assert_eq!(
            after
                .resolve("key_a", "a")
                .await
                .unwrap()
                .unwrap()
                .1
                .expose(),
            "beta"
        );
    }
}
