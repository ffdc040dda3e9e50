//! Sandbox networks in the daemon: every sandbox gets its own network (E2B: internet on
//! unless told otherwise) with its egress rules, and may join private networks of its key.
//!
//! Who does what:
//! - `sandcell-net` makes the networks (namespace, veth, nftables, our DNS server) and keeps
//!   them by sandbox id in the daemon's [`NetRegistry`], made in `run()` and shared by
//!   [`Networks`] and the runtimes; the daemon installs a warm pool there
//!   ([`Networks::start_pool`]), so a create takes a prepared network instead of making one.
//! - The runtime asks for the network when it makes the sandbox (`SandboxSpec::network`,
//!   from [`Networks::spec_of`]), also for restores and fork children, removes it with the
//!   sandbox, and hands it out ([`sandcell_runtime::Sandbox::network`]).
//! - This module keeps the database side (migration 4; the SQL is store/networks.rs's):
//!   each sandbox's rules and network id (written before the runtime starts anything, the
//!   id once it exists) and the private networks with their members; it recomputes every
//!   sandbox's private-network peers when a membership or a member changes
//!   ([`Networks::refresh_peers`]).
//!
//! Everything this keeps in memory (settings, registry, peers in force, traffic tokens) is
//! a [`Networks`] value of one daemon: two daemons in one process share none of it.
//!
//! Crash safety: a restarted daemon takes over the networks of the sandboxes it adopts
//! ([`Networks::adopt`]: same nftables state, a new DNS server) and then removes every
//! network of its own (by name prefix, see [`NetSettings::prefix`]) that no adopted sandbox
//! uses ([`Networks::reconcile_host`]), prepared ones included. Networks of other daemons or of
//! `sandcell run` on the same host are left alone.

use crate::error::Error;
use crate::store::Db;
use crate::store::networks::SandboxNetworkRow;
use sandcell_proto::sync::lock;
use sandcell_runtime::NetworkSpec;
use sandcell_runtime::net::{EgressSpec, NetConfig, NetPool, NetRegistry, Policy, SandboxNet};
use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// What is wrong with the network fields of a create (the HTTP layer makes them 4xx).
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error(
        "this server runs sandboxes without networks (sandcell serve --no-network): \
         they cannot join private networks"
    )]
    NetworksOff,
    #[error(transparent)]
    Rules(#[from] sandcell_runtime::net::policy::PolicyError),
    #[error("network.rules: {0}")]
    Transform(#[from] crate::secrets::placeholders::PlaceholderError),
    #[error("private network {0:?} doesn't exist or you don't have access to it")]
    UnknownNetwork(String),
    #[error(
        "network.maskRequestHost must be a host (with `${{PORT}}` for the port), at most \
         {MAX_MASK} visible ASCII characters"
    )]
    BadMask,
    /// A refused `network.egressProxy`.
    #[error(transparent)]
    Proxy(#[from] sandcell_runtime::net::tunnel::ProxyError),
    #[error(transparent)]
    Internal(#[from] Error),
}

/// How this daemon makes networks (`sandcell serve --net-*`).
#[derive(Debug, Clone)]
pub struct NetSettings {
    pub config: NetConfig,
    /// Names of this daemon's networks start with it: derived from the data dir, so that a
    /// restarted daemon recognises its own leftovers and no other daemon's.
    pub prefix: String,
    /// Networks kept prepared ahead of creates.
    pub warm: usize,
    /// The daemon's data dir, recorded per prefix in [`OWNERS_DIR`].
    pub data_dir: std::path::PathBuf,
}

/// `<prefix>` files holding the data dir of the daemon that uses the prefix: a daemon whose
/// data dir is gone (a test's temporary one, say) will never start again to reconcile its
/// networks, so any daemon's [`reconcile_host`] removes them.
const OWNERS_DIR: &str = "/run/sandcell-net-owners";

/// The daemon prefix of network `id`, if it is one ([`prefix_for`]'s shape).
fn daemon_prefix(id: &str) -> Option<&str> {
    let p = id.get(..8)?;
    let b = p.as_bytes();
    (b[0] == b'd' && b[7] == b'x' && b[1..7].iter().all(u8::is_ascii_hexdigit)).then_some(p)
}

/// Whether the daemon that used `prefix` is gone for good (its data dir no longer exists).
fn owner_gone(prefix: &str) -> bool {
    let file = std::path::Path::new(OWNERS_DIR).join(prefix);
    match std::fs::read_to_string(&file) {
        Ok(dir) => !std::path::Path::new(dir.trim()).exists(),
        Err(_) => false,
    }
}

/// Sandbox id to its peers: (peer sandbox id, peer address), sorted.
type PeerMap = HashMap<String, Vec<(String, Ipv4Addr)>>;

/// The daemon's side of its sandboxes' networks (module docs).
pub struct Networks {
    /// `None`: `sandcell serve --no-network`.
    settings: Option<NetSettings>,
    registry: NetRegistry,
    /// The peers last put in force per sandbox: only changes cost an `nft` call.
    peers: Mutex<PeerMap>,
    /// Serializes peer recomputations (each reads the whole membership).
    refresh: tokio::sync::Mutex<()>,
    /// How requests reach the ports of this daemon's sandboxes that have a traffic token
    /// (`allowPublicTraffic: false`) or a Host mask: read on every proxied request, so kept
    /// in memory (and in the database for restarts).
    traffic: Mutex<HashMap<String, PortAccess>>,
    /// Seals the egress proxy passwords (the secrets' ring; `None` in unit tests).
    key_ring: Option<std::sync::Arc<crate::secrets::crypto::KeyRing>>,
}

fn net_error(what: &str) -> impl FnOnce(sandcell_runtime::net::Error) -> Error + '_ {
    move |e| Error::Io {
        what: what.to_string(),
        source: std::io::Error::other(e),
    }
}

