//! TLS interception (intercept.rs) with real rustls on both sides, on loopback: a "sandbox"
//! client that trusts only the egress CA, the proxy's [`Interceptor::relay`] fed the
//! ClientHello the Host/SNI proxy sniffed (as hostcheck.rs does), and an upstream HTTPS
//! server with its own CA, given to the interceptor as the operator's extra CA, that records
//! what it receives. No root needed (the path through nftables and the SNI check runs in
//! tests/egress_tls.rs).

#![allow(clippy::unwrap_used)]

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use sandcell_net::hostcheck::{Kind, Sniffed, sniff};
use sandcell_net::inject::InjectedHeader;
use sandcell_net::intercept::{InterceptError, Interceptor, Replayed};
use sandcell_net::tls_ca::EgressCa;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const DOMAIN: &str = "api.test";
const PLACEHOLDER: &str = "Bearer ${e2b.secrets.api-key}";
const VALUE: &str = "Bearer REAL-VALUE-5c";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA of the test's own: its issuer and its certificate.
fn test_ca(name: &str) -> (Issuer<'static, KeyPair>, CertificateDer<'static>) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let cert = p.self_signed(&key).unwrap();
    (Issuer::new(p, key), cert.der().clone())
}

/// A TLS server's configuration with a new leaf for `name` from `issuer`.
fn server_config(issuer: &Issuer<'static, KeyPair>, name: &str) -> rustls::ServerConfig {
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, issuer)
        .unwrap();
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap()
}

/// An HTTPS server for `name` with a leaf of `issuer`, serving one connection: it reads
/// until the client closes (or after one request head), answers 200 "ok", and returns
/// what it read (empty if the handshake failed).
async fn upstream(
    issuer: &Issuer<'static, KeyPair>,
    name: &str,
) -> (SocketAddr, JoinHandle<Vec<u8>>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(issuer, name)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let Ok(mut tls) = acceptor.accept(tcp).await else {
            return Vec::new();
        };
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let _ = tls
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            .await;
        let _ = tls.shutdown().await;
        got
    });
    (addr, task)
}

/// The proxy side of one connection: sniffs the ClientHello as hostcheck.rs does, then
/// intercepts it for the name it carries, to `upstream`.
async fn proxy(
    interceptor: Arc<Interceptor>,
    upstream: SocketAddr,
) -> (SocketAddr, JoinHandle<Result<(), InterceptError>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        let name = loop {
            match sniff(&head) {
                Sniffed::Name(Kind::Tls, n) => break n,
                Sniffed::NeedMore => {}
                other => panic!("the ClientHello sniffed as {other:?}"),
            }
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client closed before its ClientHello");
            head.extend_from_slice(&buf[..n]);
        };
        assert_eq!(name, DOMAIN);
        let sandbox = Replayed::new(head, conn);
        interceptor
            .relay(sandbox, &name, upstream, || async {
                Ok(vec![InjectedHeader {
                    name: "Authorization".into(),
                    value: VALUE.into(),
                    secrets: vec![("api-key".into(), 1)],
                }])
            })
            .await
    });
    (addr, task)
}

/// TLS to `proxy` for DOMAIN trusting only `root`, offering `alpn`.
async fn connect_sandbox(
    proxy: SocketAddr,
    root: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut store = rustls::RootCertStore::empty();
    store.add(root.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(proxy).await?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(DOMAIN).unwrap(), tcp)
        .await
}

/// The sandbox: TLS to `proxy` for DOMAIN trusting only `root`, offering `alpn`; sends
/// `request` and reads the answer to its end.
async fn sandbox(
    proxy: SocketAddr,
    root: &CertificateDer<'static>,
    alpn: &[&[u8]],
    request: &str,
) -> std::io::Result<(Option<Vec<u8>>, String)> {
    let mut tls = connect_sandbox(proxy, root, alpn).await?;
    let alpn = tls.get_ref().1.alpn_protocol().map(|p| p.to_vec());
    tls.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await?;
    Ok((alpn, String::from_utf8_lossy(&answer).into_owned()))
}

fn request(host: &str) -> String {
    format!(
        "GET /v1/x HTTP/1.1\r\nHost: {host}\r\nAuthorization: {PLACEHOLDER}\r\nConnection: close\r\n\r\n"
    )
}

