//! The routes E2B's `Template.build` calls (SDK 2.x), so that an E2B template definition
//! builds on Sandcell unchanged:
//!
//! 1. `POST /v3/templates {name[:tag], cpuCount, memoryMB}` → 202 `{templateID, buildID}`;
//!    the template's id is its name, an image name under `<data-dir>/images/`.
//! 2. For each COPY step, `GET /templates/{templateID}/files/{hash}` → 201 `{present, url}`;
//!    when not present the SDK PUTs a (gzipped) tar of the sources to `url`: this daemon's
//!    `PUT /templates/{templateID}/files/{hash}?token=...` (the token, not an API key,
//!    authorizes it: the SDK sends none there). The archive is extracted by crates/image's
//!    unpacker (no path leaves the directory; its size limits apply) into the caller's
//!    `cache/e2b-files/<keyID>/<hash>/`, so one key's uploads never feed another's builds.
//! 3. `POST /v2/templates/{templateID}/builds/{buildID}` with the steps → 202; the build
//!    runs (templates/builds.rs).
//! 4. `GET /templates/{templateID}/builds/{buildID}/status?logsOffset&limit&level` until
//!    `ready` or `error` (with `reason`).
//!
//! A template built so belongs to the key that first requested its name and is private to
//! it (and admin keys) until made public (templates/access.rs); a build's status is seen
//! only by the key that made it.

use crate::App;
use crate::http::error::{ApiError, ApiResult, ErrorBody};
use crate::http::extract::{ApiJson, Caller};
use crate::templates::builds::{self as builds, BuildReport, LogEntry, Status};
use crate::templates::plan::{self as plan, BuildStart};
use crate::templates::tags;
use crate::util::{random_hex, rfc3339};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use sandcell_image::{Limits, valid_name};
use sandcell_proto::sync::lock;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use utoipa::ToSchema;

/// How long an upload URL is good for.
const UPLOAD_URL_LIFETIME: Duration = Duration::from_secs(3600);
/// Log entries one status answer carries at most (E2B's limit too).
const MAX_STATUS_ENTRIES: usize = 100;

/// `POST /v3/templates` (E2B's `TemplateBuildRequestV3`).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildRequestV3 {
    /// `name` or `name:tag` (the build's tag, with `tags` and `default`: templates/tags.rs).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    /// Older SDKs' name.
    #[serde(default)]
    pub alias: Option<String>,
    #[serde(default, rename = "teamID")]
    pub team_id: Option<String>,
    /// vCPUs and memory of the RUN sandboxes and the default size of the template's
    /// sandboxes (400 beyond what this server allows).
    #[serde(default)]
    pub cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB")]
    pub memory_mb: Option<u32>,
    /// Accepted and ignored (the image is sized to its content plus headroom).
    #[serde(default)]
    pub min_free_disk_mb: Option<u64>,
}

/// E2B's `TemplateRequestResponseV3`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BuildRequested {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub public: bool,
    pub names: Vec<String>,
    pub tags: Vec<String>,
    pub aliases: Vec<String>,
}

/// E2B's `TemplateBuildFileUpload`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileUpload {
    /// The archive of that hash is here already: no upload needed.
    pub present: bool,
    /// Where to PUT the tar (or tar.gz) of the sources, when not present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// E2B's `BuildLogEntry`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BuildLogEntry {
    /// RFC 3339.
    pub timestamp: String,
    pub message: String,
    /// debug, info, warn or error.
    pub level: String,
    /// The E2B step: `base`, `1`.. (the steps in order), `finalize`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// E2B's `BuildStatusReason`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BuildStatusReason {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(rename = "logEntries")]
    pub log_entries: Vec<BuildLogEntry>,
}

/// E2B's `TemplateBuildInfo`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BuildInfo {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: Status,
    #[serde(rename = "logEntries")]
    pub log_entries: Vec<BuildLogEntry>,
    /// Always empty (E2B's deprecated raw logs).
    pub logs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<BuildStatusReason>,
}

/// E2B's `TemplateAliasResponse`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AliasInfo {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub public: bool,
}

/// An upload URL's token: what it may write, and until when.
struct UploadGrant {
    key_id: String,
    hash: String,
    until: Instant,
}