/// The network-name prefix of the daemon whose data dir is `data_dir`: `d`, 6 hex digits
/// of its path's SHA-256, `x` (network ids are at most 64 bytes; this leaves plenty).
pub fn prefix_for(data_dir: &std::path::Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(data_dir.as_os_str().as_encoded_bytes());
    let hex: String = digest[..3].iter().map(|b| format!("{b:02x}")).collect();
    format!("d{hex}x")
}

impl Networks {
    /// Networking with `settings` (`None`: no networks), its networks in `registry` (the
    /// one the daemon's runtimes were given).
    pub fn new(settings: Option<NetSettings>, registry: NetRegistry) -> Networks {
        Networks {
            settings,
            registry,
            peers: Mutex::new(PeerMap::new()),
            refresh: tokio::sync::Mutex::new(()),
            traffic: Mutex::new(HashMap::new()),
            key_ring: None,
        }
    }

    /// Egress proxy passwords are sealed with `ring` (the secrets key ring).
    pub fn with_key_ring(
        mut self,
        ring: std::sync::Arc<crate::secrets::crypto::KeyRing>,
    ) -> Networks {
        self.key_ring = Some(ring);
        self
    }

    /// The ring egress proxy passwords are sealed with.
    pub fn key_ring(&self) -> Option<&crate::secrets::crypto::KeyRing> {
        self.key_ring.as_deref()
    }

    pub fn settings(&self) -> Option<&NetSettings> {
        self.settings.as_ref()
    }

    /// Where the daemon's runtimes make their networks.
    pub fn registry(&self) -> &NetRegistry {
        &self.registry
    }

    /// Starts preparing networks ahead (after [`Networks::reconcile_host`], which would
    /// remove them). Forwarding is turned on here once for all.
    pub fn start_pool(&self) -> Result<(), Error> {
        let Some(s) = self.settings() else {
            return Ok(());
        };
        sandcell_runtime::net::network::enable_forwarding()
            .map_err(net_error("turning on IPv4 forwarding"))?;
        self.registry
            .install(NetPool::start(s.config.clone(), &s.prefix, s.warm));
        Ok(())
    }

    /// At daemon stop: removes the prepared networks (those of running sandboxes stay with
    /// them for the next daemon).
    pub async fn shutdown(&self) {
        if let Some(pool) = self.registry.pool() {
            pool.drain().await;
        }
    }

    fn traffic<T>(&self, f: impl FnOnce(&mut HashMap<String, PortAccess>) -> T) -> T {
        f(&mut lock(&self.traffic))
    }

