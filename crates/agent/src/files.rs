//! `GET /files` and `POST /files` as envd serves them: query `path` (relative paths under the
//! user's home) and `username`; uploads as `application/octet-stream` or `multipart/form-data`
//! (field `file`, one or more files), optionally gzip-encoded; downloads gzip-encoded when the
//! client prefers it. Errors are envd's REST ones (`{"code": 404, "message"}`).
//!
//! Files are streamed, never held whole in memory. An upload is written in place like envd's
//! (`O_TRUNC`, existing mode kept, owner set to the user): watchers then see `CREATE`/`WRITE`
//! on the file's own name, which SDK code relies on. The price, as with envd: a reader may
//! see a partly written file, and a failed upload leaves a truncated one.
//! Not supported: Range/conditional downloads (the whole file is sent), signed URLs.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use sandcell_proto::agent::{ACCESS_TOKEN_HEADER, EntryInfo};
use tokio::fs::{File, OpenOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::body::{BoxBody, ChannelBody, ReaderBody};
use crate::connect::{ApiError, Reply, json_reply};
use crate::fs_api::{blocking, ensure_dirs};
use crate::metadata;
use crate::server::State;
use crate::state::token_matches;
use crate::upload::{Multipart, Source, UploadError, boundary_of};
use crate::users::User;

/// Chunk size when streaming a file out.
const FILE_CHUNK: usize = 64 * 1024;
/// Files uploaded in one multipart request.
const MAX_FILES_PER_UPLOAD: usize = 1000;

fn rest(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError::rest(status, message)
}

/// The query parameters envd reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FilesQuery {
    pub path: Option<String>,
    pub username: Option<String>,
    pub signature: Option<String>,
}

impl FilesQuery {
    /// Percent-decoded (`+` is a space, as in Go's `url.Query`); the first of repeats wins.
    pub fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let mut q = FilesQuery::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v).ok_or_else(|| {
                rest(
                    StatusCode::BAD_REQUEST,
                    format!("query parameter {k} is not valid percent-encoded UTF-8"),
                )
            })?;
            let slot = match k {
                "path" => &mut q.path,
                "username" => &mut q.username,
                "signature" => &mut q.signature,
                _ => continue,
            };
            slot.get_or_insert(v);
        }
        Ok(q)
    }
}

pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// envd's `validateSigning`: with an access token set, the header must carry it (signed
/// URLs are not supported by this agent, so a request relying on one is refused).
fn check_access<B>(state: &State, req: &Request<B>, q: &FilesQuery) -> Result<(), ApiError> {
    let Some(token) = state.shared.defaults().access_token.clone() else {
        return Ok(());
    };
    let unauthorized = |m: &str| rest(StatusCode::UNAUTHORIZED, m);
    match req.headers().get(ACCESS_TOKEN_HEADER) {
        Some(h) if h.to_str().is_ok_and(|v| token_matches(&token, v)) => Ok(()),
        Some(_) => Err(unauthorized(
            "access token present in header but does not match",
        )),
        None if q.signature.is_some() => Err(unauthorized(
            "invalid signature: signed file URLs are not supported by this agent",
        )),
        None => Err(unauthorized("missing signature query parameter")),
    }
}

fn resolve(state: &State, q: &FilesQuery, user: &User) -> Result<PathBuf, ApiError> {
    let path = q.path.as_deref().unwrap_or("");
    state.shared.resolve(path, user).map_err(|e| {
        rest(
            StatusCode::BAD_REQUEST,
            format!("error expanding and resolving path '{path}': {e}"),
        )
    })
}