/// The upload URLs one daemon handed out, by token (in [`App`]).
#[derive(Default)]
pub struct UploadGrants {
    grants: Mutex<HashMap<String, UploadGrant>>,
}

impl UploadGrants {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, UploadGrant>> {
        lock(&self.grants)
    }
}

fn entry_json(e: &LogEntry) -> BuildLogEntry {
    BuildLogEntry {
        timestamp: rfc3339(e.timestamp_ms),
        message: e.message.clone(),
        level: e.level.to_string(),
        step: e.step.clone(),
    }
}

/// Requests a template build: the name is checked and a build id given; nothing runs yet.
#[utoipa::path(post, path = "/v3/templates", tag = "templates", security(("ApiKeyAuth" = [])),
    request_body = BuildRequestV3,
    responses((status = 202, body = BuildRequested),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, description = "An installed image has that name, or it is being built",
            body = ErrorBody),
        (status = 500, body = ErrorBody)))]
pub async fn request_build(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<BuildRequestV3>,
) -> ApiResult<(StatusCode, Json<BuildRequested>)> {
    let full = req
        .name
        .as_deref()
        .or(req.alias.as_deref())
        .ok_or_else(|| ApiError::bad_request("name is required"))?;
    // `name[:tag]`: the tag is the build's, with `tags` and `default` (templates/tags.rs).
    let (name, name_tag) = tags::split_target(full)?;
    if req.cpu_count.is_some() || req.memory_mb.is_some() {
        // The template's sandboxes get that size: it must be one this server allows.
        app.lifecycle.size(req.cpu_count, req.memory_mb)?;
    }
    let dir = app.lifecycle.dirs().images().join(name);
    if dir.exists() && sandcell_image::template::read_record(&dir).is_none() {
        return Err(ApiError::conflict(format!(
            "template '{name}' is an installed image: choose another name"
        )));
    }
    let public = claim(&app, &caller, name, dir.exists()).await?;
    if app.builds.active_for(name).is_some() {
        return Err(ApiError::conflict(format!(
            "template '{name}' is being built: wait for that build to end"
        )));
    }
    // The tags the build takes when it succeeds: the name's, `tags` and `default`.
    let mut tags = vec![name_tag.to_string()];
    tags.extend(req.tags.iter().flatten().cloned());
    tags.push(tags::DEFAULT_TAG.into());
    let tags = tags::check_tags(&tags)?;
    let build_id = random_hex(16).map_err(|e| ApiError::internal(format!("getrandom: {e}")))?;
    let build = app
        .builds
        .create(
            &app.db,
            build_id.clone(),
            name.to_string(),
            caller.0.id.clone(),
            req.cpu_count,
            req.memory_mb,
        )
        .await?;
    // Never started, it expires and frees the name (`--build-start-timeout`).
    builds::expire_unstarted(app.clone(), build);
    tags::request(&app.db, &build_id, &tags).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(BuildRequested {
            template_id: name.to_string(),
            build_id,
            public,
            names: vec![name.to_string()],
            tags,
            aliases: vec![name.to_string()],
        }),
    ))
}

/// The caller's right to build template `name` (templates/access.rs): a new name becomes
/// the caller's (private); its own, or any for an admin key, is rebuilt; another key's
/// public template or a system template is 403, another key's private one 409 "not
/// available" (names are one namespace: that it is taken is all it tells). Whether the
/// template is public.
async fn claim(app: &App, caller: &Caller, name: &str, exists: bool) -> ApiResult<bool> {
    use crate::templates::access::TemplateAccess;
    use crate::templates::error::TemplateError;
    let key = &caller.0;
    let access = match app.db.template_access(name).await? {
        Some(access) => access,
        // Built on the host (`sandcell build`): a system template.
        None if exists => TemplateAccess::SYSTEM,
        // The first build request of a name claims it; of two at once, one wins.
        None => app
            .db
            .claim_template(name, &key.id, crate::util::now_ms())
            .await?
            .unwrap_or(TemplateAccess::SYSTEM),
    };
    if access.changeable_by(key) {
        Ok(access.public)
    } else if access.visible_to(key) {
        Err(TemplateError::NotOwner(name.to_string()).into())
    } else {
        Err(TemplateError::NameTaken(name.to_string()).into())
    }
}