    /// Remembers how `sandbox`'s ports are reached (nothing when all is the default).
    fn remember(&self, sandbox: &str, access: PortAccess) {
        if access.token.is_some() || access.mask_host.is_some() {
            self.traffic(|m| m.insert(sandbox.to_string(), access));
        }
    }

    /// The token requests to sandbox `id`'s ports must carry, if it has one.
    pub fn traffic_token(&self, id: &str) -> Option<String> {
        self.traffic(|m| m.get(id).and_then(|a| a.token.clone()))
    }

    /// Sandbox `id`'s `maskRequestHost` as given (with `${PORT}`), if any.
    pub fn mask_request_host(&self, id: &str) -> Option<String> {
        self.traffic(|m| m.get(id).and_then(|a| a.mask_host.clone()))
    }

    /// The Host header requests to sandbox `id`'s `port` get (`maskRequestHost`), if any.
    pub fn masked_host(&self, id: &str, port: u32) -> Option<String> {
        self.traffic(|m| {
            m.get(id)
                .and_then(|a| a.mask_host.as_deref().map(|mask| mask_host(mask, port)))
        })
    }
}

/// What the proxy applies to a sandbox's port traffic.
#[derive(Debug, Clone, Default)]
struct PortAccess {
    token: Option<String>,
    mask_host: Option<String>,
}

impl PortAccess {
    fn of(row: &SandboxNetworkRow) -> PortAccess {
        PortAccess {
            token: row.traffic_token.clone(),
            mask_host: row.mask_request_host.clone(),
        }
    }
}

/// `maskRequestHost` for `port`: E2B's `${PORT}` replaced by the port.
pub fn mask_host(mask: &str, port: u32) -> String {
    mask.replace("${PORT}", &port.to_string())
}

/// The longest `maskRequestHost` (a host name and a port fit with room).
const MAX_MASK: usize = 300;

/// Whether `mask` makes a Host header for every port: bounded, visible ASCII, no spaces.
pub fn valid_mask(mask: &str) -> bool {
    !mask.is_empty()
        && mask.len() <= MAX_MASK
        && mask.bytes().all(|b| b.is_ascii_graphic())
        && axum::http::HeaderValue::from_str(&mask_host(mask, 65535)).is_ok()
}

/// Private-network names: what `POST /networks` accepts.
pub fn valid_network_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// The network fields of a create, checked.
#[derive(Debug, Clone)]
pub struct NetRequest {
    /// `allowPublicTraffic: false`: the token its ports then require.
    pub traffic_token: Option<String>,
    /// `maskRequestHost`: the Host its ports' requests get (`${PORT}`: the port).
    pub mask_request_host: Option<String>,
    pub egress: EgressSpec,
    /// E2B's `egressProxy`, checked.
    pub egress_proxy: Option<sandcell_runtime::net::tunnel::EgressProxy>,
    /// Private networks to join.
    pub join: Vec<String>,
}

impl Networks {
    /// Checks the network fields of a create for key `key_id`: `None` when this daemon runs
    /// without networks (rules are then moot: the sandbox has no network at all).
    pub async fn check_request(
        &self,
        db: &Db,
        key_id: &str,
        allow_internet_access: Option<bool>,
        network: Option<&crate::networks::api::NetworkConfig>,
        join: Option<&[String]>,
    ) -> Result<Option<NetRequest>, NetworkError> {
        let join = join.unwrap_or_default().to_vec();
        if self.settings().is_none() {
            if !join.is_empty() {
                return Err(NetworkError::NetworksOff);
            }
            return Ok(None);
        }
        let egress = EgressSpec {
            allow_internet_access: allow_internet_access.unwrap_or(true),
            allow_out: network
                .and_then(|n| n.allow_out.clone())
                .unwrap_or_default(),
            deny_out: network.and_then(|n| n.deny_out.clone()).unwrap_or_default(),
            rules: network.and_then(|n| n.rules.clone()).unwrap_or_default(),
        };
        self.check_rules(&egress)?;
        let egress_proxy = network.and_then(|n| n.egress_proxy.clone());
        if let (Some(p), Some(s)) = (&egress_proxy, self.settings()) {
            crate::networks::egress_proxy::check(&s.config.destinations(), p).await?;
        }
        for name in &join {
            if !network_exists(db, key_id, name).await? {
                return Err(NetworkError::UnknownNetwork(name.clone()));
            }
        }
        let traffic_token = match network.and_then(|n| n.allow_public_traffic) {
            Some(false) => Some(
                crate::util::random_hex(20)
                    .map_err(Error::io("getrandom for a traffic access token"))?,
            ),
            _ => None,
        };
        let mask_request_host = network.and_then(|n| n.mask_request_host.clone());
        if let Some(mask) = &mask_request_host
            && !valid_mask(mask)
        {
            return Err(NetworkError::BadMask);
        }
        Ok(Some(NetRequest {
            traffic_token,
            mask_request_host,
            egress,
            egress_proxy,
            join,
        }))
    }
}

