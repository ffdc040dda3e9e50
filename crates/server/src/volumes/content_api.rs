//! E2B's volume content API, `/volumecontent/{volumeID}/path|dir|file`, as the SDKs'
//! `Volume` instances call it (`Authorization: Bearer <the volume's token>`, no API key):
//! stat, chmod/chown, delete, list with depth, mkdir, read and write, without a sandbox.
//! The file operations are content.rs's (no link or `..` is ever followed); they run on
//! the blocking pool, each under the volume's host mount.

use super::content::{self, Entry, VolPath};
use crate::App;
use crate::http::error::{ApiError, ApiResult};
use crate::util::rfc3339;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Router, extract::DefaultBodyLimit};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// Largest file one PUT writes.
pub const MAX_FILE: u64 = 16 << 30;

/// The routes (outside the OpenAPI router: a file body is not JSON and has its own cap).
pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route(
            "/volumecontent/{volume_id}/path",
            get(stat_path).patch(patch_path).delete(delete_path),
        )
        .route(
            "/volumecontent/{volume_id}/dir",
            get(list_dir).post(make_dir),
        )
        .route(
            "/volumecontent/{volume_id}/file",
            get(read_file)
                .put(write_file)
                .layer(DefaultBodyLimit::disable()),
        )
}

/// E2B's `VolumeEntryStat`.
#[derive(Debug, Serialize)]
pub struct EntryStat {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    size: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    atime: String,
    mtime: String,
    ctime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

impl From<Entry> for EntryStat {
    fn from(e: Entry) -> EntryStat {
        EntryStat {
            name: e.name,
            kind: e.kind,
            path: e.path,
            size: e.size,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            atime: rfc3339(e.atime_ms),
            mtime: rfc3339(e.mtime_ms),
            ctime: rfc3339(e.ctime_ms),
            target: e.target,
        }
    }
}

#[derive(Debug, Default)]
pub struct PathQuery {
    path: String,
    depth: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

impl PathQuery {
    /// `path` (required), `depth`, `uid`, `gid`, `mode` and `force` from the query string.
    fn parse(raw: Option<&str>) -> ApiResult<PathQuery> {
        let mut q = PathQuery::default();
        let mut path = None;
        let num = |k: &str, v: &str| {
            v.parse::<u32>()
                .map_err(|_| ApiError::bad_request(format!("invalid {k} {v:?}")))
        };
        for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
            match &*k {
                "path" => path = Some(v.into_owned()),
                "depth" => q.depth = Some(num(&k, &v)?),
                "uid" => q.uid = Some(num(&k, &v)?),
                "gid" => q.gid = Some(num(&k, &v)?),
                "mode" => q.mode = Some(num(&k, &v)?),
                "force" => q.force = Some(v == "true"),
                _ => {}
            }
        }
        q.path = path.ok_or_else(|| ApiError::bad_request("the path parameter is required"))?;
        Ok(q)
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct Attrs {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

fn bearer(headers: &HeaderMap) -> &str {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
}

fn parse_path(q: &PathQuery) -> ApiResult<VolPath> {
    VolPath::parse(&q.path)
        .ok_or_else(|| ApiError::bad_request(format!("invalid path {:?}: no '..' or NUL", q.path)))
}

fn fs_error(path: &VolPath, e: std::io::Error) -> ApiError {
    if content::is_missing(&e) {
        ApiError::not_found(format!("path {} not found", path.shown()))
    } else if content::is_refused(&e) {
        ApiError::bad_request(format!("path {}: {e}", path.shown()))
    } else if e.raw_os_error() == Some(libc::EIO) {
        // What JuiceFS answers once its retries against the bucket are spent.
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "path {}: I/O error from the volume's storage (its S3 bucket failed or is \
                 unreachable; nothing unsynced was committed): {e}",
                path.shown()
            ),
        )
    } else {
        ApiError::internal(format!("path {}: {e}", path.shown()))
    }
}

/// A request's volume (authenticated, mounted, its top open) and path.
struct Target {
    top: Arc<OwnedFd>,
    path: VolPath,
    q: PathQuery,
}

async fn target(app: &App, id: &str, raw: Option<&str>, headers: &HeaderMap) -> ApiResult<Target> {
    let q = PathQuery::parse(raw)?;
    let path = parse_path(&q)?;
    let dir = app.volumes.content_dir(id, bearer(headers)).await?;
    let top = content::open_top(&dir)
        .map_err(|e| ApiError::internal(format!("opening volume {id}: {e}")))?;
    Ok(Target {
        top: Arc::new(top),
        path,
        q,
    })
}

impl Target {
    /// Runs a file operation on the path, on the blocking pool.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&OwnedFd, &VolPath) -> std::io::Result<T> + Send + 'static,
    ) -> ApiResult<T> {
        let (top, path) = (self.top.clone(), self.path.clone());
        tokio::task::spawn_blocking(move || f(&top, &path))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            .map_err(|e| fs_error(&self.path, e))
    }

