//! Our DNS server for one sandbox, on the host end of its veth (UDP and TCP port 53): the
//! only resolver the sandbox can reach (nft.rs refuses port 53/853 anywhere else).
//!
//! A query is answered only if the policy resolves its name ([`Policy::resolves`]); other
//! names get NXDOMAIN without any packet leaving the host, so a sandbox cannot tunnel data
//! through DNS to a domain outside its rules. Allowed queries are forwarded unchanged (new
//! id) to the host's upstream resolvers; when a domain rule matched, the answer's A
//! addresses go into the sandbox's `dns_allow` set for their TTL (clamped to
//! [`MIN_TTL`]..[`MAX_TTL`]) BEFORE the answer is sent, so the connection that follows is
//! never refused. Addresses in reserved ranges are not learned (DNS rebinding), and answers
//! naming what sandboxes never reach (reserved.rs: loopback, link-local, the pool, the
//! host, private ranges the operator did not open) are dropped from the reply (REFUSED when
//! nothing is left, or for AAAA).

pub mod wire;

use crate::accept::{self, Backoff};
use crate::nft;
use crate::policy::{Cidr, Policy, is_reserved};
use crate::reserved::{self, Destinations};
use sandcell_proto::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Mutex, Semaphore};
use tokio::task::JoinHandle;
use wire::{RCODE_FORMERR, RCODE_NOTIMP, RCODE_NXDOMAIN, RCODE_REFUSED, RCODE_SERVFAIL};

pub const MIN_TTL: Duration = Duration::from_secs(30);
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
const TCP_IDLE: Duration = Duration::from_secs(10);
const MAX_IN_FLIGHT: usize = 64;
const MAX_DENIED_NAMES: usize = 256;
const UDP_BUF: usize = 4096;
/// Peers' addresses change only when they leave: a short TTL keeps stale answers short.
const PEER_TTL: u32 = 5;

/// One header the egress proxy filled from a secret (the audit record: never the value).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Injection {
    pub domain: String,
    pub header: String,
    pub secret: String,
    pub version: i64,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

/// A name the DNS server refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeniedName {
    pub name: String,
    pub qtype: u16,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

pub(crate) struct Inner {
    pub(crate) policy: Policy,
    /// Learned addresses: the name that brought them and until when.
    pub(crate) learned: HashMap<Ipv4Addr, (String, Instant)>,
}

impl Inner {
    /// Learned addresses still valid under `policy`, with their time left.
    pub(crate) fn still_allowed(&self, policy: &Policy) -> Vec<(Ipv4Addr, Duration)> {
        let now = Instant::now();
        self.learned
            .iter()
            .filter(|(_, (name, until))| *until > now && policy.domain_allowed(name))
            .map(|(ip, (_, until))| (*ip, *until - now))
            .collect()
    }
}

/// What the DNS tasks share with [`crate::SandboxNet`].
pub(crate) struct DnsState {
    pub(crate) slot: u32,
    pub(crate) pool: Cidr,
    /// What names may never lead to (reserved.rs): such answers are dropped here and never
    /// connected to by the proxy.
    pub(crate) dest: Destinations,
    pub(crate) upstream: Vec<SocketAddr>,
    /// Serializes learning with policy changes: a policy change and the addresses learned
    /// under it never interleave.
    pub(crate) inner: Mutex<Inner>,
    pub(crate) denied: std::sync::Mutex<VecDeque<DeniedName>>,
    /// The latest injections (audit, [`MAX_DENIED_NAMES`] of them).
    pub(crate) injections: std::sync::Mutex<VecDeque<Injection>>,
    /// The network's id (what the secrets resolver maps to the sandbox and its owner).
    pub(crate) net_id: String,
    /// Private-network peers by name (their sandbox id): answered here, never forwarded.
    pub(crate) peers: std::sync::Mutex<HashMap<String, Ipv4Addr>>,
    /// Bumped after every policy change: the proxy's open connections re-check their name.
    pub(crate) policy_changed: tokio::sync::watch::Sender<u64>,
}

