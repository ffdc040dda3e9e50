//! Sandbox networks through the daemon's API: a real `sandcell-serve` (gvisor), real
//! namespaces and nftables, our DNS server, and a fake "internet" that exists only inside
//! the test (sandcell_net::testing: HTTP on 198.51.100.10 and .20, DNS on .53). Needs
//! root, runsc, iproute2, nftables, dnsmasq and python3: fails loudly without them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::run;
use hyper::{Method, Request, StatusCode};
use sandcell_client::{Client, Sandbox, read_whole};
use sandcell_runtime::net::testing::Internet;
use serde_json::{Value, json};

/// The daemon's options: its own address pool (other tests use others) and the fake
/// internet's DNS server as the upstream.
fn net_args(pool: &str) -> Vec<String> {
    vec![
        "--net-pool".into(),
        pool.into(),
        "--net-dns".into(),
        "198.51.100.53".into(),
    ]
}

fn start(env: &common::Env, pool: &str) -> common::Daemon {
    let mut args = net_args(pool);
    args.extend(["--domain", "sandcell.test", "--https-port", "0"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    env.start(&args)
}

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

/// An HTTP GET from inside the sandbox: the body, or "ERR". busybox nc, and names looked
/// up with busybox nslookup first: the minimal image's static busybox wget crashes in
/// libc's resolver (and with -T) under gVisor.
async fn get(c: &Client, s: &Sandbox, url: &str) -> String {
    let rest = url.trim_start_matches("http://");
    let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "80"));
    let script = format!(
        "h={host}; case $h in *[a-z]*) h=$(nslookup $h 2>/dev/null | \
           awk '/^Address/ && !/:53$/ {{print $2}}' | tail -n 1);; esac; \
         [ -n \"$h\" ] || exit 1; \
         printf 'GET /{path} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n' | nc -w 3 $h {port}"
    );
    let (out, _) = run(c, s, &script).await;
    let ok = out.lines().next().is_some_and(|l| l.contains(" 200 "));
    match out.split_once("\r\n\r\n") {
        Some((_, body)) if ok => body.trim().to_string(),
        _ => "ERR".into(),
    }
}

