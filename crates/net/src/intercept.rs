//! TLS interception for `network.rules` domains (issue 17): HTTPS requests get their
//! headers filled on the host as plain HTTP does (inject.rs). On unless the daemon is
//! started with `--no-egress-intercept-tls` ([`set_interceptor`]); the sandboxes trust the
//! CA because `/init` installs it into their system store (`sandcellCaBundle`).
//!
//! The Host/SNI proxy ([`crate::hostcheck`]) hands over a TLS connection on port 443 whose
//! SNI is a domain with a transform in the sandbox's rules. The real host is connected first
//! (TLS verified against the host's CA bundle plus the operator's extra CAs,
//! `--egress-extra-ca`, offering `h2` and `http/1.1`); then the sandbox's TLS is terminated
//! here with a leaf certificate for exactly that name from the daemon's egress CA
//! ([`crate::tls_ca`]), offering what the upstream took: `h2` (and `http/1.1`) when it took
//! `h2`, else `http/1.1` only, so the two sides always speak the same version. HTTP/1.1
//! requests go through [`inject::relay`] unchanged (every request's `Host` must be the
//! domain; 403 and 502 as for plain HTTP), HTTP/2 streams through [`crate::h2relay`] (the
//! same checks per stream). A sandbox that picks `http/1.1` from an `h2` offer gets a new
//! upstream connection that speaks it. An upstream that fails to connect or to verify gets
//! the sandbox a 502 and is sent nothing.
//!
//! Domains without a transform are never intercepted: their TLS passes through the SNI
//! check untouched. Nothing here puts the egress CA into a sandbox's trust store: a sandbox
//! trusts the leaf only if it was given `<data-dir>/egress-ca.pem` (docs/secrets.md).

