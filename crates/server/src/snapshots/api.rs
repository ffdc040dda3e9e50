//! The routes of pause, resume, snapshots and fork (E2B's paths, bodies and codes; see
//! snapshots/pause.rs and snapshots/ for what they do), and their JSON.

use crate::App;
use crate::http::error::{ApiError, ApiResult, ErrorBody};
use crate::http::extract::{Caller, OptionalJson};
use crate::sandboxes::api::sandbox_json;
use crate::sandboxes::models::Sandbox;
use crate::snapshots::fork::{DEFAULT_FORK_TIMEOUT_SECS, MAX_FORK_COUNT};
use crate::snapshots::pause::Resumed;
use crate::store::snapshots::SnapshotRow;
use crate::store::{SandboxRow, State as DbState};
use crate::util::rfc3339;
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// `POST /sandboxes/{sandboxID}/pause`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseRequest {
    /// true (the default): the memory is saved too, and a resume restores the sandbox where
    /// it was. false (filesystem only): its files are saved and its processes end; a resume
    /// boots a fresh sandbox on them (same id, env, network and token). Needs a disk
    /// (`sandcell serve --disk-mib`, the default), else 400.
    #[serde(default)]
    pub memory: Option<bool>,
    /// Accepted. The pause always needs the agent to answer (it prepares the checkpoint);
    /// when it does not, the pause is refused with 503 and the sandbox keeps running.
    #[serde(default)]
    pub require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{sandboxID}/resume` (legacy; the SDKs resume through connect).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumeRequest {
    /// Seconds from now until the sandbox's timeout (default 15, as E2B).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Pause instead of kill at the timeout from now on.
    #[serde(default)]
    pub auto_pause: Option<bool>,
    /// Accepted: a resume restores what the pause saved (the memory or the files only).
    #[serde(default)]
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{sandboxID}/snapshots`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct SnapshotRequest {
    /// A name to create sandboxes from (`templateID`); a second snapshot of the same name
    /// replaces the first. Without: the snapshot is known by its id.
    #[serde(default)]
    pub name: Option<String>,
    /// Only true (the default) is supported (false: 400).
    #[serde(default)]
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{sandboxID}/fork`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct ForkRequest {
    /// Seconds until each child's timeout (default 15, as E2B).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// How many children (1 to 100, default 1).
    #[serde(default)]
    pub count: Option<u32>,
}

/// A snapshot (E2B's `SnapshotInfo`, plus our `sandboxID` and `createdAt`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotInfo {
    /// What `templateID` on create and `DELETE /snapshots/{id}` take: the name when it has
    /// one, else the id.
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
    /// Our extension: the sandbox it was taken of.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Our extension (RFC 3339).
    #[serde(rename = "createdAt")]
    pub created_at: String,
}

/// One child of a fork: exactly one of `sandbox` and `error`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ForkError>,
}

/// Why one child of a fork failed (E2B's error shape: the HTTP status and a message).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ForkError {
    pub code: u16,
    pub message: String,
}

fn snapshot_info(snap: &SnapshotRow) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: snap.name.clone().unwrap_or_else(|| snap.id.clone()),
        names: snap.name.iter().cloned().collect(),
        sandbox_id: snap.source_id.clone(),
        created_at: rfc3339(snap.created_at),
    }
}

/// The caller's sandbox `id` in a live state, or 404.
async fn owned(app: &App, caller: &Caller, id: &str) -> ApiResult<SandboxRow> {
    match app.db.sandbox_of_key(&caller.0.id, id).await? {
        Some(row) if !row.state.is_final() => Ok(row),
        _ => Err(ApiError::sandbox_not_found(id)),
    }
}

/// Snapshots (unlike pauses) always keep the memory.
fn no_filesystem_only(memory: Option<bool>) -> ApiResult<()> {
    if memory == Some(false) {
        return Err(ApiError::bad_request(
            "memory: false (filesystem only) is not supported for snapshots: they always save \
             the memory (a pause can save the files only: POST /sandboxes/{id}/pause with \
             {\"memory\": false})",
        ));
    }
    Ok(())
}

/// Runs `f` in its own task: a client going away must not stop a pause or restore halfway.
async fn detached<T: Send + 'static, E: Send + 'static>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
) -> ApiResult<T>
where
    ApiError: From<E>,
{
    tokio::spawn(f)
        .await
        .map_err(|e| ApiError::internal(format!("{what}: {e}")))?
        .map_err(ApiError::from)
}

/// Pauses the sandbox: its memory, processes and files (or with `memory: false` its files
/// only) are saved to disk and it stops running (and being billed). Resume it with connect
/// (or resume): same id, same token.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/pause", tag = "sandboxes",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    request_body = PauseRequest,
    responses((status = 204, description = "Paused"),
        (status = 400, description = "memory: false without a disk", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "Already paused", body = ErrorBody),
        (status = 500, body = ErrorBody),
        (status = 503, description = "Could not pause now; it keeps running", body = ErrorBody)))]
pub async fn pause_sandbox(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<PauseRequest>,
) -> ApiResult<StatusCode> {
    let row = owned(&app, &caller, &id).await?;
    app.volumes.refuse_if_mounted(&id, "pause").await?;
    let memory = req.memory.unwrap_or(true);
    if matches!(row.state, DbState::Paused | DbState::Pausing) {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is already paused"
        )));
    }
    let lifecycle = app.lifecycle.clone();
    detached("pausing the sandbox", async move {
        lifecycle.pause(&id, memory).await
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resumes a paused sandbox (the SDKs use connect, which also takes running ones).
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/resume", tag = "sandboxes",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    request_body = ResumeRequest,
    responses((status = 201, description = "Resumed", body = Sandbox),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "It is running", body = ErrorBody),
        (status = 500, body = ErrorBody)))]
pub async fn resume_sandbox(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<ResumeRequest>,
) -> ApiResult<(StatusCode, Json<Sandbox>)> {
    let row = owned(&app, &caller, &id).await?;
    let timeout = req.timeout.unwrap_or(15);
    app.lifecycle.check_timeout(timeout)?;
    if row.state == DbState::Running {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is already running"
        )));
    }
    if let Some(auto_pause) = req.auto_pause {
        let mut life = app.db.sandbox_lifecycle(&id).await?;
        life.auto_pause = auto_pause;
        app.db.set_sandbox_lifecycle(&id, &life).await?;
    }
    match resume(&app, id.clone(), timeout).await? {
        Resumed::Resumed(row) => Ok((StatusCode::CREATED, Json(sandbox_json(&app, &row)))),
        Resumed::WasRunning(_) => Err(ApiError::conflict(format!(
            "sandbox {id} is already running"
        ))),
    }
}

/// Connect's resume (sandboxes/api.rs): in its own task.
pub(crate) async fn resume(app: &App, id: String, timeout: u64) -> ApiResult<Resumed> {
    let lifecycle = app.lifecycle.clone();
    detached("resuming the sandbox", async move {
        lifecycle.resume(&id, timeout).await
    })
    .await
}

/// Saves the running sandbox as a snapshot, usable as `templateID` on create; the sandbox
/// keeps running. On the gvisor runtime (runsc cannot checkpoint and keep running) the
/// sandbox is checkpointed, which stops it, and restored in place at once: its processes
/// and files continue, but connections open to it at that moment end.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/snapshots", tag = "snapshots",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    request_body = SnapshotRequest,
    responses((status = 201, body = SnapshotInfo),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is paused", body = ErrorBody),
        (status = 500, body = ErrorBody)))]
pub async fn create_snapshot(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<SnapshotRequest>,
) -> ApiResult<(StatusCode, Json<SnapshotInfo>)> {
    let row = owned(&app, &caller, &id).await?;
    app.volumes.refuse_if_mounted(&id, "a snapshot").await?;
    no_filesystem_only(req.memory)?;
    let lifecycle = app.lifecycle.clone();
    let snap = detached("snapshotting the sandbox", async move {
        lifecycle.snapshot_named(&row, req.name).await
    })
    .await?;
    Ok((StatusCode::CREATED, Json(snapshot_info(&snap))))
}

/// The key's snapshots, oldest first; the next page's token is in `x-next-token`.
#[utoipa::path(get, path = "/snapshots", tag = "snapshots", security(("ApiKeyAuth" = [])),
    params(
        ("sandboxID" = Option<String>, Query, description = "only those taken of this sandbox"),
        ("name" = Option<String>, Query, description = "only this id or name"),
        ("limit" = Option<u32>, Query, description = "1 to 100 (default 100)"),
        ("nextToken" = Option<String>, Query)),
    responses((status = 200, body = Vec<SnapshotInfo>,
            headers(("x-next-token" = String, description = "present when more pages follow"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_snapshots(
    State(app): State<Arc<App>>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult<(HeaderMap, Json<Vec<SnapshotInfo>>)> {
    let (mut sandbox, mut name, mut limit, mut after) = (None, None, 100usize, None);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "sandboxID" => sandbox = Some(v.into_owned()),
            "name" => name = Some(v.strip_suffix(":default").unwrap_or(&v).to_string()),
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("invalid limit {v:?}: 1 to 100"))
                    })?
            }
            "nextToken" => {
                after = Some(crate::sandboxes::api::parse_page_token(&v)?);
            }
            _ => {}
        }
    }
    let mut rows = app.db.named_snapshots(&caller.0.id).await?;
    rows.retain(|s| {
        sandbox.as_ref().is_none_or(|id| &s.source_id == id)
            && name
                .as_ref()
                .is_none_or(|n| &s.id == n || s.name.as_ref() == Some(n))
            && after
                .as_ref()
                .is_none_or(|a| (s.created_at, s.id.clone()) > *a)
    });
    let mut headers = HeaderMap::new();
    if rows.len() > limit {
        let last = &rows[limit - 1];
        let token = crate::sandboxes::api::encode_page_token(last.created_at, &last.id);
        if let Ok(v) = HeaderValue::from_str(&token) {
            headers.insert("x-next-token", v);
        }
        rows.truncate(limit);
    }
    Ok((headers, Json(rows.iter().map(snapshot_info).collect())))
}

/// Deletes the caller's named snapshot `id_or_name` (id or name, `:default` allowed);
/// false when the caller has none of that id or name.
pub(crate) async fn delete_snapshot_named(
    app: &App,
    caller: &Caller,
    id_or_name: &str,
) -> Result<bool, crate::error::Error> {
    let name = id_or_name.strip_suffix(":default").unwrap_or(id_or_name);
    let Some(snap) = app.db.named_snapshot(&caller.0.id, name).await? else {
        return Ok(false);
    };
    let deleted = app
        .db
        .delete_named_snapshot(&caller.0.id, &snap.id, crate::util::now_ms())
        .await?;
    // Its files go now, or with the last sandbox restored from it.
    app.lifecycle.collect_snapshots().await;
    Ok(deleted)
}

/// Deletes a snapshot (by id or name). Sandboxes restored from it keep running; its files
/// go with the last of them.
#[utoipa::path(delete, path = "/snapshots/{snapshotID}", tag = "snapshots",
    security(("ApiKeyAuth" = [])), params(("snapshotID" = String, Path)),
    responses((status = 204, description = "Deleted"),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete_snapshot(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    if delete_snapshot_named(&app, &caller, &id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("snapshot '{id}' not found")))
    }
}

/// Forks the running sandbox: it is checkpointed once and `count` new sandboxes are
/// restored from that state, each with its own id, access token and timeout, owned by the
/// same key (and counted against its limit). One result per child, in order: a sandbox or
/// the error that stopped it. On the gvisor runtime (runsc cannot checkpoint and keep
/// running) the parent is checkpointed, which stops it, and restored in place at once: its
/// processes and files continue, but connections open to it at that moment end.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/fork", tag = "sandboxes",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    request_body = ForkRequest,
    responses((status = 201, body = Vec<ForkResult>),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is paused", body = ErrorBody),
        (status = 500, body = ErrorBody)))]
pub async fn fork_sandbox(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJson(req): OptionalJson<ForkRequest>,
) -> ApiResult<(StatusCode, Json<Vec<ForkResult>>)> {
    let parent = owned(&app, &caller, &id).await?;
    app.volumes.refuse_if_mounted(&id, "a fork").await?;
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORK_COUNT).contains(&count) {
        return Err(ApiError::bad_request(format!(
            "count {count} is out of range: 1 to {MAX_FORK_COUNT}"
        )));
    }
    let timeout = req.timeout.unwrap_or(DEFAULT_FORK_TIMEOUT_SECS);
    let lifecycle = app.lifecycle.clone();
    let key = caller.0.clone();
    let children = detached("forking the sandbox", async move {
        lifecycle.fork(&key, &parent, count, timeout).await
    })
    .await?;
    let results = children
        .into_iter()
        .map(|child| match child {
            Ok(row) => ForkResult {
                sandbox: Some(sandbox_json(&app, &row)),
                error: None,
            },
            Err(e) => {
                let e = ApiError::from(e);
                ForkResult {
                    sandbox: None,
                    error: Some(ForkError {
                        code: e.status.as_u16(),
                        message: e.message,
                    }),
                }
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(results)))
}
