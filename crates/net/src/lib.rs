//! Sandbox networks on the host: a network namespace and veth per sandbox, NAT out of the
//! host, an egress policy enforced by nftables on the host (E2B's `allow_internet_access`,
//! `allowOut`, `denyOut`), our own DNS server as the sandbox's only resolver, and a log of
//! denied attempts.
//!
//! ```text
//!  netns sc-<id>                         host namespace
//!  ┌──────────────────────┐              ┌────────────────────────────────────────────┐
//!  │ scg<n> 10.200.x.2/30 ├──── veth ────┤ sch<n> 10.200.x.1/30  (gateway, DNS :53)    │
//!  │ default via x.1      │              │ table inet sandcell_<n>: policy, NAT, log  │
//!  └──────────────────────┘              └──────────────── uplink (masquerade) ───────┘
//! ```
//!
//! The gvisor runtime starts `runsc --network=sandbox` inside `sc-<id>` (gVisor's netstack
//! takes over `scg<n>`); the microvm runtime will put a TAP in the same namespace.
//! See [`policy`] for the rules' semantics, [`nft`] for where they are enforced and why,
//! [`dns`] for the resolver.
//!
//! Not done yet (see the crate's README section in the report): the SNI/Host-checking
//! proxy (so domain rules open the addresses DNS returned, on every port), private
//! networks, ports by URL, a warm pool of prepared networks, IPv6 (dropped).

pub mod cmd;
pub mod dns;
mod error;
pub mod network;
pub mod nft;
pub mod policy;
pub mod testing;

pub use error::{Error, Result};
pub use network::{NetConfig, Network, reconcile};
pub use nft::DeniedFlow;
pub use policy::{Cidr, EgressSpec, Policy};

use dns::{DeniedName, DnsServer, DnsState};
use std::sync::Arc;

/// A sandbox's network with its DNS server running: what a runtime holds for a sandbox.
pub struct SandboxNet {
    net: Network,
    state: Arc<DnsState>,
    dns: Option<DnsServer>,
}

/// What was refused for a sandbox.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DeniedLog {
    /// Refused TCP/UDP destinations (last hour, by the kernel).
    pub flows: Vec<DeniedFlow>,
    /// Refused packets in all, any protocol.
    pub packets: u64,
    /// Names our DNS server refused to resolve (the latest 256).
    pub names: Vec<DeniedName>,
}

async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::io(what.to_string(), std::io::Error::other(e)))?
}

impl SandboxNet {
    /// Builds the network of sandbox `id` (see [`Network::create`]) and starts its DNS
    /// server. Must run inside a tokio runtime (the server's tasks live there).
    pub async fn create(cfg: &NetConfig, id: &str, spec: &EgressSpec) -> Result<SandboxNet> {
        let policy = Policy::from_spec(spec)?;
        let (c, i, p) = (cfg.clone(), id.to_string(), policy.clone());
        let net = blocking("creating a sandbox network", move || {
            Network::create(&c, &i, &p)
        })
        .await?;
        let state = Arc::new(DnsState::new(
            net.slot,
            net.pool,
            cfg.upstream_dns.clone(),
            policy,
        ));
        match DnsServer::start(net.gateway, state.clone()).await {
            Ok(dns) => Ok(SandboxNet {
                net,
                state,
                dns: Some(dns),
            }),
            Err(e) => {
                let n = net.clone();
                let _ = blocking("removing a sandbox network", move || n.teardown()).await;
                Err(Error::io(
                    format!("starting the DNS server on {}:53", net.gateway),
                    e,
                ))
            }
        }
    }

    pub fn network(&self) -> &Network {
        &self.net
    }

    /// Replaces the policy live (one nftables transaction); DNS answers learned for names
    /// still allowed stay allowed.
    pub async fn set_policy(&self, spec: &EgressSpec) -> Result<()> {
        let policy = Policy::from_spec(spec)?;
        let mut inner = self.state.inner.lock().await;
        let keep = inner.still_allowed(&policy);
        let (net, p) = (self.net.clone(), policy.clone());
        blocking("replacing a sandbox's egress policy", move || {
            net.set_policy(&p, &keep)
        })
        .await?;
        inner
            .learned
            .retain(|_, (name, _)| policy.domain_allowed(name));
        inner.policy = policy;
        Ok(())
    }

    pub async fn denied(&self) -> Result<DeniedLog> {
        let slot = self.net.slot;
        let (flows, packets) = blocking("reading denied flows", move || nft::denied(slot)).await?;
        Ok(DeniedLog {
            flows,
            packets,
            names: self.state.denied_names(),
        })
    }

    /// Stops the DNS server and removes everything of the network.
    pub async fn teardown(mut self) -> Result<()> {
        self.dns.take();
        let net = self.net.clone();
        blocking("removing a sandbox network", move || net.teardown()).await
    }
}
