//! Host-side client of the agent, over any byte stream: a Unix socket, a hybrid-vsock stream
//! after its `CONNECT` handshake, TCP. One HTTP/1.1 connection per call, opened by a
//! [`Connector`], so concurrent calls never queue behind a long Start stream.
//!
//! The agent is untrusted: every reply is read with a size cap. Time limits are the
//! caller's (wrap calls in `tokio::time::timeout`).

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Incoming};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use sandcell_proto::agent::{
    self as wire, CloseStdinRequest, ConnectError, DataEvent, EndEvent, EndOfStream, EntryInfo,
    Event, InitRequest, ProcessEvent, ProcessInput, ProcessSelector, SendInputRequest,
    SendSignalRequest, StartRequest, envelope,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;

use crate::body::ReaderBody;

/// Default cap on one Start-stream envelope.
pub const MAX_ENVELOPE: usize = 4 * 1024 * 1024;
/// Cap on error bodies and unary replies.
const MAX_SMALL_REPLY: usize = 64 * 1024;
/// Chunk size of uploads.
const UPLOAD_CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to the agent: {0}")]
    Connect(#[source] io::Error),
    #[error("HTTP exchange with the agent ({what}): {source}")]
    Http { what: String, source: hyper::Error },
    #[error("the agent answered HTTP {status} to {what}: {code}: {message}")]
    Status {
        what: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("the agent reported an error in {what}: {code}: {message}")]
    Rpc {
        what: String,
        code: String,
        message: String,
    },
    #[error("malformed reply from the agent to {what}: {reason}")]
    Protocol { what: String, reason: String },
    #[error("{what}: output exceeds the {max}-byte limit")]
    TooLarge { what: String, max: usize },
}

impl ClientError {
    /// The Connect error code, when the agent sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Status { code, .. } | ClientError::Rpc { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status, when the agent answered with an error status.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    fn protocol(what: &str, reason: impl ToString) -> Self {
        ClientError::Protocol {
            what: what.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// Opens one byte stream to the agent per call.
pub trait Connector: Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn connect(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl<F, Fut, S> Connector for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = io::Result<S>> + Send,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Io = S;
    fn connect(&self) -> impl Future<Output = io::Result<S>> + Send {
        self()
    }
}

/// Connects to an agent listening on a Unix socket.
#[derive(Debug, Clone)]
pub struct UnixConnector(pub PathBuf);

impl Connector for UnixConnector {
    type Io = UnixStream;
    fn connect(&self) -> impl Future<Output = io::Result<UnixStream>> + Send {
        UnixStream::connect(self.0.clone())
    }
}

#[derive(Debug)]
pub struct AgentClient<C> {
    connector: Arc<C>,
    max_envelope: usize,
}

impl<C> Clone for AgentClient<C> {
    fn clone(&self) -> Self {
        AgentClient {
            connector: self.connector.clone(),
            max_envelope: self.max_envelope,
        }
    }
}

impl AgentClient<UnixConnector> {
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        AgentClient::new(UnixConnector(path.into()))
    }
}

impl<C: Connector> AgentClient<C> {
    pub fn new(connector: C) -> Self {
        AgentClient {
            connector: Arc::new(connector),
            max_envelope: MAX_ENVELOPE,
        }
    }

    /// Caps one Start-stream envelope (default [`MAX_ENVELOPE`]).
    pub fn with_max_envelope(mut self, max: usize) -> Self {
        self.max_envelope = max;
        self
    }

    /// Sends one request on a fresh connection and returns the response head.
    async fn send<B>(&self, what: &str, req: Request<B>) -> Result<Response<Incoming>, ClientError>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let io = self
            .connector
            .connect()
            .await
            .map_err(ClientError::Connect)?;
        let http_err = |source| ClientError::Http {
            what: what.to_owned(),
            source,
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(http_err)?;
        // Drives the connection until the response body is consumed or dropped; its errors
        // surface through the request and body.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sender.send_request(req).await.map_err(http_err)
    }

    /// Turns a non-success answer into [`ClientError::Status`].
    async fn check(
        what: &str,
        resp: Response<Incoming>,
    ) -> Result<Response<Incoming>, ClientError> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let body = read_capped(what, resp.into_body(), MAX_SMALL_REPLY)
            .await
            .unwrap_or_default();
        // Connect errors name their code; envd's REST ones (`/files`) carry the HTTP status,
        // named here the way Connect names it.
        let (code, message) = match serde_json::from_slice::<ConnectError>(&body) {
            Ok(e) => (e.code, e.message),
            Err(_) => match serde_json::from_slice::<sandcell_proto::agent::RestError>(&body) {
                Ok(e) => (code_of_status(status).to_owned(), e.message),
                Err(_) => (
                    "unknown".to_owned(),
                    String::from_utf8_lossy(&body).into_owned(),
                ),
            },
        };
        Err(ClientError::Status {
            what: what.to_owned(),
            status,
            code,
            message,
        })
    }

    pub async fn health(&self) -> Result<(), ClientError> {
        let req = request(
            Method::GET,
            wire::HEALTH_PATH,
            None,
            http_body_util::Empty::<Bytes>::new(),
        )?;
        Self::check("health", self.send("health", req).await?)
            .await
            .map(drop)
    }

    /// Starts a process and returns its event stream. A failure to start (say, no such
    /// command) comes out of the stream as [`ClientError::Rpc`].
    pub async fn start(&self, start: &StartRequest) -> Result<ProcessStream, ClientError> {
        let json = serde_json::to_vec(start).map_err(|e| ClientError::protocol("Start", e))?;
        let body = http_body_util::Full::new(Bytes::from(envelope::encode(0, &json)));
        let req = request(
            Method::POST,
            wire::START_PATH,
            Some(wire::CONNECT_JSON),
            body,
        )?;
        let resp = Self::check("Start", self.send("Start", req).await?).await?;
        Ok(ProcessStream {
            body: resp.into_body(),
            decoder: envelope::Decoder::new(self.max_envelope),
            done: false,
        })
    }

    async fn unary<T: serde::Serialize>(
        &self,
        what: &str,
        path: &str,
        message: &T,
    ) -> Result<(), ClientError> {
        let json = serde_json::to_vec(message).map_err(|e| ClientError::protocol(what, e))?;
        let req = request(
            Method::POST,
            path,
            Some("application/json"),
            http_body_util::Full::new(Bytes::from(json)),
        )?;
        let resp = Self::check(what, self.send(what, req).await?).await?;
        read_capped(what, resp.into_body(), MAX_SMALL_REPLY)
            .await
            .map(drop)
    }

    pub async fn send_input(&self, pid: u32, data: &[u8]) -> Result<(), ClientError> {
        let message = SendInputRequest {
            process: ProcessSelector { pid },
            input: ProcessInput {
                stdin: BASE64.encode(data),
            },
        };
        self.unary("SendInput", wire::SEND_INPUT_PATH, &message)
            .await
    }

    pub async fn close_stdin(&self, pid: u32) -> Result<(), ClientError> {
        let message = CloseStdinRequest {
            process: ProcessSelector { pid },
        };
        self.unary("CloseStdin", wire::CLOSE_STDIN_PATH, &message)
            .await
    }

    /// Signals the process group of `pid`. Signals envd knows by name go by name; others by
    /// number (which only our agent understands).
    pub async fn send_signal(&self, pid: u32, signal: i32) -> Result<(), ClientError> {
        let name = match signal {
            1 => "SIGNAL_SIGHUP".to_owned(),
            2 => "SIGNAL_SIGINT".to_owned(),
            9 => "SIGNAL_SIGKILL".to_owned(),
            15 => "SIGNAL_SIGTERM".to_owned(),
            n => n.to_string(),
        };
        let message = SendSignalRequest {
            process: ProcessSelector { pid },
            signal: name,
        };
        self.unary("SendSignal", wire::SEND_SIGNAL_PATH, &message)
            .await
    }

    /// Streams a file out of the sandbox.
    pub async fn read_file(&self, path: &str) -> Result<FileStream, ClientError> {
        let uri = format!("{}?path={}", wire::FILES_PATH, encode_query_value(path));
        let req = request(
            Method::GET,
            &uri,
            None,
            http_body_util::Empty::<Bytes>::new(),
        )?;
        let resp = Self::check("GET /files", self.send("GET /files", req).await?).await?;
        Ok(FileStream {
            body: resp.into_body(),
        })
    }

    /// Streams `contents` into a file in the sandbox (parents created, replaced atomically).
    pub async fn write_file<R>(
        &self,
        path: &str,
        contents: R,
    ) -> Result<Vec<EntryInfo>, ClientError>
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let uri = format!("{}?path={}", wire::FILES_PATH, encode_query_value(path));
        let body = ReaderBody::new(contents, UPLOAD_CHUNK);
        let req = request(Method::POST, &uri, Some("application/octet-stream"), body)?;
        let resp = Self::check("POST /files", self.send("POST /files", req).await?).await?;
        let reply = read_capped("POST /files", resp.into_body(), MAX_SMALL_REPLY).await?;
        serde_json::from_slice(&reply).map_err(|e| ClientError::protocol("POST /files", e))
    }

    /// `POST /init` with `init` (the runtime's own fields: a restored microVM's
    /// `sandcellNet`; the daemon sends the rest itself).
    pub async fn init(&self, init: &InitRequest) -> Result<(), ClientError> {
        let body = serde_json::to_vec(init).map_err(|e| ClientError::protocol("init", e))?;
        let req = request(
            Method::POST,
            wire::INIT_PATH,
            Some("application/json"),
            http_body_util::Full::new(Bytes::from(body)),
        )?;
        Self::check("init", self.send("init", req).await?)
            .await
            .map(drop)
    }

    /// Asks the agent to power the sandbox off (or, not being PID 1, to exit).
    pub async fn poweroff(&self) -> Result<(), ClientError> {
        let req = request(
            Method::POST,
            wire::POWEROFF_PATH,
            None,
            http_body_util::Empty::<Bytes>::new(),
        )?;
        Self::check("poweroff", self.send("poweroff", req).await?)
            .await
            .map(drop)
    }
}

