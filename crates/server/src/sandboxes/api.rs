//! The control API's handlers (E2B's routes and semantics). Every handler is described for
//! `GET /openapi.json` by its `#[utoipa::path]`.

use crate::App;
use crate::http::error::{ApiError, ApiResult, ErrorBody};
use crate::http::extract::{ApiJson, Caller, OptionalJson};
use crate::sandboxes::models::{
    ConnectRequest, LifecycleInfo, ListedSandbox, NewSandbox, RefreshRequest, Sandbox,
    SandboxDetail, SandboxState, TimeoutRequest,
};
use crate::sandboxes::service::MAX_REFRESH_SECS;
use crate::store::{SandboxRow, State as DbState};
use crate::util::{now_ms, parse_rfc3339, rfc3339};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::collections::BTreeMap;
use std::sync::Arc;

pub const CLIENT_ID: &str = "sandcell";
const DEFAULT_REFRESH_SECS: u64 = 60;
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 100;

pub(crate) fn sandbox_json(app: &App, row: &SandboxRow) -> Sandbox {
    Sandbox {
        template_id: row.template_id.clone(),
        sandbox_id: row.id.clone(),
        client_id: CLIENT_ID.into(),
        envd_version: row.envd_version.clone(),
        envd_access_token: row.access_token.clone(),
        traffic_access_token: app.lifecycle.networks.traffic_token(&row.id),
        domain: app.config.domain.clone(),
    }
}

fn listed_json(row: &SandboxRow) -> ListedSandbox {
    ListedSandbox {
        template_id: row.template_id.clone(),
        sandbox_id: row.id.clone(),
        client_id: CLIENT_ID.into(),
        started_at: rfc3339(row.started_at.unwrap_or(row.created_at)),
        end_at: rfc3339(row.end_at.unwrap_or(row.created_at)),
        cpu_count: row.vcpus,
        memory_mb: row.memory_mib,
        disk_size_mb: row.disk_mib,
        state: match row.state {
            DbState::Pausing | DbState::Paused | DbState::Resuming => SandboxState::Paused,
            _ => SandboxState::Running,
        },
        envd_version: row.envd_version.clone(),
        metadata: row.metadata.clone(),
        key_id: None,
    }
}

/// An admin key's listing item: with the owning key.
fn listed_json_of_any(row: &SandboxRow) -> ListedSandbox {
    ListedSandbox {
        key_id: Some(row.key_id.clone()),
        ..listed_json(row)
    }
}

/// The keys whose sandboxes a listing shows: the caller's, or with `all=true` every key's
/// (admin keys only: the operator's view; 403 for others, so that a script expecting all
/// does not silently get its own).
fn listed_keys<'a>(caller: &'a Caller, q: &ListQuery) -> ApiResult<Option<&'a str>> {
    match (q.all, caller.0.is_admin) {
        (false, _) => Ok(Some(&caller.0.id)),
        (true, true) => Ok(None),
        (true, false) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "all=true lists every key's sandboxes and needs an admin key; without it you see \
             your own",
        )),
    }
}

/// Sandbox `id` as the caller may address it by id (GET, DELETE): its own; an admin key's,
/// any key's (the operator's view) but the daemon's own (templates/installed_snapshot.rs:
/// its answer would carry the envd token of a sandbox every tenant's restores come from).
/// Other keys' sandboxes do not exist for the caller.
async fn addressable_of(app: &App, caller: &Caller, id: &str) -> ApiResult<SandboxRow> {
    let row = if caller.0.is_admin {
        app.db.sandbox(id).await?
    } else {
        app.db.sandbox_of_key(&caller.0.id, id).await?
    };
    match row {
        Some(row)
            if row.state.is_addressable() && row.key_id != crate::store::keys::SYSTEM_KEY_ID =>
        {
            Ok(row)
        }
        _ => Err(ApiError::sandbox_not_found(id)),
    }
}

/// The caller's running sandbox `id`, or 404 (other keys' sandboxes do not exist for it).
async fn running_of(app: &App, caller: &Caller, id: &str) -> ApiResult<SandboxRow> {
    match app.db.sandbox_of_key(&caller.0.id, id).await? {
        Some(row) if row.state == DbState::Running => Ok(row),
        _ => Err(ApiError::sandbox_not_found(id)),
    }
}

