//! The `sandboxes` table (migrations 1 and 2): one row per sandbox, its state moves checked
//! against sandboxes/state.rs.

use super::{Db, Result};
use super::{State, placeholders};
use crate::error::Error;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use std::collections::BTreeMap;

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

const SANDBOX_COLUMNS: &str = "id, key_id, template_id, runtime, state, secure, access_token, \
     metadata, vcpus, memory_mib, disk_mib, envd_version, created_at, started_at, end_at, \
     ended_at, end_reason";
/// What is read: what is inserted, and what is written later.
const SANDBOX_READ_COLUMNS: &str = "id, key_id, template_id, runtime, state, secure, \
     access_token, metadata, vcpus, memory_mib, disk_mib, envd_version, created_at, \
     started_at, end_at, ended_at, end_reason, handle";

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

impl Db {
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
    /// same transaction. A move the state machine forbids (sandboxes/state.rs) is an error.
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
}