impl<C: Connector> AgentClient<C> {
    /// Asks the agent to close its listener and every connection until the runtime writes
    /// the resume marker ([`wire::CHECKPOINT_HOLD_PATH`]); the answer comes before it does.
    pub async fn checkpoint_hold(&self) -> Result<(), ClientError> {
        let req = request(
            Method::POST,
            wire::CHECKPOINT_HOLD_PATH,
            None,
            http_body_util::Empty::<Bytes>::new(),
        )?;
        Self::check("checkpoint hold", self.send("checkpoint hold", req).await?)
            .await
            .map(drop)
    }
}

fn request<B>(
    method: Method,
    uri: &str,
    content_type: Option<&'static str>,
    body: B,
) -> Result<Request<B>, ClientError> {
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = uri
        .parse()
        .map_err(|e| ClientError::protocol(uri, format!("bad request URI: {e}")))?;
    // HTTP/1.1 requires a Host; the agent ignores its value.
    req.headers_mut()
        .insert(HOST, HeaderValue::from_static("sandcell-agent"));
    if let Some(ct) = content_type {
        req.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    Ok(req)
}

/// The Connect code for an HTTP status (the inverse of connect-go's mapping).
fn code_of_status(status: u16) -> &'static str {
    match status {
        400 => "invalid_argument",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        409 => "already_exists",
        429 | 507 => "resource_exhausted",
        501 => "unimplemented",
        503 => "unavailable",
        504 => "deadline_exceeded",
        _ => "internal",
    }
}