async fn create(
    app: Arc<App>,
    caller: Caller,
    mut req: NewSandbox,
    secure_by_default: bool,
) -> ApiResult<(StatusCode, Json<Sandbox>)> {
    // Every sandbox a key creates gets an envd access token, `secure: false` or not: without
    // one, its id alone would open its envd (commands, files) to anyone reaching this port.
    // E2B's own API does the same now ("secure: Ignored. All system communication with the
    // sandbox is always secured", e2b SDK 2.63), and every SDK sends the token it is given.
    req.secure = Some(true);
    // In its own task: a client that goes away mid-create must not leave a half-made
    // sandbox behind (the finished one is reaped at its timeout).
    let lifecycle = app.lifecycle.clone();
    let row =
        tokio::spawn(async move { lifecycle.create(&caller.0, req, secure_by_default).await })
            .await
            .map_err(|e| ApiError::internal(format!("creating the sandbox: {e}")))??;
    Ok((StatusCode::CREATED, Json(sandbox_json(&app, &row))))
}

#[utoipa::path(post, path = "/sandboxes", tag = "sandboxes", request_body = NewSandbox,
    security(("ApiKeyAuth" = [])),
    responses(
        (status = 201, description = "Created and started", body = Sandbox),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "Unknown template", body = ErrorBody),
        (status = 429, description = "The key's concurrency limit", body = ErrorBody),
        (status = 500, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn create_v1(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<NewSandbox>,
) -> ApiResult<(StatusCode, Json<Sandbox>)> {
    create(app, caller, req, false).await
}

/// As `POST /sandboxes`, but `secure` defaults to true (an envd access token is issued).
#[utoipa::path(post, path = "/v2/sandboxes", tag = "sandboxes", request_body = NewSandbox,
    security(("ApiKeyAuth" = [])),
    responses(
        (status = 201, description = "Created and started", body = Sandbox),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "Unknown template", body = ErrorBody),
        (status = 429, description = "The key's concurrency limit", body = ErrorBody),
        (status = 500, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn create_v2(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<NewSandbox>,
) -> ApiResult<(StatusCode, Json<Sandbox>)> {
    create(app, caller, req, true).await
}

/// Query parameters of the list routes, parsed by hand: `state` may repeat or be
/// comma-separated, and `metadata` is itself a URL-encoded query (`k=v&k2=v2`).
#[derive(Default)]
struct ListQuery {
    metadata: BTreeMap<String, String>,
    states: Vec<SandboxState>,
    template: Option<String>,
    started_after: Option<i64>,
    started_before: Option<i64>,
    ascending: bool,
    limit: Option<usize>,
    next_token: Option<String>,
    /// `all=true`: every key's sandboxes (admin keys only).
    all: bool,
}

/// Decodes `%XX` sequences (the SDKs encode metadata keys and values once more before
/// building the `metadata` parameter).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_list_query(raw: Option<&str>) -> ApiResult<ListQuery> {
    let mut q = ListQuery::default();
    for (name, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        match &*name {
            "metadata" => {
                for (k, v) in form_urlencoded::parse(value.as_bytes()) {
                    q.metadata.insert(percent_decode(&k), percent_decode(&v));
                }
            }
            "state" => {
                for s in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    q.states.push(match s {
                        "running" => SandboxState::Running,
                        "paused" => SandboxState::Paused,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "invalid state {other:?}: running or paused"
                            )));
                        }
                    });
                }
            }
            "template" => q.template = Some(value.into_owned()),
            "startedAfter" => {
                q.started_after = Some(parse_rfc3339(&value).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "invalid startedAfter {value:?}: RFC 3339 expected"
                    ))
                })?)
            }
            "startedBefore" => {
                q.started_before = Some(parse_rfc3339(&value).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "invalid startedBefore {value:?}: RFC 3339 expected"
                    ))
                })?)
            }
            "order" => {
                q.ascending = match &*value {
                    "asc" => true,
                    "desc" => false,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "invalid order {other:?}: asc or desc"
                        )));
                    }
                }
            }
            "limit" => {
                q.limit = Some(
                    value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_PAGE).contains(n))
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "invalid limit {value:?}: 1 to {MAX_PAGE}"
                            ))
                        })?,
                )
            }
            "nextToken" => q.next_token = Some(value.into_owned()),
            "all" => {
                q.all = match &*value {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "invalid all {other:?}: true or false"
                        )));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(q)
}