struct Fixture {
    dir: PathBuf,
    interceptor: Arc<Interceptor>,
    egress_ca: CertificateDer<'static>,
    upstream_ca: Issuer<'static, KeyPair>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture() -> Fixture {
    let hex = sandcell_proto::random::hex(8).unwrap();
    let dir = std::env::temp_dir().join(format!("sc-intercept-test-{hex}"));
    std::fs::create_dir(&dir).unwrap();
    let ca = EgressCa::load_or_create(&dir).unwrap();
    let egress_ca = CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap();
    let (upstream_ca, upstream_ca_cert) = test_ca("upstream test CA");
    let interceptor = Arc::new(Interceptor::new(ca, vec![upstream_ca_cert]).unwrap());
    Fixture {
        dir,
        interceptor,
        egress_ca,
        upstream_ca,
    }
}

#[tokio::test]
async fn the_header_arrives_filled_behind_the_egress_cas_leaf() {
    let f = fixture();
    let (up, recorded) = upstream(&f.upstream_ca, DOMAIN).await;
    let (px, relayed) = proxy(f.interceptor.clone(), up).await;
    // The sandbox trusts the egress CA alone: the handshake proves the leaf is its.
    let (alpn, answer) = sandbox(px, &f.egress_ca, &[b"h2", b"http/1.1"], &request(DOMAIN))
        .await
        .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]), "HTTP/1.1 only");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    relayed.await.unwrap().unwrap();
    let got = String::from_utf8(recorded.await.unwrap()).unwrap();
    assert!(got.starts_with("GET /v1/x HTTP/1.1\r\n"), "{got}");
    assert!(
        got.contains(&format!("Authorization: {VALUE}\r\n")),
        "{got}"
    );
    assert!(!got.contains("${e2b"), "the placeholder went out: {got}");
    assert_eq!(got.matches("Authorization").count(), 1, "{got}");
}

#[tokio::test]
async fn another_host_inside_the_tls_is_refused_before_anything_is_sent() {
    let f = fixture();
    let (up, recorded) = upstream(&f.upstream_ca, DOMAIN).await;
    let (px, relayed) = proxy(f.interceptor.clone(), up).await;
    let (_, answer) = sandbox(px, &f.egress_ca, &[b"http/1.1"], &request("evil.test"))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden"), "{answer}");
    let e = relayed.await.unwrap().unwrap_err();
    assert!(
        matches!(&e, InterceptError::Inject(sandcell_net::inject::InjectError::OtherHost(h)) if h == "evil.test"),
        "{e}"
    );
    assert!(recorded.await.unwrap().is_empty(), "the upstream got bytes");
}

#[tokio::test]
async fn an_upstream_that_does_not_verify_gets_a_502_and_nothing() {
    let f = fixture();
    // Its certificate is for the right name, from a CA the interceptor does not trust.
    let (rogue, _) = test_ca("rogue CA");
    let (up, recorded) = upstream(&rogue, DOMAIN).await;
    let (px, relayed) = proxy(f.interceptor.clone(), up).await;
    let (_, answer) = sandbox(px, &f.egress_ca, &[b"http/1.1"], &request(DOMAIN))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 502 Bad Gateway"), "{answer}");
    let e = relayed.await.unwrap().unwrap_err();
    assert!(matches!(e, InterceptError::UpstreamHandshake { .. }), "{e}");
    assert!(recorded.await.unwrap().is_empty(), "the upstream got bytes");

    // A certificate from the trusted CA for another name does not verify either.
    let (up, recorded) = upstream(&f.upstream_ca, "other.test").await;
    let (px, relayed) = proxy(f.interceptor.clone(), up).await;
    let (_, answer) = sandbox(px, &f.egress_ca, &[b"http/1.1"], &request(DOMAIN))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 502 Bad Gateway"), "{answer}");
    assert!(matches!(
        relayed.await.unwrap(),
        Err(InterceptError::UpstreamHandshake { .. })
    ));
    assert!(recorded.await.unwrap().is_empty(), "the upstream got bytes");
}

