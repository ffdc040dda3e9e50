//! The network tables (migrations 4, 5 and 14): `sandbox_networks` (each sandbox's egress
//! rules as JSON, its network id once the runtime made it, its traffic token and Host mask) and the private
//! networks of a key with their members. What the rows mean is networks/service.rs's.

use super::{Db, Result};
use crate::error::Error;

/// A sandbox's row of `sandbox_networks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNetworkRow {
    /// `None` until the runtime made the network.
    pub net_id: Option<String>,
    /// The egress rules, JSON.
    pub egress: String,
    pub traffic_token: Option<String>,
    /// `maskRequestHost`, as given.
    pub mask_request_host: Option<String>,
}

impl Db {
    /// Whether key `key_id` has a private network `name`.
    pub async fn private_network_exists(&self, key_id: &str, name: &str) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM private_networks WHERE key_id = $1 AND name = $2")
            .bind(key_id)
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(Error::db(format!("looking up private network {name}")))?;
        Ok(row.is_some())
    }

    /// The network row of a new sandbox: its rules (`egress`, JSON), token and Host mask, no
    /// network id.
    pub async fn insert_sandbox_network(
        &self,
        sandbox: &str,
        egress: &str,
        traffic_token: Option<&str>,
        mask_request_host: Option<&str>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_networks \
             (sandbox_id, net_id, egress, traffic_token, mask_request_host) \
             VALUES ($1, NULL, $2, $3, $4)",
        )
        .bind(sandbox)
        .bind(egress)
        .bind(traffic_token)
        .bind(mask_request_host)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!(
            "recording the network of sandbox {sandbox}"
        )))?;
        Ok(())
    }

    /// `sandbox` joins private network `name` of key `key_id` (a no-op if it is in it).
    pub async fn join_private_network(
        &self,
        key_id: &str,
        name: &str,
        sandbox: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT OR IGNORE INTO private_network_members (key_id, name, sandbox_id) \
         VALUES ($1, $2, $3)",
        )
        .bind(key_id)
        .bind(name)
        .bind(sandbox)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!(
            "adding {sandbox} to private network {name}"
        )))?;
        Ok(())
    }

    /// `to` joins the private networks of key `key_id` that `from` is in.
    pub async fn inherit_private_networks(&self, key_id: &str, from: &str, to: &str) -> Result<()> {
        sqlx::query(
            "INSERT OR IGNORE INTO private_network_members (key_id, name, sandbox_id) \
         SELECT m.key_id, m.name, $3 FROM private_network_members m \
         WHERE m.sandbox_id = $1 AND m.key_id = $2",
        )
        .bind(from)
        .bind(key_id)
        .bind(to)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!(
            "adding {to} to the private networks of {from}"
        )))?;
        Ok(())
    }

    /// The egress rules (JSON) recorded for `sandbox`, if it has a network row.
    pub async fn sandbox_egress(&self, sandbox: &str) -> Result<Option<String>> {
        let row: Option<(String,)> =
            sqlx::query_as("SELECT egress FROM sandbox_networks WHERE sandbox_id = $1")
                .bind(sandbox)
                .fetch_optional(self.pool())
                .await
                .map_err(Error::db(format!("reading the rules of sandbox {sandbox}")))?;
        Ok(row.map(|(e,)| e))
    }

    /// Sets the egress rules (JSON) of `sandbox`, making its row if it has none.
    pub async fn store_sandbox_egress(&self, sandbox: &str, egress: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_networks (sandbox_id, net_id, egress) VALUES ($1, NULL, $2) \
         ON CONFLICT (sandbox_id) DO UPDATE SET egress = excluded.egress",
        )
        .bind(sandbox)
        .bind(egress)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!("storing the rules of sandbox {sandbox}")))?;
        Ok(())
    }

    /// The egress proxy (JSON, with its password) recorded for `sandbox`.
    pub async fn sandbox_egress_proxy(&self, sandbox: &str) -> Result<Option<String>> {
        let row: Option<(Option<String>,)> =
            sqlx::query_as("SELECT egress_proxy FROM sandbox_networks WHERE sandbox_id = $1")
                .bind(sandbox)
                .fetch_optional(self.pool())
                .await
                .map_err(Error::db(format!(
                    "reading the egress proxy of sandbox {sandbox}"
                )))?;
        Ok(row.and_then(|(p,)| p))
    }

    /// Every recorded egress proxy (sandbox, JSON), for resealing their passwords.
    pub async fn all_sandbox_egress_proxies(&self) -> Result<Vec<(String, String)>> {
        sqlx::query_as(
            "SELECT sandbox_id, egress_proxy FROM sandbox_networks \
             WHERE egress_proxy IS NOT NULL",
        )
        .fetch_all(self.pool())
        .await
        .map_err(Error::db("reading the recorded egress proxies"))
    }

    /// Sets (`None`: clears) the egress proxy (JSON) of `sandbox`, which has a row.
    pub async fn set_sandbox_egress_proxy(&self, sandbox: &str, proxy: Option<&str>) -> Result<()> {
        sqlx::query("UPDATE sandbox_networks SET egress_proxy = $2 WHERE sandbox_id = $1")
            .bind(sandbox)
            .bind(proxy)
            .execute(self.pool())
            .await
            .map_err(Error::db(format!(
                "storing the egress proxy of sandbox {sandbox}"
            )))?;
        Ok(())
    }

    /// Sets how the ports of `sandbox` (which has a row) are reached: the token they want and
    /// the Host mask.
    pub async fn set_sandbox_port_access(
        &self,
        sandbox: &str,
        traffic_token: Option<&str>,
        mask_request_host: Option<&str>,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE sandbox_networks SET traffic_token = $2, mask_request_host = $3 \
             WHERE sandbox_id = $1",
        )
        .bind(sandbox)
        .bind(traffic_token)
        .bind(mask_request_host)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!(
            "recording how the ports of sandbox {sandbox} are reached"
        )))?;
        Ok(())
    }

    /// Records network `net_id` of `sandbox`; `egress` (JSON) only if it has no row yet.
    pub async fn record_sandbox_net_id(
        &self,
        sandbox: &str,
        net_id: &str,
        egress: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_networks (sandbox_id, net_id, egress) VALUES ($1, $2, $3) \
         ON CONFLICT (sandbox_id) DO UPDATE SET net_id = excluded.net_id",
        )
        .bind(sandbox)
        .bind(net_id)
        .bind(egress)
        .execute(self.pool())
        .await
        .map_err(Error::db(format!(
            "recording the network of sandbox {sandbox}"
        )))?;
        Ok(())
    }

    /// The network row of `sandbox`, if any.
    pub async fn sandbox_network(&self, sandbox: &str) -> Result<Option<SandboxNetworkRow>> {
        type Row = (Option<String>, String, Option<String>, Option<String>);
        let row: Option<Row> = sqlx::query_as(
            "SELECT net_id, egress, traffic_token, mask_request_host FROM sandbox_networks \
             WHERE sandbox_id = $1",
        )
        .bind(sandbox)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::db(format!(
            "reading the network of sandbox {sandbox}"
        )))?;
        Ok(row.map(
            |(net_id, egress, traffic_token, mask_request_host)| SandboxNetworkRow {
                net_id,
                egress,
                traffic_token,
                mask_request_host,
            },
        ))
    }

    /// Every private-network membership: `(key id, network name, sandbox id)`.
    pub async fn all_private_network_members(&self) -> Result<Vec<(String, String, String)>> {
        sqlx::query_as("SELECT key_id, name, sandbox_id FROM private_network_members")
            .fetch_all(self.pool())
            .await
            .map_err(Error::db("reading private-network members"))
    }

    /// The private networks of key `key_id`, by name: `(name, created_at)`.
    pub async fn private_networks_of_key(&self, key_id: &str) -> Result<Vec<(String, i64)>> {
        sqlx::query_as(
            "SELECT name, created_at FROM private_networks WHERE key_id = $1 ORDER BY name",
        )
        .bind(key_id)
        .fetch_all(self.pool())
        .await
        .map_err(Error::db("listing private networks"))
    }

    /// The memberships in private networks of key `key_id`, by sandbox: `(name, sandbox id)`.
    pub async fn private_network_members_of_key(
        &self,
        key_id: &str,
    ) -> Result<Vec<(String, String)>> {
        sqlx::query_as(
            "SELECT name, sandbox_id FROM private_network_members WHERE key_id = $1 \
         ORDER BY sandbox_id",
        )
        .bind(key_id)
        .fetch_all(self.pool())
        .await
        .map_err(Error::db("listing private-network members"))
    }

    /// Creates private network `name` of key `key_id`; false if it already exists.
    pub async fn insert_private_network(
        &self,
        key_id: &str,
        name: &str,
        created_at: i64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "INSERT OR IGNORE INTO private_networks (key_id, name, created_at) VALUES ($1, $2, $3)",
        )
        .bind(key_id)
        .bind(name)
        .bind(created_at)
        .execute(self.pool())
        .await
        .map_err(Error::db("creating a private network"))?;
        Ok(done.rows_affected() != 0)
    }

    /// Deletes private network `name` of key `key_id`; false if there was none.
    pub async fn delete_private_network(&self, key_id: &str, name: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM private_networks WHERE key_id = $1 AND name = $2")
            .bind(key_id)
            .bind(name)
            .execute(self.pool())
            .await
            .map_err(Error::db("deleting a private network"))?;
        Ok(done.rows_affected() != 0)
    }

    /// `sandbox` leaves private network `name` of key `key_id`; false if it was not in it.
    pub async fn leave_private_network(
        &self,
        key_id: &str,
        name: &str,
        sandbox: &str,
    ) -> Result<bool> {
        let done = sqlx::query(
            "DELETE FROM private_network_members WHERE key_id = $1 AND name = $2 AND sandbox_id = $3",
        )
        .bind(key_id)
        .bind(name)
        .bind(sandbox)
        .execute(self.pool())
        .await
        .map_err(Error::db("leaving a private network"))?;
        Ok(done.rows_affected() != 0)
    }

    /// Test fixture: key `key_1` and a bare `creating` sandbox `id` of it, for network rows
    /// to refer to.
    #[cfg(test)]
    pub(crate) async fn insert_test_sandbox(&self, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO api_keys (id, name, key_hash, key_prefix, created_at) \
             VALUES ('key_1', 'k', $1, 'e2b_', 0)",
        )
        .bind(format!("hash-{id}"))
        .execute(self.pool())
        .await?;
        sqlx::query(
            "INSERT INTO sandboxes (id, key_id, template_id, runtime, state, secure, vcpus, \
             memory_mib, disk_mib, created_at) \
             VALUES ($1, 'key_1', 'base', 'gvisor', 'creating', 0, 1, 512, 0, 0)",
        )
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

impl Db {
    /// The key owning the running sandbox on network `net_id` (what the egress proxy
    /// resolves a rule's secrets for); `None` if no running sandbox has that network, or
    /// (never expected: ids are random) sandboxes of two keys claim it.
    pub async fn key_of_running_net(&self, net_id: &str) -> Result<Option<String>> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT DISTINCT s.key_id FROM sandbox_networks n \
             JOIN sandboxes s ON s.id = n.sandbox_id WHERE n.net_id = $1 AND s.state = $2",
        )
        .bind(net_id)
        .bind(super::State::Running.as_str())
        .fetch_all(self.pool())
        .await
        .map_err(Error::db(format!(
            "looking up the owner of network {net_id}"
        )))?;
        match rows.as_slice() {
            [(k,)] => Ok(Some(k.clone())),
            _ => Ok(None),
        }
    }
}