fn page_token(row: &SandboxRow) -> String {
    encode_page_token(row.started_at.unwrap_or(row.created_at), &row.id)
}

/// A `nextToken` cursor (E2B's listings): `at:id`, base64url. Sandboxes, snapshots and
/// secrets page with it.
pub(crate) fn encode_page_token(at: i64, id: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{at}:{id}"))
}

/// The `(at, id)` of a [`encode_page_token`] cursor; 400 for anything else.
pub(crate) fn parse_page_token(token: &str) -> ApiResult<(i64, String)> {
    let bad = || ApiError::bad_request("invalid nextToken");
    let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let raw = String::from_utf8(raw).map_err(|_| bad())?;
    let (t, id) = raw.split_once(':').ok_or_else(bad)?;
    Ok((t.parse().map_err(|_| bad())?, id.to_string()))
}

/// The caller's running sandboxes that match `q`, sorted and paginated: the page and the
/// token of the next one.
async fn list_page(
    app: &App,
    caller: &Caller,
    q: &ListQuery,
) -> ApiResult<(Vec<ListedSandbox>, Option<String>)> {
    // As E2B: running and paused ones unless `state` says otherwise.
    let mut states = Vec::new();
    if q.states.is_empty() || q.states.contains(&SandboxState::Running) {
        states.push(DbState::Running);
    }
    if q.states.is_empty() || q.states.contains(&SandboxState::Paused) {
        states.extend([DbState::Pausing, DbState::Paused, DbState::Resuming]);
    }
    let keys = listed_keys(caller, q)?;
    let mut rows = app.db.sandboxes_in(keys, &states).await?;
    let key = |r: &SandboxRow| (r.started_at.unwrap_or(r.created_at), r.id.clone());
    rows.retain(|r| {
        q.metadata.iter().all(|(k, v)| r.metadata.get(k) == Some(v))
            && q.template.as_ref().is_none_or(|t| &r.template_id == t)
            && q.started_after.is_none_or(|t| key(r).0 > t)
            && q.started_before.is_none_or(|t| key(r).0 < t)
    });
    rows.sort_by_key(key);
    if !q.ascending {
        rows.reverse();
    }
    if let Some(token) = &q.next_token {
        let after = parse_page_token(token)?;
        rows.retain(|r| {
            let k = key(r);
            if q.ascending { k > after } else { k < after }
        });
    }
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    let next = (rows.len() > limit).then(|| page_token(&rows[limit - 1]));
    rows.truncate(limit);
    let item = if q.all {
        listed_json_of_any
    } else {
        listed_json
    };
    Ok((rows.iter().map(item).collect(), next))
}

/// Running sandboxes of the key (legacy; filter: `metadata`); an admin key's `all=true`:
/// every key's.
#[utoipa::path(get, path = "/sandboxes", tag = "sandboxes", security(("ApiKeyAuth" = [])),
    params(("metadata" = Option<String>, Query, description = "URL-encoded k=v pairs"),
        ("all" = Option<bool>, Query, description = "admin keys: every key's sandboxes")),
    responses((status = 200, body = Vec<ListedSandbox>),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "all=true without an admin key", body = ErrorBody)))]
