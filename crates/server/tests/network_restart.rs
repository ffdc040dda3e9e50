//! A daemon stopped gracefully WITHOUT `--kill-on-exit` leaves its sandboxes running; their
//! DNS server and Host/SNI proxy live in the daemon, so until the next start the sandboxes
//! resolve nothing (queries to the gateway are refused at once, not left hanging). The next
//! start takes the networks over before it listens: names resolve again under the same
//! rules, and private-network members find each other by name again. Real `sandcell-serve`
//! (gvisor), namespaces, nftables and the fake internet (sandcell_net::testing): needs
//! root, runsc, iproute2, nftables, dnsmasq and python3; fails loudly without them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::run;
use hyper::{Method, StatusCode};
use sandcell_client::{Client, Sandbox};
use sandcell_runtime::net::testing::Internet;
use serde_json::{Value, json};

const NET_ARGS: [&str; 4] = ["--net-pool", "10.207.0.0/16", "--net-dns", "198.51.100.53"];

async fn create(c: &Client, body: Value) -> Sandbox {
    let mut body = body;
    body["templateID"] = json!("minimal");
    body["timeout"] = json!(600);
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

/// What `from` gets over HTTP from `name` (resolved by our DNS server) on `port`, or "ERR".
async fn get(c: &Client, from: &Sandbox, name: &str, port: u16) -> String {
    let script = format!(
        "h=$(nslookup {name} 2>/dev/null | awk '/^Address/ && !/:53$/ {{print $2}}' | tail -n 1); \
         [ -n \"$h\" ] || exit 1; \
         printf 'GET / HTTP/1.0\\r\\nHost: {name}\\r\\n\\r\\n' | nc -w 3 $h {port}"
    );
    let (out, _) = run(c, from, &script).await;
    match out.split_once("\r\n\r\n") {
        Some((head, body)) if head.contains(" 200 ") => body.trim().to_string(),
        _ => "ERR".into(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_keeps_sandboxes_and_the_next_start_restores_their_dns() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let env = common::Env::new();
    let daemon = env.start_with(&NET_ARGS);
    let c = &daemon.client;
    let resp = c
        .api(Method::POST, "/networks", Some(&json!({"name": "team"})))
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::CREATED);
    let a = create(
        c,
        json!({"networks": ["team"], "network": {"allowOut": ["allowed.test"]}}),
    )
    .await;
    let b = create(c, json!({"networks": ["team"]})).await;
    let (_, code) = run(
        c,
        &b,
        "mkdir -p /tmp/www && echo from-b > /tmp/www/index.html && httpd -p 8080 -h /tmp/www",
    )
    .await;
    assert_eq!(code, 0);
    assert_eq!(get(c, &a, "allowed.test", 80).await, "hello-10");
    assert_eq!(get(c, &a, &b.sandbox_id, 8080).await, "from-b");
    daemon.stop(); // SIGTERM without --kill-on-exit: the sandboxes keep running

    let mut args = vec!["--kill-on-exit"];
    args.extend(NET_ARGS);
    let daemon = env.start_with(&args);
    let c = &daemon.client;
    // taken over: same rules, a new DNS server and proxy, peer names known again
    assert_eq!(get(c, &a, "allowed.test", 80).await, "hello-10");
    assert_eq!(get(c, &a, "other.test", 80).await, "ERR");
    assert_eq!(get(c, &a, &b.sandbox_id, 8080).await, "from-b");
    daemon.stop();
}
