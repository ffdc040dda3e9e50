//! What the sandbox log route (sandboxes/logs.rs) reads: a sandbox's running stretches,
//! the snapshots taken of it and the sandboxes forked from it, each with its time.

use super::{Db, Result};
use crate::error::Error;
use sqlx::Row;

/// One stretch of running: `end_ms` is `None` while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStretch {
    pub start_ms: i64,
    pub end_ms: Option<i64>,
}

/// A snapshot of the sandbox: its id, kind (`pause`, `named`, `fork`), name, time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEvent {
    pub id: String,
    pub kind: String,
    pub name: Option<String>,
    pub at_ms: i64,
}

impl Db {
    /// The running stretches of sandbox `id`, oldest first.
    pub async fn run_stretches(&self, id: &str) -> Result<Vec<RunStretch>> {
        let rows = sqlx::query(
            "SELECT start_ms, end_ms, open FROM usage_intervals WHERE sandbox_id = $1 \
             ORDER BY start_ms",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(format!(
            "reading the running times of sandbox {id}"
        )))?;
        rows.iter()
            .map(|r| {
                let open: i64 = r.try_get("open")?;
                Ok(RunStretch {
                    start_ms: r.try_get("start_ms")?,
                    end_ms: (open == 0).then(|| r.try_get("end_ms")).transpose()?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::db(format!(
                "reading the running times of sandbox {id}"
            )))
    }

    /// The snapshots taken of sandbox `id` (deleted ones too), oldest first.
    pub async fn snapshots_of(&self, id: &str) -> Result<Vec<SnapshotEvent>> {
        let rows = sqlx::query(
            "SELECT id, kind, name, created_at FROM snapshots WHERE source_id = $1 \
             ORDER BY created_at, id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(format!("reading the snapshots of sandbox {id}")))?;
        rows.iter()
            .map(|r| {
                Ok(SnapshotEvent {
                    id: r.try_get("id")?,
                    kind: r.try_get("kind")?,
                    name: r.try_get("name")?,
                    at_ms: r.try_get("created_at")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::db(format!("reading the snapshots of sandbox {id}")))
    }

    /// The sandboxes forked from `id` (live or not): (child id, created at), oldest first.
    pub async fn forks_of(&self, id: &str) -> Result<Vec<(String, i64)>> {
        sqlx::query_as(
            "SELECT b.id, b.created_at FROM sandbox_lifecycle l \
             JOIN sandboxes b ON b.id = l.sandbox_id WHERE l.parent_id = $1 \
             ORDER BY b.created_at, b.id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(format!("reading the forks of sandbox {id}")))
    }
}
