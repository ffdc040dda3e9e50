//! The API port's accept loop: HTTP/1.1 connections served by hyper with the limits a
//! public port needs (`axum::serve` sets none):
//! - a connection cap ([`Limits::max_connections`]): beyond it the loop stops accepting
//!   (new connections wait in the kernel's backlog, then their SYNs go unanswered and are
//!   retried by the client) instead of refusing them or spawning without bound;
//! - a header read timeout ([`Limits::header_timeout`]): a client that does not send a
//!   whole request head in time is disconnected (slowloris). hyper starts this timer
//!   whenever the connection waits for a request head, so an idle keep-alive connection
//!   is closed after the same time;
//! - a cap on the request head's size ([`Limits::max_header_bytes`]): larger heads get
//!   431. Bodies are capped per route (`DefaultBodyLimit`, http/mod.rs).
//!
//! Upgrades (WebSocket through the port proxy) leave these limits with hyper once switched.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// Limits of the API listener (`sandcell serve --max-connections`, `--header-timeout-secs`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            max_header_bytes: 64 * 1024,
        }
    }
}

/// After an accept error (EMFILE, ...): wait before the next accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `stop` completes, then lets the open connections
/// finish their current request (graceful shutdown) and returns when they all have.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing_tx, closing_rx) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        // The slot first: at the cap nothing is accepted (the backlog holds the rest).
        let permit = tokio::select! {
            _ = &mut stop => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            _ = &mut stop => break,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("accepting an API connection: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut closing = closing_rx.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_header_size(limits.max_header_bytes);
            let conn = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(conn);
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    r = closing.changed() => {
                        conn.as_mut().graceful_shutdown();
                        if r.is_err() {
                            // The loop is gone: just finish.
                            let _ = conn.as_mut().await;
                            break;
                        }
                    }
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    let _ = closing_tx.send(true);
    // Every connection task holds a slot: all slots back means all connections ended.
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use std::io::{Read, Write};

    async fn start(limits: Limits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", get(|| async { "up" }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, router, limits, async move {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    fn get_root(addr: std::net::SocketAddr) -> String {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    /// Reads until the server closes (panics if it does not within 20 s); what it sent.
    fn until_closed(c: &mut std::net::TcpStream) -> Vec<u8> {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match c.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
                Err(e) => panic!("the server kept the connection open: {e}"),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn slow_and_idle_clients_are_disconnected() {
        let limits = Limits {
            header_timeout: Duration::from_millis(500),
            ..Limits::default()
        };
        let (addr, _stop) = start(limits).await;
        tokio::task::spawn_blocking(move || {
            // half a request head, never finished
            let mut slow = std::net::TcpStream::connect(addr).unwrap();
            slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
            let mut idle = std::net::TcpStream::connect(addr).unwrap();
            // a keep-alive connection that goes quiet after one request
            let mut kept = std::net::TcpStream::connect(addr).unwrap();
            kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let _ = until_closed(&mut slow);
            assert!(until_closed(&mut idle).is_empty());
            let got = String::from_utf8(until_closed(&mut kept)).unwrap();
            assert!(got.contains("up"), "{got}");
            // and the daemon still answers
            assert!(get_root(addr).contains("up"));
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn beyond_the_cap_connections_wait_and_are_served_later() {
        let limits = Limits {
            max_connections: 2,
            header_timeout: Duration::from_secs(60),
            ..Limits::default()
        };
        let (addr, _stop) = start(limits).await;
        tokio::task::spawn_blocking(move || {
            let hogs: Vec<_> = (0..2)
                .map(|_| std::net::TcpStream::connect(addr).unwrap())
                .collect();
            // the third connects (kernel backlog) but is not served while both hog
            let mut third = std::net::TcpStream::connect(addr).unwrap();
            third
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            third
                .set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let mut buf = [0u8; 64];
            assert!(third.read(&mut buf).is_err(), "served beyond the cap");
            drop(hogs);
            let got = String::from_utf8(until_closed(&mut third)).unwrap();
            assert!(got.contains("up"), "{got}");
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn oversized_heads_get_431() {
        let (addr, _stop) = start(Limits::default()).await;
        tokio::task::spawn_blocking(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            let big = "a".repeat(100 * 1024);
            let _ = c
                .write_all(format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes());
            let got = String::from_utf8_lossy(&until_closed(&mut c)).to_string();
            assert!(got.starts_with("HTTP/1.1 431"), "{got}");
            assert!(get_root(addr).contains("up"));
        })
        .await
        .unwrap();
    }
}