impl Networks {
    /// Checks rules entering the API (create, live update): they parse, and open nothing
    /// sandboxes never reach (loopback, link-local with the metadata address, the pool, the
    /// host's addresses; private ranges only as `--allow-private-egress` says: see
    /// `sandcell_net::reserved`).
    pub fn check_rules(&self, egress: &EgressSpec) -> Result<(), NetworkError> {
        Policy::from_spec(egress)?;
        crate::secrets::inject::check_transforms(egress)?;
        if let Some(s) = self.settings() {
            let host = sandcell_runtime::net::reserved::host_addresses();
            s.config.destinations().check_spec(egress, &host)?;
        }
        Ok(())
    }
}

pub(crate) async fn network_exists(db: &Db, key_id: &str, name: &str) -> Result<bool, Error> {
    db.private_network_exists(key_id, name).await
}

impl Networks {
    /// Records the rules and memberships of a new sandbox, before the runtime makes anything.
    pub async fn record(
        &self,
        db: &Db,
        sandbox: &str,
        key_id: &str,
        req: &NetRequest,
    ) -> Result<(), Error> {
        let egress = serde_json::to_string(&req.egress).map_err(|e| Error::Io {
            what: "encoding egress rules".into(),
            source: e.into(),
        })?;
        db.insert_sandbox_network(
            sandbox,
            &egress,
            req.traffic_token.as_deref(),
            req.mask_request_host.as_deref(),
        )
        .await?;
        crate::networks::egress_proxy::record(
            db,
            self.key_ring(),
            sandbox,
            req.egress_proxy.as_ref(),
        )
        .await?;
        self.remember(
            sandbox,
            PortAccess {
                token: req.traffic_token.clone(),
                mask_host: req.mask_request_host.clone(),
            },
        );
        for name in &req.join {
            join(db, key_id, name, sandbox).await?;
        }
        Ok(())
    }
}

pub(crate) async fn join(db: &Db, key_id: &str, name: &str, sandbox: &str) -> Result<(), Error> {
    db.join_private_network(key_id, name, sandbox).await
}

/// A sandbox restored from a checkpoint of `from` (a fork child, or a create from a named
/// snapshot of it) joins the private networks `from` is in (or was in when it ended: see
/// [`ended`]), those of key `key_id` only: its restored processes expect the peers they had.
pub async fn inherit(db: &Db, key_id: &str, from: &str, to: &str) -> Result<(), Error> {
    db.inherit_private_networks(key_id, from, to).await
}

/// The egress rules recorded for `sandbox` (`None`: it has no network).
pub async fn egress_of(db: &Db, sandbox: &str) -> Result<Option<EgressSpec>, Error> {
    let row = db.sandbox_egress(sandbox).await?;
    Ok(row.and_then(|e| serde_json::from_str(&e).ok()))
}

impl Networks {
    /// What the runtime makes the network of `sandbox` from (also what a restore or fork of it
    /// should get): `None` if it has none.
    pub async fn spec_of(&self, db: &Db, sandbox: &str) -> Result<Option<NetworkSpec>, Error> {
        let Some(s) = self.settings() else {
            return Ok(None);
        };
        let Some(egress) = egress_of(db, sandbox).await? else {
            return Ok(None);
        };
        // With an egress proxy: nothing out until `started` puts it in force.
        let egress = crate::networks::egress_proxy::starting_egress(db, sandbox, egress).await?;
        Ok(Some(NetworkSpec {
            egress,
            config: s.config.clone(),
        }))
    }
}

