//! Private-network memberships across checkpoints, through the daemon's API (real
//! `sandcell-serve` on gvisor, real namespaces and nftables, our DNS server): a fork child
//! and a sandbox created from a named snapshot join the private networks of their source,
//! reach its members by name, and are reached by theirs; the network's member list shows
//! them. A paused member is out of reach and back once resumed. A fork child of a sandbox
//! whose ports want a traffic token wants one too, its own. Needs root, runsc, iproute2 and nftables: fails loudly without them. Runs in the
//! `gvisor-checkpoint` nextest group (.config/nextest.toml: runsc restore defects).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::run;
use hyper::{Method, Request, StatusCode};
use sandcell_client::{Client, Sandbox, read_whole};
use serde_json::{Value, json};

async fn call(c: &Client, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let resp = c.api(method, path, body.as_ref()).await.unwrap();
    let value = serde_json::from_slice(&resp.body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&resp.body).into_owned()));
    (resp.status, value)
}

async fn create(c: &Client, body: Value) -> Sandbox {
    let mut body = body;
    body["timeout"] = json!(600);
    let (status, v) = call(c, Method::POST, "/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    serde_json::from_value(v).unwrap()
}

/// Serves "from-<its id>" on port 8080 (busybox httpd); restored copies serve the same.
async fn serve(c: &Client, s: &Sandbox) {
    let script = format!(
        "mkdir -p /tmp/www && echo from-{} > /tmp/www/index.html && httpd -p 8080 -h /tmp/www",
        s.sandbox_id
    );
    assert_eq!(run(c, s, &script).await.1, 0);
}

/// What `from` gets from port 8080 of `name` (resolved by our DNS server), or "ERR".
async fn reach(c: &Client, from: &Sandbox, name: &str) -> String {
    let script = format!(
        "h=$(nslookup {name} 2>/dev/null | awk '/^Address/ && !/:53$/ {{print $2}}' | tail -n 1); \
         [ -n \"$h\" ] || exit 1; \
         printf 'GET / HTTP/1.0\\r\\nHost: {name}\\r\\n\\r\\n' | nc -w 3 $h 8080"
    );
    let (out, _) = run(c, from, &script).await;
    match out.split_once("\r\n\r\n") {
        Some((head, body)) if head.contains(" 200 ") => body.trim().to_string(),
        _ => "ERR".into(),
    }
}

/// Port 8080 of sandbox `id` through the daemon's proxy, with `token` as the traffic token.
async fn via_proxy(c: &Client, id: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = Request::get("/")
        .header("E2b-Sandbox-Id", id)
        .header("E2b-Sandbox-Port", "8080");
    if let Some(t) = token {
        req = req.header("E2b-Traffic-Access-Token", t);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = read_whole(c.send(req).await.unwrap()).await.unwrap();
    let body = String::from_utf8_lossy(&resp.body).trim().to_string();
    (resp.status, body)
}

async fn members(c: &Client) -> Vec<String> {
    let (status, nets) = call(c, Method::GET, "/networks", None).await;
    assert_eq!(status, StatusCode::OK, "{nets}");
    let mut m: Vec<String> = nets[0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    m.sort();
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_children_and_snapshot_creates_join_their_sources_networks() {
    let env = common::Env::new();
    let daemon = env.start(&["--net-pool", "10.206.0.0/16"]);
    let c = &daemon.client;
    let (status, v) = call(c, Method::POST, "/networks", Some(json!({"name": "team"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");

    let a = create(c, json!({"templateID": "minimal", "networks": ["team"]})).await;
    let b = create(c, json!({"templateID": "minimal", "networks": ["team"]})).await;
    let outsider = create(c, json!({"templateID": "minimal"})).await;
    for s in [&a, &b] {
        serve(c, s).await;
    }
    let from_a = format!("from-{}", a.sandbox_id);
    let from_b = format!("from-{}", b.sandbox_id);

    // a fork child of `a` is in `team`: it reaches b by name, b reaches it by its own name
    let (status, forked) = call(
        c,
        Method::POST,
        &format!("/sandboxes/{}/fork", a.sandbox_id),
        Some(json!({"count": 1, "timeout": 600})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{forked}");
    let child: Sandbox = serde_json::from_value(forked[0]["sandbox"].clone())
        .unwrap_or_else(|e| panic!("fork result {forked}: {e}"));
    assert_eq!(reach(c, &child, &b.sandbox_id).await, from_b);
    // the child's httpd is a's, restored: it answers with a's text under the child's name
    assert_eq!(reach(c, &b, &child.sandbox_id).await, from_a);
    assert_eq!(reach(c, &a, &child.sandbox_id).await, from_a);
    assert_eq!(reach(c, &outsider, &child.sandbox_id).await, "ERR");
    let mut want = vec![
        a.sandbox_id.clone(),
        b.sandbox_id.clone(),
        child.sandbox_id.clone(),
    ];
    want.sort();
    assert_eq!(members(c).await, want);

    // a named snapshot of b, b killed, a sandbox created from the snapshot: in `team` too
    let (status, snap) = call(
        c,
        Method::POST,
        &format!("/sandboxes/{}/snapshots", b.sandbox_id),
        Some(json!({"name": "b-snap"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    let path = format!("/sandboxes/{}", b.sandbox_id);
    let (status, v) = call(c, Method::DELETE, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(reach(c, &a, &b.sandbox_id).await, "ERR");
    let restored = create(c, json!({"templateID": "b-snap"})).await;
    assert_eq!(reach(c, &a, &restored.sandbox_id).await, from_b);
    assert_eq!(reach(c, &restored, &a.sandbox_id).await, from_a);
    assert_eq!(reach(c, &outsider, &restored.sandbox_id).await, "ERR");
    let mut want = vec![
        a.sandbox_id.clone(),
        child.sandbox_id.clone(),
        restored.sandbox_id.clone(),
    ];
    want.sort();
    assert_eq!(members(c).await, want);

    // a paused member is out of reach but stays a member: resumed, it is back
    let path = format!("/sandboxes/{}/pause", child.sandbox_id);
    let (status, v) = call(c, Method::POST, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(reach(c, &a, &child.sandbox_id).await, "ERR");
    assert!(!members(c).await.contains(&child.sandbox_id));
    let path = format!("/v2/sandboxes/{}/connect", child.sandbox_id);
    let (status, v) = call(c, Method::POST, &path, Some(json!({"timeout": 600}))).await;
    assert!(status.is_success(), "connect: {status} {v}");
    let child: Sandbox = serde_json::from_value(v).unwrap();
    assert_eq!(reach(c, &restored, &child.sandbox_id).await, from_a);
    assert!(members(c).await.contains(&child.sandbox_id));

    // allowPublicTraffic: false holds for a fork child: its ports want its own token
    let body = json!({"templateID": "minimal", "timeout": 600,
                      "network": {"allowPublicTraffic": false}});
    let (status, v) = call(c, Method::POST, "/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let parent_token = v["trafficAccessToken"]
        .as_str()
        .expect("a traffic token")
        .to_string();
    let private: Sandbox = serde_json::from_value(v).unwrap();
    serve(c, &private).await;
    let path = format!("/sandboxes/{}/fork", private.sandbox_id);
    let (status, forked) = call(c, Method::POST, &path, Some(json!({"count": 1}))).await;
    assert_eq!(status, StatusCode::CREATED, "{forked}");
    let child_token = forked[0]["sandbox"]["trafficAccessToken"]
        .as_str()
        .unwrap_or_else(|| panic!("no traffic token for the child: {forked}"))
        .to_string();
    assert_ne!(child_token, parent_token);
    let id = forked[0]["sandbox"]["sandboxID"].as_str().unwrap();
    assert_eq!(via_proxy(c, id, None).await.0, StatusCode::FORBIDDEN);
    assert_eq!(
        via_proxy(c, id, Some(&parent_token)).await.0,
        StatusCode::FORBIDDEN
    );
    let from_private = format!("from-{}", private.sandbox_id);
    assert_eq!(
        via_proxy(c, id, Some(&child_token)).await,
        (StatusCode::OK, from_private)
    );
    daemon.stop();
}
