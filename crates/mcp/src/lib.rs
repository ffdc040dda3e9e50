//! Sandcell as an MCP server: an agent drives sandboxes through tools (create, exec, files,
//! fork, snapshots, egress rules), over stdio (`sandcell mcp`, spawned by desktop clients
//! and agent frameworks) or the daemon's streamable HTTP `/mcp` ([`http`]).
//!
//! Every tool is a call to the daemon's REST API and, through its envd proxy, to a
//! sandbox's agent, made with `sandcell-client` as the CLI makes them. Nothing here reaches
//! a runtime or the database: the daemon's own routes do every owner check, so an MCP
//! caller can do exactly what its API key can do over REST, no more. The stdio server has
//! one key (the CLI's); the HTTP one uses the key of each request ([`Keys::PerRequest`]).
//!
//! Tools are listed and dispatched by hand ([`tools`]) rather than with rmcp's macros: the
//! arguments are parsed here, so a malformed call is a tool result with `isError` and a
//! message saying what to fix, never a protocol error a model cannot read.

mod computer;
mod error;
mod exec;
mod files;
pub mod http;
mod resources;
mod sandboxes;
mod tools;

pub use error::ToolError;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use sandcell_client::Client;

/// What the server tells a client about itself at `initialize`.
const INSTRUCTIONS: &str = "Sandcell runs isolated Linux sandboxes (microVMs or gVisor). \
Create one with sandbox_create (template `base` unless told otherwise), run shell commands \
in it with exec, move files with file_read/file_write, and kill it with sandbox_kill when \
done (sandboxes also die at their timeout, 300 s by default: extend it with \
sandbox_set_timeout). Every tool but sandbox_create and sandbox_list takes the sandbox_id \
that sandbox_create returned.";

/// Where the API key of a call comes from.
#[derive(Debug, Clone)]
pub enum Keys {
    /// The client's own (stdio: the CLI's key).
    Fixed,
    /// The `X-API-KEY` or `Authorization: Bearer` header of the HTTP request that carried
    /// the call (the daemon's `/mcp`).
    PerRequest,
}

/// The MCP server: one per stdio process, one per HTTP session.
#[derive(Debug, Clone)]
pub struct Sandcell {
    /// The daemon's REST API (for [`Keys::PerRequest`], without a key).
    client: Client,
    keys: Keys,
    /// The daemon's URL as a model should be told it (port_url without a domain).
    public_url: String,
    /// Commands running in `exec` calls (shared by the clones).
    running: exec::Running,
}

impl Sandcell {
    /// A server calling the daemon at `public_url` with `client` (its key included).
    pub fn new(client: Client, public_url: impl Into<String>) -> Sandcell {
        Sandcell {
            client,
            keys: Keys::Fixed,
            public_url: public_url.into(),
            running: exec::Running::default(),
        }
    }

    /// A server whose calls carry the key of the HTTP request they came in.
    pub fn per_request(client: Client, public_url: impl Into<String>) -> Sandcell {
        Sandcell {
            client: client.with_api_key(None),
            keys: Keys::PerRequest,
            public_url: public_url.into(),
            running: exec::Running::default(),
        }
    }

    /// The client for one call: ours, or ours with the caller's key.
    fn client_for(&self, ctx: &RequestContext<RoleServer>) -> Result<Client, ToolError> {
        match self.keys {
            Keys::Fixed => Ok(self.client.clone()),
            Keys::PerRequest => {
                let key = ctx
                    .extensions
                    .get::<::http::request::Parts>()
                    .and_then(|parts| http::api_key(&parts.headers))
                    .ok_or(ToolError::NoKey)?;
                Ok(self.client.with_api_key(Some(key)))
            }
        }
    }
}

impl Sandcell {
    /// [`Sandcell::client_for`] for resource requests, whose errors are protocol errors.
    fn resource_client(&self, ctx: &RequestContext<RoleServer>) -> Result<Client, ErrorData> {
        self.client_for(ctx)
            .map_err(|e| ErrorData::invalid_request(e.to_string(), None))
    }
}

impl ServerHandler for Sandcell {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("sandcell", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::all()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        tools::call(self, request, context).await.map(Into::into)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        resources::list(&self.resource_client(&context)?).await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(resources::templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let client = self.resource_client(&context)?;
        resources::read(&client, &request.uri).await.map(Into::into)
    }
}

/// Serves MCP on stdin/stdout until the client closes it. Logs go to stderr (stdout is
/// the protocol's).
///
/// A client that goes away mid-`exec` (stdin closed, no cancel sent) ends the session with
/// the command still running; rmcp then cancels the call, and the process must stay up
/// until that call has killed the command: it waits for every `exec` to end, bounded.
pub async fn serve_stdio(server: Sandcell) -> Result<(), std::io::Error> {
    let running = server.running.clone();
    let session = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| std::io::Error::other(format!("MCP handshake on stdio: {e}")))?;
    let ended = session
        .waiting()
        .await
        .map_err(|e| std::io::Error::other(format!("MCP session on stdio: {e}")));
    running.wait_idle().await;
    ended.map(drop)
}
