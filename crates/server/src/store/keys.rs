//! The `api_keys` table (migrations 1 and 9), and what the sandboxes of a key (or of the
//! whole host) hold, for admission (sandboxes/admission.rs).

use super::{Db, Result};
use super::{State, placeholders};
use crate::error::Error;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

/// One quota of a key as stored (migration 9): NULL is [`Limit::Default`], -1
/// [`Limit::Unlimited`], N >= 0 [`Limit::Max`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Limit {
    /// The daemon's default for this quota (`sandcell serve --default-max-...`); none for
    /// an admin key.
    #[default]
    Default,
    Unlimited,
    Max(u64),
}

impl Limit {
    fn to_sql(self) -> Option<i64> {
        match self {
            Limit::Default => None,
            Limit::Unlimited => Some(-1),
            Limit::Max(n) => Some(i64::try_from(n).unwrap_or(i64::MAX)),
        }
    }

    fn from_sql(v: Option<i64>) -> Limit {
        match v {
            None => Limit::Default,
            Some(n) if n < 0 => Limit::Unlimited,
            Some(n) => Limit::Max(n as u64),
        }
    }

    /// The limit in force: `default` for [`Limit::Default`]; `None` is no limit.
    pub fn resolve(self, default: Option<u64>) -> Option<u64> {
        match self {
            Limit::Default => default,
            Limit::Unlimited => None,
            Limit::Max(n) => Some(n),
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Default => f.write_str("default"),
            Limit::Unlimited => f.write_str("unlimited"),
            Limit::Max(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for Limit {
    type Err = String;

    /// `N`, `unlimited` (or `none`) or `default`.
    fn from_str(s: &str) -> Result<Limit, String> {
        match s {
            "default" => Ok(Limit::Default),
            "unlimited" | "none" => Ok(Limit::Unlimited),
            n => n
                .parse::<u64>()
                .map(Limit::Max)
                .map_err(|_| format!("{n:?} is not a limit: a number, `unlimited` or `default`")),
        }
    }
}

/// A key's quotas as stored. Sandbox count and memory and disk are checked on every create,
/// restore, fork and resume (sandboxes/admission.rs); builds and uploads are recorded for
/// the template builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyQuotas {
    /// Live sandboxes (running, paused, being made or killed).
    pub sandboxes: Limit,
    /// Memory of its sandboxes that hold memory (all live ones but paused).
    pub memory_mib: Limit,
    /// Disks of its live sandboxes, plus the memory files of its paused ones.
    pub disk_mib: Limit,
    /// Template builds at once.
    pub builds: Limit,
    /// Uploaded build archives kept.
    pub upload_mib: Limit,
}

impl KeyQuotas {
    /// No limit on anything (a template build's own sandbox: templates/memory_snapshot.rs).
    pub const UNLIMITED: KeyQuotas = KeyQuotas {
        sandboxes: Limit::Unlimited,
        memory_mib: Limit::Unlimited,
        disk_mib: Limit::Unlimited,
        builds: Limit::Unlimited,
        upload_mib: Limit::Unlimited,
    };
}

/// The daemon's own key (migration 16): the owner of the sandboxes and snapshots it makes
/// for itself (templates/installed_snapshot.rs). No request can present it (its hash is no
/// sha256 hex), and listings, quota changes and revocations leave it out.
pub const SYSTEM_KEY_ID: &str = "key_system";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub id: String,
    pub name: String,
    pub key_prefix: String,
    pub is_admin: bool,
    pub quotas: KeyQuotas,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

const KEY_COLUMNS: &str = "id, name, key_prefix, is_admin, max_sandboxes, max_memory_mib, \
     max_disk_mib, max_builds, max_upload_mib, created_at, revoked_at";

fn key_from_row(row: &SqliteRow) -> Result<KeyRow, sqlx::Error> {
    let limit = |col: &str| -> Result<Limit, sqlx::Error> {
        Ok(Limit::from_sql(row.try_get::<Option<i64>, _>(col)?))
    };
    Ok(KeyRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        key_prefix: row.try_get("key_prefix")?,
        is_admin: row.try_get::<i64, _>("is_admin")? != 0,
        quotas: KeyQuotas {
            sandboxes: limit("max_sandboxes")?,
            memory_mib: limit("max_memory_mib")?,
            disk_mib: limit("max_disk_mib")?,
            builds: limit("max_builds")?,
            upload_mib: limit("max_upload_mib")?,
        },
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

/// What live sandboxes hold (of one key or of the host), from their rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InUse {
    /// Live sandboxes.
    pub sandboxes: u64,
    /// Memory of those that hold it: every live state but `paused`.
    pub memory_mib: u64,
    /// Their disks, plus the memory of the paused ones (saved to a file).
    pub disk_mib: u64,
}

impl Db {
    pub async fn insert_key(&self, key: &KeyRow, key_hash: &str) -> Result<()> {
        let q = &key.quotas;
        sqlx::query(
            "INSERT INTO api_keys (id, name, key_hash, key_prefix, is_admin, max_sandboxes, \
             max_memory_mib, max_disk_mib, max_builds, max_upload_mib, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&key.id)
        .bind(&key.name)
        .bind(key_hash)
        .bind(&key.key_prefix)
        .bind(i64::from(key.is_admin))
        .bind(q.sandboxes.to_sql())
        .bind(q.memory_mib.to_sql())
        .bind(q.disk_mib.to_sql())
        .bind(q.builds.to_sql())
        .bind(q.upload_mib.to_sql())
        .bind(key.created_at)
        .execute(&self.pool)
        .await
        .map_err(Error::db(format!("inserting API key {}", key.id)))?;
        Ok(())
    }

    /// Sets the quotas of the active keys whose id or name is `id_or_name`; returns their
    /// ids.
    pub async fn set_key_quotas(&self, id_or_name: &str, q: &KeyQuotas) -> Result<Vec<String>> {
        let ids: Vec<String> = sqlx::query_scalar(
            "UPDATE api_keys SET max_sandboxes = $2, max_memory_mib = $3, max_disk_mib = $4, \
             max_builds = $5, max_upload_mib = $6 \
             WHERE (id = $1 OR name = $1) AND revoked_at IS NULL AND id != 'key_system' \
             RETURNING id",
        )
        .bind(id_or_name)
        .bind(q.sandboxes.to_sql())
        .bind(q.memory_mib.to_sql())
        .bind(q.disk_mib.to_sql())
        .bind(q.builds.to_sql())
        .bind(q.upload_mib.to_sql())
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(format!(
            "setting the quotas of API key {id_or_name}"
        )))?;
        Ok(ids)
    }

    /// What the live sandboxes of `key_id` (of every key when `None`) hold.
    pub async fn in_use(&self, key_id: Option<&str>) -> Result<InUse> {
        let sql = format!(
            "SELECT state, COUNT(*) AS n, COALESCE(SUM(memory_mib), 0) AS mem, \
             COALESCE(SUM(disk_mib), 0) AS disk FROM sandboxes \
             WHERE ($1 IS NULL OR key_id = $1) AND state IN ({}) GROUP BY state",
            placeholders(2, State::LIVE.len())
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(key_id);
        for s in State::LIVE {
            q = q.bind(s.as_str());
        }
        let rows = q
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db("summing what live sandboxes hold"))?;
        let mut used = InUse::default();
        for r in &rows {
            let read = || -> Result<(String, i64, i64, i64), sqlx::Error> {
                Ok((
                    r.try_get("state")?,
                    r.try_get("n")?,
                    r.try_get("mem")?,
                    r.try_get("disk")?,
                ))
            };
            let (state, n, mem, disk) = read().map_err(Error::db("reading sandbox sums"))?;
            let (n, mem, disk) = (n.max(0) as u64, mem.max(0) as u64, disk.max(0) as u64);
            used.sandboxes += n;
            used.disk_mib += disk;
            if State::parse(&state) == Some(State::Paused) {
                used.disk_mib += mem;
            } else {
                used.memory_mib += mem;
            }
        }
        Ok(used)
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
        let sql = format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE id != '{SYSTEM_KEY_ID}' \
             ORDER BY created_at, id"
        );
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
             WHERE (id = $2 OR name = $2) AND revoked_at IS NULL AND id != 'key_system' \
             RETURNING id",
        )
        .bind(now)
        .bind(id_or_name)
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(format!("revoking API key {id_or_name}")))?;
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sandbox(db: &Db, id: &str, key: &str, state: &str, mem: i64, disk: i64) {
        sqlx::query(
            "INSERT INTO sandboxes (id, key_id, template_id, runtime, state, secure, vcpus, \
             memory_mib, disk_mib, created_at) VALUES ($1, $2, 'base', 'gvisor', $3, 0, 1, $4, $5, 0)",
        )
        .bind(id)
        .bind(key)
        .bind(state)
        .bind(mem)
        .bind(disk)
        .execute(db.pool())
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn in_use_sums_live_sandboxes_paused_memory_as_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let db = crate::keys::open_db(tmp.path()).await.unwrap();
        let a = crate::keys::create_key(&db, "a", None, false)
            .await
            .unwrap();
        let b = crate::keys::create_key(&db, "b", None, false)
            .await
            .unwrap();
        let (a, b) = (a.record.id, b.record.id);
        sandbox(&db, "sc-1", &a, "running", 512, 1000).await;
        sandbox(&db, "sc-2", &a, "paused", 1024, 1000).await;
        sandbox(&db, "sc-3", &a, "creating", 256, 10).await;
        sandbox(&db, "sc-4", &a, "killed", 4096, 4096).await;
        sandbox(&db, "sc-5", &a, "error", 4096, 4096).await;
        sandbox(&db, "sc-6", &b, "running", 2048, 5).await;
        assert_eq!(
            db.in_use(Some(&a)).await.unwrap(),
            InUse {
                sandboxes: 3,
                memory_mib: 512 + 256,
                disk_mib: 1000 + 1000 + 10 + 1024,
            }
        );
        let all = db.in_use(None).await.unwrap();
        assert_eq!(all.sandboxes, 4);
        assert_eq!(all.memory_mib, 512 + 256 + 2048);
        assert_eq!(db.in_use(Some("key_none")).await.unwrap(), InUse::default());
    }

    #[tokio::test]
    async fn quotas_round_trip_and_update_by_id_or_name() {
        let tmp = tempfile::tempdir().unwrap();
        let db = crate::keys::open_db(tmp.path()).await.unwrap();
        let q = KeyQuotas {
            sandboxes: Limit::Max(4),
            memory_mib: Limit::Unlimited,
            disk_mib: Limit::Max(0),
            builds: Limit::Default,
            upload_mib: Limit::Max(1 << 40),
        };
        let k = crate::keys::create_key_with(&db, "ci", q, false)
            .await
            .unwrap();
        let read = db.key_by_id(&k.record.id).await.unwrap().unwrap();
        assert_eq!(read.quotas, q);
        let changed = KeyQuotas {
            memory_mib: Limit::Max(2048),
            ..q
        };
        assert_eq!(
            db.set_key_quotas("ci", &changed).await.unwrap(),
            vec![k.record.id.clone()]
        );
        assert_eq!(
            db.key_by_id(&k.record.id).await.unwrap().unwrap().quotas,
            changed
        );
        assert!(
            db.set_key_quotas("nobody", &changed)
                .await
                .unwrap()
                .is_empty()
        );
        db.revoke_key("ci", 1).await.unwrap();
        // A revoked key's quotas are not changed.
        assert!(db.set_key_quotas("ci", &q).await.unwrap().is_empty());
    }
}
