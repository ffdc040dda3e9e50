//! The egress guard of a registry pull: a proxy on loopback that every connection of the
//! pull goes through, the registry's redirects and token realms included.
//!
//! Why a proxy: a tenant's `fromImage` names the registry, so a hostile registry answers the
//! pull, and it chooses where the pull goes next: redirects, and the realm of its bearer
//! challenge (the token exchange, documents.rs). One client makes every request of the pull
//! (ours, documents.rs), and reqwest sends every hop of it through the proxy (CONNECT for
//! HTTPS, an absolute-form request for plain HTTP), so one place decides for all of them,
//! after name resolution: a redirect policy and a DNS resolver in the client would have to
//! repeat the rule for each kind of hop (and an HTTPS hop's body is out of the guard's
//! sight, so bounding what is read is the client's job, documents.rs). The guard resolves
//! the target itself and connects only where the up-front check would
//! ([`crate::registry::internal_address`], plus the host's own addresses), so a redirect or
//! realm at 127.0.0.1, 169.254.169.254, a private range or the host itself reaches nothing,
//! whatever the name resolves to at that moment (no rebinding between check and connect). Plain HTTP is forwarded only to the `host:port`s the operator
//! listed as insecure registries.
//!
//! Bounded: request heads of 8 KiB, a connect deadline, a few dozen connections at once;
//! every connection ends when the guard (one per pull) is dropped.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

const MAX_HEAD: usize = 8 << 10;
const MAX_CONNECTIONS: usize = 32;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a pull may connect.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// Internal addresses too (the CLI: its user is the operator).
    pub allow_internal: bool,
    /// `host:port`s the operator listed: reached at any address, over plain HTTP too.
    pub insecure: Vec<String>,
}

/// A running guard; it stops, with every connection through it, when dropped.
pub(crate) struct Guard {
    addr: SocketAddr,
    refused: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Guard {
    pub async fn start(policy: Policy) -> std::io::Result<Guard> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let refused = Arc::new(Mutex::new(None));
        let policy = Arc::new(policy);
        let slot = refused.clone();
        let task = tokio::spawn(async move {
            // Dropped with the accept loop: aborts the connections still open.
            let mut open = JoinSet::new();
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    // Out of descriptors, most likely: not a reason to spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                while open.try_join_next().is_some() {}
                if open.len() >= MAX_CONNECTIONS {
                    tracing::warn!("registry guard: too many connections, one refused");
                    continue;
                }
                let (policy, slot) = (policy.clone(), slot.clone());
                open.spawn(async move { serve(conn, &policy, &slot).await });
            }
        });
        Ok(Guard {
            addr,
            refused,
            task,
        })
    }

    /// The proxy URL for the pull's reqwest client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Why the first refused connection was refused, if one was.
    pub fn refusal(&self) -> Option<String> {
        self.refused.lock().ok().and_then(|s| s.clone())
    }
}

/// One client connection: CONNECT or an absolute-form plain HTTP request. A refusal is
/// answered 403, its reason kept in `refused`.
async fn serve(mut conn: TcpStream, policy: &Policy, refused: &Mutex<Option<String>>) {
    let Some((head, rest)) = read_head(&mut conn).await else {
        return;
    };
    let mut words = head.lines().next().unwrap_or("").split_ascii_whitespace();
    let (method, target, version) = (
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
        words.next().unwrap_or("HTTP/1.1"),
    );
    let outcome = if method.eq_ignore_ascii_case("CONNECT") {
        match connect(target, policy).await {
            Ok(mut up) => {
                let _ = conn
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await;
                let _ = up.write_all(&rest).await;
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                return;
            }
            Err(why) => why,
        }
    } else if let Some(after) = target.strip_prefix("http://") {
        let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
        let path = if path.is_empty() { "/" } else { path };
        if listed(authority, policy) {
            match connect(&with_port(authority, 80), policy).await {
                Ok(mut up) => {
                    let head = origin_form(&head, method, path, version);
                    let _ = up.write_all(head.as_bytes()).await;
                    let _ = up.write_all(&rest).await;
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                    return;
                }
                Err(why) => why,
            }
        } else {
            format!(
                "plain HTTP to {authority}: refused (only the registries an operator lists \
                 with --insecure-registry are spoken to without TLS)"
            )
        }
    } else {
        format!("unexpected proxy request {method:?}")
    };
    tracing::warn!(why = %outcome, "registry pull: connection refused");
    // Kept before the client hears of it: the pull reads it as soon as its request fails.
    if let Ok(mut slot) = refused.lock() {
        slot.get_or_insert(outcome);
    }
    let _ = conn
        .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .await;
}

fn listed(authority: &str, policy: &Policy) -> bool {
    policy.insecure.iter().any(|r| r == authority)
        || (!authority.contains(':')
            && policy
                .insecure
                .iter()
                .any(|r| *r == with_port(authority, 80)))
}

fn with_port(authority: &str, port: u16) -> String {
    match authority.rsplit_once(':') {
        Some((_, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => authority.into(),
        _ => format!("{authority}:{port}"),
    }
}

/// The request head for the origin: its path, and `Connection: close` so that the
/// connection carries this one request (a second one from the client would reach the same
/// allowed origin, never another).
fn origin_form(head: &str, method: &str, path: &str, version: &str) -> String {
    let mut out = format!("{method} {path} {version}\r\n");
    for line in head.split("\r\n").skip(1).filter(|l| !l.is_empty()) {
        let name = line
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

/// Reads up to the end of the request head; `None` on EOF, garbage or an oversized head.
async fn read_head(conn: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = tokio::time::timeout(CONNECT_TIMEOUT, conn.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf[..end].to_vec()).ok()?;
            return Some((head, buf[end + 4..].to_vec()));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

/// Resolves `host:port` and connects to an address the policy allows.
async fn connect(target: &str, policy: &Policy) -> Result<TcpStream, String> {
    let (name, port) = match target.rsplit_once(':') {
        Some((n, p)) => (
            n.trim_start_matches('[').trim_end_matches(']'),
            p.parse::<u16>()
                .map_err(|_| format!("bad proxy target {target:?}"))?,
        ),
        None => return Err(format!("bad proxy target {target:?}")),
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
        .await
        .map_err(|e| format!("resolving {name}: {e}"))?
        .collect();
    if !(policy.allow_internal || policy.insecure.iter().any(|r| r == target)) {
        let host = sandcell_net::reserved::host_addresses();
        if let Some(bad) = addrs.iter().find(|a| refused(a.ip(), &host)) {
            return Err(format!(
                "the registry sent the pull to {target}, at {}, an internal address: refused",
                bad.ip()
            ));
        }
    }
    let mut last = format!("{name} resolves to no address");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = format!("connecting to {addr}: {e}"),
            Err(_) => last = format!("connecting to {addr}: timed out"),
        }
    }
    Err(last)
}

/// The up-front check's ranges, and the host's own addresses (a daemon's API or any
/// service bound to 0.0.0.0 is there).
fn refused(ip: IpAddr, host: &[IpAddr]) -> bool {
    crate::registry::internal_address(ip) || host.contains(&ip)
}
