//! A hostile registry: a real HTTP front (here, on loopback) before a real `docker-registry`
//! that answers some requests itself: redirects to internal addresses, a token realm on one,
//! a 256 MiB manifest or token answer, a long error body, a token server of its own. The
//! pull must fail clearly, the internal "canary" service must see no connection at all, and
//! the oversized manifest or token answer must be refused at the cap, not read whole. A
//! redirect to an address the operator allowed (the CDN case) works, and so does a bearer
//! token from the registry's realm.
//!
//! The front and the registry are on loopback, so they are listed as insecure registries,
//! as an operator would list a registry of theirs; the canary is not.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sandcell_image::cache::BlobCache;
use sandcell_image::registry::{PullOptions, pull};
use sandcell_image::{Error, NoProgress};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Far more than the client may hold: the document cap, what the kernel buffers on both
/// ends of a loopback connection (see `buffered`), and hyper's read buffer.
const HUGE: u64 = 256 << 20;

/// The most a connection's two socket buffers can hold here: the receive buffer's autotuning
/// ceiling (`tcp_rmem` max, 32 MiB on our hosts) plus the send buffer's (`tcp_wmem` max).
/// Bytes in them were written by the front but never taken by the pull.
fn buffered() -> u64 {
    let max = |file: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{file}"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(2).and_then(|n| n.parse().ok()))
            .unwrap_or(32 << 20)
    };
    max("tcp_rmem") + max("tcp_wmem")
}

/// What a pull that stopped at `limit` can have made the front write, with margin for
/// hyper's buffer; well under `HUGE`, so a pull that read on would exceed it.
fn most_written(limit: u64) -> u64 {
    let most = limit + buffered() + (2 << 20);
    assert!(
        most < HUGE / 2,
        "socket buffers of {most} bytes leave the test no margin"
    );
    most
}

