//! A Rust client of the Sandcell daemon (`sandcell serve`): its E2B-compatible control API
//! and, through the same port, the envd (agent) API of a sandbox.
//!
//! Plain HTTP/1.1 over TCP, one connection per request (the daemon is local or behind a
//! TLS-terminating proxy; no TLS here). Response bodies of envd calls stream
//! ([`Client::envd`]); control API answers are small and read whole, bounded.

mod computer;
mod envd;
mod models;

pub use computer::{Point, ScreenSize, ScreenshotOptions, Window};
pub use envd::{Download, Envd, InputStream, Output, ProcessStream, decode_data};
pub use models::*;
/// envd's port in every sandbox.
pub use sandcell_envd_client::ENVD_PORT;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use sandcell_envd_client::{Connector, TcpConnector, exchange};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest control-API answer read.
const MAX_API_BODY: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid daemon URL {url:?}: {problem}")]
    Url { url: String, problem: String },
    #[error("connecting to the daemon at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP with the daemon at {addr}: {source}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
    #[error("reading the daemon's answer: {0}")]
    Body(String),
    /// The daemon answered with an error (`{"code","message"}`).
    #[error("{status}: {message}")]
    Api { status: StatusCode, message: String },
    #[error("unexpected answer to {what}: {problem}")]
    Decode { what: String, problem: String },
    /// The sandbox's envd (through the proxy) answered with an error status: a Connect
    /// code (`not_found`) or envd's REST one (`404`).
    #[error("{what}: {status}: {message}")]
    Envd {
        what: String,
        status: StatusCode,
        code: String,
        message: String,
    },
    /// A Connect stream ended with an error.
    #[error("{what}: {code}: {message}")]
    Rpc {
        what: String,
        code: String,
        message: String,
    },
}

impl ClientError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } | ClientError::Envd { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A raw answer, body read whole.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

#[derive(Debug, Clone)]
pub struct Client {
    /// `host:port`
    addr: String,
    api_key: Option<String>,
}

impl Client {
    /// `url` is `http://host:port` (a trailing `/` is fine).
    pub fn new(url: &str, api_key: Option<String>) -> Result<Client, ClientError> {
        let bad = |problem: &str| ClientError::Url {
            url: url.to_string(),
            problem: problem.to_string(),
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// is supported"))?;
        let addr = rest.trim_end_matches('/');
        if addr.is_empty() || addr.contains('/') {
            return Err(bad("expected http://host:port"));
        }
        Ok(Client {
            addr: addr.to_string(),
            api_key,
        })
    }

    pub fn with_api_key(&self, api_key: Option<String>) -> Client {
        Client {
            addr: self.addr.clone(),
            api_key,
        }
    }

    /// Sends `req` (its Host is set here) and returns the answer, body still streaming.
    pub async fn send<B>(&self, mut req: Request<B>) -> Result<Response<Incoming>, ClientError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // Within `sandcell_envd_client::TCP_CONNECT_TIMEOUT`: a host that drops packets
        // would otherwise hold us for the kernel's minutes of SYN retries.
        let stream = TcpConnector(self.addr.clone())
            .connect()
            .await
            .map_err(|source| ClientError::Connect {
                addr: self.addr.clone(),
                source,
            })?;
        if !req.headers().contains_key(HOST)
            && let Ok(host) = HeaderValue::from_str(&self.addr)
        {
            req.headers_mut().insert(HOST, host);
        }
        exchange(stream, req)
            .await
            .map_err(|source| ClientError::Http {
                addr: self.addr.clone(),
                source,
            })
    }

