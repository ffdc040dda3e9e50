//! The agent's HTTP/1.1 server: accept loop, routing and the handlers of the envd-shaped
//! protocol described in [`sandcell_proto::agent`].

use std::convert::Infallible;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use sandcell_proto::agent::{self as wire, ConnectError, envelope};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::body::{self, BoxBody, ChannelBody, ReaderBody};
use crate::files::{self, FileError};
use crate::listen::{Listener, Stream};
use crate::process::{ProcessError, Processes};
use crate::reaper::{ReapMode, Reaper};
use crate::stream;

/// Largest JSON request body (and Start envelope) accepted. File uploads are streamed and
/// not limited by this.
pub const MAX_JSON_BODY: usize = 1024 * 1024;
/// Chunk size when streaming a file out.
const FILE_CHUNK: usize = 64 * 1024;
/// Envelopes queued per Start stream before the reader of the process's output waits.
const STREAM_QUEUE: usize = 8;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Keepalive event interval on Start streams, unless the request's
    /// `Keepalive-Ping-Interval` header (seconds) says otherwise.
    pub keepalive: Duration,
    pub max_json_body: usize,
    pub reap_mode: ReapMode,
    /// Relative `/files` paths are resolved against this directory.
    pub files_base: PathBuf,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            keepalive: Duration::from_secs(30),
            max_json_body: MAX_JSON_BODY,
            reap_mode: ReapMode::for_this_process(),
            files_base: PathBuf::from("/"),
        }
    }
}

/// Why [`Server::serve`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServeOutcome {
    /// `POST /sandcell/poweroff` was answered; the caller powers off (or exits).
    PowerOffRequested,
}

struct State {
    config: ServerConfig,
    procs: Arc<Processes>,
}

pub struct Server {
    state: Arc<State>,
}

impl Server {
    /// Must be called inside a tokio runtime (it starts the child reaper).
    pub fn new(config: ServerConfig) -> io::Result<Self> {
        let reaper = Reaper::start(config.reap_mode)?;
        let procs = Arc::new(Processes::new(reaper));
        Ok(Server {
            state: Arc::new(State { config, procs }),
        })
    }

    /// Serves connections until a power-off request has been answered.
    pub async fn serve(&self, listener: Listener) -> io::Result<ServeOutcome> {
        let (off_tx, mut off_rx) = mpsc::channel::<()>(1);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(conn) => {
                        tokio::spawn(serve_connection(self.state.clone(), conn, off_tx.clone()));
                    }
                    Err(e) => {
                        crate::log!("accepting a connection: {e}");
                        // EMFILE and friends: do not spin on them.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = off_rx.recv() => return Ok(ServeOutcome::PowerOffRequested),
            }
        }
    }
}

async fn serve_connection(state: Arc<State>, conn: Stream, off_tx: mpsc::Sender<()>) {
    let poweroff = Arc::new(AtomicBool::new(false));
    let flag = poweroff.clone();
    let service = service_fn(move |req| {
        let state = state.clone();
        let flag = flag.clone();
        async move { Ok::<_, Infallible>(route(&state, &flag, req).await) }
    });
    // Errors here are the peer's (reset, malformed HTTP): nothing to do but drop it.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(conn), service)
        .await;
    // The power-off answer carried `Connection: close`, so the connection ending means the
    // client has its 204.
    if poweroff.load(Ordering::SeqCst) {
        let _ = off_tx.send(()).await;
    }
}