/// The encoding to answer with, from `Accept-Encoding` (RFC 9110 q-values): `Some(true)` for
/// gzip, `Some(false)` for identity, `None` when neither is acceptable.
pub fn negotiate_gzip(accept: Option<&str>) -> Option<bool> {
    let Some(header) = accept.filter(|h| !h.trim().is_empty()) else {
        return Some(false);
    };
    let mut entries: Vec<(String, f32)> = header
        .split(',')
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
                .find_map(|v| v.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            (name, q)
        })
        .collect();
    let identity_q = entries.iter().find(|(n, _)| n == "identity").map(|e| e.1);
    let wildcard_q = entries.iter().find(|(n, _)| n == "*").map(|e| e.1);
    let identity_rejected =
        identity_q == Some(0.0) || (wildcard_q == Some(0.0) && identity_q.is_none_or(|q| q == 0.0));
    entries.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (name, q) in &entries {
        if *q == 0.0 {
            continue;
        }
        match name.as_str() {
            "identity" => return Some(false),
            "*" => return Some(identity_rejected),
            "gzip" => return Some(true),
            _ => {}
        }
    }
    if identity_rejected { None } else { Some(false) }
}

fn content_disposition(path: &Path) -> Option<HeaderValue> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    let value = if name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
        format!("inline; filename=\"{escaped}\"")
    } else {
        let encoded: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        format!("inline; filename*=utf-8''{encoded}")
    };
    HeaderValue::from_str(&value).ok()
}

pub async fn download(state: &State, req: Request<Incoming>) -> Reply {
    let q = FilesQuery::parse(req.uri().query())?;
    check_access(state, &req, &q)?;
    let user = state.shared.files_user(q.username.as_deref())?;
    let path = resolve(state, &q, &user)?;
    let meta = match tokio::fs::metadata(&path).await {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(rest(
                StatusCode::NOT_FOUND,
                format!("path '{}' does not exist", path.display()),
            ));
        }
        Err(e) => {
            return Err(rest(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("error checking if path exists '{}': {e}", path.display()),
            ));
        }
    };
    if meta.is_dir() {
        return Err(rest(
            StatusCode::BAD_REQUEST,
            format!("path '{}' is a directory", path.display()),
        ));
    }
    let accept = req
        .headers()
        .get(hyper::header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok());
    let gzip = negotiate_gzip(accept).ok_or_else(|| {
        rest(
            StatusCode::NOT_ACCEPTABLE,
            "no acceptable encoding found, supported: [identity, gzip]",
        )
    })?;
    let file = File::open(&path).await.map_err(|e| {
        rest(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error opening file '{}': {e}", path.display()),
        )
    })?;
    let body: BoxBody = if gzip {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(gzip_file(file, tx));
        ChannelBody::new(rx).boxed_unsync()
    } else {
        ReaderBody::new(file, FILE_CHUNK).boxed_unsync()
    };
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(
        hyper::header::VARY,
        HeaderValue::from_static("Accept-Encoding"),
    );
    if gzip {
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if let Some(cd) = content_disposition(&path) {
        headers.insert(hyper::header::CONTENT_DISPOSITION, cd);
    }
    Ok(resp)
}

/// Compresses `file` into the channel, a chunk at a time (the channel bounds the buffering).
async fn gzip_file(mut file: File, tx: mpsc::Sender<Bytes>) {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut buf = vec![0u8; FILE_CHUNK];
    loop {
        let n = match file.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(_) => return, // the body ends short; the client sees a broken gzip stream
        };
        if gz.write_all(&buf[..n]).is_err() {
            return;
        }
        let out = std::mem::take(gz.get_mut());
        if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
            return;
        }
    }
    if let Ok(rest) = gz.finish() {
        let _ = tx.send(Bytes::from(rest)).await;
    }
}

/// `X-Metadata-<key>: value` headers, keys lowercased, the first of repeats kept.
fn metadata_headers<B>(req: &Request<B>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for (name, value) in req.headers() {
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else {
            continue;
        };
        if key.is_empty() || out.contains_key(key) {
            continue;
        }
        let value = value.to_str().map_err(|_| {
            rest(
                StatusCode::BAD_REQUEST,
                format!("invalid metadata: value for key {key:?} is not printable ASCII"),
            )
        })?;
        out.insert(key.to_owned(), value.to_owned());
    }
    metadata::validate(&out)
        .map_err(|e| rest(StatusCode::BAD_REQUEST, format!("invalid metadata: {e}")))?;
    Ok(out)
}

