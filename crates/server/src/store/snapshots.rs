//! The tables of pause, snapshots and fork (migration 3): `snapshots`, `snapshot_users` and
//! `sandbox_lifecycle`. Kept out of `store/` so that `SandboxRow` stays as it is.
//!
//! Files of snapshots are reference-counted through `snapshot_users`: a snapshot is needed
//! while it is a named snapshot the user has not deleted, or while a sandbox in a live state
//! (sandboxes/state.rs `LIVE`) uses it. Users are recorded BEFORE the runtime writes or restores
//! anything, so that a concurrent [`Db::unused_snapshots`] never takes files in use.

use crate::error::Error;
use crate::store::{Db, State};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

type Result<T, E = Error> = std::result::Result<T, E>;

/// What a snapshot is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotPurpose {
    /// The state of a paused sandbox.
    Pause,
    /// `POST /sandboxes/{id}/snapshots`: usable as a template until deleted.
    Named,
    /// What the children of one fork were restored from.
    Fork,
    /// An API-built template's state once its start command runs and its ready command
    /// succeeded (templates/memory_snapshot.rs): kept until the template is rebuilt or deleted.
    Template,
}

impl SnapshotPurpose {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotPurpose::Pause => "pause",
            SnapshotPurpose::Named => "named",
            SnapshotPurpose::Fork => "fork",
            SnapshotPurpose::Template => "template",
        }
    }

    fn parse(s: &str) -> Option<SnapshotPurpose> {
        [
            SnapshotPurpose::Pause,
            SnapshotPurpose::Named,
            SnapshotPurpose::Fork,
            SnapshotPurpose::Template,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub id: String,
    pub key_id: String,
    pub kind: SnapshotPurpose,
    pub name: Option<String>,
    pub source_id: String,
    pub template_id: String,
    pub dir: String,
    /// The runtime's `SnapshotHandle` as JSON; `None` until the snapshot was written.
    pub handle: Option<String>,
    pub created_at: i64,
    pub deleted_at: Option<i64>,
}

const COLUMNS: &str =
    "id, key_id, kind, name, source_id, template_id, dir, handle, created_at, deleted_at";

fn from_row(row: &SqliteRow) -> Result<SnapshotRow, sqlx::Error> {
    let kind: String = row.try_get("kind")?;
    Ok(SnapshotRow {
        id: row.try_get("id")?,
        key_id: row.try_get("key_id")?,
        kind: SnapshotPurpose::parse(&kind).ok_or_else(|| sqlx::Error::ColumnDecode {
            index: "kind".into(),
            source: format!("unknown snapshot kind {kind:?}").into(),
        })?,
        name: row.try_get("name")?,
        source_id: row.try_get("source_id")?,
        template_id: row.try_get("template_id")?,
        dir: row.try_get("dir")?,
        handle: row.try_get("handle")?,
        created_at: row.try_get("created_at")?,
        deleted_at: row.try_get("deleted_at")?,
    })
}

/// `'creating', 'running', ...`: the live states as an SQL list (constants, not input).
fn live_states_sql() -> String {
    State::LIVE
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `sandbox_lifecycle` of one sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LifecycleRow {
    pub auto_pause: bool,
    /// The auto-pause saves the files only (E2B's `autoPauseMemory: false`).
    pub auto_pause_files_only: bool,
    pub paused_in: Option<String>,
    pub parent_id: Option<String>,
    /// Auto-resume (http/wake.rs): `Some(timeout)` when a request for the paused sandbox
    /// resumes it, with that timeout in seconds.
    pub auto_resume: Option<u64>,
}

impl Db {
    /// Every snapshot but templates' own (kind `template`): (id, name, template id, key), for
    /// what a template is used by. The error is the database's, for the caller to word.
    pub async fn snapshot_sources(
        &self,
    ) -> Result<Vec<(String, Option<String>, String, String)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT id, name, template_id, key_id FROM snapshots WHERE kind != 'template'",
        )
        .fetch_all(self.pool())
        .await
    }

    /// Records a snapshot about to be written, used by `users` (one transaction). A named
    /// snapshot takes its name from an earlier one of the key, which is then deleted (E2B:
    /// the same name is a new build of the same snapshot template).
    pub async fn insert_snapshot(&self, snap: &SnapshotRow, users: &[&str]) -> Result<()> {
        let what = format!("recording snapshot {}", snap.id);
        let mut tx = self.pool().begin().await.map_err(Error::db(what.clone()))?;
        if let Some(name) = &snap.name {
            sqlx::query(
                "UPDATE snapshots SET deleted_at = $3 \
                 WHERE key_id = $1 AND name = $2 AND deleted_at IS NULL",
            )
            .bind(&snap.key_id)
            .bind(name)
            .bind(snap.created_at)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what.clone()))?;
        }
        let sql = format!(
            "INSERT INTO snapshots ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&snap.id)
            .bind(&snap.key_id)
            .bind(snap.kind.as_str())
            .bind(&snap.name)
            .bind(&snap.source_id)
            .bind(&snap.template_id)
            .bind(&snap.dir)
            .bind(&snap.handle)
            .bind(snap.created_at)
            .bind(snap.deleted_at)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what.clone()))?;
        for user in users {
            sqlx::query(
                "INSERT OR IGNORE INTO snapshot_users (snapshot_id, sandbox_id) VALUES ($1, $2)",
            )
            .bind(&snap.id)
            .bind(user)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what.clone()))?;
        }
        tx.commit().await.map_err(Error::db(what))?;
        Ok(())
    }

    pub async fn set_snapshot_handle(&self, id: &str, handle: &str) -> Result<()> {
        sqlx::query("UPDATE snapshots SET handle = $2 WHERE id = $1")
            .bind(id)
            .bind(handle)
            .execute(self.pool())
            .await
            .map_err(Error::db(format!("saving snapshot {id}")))?;
        Ok(())
    }

    /// Sandbox `sandbox_id` uses the files of `snapshot_id` from now on.
    pub async fn add_snapshot_user(&self, snapshot_id: &str, sandbox_id: &str) -> Result<()> {
        sqlx::query(
            "INSERT OR IGNORE INTO snapshot_users (snapshot_id, sandbox_id) VALUES ($1, $2)",
        )
        .bind(snapshot_id)
        .bind(sandbox_id)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!(
            "recording that sandbox {sandbox_id} uses snapshot {snapshot_id}"
        )))?;
        Ok(())
    }

    pub async fn remove_snapshot_user(&self, snapshot_id: &str, sandbox_id: &str) -> Result<()> {
        sqlx::query("DELETE FROM snapshot_users WHERE snapshot_id = $1 AND sandbox_id = $2")
            .bind(snapshot_id)
            .bind(sandbox_id)
            .execute(self.pool())
            .await
            .map_err(Error::db(format!(
                "forgetting that sandbox {sandbox_id} uses snapshot {snapshot_id}"
            )))?;
        Ok(())
    }

    /// Sandbox `sandbox_id` uses no snapshot's files but `keep`'s (paused into it, or
    /// `None`: it stopped).
    pub async fn drop_snapshot_users(&self, sandbox_id: &str, keep: Option<&str>) -> Result<()> {
        sqlx::query(
            "DELETE FROM snapshot_users WHERE sandbox_id = $1 AND ($2 IS NULL OR snapshot_id != $2)",
        )
        .bind(sandbox_id)
        .bind(keep)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!(
            "forgetting the snapshots of sandbox {sandbox_id}"
        )))?;
        Ok(())
    }

    /// Takes the rows of every snapshot nothing needs any more and returns them (the
    /// caller removes their directories).
    pub async fn take_unused_snapshots(&self) -> Result<Vec<SnapshotRow>> {
        let what = "collecting unused snapshots";
        let mut tx = self.pool().begin().await.map_err(Error::db(what))?;
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshots s \
             WHERE (s.kind NOT IN ('named', 'template') OR s.deleted_at IS NOT NULL) \
             AND NOT EXISTS (SELECT 1 FROM snapshot_users u JOIN sandboxes b ON b.id = u.sandbox_id \
                 WHERE u.snapshot_id = s.id AND b.state IN ({}))",
            live_states_sql()
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db(what))?;
        let rows = rows
            .iter()
            .map(from_row)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::db(what))?;
        for snap in &rows {
            sqlx::query("UPDATE sandbox_lifecycle SET paused_in = NULL WHERE paused_in = $1")
                .bind(&snap.id)
                .execute(&mut *tx)
                .await
                .map_err(Error::db(what))?;
            sqlx::query("DELETE FROM snapshot_users WHERE snapshot_id = $1")
                .bind(&snap.id)
                .execute(&mut *tx)
                .await
                .map_err(Error::db(what))?;
            sqlx::query("DELETE FROM snapshots WHERE id = $1")
                .bind(&snap.id)
                .execute(&mut *tx)
                .await
                .map_err(Error::db(what))?;
        }
        tx.commit().await.map_err(Error::db(what))?;
        Ok(rows)
    }

    /// Every snapshot directory the database knows (to tell orphans on disk).
    pub async fn snapshot_dirs(&self) -> Result<Vec<String>> {
        sqlx::query_scalar("SELECT dir FROM snapshots")
            .fetch_all(self.pool())
            .await
            .map_err(Error::db("listing snapshot directories"))
    }

    pub async fn snapshot(&self, id: &str) -> Result<Option<SnapshotRow>> {
        let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(Error::db(format!("looking up snapshot {id}")))?;
        row.as_ref()
            .map(from_row)
            .transpose()
            .map_err(Error::db(format!("reading snapshot {id}")))
    }

    /// The key's named, not deleted snapshot whose id or name is `id_or_name`.
    pub async fn named_snapshot(
        &self,
        key_id: &str,
        id_or_name: &str,
    ) -> Result<Option<SnapshotRow>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshots WHERE key_id = $1 AND kind = 'named' \
             AND deleted_at IS NULL AND (id = $2 OR name = $2)"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(key_id)
            .bind(id_or_name)
            .fetch_optional(self.pool())
            .await
            .map_err(Error::db(format!("looking up snapshot {id_or_name}")))?;
        row.as_ref()
            .map(from_row)
            .transpose()
            .map_err(Error::db(format!("reading snapshot {id_or_name}")))
    }

    /// The key's named, not deleted snapshots, oldest first.
    pub async fn named_snapshots(&self, key_id: &str) -> Result<Vec<SnapshotRow>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshots WHERE key_id = $1 AND kind = 'named' \
             AND deleted_at IS NULL ORDER BY created_at, id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(key_id)
            .fetch_all(self.pool())
            .await
            .map_err(Error::db("listing snapshots"))?;
        rows.iter()
            .map(from_row)
            .collect::<Result<_, _>>()
            .map_err(Error::db("reading snapshots"))
    }

    /// A snapshot that failed: nothing uses it, whatever its kind.
    pub async fn discard_snapshot(&self, id: &str, now: i64) -> Result<()> {
        let what = format!("discarding snapshot {id}");
        let mut tx = self.pool().begin().await.map_err(Error::db(what.clone()))?;
        sqlx::query("UPDATE snapshots SET deleted_at = $2 WHERE id = $1")
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what.clone()))?;
        sqlx::query("DELETE FROM snapshot_users WHERE snapshot_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what.clone()))?;
        tx.commit().await.map_err(Error::db(what))?;
        Ok(())
    }

    /// The template snapshots not retired: (snapshot id, template name).
    pub async fn template_snapshots(&self) -> Result<Vec<(String, String)>> {
        sqlx::query_as(
            "SELECT id, template_id FROM snapshots WHERE kind = 'template' AND deleted_at IS NULL",
        )
        .fetch_all(self.pool())
        .await
        .map_err(Error::db("listing template snapshots"))
    }

    /// Template snapshot `id` is no longer the template's: its files go once no sandbox
    /// restored from it needs them (unlike [`Db::discard_snapshot`], its users stay).
    pub async fn retire_template_snapshot(&self, id: &str, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE snapshots SET deleted_at = $2 WHERE id = $1 AND kind = 'template' \
             AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!("retiring template snapshot {id}")))?;
        Ok(())
    }

    /// Deletes the key's named snapshot `id`; false when there is none.
    pub async fn delete_named_snapshot(&self, key_id: &str, id: &str, now: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE snapshots SET deleted_at = $3 WHERE key_id = $1 AND id = $2 \
             AND kind = 'named' AND deleted_at IS NULL",
        )
        .bind(key_id)
        .bind(id)
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!("deleting snapshot {id}")))?;
        Ok(done.rows_affected() == 1)
    }

    // ---- sandbox_lifecycle ----

    pub async fn set_sandbox_lifecycle(&self, sandbox_id: &str, row: &LifecycleRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_lifecycle \
             (sandbox_id, auto_pause, paused_in, parent_id, auto_resume_timeout_secs, \
             auto_pause_files_only) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT(sandbox_id) DO UPDATE SET \
             auto_pause = excluded.auto_pause, paused_in = excluded.paused_in, \
             parent_id = excluded.parent_id, \
             auto_resume_timeout_secs = excluded.auto_resume_timeout_secs, \
             auto_pause_files_only = excluded.auto_pause_files_only",
        )
        .bind(sandbox_id)
        .bind(row.auto_pause)
        .bind(&row.paused_in)
        .bind(&row.parent_id)
        .bind(row.auto_resume.and_then(|t| i64::try_from(t).ok()))
        .bind(row.auto_pause_files_only)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!(
            "saving the lifecycle of sandbox {sandbox_id}"
        )))?;
        Ok(())
    }

    /// Defaults (no auto-pause or auto-resume, not paused, no parent) when nothing was
    /// recorded.
    pub async fn sandbox_lifecycle(&self, sandbox_id: &str) -> Result<LifecycleRow> {
        let row = sqlx::query(
            "SELECT auto_pause, paused_in, parent_id, auto_resume_timeout_secs, \
             auto_pause_files_only FROM sandbox_lifecycle WHERE sandbox_id = $1",
        )
        .bind(sandbox_id)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::db(format!(
            "reading the lifecycle of sandbox {sandbox_id}"
        )))?;
        let Some(row) = row else {
            return Ok(LifecycleRow::default());
        };
        let read = || -> Result<LifecycleRow, sqlx::Error> {
            Ok(LifecycleRow {
                auto_pause: row.try_get::<i64, _>("auto_pause")? != 0,
                auto_pause_files_only: row.try_get::<i64, _>("auto_pause_files_only")? != 0,
                paused_in: row.try_get("paused_in")?,
                parent_id: row.try_get("parent_id")?,
                auto_resume: row
                    .try_get::<Option<i64>, _>("auto_resume_timeout_secs")?
                    .and_then(|t| u64::try_from(t).ok()),
            })
        };
        read().map_err(Error::db(format!(
            "reading the lifecycle of sandbox {sandbox_id}"
        )))
    }

    /// The sandboxes forked from `parent_id` that are still live, oldest first.
    pub async fn live_children(&self, parent_id: &str) -> Result<Vec<String>> {
        let sql = format!(
            "SELECT l.sandbox_id FROM sandbox_lifecycle l JOIN sandboxes b ON b.id = l.sandbox_id \
             WHERE l.parent_id = $1 AND b.state IN ({}) ORDER BY b.created_at, b.id",
            live_states_sql()
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(parent_id)
            .fetch_all(self.pool())
            .await
            .map_err(Error::db(format!("listing the children of {parent_id}")))
    }

    /// The runtime handle of running sandbox `id` changed (a checkpoint restored in place
    /// runs in a new host process).
    pub async fn set_handle(&self, id: &str, handle: Option<&str>) -> Result<()> {
        sqlx::query("UPDATE sandboxes SET handle = $2 WHERE id = $1")
            .bind(id)
            .bind(handle)
            .execute(self.pool())
            .await
            .map_err(Error::db(format!("saving the handle of sandbox {id}")))?;
        Ok(())
    }

    /// `from` (resuming, or pausing after a failed pause) to `running`, with the sandbox's
    /// handle and end, and a new metering interval opened (paused time is not billed), in
    /// one transaction.
    pub async fn mark_running_again(
        &self,
        row: &crate::store::SandboxRow,
        from: State,
        now: i64,
        end_at: i64,
        handle: Option<&str>,
    ) -> Result<bool> {
        let id = &row.id;
        if !from.can_move_to(State::Running) {
            return Err(Error::Transition {
                id: id.clone(),
                from: from.as_str(),
                to: State::Running.as_str(),
            });
        }
        let what = format!("marking sandbox {id} running again");
        let mut tx = self.pool().begin().await.map_err(Error::db(what.clone()))?;
        let done = sqlx::query(
            "UPDATE sandboxes SET state = 'running', end_at = $2, handle = $3 \
             WHERE id = $1 AND state = $4",
        )
        .bind(id)
        .bind(end_at)
        .bind(handle)
        .bind(from.as_str())
        .execute(&mut *tx)
        .await
        .map_err(Error::db(what.clone()))?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO usage_intervals (sandbox_id, key_id, vcpus, memory_mib, start_ms, end_ms, open) \
             VALUES ($1, $2, $3, $4, $5, $5, 1) \
             ON CONFLICT(sandbox_id, start_ms) DO UPDATE SET open = 1",
        )
        .bind(id)
        .bind(&row.key_id)
        .bind(i64::from(row.vcpus))
        .bind(i64::from(row.memory_mib))
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(what.clone()))?;
        sqlx::query("UPDATE sandbox_lifecycle SET paused_in = NULL WHERE sandbox_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what.clone()))?;
        tx.commit().await.map_err(Error::db(what))?;
        Ok(true)
    }
}