impl DnsState {
    pub(crate) fn new(
        net_id: String,
        slot: u32,
        dest: Destinations,
        upstream: Vec<SocketAddr>,
        policy: Policy,
    ) -> Self {
        DnsState {
            slot,
            pool: dest.pool,
            dest,
            upstream,
            inner: Mutex::new(Inner {
                policy,
                learned: HashMap::new(),
            }),
            denied: std::sync::Mutex::new(VecDeque::new()),
            injections: std::sync::Mutex::new(VecDeque::new()),
            net_id,
            peers: std::sync::Mutex::new(HashMap::new()),
            policy_changed: tokio::sync::watch::Sender::new(0),
        }
    }

    pub(crate) fn note_denied(&self, name: &str, qtype: u16) {
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut d = lock(&self.denied);
        if d.len() >= MAX_DENIED_NAMES {
            d.pop_front();
        }
        d.push_back(DeniedName {
            name: name.to_string(),
            qtype,
            at,
        });
    }

    pub(crate) fn note_injection(&self, domain: &str, header: &str, secret: &str, version: i64) {
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        tracing::info!(
            network = %self.net_id, domain, header, secret, version,
            "egress proxy: injected a secret into a request"
        );
        let mut d = lock(&self.injections);
        if d.len() >= MAX_DENIED_NAMES {
            d.pop_front();
        }
        d.push_back(Injection {
            domain: domain.to_string(),
            header: header.to_string(),
            secret: secret.to_string(),
            version,
            at,
        });
    }

    pub(crate) fn injections(&self) -> Vec<Injection> {
        lock(&self.injections).iter().cloned().collect()
    }

    fn peer(&self, name: &str) -> Option<Ipv4Addr> {
        let peers = lock(&self.peers);
        peers.get(name.trim_end_matches('.')).copied()
    }

    pub(crate) fn denied_names(&self) -> Vec<DeniedName> {
        let d = lock(&self.denied);
        d.iter().cloned().collect()
    }
}

/// The server's tasks; dropping it stops them.
pub struct DnsServer {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl DnsServer {
    /// Binds UDP and TCP port 53 on `addr` (the host end of the sandbox's veth).
    pub(crate) async fn start(addr: Ipv4Addr, state: Arc<DnsState>) -> std::io::Result<Self> {
        let at = SocketAddr::from((addr, 53));
        let udp = Arc::new(UdpSocket::bind(at).await?);
        let tcp = TcpListener::bind(at).await?;
        let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let udp_task = tokio::spawn(serve_udp(udp, state.clone(), limit.clone()));
        let tcp_task = tokio::spawn(serve_tcp(tcp, state.clone(), limit));
        let mut tasks = vec![udp_task, tcp_task];
        // The Host/SNI proxy lives and dies with the DNS server (same state, same address).
        match crate::hostcheck::start(addr, state).await {
            Ok(more) => tasks.extend(more),
            Err(e) => {
                tasks.iter().for_each(JoinHandle::abort);
                return Err(e);
            }
        }
        Ok(DnsServer { tasks })
    }
}

async fn serve_udp(sock: Arc<UdpSocket>, state: Arc<DnsState>, limit: Arc<Semaphore>) {
    let mut buf = vec![0u8; UDP_BUF];
    let mut backoff = Backoff::new();
    loop {
        // Not accept::retry: the closure would have to lend `buf` to the future it returns.
        let (n, from) = match sock.recv_from(&mut buf).await {
            Ok(received) => {
                backoff.succeeded();
                received
            }
            Err(_) => {
                tokio::time::sleep(backoff.failed()).await;
                continue;
            }
        };
        // Over the limit: drop the query, the client retries.
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue;
        };
        let msg = buf[..n].to_vec();
        let (sock, state) = (sock.clone(), state.clone());
        tokio::spawn(async move {
            if let Some(reply) = handle(&state, &msg, false).await {
                let _ = sock.send_to(&reply, from).await;
            }
            drop(permit);
        });
    }
}

async fn serve_tcp(listener: TcpListener, state: Arc<DnsState>, limit: Arc<Semaphore>) {
    let mut backoff = Backoff::new();
    loop {
        let (conn, _) = accept::retry(&mut backoff, || listener.accept()).await;
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _ = serve_tcp_conn(conn, &state).await;
            drop(permit);
        });
    }
}

