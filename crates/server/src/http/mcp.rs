//! `/mcp`: the MCP server (crates/mcp) over streamable HTTP on the API listener.
//!
//! A request needs a valid API key (`X-API-KEY` or `Authorization: Bearer`, checked by the
//! same [`Caller`] extractor as every REST route) before rmcp sees it. The tools then call
//! this daemon's REST API on loopback with that key, so what an MCP session may see and do
//! is decided by the REST routes' owner checks alone, not by a second copy of them here;
//! the cost is one loopback HTTP request per daemon call, small next to a sandbox's work.

use crate::App;
use crate::http::extract::Caller;
use axum::Router;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use sandcell_client::Client;
use std::net::SocketAddr;
use std::sync::Arc;

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
    Some(
        Router::new()
            .route_service("/mcp", service)
            .layer(axum::middleware::from_fn_with_state(
                app.clone(),
                require_key,
            )),
    )
}

/// Refuses a request without a valid key (401 in E2B's error shape) before rmcp reads it.
async fn require_key(_caller: Caller, req: Request, next: Next) -> Response {
    next.run(req).await
}
