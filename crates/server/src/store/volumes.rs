//! The volumes tables (migration 14; `storage` migration 18): `volumes` (one row a volume of a key) and
//! `sandbox_volumes` (which sandbox mounts which volume where). Every query of a volume
//! names the owning key: another key's volume is not found.

use super::{Db, Result};
use crate::error::Error;
use sqlx::Row;

/// A volume's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    pub id: String,
    pub key_id: String,
    pub name: String,
    /// Bearer token of the volume content API.
    pub token: String,
    pub created_at: i64,
    /// Migration 18: the volume's own bucket (volumes/storage.rs, its credentials sealed);
    /// `None` for the operator's.
    pub storage: Option<String>,
}

/// A sandbox's mount of a volume (E2B's `volumeMounts` entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRow {
    pub volume_id: String,
    pub name: String,
    pub path: String,
}

fn volume_from_row(row: &sqlx::sqlite::SqliteRow) -> std::result::Result<VolumeRow, sqlx::Error> {
    Ok(VolumeRow {
        id: row.try_get("id")?,
        key_id: row.try_get("key_id")?,
        name: row.try_get("name")?,
        token: row.try_get("token")?,
        created_at: row.try_get("created_at")?,
        storage: row.try_get("storage")?,
    })
}

impl Db {
    /// Records a new volume; false when its key already has one of that name.
    pub async fn insert_volume(&self, v: &VolumeRow) -> Result<bool> {
        let r = sqlx::query(
            "INSERT INTO volumes (id, key_id, name, token, created_at, storage) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&v.id)
        .bind(&v.key_id)
        .bind(&v.name)
        .bind(&v.token)
        .bind(v.created_at)
        .bind(&v.storage)
        .execute(self.pool())
        .await;
        match r {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(d)) if d.is_unique_violation() => Ok(false),
            Err(e) => Err(Error::db(format!("recording volume {}", v.name))(e)),
        }
    }

    /// Every volume in its key's own bucket: its id and recorded storage (key rotation).
    pub async fn all_volume_storages(&self) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query("SELECT id, storage FROM volumes WHERE storage IS NOT NULL")
            .fetch_all(self.pool())
            .await
            .map_err(Error::db("listing volume storages"))?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("storage")?)))
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(Error::db("decoding a volume storage"))
    }

    /// Records the volume's storage anew (resealed under another key).
    pub async fn set_volume_storage(&self, id: &str, storage: &str) -> Result<()> {
        sqlx::query("UPDATE volumes SET storage = $2 WHERE id = $1")
            .bind(id)
            .bind(storage)
            .execute(self.pool())
            .await
            .map_err(Error::db(format!("recording the storage of volume {id}")))?;
        Ok(())
    }

    /// The key's volume with this id or name.
    pub async fn volume(&self, key_id: &str, id_or_name: &str) -> Result<Option<VolumeRow>> {
        sqlx::query("SELECT * FROM volumes WHERE key_id = $1 AND (id = $2 OR name = $2)")
            .bind(key_id)
            .bind(id_or_name)
            .fetch_optional(self.pool())
            .await
            .map_err(Error::db(format!("reading volume {id_or_name}")))?
            .map(|r| volume_from_row(&r))
            .transpose()
            .map_err(Error::db("decoding a volume"))
    }

    /// The volume `id` whatever its key (the content API authenticates by its token).
    pub async fn volume_by_id(&self, id: &str) -> Result<Option<VolumeRow>> {
        sqlx::query("SELECT * FROM volumes WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(Error::db(format!("reading volume {id}")))?
            .map(|r| volume_from_row(&r))
            .transpose()
            .map_err(Error::db("decoding a volume"))
    }

    /// The key's volumes, oldest first.
    pub async fn volumes_of(&self, key_id: &str) -> Result<Vec<VolumeRow>> {
        let rows = sqlx::query("SELECT * FROM volumes WHERE key_id = $1 ORDER BY created_at, id")
            .bind(key_id)
            .fetch_all(self.pool())
            .await
            .map_err(Error::db("listing volumes"))?;
        rows.iter()
            .map(volume_from_row)
            .collect::<std::result::Result<_, _>>()
            .map_err(Error::db("decoding a volume"))
    }

    /// Deletes the volume unless a live sandbox mounts it: `Ok(false)` then (the check and
    /// the delete are one statement, so a create recording a mount cannot slip between).
    pub async fn delete_volume_unless_mounted(&self, id: &str) -> Result<bool> {
        // A sandbox not yet killed or failed still holds its volumes.
        let r = sqlx::query(
            "DELETE FROM volumes WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM sandbox_volumes m \
             JOIN sandboxes s ON s.id = m.sandbox_id WHERE m.volume_id = $1 \
             AND s.state NOT IN ('killed', 'error'))",
        )
        .bind(id)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!("deleting volume {id}")))?;
        Ok(r.rows_affected() == 1)
    }

    /// Live sandboxes mounting the volume.
    pub async fn volume_users(&self, id: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT DISTINCT m.sandbox_id FROM sandbox_volumes m JOIN sandboxes s \
             ON s.id = m.sandbox_id WHERE m.volume_id = $1 AND s.state NOT IN ('killed', 'error')",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await
        .map_err(Error::db(format!("reading the users of volume {id}")))?;
        rows.iter()
            .map(|r| r.try_get("sandbox_id"))
            .collect::<std::result::Result<_, _>>()
            .map_err(Error::db("decoding a sandbox id"))
    }

    /// Records the sandbox's mounts (before it boots).
    pub async fn insert_sandbox_volumes(
        &self,
        sandbox_id: &str,
        mounts: &[MountRow],
    ) -> Result<()> {
        let what = format!("recording the volume mounts of {sandbox_id}");
        let mut tx = self.pool().begin().await.map_err(Error::db(what.clone()))?;
        for m in mounts {
            sqlx::query(
                "INSERT INTO sandbox_volumes (sandbox_id, volume_id, path) VALUES ($1, $2, $3)",
            )
            .bind(sandbox_id)
            .bind(&m.volume_id)
            .bind(&m.path)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what.clone()))?;
        }
        tx.commit().await.map_err(Error::db(what))
    }

    /// The sandbox's mounts, by path.
    pub async fn sandbox_volumes(&self, sandbox_id: &str) -> Result<Vec<MountRow>> {
        let rows = sqlx::query(
            "SELECT m.volume_id, v.name, m.path FROM sandbox_volumes m JOIN volumes v \
             ON v.id = m.volume_id WHERE m.sandbox_id = $1 ORDER BY m.path",
        )
        .bind(sandbox_id)
        .fetch_all(self.pool())
        .await
        .map_err(Error::db(format!(
            "reading the volume mounts of {sandbox_id}"
        )))?;
        rows.iter()
            .map(|r| {
                Ok(MountRow {
                    volume_id: r.try_get("volume_id")?,
                    name: r.try_get("name")?,
                    path: r.try_get("path")?,
                })
            })
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(Error::db("decoding a volume mount"))
    }
}
