//! The daemon's state in SQLite through sqlx (runtime-checked queries, `$N` placeholders so
//! that the same SQL runs on PostgreSQL later). Migrations are embedded from
//! `crates/server/migrations/` and run on open.

pub mod installed_snapshots;
pub mod keys;
pub mod logs;
pub mod networks;
pub mod sandboxes;
pub mod secrets;
pub mod snapshots;
pub mod templates;
pub mod usage;
pub mod volumes;

pub use keys::KeyRow;
pub use sandboxes::SandboxRow;
pub use usage::UsageInterval;

use crate::error::Error;
use sqlx::SqlitePool;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use std::path::Path;
use std::time::Duration;

type Result<T, E = Error> = std::result::Result<T, E>;

/// `(version, description, sql)`, in order. Never edit a released one: add a new file.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "initial",
        include_str!("../../migrations/0001_initial.sql"),
    ),
    (
        2,
        "lifecycle metering",
        include_str!("../../migrations/0002_lifecycle_metering.sql"),
    ),
    (
        3,
        "snapshots",
        include_str!("../../migrations/0003_snapshots.sql"),
    ),
    (
        4,
        "networks",
        include_str!("../../migrations/0004_networks.sql"),
    ),
    (
        5,
        "traffic token",
        include_str!("../../migrations/0005_traffic_token.sql"),
    ),
    (
        6,
        "template builds",
        include_str!("../../migrations/0006_template_builds.sql"),
    ),
    (
        7,
        "template tags",
        include_str!("../../migrations/0007_template_tags.sql"),
    ),
    (
        8,
        "template ownership",
        include_str!("../../migrations/0008_template_ownership.sql"),
    ),
    (
        9,
        "key quotas",
        include_str!("../../migrations/0009_key_quotas.sql"),
    ),
    (
        10,
        "filesystem-only auto-pause",
        include_str!("../../migrations/0010_auto_pause_files_only.sql"),
    ),
    (
        11,
        "auto resume",
        include_str!("../../migrations/0011_auto_resume.sql"),
    ),
    (
        13,
        "secrets",
        include_str!("../../migrations/0013_secrets.sql"),
    ),
    (
        14,
        "volumes",
        include_str!("../../migrations/0014_volumes.sql"),
    ),
    (
        15,
        "mask request host",
        include_str!("../../migrations/0015_mask_request_host.sql"),
    ),
    (
        16,
        "installed template snapshots",
        include_str!("../../migrations/0016_installed_template_snapshots.sql"),
    ),
    (
        17,
        "egress proxy",
        include_str!("../../migrations/0017_egress_proxy.sql"),
    ),
    (
        18,
        "volume storage",
        include_str!("../../migrations/0018_volume_storage.sql"),
    ),
];

pub use crate::sandboxes::state::State;

#[derive(Clone)]
pub struct Db {
    pool: SqlitePool,
}

/// `$from, $from+1, ...` for an `IN (...)` list.
fn placeholders(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The database holds every key's hash, sandbox and token: only root reads it. Creates the
/// file 0600 before SQLite opens it (SQLite gives its `-wal` and `-shm` files the mode of
/// the database file), and tightens the files of an older install (they were 0644).
fn make_private(path: &Path) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(Error::io(format!("creating {}", path.display())))?;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let file = std::path::PathBuf::from(name);
        let Ok(meta) = std::fs::symlink_metadata(&file) else {
            continue;
        };
        if meta.file_type().is_file() && meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).map_err(
                Error::io(format!("making {} private (0600)", file.display())),
            )?;
            tracing::info!("{}: made private (0600)", file.display());
        }
    }
    Ok(())
}

impl Db {
    /// Opens (creating if needed) the database file and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<Db> {
        make_private(path)?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // No fsync per commit, only at checkpoints: in WAL mode that keeps the file
            // consistent whatever happens, and a killed or crashed daemon loses nothing it
            // committed; only a host crash or power loss can roll back the last commits,
            // and the sandboxes those rows name died with the host (the next start's
            // reconcile sweeps what no row names). A create commits 2-4 times: an fsync
            // each cost 0.2-8 ms on the build host, more under load.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(Error::db(format!("opening {}", path.display())))?;
        let migrations = MIGRATIONS
            .iter()
            .map(|(version, description, sql)| {
                Migration::new(
                    *version,
                    (*description).into(),
                    MigrationType::Simple,
                    sqlx::SqlSafeStr::into_sql_str(*sql),
                    false,
                )
            })
            .collect();
        Migrator::with_migrations(migrations).run(&pool).await?;
        Ok(Db { pool })
    }

    /// Makes every commit so far durable (a full WAL checkpoint syncs the WAL and the
    /// database file), for the rare step that must not be rolled back by a host crash.
    pub async fn sync_to_disk(&self) -> Result<()> {
        sqlx::query("PRAGMA wal_checkpoint(FULL)")
            .execute(&self.pool)
            .await
            .map_err(Error::db("checkpointing the database to disk"))?;
        Ok(())
    }

    /// The pool, for the modules that keep their own tables (store/snapshots.rs).
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Test fixture: a bare API key row `id` (a non-admin key with the default quotas), for
    /// rows that refer to a key.
    #[cfg(test)]
    pub(crate) async fn insert_test_key(&self, id: &str) -> std::result::Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO api_keys (id, name, key_hash, key_prefix, created_at) \
             VALUES ($1, $1, $1, 'e2b_', 0)",
        )
        .bind(id)
        .execute(&self.pool)
        .await
        .map(|_| ())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}
