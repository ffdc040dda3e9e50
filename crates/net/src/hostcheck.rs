//! The Host/SNI-checking proxy. A sandbox's TCP connection to an address that is allowed
//! only because a domain rule's DNS answer put it in the `dns_allow` set, on ANY port, is
//! redirected here (nft.rs, chain `to_proxy`), to one listener on the host end of its veth;
//! the original destination port comes from conntrack (`SO_ORIGINAL_DST`). The proxy reads
//! what the client sends first: a TLS ClientHello (its SNI) or an HTTP/1.x request head
//! (its `Host`), checks that name against the domain rules, resolves the name itself
//! through the upstream resolvers, and connects to that name's address on the original
//! port. So a connection to an allowed address that names another host (an IP literal with
//! a forged SNI or Host, a lying /etc/hosts, a shared CDN address) reaches nothing.
//!
//! What carries neither name is refused: protocols where the server speaks first (SSH,
//! SMTP, ...) or that are not TLS or HTTP/1.x. To reach such a service, allow its address
//! or range explicitly (`allowOut: ["203.0.113.7"]`): addresses an IP/CIDR rule allows are
//! reached directly, never through this proxy. UDP to a domain-only address (QUIC
//! included) is refused for the same reason: nothing checks its name.
//!
//! A `network.rules` domain with a transform is not passed through: its plain HTTP on port 80
//! goes through the header-filling relay ([`inject`]), and so does its TLS on port 443 once
//! decrypted, when the daemon intercepts TLS ([`intercept`], off by default).
//!
//! With an egress proxy (E2B's `egressProxy`, [`crate::tunnel`]) every TCP connection the
//! rules let out comes here, not only domain-rule ones: what the rules allow by address is
//! passed through the user's SOCKS5 proxy unread, the rest is checked as above and its
//! upstream reached through that proxy by name; a proxy that fails closes the connection.
//!
//! Everything read from the sandbox is bounded: [`MAX_HEAD`] bytes within [`HEAD_TIMEOUT`].
//! Refusals are logged with the DNS refusals (qtype 0: a Host/SNI name).

use crate::accept::{self, Backoff};
use crate::dns::{DnsState, forward, wire};
use crate::socks5::Target;
use crate::tunnel::{Route, Tunnel};
use crate::{inject, intercept, rules};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Where the redirected connections arrive (on the gateway address), whatever their port.
pub const PROXY_PORT: u16 = 15001;
/// The most of a request head or ClientHello read before deciding.
pub const MAX_HEAD: usize = 16 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS: usize = 256;
/// Longest HTTP method token accepted (`OPTIONS`, `CONNECT`, WebDAV's `PROPPATCH`...).
const MAX_METHOD: usize = 16;

/// The protocol a connection's first bytes speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Http,
    Tls,
}

/// What the proxy makes of the bytes a connection sent so far ([`sniff`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// Not enough yet to tell (and under [`MAX_HEAD`]).
    NeedMore,
    /// Neither TLS nor HTTP/1.x, no usable name, ambiguous, or too long: the connection is
    /// refused.
    Refuse,
    /// The protocol and the host name it names (lowercased, without port or final dot).
    Name(Kind, String),
}

/// The decision on `head`, the first bytes of a connection. Once it is not
/// [`Sniffed::NeedMore`], more bytes never change it (a request head ends at its first
/// blank line, a ClientHello record at its length): so however the client splits its
/// writes, the proxy decides the same (tests/fuzz target `egress_sniff` check it).
pub fn sniff(head: &[u8]) -> Sniffed {
    // What the proxy reads is at most MAX_HEAD: decide on no more, whatever the caller has.
    let head = &head[..head.len().min(MAX_HEAD)];
    let parsed = match head_kind(head) {
        Some(Kind::Http) => http_host(head),
        Some(Kind::Tls) => tls_sni(head),
        None if may_become_known(head) => Parsed::NeedMore,
        None => Parsed::Refuse,
    };
    match parsed {
        Parsed::Name(n) => match head_kind(head) {
            Some(kind) if valid_name(&n) => Sniffed::Name(kind, n),
            _ => Sniffed::Refuse,
        },
        Parsed::Refuse => Sniffed::Refuse,
        Parsed::NeedMore if head.len() >= MAX_HEAD => Sniffed::Refuse,
        Parsed::NeedMore => Sniffed::NeedMore,
    }
}

/// Starts the proxy listener of one sandbox on `gateway`.
pub(crate) async fn start(
    gateway: Ipv4Addr,
    state: Arc<DnsState>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let listener = TcpListener::bind((gateway, PROXY_PORT)).await?;
    Ok(vec![tokio::spawn(serve(listener, gateway, state, limit))])
}