/// Whether the caller uploaded the COPY archive of `hash`; if not, where to PUT it.
#[utoipa::path(get, path = "/templates/{templateID}/files/{hash}", tag = "templates",
    security(("ApiKeyAuth" = [])),
    params(("templateID" = String, Path), ("hash" = String, Path)),
    responses((status = 201, body = FileUpload),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn file_upload_link(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    Path((template_id, hash)): Path<(String, String)>,
) -> ApiResult<(StatusCode, Json<FileUpload>)> {
    if !plan::valid_files_hash(&hash) {
        return Err(ApiError::bad_request(format!(
            "files hash {hash:?}: lowercase hex expected"
        )));
    }
    if !valid_name(&template_id) {
        return Err(ApiError::bad_request(format!(
            "template {template_id:?}: not a template name"
        )));
    }
    let dir = builds::files_dir(&app.lifecycle.dirs().data, &caller.0.id).join(&hash);
    let present = dir.is_dir();
    let token = random_hex(20).map_err(|e| ApiError::internal(format!("getrandom: {e}")))?;
    {
        let mut grants = app.uploads.lock();
        let now = Instant::now();
        grants.retain(|_, g| g.until > now);
        grants.insert(
            token.clone(),
            UploadGrant {
                key_id: caller.0.id.clone(),
                hash: hash.clone(),
                until: now + UPLOAD_URL_LIFETIME,
            },
        );
    }
    // The SDK PUTs to this URL as given: this daemon, as the client reached it.
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .ok_or_else(|| ApiError::bad_request("a Host header is required"))?;
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
        .filter(|p| *p == "https")
        .unwrap_or("http");
    let url = format!("{scheme}://{host}/templates/{template_id}/files/{hash}?token={token}");
    Ok((
        StatusCode::CREATED,
        Json(FileUpload {
            present,
            url: Some(url),
        }),
    ))
}

/// The upload of a COPY archive (a tar, gzipped or not) to the URL `GET` gave: authorized
/// by its `token`, not an API key. Extracted safely; a second upload replaces the first.
#[utoipa::path(put, path = "/templates/{templateID}/files/{hash}", tag = "templates",
    params(("templateID" = String, Path), ("hash" = String, Path),
        ("token" = String, Query, description = "From the upload URL")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, description = "Stored"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 413, body = ErrorBody)))]
pub async fn upload_files(
    State(app): State<Arc<App>>,
    Path((_template_id, hash)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    let token = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| ApiError::unauthorized("the upload URL's token is missing"))?;
    let key_id = {
        let grants = app.uploads.lock();
        match grants.get(&token) {
            Some(g) if g.hash == hash && g.until > Instant::now() => g.key_id.clone(),
            _ => return Err(ApiError::unauthorized("invalid or expired upload URL")),
        }
    };
    let base = builds::files_dir(&app.lifecycle.dirs().data, &key_id);
    std::fs::create_dir_all(&base)
        .map_err(|e| ApiError::internal(format!("creating {}: {e}", base.display())))?;
    // The key's uploads kept so far count against its `upload_mib` quota (keys/quota.rs;
    // `--default-max-upload-mib`); an archive that cannot fit is refused before a byte is read.
    let quota = match app.db.key_by_id(&key_id).await? {
        Some(key) => {
            crate::keys::quota::quotas_of(&key, &app.lifecycle.admission.key_defaults).upload_mib
        }
        None => return Err(ApiError::unauthorized("the upload URL's key is gone")),
    };
    let cap = quota.map_or(u64::MAX, |mib| mib.saturating_mul(1 << 20));
    let used = {
        let b = base.clone();
        tokio::task::spawn_blocking(move || tree_bytes(&b))
            .await
            .map_err(|e| ApiError::internal(format!("the sizing thread failed: {e}")))?
    };
    let room = cap.saturating_sub(used);
    let max = Limits::default().max_blob_bytes.min(room);
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) || room == 0 {
        return Err(too_large(cap, used));
    }
    let suffix = random_hex(8).map_err(|e| ApiError::internal(format!("getrandom: {e}")))?;
    let archive = base.join(format!(".upload-{suffix}.tar"));
    let result = receive(body, &archive, max).await.map_err(|e| {
        if e.status == StatusCode::PAYLOAD_TOO_LARGE {
            too_large(cap, used)
        } else {
            e
        }
    });
    let extracted = match result {
        Ok(()) => {
            let tree = base.join(format!(".tree-{suffix}"));
            let (a, t) = (archive.clone(), tree.clone());
            let done = tokio::task::spawn_blocking(move || extract(&a, &t))
                .await
                .map_err(|e| ApiError::internal(format!("the extracting thread failed: {e}")))
                .and_then(|r| r);
            done.map(|()| tree)
        }
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_file(&archive);
    let tree = extracted?;
    // Extracted (a compressed archive grows): still within the cap?
    let t = tree.clone();
    let size = tokio::task::spawn_blocking(move || tree_bytes(&t))
        .await
        .map_err(|e| ApiError::internal(format!("the sizing thread failed: {e}")))?;
    if used.saturating_add(size) > cap {
        let _ = std::fs::remove_dir_all(&tree);
        return Err(too_large(cap, used));
    }
    let dest = base.join(&hash);
    if dest.exists() {
        let old = base.join(format!(".old-{suffix}"));
        std::fs::rename(&dest, &old)
            .map_err(|e| ApiError::internal(format!("moving {} away: {e}", dest.display())))?;
        let _ = std::fs::remove_dir_all(&old);
    }
    std::fs::rename(&tree, &dest).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tree);
        ApiError::internal(format!("moving the files to {}: {e}", dest.display()))
    })?;
    Ok(StatusCode::OK)
}