#[tokio::test]
async fn a_client_that_speaks_only_h2_or_trusts_another_ca_gets_nothing_through() {
    let f = fixture();
    let (up, recorded) = upstream(&f.upstream_ca, DOMAIN).await;
    let (px, relayed) = proxy(f.interceptor.clone(), up).await;
    let r = sandbox(px, &f.egress_ca, &[b"h2"], &request(DOMAIN)).await;
    assert!(r.is_err(), "an h2-only handshake succeeded: {r:?}");
    assert!(matches!(
        relayed.await.unwrap(),
        Err(InterceptError::SandboxHandshake { .. })
    ));
    // The egress CA is the only thing vouching for the leaf: a sandbox that trusts the
    // upstream's CA instead refuses it.
    let (px, relayed) = proxy(f.interceptor.clone(), up).await;
    let (_, other) = test_ca("not the egress CA");
    let r = sandbox(px, &other, &[b"http/1.1"], &request(DOMAIN)).await;
    assert!(r.is_err(), "a leaf verified without the egress CA: {r:?}");
    assert!(relayed.await.unwrap().is_err());
    // The upstream is connected first (its ALPN decides the offer) but sent nothing.
    recorded.abort();
}

/// What an HTTP/2-capable upstream saw of one request.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    version: hyper::Version,
    path: String,
    authorization: Vec<String>,
    body: Vec<u8>,
}

/// An HTTPS server for DOMAIN (a leaf of `issuer`) offering `h2` and `http/1.1`, serving
/// every connection with hyper in the protocol ALPN chose: it answers each request 200 with
/// "seen <path>" and records it. With `one_per_connection`, an HTTP/2 connection is shut
/// down (GOAWAY) after its first answer, as a server with a request limit does.
async fn upstream_h2(
    issuer: &Issuer<'static, KeyPair>,
    one_per_connection: bool,
) -> (SocketAddr, Arc<std::sync::Mutex<Vec<Seen>>>) {
    use http_body_util::{BodyExt, Full};
    let mut config = server_config(issuer, DOMAIN);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let record = record.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                let answered = Arc::new(tokio::sync::Notify::new());
                let answered_tx = answered.clone();
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let record = record.clone();
                        let answered = answered_tx.clone();
                        async move {
                            let version = req.version();
                            let path = req.uri().path().to_string();
                            let authorization = req
                                .headers()
                                .get_all("authorization")
                                .iter()
                                .map(|v| v.to_str().unwrap().to_string())
                                .collect();
                            let body = req.into_body().collect().await.unwrap().to_bytes().to_vec();
                            let answer = format!("seen {path}");
                            record.lock().unwrap().push(Seen {
                                version,
                                path,
                                authorization,
                                body,
                            });
                            answered.notify_one();
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                                bytes::Bytes::from(answer),
                            )))
                        }
                    },
                );
                let io = hyper_util::rt::TokioIo::new(tls);
                if h2 {
                    let conn = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(io, service);
                    tokio::pin!(conn);
                    if one_per_connection {
                        tokio::select! {
                            _ = &mut conn => return,
                            () = answered.notified() => conn.as_mut().graceful_shutdown(),
                        }
                    }
                    let _ = conn.await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                }
            });
        }
    });
    (addr, seen)
}

/// The sandbox as an HTTP/2 client: TLS to `proxy` trusting the egress CA, offering `h2`
/// and `http/1.1`; the protocol chosen and a request sender.
async fn h2_sandbox(
    proxy: SocketAddr,
    root: &CertificateDer<'static>,
) -> (
    Option<Vec<u8>>,
    hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    JoinHandle<Result<(), hyper::Error>>,
) {
    let tls = connect_sandbox(proxy, root, &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    let alpn = tls.get_ref().1.alpn_protocol().map(|p| p.to_vec());
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    (alpn, send, tokio::spawn(conn))
}

async fn h2_get(
    send: &mut hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    authority: &str,
    path: &str,
    body: &str,
) -> (hyper::StatusCode, String) {
    use http_body_util::BodyExt;
    let req = hyper::Request::post(format!("https://{authority}{path}"))
        .header("authorization", PLACEHOLDER)
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status();
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&text).into_owned())
}

