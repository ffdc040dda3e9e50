//! The daemon's state in SQLite through sqlx (runtime-checked queries, `$N` placeholders so
//! that the same SQL runs on PostgreSQL later). Migrations are embedded from
//! `crates/server/migrations/` and run on open.

use crate::error::Error;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow};
use sqlx::{Row, SqlitePool};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

type Result<T, E = Error> = std::result::Result<T, E>;

/// `(version, description, sql)`, in order. Never edit a released one: add a new file.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "initial", include_str!("../migrations/0001_initial.sql")),
    (
        2,
        "lifecycle metering",
        include_str!("../migrations/0002_lifecycle_metering.sql"),
    ),
    (
        3,
        "snapshots",
        include_str!("../migrations/0003_snapshots.sql"),
    ),
    (
        4,
        "networks",
        include_str!("../migrations/0004_networks.sql"),
    ),
    (
        5,
        "traffic token",
        include_str!("../migrations/0005_traffic_token.sql"),
    ),
    (
        6,
        "template builds",
        include_str!("../migrations/0006_template_builds.sql"),
    ),
    (
        7,
        "template tags",
        include_str!("../migrations/0007_template_tags.sql"),
    ),
];

pub use crate::state::State;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub id: String,
    pub name: String,
    pub key_prefix: String,
    pub is_admin: bool,
    pub max_sandboxes: Option<u32>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRow {
    pub id: String,
    pub key_id: String,
    pub template_id: String,
    pub runtime: String,
    pub state: State,
    pub secure: bool,
    pub access_token: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub vcpus: u32,
    pub memory_mib: u32,
    pub disk_mib: u32,
    pub envd_version: String,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub end_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub end_reason: Option<String>,
    /// The runtime's `SandboxHandle` as JSON, once running (see the migration 2).
    pub handle: Option<String>,
}

/// A stretch of time a sandbox ran, for metering (`end_ms` is now for a running one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageInterval {
    pub sandbox_id: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    pub start_ms: i64,
    pub end_ms: i64,
}

#[derive(Clone)]
pub struct Db {
    pool: SqlitePool,
}

const KEY_COLUMNS: &str = "id, name, key_prefix, is_admin, max_sandboxes, created_at, revoked_at";
const SANDBOX_COLUMNS: &str = "id, key_id, template_id, runtime, state, secure, access_token, \
     metadata, vcpus, memory_mib, disk_mib, envd_version, created_at, started_at, end_at, \
     ended_at, end_reason";
/// What is read: what is inserted, and what is written later.
const SANDBOX_READ_COLUMNS: &str = "id, key_id, template_id, runtime, state, secure, \
     access_token, metadata, vcpus, memory_mib, disk_mib, envd_version, created_at, \
     started_at, end_at, ended_at, end_reason, handle";