/// Percent-encodes everything but unreserved characters and `/`.
fn encode_query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn read_capped(what: &str, body: Incoming, max: usize) -> Result<Bytes, ClientError> {
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ClientError::TooLarge {
            what: what.to_owned(),
            max,
        }),
        Err(e) => Err(ClientError::protocol(what, e)),
    }
}

/// Which output a data event carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    Stdout,
    Stderr,
    Pty,
}

/// The bytes of a data event.
pub fn decode_data(data: &DataEvent) -> Result<(OutputKind, Vec<u8>), ClientError> {
    let (kind, b64) = match (&data.stdout, &data.stderr, &data.pty) {
        (Some(s), None, None) => (OutputKind::Stdout, s),
        (None, Some(s), None) => (OutputKind::Stderr, s),
        (None, None, Some(s)) => (OutputKind::Pty, s),
        _ => {
            return Err(ClientError::protocol(
                "Start",
                "a data event must carry exactly one output",
            ));
        }
    };
    let bytes = BASE64
        .decode(b64.as_bytes())
        .map_err(|e| ClientError::protocol("Start", e))?;
    Ok((kind, bytes))
}

/// The events of one process, as they come.
#[derive(Debug)]
pub struct ProcessStream {
    body: Incoming,
    decoder: envelope::Decoder,
    done: bool,
}

