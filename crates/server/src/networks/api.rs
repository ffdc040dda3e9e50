//! The network routes: E2B's `PUT /sandboxes/{id}/network` (replace the egress rules live),
//! and our extensions: `GET /sandboxes/{id}/network/log` (what the rules refused), private
//! networks (`/networks`, join and leave with `/sandboxes/{id}/networks/{name}`). Ports by
//! URL (any TCP port served inside a sandbox) are the proxy's: `http::proxy::forward_port`.

use crate::App;
use crate::http::error::{ApiError, ApiResult, ErrorBody};
use crate::http::extract::{ApiJson, Caller, OptionalJson};
use crate::networks::service::{self, valid_network_name};
use crate::store::State as DbState;
use crate::util::{now_ms, rfc3339};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sandcell_runtime::net::rules::Rules;
use sandcell_runtime::net::tunnel::EgressProxy;
use sandcell_runtime::net::{DeniedLog, EgressSpec, SandboxNet};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// E2B's `network` object of a create. `allowOut`: IPs, CIDRs (IPv4 or IPv6), `domain`,
/// `*.domain` (any entry makes everything else denied, both families); `denyOut`: IPs and
/// CIDRs; allow wins. Domain rules open IPv4 only (no AAAA answers then). An address
/// allowed only through a domain rule (the DNS answers for it) takes TCP on any port, but
/// only TLS whose SNI, or HTTP/1.x whose `Host`, names an allowed domain (the host
/// connects to that name itself); other protocols (SSH, anything where the server speaks
/// first, UDP and QUIC) are refused there: allow such a destination by IP or CIDR.
/// `rules`: per domain (which `allowOut` must allow), one `transform` whose `headers` the
/// host sets on every plain-HTTP request to it, `${e2b.secrets.<name>}` placeholders filled
/// with the key's secrets (docs/secrets.md). Other E2B fields (`dnsServers`, ...) are
/// accepted and ignored: the sandbox's only resolver is ours, which resolves exactly what
/// the rules allow.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
    #[serde(default)]
    pub deny_out: Option<Vec<String>>,
    /// false: requests to the sandbox's ports (other than envd's) must carry the
    /// `trafficAccessToken` of the create's answer in `e2b-traffic-access-token`.
    #[serde(default)]
    pub allow_public_traffic: Option<bool>,
    /// The Host header requests to the sandbox's ports (other than envd's) arrive with,
    /// `${PORT}` replaced by the port (e.g. `localhost:${PORT}`); default: the caller's.
    #[serde(default)]
    pub mask_request_host: Option<String>,
    /// E2B's `rules`: `{"api.example.com": [{"transform": {"headers": {...}}}]}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub rules: Option<Rules>,
    /// E2B's `egressProxy`: `{"address": "host:port", "username"?, "password"?}`, a SOCKS5
    /// proxy all of the sandbox's allowed outbound TCP goes through (docs/networks.md).
    /// Shown without its password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub egress_proxy: Option<EgressProxy>,
}

/// `PUT /sandboxes/{id}/network`: the new rules, replacing all of the old (an omitted field
/// is cleared, as E2B does).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkUpdate {
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
    #[serde(default)]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// As a create's `network.rules`; omitted: no rules.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub rules: Option<Rules>,
    /// As a create's `network.egressProxy`; omitted: no proxy (E2B: "omitting a field
    /// clears it").
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub egress_proxy: Option<EgressProxy>,
}

/// What the rules of a sandbox refused (our extension).
#[derive(Debug, Serialize, ToSchema)]
pub struct NetworkLog {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// TCP/UDP destinations refused in the last hour: `{dest, protocol, port}`.
    #[schema(value_type = Vec<Object>)]
    pub flows: Vec<sandcell_runtime::net::DeniedFlow>,
    /// Refused packets in all.
    pub packets: u64,
    /// Names our DNS server refused (latest 256): `{name, qtype, at}` (`at`: Unix seconds).
    #[schema(value_type = Vec<Object>)]
    pub names: Vec<sandcell_runtime::net::dns::DeniedName>,
    /// Headers the egress proxy filled from secrets (latest 256):
    /// `{domain, header, secret, version, at}`, never a value.
    #[schema(value_type = Vec<Object>)]
    pub injections: Vec<sandcell_runtime::net::dns::Injection>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct NewNetwork {
    /// Lowercase letters, digits, `-` and `_`, at most 63.
    pub name: String,
}

/// A private network of the caller's key.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PrivateNetwork {
    pub name: String,
    /// RFC 3339.
    #[serde(rename = "createdAt")]
    pub created_at: String,
    /// Its running members' sandbox ids: they reach each other by IP and by sandbox id
    /// (our DNS server answers it).
    pub members: Vec<String>,
}

/// The network of the caller's running sandbox `id`.
async fn sandbox_net(app: &App, caller: &Caller, id: &str) -> ApiResult<SandboxNet> {
    let row = app
        .db
        .sandbox_of_key(&caller.0.id, id)
        .await?
        .ok_or_else(|| ApiError::sandbox_not_found(id))?;
    if row.state != DbState::Running {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is {}, not running",
            row.state.as_str()
        )));
    }
    app.lifecycle.network_of(id).ok_or_else(|| {
        ApiError::conflict(format!(
            "sandbox {id} has no network (created while the server ran with --no-network)"
        ))
    })
}

/// Replaces the egress rules of a running sandbox; new connections follow them at once.
#[utoipa::path(put, path = "/sandboxes/{sandboxID}/network", tag = "network",
    request_body = NetworkUpdate, security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path)),
    responses((status = 204, description = "The new rules are in force"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 500, body = ErrorBody)))]