fn error_of(resp: &sandcell_client::RawResponse, want: StatusCode) {
    assert_eq!(resp.status, want, "{}", String::from_utf8_lossy(&resp.body));
    let v: Value = serde_json::from_slice(&resp.body).unwrap();
    assert_eq!(v["code"], want.as_u16());
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn egress_rules_as_e2b_sends_them() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let env = common::Env::new();
    let daemon = start(&env, "10.202.0.0/16");
    let c = &daemon.client;

    // open by default, names resolve through our DNS server
    let open = create(c, json!({})).await;
    assert_eq!(get(c, &open, "http://198.51.100.10/").await, "hello-10");
    assert_eq!(get(c, &open, "http://other.test/").await, "hello-20");
    // the metadata address and the host's services are refused even when open
    assert_eq!(get(c, &open, "http://169.254.169.254/").await, "ERR");
    assert_eq!(get(c, &open, "http://198.51.100.1:1/").await, "ERR");

    // deny all
    let closed = create(c, json!({"allow_internet_access": false})).await;
    assert_eq!(get(c, &closed, "http://198.51.100.10/").await, "ERR");
    assert_eq!(get(c, &closed, "http://allowed.test/").await, "ERR");

    // allow by CIDR: everything else denied, no names resolve
    let cidr = create(c, json!({"network": {"allowOut": ["198.51.100.20/32"]}})).await;
    assert_eq!(get(c, &cidr, "http://198.51.100.20/").await, "hello-20");
    assert_eq!(get(c, &cidr, "http://198.51.100.10/").await, "ERR");

    // allow by domain and wildcard; a name outside the rules does not resolve and its
    // address is not reachable
    let dom = create(
        c,
        json!({"allow_internet_access": true,
               "network": {"allowOut": ["allowed.test", "*.wild.test"], "denyOut": ["0.0.0.0/0"]}}),
    )
    .await;
    assert_eq!(get(c, &dom, "http://allowed.test/").await, "hello-10");
    assert_eq!(get(c, &dom, "http://a.wild.test/").await, "hello-10");
    assert_eq!(get(c, &dom, "http://other.test/").await, "ERR");
    assert_eq!(get(c, &dom, "http://198.51.100.20/").await, "ERR");
    let (out, _) = run(c, &dom, "nslookup other.test").await;
    assert!(!out.contains("198.51.100.20"), "{out}");

    // live rule change (E2B's update body), then the denied log
    let put = |id: &str, body: Value| {
        let path = format!("/sandboxes/{id}/network");
        async move { c.api(Method::PUT, &path, Some(&body)).await.unwrap() }
    };
    let resp = put(&open.sandbox_id, json!({"denyOut": ["198.51.100.10/32"]})).await;
    assert_eq!(resp.status, StatusCode::NO_CONTENT);
    assert_eq!(get(c, &open, "http://198.51.100.10/").await, "ERR");
    assert_eq!(get(c, &open, "http://198.51.100.20/").await, "hello-20");
    let resp = put(&open.sandbox_id, json!({"allow_internet_access": false})).await;
    assert_eq!(resp.status, StatusCode::NO_CONTENT);
    assert_eq!(get(c, &open, "http://198.51.100.20/").await, "ERR");
    let resp = put(&closed.sandbox_id, json!({})).await;
    assert_eq!(resp.status, StatusCode::NO_CONTENT);
    assert_eq!(get(c, &closed, "http://198.51.100.10/").await, "hello-10");

    let path = format!("/sandboxes/{}/network/log", open.sandbox_id);
    let log = c.api(Method::GET, &path, None).await.unwrap();
    assert_eq!(log.status, StatusCode::OK);
    let log: Value = serde_json::from_slice(&log.body).unwrap();
    let flows = log["flows"].as_array().unwrap();
    for (dest, port) in [("169.254.169.254", 80), ("198.51.100.10", 80)] {
        assert!(
            flows.iter().any(|f| f["dest"] == dest && f["port"] == port),
            "{log}"
        );
    }

    // validation: 400 with E2B's body, at create and on update
    let bad = json!({"templateID": "minimal", "network": {"allowOut": ["10.0.0.1/8"]}});
    error_of(
        &c.api(Method::POST, "/sandboxes", Some(&bad)).await.unwrap(),
        StatusCode::BAD_REQUEST,
    );
    error_of(
        &put(&open.sandbox_id, json!({"denyOut": ["example.com"]})).await,
        StatusCode::BAD_REQUEST,
    );
    // what no rule opens: loopback, metadata, 0/8, the pool, the host; private ranges
    // without --allow-private-egress. Refused naming the entry, at create and on update.
    for entry in [
        "127.0.0.0/8",
        "169.254.169.254",
        "0.0.0.0/8",
        "10.202.0.0/16",
        "198.51.100.1",
        "192.168.0.0/16",
        "::1",
        "fe80::/10",
    ] {
        let bad = json!({"templateID": "minimal", "network": {"allowOut": ["*.wild.test", entry]}});
        let resp = c.api(Method::POST, "/sandboxes", Some(&bad)).await.unwrap();
        error_of(&resp, StatusCode::BAD_REQUEST);
        assert!(
            String::from_utf8_lossy(&resp.body).contains(entry),
            "{entry}"
        );
        let resp = put(&open.sandbox_id, json!({"allowOut": [entry]})).await;
        error_of(&resp, StatusCode::BAD_REQUEST);
        assert!(
            String::from_utf8_lossy(&resp.body).contains(entry),
            "{entry}"
        );
    }
    // the refused updates left the rules as they were (internet off since above)
    assert_eq!(get(c, &open, "http://198.51.100.20/").await, "ERR");
    error_of(
        &put("sc-0000000000000000", json!({})).await,
        StatusCode::NOT_FOUND,
    );
    // another key sees none of it
    let other = c.with_api_key(Some(env.key("other", None).await));
    error_of(
        &other.api(Method::GET, &path, None).await.unwrap(),
        StatusCode::NOT_FOUND,
    );
    daemon.stop();
}

/// A raw request through the daemon's proxy to `port` of sandbox `id`.
async fn via_proxy(c: &Client, id: &str, port: u16) -> (StatusCode, String) {
    let req = Request::get("/")
        .header("E2b-Sandbox-Id", id)
        .header("E2b-Sandbox-Port", port.to_string())
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = read_whole(c.send(req).await.unwrap()).await.unwrap();
    (
        resp.status,
        String::from_utf8_lossy(&resp.body).into_owned(),
    )
}

/// An `Upgrade` request to port 9000 of sandbox `id` by Host routing; after the 101,
/// "ping\n" goes in and what comes back is returned.
async fn upgrade_echo(url: &str, id: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET /ws HTTP/1.1\r\nHost: 9000-{id}.sandcell.test\r\nUpgrade: echo\r\n\
         Connection: Upgrade\r\n\r\n"
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(common::GUARD, conn.read(&mut byte))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 1, "closed after {}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    conn.write_all(b"ping\n").await.unwrap();
    let mut back = [0u8; 5];
    tokio::time::timeout(common::GUARD, conn.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&back).trim().to_string()
}

