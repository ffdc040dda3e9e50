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
//! IPv6: each network also has a unique-local /64 (`fd5c:5c5c:<slot>::/64`, host end `::1`,
//! sandbox `::2`, masqueraded out of the host's uplink), under the same rules with IPv6
//! CIDRs (policy.rs). Domain rules open IPv4 only (the Host/SNI proxy, [`hostcheck`]).

mod accept;
pub mod cmd;
pub mod conntrack;
pub mod dns;
mod error;
pub mod h2relay;
pub mod hostcheck;
pub mod inject;
pub mod intercept;
pub mod network;
pub mod nft;
pub mod nftlib;
pub mod policy;
pub mod pool;
mod registry;
pub mod reserved;
pub mod rules;
pub mod socks5;
pub mod testing;
pub mod tls_ca;
pub mod tunnel;

pub use error::{Error, Result};
pub use network::{NetConfig, Network, reconcile};
pub use nft::DeniedFlow;
pub use policy::{Cidr, EgressSpec, Policy};
pub use pool::NetPool;
pub use registry::NetRegistry;
pub use reserved::{AllowPrivate, Destinations};

use dns::{DeniedName, DnsServer, DnsState};
use sandcell_proto::sync::lock;
use std::sync::Arc;

/// A sandbox's network with its DNS server running: what a runtime holds for a sandbox.
/// Clones share the network (its owner's [`NetRegistry`] keeps one); the first
/// [`SandboxNet::teardown`] removes it for all.
#[derive(Clone)]
pub struct SandboxNet {
    net: Network,
    /// The registry it is recorded in, if any (its teardown removes the entry).
    registry: registry::Owner,
    /// The rules in force, as given (what an owner records to put them back after a
    /// restart).
    spec: Arc<std::sync::Mutex<EgressSpec>>,
    state: Arc<DnsState>,
    dns: Arc<std::sync::Mutex<Option<DnsServer>>>,
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
    /// Headers filled from secrets (the latest 256; names and versions, never values).
    pub injections: Vec<dns::Injection>,
}

async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::io(what.to_string(), std::io::Error::other(e)))?
}

/// What a policy change does to the egress proxy ([`SandboxNet::replace_policy`]).
pub(crate) enum TunnelChange {
    /// The proxy in force stays (`PUT` of rules only).
    Keep,
    /// This proxy, or none, from now on.
    Set(Option<Arc<tunnel::Tunnel>>),
}

impl SandboxNet {
    /// Builds the network of sandbox `id` (see [`Network::create`]) and starts its DNS
    /// server. Must run inside a tokio runtime (the server's tasks live there).
    pub async fn create(cfg: &NetConfig, id: &str, spec: &EgressSpec) -> Result<SandboxNet> {
        let policy = Policy::from_spec(spec)?;
        cfg.destinations()
            .check_spec(spec, &reserved::host_addresses())?;
        let (c, i, p) = (cfg.clone(), id.to_string(), policy.clone());
        let net = blocking("creating a sandbox network", move || {
            Network::create(&c, &i, &p)
        })
        .await?;
        match SandboxNet::serve(cfg, net.clone(), spec, policy).await {
            Ok(sn) => Ok(sn),
            Err(e) => {
                let _ = blocking("removing a sandbox network", move || net.teardown()).await;
                Err(e)
            }
        }
    }

    /// Takes over network `id` left by a dead owner (see [`Network::find`]) with `spec` as
    /// its policy (put in force again) and a new DNS server; `None` if it is gone.
    pub async fn adopt(cfg: &NetConfig, id: &str, spec: &EgressSpec) -> Result<Option<SandboxNet>> {
        let policy = Policy::from_spec(spec)?;
        let (c, i) = (cfg.clone(), id.to_string());
        let Some(net) =
            blocking("finding a sandbox network", move || Network::find(&c, &i)).await?
        else {
            return Ok(None);
        };
        let (n, p) = (net.clone(), policy.clone());
        blocking("restoring a sandbox's egress policy", move || {
            n.set_policy(&p, &[])
        })
        .await?;
        SandboxNet::serve(cfg, net, spec, policy).await.map(Some)
    }

    /// Starts the DNS server of `net`.
    async fn serve(
        cfg: &NetConfig,
        net: Network,
        spec: &EgressSpec,
        policy: Policy,
    ) -> Result<SandboxNet> {
        let state = Arc::new(DnsState::new(
            net.id.clone(),
            net.slot,
            cfg.destinations(),
            cfg.upstream_dns.clone(),
            policy,
        ));
        let dns = DnsServer::start(net.gateway, state.clone())
            .await
            .map_err(|e| Error::io(format!("starting the DNS server on {}:53", net.gateway), e))?;
        Ok(SandboxNet {
            net,
            registry: None,
            spec: Arc::new(std::sync::Mutex::new(spec.clone())),
            state,
            dns: Arc::new(std::sync::Mutex::new(Some(dns))),
        })
    }

    /// Replaces the private-network peers of this sandbox: (name, guest address) of every
    /// sandbox it shares a private network with. They become reachable by address (both
    /// ways only once each lists the other) and their names resolve in our DNS server.
    pub async fn set_peers(&self, peers: &[(String, std::net::Ipv4Addr)]) -> Result<()> {
        let ips: Vec<std::net::Ipv4Addr> = peers.iter().map(|(_, ip)| *ip).collect();
        let script = nft::peers_script(self.net.slot, &ips);
        blocking("replacing a sandbox's private-network peers", move || {
            nft::apply(&script)
        })
        .await?;
        let mut map = lock(&self.state.peers);
        *map = peers
            .iter()
            .map(|(n, ip)| (n.to_ascii_lowercase(), *ip))
            .collect();
        Ok(())
    }