/// 413: the key's uploads would pass `cap` (`used` kept already).
fn too_large(cap: u64, used: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the upload does not fit: this key's COPY uploads may take {cap} bytes and keep \
             {used}; they are pruned with the template caches (sandcell serve \
             --template-cache-days), or the operator raises the key's --max-upload-mib"
        ),
    )
}

/// The bytes of the regular files under `dir` (0 when it is missing); links not followed.
fn tree_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}

/// The body into `path`, refused (413) past `max` bytes.
async fn receive(mut body: Body, path: &std::path::Path, max: u64) -> ApiResult<()> {
    let mut file = std::fs::File::create(path)
        .map_err(|e| ApiError::internal(format!("creating {}: {e}", path.display())))?;
    let mut total: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("reading the upload: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if total > max {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the archive is larger than {max} bytes"),
            ));
        }
        file.write_all(&data)
            .map_err(|e| ApiError::internal(format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}

fn extract(archive: &std::path::Path, tree: &std::path::Path) -> ApiResult<()> {
    let result = (|| {
        let file = std::fs::File::open(archive)
            .map_err(|e| format!("opening {}: {e}", archive.display()))?;
        let mut unpacker = sandcell_image::unpack::Unpacker::new(tree, Limits::default())
            .map_err(|e| e.to_string())?;
        unpacker
            .apply_layer(file, "the uploaded archive", None)
            .map_err(|e| e.to_string())?;
        unpacker.finish().map_err(|e| e.to_string())?;
        only_plain_files(tree)
    })();
    result.map_err(|problem| {
        let _ = std::fs::remove_dir_all(tree);
        ApiError::bad_request(format!("the uploaded archive was refused: {problem}"))
    })
}

/// Refuses device nodes, FIFOs and sockets in an upload: COPY sources are read on the host,
/// and the SDKs only ever send files, directories and links.
fn only_plain_files(dir: &std::path::Path) -> Result<(), String> {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| format!("reading {}: {e}", d.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("reading {}: {e}", d.display()))?;
            let kind = entry
                .file_type()
                .map_err(|e| format!("looking at {}: {e}", entry.path().display()))?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else if !kind.is_file() && !kind.is_symlink() {
                return Err(format!(
                    "{}: only files, directories and symbolic links may be uploaded",
                    entry
                        .path()
                        .strip_prefix(dir)
                        .unwrap_or(&entry.path())
                        .display()
                ));
            }
        }
    }
    Ok(())
}