pub async fn list_v1(
    State(app): State<Arc<App>>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Vec<ListedSandbox>>> {
    let q = parse_list_query(raw.as_deref())?;
    let keys = listed_keys(&caller, &q)?;
    let rows = app.db.sandboxes_in(keys, &[DbState::Running]).await?;
    let item = if q.all {
        listed_json_of_any
    } else {
        listed_json
    };
    let listed = rows
        .iter()
        .filter(|r| q.metadata.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
        .map(item)
        .collect();
    Ok(Json(listed))
}

/// Sandboxes of the key, paginated: the next page's token is in the `x-next-token` header.
/// An admin key's `all=true`: every key's, each with its `keyID`.
#[utoipa::path(get, path = "/v2/sandboxes", tag = "sandboxes", security(("ApiKeyAuth" = [])),
    params(
        ("all" = Option<bool>, Query, description = "admin keys: every key's sandboxes"),
        ("metadata" = Option<String>, Query, description = "URL-encoded k=v pairs"),
        ("state" = Option<String>, Query, description = "running,paused"),
        ("template" = Option<String>, Query),
        ("startedAfter" = Option<String>, Query, description = "RFC 3339"),
        ("startedBefore" = Option<String>, Query, description = "RFC 3339"),
        ("order" = Option<String>, Query, description = "asc or desc (default) by startedAt"),
        ("limit" = Option<u32>, Query, description = "1 to 100 (default 100)"),
        ("nextToken" = Option<String>, Query)),
    responses((status = 200, body = Vec<ListedSandbox>,
            headers(("x-next-token" = String, description = "present when more pages follow"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "all=true without an admin key", body = ErrorBody)))]
pub async fn list_v2(
    State(app): State<Arc<App>>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult<(HeaderMap, Json<Vec<ListedSandbox>>)> {
    let q = parse_list_query(raw.as_deref())?;
    let (page, next) = list_page(&app, &caller, &q).await?;
    let mut headers = HeaderMap::new();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        headers.insert("x-next-token", next);
    }
    Ok((headers, Json(page)))
}

#[utoipa::path(get, path = "/sandboxes/{sandboxID}", tag = "sandboxes",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    responses((status = 200, body = SandboxDetail),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_sandbox(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxDetail>> {
    // An admin key sees any key's (the operator's view).
    let row = addressable_of(&app, &caller, &id).await?;
    let life = app.db.sandbox_lifecycle(&id).await?;
    let listed = listed_json(&row);
    // Without its password, which the API never returns.
    let egress_proxy = crate::networks::egress_proxy::shown(&app.db, &id).await?;
    Ok(Json(SandboxDetail {
        pause_mode: match listed.state {
            SandboxState::Paused if app.lifecycle.paused_files_only(&id).await => {
                Some("filesystem".to_string())
            }
            SandboxState::Paused => Some("full".to_string()),
            _ => None,
        },
        listed,
        envd_access_token: row.access_token.clone(),
        domain: app.config.domain.clone(),
        lifecycle: LifecycleInfo {
            auto_resume: life.auto_resume.is_some(),
            on_timeout: if life.auto_pause { "pause" } else { "kill" }.into(),
        },
        parent_id: life.parent_id,
        children: app.db.live_children(&id).await?,
        volume_mounts: app
            .db
            .sandbox_volumes(&id)
            .await?
            .into_iter()
            .map(|m| crate::volumes::service::VolumeMount {
                name: m.name,
                path: m.path,
            })
            .collect(),
        network: crate::networks::service::egress_of(&app.db, &id)
            .await?
            .map(|e| crate::networks::api::NetworkConfig {
                allow_out: Some(e.allow_out),
                deny_out: Some(e.deny_out),
                allow_public_traffic: Some(app.lifecycle.networks.traffic_token(&id).is_none()),
                mask_request_host: app.lifecycle.networks.mask_request_host(&id),
                rules: Some(e.rules),
                egress_proxy,
            }),
    }))
}

#[utoipa::path(delete, path = "/sandboxes/{sandboxID}", tag = "sandboxes",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    responses((status = 204, description = "Killed"),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn kill_sandbox(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    // Running or paused (a paused one's snapshot goes with it); an admin key kills any
    // key's (the operator's view).
    addressable_of(&app, &caller, &id).await?;
    // In its own task, so that a client going away cannot stop a kill halfway.
    let lifecycle = app.lifecycle.clone();
    let task_id = id.clone();
    let killed =
        tokio::spawn(async move { lifecycle.kill(&task_id, "killed through the API").await })
            .await
            .map_err(|e| ApiError::internal(format!("killing the sandbox: {e}")))??;
    if killed {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::sandbox_not_found(&id))
    }
}

/// Sets the sandbox to be killed `timeout` seconds from now (shorter or longer).
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/timeout", tag = "sandboxes",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    request_body = TimeoutRequest,
    responses((status = 204, description = "Timeout set"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn set_timeout(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<TimeoutRequest>,
) -> ApiResult<StatusCode> {
    app.lifecycle.check_timeout(req.timeout)?;
    running_of(&app, &caller, &id).await?;
    let end_at = now_ms() + (req.timeout as i64) * 1000;
    if app.db.set_end_at(&id, end_at, false).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::sandbox_not_found(&id))
    }
}

