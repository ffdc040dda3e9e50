//! E2B's `network.egressProxy` through the daemon's API: a real `sandcell-serve` (gvisor),
//! real namespaces and nftables, the fake internet (sandcell_net::testing: HTTP on
//! 198.51.100.10 and .20, DNS on .53) and a real SOCKS5 server in it, pproxy from PyPI
//! (testing::Socks5Server, pinned) on 198.51.100.2. pproxy's log names every connection it
//! carried, with the daemon's address as the client. Needs root, runsc, iproute2,
//! nftables, dnsmasq, python3 and (the first time) PyPI: fails loudly without them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::run;
use hyper::{Method, StatusCode};
use sandcell_client::{Client, Sandbox};
use sandcell_runtime::net::testing::{DNS, Internet, NETNS, Socks5Server};
use serde_json::{Value, json};
use std::net::SocketAddr;

const PROXY: &str = "198.51.100.2:1080";
const OTHER_PROXY: &str = "198.51.100.2:1081";
const PASSWORD: &str = "pw-4e1c9b";

/// No regular file directly in `dir` holds [`PASSWORD`]'s bytes.
fn assert_no_password_in(dir: &std::path::Path) {
    let mut scanned = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let found = bytes
            .windows(PASSWORD.len())
            .any(|w| w == PASSWORD.as_bytes());
        assert!(!found, "{} holds the proxy password", path.display());
        if path.to_string_lossy().contains(".db") || path.to_string_lossy().contains("sqlite") {
            scanned += 1;
        }
    }
    assert!(scanned > 0, "no database file in {}", dir.display());
}

fn pproxy(addr: &str, auth: Option<(&str, &str)>) -> Socks5Server {
    let addr: SocketAddr = addr.parse().unwrap();
    Socks5Server::start(addr, auth, Some(NETNS), Some(DNS)).unwrap()
}

async fn call(c: &Client, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let resp = c.api(method, path, body.as_ref()).await.unwrap();
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    assert!(
        !text.contains(PASSWORD),
        "the proxy's password came back: {text}"
    );
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (resp.status, value)
}

async fn create(c: &Client, network: Value) -> Sandbox {
    let body = json!({"templateID": "minimal", "timeout": 300, "network": network});
    let (status, v) = call(c, Method::POST, "/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    serde_json::from_value(v).unwrap()
}

/// An HTTP GET from inside the sandbox: the body, or "ERR" (as tests/network.rs: busybox
/// nslookup, then nc). nc's stdin stays open a while after the request: on a half-close
/// pproxy closes both ways at once, before the answer (curl and the like never
/// half-close).
async fn get(c: &Client, s: &Sandbox, url: &str) -> String {
    let rest = url.trim_start_matches("http://");
    let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "80"));
    let script = format!(
        "h={host}; case $h in *[a-z]*) h=$(nslookup $h 2>/dev/null | \
           awk '/^Address/ && !/:53$/ {{print $2}}' | tail -n 1);; esac; \
         [ -n \"$h\" ] || exit 1; \
         {{ printf 'GET /{path} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n'; sleep 2; }} | nc -w 3 $h {port}"
    );
    let (out, _) = run(c, s, &script).await;
    let ok = out.lines().next().is_some_and(|l| l.contains(" 200 "));
    match out.split_once("\r\n\r\n") {
        Some((_, body)) if ok => body.trim().to_string(),
        _ => "ERR".into(),
    }
}

async fn put_network(c: &Client, id: &str, body: Value) -> (StatusCode, Value) {
    call(
        c,
        Method::PUT,
        &format!("/sandboxes/{id}/network"),
        Some(body),
    )
    .await
}

async fn shown_proxy(c: &Client, id: &str) -> Value {
    let (status, v) = call(c, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["network"]["egressProxy"].clone()
}

fn bad_request(status: StatusCode, v: &Value) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["code"], 400, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
}

