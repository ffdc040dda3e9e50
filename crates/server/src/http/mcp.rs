//! `/mcp`: the MCP server (crates/mcp) over streamable HTTP on the API listener.
//!
//! A request needs a valid API key (`X-API-KEY` or `Authorization: Bearer`, checked by the
//! same [`Caller`] extractor as every REST route) before rmcp sees it. The tools then call
//! this daemon's REST API on loopback with that key, so what an MCP session may see and do
//! is decided by the REST routes' owner checks alone, not by a second copy of them here;
//! the cost is one loopback HTTP request per daemon call, small next to a sandbox's work.
//!
//! A session belongs to the key that opened it ([`Sessions`]): a request naming another
//! key's session (`Mcp-Session-Id`) is answered 404 as if there were none, so a leaked
//! session id gives another key neither the session's stream nor a way to end it.

use crate::App;
use crate::http::error::ApiError;
use crate::http::extract::Caller;
use axum::Router;
use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sandcell_client::Client;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// rmcp's session header.
const SESSION_HEADER: &str = "mcp-session-id";
/// Sessions whose owner is remembered; past this the oldest is forgotten (then rmcp's
/// own answer for it stands: a session it still has is reachable by any valid key).
const MAX_SESSIONS: usize = 10_000;

/// Where the MCP service finds the daemon, and the hosts it answers.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// The daemon's REST API as reached from inside it (loopback when it listens on all).
    pub api: SocketAddr,
    /// The daemon's URL as clients know it (for port_url without a domain).
    pub public_url: String,
    /// `Host` values accepted (rmcp's DNS-rebinding guard).
    pub allowed_hosts: Vec<String>,
}

impl McpConfig {
    /// For a daemon listening on `listen` with public domain `domain`.
    pub fn new(listen: SocketAddr, domain: Option<&str>) -> McpConfig {
        McpConfig {
            api: sandcell_mcp::http::loopback_of(listen),
            public_url: format!("http://{listen}"),
            allowed_hosts: sandcell_mcp::http::allowed_hosts(listen, domain),
        }
    }
}

/// The `/mcp` route, when the daemon has an MCP config.
pub fn routes(app: &Arc<App>) -> Option<Router<Arc<App>>> {
    let config = app.config.mcp.as_ref()?;
    let api = match Client::new(&format!("http://{}", config.api), None) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!("MCP is off: the daemon's own address {}: {e}", config.api);
            return None;
        }
    };
    let service =
        sandcell_mcp::http::service(api, config.public_url.clone(), config.allowed_hosts.clone());
    let sessions = Arc::new(Sessions::default());
    Some(
        Router::new()
            .route_service("/mcp", service)
            .layer(axum::middleware::from_fn_with_state(
                app.clone(),
                move |caller: Caller, req: Request, next: Next| {
                    let sessions = sessions.clone();
                    async move { sessions.admit(caller, req, next).await }
                },
            )),
    )
}

/// The most of a refused request's body read so that its connection can carry the next one.
const DRAIN_LIMIT: usize = 1 << 20;
/// How long a refused request's body may take to arrive.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `resp` for a request refused before its body was read. hyper closes a connection whose
/// request body was left unread, after the response and without saying so: a client that
/// pipelines its next request on it (httpx does) gets "server disconnected". So the body is
/// read first (bounded in size and time), and when it cannot be, the response says
/// `Connection: close`.
async fn answer_after_draining(req: Request, mut resp: Response) -> Response {
    let drained = tokio::time::timeout(
        DRAIN_TIMEOUT,
        axum::body::to_bytes(req.into_body(), DRAIN_LIMIT),
    )
    .await;
    if !matches!(drained, Ok(Ok(_))) {
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    resp
}

/// The key (id) that opened each MCP session.
#[derive(Debug, Default)]
pub struct Sessions {
    owners: Mutex<HashMap<String, (String, Instant)>>,
}

impl Sessions {
    /// A request with a valid key (the [`Caller`] extractor answered 401 otherwise): on to
    /// rmcp unless it names another key's session; a session rmcp opens is the caller's.
    async fn admit(&self, Caller(key): Caller, req: Request, next: Next) -> Response {
        let session = req
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let ending = req.method() == Method::DELETE;
        if let Some(id) = &session
            && self.owner(id).is_some_and(|owner| owner != key.id)
        {
            let refusal = ApiError::not_found(format!("no MCP session {id} for this API key"));
            return answer_after_draining(req, refusal.into_response()).await;
        }
        let resp = next.run(req).await;
        match (&session, resp.headers().get(SESSION_HEADER)) {
            (None, Some(new)) => {
                if let Ok(new) = new.to_str() {
                    self.insert(new, &key.id);
                }
            }
            (Some(id), _) if ending && resp.status().is_success() => self.forget(id),
            _ => {}
        }
        resp
    }

    fn owner(&self, session: &str) -> Option<String> {
        let owners = sandcell_proto::sync::lock(&self.owners);
        owners.get(session).map(|(key, _)| key.clone())
    }

    fn insert(&self, session: &str, key: &str) {
        let mut owners = sandcell_proto::sync::lock(&self.owners);
        if owners.len() >= MAX_SESSIONS
            && let Some(oldest) = owners
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(id, _)| id.clone())
        {
            owners.remove(&oldest);
        }
        owners.insert(session.to_string(), (key.to_string(), Instant::now()));
    }

    fn forget(&self, session: &str) {
        sandcell_proto::sync::lock(&self.owners).remove(session);
    }
}