/// Serves `text` on port 8080 inside the sandbox (busybox httpd).
async fn serve(c: &Client, s: &Sandbox, text: &str) {
    let script = format!(
        "mkdir -p /tmp/www && echo {text} > /tmp/www/index.html && httpd -p 8080 -h /tmp/www"
    );
    let (_, code) = run(c, s, &script).await;
    assert_eq!(code, 0);
}

async fn reach(c: &Client, from: &Sandbox, host: &str) -> String {
    get(c, from, &format!("http://{host}:8080/")).await
}

#[tokio::test(flavor = "multi_thread")]
async fn private_networks_keys_and_ports_by_url() {
    let env = common::Env::new();
    let daemon = start(&env, "10.203.0.0/16");
    let alice = &daemon.client;
    let bob = &alice.with_api_key(Some(env.key("bob", None).await));

    let resp = alice
        .api(Method::POST, "/networks", Some(&json!({"name": "team"})))
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::CREATED);
    error_of(
        &alice
            .api(Method::POST, "/networks", Some(&json!({"name": "team"})))
            .await
            .unwrap(),
        StatusCode::CONFLICT,
    );
    error_of(
        &alice
            .api(
                Method::POST,
                "/networks",
                Some(&json!({"name": "Bad Name"})),
            )
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
    );
    // a network belongs to its key: another key neither sees nor joins it
    let listed = bob.api(Method::GET, "/networks", None).await.unwrap();
    assert_eq!(listed.body.as_ref(), b"[]");
    let join = json!({"templateID": "minimal", "networks": ["team"]});
    error_of(
        &bob.api(Method::POST, "/sandboxes", Some(&join))
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
    );

    let a1 = create(alice, json!({"networks": ["team"]})).await;
    let a2 = create(alice, json!({"allow_internet_access": false})).await;
    let b1 = create(bob, json!({})).await;
    for s in [&a1, &a2] {
        serve(alice, s, &format!("from-{}", s.sandbox_id)).await;
    }
    serve(bob, &b1, "from-bob").await;

    // ports by URL: the proxy reaches a port served inside, even with no egress at all
    let (status, body) = via_proxy(alice, &a2.sandbox_id, 8080).await;
    assert_eq!(
        (status, body.trim()),
        (StatusCode::OK, &*format!("from-{}", a2.sandbox_id))
    );
    // the same by Host: <port>-<id>.<domain>
    let req = Request::get("/")
        .header("Host", format!("8080-{}.sandcell.test", a2.sandbox_id))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = read_whole(alice.send(req).await.unwrap()).await.unwrap();
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(
        String::from_utf8_lossy(&resp.body).trim(),
        format!("from-{}", a2.sandbox_id)
    );
    // and a protocol switch (what WebSocket does): a 101 from inside, then bytes both ways
    let script = r#"cat > /tmp/up.sh <<'EOF'