fn key_from_row(row: &SqliteRow) -> Result<KeyRow, sqlx::Error> {
    Ok(KeyRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        key_prefix: row.try_get("key_prefix")?,
        is_admin: row.try_get::<i64, _>("is_admin")? != 0,
        max_sandboxes: row
            .try_get::<Option<i64>, _>("max_sandboxes")?
            .map(|n| n.clamp(0, i64::from(u32::MAX)) as u32),
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

fn sandbox_from_row(row: &SqliteRow) -> Result<SandboxRow, sqlx::Error> {
    let state: String = row.try_get("state")?;
    let metadata: String = row.try_get("metadata")?;
    let u32_col = |name: &str| -> Result<u32, sqlx::Error> {
        Ok(row.try_get::<i64, _>(name)?.clamp(0, i64::from(u32::MAX)) as u32)
    };
    Ok(SandboxRow {
        id: row.try_get("id")?,
        key_id: row.try_get("key_id")?,
        template_id: row.try_get("template_id")?,
        runtime: row.try_get("runtime")?,
        state: State::parse(&state).ok_or_else(|| sqlx::Error::ColumnDecode {
            index: "state".into(),
            source: format!("unknown sandbox state {state:?}").into(),
        })?,
        secure: row.try_get::<i64, _>("secure")? != 0,
        access_token: row.try_get("access_token")?,
        metadata: serde_json::from_str(&metadata).map_err(|e| sqlx::Error::ColumnDecode {
            index: "metadata".into(),
            source: Box::new(e),
        })?,
        vcpus: u32_col("vcpus")?,
        memory_mib: u32_col("memory_mib")?,
        disk_mib: u32_col("disk_mib")?,
        envd_version: row.try_get("envd_version")?,
        created_at: row.try_get("created_at")?,
        started_at: row.try_get("started_at")?,
        end_at: row.try_get("end_at")?,
        ended_at: row.try_get("ended_at")?,
        end_reason: row.try_get("end_reason")?,
        handle: row.try_get("handle")?,
    })
}

/// `$from, $from+1, ...` for an `IN (...)` list.
fn placeholders(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Db {
    /// Opens (creating if needed) the database file and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<Db> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
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

    /// The pool, for the modules that keep their own tables (snapshot_store.rs).
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    // ---- keys ----

    pub async fn insert_key(&self, key: &KeyRow, key_hash: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_keys (id, name, key_hash, key_prefix, is_admin, max_sandboxes, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&key.id)
        .bind(&key.name)
        .bind(key_hash)
        .bind(&key.key_prefix)
        .bind(i64::from(key.is_admin))
        .bind(key.max_sandboxes.map(i64::from))
        .bind(key.created_at)
        .execute(&self.pool)
        .await
        .map_err(Error::db(format!("inserting API key {}", key.id)))?;
        Ok(())
    }

    /// The key with this hash, unless revoked.
    pub async fn active_key_by_hash(&self, key_hash: &str) -> Result<Option<KeyRow>> {
        let sql = format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(key_hash)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db("looking up an API key"))?;
        row.as_ref()
            .map(key_from_row)
            .transpose()
            .map_err(Error::db("reading an API key"))
    }

    /// API key `id`, revoked or not.
    pub async fn key_by_id(&self, id: &str) -> Result<Option<KeyRow>> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(format!("looking up API key {id}")))?;
        row.as_ref()
            .map(key_from_row)
            .transpose()
            .map_err(Error::db(format!("reading API key {id}")))
    }

    pub async fn list_keys(&self) -> Result<Vec<KeyRow>> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at, id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("listing API keys"))?;
        rows.iter()
            .map(key_from_row)
            .collect::<Result<_, _>>()
            .map_err(Error::db("reading API keys"))
    }

    pub async fn has_active_admin_key(&self) -> Result<bool> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM api_keys WHERE is_admin = 1 AND revoked_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(Error::db("counting admin keys"))?;
        Ok(n > 0)
    }

    /// Revokes the active keys whose id or name is `id_or_name`; returns their ids.
    pub async fn revoke_key(&self, id_or_name: &str, now: i64) -> Result<Vec<String>> {
        let ids: Vec<String> = sqlx::query_scalar(
            "UPDATE api_keys SET revoked_at = $1 \
             WHERE (id = $2 OR name = $2) AND revoked_at IS NULL RETURNING id",
        )
        .bind(now)
        .bind(id_or_name)
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(format!("revoking API key {id_or_name}")))?;
        Ok(ids)
    }

    // ---- sandboxes ----

    /// Inserts `row` (state `creating`) unless the key already has `max` live sandboxes;
    /// false when the limit held it back. One statement, so concurrent creates cannot
    /// both slip under the limit.
    pub async fn insert_sandbox_within_limit(
        &self,
        row: &SandboxRow,
        max: Option<u32>,
    ) -> Result<bool> {
        let live = placeholders(18, State::LIVE.len());
        let max_at = 18 + State::LIVE.len();
        let sql = format!(
            "INSERT INTO sandboxes ({SANDBOX_COLUMNS}) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17 \
             WHERE ${max_at} IS NULL OR (SELECT COUNT(*) FROM sandboxes WHERE key_id = $2 AND state IN ({live})) < ${max_at}"
        );
        let metadata = serde_json::to_string(&row.metadata).map_err(|e| Error::Io {
            what: "encoding sandbox metadata".into(),
            source: e.into(),
        })?;
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&row.id)
            .bind(&row.key_id)
            .bind(&row.template_id)
            .bind(&row.runtime)
            .bind(row.state.as_str())
            .bind(i64::from(row.secure))
            .bind(&row.access_token)
            .bind(metadata)
            .bind(i64::from(row.vcpus))
            .bind(i64::from(row.memory_mib))
            .bind(i64::from(row.disk_mib))
            .bind(&row.envd_version)
            .bind(row.created_at)
            .bind(row.started_at)
            .bind(row.end_at)
            .bind(row.ended_at)
            .bind(&row.end_reason);
        for s in State::LIVE {
            q = q.bind(s.as_str());
        }
        let done = q
            .bind(max.map(i64::from))
            .execute(&self.pool)
            .await
            .map_err(Error::db(format!("inserting sandbox {}", row.id)))?;
        Ok(done.rows_affected() == 1)
    }

    /// `creating` to `running`, with what a restarted daemon needs to adopt it (`handle`),
    /// and its first metering interval opened, in one transaction.
    pub async fn mark_running(
        &self,
        row: &SandboxRow,
        started_at: i64,
        end_at: i64,
        envd_version: &str,
        handle: Option<&str>,
    ) -> Result<bool> {
        let id = &row.id;
        let what = format!("marking sandbox {id} running");
        let mut tx = self.pool.begin().await.map_err(Error::db(what.clone()))?;
        let done = sqlx::query(
            "UPDATE sandboxes SET state = 'running', started_at = $2, end_at = $3, \
               envd_version = $4, handle = $5 \
             WHERE id = $1 AND state = 'creating'",
        )
        .bind(id)
        .bind(started_at)
        .bind(end_at)
        .bind(envd_version)
        .bind(handle)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(what.clone()))?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO usage_intervals (sandbox_id, key_id, vcpus, memory_mib, start_ms, end_ms, open) \
             VALUES ($1, $2, $3, $4, $5, $5, 1)",
        )
        .bind(id)
        .bind(&row.key_id)
        .bind(i64::from(row.vcpus))
        .bind(i64::from(row.memory_mib))
        .bind(started_at)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(what.clone()))?;
        tx.commit().await.map_err(Error::db(what))?;
        Ok(true)
    }

    /// Moves `id` from one of `from` to `to`; false if it was in none of them. Final states
    /// record when and why. Leaving `running` closes its metering interval at `now`, in the
    /// same transaction. A move the state machine forbids (state.rs) is an error.
    pub async fn transition(
        &self,
        id: &str,
        from: &[State],
        to: State,
        reason: Option<&str>,
        now: i64,
    ) -> Result<bool> {
        if let Some(bad) = from.iter().find(|f| !f.can_move_to(to)) {
            return Err(Error::Transition {
                id: id.to_string(),
                from: bad.as_str(),
                to: to.as_str(),
            });
        }
        let final_state = to.is_final();
        let sql = format!(
            "UPDATE sandboxes SET state = $2, \
               ended_at = CASE WHEN $3 THEN $4 ELSE ended_at END, \
               end_reason = COALESCE($5, end_reason) \
             WHERE id = $1 AND state IN ({})",
            placeholders(6, from.len())
        );
        let what = format!("moving sandbox {id} to {}", to.as_str());
        let mut tx = self.pool.begin().await.map_err(Error::db(what.clone()))?;
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(to.as_str())
            .bind(final_state)
            .bind(now)
            .bind(reason);
        for s in from {
            q = q.bind(s.as_str());
        }
        let done = q.execute(&mut *tx).await.map_err(Error::db(what.clone()))?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        if to != State::Running {
            sqlx::query(
                "UPDATE usage_intervals SET end_ms = MAX(end_ms, $2), open = 0 \
                 WHERE sandbox_id = $1 AND open = 1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what.clone()))?;
        }
        tx.commit().await.map_err(Error::db(what))?;
        Ok(true)
    }

    // ---- metering ----

    /// Closes the open metering interval of `id` where the last flush left it: for a
    /// sandbox found dead after a restart, whose end time nobody saw (never bill time we
    /// cannot vouch for).
    pub async fn close_usage_at_last_flush(&self, id: &str) -> Result<()> {
        sqlx::query("UPDATE usage_intervals SET open = 0 WHERE sandbox_id = $1 AND open = 1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(Error::db(format!("closing the metering of sandbox {id}")))?;
        Ok(())
    }

    /// Moves the end of every open interval to `now` (periodic, so a crash loses at most
    /// one period of a sandbox that died while the daemon was down).
    pub async fn flush_usage(&self, now: i64) -> Result<()> {
        sqlx::query("UPDATE usage_intervals SET end_ms = MAX(end_ms, $1) WHERE open = 1")
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(Error::db("flushing metering"))?;
        Ok(())
    }

    /// The intervals of `key_id` that overlap `[from, to)`, open ones ending at `now`
    /// (not clipped to the range).
    pub async fn usage(
        &self,
        key_id: &str,
        from: i64,
        to: i64,
        now: i64,
    ) -> Result<Vec<UsageInterval>> {
        let rows = sqlx::query(
            "SELECT sandbox_id, vcpus, memory_mib, start_ms, \
               CASE WHEN open = 1 THEN MAX(end_ms, $4) ELSE end_ms END AS end_ms \
             FROM usage_intervals \
             WHERE key_id = $1 AND start_ms < $3 AND (open = 1 OR end_ms > $2) \
             ORDER BY start_ms, sandbox_id",
        )
        .bind(key_id)
        .bind(from)
        .bind(to)
        .bind(now)
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(format!("reading the usage of key {key_id}")))?;
        rows.iter()
            .map(|r| {
                Ok(UsageInterval {
                    sandbox_id: r.try_get("sandbox_id")?,
                    vcpus: r.try_get::<i64, _>("vcpus")?.clamp(0, i64::from(u32::MAX)) as u32,
                    memory_mib: r
                        .try_get::<i64, _>("memory_mib")?
                        .clamp(0, i64::from(u32::MAX)) as u32,
                    start_ms: r.try_get("start_ms")?,
                    end_ms: r.try_get("end_ms")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::db(format!("reading the usage of key {key_id}")))
    }

    /// How many sandboxes are in each state (for `/metrics`).
    pub async fn count_by_state(&self) -> Result<Vec<(State, i64)>> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM sandboxes GROUP BY state")
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("counting sandboxes by state"))?;
        let mut out = Vec::new();
        for r in &rows {
            let state: String = r.try_get("state").map_err(Error::db("reading a state"))?;
            let n: i64 = r.try_get("n").map_err(Error::db("reading a count"))?;
            if let Some(s) = State::parse(&state) {
                out.push((s, n));
            }
        }
        Ok(out)
    }

    /// The sandbox `id` if it belongs to `key_id`.
    pub async fn sandbox_of_key(&self, key_id: &str, id: &str) -> Result<Option<SandboxRow>> {
        let sql =
            format!("SELECT {SANDBOX_READ_COLUMNS} FROM sandboxes WHERE id = $1 AND key_id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(key_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(format!("looking up sandbox {id}")))?;
        row.as_ref()
            .map(sandbox_from_row)
            .transpose()
            .map_err(Error::db(format!("reading sandbox {id}")))
    }

    pub async fn sandbox(&self, id: &str) -> Result<Option<SandboxRow>> {
        let sql = format!("SELECT {SANDBOX_READ_COLUMNS} FROM sandboxes WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(format!("looking up sandbox {id}")))?;
        row.as_ref()
            .map(sandbox_from_row)
            .transpose()
            .map_err(Error::db(format!("reading sandbox {id}")))
    }

    /// Sandboxes in one of `states`, of `key_id` if given.
    pub async fn sandboxes_in(
        &self,
        key_id: Option<&str>,
        states: &[State],
    ) -> Result<Vec<SandboxRow>> {
        let sql = format!(
            "SELECT {SANDBOX_READ_COLUMNS} FROM sandboxes WHERE ($1 IS NULL OR key_id = $1) \
             AND state IN ({}) ORDER BY created_at, id",
            placeholders(2, states.len())
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(key_id);
        for s in states {
            q = q.bind(s.as_str());
        }
        let rows = q
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("listing sandboxes"))?;
        rows.iter()
            .map(sandbox_from_row)
            .collect::<Result<_, _>>()
            .map_err(Error::db("reading sandboxes"))
    }

    /// Sets the end of running sandbox `id`: to `end_at`, or with `only_extend` to the later
    /// of the two. False when the sandbox is not running.
    pub async fn set_end_at(&self, id: &str, end_at: i64, only_extend: bool) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE sandboxes SET end_at = CASE WHEN $3 AND end_at > $2 THEN end_at ELSE $2 END \
             WHERE id = $1 AND state = 'running'",
        )
        .bind(id)
        .bind(end_at)
        .bind(only_extend)
        .execute(&self.pool)
        .await
        .map_err(Error::db(format!("setting the timeout of sandbox {id}")))?;
        Ok(done.rows_affected() == 1)
    }

    /// Running sandboxes whose time is up or whose key was revoked, with the reason.
    pub async fn due_for_kill(&self, now: i64) -> Result<Vec<(String, &'static str)>> {
        let rows = sqlx::query(
            "SELECT s.id AS id, (k.revoked_at IS NOT NULL) AS revoked FROM sandboxes s \
             JOIN api_keys k ON k.id = s.key_id \
             WHERE s.state = 'running' AND (s.end_at <= $1 OR k.revoked_at IS NOT NULL)",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db("looking for sandboxes past their timeout"))?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get("id")?;
                let revoked: bool = row.try_get("revoked")?;
                Ok((
                    id,
                    if revoked {
                        "its API key was revoked"
                    } else {
                        "its timeout was reached"
                    },
                ))
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::db("reading sandboxes past their timeout"))
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}