#[tokio::test]
async fn http2_gets_every_stream_filled_and_other_hosts_refused_per_stream() {
    let f = fixture();
    let (up, seen) = upstream_h2(&f.upstream_ca, false).await;
    let (px, relayed) = proxy(f.interceptor.clone(), up).await;
    let (alpn, mut send, _conn) = h2_sandbox(px, &f.egress_ca).await;
    // The upstream took h2, so the sandbox was offered it.
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    let mut a = send.clone();
    let mut b = send.clone();
    // Two streams at once on the one connection, then a third: each is rewritten.
    let (first, second) = tokio::join!(
        h2_get(&mut a, DOMAIN, "/v1/one", "body one"),
        h2_get(&mut b, DOMAIN, "/v1/two", "body two"),
    );
    assert_eq!(first, (hyper::StatusCode::OK, "seen /v1/one".into()));
    assert_eq!(second, (hyper::StatusCode::OK, "seen /v1/two".into()));
    // Another host named inside the TLS: that stream is refused, nothing of it sent.
    let (status, text) = h2_get(&mut send, "evil.test", "/steal", "x").await;
    assert_eq!(status, hyper::StatusCode::FORBIDDEN, "{text}");
    let (status, _) = h2_get(&mut send, &format!("{DOMAIN}:8443"), "/other-port", "x").await;
    assert_eq!(status, hyper::StatusCode::FORBIDDEN);
    // ...and the connection goes on.
    assert_eq!(
        h2_get(&mut send, DOMAIN, "/v1/three", "").await,
        (hyper::StatusCode::OK, "seen /v1/three".into())
    );
    drop((a, b, send));
    relayed.await.unwrap().unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by(|x, y| x.path.cmp(&y.path));
    let paths: Vec<_> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["/v1/one", "/v1/three", "/v1/two"], "{seen:?}");
    for s in &seen {
        assert_eq!(s.version, hyper::Version::HTTP_2);
        assert_eq!(s.authorization, vec![VALUE.to_string()], "{s:?}");
    }
    assert_eq!(seen[0].body, b"body one");
    assert_eq!(seen[2].body, b"body two");
}

#[tokio::test]
async fn a_sandbox_that_takes_http1_from_an_h2_offer_gets_an_http1_upstream() {
    let f = fixture();
    let (up, seen) = upstream_h2(&f.upstream_ca, false).await;
    let (px, relayed) = proxy(f.interceptor.clone(), up).await;
    let (alpn, answer) = sandbox(px, &f.egress_ca, &[b"http/1.1"], &request(DOMAIN))
        .await
        .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.ends_with("seen /v1/x"), "{answer}");
    relayed.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].version, hyper::Version::HTTP_11);
    assert_eq!(seen[0].authorization, vec![VALUE.to_string()]);
}

#[tokio::test]
async fn an_upstream_that_closes_its_http2_connection_closes_the_sandboxs() {
    // A server's GOAWAY (a request limit, an idle timeout) reaches the sandbox's client as a
    // GOAWAY of its own, so that it opens a new connection; before, it kept its connection
    // and got 502 for every stream after.
    let f = fixture();
    let (up, seen) = upstream_h2(&f.upstream_ca, true).await;
    let (px, relayed) = proxy(f.interceptor.clone(), up).await;
    let (_, mut send, conn) = h2_sandbox(px, &f.egress_ca).await;
    assert_eq!(
        h2_get(&mut send, DOMAIN, "/only", "").await,
        (hyper::StatusCode::OK, "seen /only".into())
    );
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), conn).await;
    assert!(
        ended.is_ok(),
        "the sandbox's connection stayed open after the upstream's closed"
    );
    assert!(
        send.ready().await.is_err(),
        "the sandbox's sender is still usable"
    );
    // The relay ended with both connections (the client's close after the GOAWAY may read
    // as a connection error on its side: either way nothing is left running).
    tokio::time::timeout(std::time::Duration::from_secs(10), relayed)
        .await
        .expect("the relay ended")
        .unwrap()
        .ok();
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[test]
fn an_extra_ca_file_must_hold_certificates() {
    let hex = sandcell_proto::random::hex(8).unwrap();
    let path = std::env::temp_dir().join(format!("sc-extra-ca-{hex}.pem"));
    std::fs::write(&path, "not a certificate\n").unwrap();
    let e = sandcell_net::intercept::read_extra_ca(&path).unwrap_err();
    assert!(matches!(e, InterceptError::ExtraCa { .. }), "{e}");
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = p.self_signed(&key).unwrap();
    let (ca, pem) = (cert.der().clone(), cert.pem());
    std::fs::write(&path, pem).unwrap();
    let certs = sandcell_net::intercept::read_extra_ca(&path).unwrap();
    assert_eq!(certs, vec![ca]);
    std::fs::remove_file(&path).unwrap();
}
