//! The sandbox tools (create, list, info, kill, pause, resume, fork, snapshot, timeout),
//! `network_update` and `port_url`: one REST call each (crates/server's sandboxes/,
//! snapshots/ and networks/ routes), the daemon's answer passed on as structured content.

use crate::error::ToolError;
use crate::exec;
use crate::tools::json_result;
use hyper::Method;
use rmcp::model::CallToolResult;
use sandcell_client::{Client, ListFilter, checked};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The longest timeout a tool sets (the daemon has its own limit too).
const MAX_TIMEOUT_SECS: u64 = 24 * 3600;
/// The most children one fork makes (the daemon's limit).
const MAX_FORK: u32 = 100;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// Template to start from: `base` (Debian with common tools) unless the user named
    /// another, or a snapshot id/name from sandbox_snapshot.
    #[serde(default = "default_template")]
    pub template: String,
    /// Seconds until the daemon kills the sandbox (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u64")]
    pub timeout_seconds: Option<u64>,
    /// Environment variables of every command run in the sandbox.
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    /// Key-value labels; sandbox_list can filter on them.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Allow only these outbound destinations (IP, CIDR, domain or *.domain); everything
    /// else is then refused.
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// Refuse these outbound destinations (IP or CIDR).
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// false: no internet access at all, except what allow_out allows (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "bool")]
    pub allow_internet: Option<bool>,
    /// Private networks of this API key to join (members reach each other by IP and id).
    #[serde(default)]
    pub networks: Vec<String>,
}

