//! IPv6 through the daemon on gvisor: a sandbox's network has an IPv6 address and route
//! (runsc's netstack takes them from its interface), and IPv6 destinations obey the same
//! egress rules as IPv4 (`allowOut`/`denyOut` IPv6 CIDRs, live changes). Real
//! `sandcell-serve`, namespaces, nftables and the fake internet (sandcell_net::testing,
//! HTTP on 2001:db8:100::10 and ::20): needs root, runsc, iproute2, nftables, dnsmasq and
//! python3; fails loudly without them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::run;
use hyper::{Method, StatusCode};
use sandcell_client::{Client, Sandbox};
use sandcell_runtime::net::testing::{HTTP6_A, HTTP6_B, Internet};
use serde_json::{Value, json};

async fn create(c: &Client, body: Value) -> Sandbox {
    let mut body = body;
    body["templateID"] = json!("minimal");
    body["timeout"] = json!(300);
    let resp = c
        .api(Method::POST, "/sandboxes", Some(&body))
        .await
        .unwrap();
    assert_eq!(
        resp.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&resp.body)
    );
    serde_json::from_slice(&resp.body).unwrap()
}

/// The body of `GET /` from `[ip]:80` inside the sandbox (busybox nc), or "ERR".
async fn get6(c: &Client, s: &Sandbox, ip: std::net::Ipv6Addr) -> String {
    let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 80");
    let (out, _) = run(c, s, &script).await;
    match out.split_once("\r\n\r\n") {
        Some((head, body)) if head.contains(" 200 ") => body.trim().to_string(),
        _ => "ERR".into(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ipv6_destinations_obey_the_rules_in_gvisor() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let env = common::Env::new();
    let daemon = env.start(&["--net-pool", "10.208.0.0/16", "--net-dns", "198.51.100.53"]);
    let c = &daemon.client;
    let s = create(c, json!({"network": {"denyOut": ["2001:db8:100::20"]}})).await;
    assert_eq!(get6(c, &s, HTTP6_A).await, "hello6-10");
    assert_eq!(get6(c, &s, HTTP6_B).await, "ERR");
    // live: an IPv6 allow makes everything else denied
    let path = format!("/sandboxes/{}/network", s.sandbox_id);
    let resp = c
        .api(
            Method::PUT,
            &path,
            Some(&json!({"allowOut": ["2001:db8:100::20/128"]})),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::NO_CONTENT);
    assert_eq!(get6(c, &s, HTTP6_B).await, "hello6-20");
    assert_eq!(get6(c, &s, HTTP6_A).await, "ERR");
    // a malformed IPv6 rule is a 400
    let resp = c
        .api(
            Method::PUT,
            &path,
            Some(&json!({"allowOut": ["2001:db8::1/32"]})),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::BAD_REQUEST);
    daemon.stop();
}