/// Starts the build requested by `POST /v3/templates`: the steps become a Dockerfile
/// (see templates/builds.rs for the mapping) and run in the background.
#[utoipa::path(post, path = "/v2/templates/{templateID}/builds/{buildID}", tag = "templates",
    security(("ApiKeyAuth" = [])),
    params(("templateID" = String, Path), ("buildID" = String, Path)),
    request_body = BuildStart,
    responses((status = 202, description = "Building"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn start_build(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((template_id, build_id)): Path<(String, String)>,
    ApiJson(req): ApiJson<BuildStart>,
) -> ApiResult<StatusCode> {
    let build = app
        .builds
        .find(&build_id)
        .filter(|b| b.template_id == template_id && b.key_id == caller.0.id)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "build '{build_id}' of template '{template_id}' not found"
            ))
        })?;
    if build.status() != Status::Waiting {
        return Err(ApiError::conflict(format!(
            "build '{build_id}' was started already"
        )));
    }
    let images = app.lifecycle.dirs().images();
    let req = visible_base(&app, &caller, req).await?;
    let plan = plan::plan(&req, &plan::base_info(&images, &req)).map_err(ApiError::bad_request)?;
    let files = builds::files_dir(&app.lifecycle.dirs().data, &caller.0.id);
    for (i, step) in req.steps.iter().enumerate() {
        if let Some(hash) = &step.files_hash
            && !files.join(hash).is_dir()
        {
            return Err(ApiError::bad_request(format!(
                "step {}: the files of hash {hash} were not uploaded \
                 (GET /templates/{template_id}/files/{hash})",
                i + 1
            )));
        }
    }
    if !builds::start(app.clone(), build, plan, req) {
        return Err(ApiError::conflict(format!(
            "build '{build_id}' was started already"
        )));
    }
    Ok(StatusCode::ACCEPTED)
}

/// `req` with a base the caller may see (templates/access.rs): `fromTemplate` of a template
/// it may not see is "no such template" (400, as an unknown one); a tagless `fromImage`
/// (`python`) names a local template when there is one, so one the caller may not see is
/// pulled from the registry instead (`docker.io/library/python`), as Docker would.
async fn visible_base(app: &App, caller: &Caller, mut req: BuildStart) -> ApiResult<BuildStart> {
    let images = app.lifecycle.dirs().images();
    let local = |name: &str| valid_name(name) && images.join(name).join("rootfs").is_dir();
    let visible = |name: String| async move {
        crate::templates::access::access(&app.db, &name)
            .await
            .map(|a| a.visible_to(&caller.0))
    };
    if let Some(base) = &req.from_template {
        if !local(base) || !visible(base.clone()).await? {
            return Err(ApiError::bad_request(format!(
                "fromTemplate '{base}': no such template"
            )));
        }
    } else if let Some(image) = &req.from_image
        && local(image)
        && !visible(image.clone()).await?
    {
        req.from_image = Some(format!("docker.io/library/{image}"));
    }
    Ok(req)
}

/// Query of the status route.
struct StatusQuery {
    offset: usize,
    limit: usize,
    min_level: u8,
}

fn parse_status_query(raw: Option<&str>) -> ApiResult<StatusQuery> {
    let mut q = StatusQuery {
        offset: 0,
        limit: MAX_STATUS_ENTRIES,
        min_level: 0,
    };
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let number = || {
            v.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("{k}={v}: a number expected")))
        };
        match k.as_ref() {
            "logsOffset" => q.offset = number()?,
            "limit" => q.limit = number()?.min(MAX_STATUS_ENTRIES),
            "level" => {
                if !matches!(v.as_ref(), "debug" | "info" | "warn" | "error") {
                    return Err(ApiError::bad_request(format!(
                        "level={v}: debug, info, warn or error"
                    )));
                }
                q.min_level = builds::level_rank(&v);
            }
            _ => {}
        }
    }
    Ok(q)
}