fn default_template() -> String {
    "base".to_string()
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only sandboxes in these states: `running`, `paused` (default: running).
    #[serde(default)]
    pub state: Vec<String>,
    /// Only sandboxes with all of these metadata pairs.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdArgs {
    /// The sandbox's id, as sandbox_create or sandbox_list returned it.
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeArgs {
    /// The paused sandbox's id.
    pub sandbox_id: String,
    /// Seconds from now until the daemon pauses or kills it again (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u64")]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    /// The running sandbox to fork.
    pub sandbox_id: String,
    /// How many new sandboxes (1 to 100, default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// Seconds until each new sandbox's timeout (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u64")]
    pub timeout_seconds: Option<u64>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArgs {
    /// The running sandbox to snapshot.
    pub sandbox_id: String,
    /// A name to create sandboxes from (a later snapshot of the same name replaces it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// Seconds from now until the daemon kills it.
    pub timeout_seconds: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The TCP port a program in the sandbox listens on (1 to 65535).
    pub port: u16,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkArgs {
    /// The running sandbox's id.
    pub sandbox_id: String,
    /// Outbound destinations allowed (IP, CIDR, domain or *.domain).
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// Outbound destinations refused (IP or CIDR).
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// false: refuse all internet access but what allow_out allows (default true).
    #[serde(default = "yes")]
    pub allow_internet: bool,
}

fn yes() -> bool {
    true
}

/// Refuses an id that would change the path it is put in.
fn path_safe(what: &str, s: &str) -> Result<(), ToolError> {
    if s.is_empty() || s.contains(['/', '?', '#', '%', ' ']) || s.len() > 256 {
        return Err(ToolError::Invalid(format!(
            "invalid {what} {s:?}: pass it exactly as sandbox_create or sandbox_list returned it"
        )));
    }
    Ok(())
}

fn timeout(secs: Option<u64>) -> Result<Option<u64>, ToolError> {
    match secs {
        Some(0) => Err(ToolError::Invalid(
            "timeout_seconds must be at least 1 (sandbox_kill ends a sandbox now)".into(),
        )),
        Some(s) if s > MAX_TIMEOUT_SECS => Err(ToolError::Invalid(format!(
            "timeout_seconds {s} is more than {MAX_TIMEOUT_SECS} (a day)"
        ))),
        other => Ok(other),
    }
}

/// One REST call; its JSON answer (`null` when it had no body).
pub async fn api(
    client: &Client,
    method: Method,
    path: &str,
    body: Option<Value>,
    sandbox: Option<&str>,
) -> Result<Value, ToolError> {
    let resp = client
        .api(method, path, body.as_ref())
        .await
        .and_then(checked)
        .map_err(|e| ToolError::daemon(&e, sandbox))?;
    if resp.body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&resp.body)
        .map_err(|e| ToolError::Daemon(format!("the daemon's answer to {path} is not JSON: {e}")))
}

pub async fn create(client: &Client, a: CreateArgs) -> Result<CallToolResult, ToolError> {
    let mut body = json!({ "templateID": a.template });
    if let Some(t) = timeout(a.timeout_seconds)? {
        body["timeout"] = json!(t);
    }
    if !a.env_vars.is_empty() {
        body["envVars"] = json!(a.env_vars);
    }
    if !a.metadata.is_empty() {
        body["metadata"] = json!(a.metadata);
    }
    if let Some(allow) = a.allow_internet {
        body["allow_internet_access"] = json!(allow);
    }
    if !a.allow_out.is_empty() || !a.deny_out.is_empty() {
        body["network"] = json!({ "allowOut": a.allow_out, "denyOut": a.deny_out });
    }
    if !a.networks.is_empty() {
        body["networks"] = json!(a.networks);
    }
    let created = api(client, Method::POST, "/v2/sandboxes", Some(body), None).await?;
    Ok(json_result(json!({
        "sandbox_id": created["sandboxID"],
        "template": created["templateID"],
        "domain": created["domain"],
    })))
}

pub async fn list(client: &Client, a: ListArgs) -> Result<CallToolResult, ToolError> {
    let filter = ListFilter {
        metadata: a.metadata,
        states: a.state,
    };
    let list = client
        .list_sandboxes_where(&filter)
        .await
        .map_err(|e| ToolError::daemon(&e, None))?;
    let sandboxes: Vec<Value> = list
        .iter()
        .map(|s| {
            json!({
                "sandbox_id": s.sandbox_id,
                "template": s.template_id,
                "state": s.state,
                "started_at": s.started_at,
                "end_at": s.end_at,
                "metadata": s.metadata,
            })
        })
        .collect();
    Ok(json_result(json!({ "sandboxes": sandboxes })))
}

pub async fn info(client: &Client, a: IdArgs) -> Result<CallToolResult, ToolError> {
    path_safe("sandbox_id", &a.sandbox_id)?;
    let id = &a.sandbox_id;
    let mut detail = api(
        client,
        Method::GET,
        &format!("/sandboxes/{id}"),
        None,
        Some(id),
    )
    .await?;
    // A credential for the sandbox's agent: not the model's business.
    if let Some(obj) = detail.as_object_mut() {
        obj.remove("envdAccessToken");
        obj.remove("trafficAccessToken");
    }
    Ok(json_result(detail))
}

pub async fn kill(client: &Client, a: IdArgs) -> Result<CallToolResult, ToolError> {
    path_safe("sandbox_id", &a.sandbox_id)?;
    let id = &a.sandbox_id;
    api(
        client,
        Method::DELETE,
        &format!("/sandboxes/{id}"),
        None,
        Some(id),
    )
    .await?;
    Ok(json_result(json!({ "sandbox_id": id, "killed": true })))
}

pub async fn pause(client: &Client, a: IdArgs) -> Result<CallToolResult, ToolError> {
    path_safe("sandbox_id", &a.sandbox_id)?;
    let id = &a.sandbox_id;
    let path = format!("/sandboxes/{id}/pause");
    api(client, Method::POST, &path, None, Some(id)).await?;
    Ok(json_result(json!({ "sandbox_id": id, "state": "paused" })))
}

pub async fn resume(client: &Client, a: ResumeArgs) -> Result<CallToolResult, ToolError> {
    path_safe("sandbox_id", &a.sandbox_id)?;
    let id = &a.sandbox_id;
    let body = timeout(a.timeout_seconds)?.map(|t| json!({ "timeout": t }));
    let path = format!("/v2/sandboxes/{id}/connect");
    api(client, Method::POST, &path, body, Some(id)).await?;
    Ok(json_result(json!({ "sandbox_id": id, "state": "running" })))
}

pub async fn fork(client: &Client, a: ForkArgs) -> Result<CallToolResult, ToolError> {
    path_safe("sandbox_id", &a.sandbox_id)?;
    if !(1..=MAX_FORK).contains(&a.count) {
        return Err(ToolError::Invalid(format!(
            "count {} is out of range: 1 to {MAX_FORK}",
            a.count
        )));
    }
    let id = &a.sandbox_id;
    let body = json!({ "count": a.count, "timeout": timeout(a.timeout_seconds)?.unwrap_or(300) });
    let path = format!("/sandboxes/{id}/fork");
    let results = api(client, Method::POST, &path, Some(body), Some(id)).await?;
    let mut children = Vec::new();
    let mut errors = Vec::new();
    for r in results.as_array().into_iter().flatten() {
        match r["sandbox"]["sandboxID"].as_str() {
            Some(child) => children.push(Value::from(child)),
            None => errors.push(r["error"].clone()),
        }
    }
    Ok(json_result(json!({
        "parent": id,
        "sandbox_ids": children,
        "errors": errors,
    })))
}

pub async fn snapshot(client: &Client, a: SnapshotArgs) -> Result<CallToolResult, ToolError> {
    path_safe("sandbox_id", &a.sandbox_id)?;
    let id = &a.sandbox_id;
    let body = a.name.as_ref().map(|n| json!({ "name": n }));
    let path = format!("/sandboxes/{id}/snapshots");
    let info = api(client, Method::POST, &path, body, Some(id)).await?;
    Ok(json_result(json!({
        "sandbox_id": id,
        "snapshot_id": info["snapshotID"],
        "name": a.name,
        "use_as_template": info["snapshotID"],
    })))
}

pub async fn set_timeout(client: &Client, a: TimeoutArgs) -> Result<CallToolResult, ToolError> {
    path_safe("sandbox_id", &a.sandbox_id)?;
    let id = &a.sandbox_id;
    let secs = timeout(Some(a.timeout_seconds))?.unwrap_or(a.timeout_seconds);
    client
        .set_timeout(id, secs)
        .await
        .map_err(|e| ToolError::daemon(&e, Some(id)))?;
    Ok(json_result(
        json!({ "sandbox_id": id, "timeout_seconds": secs }),
    ))
}

pub async fn network_update(client: &Client, a: NetworkArgs) -> Result<CallToolResult, ToolError> {
    path_safe("sandbox_id", &a.sandbox_id)?;
    let id = &a.sandbox_id;
    let body = json!({
        "allow_internet_access": a.allow_internet,
        "allowOut": a.allow_out,
        "denyOut": a.deny_out,
    });
    let path = format!("/sandboxes/{id}/network");
    api(client, Method::PUT, &path, Some(body), Some(id)).await?;
    Ok(json_result(json!({
        "sandbox_id": id,
        "allow_out": a.allow_out,
        "deny_out": a.deny_out,
        "allow_internet": a.allow_internet,
    })))
}

/// The sandbox's domain (`--domain`) gives a host per port; without one, the port is
/// reached through the daemon with routing headers. Whether something listens is read
/// from the sandbox's /proc/net/tcp{,6} (no tool needed in the image).
pub async fn port_url(
    client: &Client,
    public_url: &str,
    a: PortArgs,
) -> Result<CallToolResult, ToolError> {
    path_safe("sandbox_id", &a.sandbox_id)?;
    if a.port == 0 {
        return Err(ToolError::Invalid("port must be 1 to 65535".into()));
    }
    let id = &a.sandbox_id;
    let detail = client
        .get_sandbox(id)
        .await
        .map_err(|e| ToolError::daemon(&e, Some(id)))?;
    let listening = exec::capture(client, id, "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null")
        .await
        .map(|table| listeners(&table, a.port))?;
    let port = a.port;
    let mut out = json!({
        "sandbox_id": id,
        "port": port,
        "listening": !listening.is_empty(),
        "listen_addresses": listening,
    });
    match detail.domain.as_deref().filter(|d| !d.is_empty()) {
        Some(domain) => {
            out["host"] = json!(format!("{port}-{id}.{domain}"));
            out["url"] = json!(format!("http://{port}-{id}.{domain}"));
        }
        None => {
            out["url"] = json!(public_url);
            out["headers"] = json!({ "E2b-Sandbox-Id": id, "E2b-Sandbox-Port": port.to_string() });
            out["note"] =
                json!("the daemon has no --domain: send requests to url with these headers");
        }
    }
    if !listening.is_empty()
        && listening
            .iter()
            .all(|a| a.starts_with("127.") || a == "::1")
    {
        out["warning"] = json!(
            "the program listens on loopback only: bind it to 0.0.0.0 to reach it from outside"
        );
    }
    Ok(json_result(out))
}

/// The local addresses in a /proc/net/tcp{,6} table listening (state 0A) on `port`.
fn listeners(table: &str, port: u16) -> Vec<String> {
    let mut out = Vec::new();
    for line in table.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 4 || cols[3] != "0A" {
            continue;
        }
        let Some((addr, p)) = cols[1].split_once(':') else {
            continue;
        };
        if u16::from_str_radix(p, 16).ok() != Some(port) {
            continue;
        }
        out.push(hex_addr(addr));
    }
    out.sort();
    out.dedup();
    out
}

/// A /proc/net address as text: 32-bit words in hex, each in the host's (little-endian)
/// byte order.
fn hex_addr(hex: &str) -> String {
    let word = |i: usize| {
        hex.get(i * 8..i * 8 + 8)
            .and_then(|w| u32::from_str_radix(w, 16).ok())
            .map(u32::to_le_bytes)
    };
    match hex.len() {
        8 => word(0)
            .map(|b| std::net::Ipv4Addr::from(b).to_string())
            .unwrap_or_else(|| hex.to_string()),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                let Some(b) = word(i) else {
                    return hex.to_string();
                };
                bytes[i * 4..i * 4 + 4].copy_from_slice(&b);
            }
            let ip = std::net::Ipv6Addr::from(bytes);
            ip.to_ipv4_mapped()
                .map(|v4| v4.to_string())
                .unwrap_or_else(|| ip.to_string())
        }
        _ => hex.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_are_read_from_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st\n\
           0: 00000000:1F90 00000000:0000 0A 00000000:00000000\n\
           1: 0100007F:0050 00000000:0000 0A 00000000:00000000\n\
           2: 0100007F:1F90 0100007F:C350 01 00000000:00000000\n\
           0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A x\n";
        assert_eq!(listeners(table, 8080), vec!["0.0.0.0", "::1"]);
        assert_eq!(listeners(table, 80), vec!["127.0.0.1"]);
        assert!(listeners(table, 81).is_empty());
    }

    #[test]
    fn ids_cannot_change_the_path() {
        assert!(path_safe("sandbox_id", "abc123").is_ok());
        assert!(path_safe("sandbox_id", "../keys").is_err());
        assert!(path_safe("sandbox_id", "a?b").is_err());
        assert!(path_safe("sandbox_id", "").is_err());
    }
}