use crate::inject::{self, InjectError, InjectedHeader};
use crate::tls_ca::{CaError, EgressCa};
use crate::tunnel::{Route, RouteError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::future::Future;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// What [`inject::relay`] parses.
const HTTP1: &[u8] = b"http/1.1";
/// What [`crate::h2relay`] relays.
const H2: &[u8] = b"h2";
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a 502, what is read (and dropped) of the sandbox's request before closing, so that
/// unread bytes do not turn the close into a reset that loses the answer.
const DRAIN_LIMIT: u64 = 64 * 1024;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on an `--egress-extra-ca` file.
const MAX_EXTRA_CA: u64 = 1024 * 1024;

/// Why an intercepted connection (or the interceptor itself) failed.
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    #[error("--egress-extra-ca {path}: {why}")]
    ExtraCa { path: PathBuf, why: String },
    #[error("the upstream trust store is empty (no host CA bundle, no --egress-extra-ca)")]
    NoRoots,
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("a leaf certificate for {domain}: {source}")]
    Leaf {
        domain: String,
        #[source]
        source: CaError,
    },
    #[error("{0:?} is not a TLS server name")]
    Name(String),
    #[error("the sandbox's TLS handshake for {domain}: {source}")]
    SandboxHandshake {
        domain: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the sandbox's TLS handshake for {domain} did not finish in time")]
    SandboxHandshakeTimeout { domain: String },
    #[error("connecting to {domain} ({addr}): {source}")]
    Connect {
        domain: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {domain} ({addr}) did not finish in time")]
    ConnectTimeout { domain: String, addr: SocketAddr },
    /// The upstream's certificate did not verify for `domain`, or its handshake failed.
    #[error("the TLS handshake with {domain} ({addr}): {source}")]
    UpstreamHandshake {
        domain: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Through the sandbox's egress proxy (tunnel.rs).
    #[error("connecting to {domain} through the egress proxy: {source}")]
    Tunnel {
        domain: String,
        #[source]
        source: crate::tunnel::DialError,
    },
    #[error(transparent)]
    Inject(#[from] InjectError),
}

/// The daemon's TLS interception: its CA and its upstream client configuration.
pub struct Interceptor {
    ca: EgressCa,
    provider: Arc<rustls::crypto::CryptoProvider>,
    /// Offers `h2` and `http/1.1`.
    upstream: Arc<rustls::ClientConfig>,
    /// Offers `http/1.1` only.
    upstream_http1: Arc<rustls::ClientConfig>,
}

/// The certificates of a PEM bundle (`--egress-extra-ca`): at least one, all parsed.
pub fn read_extra_ca(path: &Path) -> Result<Vec<CertificateDer<'static>>, InterceptError> {
    let bad = |why: String| InterceptError::ExtraCa {
        path: path.to_path_buf(),
        why,
    };
    let f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mut pem = Vec::new();
    f.take(MAX_EXTRA_CA + 1)
        .read_to_end(&mut pem)
        .map_err(|e| bad(e.to_string()))?;
    if pem.len() as u64 > MAX_EXTRA_CA {
        return Err(bad("larger than a CA bundle can be".into()));
    }
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate bundle: {e}")))?;
    if certs.is_empty() {
        return Err(bad("holds no certificate".into()));
    }
    Ok(certs)
}

impl Interceptor {
    /// Upstreams are verified against the host's CA bundle (rustls-native-certs: what
    /// `SSL_CERT_FILE`/`SSL_CERT_DIR` or the distribution's store hold) and `extra`.
    pub fn new(
        ca: EgressCa,
        extra: Vec<CertificateDer<'static>>,
    ) -> Result<Interceptor, InterceptError> {
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!("egress TLS: part of the host's CA bundle did not load: {e}");
        }
        let mut roots = rustls::RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        if ignored > 0 {
            tracing::warn!("egress TLS: {ignored} certificate(s) of the host's bundle ignored");
        }
        let extra_count = extra.len();
        for cert in extra {
            roots.add(cert)?;
        }
        if roots.is_empty() {
            return Err(InterceptError::NoRoots);
        }
        tracing::info!(
            "egress TLS interception on: upstreams verified against {added} host CA(s) and {extra_count} extra"
        );
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut upstream_http1 = upstream.clone();
        upstream.alpn_protocols = vec![H2.to_vec(), HTTP1.to_vec()];
        upstream_http1.alpn_protocols = vec![HTTP1.to_vec()];
        Ok(Interceptor {
            ca,
            provider,
            upstream: Arc::new(upstream),
            upstream_http1: Arc::new(upstream_http1),
        })
    }

    /// The egress CA (its certificate is what a sandbox must trust).
    pub fn ca(&self) -> &EgressCa {
        &self.ca
    }

    /// Terminates the sandbox's TLS for `domain` with the CA's leaf for that name, offering
    /// `h2` first when `h2` is true, and `http/1.1`.
    pub async fn accept<S>(
        &self,
        sandbox: S,
        domain: &str,
        h2: bool,
    ) -> Result<tokio_rustls::server::TlsStream<S>, InterceptError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let (chain, key) = self
            .ca
            .leaf(domain)
            .map_err(|source| InterceptError::Leaf {
                domain: domain.to_string(),
                source,
            })?;
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key.clone_key())?;
        config.alpn_protocols = if h2 {
            vec![H2.to_vec(), HTTP1.to_vec()]
        } else {
            vec![HTTP1.to_vec()]
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sandbox)).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(source)) => Err(InterceptError::SandboxHandshake {
                domain: domain.to_string(),
                source,
            }),
            Err(_) => Err(InterceptError::SandboxHandshakeTimeout {
                domain: domain.to_string(),
            }),
        }
    }

    /// A TLS connection to `domain` at `addr`, its certificate verified for `domain`,
    /// offering `h2` when `h2` is true, and `http/1.1`.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        domain: &str,
        h2: bool,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, InterceptError> {
        self.connect_via(&Route::Direct(addr), domain, h2).await
    }

    /// [`Interceptor::connect`] along `route` (through the egress proxy, or not).
    pub async fn connect_via(
        &self,
        route: &Route<'_>,
        domain: &str,
        h2: bool,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, InterceptError> {
        let name = ServerName::try_from(domain.to_string())
            .map_err(|_| InterceptError::Name(domain.to_string()))?;
        let addr = route.addr();
        let domain_s = || domain.to_string();
        let tcp = match route.tcp(CONNECT_TIMEOUT).await {
            Ok(s) => s,
            Err(RouteError::Io(addr, source)) => {
                return Err(InterceptError::Connect {
                    domain: domain_s(),
                    addr,
                    source,
                });
            }
            Err(RouteError::Timeout(addr)) => {
                return Err(InterceptError::ConnectTimeout {
                    domain: domain_s(),
                    addr,
                });
            }
            Err(RouteError::Tunnel(source)) => {
                return Err(InterceptError::Tunnel {
                    domain: domain_s(),
                    source,
                });
            }
        };
        let config = if h2 {
            &self.upstream
        } else {
            &self.upstream_http1
        };
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        let handshake = connector.connect(name, tcp);
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(source)) => Err(InterceptError::UpstreamHandshake {
                domain: domain.to_string(),
                addr,
                source,
            }),
            Err(_) => Err(InterceptError::ConnectTimeout {
                domain: domain.to_string(),
                addr,
            }),
        }
    }

    /// One intercepted connection: the upstream at `addr` is connected and verified, the
    /// sandbox's TLS is terminated for `domain` offering the version the upstream took, and
    /// the requests are relayed with the headers `headers_for` gives each (as
    /// [`inject::relay`], or [`crate::h2relay::relay`] per stream). An upstream that cannot
    /// be reached or verified gets the sandbox a 502, and nothing is sent to it.
    pub async fn relay<S, F, Fut>(
        &self,
        sandbox: S,
        domain: &str,
        addr: SocketAddr,
        headers_for: F,
    ) -> Result<(), InterceptError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
        F: Fn() -> Fut + Sync,
        Fut: Future<Output = Result<Vec<InjectedHeader>, String>> + Send,
    {
        self.relay_via(sandbox, domain, &Route::Direct(addr), headers_for)
            .await
    }

    /// [`Interceptor::relay`] with the upstream reached along `route` (through the
    /// sandbox's egress proxy, or not).
    pub async fn relay_via<S, F, Fut>(
        &self,
        sandbox: S,
        domain: &str,
        route: &Route<'_>,
        headers_for: F,
    ) -> Result<(), InterceptError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
        F: Fn() -> Fut + Sync,
        Fut: Future<Output = Result<Vec<InjectedHeader>, String>> + Send,
    {
        let addr = route.addr();
        let upstream = match self.connect_via(route, domain, true).await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!("egress proxy: {e}; answered 502");
                let mut sandbox = self.accept(sandbox, domain, false).await?;
                bad_gateway(&mut sandbox).await;
                return Err(e);
            }
        };
        let upstream_h2 = upstream.get_ref().1.alpn_protocol() == Some(H2);
        let sandbox = self.accept(sandbox, domain, upstream_h2).await?;
        let sandbox_h2 = sandbox.get_ref().1.alpn_protocol() == Some(H2);
        tracing::debug!(
            "egress proxy: intercepting TLS to {domain} ({addr}), {}",
            if sandbox_h2 { "HTTP/2" } else { "HTTP/1.1" }
        );
        if sandbox_h2 {
            return Ok(crate::h2relay::relay(sandbox, upstream, domain, &headers_for).await?);
        }
        let upstream = if upstream_h2 {
            // The sandbox took HTTP/1.1 from an offer of both: an upstream that speaks it.
            drop(upstream);
            match self.connect_via(route, domain, false).await {
                Ok(u) => u,
                Err(e) => {
                    tracing::warn!("egress proxy: {e}; answered 502");
                    let mut sandbox = sandbox;
                    bad_gateway(&mut sandbox).await;
                    return Err(e);
                }
            }
        } else {
            upstream
        };
        let (r, mut w) = tokio::io::split(sandbox);
        let outcome = inject::relay(r, &mut w, upstream, domain, &headers_for).await;
        // close_notify: the sandbox's client can tell the end from a cut.
        let _ = w.shutdown().await;
        Ok(outcome?)
    }
}