/// A build's status, its log entries from `logsOffset` (at most 100, at least `level`) and,
/// for an error, why.
#[utoipa::path(get, path = "/templates/{templateID}/builds/{buildID}/status", tag = "templates",
    security(("ApiKeyAuth" = [])),
    params(("templateID" = String, Path), ("buildID" = String, Path),
        ("logsOffset" = Option<u64>, Query), ("limit" = Option<u64>, Query),
        ("level" = Option<String>, Query)),
    responses((status = 200, body = BuildInfo),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn build_status(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((template_id, build_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<BuildInfo>> {
    let q = parse_status_query(query.as_deref())?;
    let snap = find_build(&app, &caller, &template_id, &build_id).await?;
    let log_entries = snap
        .logs
        .iter()
        .filter(|e| builds::level_rank(e.level) >= q.min_level)
        .skip(q.offset)
        .take(q.limit)
        .map(entry_json)
        .collect();
    let reason = snap.reason.as_ref().map(|r| BuildStatusReason {
        message: r.message.clone(),
        step: r.step.clone(),
        log_entries: builds::reason_entries(&snap.logs)
            .iter()
            .map(entry_json)
            .collect(),
    });
    Ok(Json(BuildInfo {
        template_id,
        build_id,
        status: snap.status,
        log_entries,
        logs: Vec::new(),
        reason,
    }))
}

/// The caller's build `build_id` of `template_id`, live or from the database; 404 otherwise
/// (another key's build included).
async fn find_build(
    app: &App,
    caller: &Caller,
    template_id: &str,
    build_id: &str,
) -> ApiResult<BuildReport> {
    let snap: Option<BuildReport> = match app.builds.find(build_id) {
        Some(b) => Some(b.report()),
        None => builds::load(&app.db, build_id).await?,
    };
    snap.filter(|s| s.template_id == template_id && s.key_id == caller.0.id)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "build '{build_id}' of template '{template_id}' not found"
            ))
        })
}

/// E2B's `TemplateBuildLogsResponse`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BuildLogs {
    pub logs: Vec<BuildLogEntry>,
}

/// The query of the logs route: E2B's `cursor` (a timestamp in ms), `limit`, `direction`
/// and `level`; `source` (persistent or temporary) is accepted and has no effect (one store
/// holds a build's whole log).
#[derive(Debug, PartialEq)]
struct LogsQuery {
    cursor_ms: Option<i64>,
    limit: usize,
    forward: bool,
    min_level: u8,
}

fn parse_logs_query(raw: Option<&str>) -> ApiResult<LogsQuery> {
    let mut q = LogsQuery {
        cursor_ms: None,
        limit: MAX_STATUS_ENTRIES,
        forward: true,
        min_level: 0,
    };
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let bad = |what: &str| ApiError::bad_request(format!("{k}={v}: {what}"));
        match k.as_ref() {
            "cursor" => {
                q.cursor_ms = Some(v.parse().map_err(|_| bad("a timestamp in ms expected"))?)
            }
            "limit" => {
                let n: usize = v.parse().map_err(|_| bad("a number expected"))?;
                q.limit = n.min(MAX_STATUS_ENTRIES);
            }
            "direction" => match v.as_ref() {
                "forward" => q.forward = true,
                "backward" => q.forward = false,
                _ => return Err(bad("forward or backward")),
            },
            "level" => {
                if !matches!(v.as_ref(), "debug" | "info" | "warn" | "error") {
                    return Err(bad("debug, info, warn or error"));
                }
                q.min_level = builds::level_rank(&v);
            }
            "source" if !matches!(v.as_ref(), "persistent" | "temporary") => {
                return Err(bad("persistent or temporary"));
            }
            _ => {}
        }
    }
    Ok(q)
}

/// The entries `q` selects: from `cursor` on, oldest first (forward), or up to `cursor`,
/// newest first (backward); at most `limit`, at least `level`.
fn select_logs<'a>(logs: &'a [LogEntry], q: &LogsQuery) -> Vec<&'a LogEntry> {
    let wanted = |e: &&LogEntry| builds::level_rank(e.level) >= q.min_level;
    if q.forward {
        logs.iter()
            .filter(wanted)
            .filter(|e| q.cursor_ms.is_none_or(|c| e.timestamp_ms >= c))
            .take(q.limit)
            .collect()
    } else {
        logs.iter()
            .rev()
            .filter(wanted)
            .filter(|e| q.cursor_ms.is_none_or(|c| e.timestamp_ms <= c))
            .take(q.limit)
            .collect()
    }
}