async fn serve_tcp_conn(mut conn: TcpStream, state: &DnsState) -> std::io::Result<()> {
    loop {
        let Ok(Ok(len)) = tokio::time::timeout(TCP_IDLE, conn.read_u16()).await else {
            return Ok(());
        };
        let mut msg = vec![0u8; usize::from(len)];
        tokio::time::timeout(TCP_IDLE, conn.read_exact(&mut msg))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let Some(reply) = handle(state, &msg, true).await else {
            return Ok(());
        };
        let len = u16::try_from(reply.len()).map_err(|_| std::io::ErrorKind::InvalidData)?;
        conn.write_u16(len).await?;
        conn.write_all(&reply).await?;
    }
}

/// The reply to one message from the sandbox (`None`: no reply at all).
pub(crate) async fn handle(state: &DnsState, msg: &[u8], tcp: bool) -> Option<Vec<u8>> {
    let query = match wire::parse_query(msg) {
        Ok(q) => q,
        Err(_) => return wire::error_reply(msg, RCODE_FORMERR),
    };
    if query.opcode != 0 {
        return wire::error_reply(msg, RCODE_NOTIMP);
    }
    if query.question.qclass != wire::CLASS_IN {
        return wire::error_reply(msg, RCODE_REFUSED);
    }
    let name = &query.question.name;
    if let Some(ip) = state.peer(name) {
        return match query.question.qtype {
            wire::TYPE_A => wire::a_reply(msg, &[ip], PEER_TTL),
            // The name exists, with no record of that type (e.g. AAAA).
            _ => wire::error_reply(msg, 0),
        };
    }
    {
        let inner = state.inner.lock().await;
        if !inner.policy.resolves(name) {
            drop(inner);
            state.note_denied(name, query.question.qtype);
            return wire::error_reply(msg, RCODE_NXDOMAIN);
        }
        // Under a default-deny policy a name resolves because a domain rule allows it, and
        // domain rules open IPv4 only (through the Host/SNI proxy): no AAAA records, so
        // clients go to the IPv4 addresses (the name exists: NOERROR with no answer).
        if query.question.qtype == wire::TYPE_AAAA && inner.policy.default_deny() {
            return wire::error_reply(msg, 0);
        }
    }
    let Some(mut reply) = forward(&state.upstream, msg, tcp).await else {
        return wire::error_reply(msg, RCODE_SERVFAIL);
    };
    let Ok(answer) = wire::parse_answer(&reply) else {
        return wire::error_reply(msg, RCODE_SERVFAIL);
    };
    if answer.question != query.question {
        return wire::error_reply(msg, RCODE_SERVFAIL);
    }
    // Answers pointing at what sandboxes never reach (loopback, metadata, the pool, the
    // host...: reserved.rs) are dropped, whatever the rules: a name must not lead there.
    let host = reserved::host_addresses();
    let refused = |ip: std::net::IpAddr| state.dest.refusal(ip, &host).is_some();
    let good: Vec<(Ipv4Addr, u32)> = answer
        .addresses
        .iter()
        .copied()
        .filter(|(ip, _)| !refused((*ip).into()))
        .collect();
    let dropped = good.len() < answer.addresses.len()
        || answer
            .addresses6
            .iter()
            .any(|(ip, _)| refused((*ip).into()));
    if learn(state, name, &good).await.is_err() {
        return wire::error_reply(msg, RCODE_SERVFAIL);
    }
    if dropped {
        state.note_denied(name, query.question.qtype);
        if query.question.qtype != wire::TYPE_A || good.is_empty() {
            return wire::error_reply(msg, RCODE_REFUSED);
        }
        let ttl = good.iter().map(|(_, t)| *t).min().unwrap_or(0);
        let ips: Vec<Ipv4Addr> = good.iter().map(|(ip, _)| *ip).collect();
        let mut out = wire::a_reply(msg, &ips, ttl)?;
        // Not our authority: a_reply's AA bit off again.
        out[2] &= !0x04;
        return Some(out);
    }
    reply[..2].copy_from_slice(&query.id.to_be_bytes());
    Some(reply)
}