    /// A control-API request with the API key; the answer read whole.
    pub async fn api(
        &self,
        method: Method,
        path: &str,
        json: Option<&serde_json::Value>,
    ) -> Result<RawResponse, ClientError> {
        let mut builder = Request::builder().method(method).uri(path);
        if let Some(key) = &self.api_key {
            builder = builder.header("X-API-KEY", key);
        }
        let body = match json {
            Some(v) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(v).map_err(|e| ClientError::Decode {
                    what: path.to_string(),
                    problem: e.to_string(),
                })?)
            }
            None => Bytes::new(),
        };
        let req = builder
            .header(CONTENT_LENGTH, body.len())
            .body(Full::new(body))
            .map_err(|e| ClientError::Url {
                url: path.to_string(),
                problem: e.to_string(),
            })?;
        read_whole(self.send(req).await?).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        json: Option<&serde_json::Value>,
    ) -> Result<T, ClientError> {
        let resp = checked(self.api(method, path, json).await?)?;
        serde_json::from_slice(&resp.body).map_err(|e| ClientError::Decode {
            what: path.to_string(),
            problem: e.to_string(),
        })
    }

    async fn call_no_content(
        &self,
        method: Method,
        path: &str,
        json: Option<&serde_json::Value>,
    ) -> Result<(), ClientError> {
        checked(self.api(method, path, json).await?).map(|_| ())
    }

    pub async fn health(&self) -> Result<Health, ClientError> {
        self.call(Method::GET, "/health", None).await
    }

    pub async fn create_sandbox(&self, req: &NewSandbox) -> Result<Sandbox, ClientError> {
        self.call(Method::POST, "/v2/sandboxes", Some(&to_json(req)?))
            .await
    }

    /// All running sandboxes of the key (`GET /v2/sandboxes`, every page).
    pub async fn list_sandboxes(&self) -> Result<Vec<ListedSandbox>, ClientError> {
        self.list_sandboxes_where(&ListFilter::default()).await
    }

    /// The key's sandboxes matching `filter` (`GET /v2/sandboxes`, every page).
    pub async fn list_sandboxes_where(
        &self,
        filter: &ListFilter,
    ) -> Result<Vec<ListedSandbox>, ClientError> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        let query = filter.query();
        loop {
            let mut params: Vec<String> = query.clone();
            if let Some(t) = &token {
                params.push(format!("nextToken={}", form_encode(t)));
            }
            let path = if params.is_empty() {
                "/v2/sandboxes".to_string()
            } else {
                format!("/v2/sandboxes?{}", params.join("&"))
            };
            let resp = checked(self.api(Method::GET, &path, None).await?)?;
            let page: Vec<ListedSandbox> =
                serde_json::from_slice(&resp.body).map_err(|e| ClientError::Decode {
                    what: path.clone(),
                    problem: e.to_string(),
                })?;
            all.extend(page);
            token = resp
                .headers
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if token.is_none() {
                return Ok(all);
            }
        }
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxDetail, ClientError> {
        self.call(Method::GET, &format!("/sandboxes/{id}"), None)
            .await
    }

    pub async fn kill_sandbox(&self, id: &str) -> Result<(), ClientError> {
        self.call_no_content(Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await
    }

    pub async fn set_timeout(&self, id: &str, seconds: u64) -> Result<(), ClientError> {
        let body = serde_json::json!({ "timeout": seconds });
        self.call_no_content(
            Method::POST,
            &format!("/sandboxes/{id}/timeout"),
            Some(&body),
        )
        .await
    }

    pub async fn list_templates(&self) -> Result<Vec<Template>, ClientError> {
        self.call(Method::GET, "/templates", None).await
    }

    /// A request to the envd API of sandbox `sandbox` (through the daemon's proxy, routed by
    /// the `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers); the answer streams.
    pub async fn envd(
        &self,
        sandbox: &Sandbox,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, ClientError> {
        let (mut parts, body) = req.into_parts();
        let set = |parts: &mut hyper::http::request::Parts, name: &'static str, value: &str| {
            if let Ok(v) = HeaderValue::from_str(value) {
                parts.headers.insert(name, v);
            }
        };
        set(&mut parts, "e2b-sandbox-id", &sandbox.sandbox_id);
        set(&mut parts, "e2b-sandbox-port", &ENVD_PORT.to_string());
        if let Some(token) = &sandbox.envd_access_token {
            set(&mut parts, "x-access-token", token);
        }
        self.send(Request::from_parts(parts, body)).await
    }
}

/// Which sandboxes [`Client::list_sandboxes_where`] lists.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Every pair must be in the sandbox's metadata.
    pub metadata: std::collections::BTreeMap<String, String>,
    /// `running`, `paused`; empty: the daemon's default (running).
    pub states: Vec<String>,
}

impl ListFilter {
    /// Query parameters, as the E2B SDKs encode them: `metadata` is itself a URL-encoded
    /// `k=v&k2=v2` query; `state` is comma-separated.
    fn query(&self) -> Vec<String> {
        let mut params = Vec::new();
        if !self.metadata.is_empty() {
            let inner: Vec<String> = self
                .metadata
                .iter()
                .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
                .collect();
            params.push(format!("metadata={}", form_encode(&inner.join("&"))));
        }
        if !self.states.is_empty() {
            params.push(format!("state={}", form_encode(&self.states.join(","))));
        }
        params
    }
}

/// Percent-encodes all but unreserved characters (a query component).
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn to_json<T: Serialize>(v: &T) -> Result<serde_json::Value, ClientError> {
    serde_json::to_value(v).map_err(|e| ClientError::Decode {
        what: "request body".into(),
        problem: e.to_string(),
    })
}

/// Reads a whole (bounded) answer.
pub async fn read_whole(resp: Response<Incoming>) -> Result<RawResponse, ClientError> {
    let (parts, body) = resp.into_parts();
    let body = Limited::new(body, MAX_API_BODY)
        .collect()
        .await
        .map_err(|e| ClientError::Body(e.to_string()))?
        .to_bytes();
    Ok(RawResponse {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// Turns an error status into [`ClientError::Api`] with the daemon's message.
pub fn checked(resp: RawResponse) -> Result<RawResponse, ClientError> {
    if resp.status.is_success() {
        return Ok(resp);
    }
    let message = serde_json::from_slice::<ErrorBody>(&resp.body)
        .map(|e| e.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(&resp.body).into_owned());
    Err(ClientError::Api {
        status: resp.status,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_http_host_port() {
        assert!(Client::new("http://127.0.0.1:3000/", None).is_ok());
        assert!(Client::new("https://x:1", None).is_err());
        assert!(Client::new("http://x:1/api", None).is_err());
        assert!(Client::new("http://", None).is_err());
    }

    #[test]
    fn list_filters_encode_like_the_sdks() {
        let mut f = ListFilter::default();
        f.metadata.insert("a b".into(), "c&d".into());
        f.metadata.insert("k".into(), "v".into());
        f.states = vec!["running".into(), "paused".into()];
        assert_eq!(
            f.query(),
            vec![
                "metadata=a%2520b%3Dc%2526d%26k%3Dv".to_string(),
                "state=running%2Cpaused".to_string()
            ]
        );
        assert!(ListFilter::default().query().is_empty());
    }
}
