//! A sandbox's envd API through the daemon's proxy: processes (Start with or without a PTY,
//! input, signals, resize) and files (streamed both ways).
//!
//! Every call opens its own connection, so a long Start stream never holds up the input
//! and signal calls made beside it. Replies are bounded: one Start envelope at most
//! [`MAX_ENVELOPE`], unary answers and error bodies at most [`MAX_SMALL_REPLY`]; file
//! downloads stream chunk by chunk.

use crate::body::{ChannelBody, ReaderBody};
use crate::{Client, ClientError, ENVD_PORT};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use sandcell_proto::agent::filesystem::{self as fs, EntryResponse, PathRequest};
use sandcell_proto::agent::process::{
    self as proc, ProcessInput, ProcessSelector, Pty, PtySize, StartRequest, StreamInputData,
    StreamInputRequest, StreamInputStart, UpdateRequest,
};
use sandcell_proto::agent::{
    self as wire, ConnectError, DataEvent, EndOfStream, EntryInfo, ProcessEvent, RestError,
    envelope,
};
use tokio::io::AsyncRead;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Largest Start-stream envelope accepted.
pub const MAX_ENVELOPE: usize = 4 * 1024 * 1024;
/// Largest unary answer or error body read.
pub const MAX_SMALL_REPLY: usize = 256 * 1024;
/// Chunk size of uploads.
const UPLOAD_CHUNK: usize = 64 * 1024;
/// Input chunks queued for a [`InputStream`] before `send` waits.
const INPUT_QUEUE: usize = 16;

/// The envd API of one sandbox, as one user.
#[derive(Debug, Clone)]
pub struct Envd {
    client: Client,
    sandbox_id: String,
    access_token: Option<String>,
    user: Option<String>,
}

impl Client {
    /// The envd API of sandbox `sandbox_id` (its access token, if it is `secure`).
    pub fn envd_of(&self, sandbox_id: &str, access_token: Option<String>) -> Envd {
        Envd {
            client: self.clone(),
            sandbox_id: sandbox_id.to_string(),
            access_token,
            user: None,
        }
    }

    /// The envd API of a sandbox known by id only: its access token is asked of the daemon.
    pub async fn connect_envd(&self, sandbox_id: &str) -> Result<Envd, ClientError> {
        let detail = self.get_sandbox(sandbox_id).await?;
        Ok(self.envd_of(sandbox_id, detail.envd_access_token))
    }
}

impl Envd {
    /// Calls made as `user` (`root`, `user`, ...); without one the sandbox's default user.
    pub fn as_user(mut self, user: Option<String>) -> Envd {
        self.user = user;
        self
    }

    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    fn request<B>(
        &self,
        method: Method,
        uri: &str,
        content_type: Option<&'static str>,
        body: B,
    ) -> Result<Request<B>, ClientError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header("e2b-sandbox-id", &self.sandbox_id)
            .header("e2b-sandbox-port", ENVD_PORT.to_string());
        if let Some(token) = &self.access_token {
            builder = builder.header(wire::ACCESS_TOKEN_HEADER, token);
        }
        if let Some(ct) = content_type {
            builder = builder.header(CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        // envd names the user of an RPC in Basic auth with an empty password.
        if let Some(user) = &self.user {
            builder = builder.header(
                AUTHORIZATION,
                format!("Basic {}", BASE64.encode(format!("{user}:"))),
            );
        }
        builder.body(body).map_err(|e| ClientError::Url {
            url: uri.to_string(),
            problem: e.to_string(),
        })
    }

    /// Sends and turns an error status into [`ClientError::Envd`].
    async fn call<B>(&self, what: &str, req: Request<B>) -> Result<Response<Incoming>, ClientError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let resp = self.client.send(req).await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = read_capped(what, resp.into_body(), MAX_SMALL_REPLY)
            .await
            .unwrap_or_default();
        Err(envd_error(what, status, &body))
    }

    async fn unary<T: serde::Serialize>(
        &self,
        what: &str,
        path: &str,
        message: &T,
    ) -> Result<Bytes, ClientError> {
        let json = serde_json::to_vec(message).map_err(|e| decode(what, e))?;
        let req = self.request(
            Method::POST,
            path,
            Some("application/json"),
            Full::new(Bytes::from(json)),
        )?;
        let resp = self.call(what, req).await?;
        read_capped(what, resp.into_body(), MAX_SMALL_REPLY).await
    }

