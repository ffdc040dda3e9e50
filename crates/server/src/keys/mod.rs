//! API keys: `e2b_` + 40 hex digits (accepted by every E2B SDK version), stored as their
//! SHA-256 (the keys are 160 random bits: a slow hash would add nothing). The plaintext is
//! shown once, at creation. The first start of the daemon creates an admin key and writes it
//! to `<data-dir>/admin.key` (mode 0600).
//!
//! `sandcell keys create|update|ls|revoke` work on the database file directly (SQLite in
//! WAL mode lets them run next to the daemon), so they need access to the data dir (root),
//! not a running daemon. Revoking a key kills its sandboxes at the daemon's next reaper tick.
//! A key's quotas ([`quota`]) are read on each create, so `keys update` applies at once.

pub mod cli;
pub mod quota;

use crate::error::Error;
use crate::store::keys::{KeyQuotas, Limit};
use crate::store::{Db, KeyRow};
use crate::util::{now_ms, random_hex, sha256_hex};
use std::path::{Path, PathBuf};

pub const KEY_PREFIX: &str = "e2b_";
pub const ADMIN_KEY_FILE: &str = "admin.key";
pub const DB_FILE: &str = "sandcell.db";

/// A key as created: its plaintext (shown once) and its record.
#[derive(Debug, Clone)]
pub struct NewKey {
    pub plaintext: String,
    pub record: KeyRow,
}

pub fn hash_key(plaintext: &str) -> String {
    sha256_hex(plaintext.as_bytes())
}

/// Whether `s` is shaped like one of our keys (checked before touching the database).
pub fn looks_like_key(s: &str) -> bool {
    s.strip_prefix(KEY_PREFIX)
        .is_some_and(|hex| hex.len() == 40 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A key with the daemon's default quotas, except at most `max_sandboxes` sandboxes when
/// given.
pub async fn create_key(
    db: &Db,
    name: &str,
    max_sandboxes: Option<u32>,
    is_admin: bool,
) -> Result<NewKey, Error> {
    let quotas = KeyQuotas {
        sandboxes: max_sandboxes.map_or(Limit::Default, |n| Limit::Max(u64::from(n))),
        ..KeyQuotas::default()
    };
    create_key_with(db, name, quotas, is_admin).await
}

/// A key with these quotas.
pub async fn create_key_with(
    db: &Db,
    name: &str,
    quotas: KeyQuotas,
    is_admin: bool,
) -> Result<NewKey, Error> {
    let secret = random_hex(20).map_err(Error::io("getrandom for an API key"))?;
    let plaintext = format!("{KEY_PREFIX}{secret}");
    let id = format!(
        "key_{}",
        random_hex(6).map_err(Error::io("getrandom for a key id"))?
    );
    let record = KeyRow {
        id,
        name: name.to_string(),
        key_prefix: format!("{KEY_PREFIX}{}", &secret[..4]),
        is_admin,
        quotas,
        created_at: now_ms(),
        revoked_at: None,
    };
    db.insert_key(&record, &hash_key(&plaintext)).await?;
    Ok(NewKey { plaintext, record })
}

/// On a database without an active admin key: creates one and writes it to
/// `<data_dir>/admin.key` (0600). Returns the file when a key was created.
pub async fn ensure_admin_key(db: &Db, data_dir: &Path) -> Result<Option<PathBuf>, Error> {
    if db.has_active_admin_key().await? {
        return Ok(None);
    }
    let key = create_key(db, "admin", None, true).await?;
    let path = data_dir.join(ADMIN_KEY_FILE);
    write_private(&path, format!("{}\n", key.plaintext).as_bytes())?;
    Ok(Some(path))
}

/// Writes `bytes` to `path` with mode 0600 from the first byte on (never world-readable in
/// between), replacing the file atomically.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("key.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(Error::io(format!("creating {}", tmp.display())))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(Error::io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(Error::io(format!(
        "renaming {} to {}",
        tmp.display(),
        path.display()
    )))
}

pub async fn open_db(data_dir: &Path) -> Result<Db, Error> {
    make_data_dir(data_dir)?;
    Db::open(&data_dir.join(DB_FILE)).await
}

/// Creates the data dir 0700, or takes an existing one to 0700 (older installs made it
/// 0755): it holds the database, the admin key, templates' layers and snapshots, and
/// nothing but root (the daemon, runsc, the VMM, all root) needs to look inside.
fn make_data_dir(data_dir: &Path) -> Result<(), Error> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .map_err(Error::io(format!("creating {}", data_dir.display())))?;
    let meta = std::fs::metadata(data_dir)
        .map_err(Error::io(format!("reading {}", data_dir.display())))?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700)).map_err(
            Error::io(format!("making {} private (0700)", data_dir.display())),
        )?;
        tracing::info!("{}: made private (0700)", data_dir.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn the_database_and_data_dir_are_private_also_on_old_installs() {
        let tmp = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let fresh = tmp.path().join("fresh");
        let db = open_db(&fresh).await.unwrap();
        create_key(&db, "k", None, false).await.unwrap();
        assert_eq!(mode(&fresh), 0o700);
        for f in ["sandcell.db", "sandcell.db-wal", "sandcell.db-shm"] {
            assert_eq!(mode(&fresh.join(f)), 0o600, "{f}");
        }
        db.close().await;
        // an install made before: world-readable dir and files
        let open = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        open(&fresh, 0o755);
        for f in ["sandcell.db", "sandcell.db-wal", "sandcell.db-shm"] {
            if fresh.join(f).exists() {
                open(&fresh.join(f), 0o644);
            }
        }
        let db = open_db(&fresh).await.unwrap();
        assert_eq!(mode(&fresh), 0o700);
        for f in ["sandcell.db", "sandcell.db-wal", "sandcell.db-shm"] {
            assert_eq!(mode(&fresh.join(f)), 0o600, "{f}");
        }
        db.close().await;
    }

    #[tokio::test]
    async fn admin_key_is_made_once_private_and_resolves() {
        let tmp = tempfile::tempdir().unwrap();
        let db = open_db(tmp.path()).await.unwrap();
        let file = ensure_admin_key(&db, tmp.path()).await.unwrap().unwrap();
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let key = std::fs::read_to_string(&file).unwrap();
        let key = key.trim();
        assert!(looks_like_key(key), "{key}");
        let found = db
            .active_key_by_hash(&hash_key(key))
            .await
            .unwrap()
            .unwrap();
        assert!(found.is_admin);
        assert!(ensure_admin_key(&db, tmp.path()).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn revoked_keys_stop_resolving() {
        let tmp = tempfile::tempdir().unwrap();
        let db = open_db(tmp.path()).await.unwrap();
        let k = create_key(&db, "ci", Some(2), false).await.unwrap();
        assert!(
            db.active_key_by_hash(&hash_key(&k.plaintext))
                .await
                .unwrap()
                .is_some()
        );
        assert_eq!(
            db.revoke_key("ci", now_ms()).await.unwrap(),
            vec![k.record.id.clone()]
        );
        assert!(
            db.active_key_by_hash(&hash_key(&k.plaintext))
                .await
                .unwrap()
                .is_none()
        );
        assert!(db.revoke_key("ci", now_ms()).await.unwrap().is_empty());
        let listed = db.list_keys().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].quotas.sandboxes, Limit::Max(2));
        assert!(listed[0].revoked_at.is_some());
    }
}
