//! The `api_keys` table (migration 1).

use super::{Db, Result};
use crate::error::Error;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

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

const KEY_COLUMNS: &str = "id, name, key_prefix, is_admin, max_sandboxes, created_at, revoked_at";

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

impl Db {
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
}