pub async fn upload(state: &State, req: Request<Incoming>) -> Reply {
    let q = FilesQuery::parse(req.uri().query())?;
    check_access(state, &req, &q)?;
    let user = state.shared.files_user(q.username.as_deref())?;
    let gzip = match req
        .headers()
        .get(CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("").trim().to_ascii_lowercase())
    {
        None => false,
        Some(e) if e.is_empty() || e == "identity" => false,
        Some(e) if e == "gzip" => true,
        Some(e) => {
            return Err(rest(
                StatusCode::BAD_REQUEST,
                format!(
                    "error decompressing request body: unsupported Content-Encoding: {e}, supported: [gzip]"
                ),
            ));
        }
    };
    let meta = metadata_headers(&req)?;
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let source = Source::new(req.into_body(), gzip);
    let mut written = Vec::new();
    if media == "application/octet-stream" {
        if q.path.is_none() {
            return Err(rest(
                StatusCode::BAD_REQUEST,
                "path query parameter is required for raw body upload",
            ));
        }
        let target = resolve(state, &q, &user)?;
        let mut src = Chunks::Raw(source);
        written.push(write_file(&target, &user, &meta, &mut src).await?);
    } else if media.starts_with("multipart/") {
        let boundary = boundary_of(&content_type).ok_or_else(|| {
            rest(
                StatusCode::INTERNAL_SERVER_ERROR,
                "error parsing multipart form: no multipart boundary param in Content-Type",
            )
        })?;
        let mut parts = Chunks::Part(Multipart::new(source, &boundary));
        while let Some(headers) = parts.next_part().await? {
            if headers.name.as_deref() != Some("file") {
                continue;
            }
            let target = match (&q.path, &headers.filename) {
                (Some(_), _) => resolve(state, &q, &user)?,
                (None, Some(name)) => state.shared.resolve(name, &user).map_err(|e| {
                    rest(
                        StatusCode::BAD_REQUEST,
                        format!("error resolving path: {e}"),
                    )
                })?,
                (None, None) => {
                    return Err(rest(
                        StatusCode::BAD_REQUEST,
                        "error getting multipart custom part file name: filename not found in Content-Disposition header",
                    ));
                }
            };
            let target_str = target.to_string_lossy();
            if written.iter().any(|e: &EntryInfo| e.path == target_str) {
                return Err(rest(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "you cannot upload multiple files to the same path '{target_str}' in one upload request, only the first specified file was uploaded"
                    ),
                ));
            }
            if written.len() >= MAX_FILES_PER_UPLOAD {
                return Err(rest(
                    StatusCode::BAD_REQUEST,
                    format!("more than {MAX_FILES_PER_UPLOAD} files in one upload"),
                ));
            }
            written.push(write_file(&target, &user, &meta, &mut parts).await?);
        }
        parts.finish().await?;
    } else {
        return Err(rest(
            StatusCode::BAD_REQUEST,
            format!(
                "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
            ),
        ));
    }
    json_reply(&written)
}

/// The bytes of one file: the whole body, or the current multipart part.
enum Chunks {
    Raw(Source),
    Part(Multipart),
}

impl Chunks {
    async fn next(&mut self) -> Result<Option<Bytes>, UploadError> {
        match self {
            Chunks::Raw(s) => s.next().await,
            Chunks::Part(m) => m.read().await,
        }
    }

    async fn next_part(&mut self) -> Result<Option<crate::upload::PartHeaders>, ApiError> {
        match self {
            Chunks::Part(m) => m.next_part().await.map_err(upload_error),
            Chunks::Raw(_) => Ok(None),
        }
    }

    /// Reads what is left of the body (see [`Multipart::finish`]).
    async fn finish(&mut self) -> Result<(), ApiError> {
        match self {
            Chunks::Part(m) => m.finish().await.map_err(upload_error),
            Chunks::Raw(_) => Ok(()),
        }
    }
}