/// A build's log by time (E2B's logs route, beside the status route's offsets).
#[utoipa::path(get, path = "/templates/{templateID}/builds/{buildID}/logs", tag = "templates",
    security(("ApiKeyAuth" = [])),
    params(("templateID" = String, Path), ("buildID" = String, Path),
        ("cursor" = Option<i64>, Query), ("limit" = Option<u64>, Query),
        ("direction" = Option<String>, Query), ("level" = Option<String>, Query),
        ("source" = Option<String>, Query)),
    responses((status = 200, body = BuildLogs),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn build_logs(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((template_id, build_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<BuildLogs>> {
    let q = parse_logs_query(query.as_deref())?;
    let snap = find_build(&app, &caller, &template_id, &build_id).await?;
    let logs = select_logs(&snap.logs, &q)
        .into_iter()
        .map(entry_json)
        .collect();
    Ok(Json(BuildLogs { logs }))
}

/// Whether a template of that name exists (`Template.exists`).
#[utoipa::path(get, path = "/templates/aliases/{alias}", tag = "templates",
    security(("ApiKeyAuth" = [])), params(("alias" = String, Path)),
    responses((status = 200, body = AliasInfo), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn alias(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(alias): Path<String>,
) -> ApiResult<Json<AliasInfo>> {
    let images = app.lifecycle.dirs().images();
    if valid_name(&alias) && sandcell_runtime::Image::resolve(&images, &alias).is_ok() {
        let access = crate::templates::access::access(&app.db, &alias).await?;
        // Another key's private template: as unknown.
        if access.visible_to(&caller.0) {
            return Ok(Json(AliasInfo {
                template_id: alias,
                public: access.public,
            }));
        }
    }
    Err(ApiError::not_found(format!("template '{alias}' not found")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_query_parses_sdk_shapes() {
        let q = parse_status_query(Some("logsOffset=5&limit=500&level=warn")).unwrap();
        assert_eq!((q.offset, q.limit, q.min_level), (5, MAX_STATUS_ENTRIES, 2));
        assert!(parse_status_query(Some("level=loud")).is_err());
        assert!(parse_status_query(Some("logsOffset=-1")).is_err());
    }

    #[test]
    fn logs_query_and_selection_follow_e2b() {
        let q = parse_logs_query(Some(
            "cursor=20&limit=500&direction=backward&level=warn&source=persistent",
        ))
        .unwrap();
        assert_eq!(
            q,
            LogsQuery {
                cursor_ms: Some(20),
                limit: MAX_STATUS_ENTRIES,
                forward: false,
                min_level: 2
            }
        );
        assert!(parse_logs_query(Some("direction=up")).is_err());
        assert!(parse_logs_query(Some("source=elsewhere")).is_err());
        assert!(parse_logs_query(Some("cursor=soon")).is_err());
        let entry = |ms, level| LogEntry {
            timestamp_ms: ms,
            level,
            message: format!("{ms}"),
            step: None,
        };
        let logs = [
            entry(10, "info"),
            entry(20, "warn"),
            entry(30, "info"),
            entry(40, "error"),
        ];
        let pick = |raw: &str| -> Vec<i64> {
            let q = parse_logs_query(Some(raw)).unwrap();
            select_logs(&logs, &q)
                .iter()
                .map(|e| e.timestamp_ms)
                .collect()
        };
        assert_eq!(pick(""), vec![10, 20, 30, 40]);
        assert_eq!(pick("cursor=20&limit=2"), vec![20, 30]);
        assert_eq!(pick("direction=backward&cursor=30"), vec![30, 20, 10]);
        assert_eq!(pick("direction=backward&level=warn"), vec![40, 20]);
    }

    #[test]
    fn uploads_with_special_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("a/link")).unwrap();
        assert!(only_plain_files(dir.path()).is_ok());
        let fifo = std::ffi::CString::new(
            dir.path()
                .join("a/b/fifo")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let err = only_plain_files(dir.path()).unwrap_err();
        assert!(err.contains("a/b/fifo"), "{err}");
    }

    #[test]
    fn tree_bytes_counts_files_not_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), vec![0u8; 1000]).unwrap();
        std::fs::write(dir.path().join("g"), vec![0u8; 24]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("a/link")).unwrap();
        assert_eq!(tree_bytes(dir.path()), 1024);
        assert_eq!(tree_bytes(&dir.path().join("missing")), 0);
        assert_eq!(too_large(10, 4).status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn the_routes_are_in_the_openapi_description() {
        let (_, api) = crate::routes();
        for path in [
            "/v3/templates",
            "/templates/{templateID}/files/{hash}",
            "/v2/templates/{templateID}/builds/{buildID}",
            "/templates/{templateID}/builds/{buildID}/status",
            "/templates/aliases/{alias}",
        ] {
            assert!(api.paths.paths.contains_key(path), "{path}");
        }
        let files = &api.paths.paths["/templates/{templateID}/files/{hash}"];
        assert!(files.get.is_some() && files.put.is_some());
    }
}