/// Puts `addresses` of `name` into the sandbox's allow set if a domain rule allows `name`.
async fn learn(state: &DnsState, name: &str, addresses: &[(Ipv4Addr, u32)]) -> crate::Result<()> {
    let mut inner = state.inner.lock().await;
    if !inner.policy.domain_allowed(name) {
        return Ok(());
    }
    let now = Instant::now();
    let mut fresh = Vec::new();
    for &(ip, ttl) in addresses {
        if !reachable_by_name(state, &inner.policy, ip) {
            continue;
        }
        let ttl = Duration::from_secs(u64::from(ttl)).clamp(MIN_TTL, MAX_TTL);
        let until = now + ttl;
        // Already there for longer: nothing to change in the kernel.
        if inner.learned.get(&ip).is_some_and(|(_, u)| *u >= until) {
            continue;
        }
        fresh.push((ip, ttl));
        inner.learned.insert(ip, (name.to_string(), until));
    }
    inner.learned.retain(|_, (_, until)| *until > now);
    if fresh.is_empty() {
        return Ok(());
    }
    let script = nft::learn_script(state.slot, &fresh);
    tokio::task::spawn_blocking(move || nft::apply(&script))
        .await
        .map_err(|e| crate::Error::io("adding DNS answers to nftables", std::io::Error::other(e)))?
}

/// Whether a name resolving to `ip` may lead the sandbox there (DNS learning, the proxy):
/// never to what reserved.rs refuses; to other reserved ranges only if the rules name
/// them explicitly.
pub(crate) fn reachable_by_name(state: &DnsState, policy: &Policy, ip: Ipv4Addr) -> bool {
    state
        .dest
        .refusal(ip.into(), &reserved::host_addresses())
        .is_none()
        && (!is_reserved(ip, &state.pool) || policy.ip_allowed(ip, &state.pool))
}

/// Sends `msg` (with a fresh id) to each upstream in turn; the first reply whose id
/// matches, with the client's id still to be put back.
pub(crate) async fn forward(upstream: &[SocketAddr], msg: &[u8], tcp: bool) -> Option<Vec<u8>> {
    let id = random_id();
    let mut out = msg.to_vec();
    out[..2].copy_from_slice(&id.to_be_bytes());
    for server in upstream {
        let attempt = async {
            if tcp {
                forward_tcp(*server, &out).await
            } else {
                forward_udp(*server, &out, id).await
            }
        };
        if let Ok(Ok(reply)) = tokio::time::timeout(UPSTREAM_TIMEOUT, attempt).await
            && reply.len() >= wire::HEADER_LEN
            && reply[..2] == id.to_be_bytes()
        {
            return Some(reply);
        }
    }
    None
}

async fn forward_udp(server: SocketAddr, msg: &[u8], id: u16) -> std::io::Result<Vec<u8>> {
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).await?;
    sock.connect(server).await?;
    sock.send(msg).await?;
    let mut buf = vec![0u8; 65535];
    // Ignore stray datagrams with another id (the timeout above bounds this loop).
    loop {
        let n = sock.recv(&mut buf).await?;
        if n >= 2 && buf[..2] == id.to_be_bytes() {
            buf.truncate(n);
            return Ok(buf);
        }
    }
}

async fn forward_tcp(server: SocketAddr, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut conn = TcpStream::connect(server).await?;
    let len = u16::try_from(msg.len()).map_err(|_| std::io::ErrorKind::InvalidData)?;
    conn.write_u16(len).await?;
    conn.write_all(msg).await?;
    let len = conn.read_u16().await?;
    let mut buf = vec![0u8; usize::from(len)];
    conn.read_exact(&mut buf).await?;
    Ok(buf)
}

fn random_id() -> u16 {
    let mut b = [0u8; 2];
    if sandcell_proto::random::fill(&mut b).is_err() {
        // Never expected; a predictable id only weakens spoofing resistance.
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        return t as u16;
    }
    u16::from_be_bytes(b)
}