fn upload_error(e: UploadError) -> ApiError {
    let status = match e {
        UploadError::Gzip(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    rest(status, e.to_string())
}

fn io_error(what: &str, path: &Path, e: &io::Error) -> ApiError {
    let status = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    rest(status, format!("{what} '{}': {e}", path.display()))
}

/// Streams `src` into `target` as `user`, in place (envd's `processFile`).
async fn write_file(
    target: &Path,
    user: &User,
    meta: &BTreeMap<String, String>,
    src: &mut Chunks,
) -> Result<EntryInfo, ApiError> {
    let name = target
        .file_name()
        .ok_or_else(|| {
            rest(
                StatusCode::BAD_REQUEST,
                format!("path '{}' has no file name", target.display()),
            )
        })?
        .to_owned();
    let parent = target.parent().unwrap_or(Path::new("/")).to_owned();
    let (uid, gid) = (user.uid, user.gid);
    let probe = target.to_owned();
    blocking(move || {
        ensure_dirs(&parent, uid, gid).map_err(|e| {
            rest(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("error ensuring directories: {e}"),
            )
        })?;
        match std::fs::metadata(&probe) {
            Ok(m) if m.is_dir() => Err(rest(
                StatusCode::BAD_REQUEST,
                format!("path is a directory: {}", probe.display()),
            )),
            _ => Ok(()),
        }
    })
    .await?;

    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(target)
        .await
        .map_err(|e| io_error("error opening file", target, &e))?;
    // SAFETY: fchown on the descriptor `file` keeps open.
    if unsafe { libc::fchown(file.as_raw_fd(), uid, gid) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io_error("error changing file ownership", target, &e));
    }
    while let Some(chunk) = src.next().await.map_err(upload_error)? {
        file.write_all(&chunk)
            .await
            .map_err(|e| io_error("error writing file", target, &e))?;
    }
    // tokio's File finishes writes in the background: flush so errors surface here.
    file.flush()
        .await
        .map_err(|e| io_error("error writing file", target, &e))?;
    // Always rewritten, so an upload without metadata clears the old (envd).
    let stored = metadata::write(file.as_raw_fd(), meta)
        .map_err(|e| io_error("error writing file metadata", target, &e))?;
    if !stored && !meta.is_empty() {
        crate::log!(
            "{}: the filesystem has no xattrs; metadata not stored",
            target.display()
        );
    }
    drop(file);
    let persisted = metadata::read(target).unwrap_or_default();
    Ok(EntryInfo {
        name: name.to_string_lossy().into_owned(),
        kind: "file".to_owned(),
        path: target.to_string_lossy().into_owned(),
        metadata: (!persisted.is_empty()).then_some(persisted),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_query() {
        let q = FilesQuery::parse(Some("username=u&path=%2Ftmp%2Fa%20b+c.txt&path=x")).ok();
        assert_eq!(
            q,
            Some(FilesQuery {
                path: Some("/tmp/a b c.txt".to_owned()),
                username: Some("u".to_owned()),
                signature: None,
            })
        );
        assert!(FilesQuery::parse(Some("path=%zz")).is_err());
        assert!(FilesQuery::parse(Some("path=%2")).is_err());
        assert_eq!(FilesQuery::parse(None).ok(), Some(FilesQuery::default()));
    }

    #[test]
    fn negotiates_encodings_like_envd() {
        assert_eq!(negotiate_gzip(None), Some(false));
        assert_eq!(negotiate_gzip(Some("gzip, deflate")), Some(true));
        assert_eq!(negotiate_gzip(Some("br")), Some(false));
        assert_eq!(
            negotiate_gzip(Some("identity;q=1, gzip;q=0.5")),
            Some(false)
        );
        assert_eq!(negotiate_gzip(Some("*;q=0")), None);
        assert_eq!(negotiate_gzip(Some("identity;q=0, *")), Some(true));
        assert_eq!(negotiate_gzip(Some("gzip;q=0")), Some(false));
    }
}