    /// The owner the query asks for (`uid`, `gid`), set on the path.
    async fn chown_and_stat(&self) -> ApiResult<EntryStat> {
        let (uid, gid) = (self.q.uid, self.q.gid);
        let e = self
            .run(move |top, p| {
                if uid.is_some() || gid.is_some() {
                    content::set_attrs(top, p, uid, gid, None)?;
                }
                content::stat(top, p)
            })
            .await?;
        Ok(e.into())
    }
}

async fn stat_path(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<EntryStat>> {
    let t = target(&app, &id, raw.as_deref(), &headers).await?;
    Ok(Json(t.run(content::stat).await?.into()))
}

async fn patch_path(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> ApiResult<Json<EntryStat>> {
    let attrs: Attrs = if body.iter().all(u8::is_ascii_whitespace) {
        Attrs::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))?
    };
    let t = target(&app, &id, raw.as_deref(), &headers).await?;
    // A change waits for the bucket: refused at once (503) when it is unreachable.
    app.volumes.check_storage(&id).await?;
    let e = t
        .run(move |top, p| {
            content::set_attrs(top, p, attrs.uid, attrs.gid, attrs.mode)?;
            content::stat(top, p)
        })
        .await?;
    Ok(Json(e.into()))
}

async fn delete_path(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let t = target(&app, &id, raw.as_deref(), &headers).await?;
    // A change waits for the bucket: refused at once (503) when it is unreachable.
    app.volumes.check_storage(&id).await?;
    if t.path.is_top() {
        return Err(ApiError::bad_request("the volume's top cannot be deleted"));
    }
    t.run(content::remove).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_dir(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Vec<EntryStat>>> {
    let t = target(&app, &id, raw.as_deref(), &headers).await?;
    let depth = t.q.depth.unwrap_or(1);
    if !(1..=content::MAX_DEPTH).contains(&depth) {
        return Err(ApiError::bad_request(format!(
            "depth {depth} is out of range: 1 to {}",
            content::MAX_DEPTH
        )));
    }
    let entries = t.run(move |top, p| content::list(top, p, depth)).await?;
    Ok(Json(entries.into_iter().map(EntryStat::from).collect()))
}

async fn make_dir(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> ApiResult<(StatusCode, Json<EntryStat>)> {
    let t = target(&app, &id, raw.as_deref(), &headers).await?;
    // A change waits for the bucket: refused at once (503) when it is unreachable.
    app.volumes.check_storage(&id).await?;
    let (mode, force) = (t.q.mode.unwrap_or(0o755), t.q.force == Some(true));
    t.run(move |top, p| content::mkdir(top, p, mode, force))
        .await?;
    Ok((StatusCode::CREATED, Json(t.chown_and_stat().await?)))
}

async fn read_file(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let t = target(&app, &id, raw.as_deref(), &headers).await?;
    let file = t.run(content::open_read).await?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

async fn write_file(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, Json<EntryStat>)> {
    let t = target(&app, &id, raw.as_deref(), &headers).await?;
    // A change waits for the bucket: refused at once (503) when it is unreachable.
    app.volumes.check_storage(&id).await?;
    let (mode, force) = (t.q.mode.unwrap_or(0o644), t.q.force == Some(true));
    let file = t
        .run(move |top, p| content::open_write(top, p, mode, force))
        .await?;
    let mut file = tokio::fs::File::from_std(file);
    let mut stream = body.into_data_stream();
    let mut written: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        written += chunk.len() as u64;
        if written > MAX_FILE {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a file is at most {MAX_FILE} bytes"),
            ));
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| fs_error(&t.path, e))?;
    }
    // Durable before the answer: in the bucket (JuiceFS without write-back).
    file.sync_all().await.map_err(|e| fs_error(&t.path, e))?;
    drop(file);
    Ok((StatusCode::CREATED, Json(t.chown_and_stat().await?)))
}
