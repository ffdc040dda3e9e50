//! `sandcell mcp`: the MCP server (crates/mcp) on stdin/stdout, for MCP clients that spawn
//! their servers (desktop apps, agent frameworks). It talks to the daemon `daemon.rs`
//! finds (`$SANDCELL_URL`, `$SANDCELL_API_KEY`, the config file, the local admin key) with
//! that one key. stdout carries only the protocol: every message of ours goes to stderr.

use crate::daemon::Target;
use crate::sandboxes::{EXIT_FAILED, fail};

#[derive(clap::Args)]
pub struct McpArgs {}

pub async fn stdio(target: &Target, _args: McpArgs) -> i32 {
    match &target.key_source {
        Some(source) => tracing::info!("MCP on stdio: daemon {} (key from {source})", target.url),
        None => eprintln!(
            "sandcell mcp: no API key found ({}); calls will fail until SANDCELL_API_KEY is set",
            target.no_key_hint
        ),
    }
    let server = sandcell_mcp::Sandcell::new(target.client.clone(), target.url.clone());
    match sandcell_mcp::serve_stdio(server).await {
        Ok(()) => 0,
        Err(e) => fail(&e.to_string(), EXIT_FAILED),
    }
}