#!/bin/sh
while read -r l; do [ "$l" = "$(printf '\r')" ] && break; done
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n'
exec cat
EOF
chmod +x /tmp/up.sh && (setsid nc -ll -p 9000 -e /tmp/up.sh </dev/null >/dev/null 2>&1 &)
for i in $(seq 50); do netstat -ltn | grep -q ':9000 ' && exit 0; sleep 0.1; done; exit 1"#;
    let (_, code) = run(alice, &a2, script).await;
    assert_eq!(code, 0);
    assert_eq!(upgrade_echo(&daemon.url, &a2.sandbox_id).await, "ping");
    // allowPublicTraffic: false: the ports want the traffic token
    let body = json!({"templateID": "minimal", "network": {"allowPublicTraffic": false}});
    let resp = alice
        .api(Method::POST, "/sandboxes", Some(&body))
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::CREATED);
    let v: Value = serde_json::from_slice(&resp.body).unwrap();
    let token = v["trafficAccessToken"].as_str().unwrap().to_string();
    let private: Sandbox = serde_json::from_value(v).unwrap();
    serve(alice, &private, "private").await;
    let (status, _) = via_proxy(alice, &private.sandbox_id, 8080).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let req = Request::get("/")
        .header("E2b-Sandbox-Id", &private.sandbox_id)
        .header("E2b-Sandbox-Port", "8080")
        .header("E2b-Traffic-Access-Token", &token)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = read_whole(alice.send(req).await.unwrap()).await.unwrap();
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&resp.body).trim(), "private");

    let (status, body) = via_proxy(alice, &a2.sandbox_id, 8081).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains("port is not open"), "{body}");

    // a2 is not in the network yet: a1's name does not resolve for it, its address is
    // closed to it; then it joins live and reaches a1 by name
    assert_eq!(reach(alice, &a2, &a1.sandbox_id).await, "ERR");
    let path = format!("/sandboxes/{}/networks/team", a2.sandbox_id);
    let resp = alice.api(Method::POST, &path, None).await.unwrap();
    assert_eq!(resp.status, StatusCode::NO_CONTENT);
    assert_eq!(
        reach(alice, &a2, &a1.sandbox_id).await.trim(),
        format!("from-{}", a1.sandbox_id)
    );
    assert_eq!(
        reach(alice, &a1, &a2.sandbox_id).await.trim(),
        format!("from-{}", a2.sandbox_id)
    );
    let (out, _) = run(alice, &a2, &format!("nslookup {}", a1.sandbox_id)).await;
    let a1_ip = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Address:"))
        .map(str::trim)
        .find(|a| a.starts_with("10.203."))
        .unwrap_or_else(|| panic!("no address for a1: {out}"))
        .to_string();

    // another key's sandbox reaches neither, by name or by address, and is not reached
    assert_eq!(reach(bob, &b1, &a1.sandbox_id).await, "ERR");
    assert_eq!(reach(bob, &b1, &a1_ip).await, "ERR");
    let (out, _) = run(
        bob,
        &b1,
        "ip -4 -o addr show 2>/dev/null; ifconfig 2>/dev/null",
    )
    .await;
    let b1_ip = out
        .split(|c: char| c.is_whitespace() || c == '/' || c == ':')
        .find(|w| w.starts_with("10.203."))
        .unwrap_or_else(|| panic!("no address for b1: {out}"))
        .to_string();
    assert_eq!(reach(alice, &a1, &b1_ip).await, "ERR");

    let nets = alice.api(Method::GET, "/networks", None).await.unwrap();
    let nets: Value = serde_json::from_slice(&nets.body).unwrap();
    assert_eq!(nets[0]["name"], "team");
    assert_eq!(nets[0]["members"].as_array().unwrap().len(), 2, "{nets}");

    // leaving (and deleting the network) closes it again
    let resp = alice.api(Method::DELETE, &path, None).await.unwrap();
    assert_eq!(resp.status, StatusCode::NO_CONTENT);
    assert_eq!(reach(alice, &a2, &a1_ip).await, "ERR");
    let resp = alice
        .api(Method::DELETE, "/networks/team", None)
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::NO_CONTENT);
    error_of(
        &alice
            .api(Method::DELETE, "/networks/team", None)
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
    );
    daemon.stop();
}

/// Our networks (host veth aliases) whose id starts with `prefix`.
fn networks_with_prefix(prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
        let alias = std::fs::read_to_string(e.path().join("ifalias")).unwrap_or_default();
        if let Some(id) = alias.trim().strip_prefix("sandcell:")
            && id.starts_with(prefix)
        {
            found.push(id.to_string());
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_daemon_takes_over_networks_and_removes_leftovers() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let env = common::Env::new();
    let prefix = sandcell_server::networks::service::prefix_for(&env.data());
    let daemon = start(&env, "10.205.0.0/16");
    let c = &daemon.client;
    let s = create(c, json!({"network": {"allowOut": ["allowed.test"]}})).await;
    assert_eq!(get(c, &s, "http://allowed.test/").await, "hello-10");
    // the sandbox's network and the prepared ones
    assert!(networks_with_prefix(&prefix).len() >= 2);
    daemon.kill9();

    let daemon = start(&env, "10.205.0.0/16");
    let c = &daemon.client;
    // the same rules, a new DNS server: names resolve and the rules hold
    assert_eq!(get(c, &s, "http://allowed.test/").await, "hello-10");
    assert_eq!(get(c, &s, "http://other.test/").await, "ERR");
    // and they can still be changed live
    let path = format!("/sandboxes/{}/network", s.sandbox_id);
    let resp = c
        .api(
            Method::PUT,
            &path,
            Some(&json!({"allowOut": ["198.51.100.20"]})),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::NO_CONTENT);
    assert_eq!(get(c, &s, "http://198.51.100.20/").await, "hello-20");
    // the dead daemon's prepared networks are gone: what is left is the sandbox's and the
    // new pool's (2)
    let left = networks_with_prefix(&prefix);
    assert!(left.len() <= 3, "{left:?}");
    daemon.stop();
    // --kill-on-exit: the sandbox went, and with the pool drained nothing of ours is left
    assert_eq!(networks_with_prefix(&prefix), Vec::<String>::new());
}
