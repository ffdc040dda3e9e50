//! The streamable HTTP side: the tower service the daemon mounts at `/mcp`, the hosts it
//! accepts, and the caller's API key.
//!
//! Each call's tools run with the key of the HTTP request that carried it, against the
//! daemon's own REST API on loopback ([`Sandcell::per_request`]): the owner checks are the
//! REST routes' (one place), so a session sees exactly its key's sandboxes. The daemon
//! refuses requests without a valid key before they get here (crates/server http/mcp.rs);
//! a session started with one key and continued with another acts as the second key.
//!
//! rmcp's DNS-rebinding guard stays on: the `Host` of a request must be a loopback name,
//! the daemon's listen address, or its `--domain` (and subdomains are not: sandbox hosts
//! `<port>-<id>.<domain>` never reach this route, the envd proxy takes them first).

use crate::Sandcell;
use http::HeaderMap;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use sandcell_client::Client;
use std::net::SocketAddr;
use std::sync::Arc;

/// The `/mcp` service: `api` is the daemon's REST API on loopback (no key), `public_url`
/// what port_url tells a model when there is no domain, `allowed_hosts` from
/// [`allowed_hosts`].
pub fn service(
    api: Client,
    public_url: String,
    allowed_hosts: Vec<String>,
) -> StreamableHttpService<Sandcell, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(allowed_hosts);
    let server = Sandcell::per_request(api, public_url);
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// The hosts `/mcp` answers: loopback names (any port), the listen address when it is a
/// specific one, and the public domain.
pub fn allowed_hosts(listen: SocketAddr, domain: Option<&str>) -> Vec<String> {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .iter()
        .map(|h| h.to_string())
        .collect();
    if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
        hosts.push(listen.ip().to_string());
    }
    if let Some(domain) = domain.map(str::trim).filter(|d| !d.is_empty()) {
        hosts.push(domain.to_ascii_lowercase());
    }
    hosts
}

/// Where the daemon's own API is reached from inside it: the listen address, or loopback
/// when it listens on every address.
pub fn loopback_of(listen: SocketAddr) -> SocketAddr {
    let mut addr = listen;
    if listen.ip().is_unspecified() {
        addr.set_ip(match listen {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

/// The API key of a request (the REST API's rule: [`sandcell_proto::auth::api_key`]).
pub fn api_key(headers: &HeaderMap) -> Option<String> {
    sandcell_proto::auth::api_key(|name| headers.get(name).and_then(|v| v.to_str().ok()))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_either_header() {
        let mut h = HeaderMap::new();
        assert_eq!(api_key(&h), None);
        h.insert("authorization", "Bearer e2b_abc".parse().unwrap());
        assert_eq!(api_key(&h).as_deref(), Some("e2b_abc"));
        h.insert("x-api-key", "e2b_def".parse().unwrap());
        assert_eq!(api_key(&h).as_deref(), Some("e2b_def"));
        let mut basic = HeaderMap::new();
        basic.insert("authorization", "Basic dXNlcjo=".parse().unwrap());
        assert_eq!(api_key(&basic), None);
    }

    #[test]
    fn hosts_are_loopback_the_listen_address_and_the_domain() {
        let any: SocketAddr = "0.0.0.0:3000".parse().unwrap();
        assert_eq!(allowed_hosts(any, None), ["localhost", "127.0.0.1", "::1"]);
        let lan: SocketAddr = "10.1.2.3:3000".parse().unwrap();
        let hosts = allowed_hosts(lan, Some("Sandbox.Example.com"));
        assert!(hosts.contains(&"10.1.2.3".to_string()));
        assert!(hosts.contains(&"sandbox.example.com".to_string()));
        assert_eq!(
            loopback_of(any),
            "127.0.0.1:3000".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(loopback_of(lan), lan);
    }
}
