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
//! The HTTPS port ([`serve_tls`]) runs the same loop with a TLS handshake first.

use axum::Router;
use axum::http::{HeaderValue, Request, header};
use hyper::body::Incoming;
use hyper::service::Service;
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
    accept_loop(listener, router, limits, None, stop).await;
}

/// [`serve`] over TLS (the HTTPS port URLs, crate::tls): the handshake is bounded by the
/// header timeout too; a request without a Host gets the name the client sent in its SNI.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Arc<rustls::ServerConfig>,
    stop: impl Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    accept_loop(listener, router, limits, Some(acceptor), stop).await;
}

async fn accept_loop(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
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
        let router = router.clone();
        let closing = closing_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => connection(TokioIo::new(stream), router, None, limits, closing).await,
                Some(tls) => {
                    let handshake = tokio::time::timeout(limits.header_timeout, tls.accept(stream));
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            let sni = stream.get_ref().1.server_name().map(str::to_owned);
                            connection(TokioIo::new(stream), router, sni, limits, closing).await
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake: {e}"),
                        Err(_) => tracing::debug!("TLS handshake: timed out"),
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

/// Serves one connection until it ends, or until `closing` asks for a graceful end.
async fn connection<I>(
    io: TokioIo<I>,
    router: Router,
    sni: Option<String>,
    limits: Limits,
    mut closing: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let sni = sni.and_then(|name| HeaderValue::from_str(&name).ok());
    let router = TowerToHyperService::new(router);
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        if let Some(name) = &sni
            && !req.headers().contains_key(header::HOST)
        {
            req.headers_mut().insert(header::HOST, name.clone());
        }
        router.call(req)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes);
    let conn = builder.serve_connection(io, service).with_upgrades();
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

    /// The HTTPS port: a handshake with the daemon CA's leaf, a request answered, and a
    /// request without a Host gets the SNI name (what proxy routing then reads).
    #[tokio::test(flavor = "multi_thread")]
    async fn tls_connections_are_served_and_sni_stands_in_for_a_missing_host() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let tls = crate::tls::setup("sandbox.test", None, None, dir.path()).unwrap();
        let ca = crate::tls::ca::DaemonCa::load_or_create(dir.path()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route(
            "/",
            get(|headers: axum::http::HeaderMap| async move {
                format!("host={}", headers[header::HOST].to_str().unwrap_or(""))
            }),
        );
        let (_stop, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_tls(
            listener,
            router,
            Limits::default(),
            tls.config,
            async move {
                let _ = rx.await;
            },
        ));
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        for (head, want) in [
            (
                "Host: 8000-sc-1.sandbox.test\r\n",
                "host=8000-sc-1.sandbox.test",
            ),
            ("", "host=49983-sc-2.sandbox.test"),
        ] {
            let sni = if head.is_empty() {
                "49983-sc-2"
            } else {
                "8000-sc-1"
            };
            let name =
                rustls::pki_types::ServerName::try_from(format!("{sni}.sandbox.test")).unwrap();
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut c = connector.connect(name, tcp).await.unwrap();
            c.write_all(format!("GET / HTTP/1.1\r\n{head}Connection: close\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            let _ = c.read_to_string(&mut out).await;
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            assert!(out.ends_with(want), "{out}");
        }
    }
}