/// Keeps the sandbox alive at least `duration` seconds from now (default 60).
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/refreshes", tag = "sandboxes",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    request_body = RefreshRequest,
    responses((status = 204, description = "Refreshed"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn refresh(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<RefreshRequest>,
) -> ApiResult<StatusCode> {
    let duration = req.duration.unwrap_or(DEFAULT_REFRESH_SECS);
    if duration > MAX_REFRESH_SECS {
        return Err(ApiError::bad_request(format!(
            "duration {duration} s is above the maximum of {MAX_REFRESH_SECS} s"
        )));
    }
    running_of(&app, &caller, &id).await?;
    let end_at = now_ms() + (duration as i64) * 1000;
    if app.db.set_end_at(&id, end_at, true).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::sandbox_not_found(&id))
    }
}

async fn connect(
    app: Arc<App>,
    caller: Caller,
    id: String,
    req: ConnectRequest,
) -> ApiResult<(StatusCode, Json<Sandbox>)> {
    let timeout = req
        .timeout
        .unwrap_or(crate::sandboxes::service::DEFAULT_TIMEOUT_SECS);
    app.lifecycle.check_timeout(timeout)?;
    if !matches!(app.db.sandbox_of_key(&caller.0.id, &id).await?, Some(row) if row.state.is_addressable())
    {
        return Err(ApiError::sandbox_not_found(&id));
    }
    // 201 when it was paused and resumed (snapshots/pause.rs), 200 when it was running.
    match crate::snapshots::api::resume(&app, id, timeout).await? {
        crate::snapshots::pause::Resumed::Resumed(row) => {
            Ok((StatusCode::CREATED, Json(sandbox_json(&app, &row))))
        }
        crate::snapshots::pause::Resumed::WasRunning(row) => {
            Ok((StatusCode::OK, Json(sandbox_json(&app, &row))))
        }
    }
}

/// Connects to a sandbox: a running one's end moves to at least `timeout` seconds from now;
/// a paused one is resumed (same id and token) with its end `timeout` seconds from now.
#[utoipa::path(post, path = "/v2/sandboxes/{sandboxID}/connect", tag = "sandboxes",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    request_body = ConnectRequest,
    responses((status = 200, description = "It was running", body = Sandbox),
        (status = 201, description = "It was paused and resumed", body = Sandbox),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 500, body = ErrorBody)))]
pub async fn connect_v2(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<ConnectRequest>,
) -> ApiResult<(StatusCode, Json<Sandbox>)> {
    connect(app, caller, id, req).await
}

/// As `POST /v2/sandboxes/{sandboxID}/connect`.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/connect", tag = "sandboxes",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    request_body = ConnectRequest,
    responses((status = 200, description = "It was running", body = Sandbox),
        (status = 201, description = "It was paused and resumed", body = Sandbox),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 500, body = ErrorBody)))]
pub async fn connect_v1(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<ConnectRequest>,
) -> ApiResult<(StatusCode, Json<Sandbox>)> {
    connect(app, caller, id, req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_query_parses_sdk_shapes() {
        // What the Python SDK sends for metadata={"a b": "c&d"}, state=[running, paused].
        let q = parse_list_query(Some(
            "metadata=a%252520b%3Dc%252526d&state=running%2Cpaused&limit=5&order=asc",
        ))
        .unwrap_or_default();
        assert_eq!(q.metadata.get("a b").map(String::as_str), Some("c&d"));
        assert_eq!(q.states, vec![SandboxState::Running, SandboxState::Paused]);
        assert_eq!(q.limit, Some(5));
        assert!(q.ascending);
        assert!(parse_list_query(Some("state=dead")).is_err());
        assert!(parse_list_query(Some("limit=0")).is_err());
        assert!(parse_list_query(Some("limit=101")).is_err());
    }

    #[test]
    fn page_tokens_round_trip() {
        let token = URL_SAFE_NO_PAD.encode("1234:sc-ab");
        assert_eq!(
            parse_page_token(&token).ok(),
            Some((1234, "sc-ab".to_string()))
        );
        assert!(parse_page_token("!!").is_err());
    }
}