async fn serve(
    listener: TcpListener,
    gateway: Ipv4Addr,
    state: Arc<DnsState>,
    limit: Arc<Semaphore>,
) {
    let mut backoff = Backoff::new();
    loop {
        let (conn, _) = accept::retry(&mut backoff, || listener.accept()).await;
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _ = handle(conn, gateway, &state).await;
            drop(permit);
        });
    }
}

/// Where the sandbox meant to connect before nftables redirected it here.
fn original_destination(conn: &TcpStream) -> std::io::Result<SocketAddrV4> {
    use std::os::fd::AsRawFd;
    // SAFETY: sockaddr_in is plain data; all zeroes is a valid value of it.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: the fd is `conn`'s open socket; the kernel writes at most `len` bytes into
    // `addr`, which we own and which is that large.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&raw mut addr).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
        u16::from_be(addr.sin_port),
    ))
}

async fn handle(mut conn: TcpStream, gateway: Ipv4Addr, state: &DnsState) -> std::io::Result<()> {
    let dest = match original_destination(&conn) {
        // Straight to the listener, not redirected: there is no destination to check.
        Ok(d) if *d.ip() == gateway => return conn.shutdown().await,
        Ok(d) => d,
        Err(_) => return conn.shutdown().await,
    };
    let (tunnel, by_address) = {
        let inner = state.inner.lock().await;
        let p = &inner.policy;
        (p.tunnel.clone(), p.ip_allowed(*dest.ip(), &state.pool))
    };
    // With an egress proxy, what the rules allow by address (or an open policy) comes here
    // too (nft.rs): it goes through the proxy by address, unread.
    if let Some(tunnel) = tunnel.as_ref().filter(|_| by_address) {
        return through_by_address(conn, dest, tunnel, state).await;
    }
    let mut head = Vec::with_capacity(1024);
    let (kind, name) =
        match tokio::time::timeout(HEAD_TIMEOUT, read_name(&mut conn, &mut head)).await {
            Ok(Ok(Some(found))) => found,
            Ok(Ok(None)) => return refuse(conn, head_kind(&head)).await,
            _ => return refuse(conn, None).await,
        };
    let allowed = {
        let inner = state.inner.lock().await;
        name.parse::<Ipv4Addr>().is_err() && inner.policy.domain_allowed(&name)
    };
    if !allowed {
        state.note_denied(&name, 0);
        return refuse(conn, Some(kind)).await;
    }
    let Some(ip) = resolve(state, &name).await else {
        state.note_denied(&name, 0);
        return refuse(conn, Some(kind)).await;
    };
    // A `network.rules` domain over plain HTTP: every request gets its headers (inject.rs);
    // over TLS on 443 too when interception is on (intercept.rs), else its TLS passes
    // through with the placeholders. Without a resolver (a daemon that holds no secrets)
    // it is refused, never reached without them.
    let interceptor = match kind {
        Kind::Tls if rules::INTERCEPT_PORTS.contains(&dest.port()) => intercept::interceptor(),
        _ => None,
    };
    let injectable = match kind {
        Kind::Http => rules::INJECT_PORTS.contains(&dest.port()),
        Kind::Tls => interceptor.is_some(),
    };
    let transform = injectable && {
        let inner = state.inner.lock().await;
        inner
            .policy
            .transforms
            .get(&name)
            .is_some_and(|h| !h.is_empty())
    };
    let resolver = match (transform, rules::resolver()) {
        (false, _) => None,
        (true, Some(r)) => Some(r),
        (true, None) => return refuse(conn, Some(kind)).await,
    };
    let addr = SocketAddr::from((ip, dest.port()));
    // With an egress proxy the name is what the proxy is asked for (it resolves it: E2B's
    // "remote DNS"); the local answer above only checked where the name leads.
    let route = match &tunnel {
        None => Route::Direct(addr),
        Some(t) => Route::Tunnel {
            tunnel: t,
            dest: &state.dest,
            target: Target::Name(name.clone(), dest.port()),
            addr,
        },
    };
    if let (Some(resolver), Some(interceptor)) = (&resolver, &interceptor) {
        // The ClientHello already read is replayed into the handshake.
        let sandbox = intercept::Replayed::new(head, conn);
        let (st, nm, res) = (state, name.as_str(), &**resolver);
        let relay = async move {
            match interceptor
                .relay_via(sandbox, nm, &route, move || fill(st, nm, res))
                .await
            {
                Ok(()) => Ok(()),
                Err(intercept::InterceptError::Inject(inject::InjectError::Io(e))) => Err(e),
                Err(e) => {
                    tracing::info!("egress proxy: refused a TLS connection to {nm}: {e}");
                    Ok(())
                }
            }
        };
        return while_allowed(state, nm, ip, &tunnel, relay).await;
    }
    let mut upstream = match route.tcp(CONNECT_TIMEOUT).await {
        Ok(s) => s,
        Err(e) => {
            if tunnel.is_some() {
                tracing::info!("egress proxy: refused a connection to {name}: {e}");
            }
            return refuse(conn, Some(kind)).await;
        }
    };
    let Some(resolver) = resolver else {
        upstream.write_all(&head).await?;
        let copy = async move {
            tokio::io::copy_bidirectional(&mut conn, &mut upstream)
                .await
                .map(|_| ())
        };
        return while_allowed(state, &name, ip, &tunnel, copy).await;
    };
    let (client_r, client_w) = conn.into_split();
    // The head already read is the first request's: it goes through the relay too.
    let client_r = std::io::Cursor::new(head).chain(client_r);
    let (st, nm, res) = (state, name.as_str(), &*resolver);
    let relay = inject::relay(client_r, client_w, upstream, &name, move || {
        fill(st, nm, res)
    });
    let relay = async move {
        match relay.await {
            Ok(()) => Ok(()),
            Err(inject::InjectError::Io(e)) => Err(e),
            Err(e) => {
                tracing::info!("egress proxy: refused a request to {nm}: {e}");
                Ok(())
            }
        }
    };
    while_allowed(state, nm, ip, &tunnel, relay).await
}