    /// Starts a process; its events stream. A process that cannot start (no such command)
    /// comes out of the stream as [`ClientError::Rpc`].
    pub async fn start(&self, start: &StartRequest) -> Result<ProcessStream, ClientError> {
        let json = serde_json::to_vec(start).map_err(|e| decode("Start", e))?;
        let body = Full::new(Bytes::from(envelope::encode(0, &json)));
        let req = self.request(
            Method::POST,
            wire::START_PATH,
            Some(wire::CONNECT_JSON),
            body,
        )?;
        let resp = self.call("Start", req).await?;
        Ok(ProcessStream {
            body: resp.into_body(),
            decoder: envelope::Decoder::new(MAX_ENVELOPE),
            done: false,
        })
    }

    /// Writes to the stdin (or, `pty`, the terminal) of process `pid`.
    pub async fn send_input(&self, pid: u32, data: &[u8], pty: bool) -> Result<(), ClientError> {
        let message = proc::SendInputRequest {
            process: ProcessSelector::pid(pid),
            input: input_of(data, pty),
        };
        self.unary("SendInput", wire::SEND_INPUT_PATH, &message)
            .await
            .map(drop)
    }

    /// Opens a `StreamInput` call to process `pid`: one request whose body carries every
    /// input chunk as it is sent.
    pub fn stream_input(&self, pid: u32, pty: bool) -> Result<InputStream, ClientError> {
        let (tx, rx) = mpsc::channel::<Bytes>(INPUT_QUEUE);
        let first = StreamInputRequest {
            start: Some(StreamInputStart {
                process: ProcessSelector::pid(pid),
            }),
            ..Default::default()
        };
        let first = serde_json::to_vec(&first).map_err(|e| decode("StreamInput", e))?;
        // The channel is empty and ours: this cannot fail.
        let _ = tx.try_send(Bytes::from(envelope::encode(0, &first)));
        let req = self.request(
            Method::POST,
            proc::STREAM_INPUT_PATH,
            Some(wire::CONNECT_JSON),
            ChannelBody::new(rx),
        )?;
        let envd = self.clone();
        let call = tokio::spawn(async move {
            let resp = envd.call("StreamInput", req).await?;
            let body = read_capped("StreamInput", resp.into_body(), MAX_SMALL_REPLY).await?;
            stream_reply_error("StreamInput", &body)
        });
        Ok(InputStream {
            tx: Some(tx),
            call,
            pty,
        })
    }

    pub async fn close_stdin(&self, pid: u32) -> Result<(), ClientError> {
        let message = proc::CloseStdinRequest {
            process: ProcessSelector::pid(pid),
        };
        self.unary("CloseStdin", wire::CLOSE_STDIN_PATH, &message)
            .await
            .map(drop)
    }

    /// Signals process `pid` (its group). envd's enum names for the ones it knows, the
    /// number for the rest (our agent takes any).
    pub async fn send_signal(&self, pid: u32, signal: i32) -> Result<(), ClientError> {
        let name = match signal {
            1 => serde_json::json!("SIGNAL_SIGHUP"),
            2 => serde_json::json!("SIGNAL_SIGINT"),
            9 => serde_json::json!("SIGNAL_SIGKILL"),
            15 => serde_json::json!("SIGNAL_SIGTERM"),
            n => serde_json::json!(n),
        };
        let message = proc::SendSignalRequest {
            process: ProcessSelector::pid(pid),
            signal: name,
        };
        self.unary("SendSignal", wire::SEND_SIGNAL_PATH, &message)
            .await
            .map(drop)
    }

    /// Resizes the PTY of process `pid`.
    pub async fn resize(&self, pid: u32, cols: u16, rows: u16) -> Result<(), ClientError> {
        let message = UpdateRequest {
            process: ProcessSelector::pid(pid),
            pty: Some(Pty {
                size: Some(PtySize {
                    cols: cols.into(),
                    rows: rows.into(),
                }),
            }),
        };
        self.unary("Update", proc::UPDATE_PATH, &message)
            .await
            .map(drop)
    }