async fn route(state: &State, poweroff: &AtomicBool, req: Request<Incoming>) -> Response<BoxBody> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let result = match (method, path.as_str()) {
        (Method::GET, wire::HEALTH_PATH) => Ok(status_only(StatusCode::NO_CONTENT)),
        (Method::POST, wire::START_PATH) => start(state, req).await,
        (Method::POST, wire::SEND_INPUT_PATH) => send_input(state, req).await,
        (Method::POST, wire::CLOSE_STDIN_PATH) => close_stdin(state, req).await,
        (Method::POST, wire::SEND_SIGNAL_PATH) => send_signal(state, req).await,
        (Method::GET, wire::FILES_PATH) => read_file(state, req).await,
        (Method::POST, wire::FILES_PATH) => write_file(state, req).await,
        (Method::POST, wire::POWEROFF_PATH) => {
            poweroff.store(true, Ordering::SeqCst);
            let mut resp = status_only(StatusCode::NO_CONTENT);
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            Ok(resp)
        }
        (
            _,
            wire::HEALTH_PATH
            | wire::START_PATH
            | wire::FILES_PATH
            | wire::POWEROFF_PATH
            | wire::SEND_INPUT_PATH
            | wire::CLOSE_STDIN_PATH
            | wire::SEND_SIGNAL_PATH,
        ) => Err(ApiError::with_status(
            StatusCode::METHOD_NOT_ALLOWED,
            "unimplemented",
            format!("method not allowed on {path}"),
        )),
        _ => Err(ApiError::new("unimplemented", format!("no route {path}"))),
    };
    result.unwrap_or_else(ApiError::into_response)
}

/// An error answer: a Connect error body `{"code", "message"}` with an HTTP status.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    /// With the HTTP status Connect pairs with `code`.
    fn new(code: &'static str, message: String) -> Self {
        let status = match code {
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "not_found" | "unimplemented" => StatusCode::NOT_FOUND,
            "permission_denied" => StatusCode::FORBIDDEN,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            code,
            message,
        }
    }

    fn with_status(status: StatusCode, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            code,
            message,
        }
    }

    fn bad_request(message: String) -> Self {
        ApiError::new("invalid_argument", message)
    }

    fn unsupported_media_type(message: String) -> Self {
        ApiError::with_status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_argument",
            message,
        )
    }

    fn too_large(message: String) -> Self {
        ApiError::with_status(StatusCode::PAYLOAD_TOO_LARGE, "resource_exhausted", message)
    }

    fn into_response(self) -> Response<BoxBody> {
        let error = ConnectError {
            code: self.code.to_owned(),
            message: self.message,
        };
        let mut resp = json_reply(serde_json::to_vec(&error).unwrap_or_default());
        *resp.status_mut() = self.status;
        resp
    }
}

impl From<ProcessError> for ApiError {
    fn from(e: ProcessError) -> Self {
        ApiError::new(e.code(), e.to_string())
    }
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> Self {
        ApiError::new(e.code(), e.to_string())
    }
}

type Reply = Result<Response<BoxBody>, ApiError>;

fn status_only(status: StatusCode) -> Response<BoxBody> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = status;
    resp
}

fn with_content_type(mut resp: Response<BoxBody>, content_type: &'static str) -> Response<BoxBody> {
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn json_reply(json: Vec<u8>) -> Response<BoxBody> {
    with_content_type(Response::new(body::full(json)), "application/json")
}

fn content_type_is(req: &Request<Incoming>, want: &str) -> bool {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(want))
}

/// Reads a whole request body of at most `limit` bytes.
async fn bounded_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(format!(
            "request body exceeds {limit} bytes"
        ))),
        Err(e) => Err(ApiError::bad_request(format!(
            "reading the request body: {e}"
        ))),
    }
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("malformed {what}: {e}")))
}

/// Reads and parses a unary Connect request (`application/json`).
async fn unary<T: DeserializeOwned>(
    state: &State,
    req: Request<Incoming>,
    what: &str,
) -> Result<T, ApiError> {
    if req.headers().contains_key(CONTENT_TYPE) && !content_type_is(&req, "application/json") {
        return Err(ApiError::unsupported_media_type(format!(
            "{what} must be application/json"
        )));
    }
    let bytes = bounded_body(req, state.config.max_json_body).await?;
    parse_json(&bytes, what)
}

fn empty_reply() -> Response<BoxBody> {
    json_reply(b"{}".to_vec())
}