/// A connection the rules allow by address, with an egress proxy: through it to the
/// original destination, bytes untouched. The proxy failing closes the sandbox's
/// connection (a reset: nothing was sent either way), never a direct connection.
async fn through_by_address(
    mut conn: TcpStream,
    dest: SocketAddrV4,
    tunnel: &Arc<Tunnel>,
    state: &DnsState,
) -> std::io::Result<()> {
    let mut upstream = match tunnel.dial(&state.dest, &Target::Addr(dest.into())).await {
        Ok(s) => s,
        Err(e) => {
            tracing::info!("egress proxy: refused a connection to {dest}: {e}");
            let _ = conn.set_zero_linger();
            return Ok(());
        }
    };
    let copy = async move {
        tokio::io::copy_bidirectional(&mut conn, &mut upstream)
            .await
            .map(|_| ())
    };
    let still = |p: &crate::policy::Policy| {
        p.tunnel.as_ref() == Some(tunnel) && p.ip_allowed(*dest.ip(), &state.pool)
    };
    until_refused(state, &dest.to_string(), still, copy).await
}

/// The headers of `name`'s rule filled for one request, each injection noted for the
/// audit log; `Err`: the rule is gone or a secret could not be filled (the request is
/// answered 502, never sent).
async fn fill(
    st: &DnsState,
    nm: &str,
    res: &dyn rules::Resolver,
) -> Result<Vec<inject::InjectedHeader>, String> {
    let headers = st.inner.lock().await.policy.transforms.get(nm).cloned();
    let Some(headers) = headers else {
        return Err(format!("{nm} has no rule any more"));
    };
    let filled = res
        .resolve(&st.net_id, nm, &headers)
        .await
        .map_err(|e| e.0)?;
    for h in &filled {
        for (secret, version) in &h.secrets {
            st.note_injection(nm, &h.name, secret, *version);
        }
    }
    Ok(filled)
}

/// Runs `copy` until it ends, or a policy change no longer allows `name` or `ip`, or
/// changes the egress proxy from `tunnel` (then it is dropped with both sides: a live
/// tightening cuts what it refuses, as conntrack.rs does for direct connections).
async fn while_allowed(
    state: &DnsState,
    name: &str,
    ip: Ipv4Addr,
    tunnel: &Option<Arc<Tunnel>>,
    copy: impl std::future::Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    // A new egress proxy (or none after one): this connection went the old way.
    let still = |p: &crate::policy::Policy| {
        p.domain_allowed(name) && crate::dns::reachable_by_name(state, p, ip) && p.tunnel == *tunnel
    };
    until_refused(state, &format!("{name} ({ip})"), still, copy).await
}