/// Everything a process printed, and how it ended.
#[derive(Debug, Clone)]
pub struct ProcessOutput {
    pub pid: Option<u32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub end: EndEvent,
}

impl ProcessStream {
    /// The next event; `None` once the stream ended cleanly. An error in the end-of-stream
    /// message comes out as [`ClientError::Rpc`].
    pub async fn next(&mut self) -> Option<Result<ProcessEvent, ClientError>> {
        loop {
            match self.decoder.next() {
                Err(e) => return Some(Err(self.fail(ClientError::protocol("Start", e)))),
                Ok(Some(env)) if env.is_end() => {
                    self.done = true;
                    return match serde_json::from_slice::<EndOfStream>(&env.message) {
                        Ok(EndOfStream { error: None }) => None,
                        Ok(EndOfStream { error: Some(e) }) => Some(Err(ClientError::Rpc {
                            what: "Start".to_owned(),
                            code: e.code,
                            message: e.message,
                        })),
                        Err(e) => Some(Err(ClientError::protocol("Start", e))),
                    };
                }
                Ok(Some(env)) => {
                    return Some(
                        serde_json::from_slice(&env.message)
                            .map_err(|e| self.fail(ClientError::protocol("Start", e))),
                    );
                }
                Ok(None) if self.done => return None,
                Ok(None) => {}
            }
            match self.body.frame().await {
                None => {
                    return Some(Err(self.fail(ClientError::protocol(
                        "Start",
                        "stream ended without end-of-stream",
                    ))));
                }
                Some(Err(source)) => {
                    return Some(Err(self.fail(ClientError::Http {
                        what: "Start".to_owned(),
                        source,
                    })));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
            }
        }
    }

    fn fail(&mut self, e: ClientError) -> ClientError {
        self.done = true;
        e
    }

    /// Reads the stream to its end, keeping at most `max_output` bytes of stdout + stderr.
    pub async fn collect(mut self, max_output: usize) -> Result<ProcessOutput, ClientError> {
        let (mut pid, mut stdout, mut stderr, mut end) = (None, Vec::new(), Vec::new(), None);
        while let Some(event) = self.next().await {
            match event?.event {
                Event::Start(s) => pid = Some(s.pid),
                Event::Data(d) => {
                    let (kind, bytes) = decode_data(&d)?;
                    if stdout.len() + stderr.len() + bytes.len() > max_output {
                        return Err(ClientError::TooLarge {
                            what: "process output".to_owned(),
                            max: max_output,
                        });
                    }
                    match kind {
                        OutputKind::Stderr => stderr.extend_from_slice(&bytes),
                        OutputKind::Stdout | OutputKind::Pty => stdout.extend_from_slice(&bytes),
                    }
                }
                Event::End(e) => end = Some(e),
                Event::Keepalive(_) => {}
            }
        }
        let end = end.ok_or_else(|| {
            ClientError::protocol("Start", "the stream closed without an end event")
        })?;
        Ok(ProcessOutput {
            pid,
            stdout,
            stderr,
            end,
        })
    }
}

/// A file's contents, as they come.
#[derive(Debug)]
pub struct FileStream {
    body: Incoming,
}

impl FileStream {
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, ClientError>> {
        loop {
            match self.body.frame().await? {
                Err(source) => {
                    return Some(Err(ClientError::Http {
                        what: "GET /files".to_owned(),
                        source,
                    }));
                }
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data));
                    }
                }
            }
        }
    }

    /// The whole file, refusing more than `max` bytes.
    pub async fn to_vec(self, max: usize) -> Result<Vec<u8>, ClientError> {
        read_capped("GET /files", self.body, max)
            .await
            .map(|b| b.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode_query_value("/tmp/a b&c=d%"), "/tmp/a%20b%26c%3Dd%25");
        assert_eq!(encode_query_value("/ü"), "/%C3%BC");
    }

    #[test]
    fn data_events_need_exactly_one_output() {
        let both = DataEvent {
            stdout: Some("YQ==".into()),
            stderr: Some("Yg==".into()),
            pty: None,
        };
        assert!(decode_data(&both).is_err());
        let one = DataEvent {
            stderr: Some("Yg==".into()),
            ..Default::default()
        };
        assert_eq!(
            decode_data(&one).ok(),
            Some((OutputKind::Stderr, b"b".to_vec()))
        );
    }
}