/// Replaces the recorded rules of `sandbox` (after they were put in force).
pub async fn store_egress(db: &Db, sandbox: &str, egress: &EgressSpec) -> Result<(), Error> {
    let text = serde_json::to_string(egress).map_err(|e| Error::Io {
        what: "encoding egress rules".into(),
        source: e.into(),
    })?;
    db.store_sandbox_egress(sandbox, &text).await
}

impl Networks {
    /// Once the runtime made the sandbox (created, restored or forked): records which network
    /// it got (`net`: [`sandcell_runtime::Sandbox::network`]) and brings the peers of its
    /// private networks up to date.
    pub async fn started(
        &self,
        db: &Db,
        sandbox: &str,
        net: Option<SandboxNet>,
    ) -> Result<(), Error> {
        let Some(net) = net else {
            return Ok(());
        };
        // An upsert: restores and fork children get their network from the runtime without a
        // create request, and must be taken over after a restart all the same.
        let egress = serde_json::to_string(&net.egress()).map_err(|e| Error::Io {
            what: "encoding egress rules".into(),
            source: e.into(),
        })?;
        db.record_sandbox_net_id(sandbox, &net.network().id, &egress)
            .await?;
        crate::networks::egress_proxy::restore(db, self.key_ring(), sandbox, &net).await?;
        // A resume (same id) gets its token back: [`Networks::ended`] forgot it at the
        // pause, and without it the resumed sandbox's ports would open to anyone.
        if let Some(row) = db.sandbox_network(sandbox).await? {
            self.remember(sandbox, PortAccess::of(&row));
        }
        self.refresh_peers(db).await
    }

    /// A restore or fork child `to` of `from` (which has its rules recorded): its ports are as
    /// private as `from`'s, behind a token of its own (in its create or fork answer; `from`'s
    /// token opens nothing of it), with the same Host mask.
    pub async fn inherit_port_access(&self, db: &Db, from: &str, to: &str) -> Result<(), Error> {
        let Some(source) = db.sandbox_network(from).await? else {
            return Ok(());
        };
        let token = match source.traffic_token {
            Some(_) => Some(
                crate::util::random_hex(20)
                    .map_err(Error::io("getrandom for a traffic access token"))?,
            ),
            None => None,
        };
        if token.is_none() && source.mask_request_host.is_none() {
            return Ok(());
        }
        db.set_sandbox_port_access(to, token.as_deref(), source.mask_request_host.as_deref())
            .await?;
        self.remember(
            to,
            PortAccess {
                token,
                mask_host: source.mask_request_host,
            },
        );
        Ok(())
    }

    /// The traffic token recorded for `sandbox` (running or not: a paused one's ports want
    /// it too before a request may wake it, http/wake.rs).
    pub async fn recorded_traffic_token(
        &self,
        db: &Db,
        sandbox: &str,
    ) -> Result<Option<String>, Error> {
        Ok(db
            .sandbox_network(sandbox)
            .await?
            .and_then(|row| row.traffic_token))
    }
}

impl Networks {
    /// After the sandbox ended or was paused: its network is gone, so the other members of its
    /// private networks stop reaching its address (which the next sandbox may get: only
    /// sandboxes with a network are peers, see [`Networks::refresh_peers`]). Its memberships stay on
    /// record: a resume (same id) is back in its networks, and sandboxes restored from its
    /// snapshots or forks join them too ([`inherit`]).
    pub async fn ended(&self, db: &Db, sandbox: &str) {
        self.traffic(|m| m.remove(sandbox));
        if let Err(e) = self.registry.release(sandbox).await {
            tracing::warn!("removing the network of {sandbox}: {e}");
        }
        if let Err(e) = self.refresh_peers(db).await {
            tracing::warn!("updating private-network peers: {e}");
        }
    }
}