/// Runs `copy` until it ends or, at a policy change, `still` says the policy in force no
/// longer allows this connection (then it is dropped with both sides).
async fn until_refused(
    state: &DnsState,
    what: &str,
    still: impl Fn(&crate::policy::Policy) -> bool,
    copy: impl std::future::Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    let mut changed = state.policy_changed.subscribe();
    tokio::pin!(copy);
    loop {
        tokio::select! {
            r = &mut copy => return r,
            r = changed.changed() => {
                if r.is_err() {
                    return Ok(());
                }
                let allowed = still(&state.inner.lock().await.policy);
                if !allowed {
                    tracing::info!("egress proxy: cut a connection to {what}: no longer allowed");
                    return Ok(());
                }
            }
        }
    }
}

/// An HTTP client gets a 403 it can show; anything else a closed connection.
async fn refuse(mut conn: TcpStream, kind: Option<Kind>) -> std::io::Result<()> {
    if kind == Some(Kind::Http) {
        let body = "refused by the sandbox's egress rules\n";
        let resp = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(resp.as_bytes()).await?;
    }
    conn.shutdown().await
}

/// What the client's first bytes say it speaks: a TLS handshake record, an HTTP method
/// token and a space, or neither (`None`; also while too little has come to tell).
fn head_kind(head: &[u8]) -> Option<Kind> {
    match head.first()? {
        22 => Some(Kind::Tls),
        b'A'..=b'Z' => {
            let token = head.iter().take_while(|b| b.is_ascii_uppercase()).count();
            (token <= MAX_METHOD && head.get(token) == Some(&b' ')).then_some(Kind::Http)
        }
        _ => None,
    }
}

/// Whether `head` can still become the start of a TLS record or an HTTP request line.
fn may_become_known(head: &[u8]) -> bool {
    match head.first() {
        None => true,
        Some(22) => true,
        Some(b'A'..=b'Z') => {
            let token = head.iter().take_while(|b| b.is_ascii_uppercase()).count();
            token == head.len() && token <= MAX_METHOD
        }
        Some(_) => false,
    }
}

/// Reads from `conn` into `head` until the protocol and host name can be told; `None`: they
/// cannot (neither TLS nor HTTP, no name, too long, closed).
async fn read_name(
    conn: &mut TcpStream,
    head: &mut Vec<u8>,
) -> std::io::Result<Option<(Kind, String)>> {
    let mut buf = [0u8; 4096];
    loop {
        match sniff(head) {
            Sniffed::Name(kind, n) => return Ok(Some((kind, n))),
            Sniffed::Refuse => return Ok(None),
            Sniffed::NeedMore => {}
        }
        let want = (MAX_HEAD - head.len()).min(buf.len());
        let n = conn.read(&mut buf[..want]).await?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&buf[..n]);
    }
}

/// A DNS name as a rule could match it, lowercased.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    Name(String),
    NeedMore,
    Refuse,
}

/// The `Host` of an HTTP/1.x request head (port and trailing dot dropped, lowercased).
fn http_host(head: &[u8]) -> Parsed {
    let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Parsed::NeedMore;
    };
    let Ok(text) = std::str::from_utf8(&head[..end]) else {
        return Parsed::Refuse;
    };
    let mut hosts = text.split("\r\n").skip(1).filter_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case("host").then(|| v.trim())
    });
    match (hosts.next(), hosts.next()) {
        // Two Host headers: ambiguous, refused (RFC 9112 §3.2).
        (Some(h), None) => {
            let h = match h.rsplit_once(':') {
                Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
                _ => h,
            };
            Parsed::Name(h.trim_end_matches('.').to_ascii_lowercase())
        }
        _ => Parsed::Refuse,
    }
}

/// The SNI host name of a TLS ClientHello (in its first record).
fn tls_sni(b: &[u8]) -> Parsed {
    // Record: type 22 (handshake), version, length.
    if b.len() < 5 {
        return Parsed::NeedMore;
    }
    if b[0] != 22 {
        return Parsed::Refuse;
    }
    let rec_len = usize::from(u16::from_be_bytes([b[3], b[4]]));
    if b.len() < 5 + rec_len {
        return Parsed::NeedMore;
    }
    match sni_in(&b[5..5 + rec_len]) {
        Some(name) => Parsed::Name(name.trim_end_matches('.').to_ascii_lowercase()),
        None => Parsed::Refuse,
    }
}