/// How many connections to `target` pproxy carried for the daemon (198.51.100.1).
fn carried(p: &Socks5Server, target: &str) -> usize {
    p.log()
        .lines()
        .filter(|l| l.starts_with("socks5 198.51.100.1:") && l.ends_with(&format!("-> {target}")))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn egress_proxy_as_e2b_sends_it() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let mut proxy = pproxy(PROXY, Some(("alice", PASSWORD)));
    let env = common::Env::new();
    let daemon = env.start(&["--net-pool", "10.214.0.0/16", "--net-dns", "198.51.100.53"]);
    let c = &daemon.client;
    let with_login = json!({"address": PROXY, "username": "alice", "password": PASSWORD});

    // Refused at create, with E2B's error body: addresses sandboxes never reach, by IP or
    // by name, and malformed ones. Nothing is left behind.
    for bad in [
        json!({"address": "10.1.2.3:1080"}),
        json!({"address": "127.0.0.1:1080"}),
        json!({"address": "localhost:1080"}),
        json!({"address": "169.254.169.254:80"}),
        json!({"address": "10.214.0.1:1080"}),
        json!({"address": "198.51.100.2"}),
        json!({"address": "socks5://198.51.100.2:1080"}),
        json!({"address": PROXY, "password": PASSWORD}),
        json!({"address": PROXY, "username": "alice"}),
        json!({"address": PROXY, "username": "x".repeat(256)}),
    ] {
        let body = json!({"templateID": "minimal", "network": {"egressProxy": bad}});
        let (status, v) = call(c, Method::POST, "/sandboxes", Some(body)).await;
        bad_request(status, &v);
    }
    let (_, list) = call(c, Method::GET, "/sandboxes", None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(0), "{list}");

    // Open rules: the sandbox's TCP leaves through the proxy, the daemon its client.
    let open = create(c, json!({"egressProxy": with_login})).await;
    let id = &open.sandbox_id;
    assert_eq!(get(c, &open, "http://198.51.100.10/").await, "hello-10");
    assert_eq!(carried(&proxy, "198.51.100.10:80"), 1, "{}", proxy.log());
    // Shown without the password (`call` checks every answer for it).
    assert_eq!(
        shown_proxy(c, id).await,
        json!({"address": PROXY, "username": "alice"})
    );
    // Another key sees nothing of it, and cannot change it.
    let other = Client::new(&daemon.url, Some(env.key("other", None).await)).unwrap();
    let (status, _) = call(&other, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = put_network(&other, id, json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A domain rule: SNI/Host checked here, then the proxy is asked for the name (it
    // resolves it: E2B's "remote DNS"). Other names still get nothing.
    let dom = create(
        c,
        json!({"allowOut": ["allowed.test"], "denyOut": ["0.0.0.0/0"], "egressProxy": with_login}),
    )
    .await;
    // The proxy resolves it: it may take allowed.test's AAAA (the IPv6 server of .10).
    let got = get(c, &dom, "http://allowed.test/").await;
    assert!(got == "hello-10" || got == "hello6-10", "{got}");
    assert_eq!(carried(&proxy, "allowed.test:80"), 1, "{}", proxy.log());
    assert_eq!(get(c, &dom, "http://198.51.100.20/").await, "ERR");
    assert_eq!(carried(&proxy, "198.51.100.20:80"), 0, "{}", proxy.log());

    // Wrong credentials: the proxy refuses the login, the sandbox's connection fails.
    let wrong = json!({"address": PROXY, "username": "alice", "password": "nope"});
    let (status, v) = put_network(c, id, json!({"egressProxy": wrong})).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(get(c, &open, "http://198.51.100.10/").await, "ERR");
    assert!(
        proxy.log().contains("Unauthorized SOCKS"),
        "{}",
        proxy.log()
    );

    // The proxy down: fails closed (never a direct connection).
    let (status, v) = put_network(c, id, json!({"egressProxy": with_login})).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(get(c, &open, "http://198.51.100.20/").await, "hello-20");
    proxy.stop();
    assert_eq!(get(c, &open, "http://198.51.100.20/").await, "ERR");

    // Switched live to another proxy (no login), then removed: direct again.
    let other_proxy = pproxy(OTHER_PROXY, None);
    let (status, v) = put_network(c, id, json!({"egressProxy": {"address": OTHER_PROXY}})).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(get(c, &open, "http://198.51.100.20/").await, "hello-20");
    assert_eq!(
        carried(&other_proxy, "198.51.100.20:80"),
        1,
        "{}",
        other_proxy.log()
    );
    assert_eq!(shown_proxy(c, id).await, json!({"address": OTHER_PROXY}));
    let (status, v) = put_network(c, id, json!({})).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(shown_proxy(c, id).await, Value::Null);
    assert_eq!(get(c, &open, "http://198.51.100.10/").await, "hello-10");
    assert_eq!(
        carried(&other_proxy, "198.51.100.10:80"),
        0,
        "{}",
        other_proxy.log()
    );

    // Refused on update as at create; the proxy in force stays as it was.
    let (status, v) = put_network(
        c,
        id,
        json!({"egressProxy": {"address": "192.168.1.1:1080"}}),
    )
    .await;
    bad_request(status, &v);
    assert_eq!(shown_proxy(c, id).await, Value::Null);
}

/// A daemon stopped without `--kill-on-exit` leaves the sandbox running; the next one takes
/// its network over with the proxy in force again (from the record, password included),
/// never with a direct way out.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_daemon_puts_the_proxy_back() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let mut proxy = pproxy(PROXY, Some(("bob", PASSWORD)));
    let env = common::Env::new();
    let net_args = ["--net-pool", "10.215.0.0/16", "--net-dns", "198.51.100.53"];
    let daemon = env.start_with(&net_args);
    let login = json!({"address": PROXY, "username": "bob", "password": PASSWORD});
    let s = create(&daemon.client, json!({"egressProxy": login})).await;
    assert_eq!(
        get(&daemon.client, &s, "http://198.51.100.10/").await,
        "hello-10"
    );
    assert_eq!(carried(&proxy, "198.51.100.10:80"), 1, "{}", proxy.log());
    // The password is sealed at rest: no file of the data dir (the database, its -wal
    // and -shm) holds its bytes, while the daemon runs and after it stopped.
    assert_no_password_in(&env.data());
    daemon.stop();
    assert_no_password_in(&env.data());

    let mut args = vec!["--kill-on-exit"];
    args.extend(net_args);
    let daemon = env.start_with(&args);
    let c = &daemon.client;
    assert_eq!(get(c, &s, "http://198.51.100.20/").await, "hello-20");
    assert_eq!(carried(&proxy, "198.51.100.20:80"), 1, "{}", proxy.log());
    assert_eq!(
        shown_proxy(c, &s.sandbox_id).await,
        json!({"address": PROXY, "username": "bob"})
    );
    proxy.stop();
    assert_eq!(get(c, &s, "http://198.51.100.10/").await, "ERR");
    daemon.stop();
}