/// What the front answers itself, for requests whose path contains the `&str`.
#[derive(Clone)]
enum Rule {
    /// 307 to this base followed by the request's path.
    Redirect(&'static str, String),
    /// 200 with 256 MiB of JSON-ish bytes, with or without a `Content-Length`.
    Huge(&'static str, bool),
    /// 404 with a 1 MiB body full of control bytes.
    LongError(&'static str),
    /// 500 with a 256 MiB body, no `Content-Length`.
    HugeError(&'static str),
    /// 401 with a bearer challenge whose realm is this URL.
    Realm(&'static str, String),
    /// A token server on this front: `/token` answers `{"<field>": "<token>"}` to a pull
    /// token request for `test/app` (400 otherwise); a `/v2/` request without
    /// `Authorization: Bearer <token>` gets a 401 whose realm is that `/token`, one with it
    /// goes to the registry.
    Bearer {
        field: &'static str,
        token: &'static str,
    },
}

struct Front {
    port: u16,
    /// Bytes of the huge body written before the client went away.
    sent: Arc<AtomicU64>,
}

impl Front {
    async fn start(registry: String, rules: Vec<Rule>) -> Front {
        Front::start_with(registry, |_| rules).await
    }

    /// With rules that name the front's own port.
    async fn start_with(registry: String, rules: impl FnOnce(u16) -> Vec<Rule>) -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let rules = rules(port);
        let host = format!("127.0.0.1:{port}");
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        tokio::spawn(async move {
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                let (registry, rules, sent) = (registry.clone(), rules.clone(), counter.clone());
                let host = host.clone();
                tokio::spawn(async move { answer(conn, &host, &registry, &rules, &sent).await });
            }
        });
        Front { port, sent }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

async fn answer(mut conn: TcpStream, host: &str, registry: &str, rules: &[Rule], sent: &AtomicU64) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await.unwrap_or(0) == 0 {
            return;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let path = text.split(' ').nth(1).unwrap_or("/").to_string();
    for rule in rules {
        match rule {
            Rule::Redirect(part, to) if path.contains(part) => {
                let reply = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}{path}\r\n\
                     Content-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                return;
            }
            Rule::Realm(part, realm) if path.contains(part) => {
                let reply = format!(
                    "HTTP/1.1 401 Unauthorized\r\nWww-Authenticate: Bearer realm=\"{realm}\",\
                     service=\"evil\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                return;
            }
            Rule::Bearer { field, token } if path.starts_with("/token") => {
                let wanted = ["scope=repository%3Atest%2Fapp%3Apull", "service=front%22s"];
                let reply = if wanted.iter().all(|w| path.contains(w)) {
                    let body = format!("{{\"{field}\":\"{token}\",\"expires_in\":300}}");
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                } else {
                    "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_string()
                };
                let _ = conn.write_all(reply.as_bytes()).await;
                return;
            }
            Rule::Bearer { token, .. }
                if path.starts_with("/v2/")
                    && !text.to_ascii_lowercase().contains(
                        &format!("\r\nauthorization: bearer {token}\r\n").to_ascii_lowercase(),
                    ) =>
            {
                // The service quoted with an escape in it (`front"s`).
                let reply = format!(
                    "HTTP/1.1 401 Unauthorized\r\nWww-Authenticate: Bearer \
                     realm=\"http://{host}/token\",service=\"front\\\"s\"\r\n\
                     Content-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                return;
            }
            Rule::Huge(part, _) | Rule::HugeError(part) if path.contains(part) => {
                let status = if matches!(rule, Rule::HugeError(_)) {
                    "500 Internal Server Error"
                } else {
                    "200 OK"
                };
                let length = matches!(rule, Rule::Huge(_, true));
                let mut reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                     Docker-Content-Digest: sha256:0000000000000000000000000000000000000000000000000000000000000000\r\n\
                     Connection: close\r\n",
                );
                if length {
                    reply.push_str(&format!("Content-Length: {HUGE}\r\n"));
                }
                reply.push_str("\r\n");
                if conn.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 64 << 10];
                while sent.load(Ordering::SeqCst) < HUGE {
                    if conn.write_all(&chunk).await.is_err() {
                        return;
                    }
                    sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                }
                return;
            }
            Rule::LongError(part) if path.contains(part) => {
                let body: Vec<u8> = (0..1u32 << 20)
                    .map(|i| if i % 7 == 0 { b'\x1b' } else { b'A' })
                    .collect();
                let reply = format!(
                    "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                let _ = conn.write_all(&body).await;
                return;
            }
            _ => {}
        }
    }
    // Everything else: the real registry (the guard asked for `Connection: close`).
    let Ok(mut up) = TcpStream::connect(registry).await else {
        return;
    };
    if up.write_all(&head).await.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
    }
}

/// An internal service that must never be reached: counts connections.
async fn canary() -> (u16, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicU64::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, hits)
}

/// A registry with `test/app:v1` in it.
fn registry_with_image(tmp: &std::path::Path) -> Registry {
    let registry = Registry::start(None);
    let mut layout = Layout::new(&tmp.join("layout"));
    let desc = layout.image(&layered_image_layers(), "amd64", layered_image_config());
    layout.tag(desc, "v1");
    push(
        &layout.dir,
        "v1",
        &format!("{}/test/app:v1", registry.host()),
        None,
    );
    registry
}

async fn pull_via(front: &Front, registry: &Registry, data: &std::path::Path) -> Result<(), Error> {
    let options = PullOptions {
        insecure_registries: vec![front.host(), registry.host()],
        ..PullOptions::default()
    };
    let cache = BlobCache::in_data_dir(data);
    pull(
        &format!("{}/test/app:v1", front.host()),
        &cache,
        &options,
        &NoProgress,
    )
    .await
    .map(|_| ())
}

#[tokio::test(flavor = "multi_thread")]
async fn redirects_and_realms_to_internal_addresses_reach_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = registry_with_image(tmp.path());
    let (port, hits) = canary().await;
    let cases = [
        // The manifest, fetched by our client: plain HTTP elsewhere, TLS to loopback, the
        // cloud metadata address.
        Rule::Redirect("/manifests/", format!("http://127.0.0.1:{port}")),
        Rule::Redirect("/manifests/", format!("https://127.0.0.1:{port}")),
        Rule::Redirect("/manifests/", "https://169.254.169.254".into()),
        // A blob: its redirects go through the guard too.
        Rule::Redirect("/blobs/", format!("https://127.0.0.1:{port}")),
        Rule::Redirect("/blobs/", format!("http://127.0.0.1:{port}")),
        // The token realm of a bearer challenge.
        Rule::Realm("/v2/", format!("http://127.0.0.1:{port}/token")),
        Rule::Realm("/v2/", format!("https://127.0.0.1:{port}/token")),
    ];
    for (i, rule) in cases.into_iter().enumerate() {
        let front = Front::start(registry.host(), vec![rule]).await;
        let err = pull_via(&front, &registry, &tmp.path().join(format!("d{i}")))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::PullRefused { .. }), "case {i}: {text}");
        assert!(
            text.contains("internal address") || text.contains("plain HTTP"),
            "case {i}: {text}"
        );
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the canary was reached");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_redirect_to_an_allowed_address_still_works() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = registry_with_image(tmp.path());
    // The CDN case: blobs answered by another host the policy allows (here the registry
    // itself, listed by the operator).
    let front = Front::start(
        registry.host(),
        vec![Rule::Redirect(
            "/blobs/",
            format!("http://{}", registry.host()),
        )],
    )
    .await;
    pull_via(&front, &registry, &tmp.path().join("data"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_manifest_is_refused_at_the_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = registry_with_image(tmp.path());
    for length in [false, true] {
        let front = Front::start(registry.host(), vec![Rule::Huge("/manifests/", length)]).await;
        let err = pull_via(&front, &registry, &tmp.path().join("data"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::DocumentTooLarge { limit, .. } if limit == 4 << 20),
            "{err}"
        );
        // Read no further than the cap (plus what the sockets buffer): the pull went
        // away long before the 256 MiB were written.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let sent = front.sent.load(Ordering::SeqCst);
        assert!(
            sent < most_written(4 << 20),
            "{sent} bytes of the manifest were taken"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_error_body_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = registry_with_image(tmp.path());
    for part in ["/manifests/", "/blobs/"] {
        let front = Front::start(registry.host(), vec![Rule::HugeError(part)]).await;
        let err = pull_via(&front, &registry, &tmp.path().join("data"))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::RegistryStatus { .. }), "{part}: {err}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let sent = front.sent.load(Ordering::SeqCst);
        assert!(
            sent < most_written(1 << 20),
            "{part}: {sent} bytes of the error were taken"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_error_body_is_bounded_and_printable() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = registry_with_image(tmp.path());
    for part in ["/manifests/", "/blobs/"] {
        let front = Front::start(registry.host(), vec![Rule::LongError(part)]).await;
        let text = pull_via(&front, &registry, &tmp.path().join("data"))
            .await
            .unwrap_err()
            .to_string();
        assert!(text.len() < 1024, "{part}: {} bytes of reason", text.len());
        assert!(!text.contains('\x1b'), "{part}: {text}");
        assert!(
            text.contains("404") || text.contains("AAAA"),
            "{part}: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_token_answer_is_refused_at_the_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = registry_with_image(tmp.path());
    for length in [false, true] {
        // The registry's challenge names a realm on the front itself, which answers 256 MiB.
        let front = Front::start_with(registry.host(), |port| {
            vec![
                Rule::Realm("/v2/", format!("http://127.0.0.1:{port}/token")),
                Rule::Huge("/token", length),
            ]
        })
        .await;
        let err = pull_via(&front, &registry, &tmp.path().join("data"))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, Error::TokenTooLarge { limit, .. } if limit == 64 << 10),
            "{text}"
        );
        assert!(text.contains(&front.host()), "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let sent = front.sent.load(Ordering::SeqCst);
        assert!(
            sent < most_written(64 << 10),
            "{sent} bytes of the token answer were taken"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bearer_token_from_the_realm_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = registry_with_image(tmp.path());
    for (i, field) in ["token", "access_token"].into_iter().enumerate() {
        let front = Front::start(
            registry.host(),
            vec![Rule::Bearer {
                field,
                token: "t0k3n.abc-DEF_1",
            }],
        )
        .await;
        pull_via(&front, &registry, &tmp.path().join(format!("d{i}")))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_realm_error_is_bounded_and_printable() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = registry_with_image(tmp.path());
    let front = Front::start_with(registry.host(), |port| {
        vec![
            Rule::Realm("/v2/", format!("http://127.0.0.1:{port}/token")),
            Rule::LongError("/token"),
        ]
    })
    .await;
    let err = pull_via(&front, &registry, &tmp.path().join("data"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Token { .. }), "{text}");
    assert!(text.len() < 1024, "{} bytes of reason", text.len());
    assert!(!text.contains('\x1b'), "{text}");
    assert!(
        text.contains("404") && text.contains(&front.host()),
        "{text}"
    );
}