/// The server_name of a ClientHello handshake message (bounds-checked all through).
fn sni_in(h: &[u8]) -> Option<String> {
    let mut r = Reader { b: h, at: 0 };
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = r.u24()?;
    let mut r = Reader {
        b: r.take(len)?,
        at: 0,
    };
    r.take(2 + 32)?; // version, random
    let sid = usize::from(r.u8()?);
    r.take(sid)?;
    let suites = usize::from(r.u16()?);
    r.take(suites)?;
    let comp = usize::from(r.u8()?);
    r.take(comp)?;
    let ext_len = usize::from(r.u16()?);
    let mut exts = Reader {
        b: r.take(ext_len)?,
        at: 0,
    };
    while exts.at < exts.b.len() {
        let ty = exts.u16()?;
        let len = usize::from(exts.u16()?);
        let body = exts.take(len)?;
        if ty != 0 {
            continue;
        }
        let mut sn = Reader { b: body, at: 0 };
        let list = usize::from(sn.u16()?);
        let mut list = Reader {
            b: sn.take(list)?,
            at: 0,
        };
        while list.at < list.b.len() {
            let kind = list.u8()?;
            let len = usize::from(list.u16()?);
            let name = list.take(len)?;
            if kind == 0 {
                return String::from_utf8(name.to_vec()).ok();
            }
        }
        return None;
    }
    None
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_be_bytes([s[0], s[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|s| (usize::from(s[0]) << 16) | (usize::from(s[1]) << 8) | usize::from(s[2]))
    }
}

/// The first usable A address of `name` from the upstream resolvers: never one reserved.rs
/// refuses (loopback, link-local, the pool, the host's own: this proxy connects from the
/// host's namespace, around the sandbox's chains), other reserved ranges only when the
/// policy allows them explicitly, as for DNS learning.
async fn resolve(state: &DnsState, name: &str) -> Option<Ipv4Addr> {
    let query = wire::build_query(0, name, wire::TYPE_A)?;
    let reply = forward(&state.upstream, &query, false).await?;
    let answer = wire::parse_answer(&reply).ok()?;
    let policy = state.inner.lock().await.policy.clone();
    answer
        .addresses
        .iter()
        .map(|(ip, _)| *ip)
        .find(|ip| crate::dns::reachable_by_name(state, &policy, *ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello with `sni`, as a client would send it (structure only).
    pub(crate) fn client_hello(sni: &str) -> Vec<u8> {
        let name = sni.as_bytes();
        let mut sn = Vec::new();
        sn.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
        sn.push(0);
        sn.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sn.extend_from_slice(name);
        let mut exts = Vec::new();
        exts.extend_from_slice(&[0x00, 0x0b, 0x00, 0x02, 0x01, 0x00]); // ec_point_formats
        exts.extend_from_slice(&0u16.to_be_bytes());
        exts.extend_from_slice(&(sn.len() as u16).to_be_bytes());
        exts.extend_from_slice(&sn);
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0);
        body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01, 0x01, 0x00]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn reads_sni_and_waits_for_the_whole_record() {
        let hello = client_hello("API.Example.com.");
        assert_eq!(tls_sni(&hello), Parsed::Name("api.example.com".into()));
        assert_eq!(tls_sni(&hello[..hello.len() - 1]), Parsed::NeedMore);
        assert_eq!(tls_sni(b"GET / HTTP/1.1\r\n"), Parsed::Refuse);
        // every truncation of the handshake inside a complete record is refused, never a panic
        for cut in 6..hello.len() {
            let mut h = hello[..cut].to_vec();
            let len = (cut - 5) as u16;
            h[3..5].copy_from_slice(&len.to_be_bytes());
            let _ = tls_sni(&h);
        }
    }

    #[test]
    fn reads_the_one_host_header() {
        let h = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhost: Allowed.Test:8080\r\n\r\n";
        assert_eq!(http_host(h), Parsed::Name("allowed.test".into()));
        assert_eq!(http_host(b"GET / HTTP/1.1\r\nHost: a"), Parsed::NeedMore);
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            Parsed::Refuse
        );
        assert_eq!(http_host(b"GET / HTTP/1.0\r\n\r\n"), Parsed::Refuse);
    }

    #[test]
    fn tells_tls_from_http_from_neither() {
        assert_eq!(head_kind(&client_hello("a.test")), Some(Kind::Tls));
        assert_eq!(head_kind(b"GET / HTTP/1.1\r\n"), Some(Kind::Http));
        assert_eq!(head_kind(b"PROPPATCH /x HTTP/1.1"), Some(Kind::Http));
        assert_eq!(head_kind(b"GE"), None);
        assert!(may_become_known(b"GE"));
        assert!(may_become_known(b""));
        assert!(!may_become_known(b"SSH-2.0-OpenSSH\r\n"));
        assert!(!may_become_known(b"\x00\x01binary"));
        assert!(!may_become_known(b"get / HTTP/1.1"));
        assert!(!may_become_known(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"));
    }
}
