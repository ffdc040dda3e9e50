//! The tables of E2B template builds (migration 6: `template_builds`,
//! `template_build_logs`), tags (migration 7: `template_tags`, `template_build_tags`) and
//! owners (migration 8: `templates`, read through templates/access.rs).

use super::{Db, Result};
use crate::error::Error;
use crate::templates::access::TemplateAccess;
use crate::templates::builds::{BuildReport, LogEntry, Reason, Status};
use sqlx::Row;

impl Db {
    /// A new build, status `waiting`.
    pub async fn insert_template_build(
        &self,
        build_id: &str,
        template_id: &str,
        key_id: &str,
        cpu_count: Option<u32>,
        memory_mb: Option<u32>,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO template_builds (build_id, template_id, key_id, status, cpu_count, \
             memory_mb, created_at) VALUES ($1, $2, $3, 'waiting', $4, $5, $6)",
        )
        .bind(build_id)
        .bind(template_id)
        .bind(key_id)
        .bind(cpu_count.map(i64::from))
        .bind(memory_mb.map(i64::from))
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(Error::db("recording a template build"))?;
        Ok(())
    }

    /// Builds left `waiting` or `building` become `error: interrupted`; how many.
    pub async fn mark_interrupted_builds(&self, now: i64) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE template_builds SET status = 'error', reason = 'interrupted', \
             finished_at = $1 WHERE status IN ('waiting', 'building')",
        )
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(Error::db("marking interrupted template builds"))?;
        Ok(done.rows_affected())
    }

    /// A build as recorded, with its logs.
    pub async fn template_build(&self, build_id: &str) -> Result<Option<BuildReport>> {
        let Some(row) = sqlx::query(
            "SELECT template_id, key_id, status, reason, reason_step FROM template_builds \
         WHERE build_id = $1",
        )
        .bind(build_id)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::db("reading a template build"))?
        else {
            return Ok(None);
        };
        let logs = sqlx::query(
            "SELECT timestamp_ms, level, message, step FROM template_build_logs \
         WHERE build_id = $1 ORDER BY seq",
        )
        .bind(build_id)
        .fetch_all(self.pool())
        .await
        .map_err(Error::db("reading a template build's logs"))?;
        let level = |s: String| -> &'static str {
            match s.as_str() {
                "debug" => "debug",
                "info" => "info",
                "warn" => "warn",
                _ => "error",
            }
        };
        let reason: Option<String> = row.get("reason");
        Ok(Some(BuildReport {
            template_id: row.get("template_id"),
            key_id: row.get("key_id"),
            status: Status::parse(&row.get::<String, _>("status")),
            logs: logs
                .into_iter()
                .map(|r| LogEntry {
                    timestamp_ms: r.get("timestamp_ms"),
                    level: level(r.get("level")),
                    message: r.get("message"),
                    step: r.get("step"),
                })
                .collect(),
            reason: reason.map(|message| Reason {
                message,
                step: row.get("reason_step"),
            }),
        }))
    }

    /// A build's status and reason (`finished_at` once final), and its logs once final.
    pub async fn record_build_status(
        &self,
        build_id: &str,
        report: &BuildReport,
        finished_at: Option<i64>,
    ) -> Result<()> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(Error::db("starting a transaction"))?;
        sqlx::query(
            "UPDATE template_builds SET status = $2, reason = $3, reason_step = $4, \
         finished_at = $5 WHERE build_id = $1",
        )
        .bind(build_id)
        .bind(report.status.as_str())
        .bind(report.reason.as_ref().map(|r| r.message.clone()))
        .bind(report.reason.as_ref().and_then(|r| r.step.clone()))
        .bind(finished_at)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("updating a template build"))?;
        if report.status.is_final() {
            for (seq, e) in report.logs.iter().enumerate() {
                sqlx::query(
                    "INSERT OR REPLACE INTO template_build_logs \
                 (build_id, seq, timestamp_ms, level, message, step) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(build_id)
                .bind(seq as i64)
                .bind(e.timestamp_ms)
                .bind(e.level)
                .bind(&e.message)
                .bind(&e.step)
                .execute(&mut *tx)
                .await
                .map_err(Error::db("writing a template build's logs"))?;
            }
        }
        tx.commit()
            .await
            .map_err(Error::db("committing a template build"))
    }

    /// The key that made build `build_id`.
    pub async fn build_owner(&self, build_id: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query("SELECT key_id FROM template_builds WHERE build_id = $1")
                .bind(build_id)
                .fetch_optional(self.pool())
                .await
                .map_err(Error::db(format!("reading build {build_id}")))?
                .map(|r| r.get("key_id")),
        )
    }

    /// Records the tags build `build_id` asks for (it takes them when recorded ready).
    pub async fn request_build_tags(&self, build_id: &str, tags: &[String]) -> Result<()> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(Error::db("starting a transaction"))?;
        for tag in tags {
            sqlx::query(
                "INSERT OR IGNORE INTO template_build_tags (build_id, tag) VALUES ($1, $2)",
            )
            .bind(build_id)
            .bind(tag)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(format!("recording the tags of build {build_id}")))?;
        }
        tx.commit()
            .await
            .map_err(Error::db(format!("recording the tags of build {build_id}")))
    }

    /// Drops every tag of `template`.
    pub async fn forget_template_tags(&self, template: &str) -> Result<()> {
        sqlx::query("DELETE FROM template_tags WHERE template_id = $1")
            .bind(template)
            .execute(self.pool())
            .await
            .map_err(Error::db(format!(
                "deleting the tags of template {template}"
            )))?;
        Ok(())
    }

    /// The build `tag` of `template` names, if any.
    pub async fn tagged_build(&self, template: &str, tag: &str) -> Result<Option<String>> {
        sqlx::query("SELECT build_id FROM template_tags WHERE template_id = $1 AND tag = $2")
            .bind(template)
            .bind(tag)
            .fetch_optional(self.pool())
            .await
            .map(|row| row.map(|r| r.get("build_id")))
            .map_err(Error::db(format!(
                "reading tag {tag} of template {template}"
            )))
    }

    /// Points `tags` of `template` at `build_id` (moving them from other builds), in one
    /// transaction.
    pub async fn assign_tags(
        &self,
        template: &str,
        tags: &[String],
        build_id: &str,
        now: i64,
    ) -> Result<()> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(Error::db("starting a transaction"))?;
        for t in tags {
            sqlx::query(
                "INSERT OR REPLACE INTO template_tags (template_id, tag, build_id, assigned_at) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(template)
            .bind(t)
            .bind(build_id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(format!("tagging template {template}")))?;
        }
        tx.commit()
            .await
            .map_err(Error::db(format!("tagging template {template}")))
    }

    /// Removes `tags` of `template`, all or none: `Some(tag)`, the first one it does not
    /// have (then nothing was removed).
    pub async fn remove_tags(&self, template: &str, tags: &[String]) -> Result<Option<String>> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(Error::db("starting a transaction"))?;
        for tag in tags {
            let done = sqlx::query("DELETE FROM template_tags WHERE template_id = $1 AND tag = $2")
                .bind(template)
                .bind(tag)
                .execute(&mut *tx)
                .await
                .map_err(Error::db(format!("removing tags of template {template}")))?;
            if done.rows_affected() == 0 {
                // Dropping the transaction rolls back the tags removed so far.
                return Ok(Some(tag.clone()));
            }
        }
        tx.commit()
            .await
            .map_err(Error::db(format!("removing tags of template {template}")))?;
        Ok(None)
    }

    /// `template`'s tags: (tag, build id, assigned at), oldest first.
    pub async fn template_tags(&self, template: &str) -> Result<Vec<(String, String, i64)>> {
        let rows = sqlx::query(
            "SELECT tag, build_id, assigned_at FROM template_tags WHERE template_id = $1 \
             ORDER BY assigned_at, tag",
        )
        .bind(template)
        .fetch_all(self.pool())
        .await
        .map_err(Error::db(format!(
            "listing the tags of template {template}"
        )))?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get("tag"), r.get("build_id"), r.get("assigned_at")))
            .collect())
    }

    /// Template `name`'s owner row, if it has one (none: a system template).
    pub async fn template_access(&self, name: &str) -> Result<Option<TemplateAccess>> {
        sqlx::query("SELECT owner_key_id, public FROM templates WHERE name = $1")
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map(|row| {
                row.map(|r| TemplateAccess {
                    owner: r.get("owner_key_id"),
                    public: r.get::<i64, _>("public") != 0,
                })
            })
            .map_err(Error::db(format!("reading the owner of template {name}")))
    }

    /// Every owner row, by template name (for `GET /templates`).
    pub async fn template_accesses(&self) -> Result<Vec<(String, TemplateAccess)>> {
        let rows = sqlx::query("SELECT name, owner_key_id, public FROM templates")
            .fetch_all(self.pool())
            .await
            .map_err(Error::db("listing template owners"))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.get("name"),
                    TemplateAccess {
                        owner: r.get("owner_key_id"),
                        public: r.get::<i64, _>("public") != 0,
                    },
                )
            })
            .collect())
    }

    /// Claims `name` for `key_id` (private) unless someone holds it; the owner row after.
    pub async fn claim_template(
        &self,
        name: &str,
        key_id: &str,
        now: i64,
    ) -> Result<Option<TemplateAccess>> {
        sqlx::query(
            "INSERT OR IGNORE INTO templates (name, owner_key_id, public, created_at) \
             VALUES ($1, $2, 0, $3)",
        )
        .bind(name)
        .bind(key_id)
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!("claiming template {name}")))?;
        self.template_access(name).await
    }

    /// Sets `name`'s `public` flag (a system template gets an ownerless row).
    pub async fn set_template_public(&self, name: &str, public: bool, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO templates (name, owner_key_id, public, created_at) \
             VALUES ($1, NULL, $2, $3) ON CONFLICT (name) DO UPDATE SET public = $2",
        )
        .bind(name)
        .bind(i64::from(public))
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!("publishing template {name}")))?;
        Ok(())
    }

    /// Drops `name`'s owner row (it was deleted); with `only_owner`, only if that key owns
    /// it (a first build that failed or expired frees the name).
    pub async fn release_template(&self, name: &str, only_owner: Option<&str>) -> Result<()> {
        let query = match only_owner {
            Some(key) => sqlx::query("DELETE FROM templates WHERE name = $1 AND owner_key_id = $2")
                .bind(name)
                .bind(key),
            None => sqlx::query("DELETE FROM templates WHERE name = $1").bind(name),
        };
        query
            .execute(self.pool())
            .await
            .map_err(Error::db(format!("releasing template {name}")))?;
        Ok(())
    }
}
