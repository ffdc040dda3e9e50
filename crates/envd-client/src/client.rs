//! [`EnvdClient`]: requests, error answers and the small calls (`/health`, `/init`, ours).
//! Processes are in [`crate::process`], files in [`crate::files`].
//!
//! One HTTP/1.1 connection per call, opened by the [`Connector`], so concurrent calls never
//! queue behind a long Start stream. The other end is untrusted: every reply is read with a
//! size cap. Time limits are the caller's (wrap calls in `tokio::time::timeout`).

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::{Body, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use sandcell_proto::agent::{self as wire, InitRequest};

use crate::connect::{Connector, TcpConnector, UnixConnector, exchange};
use crate::error::{ClientError, error_of_reply};

/// Default cap on one Start-stream envelope.
pub const MAX_ENVELOPE: usize = 4 * 1024 * 1024;
/// Default cap on error bodies and unary replies from an agent.
pub const MAX_SMALL_REPLY: usize = 64 * 1024;
/// The cap on error bodies and unary replies through the daemon's proxy.
pub const MAX_PROXIED_REPLY: usize = 256 * 1024;
/// envd's port in every sandbox: what the daemon's proxy is asked to reach.
pub const ENVD_PORT: u16 = 49983;
/// The `Host` of requests straight to an agent (HTTP/1.1 requires one; the agent ignores it).
const AGENT_HOST: &str = "sandcell-agent";

/// The envd API of one sandbox, reached through `C`, as one user.
#[derive(Debug)]
pub struct EnvdClient<C> {
    connector: Arc<C>,
    host: String,
    /// Sent with every request: the proxy's routing headers, the access token.
    headers: Vec<(&'static str, String)>,
    user: Option<String>,
    pub(crate) max_envelope: usize,
    pub(crate) max_reply: usize,
}

impl<C> Clone for EnvdClient<C> {
    fn clone(&self) -> Self {
        EnvdClient {
            connector: self.connector.clone(),
            host: self.host.clone(),
            headers: self.headers.clone(),
            user: self.user.clone(),
            max_envelope: self.max_envelope,
            max_reply: self.max_reply,
        }
    }
}

impl EnvdClient<UnixConnector> {
    /// An agent listening on the Unix socket `path`.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        EnvdClient::new(UnixConnector(path.into()))
    }
}

impl EnvdClient<TcpConnector> {
    /// Sandbox `sandbox_id`'s envd through the daemon at `addr` (`host:port`), whose proxy
    /// routes by the `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers; `access_token` when
    /// the sandbox is `secure`.
    pub fn via_proxy(addr: &str, sandbox_id: &str, access_token: Option<String>) -> Self {
        EnvdClient::new(TcpConnector(addr.to_owned()))
            .with_host(addr)
            .with_header("e2b-sandbox-id", sandbox_id)
            .with_header("e2b-sandbox-port", &ENVD_PORT.to_string())
            .with_access_token(access_token)
            .with_max_reply(MAX_PROXIED_REPLY)
    }
}

impl<C> EnvdClient<C> {
    pub fn new(connector: C) -> Self {
        EnvdClient {
            connector: Arc::new(connector),
            host: AGENT_HOST.to_owned(),
            headers: Vec::new(),
            user: None,
            max_envelope: MAX_ENVELOPE,
            max_reply: MAX_SMALL_REPLY,
        }
    }

    /// The `Host` of every request (default `sandcell-agent`).
    pub fn with_host(mut self, host: &str) -> Self {
        self.host = host.to_owned();
        self
    }

    /// A header every request carries.
    pub fn with_header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    /// The access token `/init` set (`X-Access-Token`), if any.
    pub fn with_access_token(self, token: Option<String>) -> Self {
        match token {
            Some(token) => self.with_header(wire::ACCESS_TOKEN_HEADER, &token),
            None => self,
        }
    }

    /// Calls made as `user` (`root`, `user`, ...); without one the sandbox's default user.
    pub fn as_user(mut self, user: Option<String>) -> Self {
        self.user = user;
        self
    }

    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// Caps one Start-stream envelope (default [`MAX_ENVELOPE`]).
    pub fn with_max_envelope(mut self, max: usize) -> Self {
        self.max_envelope = max;
        self
    }

    /// Caps error bodies and unary replies (default [`MAX_SMALL_REPLY`]).
    pub fn with_max_reply(mut self, max: usize) -> Self {
        self.max_reply = max;
        self
    }

    /// A request with this client's host, headers and user.
    pub(crate) fn request<B>(
        &self,
        method: Method,
        uri: &str,
        content_type: Option<&'static str>,
        body: B,
    ) -> Result<Request<B>, ClientError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(HOST, &self.host);
        for (name, value) in &self.headers {
            builder = builder.header(*name, value);
        }
        if let Some(ct) = content_type {
            builder = builder.header(CONTENT_TYPE, ct);
        }
        // envd names the user of an RPC in Basic auth with an empty password.
        if let Some(user) = &self.user {
            builder = builder.header(
                AUTHORIZATION,
                format!("Basic {}", BASE64.encode(format!("{user}:"))),
            );
        }
        builder.body(body).map_err(|e| ClientError::Request {
            uri: uri.to_owned(),
            reason: e.to_string(),
        })
    }
}