impl Networks {
    /// At start: takes over the network of adopted sandbox `sandbox`.
    pub async fn adopt(&self, db: &Db, sandbox: &str) -> Result<(), Error> {
        let Some(s) = self.settings() else {
            return Ok(());
        };
        let Some(row) = db.sandbox_network(sandbox).await? else {
            return Ok(());
        };
        let Some(net_id) = row.net_id.clone() else {
            return Ok(());
        };
        self.remember(sandbox, PortAccess::of(&row));
        let egress = row.egress;
        let egress: EgressSpec = serde_json::from_str(&egress).unwrap_or_default();
        let egress = crate::networks::egress_proxy::starting_egress(db, sandbox, egress).await?;
        match self
            .registry
            .adopt(&s.config, sandbox, &net_id, &egress)
            .await
        {
            Ok(Some(net)) => {
                crate::networks::egress_proxy::restore(db, self.key_ring(), sandbox, &net).await
            }
            Ok(None) => {
                tracing::warn!("the network {net_id} of sandbox {sandbox} is gone");
                Ok(())
            }
            Err(e) => Err(net_error("taking over a sandbox network")(e)),
        }
    }
}

impl Networks {
    /// At start, after adoption: removes this daemon's networks no sandbox uses any more.
    pub async fn reconcile_host(&self) -> Result<Vec<String>, Error> {
        let Some(s) = self.settings() else {
            return Ok(Vec::new());
        };
        let prefix = s.prefix.clone();
        let registry = self.registry.clone();
        let record = std::fs::create_dir_all(OWNERS_DIR).and_then(|()| {
            std::fs::write(
                std::path::Path::new(OWNERS_DIR).join(&prefix),
                s.data_dir.as_os_str().as_encoded_bytes(),
            )
        });
        if let Err(e) = record {
            tracing::warn!("recording this daemon's network prefix in {OWNERS_DIR}: {e}");
        }
        tokio::task::spawn_blocking(move || {
            sandcell_runtime::net::reconcile(&|id| {
                if id.starts_with(&prefix) {
                    return registry.get_by_net(id).is_some();
                }
                !daemon_prefix(id).is_some_and(owner_gone)
            })
        })
        .await
        .map_err(|e| Error::Io {
            what: "reconciling sandbox networks".into(),
            source: std::io::Error::other(e),
        })?
        .map_err(net_error("reconciling sandbox networks"))
        .inspect(|_| forget_gone_owners())
    }
}

