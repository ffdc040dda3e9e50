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

    /// Running sandboxes that have run `lifetime_ms` or more in all (their intervals
    /// summed, the open one up to `now`: time paused is not in any interval).
    pub async fn past_lifetime(&self, now: i64, lifetime_ms: i64) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT s.id AS id FROM sandboxes s JOIN usage_intervals u ON u.sandbox_id = s.id \
             WHERE s.state = 'running' GROUP BY s.id \
             HAVING SUM(CASE WHEN u.open = 1 THEN MAX($1, u.end_ms) - u.start_ms \
                        ELSE u.end_ms - u.start_ms END) >= $2",
        )
        .bind(now)
        .bind(lifetime_ms)
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(
            "looking for sandboxes past their longest lifetime",
        ))?;
        rows.iter()
            .map(|r| r.try_get("id"))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::db("reading sandboxes past their longest lifetime"))
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

#[cfg(test)]
mod tests {
    use crate::store::{Db, SandboxRow, State};

    fn row(id: &str, key_id: &str) -> SandboxRow {
        SandboxRow {
            id: id.into(),
            key_id: key_id.into(),
            template_id: "base".into(),
            runtime: "gvisor".into(),
            state: State::Creating,
            secure: false,
            access_token: None,
            metadata: Default::default(),
            vcpus: 1,
            memory_mib: 128,
            disk_mib: 0,
            envd_version: String::new(),
            created_at: 0,
            started_at: None,
            end_at: None,
            ended_at: None,
            end_reason: None,
            handle: None,
        }
    }

    #[tokio::test]
    async fn lifetime_counts_running_time_only() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db")).await.unwrap();
        let key = crate::keys::create_key(&db, "k", None, false)
            .await
            .unwrap();
        let r = row("sbx-1", &key.record.id);
        assert!(db.insert_sandbox_within_limit(&r, None).await.unwrap());
        assert!(db.mark_running(&r, 0, i64::MAX, "0", None).await.unwrap());
        assert!(db.past_lifetime(5_000, 10_000).await.unwrap().is_empty());
        // Paused at 4 s, resumed at 100 s: 4 s ran before, the pause does not count.
        assert!(
            db.transition("sbx-1", &[State::Running], State::Pausing, None, 4_000)
                .await
                .unwrap()
        );
        assert!(
            db.transition("sbx-1", &[State::Pausing], State::Paused, None, 4_000)
                .await
                .unwrap()
        );
        assert!(
            db.past_lifetime(200_000, 1).await.unwrap().is_empty(),
            "paused: not running"
        );
        assert!(
            db.transition("sbx-1", &[State::Paused], State::Resuming, None, 100_000)
                .await
                .unwrap()
        );
        let mut again = r.clone();
        again.state = State::Resuming;
        assert!(
            db.mark_running_again(&again, State::Resuming, 100_000, i64::MAX, None)
                .await
                .unwrap()
        );
        assert!(db.past_lifetime(105_000, 10_000).await.unwrap().is_empty());
        assert_eq!(
            db.past_lifetime(106_000, 10_000).await.unwrap(),
            vec!["sbx-1".to_string()]
        );
    }
}