impl<C: Connector> EnvdClient<C> {
    /// Sends `req` on a fresh connection; an error status becomes [`ClientError::Status`].
    pub(crate) async fn call<B>(
        &self,
        what: &str,
        req: Request<B>,
    ) -> Result<Response<Incoming>, ClientError>
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
        let resp = exchange(io, req)
            .await
            .map_err(|source| ClientError::Http {
                what: what.to_owned(),
                source,
            })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let body = read_capped(what, resp.into_body(), self.max_reply)
            .await
            .unwrap_or_default();
        Err(error_of_reply(what, status, &body))
    }

    /// A unary JSON call; its answer, read whole.
    pub(crate) async fn unary<T: serde::Serialize>(
        &self,
        what: &str,
        path: &str,
        message: &T,
    ) -> Result<Bytes, ClientError> {
        let json = serde_json::to_vec(message).map_err(|e| ClientError::protocol(what, e))?;
        let req = self.request(
            Method::POST,
            path,
            Some("application/json"),
            Full::new(Bytes::from(json)),
        )?;
        let resp = self.call(what, req).await?;
        read_capped(what, resp.into_body(), self.max_reply).await
    }

    /// A call without a body whose answer is only its status.
    async fn bare(&self, what: &str, method: Method, path: &str) -> Result<(), ClientError> {
        let req = self.request(method, path, None, Empty::<Bytes>::new())?;
        self.call(what, req).await.map(drop)
    }

    pub async fn health(&self) -> Result<(), ClientError> {
        self.bare("health", Method::GET, wire::HEALTH_PATH).await
    }

    /// `POST /init` with `init` (the runtime's own fields: a restored microVM's
    /// `sandcellNet`; the daemon sends the rest itself).
    pub async fn init(&self, init: &InitRequest) -> Result<(), ClientError> {
        let body = serde_json::to_vec(init).map_err(|e| ClientError::protocol("init", e))?;
        let req = self.request(
            Method::POST,
            wire::INIT_PATH,
            Some("application/json"),
            Full::new(Bytes::from(body)),
        )?;
        self.call("init", req).await.map(drop)
    }

    /// Asks the agent to power the sandbox off (or, not being PID 1, to exit).
    pub async fn poweroff(&self) -> Result<(), ClientError> {
        self.bare("poweroff", Method::POST, wire::POWEROFF_PATH)
            .await
    }

    /// Asks the agent to close its listener and every connection until the runtime writes
    /// the resume marker ([`wire::CHECKPOINT_HOLD_PATH`]); the answer comes before it does.
    pub async fn checkpoint_hold(&self) -> Result<(), ClientError> {
        self.bare("checkpoint hold", Method::POST, wire::CHECKPOINT_HOLD_PATH)
            .await
    }
}

/// A whole body, refusing more than `max` bytes.
pub(crate) async fn read_capped(
    what: &str,
    body: Incoming,
    max: usize,
) -> Result<Bytes, ClientError> {
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ClientError::TooLarge {
            what: what.to_owned(),
            max,
        }),
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(source) => Err(ClientError::Body {
                what: what.to_owned(),
                source: *source,
            }),
            Err(e) => Err(ClientError::protocol(what, e)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a, B>(req: &'a Request<B>, name: &str) -> Option<&'a str> {
        req.headers().get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn proxied_requests_carry_the_route_token_and_user() {
        let envd = EnvdClient::via_proxy("127.0.0.1:3000", "sb-1", Some("tok".into()))
            .as_user(Some("user".into()));
        let req = envd
            .request(Method::GET, "/health", None, Empty::<Bytes>::new())
            .expect("request");
        assert_eq!(header(&req, "host"), Some("127.0.0.1:3000"));
        assert_eq!(header(&req, "e2b-sandbox-id"), Some("sb-1"));
        assert_eq!(header(&req, "e2b-sandbox-port"), Some("49983"));
        assert_eq!(header(&req, "x-access-token"), Some("tok"));
        // base64("user:")
        assert_eq!(header(&req, "authorization"), Some("Basic dXNlcjo="));
    }

    #[test]
    fn agent_requests_carry_only_a_host() {
        let req = EnvdClient::unix("/nonexistent.sock")
            .request(
                Method::POST,
                "/init",
                Some("application/json"),
                Empty::<Bytes>::new(),
            )
            .expect("request");
        let names: Vec<&str> = req.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["host", "content-type"]);
        assert_eq!(header(&req, "host"), Some("sandcell-agent"));
    }

    #[test]
    fn a_bad_header_value_fails_the_request_not_the_process() {
        let envd = EnvdClient::via_proxy("127.0.0.1:3000", "bad\nid", None);
        let err = envd
            .request(Method::GET, "/health", None, Empty::<Bytes>::new())
            .expect_err("a newline in a header");
        assert!(matches!(err, ClientError::Request { .. }), "{err}");
    }
}