    /// What is at `path`; `Ok(None)` when nothing is.
    pub async fn stat(&self, path: &str) -> Result<Option<fs::EntryInfo>, ClientError> {
        let message = PathRequest {
            path: path.to_string(),
        };
        match self.unary("Stat", fs::STAT_PATH, &message).await {
            Ok(body) => serde_json::from_slice::<EntryResponse>(&body)
                .map(|r| Some(r.entry))
                .map_err(|e| decode("Stat", e)),
            Err(ClientError::Envd { status, .. }) if status == StatusCode::NOT_FOUND => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn files_uri(&self, path: &str) -> String {
        let mut uri = format!("{}?path={}", wire::FILES_PATH, encode_query_value(path));
        if let Some(user) = &self.user {
            uri.push_str("&username=");
            uri.push_str(&encode_query_value(user));
        }
        uri
    }

    /// Streams the file at `path` out of the sandbox.
    pub async fn download(&self, path: &str) -> Result<Download, ClientError> {
        let req = self.request(
            Method::GET,
            &self.files_uri(path),
            None,
            Empty::<Bytes>::new(),
        )?;
        let resp = self.call("GET /files", req).await?;
        Ok(Download {
            body: resp.into_body(),
        })
    }

    /// Streams `contents` into the file at `path` (parents made as needed).
    pub async fn upload<R>(&self, path: &str, contents: R) -> Result<Vec<EntryInfo>, ClientError>
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let req = self.request(
            Method::POST,
            &self.files_uri(path),
            Some("application/octet-stream"),
            ReaderBody::new(contents, UPLOAD_CHUNK),
        )?;
        let resp = self.call("POST /files", req).await?;
        let body = read_capped("POST /files", resp.into_body(), MAX_SMALL_REPLY).await?;
        serde_json::from_slice(&body).map_err(|e| decode("POST /files", e))
    }
}

fn input_of(data: &[u8], pty: bool) -> ProcessInput {
    let b64 = BASE64.encode(data);
    if pty {
        ProcessInput {
            stdin: None,
            pty: Some(b64),
        }
    } else {
        ProcessInput {
            stdin: Some(b64),
            pty: None,
        }
    }
}

fn decode(what: &str, e: impl ToString) -> ClientError {
    ClientError::Decode {
        what: what.to_string(),
        problem: e.to_string(),
    }
}

/// An envd error answer: a Connect error (`{"code": "not_found", ...}`) or a REST one
/// (`{"code": 404, ...}`), else the raw text.
fn envd_error(what: &str, status: StatusCode, body: &[u8]) -> ClientError {
    let (code, message) = if let Ok(e) = serde_json::from_slice::<ConnectError>(body) {
        (e.code, e.message)
    } else if let Ok(e) = serde_json::from_slice::<RestError>(body) {
        (e.code.to_string(), e.message)
    } else if let Ok(e) = serde_json::from_slice::<EndOfStream>(body)
        && let Some(e) = e.error
    {
        (e.code, e.message)
    } else {
        (String::new(), String::from_utf8_lossy(body).into_owned())
    };
    ClientError::Envd {
        what: what.to_string(),
        status,
        code,
        message,
    }
}

/// The error in the end-of-stream message of a Connect stream answer, if any.
fn stream_reply_error(what: &str, body: &[u8]) -> Result<(), ClientError> {
    let mut decoder = envelope::Decoder::new(MAX_SMALL_REPLY);
    decoder.push(body);
    while let Some(env) = decoder.next().map_err(|e| decode(what, e))? {
        if env.is_end() {
            let end: EndOfStream =
                serde_json::from_slice(&env.message).map_err(|e| decode(what, e))?;
            return match end.error {
                None => Ok(()),
                Some(e) => Err(ClientError::Rpc {
                    what: what.to_string(),
                    code: e.code,
                    message: e.message,
                }),
            };
        }
    }
    Ok(())
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
    Limited::new(body, max)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ClientError::Body(format!("{what}: {e}")))
}

/// Which output a data event carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Stdout,
    Stderr,
    Pty,
}

/// The bytes of a data event.
pub fn decode_data(data: &DataEvent) -> Result<(Output, Vec<u8>), ClientError> {
    let (kind, b64) = match (&data.stdout, &data.stderr, &data.pty) {
        (Some(s), None, None) => (Output::Stdout, s),
        (None, Some(s), None) => (Output::Stderr, s),
        (None, None, Some(s)) => (Output::Pty, s),
        _ => {
            return Err(decode(
                "Start",
                "a data event must carry exactly one output",
            ));
        }
    };
    let bytes = BASE64
        .decode(b64.as_bytes())
        .map_err(|e| decode("Start", e))?;
    Ok((kind, bytes))
}

/// The events of one process, as they come.
#[derive(Debug)]
pub struct ProcessStream {
    body: Incoming,
    decoder: envelope::Decoder,
    done: bool,
}