async fn start(state: &State, req: Request<Incoming>) -> Reply {
    if !content_type_is(&req, wire::CONNECT_JSON) {
        return Err(ApiError::unsupported_media_type(format!(
            "Start takes {}",
            wire::CONNECT_JSON
        )));
    }
    let keepalive = keepalive_of(&req).unwrap_or(state.config.keepalive);
    let max = state.config.max_json_body;
    let bytes = bounded_body(req, max + envelope::HEADER_LEN).await?;
    let mut decoder = envelope::Decoder::new(max);
    decoder.push(&bytes);
    let message = match decoder.next() {
        Ok(Some(env)) => env.message,
        Ok(None) => {
            return Err(ApiError::bad_request(
                "the Start request envelope is truncated".to_owned(),
            ));
        }
        Err(e @ envelope::DecodeError::TooLarge { .. }) => {
            return Err(ApiError::too_large(e.to_string()));
        }
        Err(e) => return Err(ApiError::bad_request(e.to_string())),
    };
    let start_req: wire::StartRequest = parse_json(&message, "StartRequest")?;

    let stream_body = match state.procs.start(&start_req) {
        Ok(running) => {
            let (tx, rx) = mpsc::channel(STREAM_QUEUE);
            tokio::spawn(stream::report(running, state.procs.clone(), tx, keepalive));
            ChannelBody::new(rx).boxed_unsync()
        }
        // Connect streams report errors in the end-of-stream message, with HTTP 200.
        Err(e) => body::full(stream::end_of_stream(Some(ConnectError {
            code: e.code().to_owned(),
            message: e.to_string(),
        }))),
    };
    Ok(with_content_type(
        Response::new(stream_body),
        wire::CONNECT_JSON,
    ))
}

/// The SDK's `Keepalive-Ping-Interval` header, in seconds (bounded to something sane).
fn keepalive_of(req: &Request<Incoming>) -> Option<Duration> {
    let value = req
        .headers()
        .get("keepalive-ping-interval")?
        .to_str()
        .ok()?;
    let secs: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(secs.clamp(1, 3600)))
}

async fn send_input(state: &State, req: Request<Incoming>) -> Reply {
    let input: wire::SendInputRequest = unary(state, req, "SendInputRequest").await?;
    let data = BASE64
        .decode(input.input.stdin.as_bytes())
        .map_err(|_| ApiError::bad_request("input.stdin is not base64".to_owned()))?;
    state.procs.send_input(input.process.pid, &data).await?;
    Ok(empty_reply())
}

async fn close_stdin(state: &State, req: Request<Incoming>) -> Reply {
    let close: wire::CloseStdinRequest = unary(state, req, "CloseStdinRequest").await?;
    state.procs.close_stdin(close.process.pid).await?;
    Ok(empty_reply())
}

async fn send_signal(state: &State, req: Request<Incoming>) -> Reply {
    let sig: wire::SendSignalRequest = unary(state, req, "SendSignalRequest").await?;
    let signo = parse_signal(&sig.signal)
        .ok_or_else(|| ApiError::bad_request(format!("unknown signal {:?}", sig.signal)))?;
    state.procs.signal(sig.process.pid, signo)?;
    Ok(empty_reply())
}

/// envd's enum names, or a plain signal number.
fn parse_signal(name: &str) -> Option<i32> {
    wire::signal_from_enum(name).or_else(|| name.parse().ok().filter(|n| (1..=64).contains(n)))
}

async fn read_file(state: &State, req: Request<Incoming>) -> Reply {
    let path = files::path_from_query(req.uri().query(), &state.config.files_base)?;
    let file = files::open_for_read(&path).await?;
    let body = ReaderBody::new(file, FILE_CHUNK).boxed_unsync();
    Ok(with_content_type(
        Response::new(body),
        "application/octet-stream",
    ))
}

async fn write_file(state: &State, req: Request<Incoming>) -> Reply {
    let path = files::path_from_query(req.uri().query(), &state.config.files_base)?;
    if req.headers().contains_key(CONTENT_TYPE)
        && !content_type_is(&req, "application/octet-stream")
    {
        return Err(ApiError::unsupported_media_type(
            "POST /files takes application/octet-stream (multipart is not supported yet)"
                .to_owned(),
        ));
    }
    if req.headers().contains_key(hyper::header::CONTENT_ENCODING) {
        return Err(ApiError::unsupported_media_type(
            "POST /files does not take a Content-Encoding".to_owned(),
        ));
    }
    let entry = files::write(&path, req.into_body()).await?;
    Ok(json_reply(serde_json::to_vec(&[entry]).unwrap_or_default()))
}
