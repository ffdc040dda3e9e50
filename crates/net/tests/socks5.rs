//! The SOCKS5 client (socks5.rs) against a real SOCKS5 server, pproxy from PyPI
//! (testing::Socks5Server), on loopback: a login that works, one that does not, no login to
//! a server that wants one, remote DNS, a server that is down, one that does not speak
//! SOCKS5, one that never answers. Needs python3 and, the first time, PyPI.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell_net::socks5::{self, Credentials, Socks5Error, Target};
use sandcell_net::testing::Socks5Server;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const T: Duration = Duration::from_secs(10);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An upstream that answers each connection with "hello <peer address>" and closes.
async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = l.accept().await {
            let _ = s.write_all(format!("hello {peer}").as_bytes()).await;
        }
    });
    addr
}

async fn read_all(mut s: tokio::net::TcpStream) -> String {
    let mut v = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut v))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8(v).unwrap()
}

fn creds(u: &str, p: &str) -> Credentials {
    Credentials {
        username: u.into(),
        password: p.into(),
    }
}

#[tokio::test]
async fn connects_through_pproxy_with_and_without_the_right_login() {
    let up = upstream().await;
    let proxy: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let server = Socks5Server::start(proxy, Some(("alice", "s3cret")), None, None).unwrap();

    let good = creds("alice", "s3cret");
    let s = socks5::connect(proxy, Some(&good), &Target::Addr(up), T)
        .await
        .unwrap();
    let said = read_all(s).await;
    assert!(said.starts_with("hello 127.0.0.1:"), "{said}");
    // By name: the proxy resolves it (ATYP 3).
    let s = socks5::connect(
        proxy,
        Some(&good),
        &Target::Name("localhost".into(), up.port()),
        T,
    )
    .await
    .unwrap();
    assert!(read_all(s).await.starts_with("hello "));
    let log = server.log();
    assert!(
        log.contains(&format!("-> 127.0.0.1:{}", up.port()))
            && log.contains(&format!("-> localhost:{}", up.port())),
        "{log}"
    );

    let e = socks5::connect(proxy, Some(&creds("alice", "wrong")), &Target::Addr(up), T)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Socks5Error::AuthFailed | Socks5Error::Io(_)),
        "{e:?}"
    );
    assert!(
        server.log().contains("Unauthorized SOCKS"),
        "{}",
        server.log()
    );
    // No login at all to a server that wants one.
    let e = socks5::connect(proxy, None, &Target::Addr(up), T)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Socks5Error::NoAcceptableMethod | Socks5Error::Io(_)),
        "{e:?}"
    );
    // The target refuses: the proxy says so, or (pproxy answers success before it
    // connects) closes the stream without a byte.
    let closed: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    if let Ok(s) = socks5::connect(proxy, Some(&good), &Target::Addr(closed), T).await {
        let mut s = s;
        let mut v = Vec::new();
        let r = tokio::time::timeout(T, s.read_to_end(&mut v))
            .await
            .unwrap();
        assert!(r.is_err() || v.is_empty(), "{v:?}");
    }
    drop(server);
    // Down: the connect fails, promptly.
    let e = socks5::connect(proxy, Some(&good), &Target::Addr(up), T)
        .await
        .unwrap_err();
    assert!(matches!(e, Socks5Error::Connect { .. }), "{e:?}");
}

#[tokio::test]
async fn a_proxy_without_login_takes_a_client_with_credentials() {
    let up = upstream().await;
    let proxy: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _server = Socks5Server::start(proxy, None, None, None).unwrap();
    let s = socks5::connect(proxy, Some(&creds("u", "p")), &Target::Addr(up), T)
        .await
        .unwrap();
    assert!(read_all(s).await.starts_with("hello "));
    let s = socks5::connect(proxy, None, &Target::Addr(up), T)
        .await
        .unwrap();
    assert!(read_all(s).await.starts_with("hello "));
}

#[tokio::test]
async fn what_is_not_a_socks5_proxy_fails_within_the_timeout() {
    // Speaks HTTP.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\n").await;
        }
    });
    let target = Target::Name("example.test".into(), 80);
    let e = socks5::connect(http, None, &target, T).await.unwrap_err();
    assert!(matches!(e, Socks5Error::NotSocks5(b'H')), "{e:?}");
    // Never answers.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    let begun = std::time::Instant::now();
    let e = socks5::connect(silent, None, &target, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(e, Socks5Error::Timeout(_)), "{e:?}");
    assert!(begun.elapsed() < Duration::from_secs(5));
}
