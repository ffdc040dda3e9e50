//! The `installed_template_snapshots` table (migration 16): the memory snapshot of each
//! installed template with a start command, and the fingerprint of the image it was taken
//! of (templates/installed_snapshot.rs).

use super::{Db, Result};
use crate::error::Error;

/// One installed template's snapshot as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledSnapshotRow {
    pub template_id: String,
    pub fingerprint: String,
    pub snapshot_id: String,
}

impl From<(String, String, String)> for InstalledSnapshotRow {
    fn from((template_id, fingerprint, snapshot_id): (String, String, String)) -> Self {
        InstalledSnapshotRow {
            template_id,
            fingerprint,
            snapshot_id,
        }
    }
}

impl Db {
    /// The snapshot recorded for installed template `template`.
    pub async fn installed_snapshot(&self, template: &str) -> Result<Option<InstalledSnapshotRow>> {
        let row: Option<(String, String, String)> = sqlx::query_as(
            "SELECT template_id, fingerprint, snapshot_id FROM installed_template_snapshots \
             WHERE template_id = $1",
        )
        .bind(template)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::db(format!(
            "reading the snapshot of installed template {template}"
        )))?;
        Ok(row.map(InstalledSnapshotRow::from))
    }

    /// Every installed template's recorded snapshot.
    pub async fn installed_snapshots(&self) -> Result<Vec<InstalledSnapshotRow>> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT template_id, fingerprint, snapshot_id FROM installed_template_snapshots",
        )
        .fetch_all(self.pool())
        .await
        .map_err(Error::db("listing the snapshots of installed templates"))?;
        Ok(rows.into_iter().map(InstalledSnapshotRow::from).collect())
    }

    /// Records `row` as its template's snapshot; the one it replaces, if any.
    pub async fn set_installed_snapshot(
        &self,
        row: &InstalledSnapshotRow,
        now: i64,
    ) -> Result<Option<String>> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(Error::db("recording an installed template's snapshot"))?;
        let old: Option<String> = sqlx::query_scalar(
            "SELECT snapshot_id FROM installed_template_snapshots WHERE template_id = $1",
        )
        .bind(&row.template_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::db("recording an installed template's snapshot"))?;
        sqlx::query(
            "INSERT INTO installed_template_snapshots (template_id, fingerprint, snapshot_id, \
             created_at) VALUES ($1, $2, $3, $4) ON CONFLICT (template_id) DO UPDATE SET \
             fingerprint = excluded.fingerprint, snapshot_id = excluded.snapshot_id, \
             created_at = excluded.created_at",
        )
        .bind(&row.template_id)
        .bind(&row.fingerprint)
        .bind(&row.snapshot_id)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(format!(
            "recording the snapshot of installed template {}",
            row.template_id
        )))?;
        tx.commit()
            .await
            .map_err(Error::db("recording an installed template's snapshot"))?;
        Ok(old.filter(|old| *old != row.snapshot_id))
    }

    /// Forgets installed template `template`'s snapshot if it is still `snapshot_id`.
    pub async fn forget_installed_snapshot(&self, template: &str, snapshot_id: &str) -> Result<()> {
        sqlx::query(
            "DELETE FROM installed_template_snapshots WHERE template_id = $1 AND snapshot_id = $2",
        )
        .bind(template)
        .bind(snapshot_id)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!(
            "forgetting the snapshot of installed template {template}"
        )))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keys::SYSTEM_KEY_ID;

    fn row(snapshot: &str, fingerprint: &str) -> InstalledSnapshotRow {
        InstalledSnapshotRow {
            template_id: "code-interpreter-v1".into(),
            fingerprint: fingerprint.into(),
            snapshot_id: snapshot.into(),
        }
    }

    #[tokio::test]
    async fn a_new_snapshot_replaces_the_old_and_forget_needs_the_current_id() {
        let tmp = tempfile::tempdir().unwrap();
        let db = crate::keys::open_db(tmp.path()).await.unwrap();
        assert_eq!(
            db.installed_snapshot("code-interpreter-v1").await.unwrap(),
            None
        );
        assert_eq!(
            db.set_installed_snapshot(&row("snap-1", "f1"), 1)
                .await
                .unwrap(),
            None
        );
        // The same snapshot again replaces nothing.
        assert_eq!(
            db.set_installed_snapshot(&row("snap-1", "f1"), 2)
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            db.set_installed_snapshot(&row("snap-2", "f2"), 3)
                .await
                .unwrap(),
            Some("snap-1".into())
        );
        assert_eq!(
            db.installed_snapshot("code-interpreter-v1").await.unwrap(),
            Some(row("snap-2", "f2"))
        );
        // A stale forget (of the replaced snapshot) leaves the current one.
        db.forget_installed_snapshot("code-interpreter-v1", "snap-1")
            .await
            .unwrap();
        assert_eq!(
            db.installed_snapshots().await.unwrap(),
            vec![row("snap-2", "f2")]
        );
        db.forget_installed_snapshot("code-interpreter-v1", "snap-2")
            .await
            .unwrap();
        assert!(db.installed_snapshots().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_daemons_own_key_is_never_listed_changed_or_revoked() {
        let tmp = tempfile::tempdir().unwrap();
        let db = crate::keys::open_db(tmp.path()).await.unwrap();
        let system = db.key_by_id(SYSTEM_KEY_ID).await.unwrap().unwrap();
        assert!(!system.is_admin && system.revoked_at.is_none());
        assert!(
            db.list_keys()
                .await
                .unwrap()
                .iter()
                .all(|k| k.id != SYSTEM_KEY_ID)
        );
        assert!(db.revoke_key(SYSTEM_KEY_ID, 1).await.unwrap().is_empty());
        assert!(
            db.revoke_key("sandcell-system", 1)
                .await
                .unwrap()
                .is_empty()
        );
        let q = crate::store::keys::KeyQuotas::UNLIMITED;
        assert!(
            db.set_key_quotas(SYSTEM_KEY_ID, &q)
                .await
                .unwrap()
                .is_empty()
        );
    }
}