/// Removes the owner records of daemons whose data dir is gone (their networks were just
/// removed by the reconcile).
fn forget_gone_owners() {
    let Ok(dir) = std::fs::read_dir(OWNERS_DIR) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        if name.to_str().is_some_and(owner_gone) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Networks {
    /// Recomputes every sandbox's private-network peers from the memberships and puts the
    /// changed ones in force (both ends of a pair list each other: see sandcell-net's nft.rs).
    pub async fn refresh_peers(&self, db: &Db) -> Result<(), Error> {
        let _one = self.refresh.lock().await;
        let rows = db.all_private_network_members().await?;
        let mut by_network: BTreeMap<(String, String), Vec<(String, Ipv4Addr)>> = BTreeMap::new();
        for (key, name, sandbox) in rows {
            if let Some(net) = self.registry.get(&sandbox) {
                by_network
                    .entry((key, name))
                    .or_default()
                    .push((sandbox, net.network().guest));
            }
        }
        let mut want = PeerMap::new();
        for members in by_network.values() {
            for (me, _) in members {
                let peers = want.entry(me.clone()).or_default();
                peers.extend(members.iter().filter(|(p, _)| p != me).cloned());
            }
        }
        for peers in want.values_mut() {
            peers.sort();
            peers.dedup();
        }
        let old = std::mem::take(&mut *lock(&self.peers));
        let mut now = HashMap::new();
        let mut first: Option<Error> = None;
        let everyone: std::collections::BTreeSet<&String> = old.keys().chain(want.keys()).collect();
        for sandbox in everyone {
            let new = want.get(sandbox).cloned().unwrap_or_default();
            let Some(net) = self.registry.get(sandbox) else {
                continue;
            };
            if old.get(sandbox) != Some(&new)
                && let Err(e) = net.set_peers(&new).await
            {
                first.get_or_insert(net_error("setting private-network peers")(e));
                continue;
            }
            if !new.is_empty() {
                now.insert(sandbox.clone(), new);
            }
        }
        *lock(&self.peers) = now;
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings(pool: &str, data_dir: &std::path::Path) -> NetSettings {
        NetSettings {
            config: NetConfig {
                pool: pool.parse().unwrap(),
                upstream_dns: Vec::new(),
                allow_private: Default::default(),
            },
            prefix: prefix_for(data_dir),
            warm: 0,
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// Two daemons in one process (as two test servers would be): each sees its own
    /// network settings, registry, pool and traffic tokens, nothing of the other's.
    #[tokio::test]
    async fn two_daemons_in_one_process_share_no_network_state() {
        let (dir_a, dir_b, dir_c) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let db_a = crate::keys::open_db(dir_a.path()).await.unwrap();
        let db_b = crate::keys::open_db(dir_b.path()).await.unwrap();
        let db_c = crate::keys::open_db(dir_c.path()).await.unwrap();
        let a = Networks::new(
            Some(settings("10.211.0.0/16", dir_a.path())),
            NetRegistry::new(),
        );
        let b = Networks::new(
            Some(settings("10.212.0.0/16", dir_b.path())),
            NetRegistry::new(),
        );
        let off = Networks::new(None, NetRegistry::new());
        // Settings: each its own pool and prefix; the third has no networks at all.
        let pool = |n: &Networks| n.settings().map(|s| s.config.pool);
        assert_eq!(pool(&a), Some("10.211.0.0/16".parse().unwrap()));
        assert_eq!(pool(&b), Some("10.212.0.0/16".parse().unwrap()));
        assert_ne!(a.settings().unwrap().prefix, b.settings().unwrap().prefix);
        assert!(off.settings().is_none());
        let join = ["team".to_string()];
        assert!(matches!(
            off.check_request(&db_c, "key_1", None, None, Some(&join))
                .await,
            Err(NetworkError::NetworksOff)
        ));
        assert!(
            off.check_request(&db_c, "key_1", None, None, None)
                .await
                .unwrap()
                .is_none()
        );
        // A pool installed in one daemon's registry is not the other's.
        let a_pool = NetPool::start(a.settings().unwrap().config.clone(), "ta", 0);
        assert!(a.registry().install(a_pool));
        assert!(b.registry().pool().is_none());
        // The same sandbox id in both: rules, network spec and traffic token stay apart.
        for db in [&db_a, &db_b] {
            db.insert_test_sandbox("sc-1").await.unwrap();
        }
        let private = crate::networks::api::NetworkConfig {
            allow_public_traffic: Some(false),
            ..Default::default()
        };
        let req_a = a
            .check_request(&db_a, "key_1", Some(false), Some(&private), None)
            .await
            .unwrap()
            .unwrap();
        a.record(&db_a, "sc-1", "key_1", &req_a).await.unwrap();
        let req_b = b
            .check_request(&db_b, "key_1", None, None, None)
            .await
            .unwrap()
            .unwrap();
        b.record(&db_b, "sc-1", "key_1", &req_b).await.unwrap();
        assert!(a.traffic_token("sc-1").is_some());
        assert_eq!(a.traffic_token("sc-1"), req_a.traffic_token);
        assert_eq!(b.traffic_token("sc-1"), None);
        let spec_a = a.spec_of(&db_a, "sc-1").await.unwrap().unwrap();
        let spec_b = b.spec_of(&db_b, "sc-1").await.unwrap().unwrap();
        assert_eq!(spec_a.config.pool, "10.211.0.0/16".parse().unwrap());
        assert!(!spec_a.egress.allow_internet_access);
        assert_eq!(spec_b.config.pool, "10.212.0.0/16".parse().unwrap());
        assert!(spec_b.egress.allow_internet_access);
        assert!(off.spec_of(&db_a, "sc-1").await.unwrap().is_none());
        // One daemon's sandbox ending does not touch the other's token.
        b.ended(&db_b, "sc-1").await;
        assert_eq!(a.traffic_token("sc-1"), req_a.traffic_token);
        for db in [db_a, db_b, db_c] {
            db.close().await;
        }
    }

    #[test]
    fn host_masks_take_the_port_and_refuse_what_is_no_header() {
        assert_eq!(mask_host("localhost:${PORT}", 8000), "localhost:8000");
        assert_eq!(mask_host("app.internal", 8000), "app.internal");
        assert!(valid_mask("localhost:${PORT}"));
        for bad in [
            "",
            "a b",
            "x\r\nInjected: 1",
            "h\u{e9}",
            &"a".repeat(MAX_MASK + 1),
        ] {
            assert!(!valid_mask(bad), "{bad:?}");
        }
    }
}