impl ProcessStream {
    /// The next event; `None` once the stream ended cleanly. An error in the end-of-stream
    /// message comes out as [`ClientError::Rpc`].
    pub async fn next(&mut self) -> Option<Result<ProcessEvent, ClientError>> {
        loop {
            if self.done {
                return None;
            }
            match self.decoder.next() {
                Err(e) => {
                    self.done = true;
                    return Some(Err(decode("Start", e)));
                }
                Ok(Some(env)) if env.is_end() => {
                    self.done = true;
                    return match serde_json::from_slice::<EndOfStream>(&env.message) {
                        Ok(EndOfStream { error: None }) => None,
                        Ok(EndOfStream { error: Some(e) }) => Some(Err(ClientError::Rpc {
                            what: "Start".to_string(),
                            code: e.code,
                            message: e.message,
                        })),
                        Err(e) => Some(Err(decode("Start", e))),
                    };
                }
                Ok(Some(env)) => {
                    let event = serde_json::from_slice(&env.message).map_err(|e| {
                        self.done = true;
                        decode("Start", e)
                    });
                    return Some(event);
                }
                Ok(None) => {}
            }
            match self.body.frame().await {
                None => {
                    self.done = true;
                    return Some(Err(decode("Start", "stream ended without end-of-stream")));
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(ClientError::Body(format!("Start: {e}"))));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
            }
        }
    }
}

/// Input to one process, in order, over one `StreamInput` call.
#[derive(Debug)]
pub struct InputStream {
    tx: Option<mpsc::Sender<Bytes>>,
    call: JoinHandle<Result<(), ClientError>>,
    pty: bool,
}

impl InputStream {
    /// Queues `data`; waits while the daemon is behind.
    pub async fn send(&mut self, data: &[u8]) -> Result<(), ClientError> {
        let message = StreamInputRequest {
            data: Some(StreamInputData {
                input: input_of(data, self.pty),
            }),
            ..Default::default()
        };
        let json = serde_json::to_vec(&message).map_err(|e| decode("StreamInput", e))?;
        let sent = match &self.tx {
            Some(tx) => tx
                .send(Bytes::from(envelope::encode(0, &json)))
                .await
                .is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The call ended early: its error says why.
        self.tx = None;
        Err(self.finish_call().await.err().unwrap_or_else(|| {
            ClientError::Body("StreamInput: the daemon ended the input stream".to_string())
        }))
    }

    /// Ends the stream and waits for the daemon's answer (everything sent was delivered).
    pub async fn finish(mut self) -> Result<(), ClientError> {
        self.tx = None;
        self.finish_call().await
    }

    async fn finish_call(&mut self) -> Result<(), ClientError> {
        match (&mut self.call).await {
            Ok(result) => result,
            Err(e) => Err(ClientError::Body(format!("StreamInput: {e}"))),
        }
    }
}

/// A file's contents, as they come.
#[derive(Debug)]
pub struct Download {
    body: Incoming,
}

impl Download {
    /// The next chunk; `None` at the end.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, ClientError>> {
        loop {
            match self.body.frame().await? {
                Err(e) => return Some(Err(ClientError::Body(format!("GET /files: {e}")))),
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data));
                    }
                }
            }
        }
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
    fn envd_errors_keep_code_and_message() {
        let e = envd_error(
            "Stat",
            StatusCode::NOT_FOUND,
            br#"{"code":"not_found","message":"no such file"}"#,
        );
        assert!(
            matches!(&e, ClientError::Envd { code, message, .. } if code == "not_found" && message == "no such file")
        );
        let e = envd_error(
            "GET /files",
            StatusCode::UNAUTHORIZED,
            br#"{"code":401,"message":"bad user"}"#,
        );
        assert!(matches!(&e, ClientError::Envd { code, .. } if code == "401"));
        let e = envd_error("x", StatusCode::BAD_GATEWAY, b"plain");
        assert!(matches!(&e, ClientError::Envd { message, .. } if message == "plain"));
    }

    #[test]
    fn stream_reply_errors_come_out() {
        let mut body = envelope::encode(0, b"{}");
        body.extend(envelope::encode(
            envelope::FLAG_END_STREAM,
            br#"{"error":{"code":"not_found","message":"process 7 not found"}}"#,
        ));
        assert!(matches!(
            stream_reply_error("StreamInput", &body),
            Err(ClientError::Rpc { code, .. }) if code == "not_found"
        ));
        let mut ok = envelope::encode(0, b"{}");
        ok.extend(envelope::encode(envelope::FLAG_END_STREAM, b"{}"));
        assert!(stream_reply_error("StreamInput", &ok).is_ok());
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
            Some((Output::Stderr, b"b".to_vec()))
        );
    }
}