pub async fn set_network(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<NetworkUpdate>,
) -> ApiResult<StatusCode> {
    let egress = EgressSpec {
        allow_internet_access: body.allow_internet_access.unwrap_or(true),
        allow_out: body.allow_out.unwrap_or_default(),
        deny_out: body.deny_out.unwrap_or_default(),
        rules: body.rules.unwrap_or_default(),
    };
    app.lifecycle.networks.check_rules(&egress)?;
    let net = sandbox_net(&app, &caller, &id).await?;
    let proxy = body.egress_proxy.as_ref();
    net.set_egress(&egress, proxy).await.map_err(|e| match e {
        // The same check again in sandcell-net (the host's addresses may have changed);
        // the proxy's address is checked there only.
        sandcell_runtime::net::Error::Policy(p) => ApiError::bad_request(p.to_string()),
        sandcell_runtime::net::Error::Proxy(p) => ApiError::bad_request(p.to_string()),
        e => ApiError::internal(format!("sandbox {id}: replacing its rules: {e}")),
    })?;
    service::store_egress(&app.db, &id, &egress).await?;
    let ring = app.secrets.key_ring();
    crate::networks::egress_proxy::record(&app.db, Some(&ring), &id, proxy).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What the egress rules of a running sandbox refused (our extension).
#[utoipa::path(get, path = "/sandboxes/{sandboxID}/network/log", tag = "network",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    responses((status = 200, body = NetworkLog), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn network_log(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<NetworkLog>> {
    let net = sandbox_net(&app, &caller, &id).await?;
    let DeniedLog {
        flows,
        packets,
        names,
        injections,
    } = net
        .denied()
        .await
        .map_err(|e| ApiError::internal(format!("sandbox {id}: reading its log: {e}")))?;
    Ok(Json(NetworkLog {
        sandbox_id: id,
        flows,
        packets,
        names,
        injections,
    }))
}

async fn list(app: &App, key_id: &str) -> ApiResult<Vec<PrivateNetwork>> {
    let nets = app.db.private_networks_of_key(key_id).await?;
    let members = app.db.private_network_members_of_key(key_id).await?;
    Ok(nets
        .into_iter()
        .map(|(name, created)| PrivateNetwork {
            members: members
                .iter()
                // Running ones: a paused or ended sandbox keeps its memberships on
                // record (service::ended) but reaches no one.
                .filter(|(n, s)| *n == name && app.lifecycle.network_of(s).is_some())
                .map(|(_, s)| s.clone())
                .collect(),
            name,
            created_at: rfc3339(created),
        })
        .collect())
}

/// Creates a private network of the caller's key (our extension).
#[utoipa::path(post, path = "/networks", tag = "network", request_body = NewNetwork,
    security(("ApiKeyAuth" = [])),
    responses((status = 201, body = PrivateNetwork), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_network(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(body): ApiJson<NewNetwork>,
) -> ApiResult<(StatusCode, Json<PrivateNetwork>)> {
    if !valid_network_name(&body.name) {
        return Err(ApiError::bad_request(format!(
            "invalid network name {:?}: 1 to 63 lowercase letters, digits, '-' and '_'",
            body.name
        )));
    }
    let now = now_ms();
    let created = app
        .db
        .insert_private_network(&caller.0.id, &body.name, now)
        .await?;
    if !created {
        return Err(ApiError::conflict(format!(
            "private network {:?} already exists",
            body.name
        )));
    }
    Ok((
        StatusCode::CREATED,
        Json(PrivateNetwork {
            name: body.name,
            created_at: rfc3339(now),
            members: Vec::new(),
        }),
    ))
}

/// The caller's private networks and their members (our extension).
#[utoipa::path(get, path = "/networks", tag = "network", security(("ApiKeyAuth" = [])),
    responses((status = 200, body = Vec<PrivateNetwork>), (status = 401, body = ErrorBody)))]
pub async fn list_networks(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> ApiResult<Json<Vec<PrivateNetwork>>> {
    Ok(Json(list(&app, &caller.0.id).await?))
}

/// Deletes a private network; its members stop reaching each other (our extension).
#[utoipa::path(delete, path = "/networks/{name}", tag = "network",
    security(("ApiKeyAuth" = [])), params(("name" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn delete_network(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    if !app.db.delete_private_network(&caller.0.id, &name).await? {
        return Err(network_not_found(&name));
    }
    app.lifecycle.networks.refresh_peers(&app.db).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn network_not_found(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "private network {name:?} doesn't exist or you don't have access to it"
    ))
}

/// A running sandbox joins a private network of its key (our extension).
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/networks/{name}", tag = "network",
    security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path), ("name" = String, Path)),
    responses((status = 204, description = "Joined"), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn attach(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((id, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    sandbox_net(&app, &caller, &id).await?;
    if !service::network_exists(&app.db, &caller.0.id, &name).await? {
        return Err(network_not_found(&name));
    }
    service::join(&app.db, &caller.0.id, &name, &id).await?;
    app.lifecycle.networks.refresh_peers(&app.db).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A sandbox leaves a private network (our extension).
#[utoipa::path(delete, path = "/sandboxes/{sandboxID}/networks/{name}", tag = "network",
    security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path), ("name" = String, Path)),
    responses((status = 204, description = "Left"), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn detach(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((id, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    if !app
        .db
        .leave_private_network(&caller.0.id, &name, &id)
        .await?
    {
        return Err(ApiError::not_found(format!(
            "sandbox {id} is not in a private network {name:?} of yours"
        )));
    }
    app.lifecycle.networks.refresh_peers(&app.db).await?;
    Ok(StatusCode::NO_CONTENT)
}