/// Answers 502 on the sandbox's connection and closes it, then reads (bounded) what it
/// still sends: closing with unread bytes would reset the connection and lose the answer.
async fn bad_gateway<S: AsyncRead + AsyncWrite + Unpin>(sandbox: &mut S) {
    let body =
        "refused by the sandbox's egress rules: the upstream could not be reached or verified\n";
    let answer = format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    if sandbox.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    // close_notify first: the client then knows the answer is whole and closes, which
    // ends the drain.
    let _ = sandbox.shutdown().await;
    let mut sink = tokio::io::sink();
    let mut rest = (&mut *sandbox).take(DRAIN_LIMIT);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, tokio::io::copy(&mut rest, &mut sink)).await;
}

/// A connection whose first bytes were already read (the ClientHello the proxy sniffed):
/// they are read again first, then the connection.
pub struct Replayed<S> {
    head: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Replayed<S> {
    pub fn new(head: Vec<u8>, inner: S) -> Replayed<S> {
        Replayed { head, at: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replayed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = (self.head.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.head[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replayed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Process-wide, as the resolver (rules.rs): one daemon, one egress CA. Without one (the
/// default), TLS to a rule's domain passes through the SNI check with its placeholders.
static INTERCEPTOR: OnceLock<Arc<Interceptor>> = OnceLock::new();

/// Turns interception on for this process (the first call wins).
pub fn set_interceptor(i: Arc<Interceptor>) {
    let _ = INTERCEPTOR.set(i);
}

pub(crate) fn interceptor() -> Option<Arc<Interceptor>> {
    INTERCEPTOR.get().cloned()
}

/// The CA sandboxes must trust while interception is on (PEM), for `/init`'s
/// `sandcellCaBundle`; `None` when it is off.
pub fn sandbox_ca_pem() -> Option<String> {
    INTERCEPTOR.get().map(|i| i.ca().cert_pem().to_owned())
}
