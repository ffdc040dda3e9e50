//! The secrets tables (migration 13): `secrets` (one row a secret of a key: name,
//! metadata JSON, current version) and `secret_versions` (each version's sealed value).
//! Every query names the owning key: a secret of another key is not found. What the rows
//! mean, and the sealing, are secrets/service.rs's and secrets/crypto.rs's.

use super::{Db, Result};
use crate::error::Error;
use crate::secrets::crypto::Sealed;
use sqlx::Row;

/// A secret's row (never its value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRow {
    pub id: String,
    pub name: String,
    /// JSON object of strings.
    pub metadata: String,
    pub current_version: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A stored version: which secret, which version, the sealed value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRow {
    pub secret_id: String,
    pub version: i64,
    pub sealed: Sealed,
}

fn secret_from_row(row: &sqlx::sqlite::SqliteRow) -> std::result::Result<SecretRow, sqlx::Error> {
    Ok(SecretRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        metadata: row.try_get("metadata")?,
        current_version: row.try_get("current_version")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn version_from_row(row: &sqlx::sqlite::SqliteRow) -> std::result::Result<VersionRow, sqlx::Error> {
    Ok(VersionRow {
        secret_id: row.try_get("secret_id")?,
        version: row.try_get("version")?,
        sealed: Sealed {
            kid: row.try_get("kid")?,
            nonce: row.try_get("nonce")?,
            ciphertext: row.try_get("ciphertext")?,
        },
    })
}

/// Whether a failed insert broke the (key, name) uniqueness.
fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
}

impl Db {
    /// Records a new secret of key `key_id` with its version 1; false when the key already
    /// has a secret of that name.
    pub async fn insert_secret(
        &self,
        key_id: &str,
        secret: &SecretRow,
        sealed: &Sealed,
    ) -> Result<bool> {
        let what = format!("recording secret {}", secret.name);
        let mut tx = self.pool().begin().await.map_err(Error::db(what.clone()))?;
        let inserted = sqlx::query(
            "INSERT INTO secrets (id, key_id, name, metadata, current_version, created_at, \
             updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&secret.id)
        .bind(key_id)
        .bind(&secret.name)
        .bind(&secret.metadata)
        .bind(secret.current_version)
        .bind(secret.created_at)
        .bind(secret.updated_at)
        .execute(&mut *tx)
        .await;
        match inserted {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => return Ok(false),
            Err(e) => return Err(Error::db(what)(e)),
        }
        insert_version(
            &mut tx,
            &secret.id,
            secret.current_version,
            sealed,
            secret.created_at,
        )
        .await
        .map_err(Error::db(what.clone()))?;
        tx.commit().await.map_err(Error::db(what))?;
        Ok(true)
    }

    /// How many secrets key `key_id` has.
    pub async fn count_secrets(&self, key_id: &str) -> Result<i64> {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM secrets WHERE key_id = $1")
            .bind(key_id)
            .fetch_one(self.pool())
            .await
            .map_err(Error::db(format!("counting the secrets of key {key_id}")))?;
        Ok(n)
    }

    /// The secrets of key `key_id` after `(created_at, id)` (exclusive), oldest first, at
    /// most `limit`.
    pub async fn secrets_of_key(
        &self,
        key_id: &str,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<SecretRow>> {
        let (t, id) = after.unwrap_or((i64::MIN, ""));
        let rows = sqlx::query(
            "SELECT id, name, metadata, current_version, created_at, updated_at \
             FROM secrets WHERE key_id = $1 \
             AND (created_at > $2 OR (created_at = $2 AND id > $3)) \
             ORDER BY created_at, id LIMIT $4",
        )
        .bind(key_id)
        .bind(t)
        .bind(id)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(Error::db(format!("listing the secrets of key {key_id}")))?;
        rows.iter()
            .map(secret_from_row)
            .collect::<std::result::Result<_, _>>()
            .map_err(Error::db(format!("reading the secrets of key {key_id}")))
    }

    /// Key `key_id`'s secret whose id or (lower-case) name is `id_or_name`.
    pub async fn secret_of_key(&self, key_id: &str, id_or_name: &str) -> Result<Option<SecretRow>> {
        let what = format!("looking up secret {id_or_name}");
        let row = sqlx::query(
            "SELECT id, name, metadata, current_version, created_at, updated_at \
             FROM secrets WHERE key_id = $1 AND (id = $2 OR name = $2)",
        )
        .bind(key_id)
        .bind(id_or_name)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::db(what.clone()))?;
        row.as_ref()
            .map(secret_from_row)
            .transpose()
            .map_err(Error::db(what))
    }

    /// Appends version `from + 1` of secret `secret_id` (of key `key_id`) and makes it
    /// current, with new `metadata` if given; prunes versions older than the latest `keep`.
    /// False when the secret is gone or its current version is no longer `from` (a
    /// concurrent update won: the caller seals for the next number and tries again).
    #[allow(clippy::too_many_arguments)]
    pub async fn append_secret_version(
        &self,
        key_id: &str,
        secret_id: &str,
        from: i64,
        sealed: &Sealed,
        metadata: Option<&str>,
        now: i64,
        keep: i64,
    ) -> Result<bool> {
        let what = format!("updating secret {secret_id}");
        let version = from + 1;
        let mut tx = self.pool().begin().await.map_err(Error::db(what.clone()))?;
        let updated = sqlx::query(
            "UPDATE secrets SET current_version = $1, updated_at = $2, \
             metadata = COALESCE($3, metadata) \
             WHERE id = $4 AND key_id = $5 AND current_version = $6",
        )
        .bind(version)
        .bind(now)
        .bind(metadata)
        .bind(secret_id)
        .bind(key_id)
        .bind(from)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(what.clone()))?;
        if updated.rows_affected() == 0 {
            return Ok(false);
        }
        insert_version(&mut tx, secret_id, version, sealed, now)
            .await
            .map_err(Error::db(what.clone()))?;
        sqlx::query("DELETE FROM secret_versions WHERE secret_id = $1 AND version <= $2")
            .bind(secret_id)
            .bind(version - keep)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what.clone()))?;
        tx.commit().await.map_err(Error::db(what))?;
        Ok(true)
    }

    /// Deletes key `key_id`'s secret `secret_id` and all its versions; false if it has none.
    pub async fn delete_secret(&self, key_id: &str, secret_id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM secrets WHERE id = $1 AND key_id = $2")
            .bind(secret_id)
            .bind(key_id)
            .execute(self.pool())
            .await
            .map_err(Error::db(format!("deleting secret {secret_id}")))?;
        Ok(done.rows_affected() > 0)
    }

    /// The current version of key `key_id`'s secret named `name` (lower-case), sealed.
    pub async fn current_secret_version(
        &self,
        key_id: &str,
        name: &str,
    ) -> Result<Option<VersionRow>> {
        let what = format!("reading secret {name}");
        let row = sqlx::query(
            "SELECT v.secret_id, v.version, v.kid, v.nonce, v.ciphertext \
             FROM secrets s JOIN secret_versions v \
             ON v.secret_id = s.id AND v.version = s.current_version \
             WHERE s.key_id = $1 AND s.name = $2",
        )
        .bind(key_id)
        .bind(name)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::db(what.clone()))?;
        row.as_ref()
            .map(version_from_row)
            .transpose()
            .map_err(Error::db(what))
    }

    /// Every stored version of every key's secrets (key rotation reseals them all).
    pub async fn all_secret_versions(&self) -> Result<Vec<VersionRow>> {
        let rows = sqlx::query(
            "SELECT secret_id, version, kid, nonce, ciphertext FROM secret_versions \
             ORDER BY secret_id, version",
        )
        .fetch_all(self.pool())
        .await
        .map_err(Error::db("listing the secret versions"))?;
        rows.iter()
            .map(version_from_row)
            .collect::<std::result::Result<_, _>>()
            .map_err(Error::db("reading the secret versions"))
    }

    /// Replaces the sealed values of `versions` (same secret and version), all or none.
    pub async fn reseal_secret_versions(&self, versions: &[VersionRow]) -> Result<()> {
        let what = "resealing the secret versions";
        let mut tx = self.pool().begin().await.map_err(Error::db(what))?;
        for v in versions {
            sqlx::query(
                "UPDATE secret_versions SET kid = $1, nonce = $2, ciphertext = $3 \
                 WHERE secret_id = $4 AND version = $5",
            )
            .bind(&v.sealed.kid)
            .bind(&v.sealed.nonce)
            .bind(&v.sealed.ciphertext)
            .bind(&v.secret_id)
            .bind(v.version)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(what))?;
        }
        tx.commit().await.map_err(Error::db(what))?;
        Ok(())
    }
}

async fn insert_version(
    tx: &mut sqlx::SqliteConnection,
    secret_id: &str,
    version: i64,
    sealed: &Sealed,
    now: i64,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO secret_versions (secret_id, version, kid, nonce, ciphertext, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(secret_id)
    .bind(version)
    .bind(&sealed.kid)
    .bind(&sealed.nonce)
    .bind(&sealed.ciphertext)
    .bind(now)
    .execute(tx)
    .await?;
    Ok(())
}