    pub fn network(&self) -> &Network {
        &self.net
    }

    /// Replaces the policy live (one nftables transaction); DNS answers learned for names
    /// still allowed stay allowed. Entries that would open what sandboxes never reach are
    /// refused ([`Destinations::check_spec`]). Connections the new policy no longer allows
    /// are cut (their conntrack entries flushed, see [`conntrack`]).
    /// The egress proxy in force stays ([`SandboxNet::set_egress`] changes it).
    pub async fn set_policy(&self, spec: &EgressSpec) -> Result<()> {
        self.replace_policy(spec, TunnelChange::Keep).await
    }

    /// [`SandboxNet::set_policy`], with the egress proxy kept or replaced as `tunnel` says.
    async fn replace_policy(&self, spec: &EgressSpec, tunnel: TunnelChange) -> Result<()> {
        let mut policy = Policy::from_spec(spec)?;
        self.state
            .dest
            .check_spec(spec, &reserved::host_addresses())?;
        let mut inner = self.state.inner.lock().await;
        // Under the same lock as the change: a concurrent `set_egress` cannot slip its proxy
        // in between and be undone here.
        policy.tunnel = match tunnel {
            TunnelChange::Keep => inner.policy.tunnel.clone(),
            TunnelChange::Set(t) => t,
        };
        let keep = inner.still_allowed(&policy);
        let new_tunnel = inner.policy.tunnel != policy.tunnel;
        // Nothing to cut when the old rules let nothing out (a pooled network given its
        // sandbox's rules): skips reading the host's whole conntrack table on the create path.
        let had_nothing = inner.policy.allows_nothing();
        let (net, p, k) = (self.net.clone(), policy.clone(), keep.clone());
        blocking("replacing a sandbox's egress policy", move || {
            net.set_policy(&p, &k)
        })
        .await?;
        inner
            .learned
            .retain(|_, (name, _)| policy.domain_allowed(name));
        inner.policy = policy.clone();
        *lock(&self.spec) = spec.clone();
        drop(inner);
        // The proxy's connections re-check themselves (hostcheck.rs).
        self.state.policy_changed.send_modify(|g| *g += 1);
        // After the new rules are in force (a flushed connection's next packet meets them):
        // cut what they no longer allow.
        if !had_nothing {
            self.cut_connections(&policy, &keep, new_tunnel).await;
        }
        Ok(())
    }

    /// Deletes the conntrack entries of this sandbox's connections to what `policy` no
    /// longer allows (conntrack.rs), all of them but the gateway's and the peers' when
    /// the egress proxy changed (`new_tunnel`). Kept: the gateway (its chain decides there),
    /// private-network peers, addresses still allowed by a DNS answer (`learned`).
    async fn cut_connections(
        &self,
        policy: &Policy,
        learned: &[(std::net::Ipv4Addr, std::time::Duration)],
        new_tunnel: bool,
    ) {
        let peers: Vec<std::net::Ipv4Addr> = lock(&self.state.peers).values().copied().collect();
        let learned: Vec<std::net::Ipv4Addr> = learned.iter().map(|(ip, _)| *ip).collect();
        let (net, policy) = (self.net.clone(), policy.clone());
        // A new egress proxy (or none after one): every connection out went another way
        // than the new setting's (direct, or through the previous proxy: their conntrack
        // entries name the original destination), so all go.
        let cut_all = new_tunnel;
        let keep = move |ip: std::net::IpAddr| match ip {
            std::net::IpAddr::V4(ip) => {
                ip == net.gateway
                    || peers.contains(&ip)
                    || (!cut_all && (learned.contains(&ip) || policy.ip_allowed(ip, &net.pool)))
            }
            std::net::IpAddr::V6(ip) => {
                ip == net.gateway6() || (!cut_all && policy.ip6_allowed(ip))
            }
        };
        let (g4, g6) = (self.net.guest, self.net.guest6());
        let result = blocking(
            "cutting connections the new egress rules refuse",
            move || {
                let a = conntrack::flush(g4.into(), &keep)?;
                Ok(a + conntrack::flush(g6.into(), &keep)?)
            },
        )
        .await;
        match result {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                "network {}: cut the connections to {n} destination(s) the new egress rules refuse",
                self.net.id
            ),
            Err(e) => tracing::warn!(
                "network {}: open connections to now-refused destinations stay open: {e}",
                self.net.id
            ),
        }
    }

    /// The rules in force, as last given.
    pub fn egress(&self) -> EgressSpec {
        lock(&self.spec).clone()
    }

    pub async fn denied(&self) -> Result<DeniedLog> {
        let slot = self.net.slot;
        let (flows, packets) = blocking("reading denied flows", move || nft::denied(slot)).await?;
        Ok(DeniedLog {
            flows,
            packets,
            names: self.state.denied_names(),
            injections: self.state.injections(),
        })
    }

    /// Stops the DNS server and removes everything of the network.
    pub async fn teardown(self) -> Result<()> {
        lock(&self.dns).take();
        if let Some(registry) = self.registry.as_ref().and_then(std::sync::Weak::upgrade) {
            registry.forget_net(&self.net.id);
        }
        let net = self.net.clone();
        blocking("removing a sandbox network", move || net.teardown()).await
    }
}
