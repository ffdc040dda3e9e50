//! The `usage_intervals` table (migration 2), for metering (sandboxes/metering.rs).

use super::{Db, Result};
use crate::error::Error;
use sqlx::Row;

/// A stretch of time a sandbox ran, for metering (`end_ms` is now for a running one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageInterval {
    pub sandbox_id: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    pub start_ms: i64,
    pub end_ms: i64,
}

impl Db {
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
}
