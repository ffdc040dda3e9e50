//! Tenants against each other and against the host, end to end (a real daemon, gvisor):
//! per-key quotas (429), host admission (503), the admin key's view of every sandbox,
//! another key's sandbox answering 404 on every route, and access tokens bound to their
//! own sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{minimal, run, start_request};
use hyper::{Method, StatusCode};
use sandcell_client::{Client, RawResponse, Sandbox};
use sandcell_server::store::keys::{KeyQuotas, Limit};

async fn key_with(env: &common::Env, name: &str, quotas: KeyQuotas) -> String {
    let db = sandcell_server::keys::open_db(&env.data()).await.unwrap();
    let key = sandcell_server::keys::create_key_with(&db, name, quotas, false)
        .await
        .unwrap();
    db.close().await;
    key.plaintext
}

/// `POST /v2/sandboxes` of the minimal template with `memoryMB`.
async fn create(c: &Client, memory_mb: u32) -> RawResponse {
    let body = serde_json::json!({"templateID": "minimal", "timeout": 120, "memoryMB": memory_mb});
    c.api(Method::POST, "/v2/sandboxes", Some(&body))
        .await
        .unwrap()
}

fn sandbox_of(resp: &RawResponse) -> Sandbox {
    assert_eq!(resp.status, StatusCode::CREATED, "{:?}", resp.body);
    serde_json::from_slice(&resp.body).unwrap()
}

fn message(resp: &RawResponse) -> String {
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    v["message"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_key_over_its_memory_quota_gets_429_naming_the_limit() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let quotas = KeyQuotas {
        memory_mib: Limit::Max(768),
        ..KeyQuotas::default()
    };
    let b = daemon
        .client
        .with_api_key(Some(key_with(&env, "b", quotas).await));
    let first = sandbox_of(&create(&b, 512).await);
    let refused = create(&b, 512).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let m = message(&refused);
    assert!(
        m.contains("768 MiB") && m.contains("512 MiB") && m.contains("--max-memory-mib"),
        "{m}"
    );
    // Within what is left it fits; the admin key has no quota.
    let small = sandbox_of(&create(&b, 256).await);
    let admin = sandbox_of(&create(&daemon.client, 1024).await);
    for id in [&first.sandbox_id, &small.sandbox_id] {
        b.kill_sandbox(id).await.unwrap();
    }
    daemon.client.kill_sandbox(&admin.sandbox_id).await.unwrap();
    daemon.stop();
}

fn mem_total_mib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    sandcell_server::sandboxes::admission::parse_mem_total_kib(&meminfo).unwrap() / 1024
}

#[tokio::test]
async fn past_the_hosts_overcommit_creates_get_503_and_the_others_keep_running() {
    let env = common::Env::new();
    // Room for 1200 MiB of sandboxes on this host: two of 512 MiB, not three.
    let ratio = format!("{:.6}", 1200.0 / mem_total_mib() as f64);
    let daemon = env.start(&["--memory-overcommit", &ratio]);
    let c = &daemon.client;
    let one = sandbox_of(&create(c, 512).await);
    let two = sandbox_of(&create(c, 512).await);
    let refused = create(c, 512).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    let m = message(&refused);
    assert!(
        m.contains("at capacity") && m.contains("--memory-overcommit"),
        "{m}"
    );
    let (out, code) = run(c, &one, "echo alive").await;
    assert_eq!((out.as_str(), code), ("alive\n", 0));
    // A freed slot admits again.
    c.kill_sandbox(&two.sandbox_id).await.unwrap();
    let three = sandbox_of(&create(c, 512).await);
    for id in [&one.sandbox_id, &three.sandbox_id] {
        c.kill_sandbox(id).await.unwrap();
    }
    daemon.stop();
}

#[tokio::test]
async fn below_the_disk_floor_creates_get_503() {
    let env = common::Env::new();
    let daemon = env.start(&["--min-free-disk-mib", "1000000000"]);
    let refused = create(&daemon.client, 256).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        message(&refused).contains("out of disk"),
        "{}",
        message(&refused)
    );
    daemon.stop();
}

/// Every route of the OpenAPI description with `{sandboxID}` in it, with its methods.
async fn sandbox_routes(c: &Client) -> Vec<(Method, String)> {
    let spec = c.api(Method::GET, "/openapi.json", None).await.unwrap();
    let spec: serde_json::Value = serde_json::from_slice(&spec.body).unwrap();
    let mut routes = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        if !path.contains("{sandboxID}") {
            continue;
        }
        for method in item.as_object().unwrap().keys() {
            routes.push((method.to_uppercase().parse().unwrap(), path.clone()));
        }
    }
    routes
}

#[tokio::test]
async fn another_keys_sandbox_is_404_on_every_route_and_the_admin_sees_all() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let a = daemon.client.with_api_key(Some(env.key("a", None).await));
    let b = daemon.client.with_api_key(Some(env.key("b", None).await));
    let victim = a.create_sandbox(&minimal(Some(120))).await.unwrap();
    let own = b.create_sandbox(&minimal(Some(120))).await.unwrap();
    let routes = sandbox_routes(&b).await;
    assert!(routes.len() >= 10, "{routes:?}");
    // B's own network, so that attaching A's sandbox to it fails on the sandbox.
    let net = b
        .api(
            Method::POST,
            "/networks",
            Some(&serde_json::json!({"name": "bnet"})),
        )
        .await
        .unwrap();
    assert!(net.status.is_success(), "{:?}", net.body);
    // A body every route takes, so that no route answers 400 before it looks the id up.
    let body = serde_json::json!({"timeout": 30, "duration": 30, "count": 1, "name": "snap-b"});
    for (method, path) in &routes {
        let path = path
            .replace("{sandboxID}", &victim.sandbox_id)
            .replace("{name}", "bnet");
        let resp = b.api(method.clone(), &path, Some(&body)).await.unwrap();
        assert_eq!(
            resp.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {:?}",
            resp.body
        );
    }
    // A's sandbox is as it was.
    let detail = a.get_sandbox(&victim.sandbox_id).await.unwrap();
    assert_eq!(detail.listed.state, "running");
    let (out, _) = run(&a, &victim, "echo intact").await;
    assert_eq!(out, "intact\n");

    // The admin key: its own by default (as E2B), every key's with all=true.
    let admin = &daemon.client;
    assert!(admin.list_sandboxes().await.unwrap().is_empty());
    for path in ["/v2/sandboxes?all=true", "/sandboxes?all=true"] {
        let listed = admin.api(Method::GET, path, None).await.unwrap();
        assert_eq!(listed.status, StatusCode::OK);
        let listed: Vec<serde_json::Value> = serde_json::from_slice(&listed.body).unwrap();
        let ids: Vec<&str> = listed
            .iter()
            .filter_map(|s| s["sandboxID"].as_str())
            .collect();
        assert!(
            ids.contains(&victim.sandbox_id.as_str()) && ids.contains(&own.sandbox_id.as_str()),
            "{path}: {ids:?}"
        );
        assert!(listed.iter().all(|s| s["keyID"].is_string()), "{listed:?}");
    }
    let forbidden = b
        .api(Method::GET, "/v2/sandboxes?all=true", None)
        .await
        .unwrap();
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    // The admin key kills any key's sandbox.
    admin.get_sandbox(&own.sandbox_id).await.unwrap();
    admin.kill_sandbox(&own.sandbox_id).await.unwrap();
    assert!(b.list_sandboxes().await.unwrap().is_empty());
    a.kill_sandbox(&victim.sandbox_id).await.unwrap();
    daemon.stop();
}

#[tokio::test]
async fn an_access_token_opens_only_its_own_sandbox() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let a = daemon.client.with_api_key(Some(env.key("a", None).await));
    let b = daemon.client.with_api_key(Some(env.key("b", None).await));
    let sa = a.create_sandbox(&minimal(Some(120))).await.unwrap();
    let sb = b.create_sandbox(&minimal(Some(120))).await.unwrap();
    let with_token = |s: &Sandbox, token: Option<String>| Sandbox {
        envd_access_token: token,
        ..s.clone()
    };
    let tries = [
        with_token(&sb, sa.envd_access_token.clone()),
        with_token(&sa, sb.envd_access_token.clone()),
        with_token(&sa, Some("0".repeat(40))),
        with_token(&sa, None),
    ];
    for s in &tries {
        let resp = b.envd(s, start_request("echo pwned")).await.unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::UNAUTHORIZED,
            "{:?}",
            s.envd_access_token
        );
    }
    // Each with its own still works.
    assert_eq!(run(&a, &sa, "echo a").await.0, "a\n");
    assert_eq!(run(&b, &sb, "echo b").await.0, "b\n");
    // A killed sandbox's token does not come back with it.
    b.kill_sandbox(&sb.sandbox_id).await.unwrap();
    let resp = b.envd(&sb, start_request("true")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    a.kill_sandbox(&sa.sandbox_id).await.unwrap();
    daemon.stop();
}

#[tokio::test]
async fn a_resume_past_the_memory_quota_is_429_and_the_sandbox_stays_paused() {
    let env = common::Env::new();
    // As tests/snapshots.rs: pause and resume without a network.
    let daemon = env.start(&["--no-network"]);
    let quotas = KeyQuotas {
        memory_mib: Limit::Max(768),
        ..KeyQuotas::default()
    };
    let b = daemon
        .client
        .with_api_key(Some(key_with(&env, "b", quotas).await));
    let first = sandbox_of(&create(&b, 512).await);
    run(&b, &first, "echo kept > /home/user/mark").await;
    let path = format!("/sandboxes/{}/pause", first.sandbox_id);
    let mut paused = StatusCode::SERVICE_UNAVAILABLE;
    // 503 is "cannot pause now, it keeps running": retried as tests/snapshots.rs does.
    for _ in 0..3 {
        paused = b.api(Method::POST, &path, None).await.unwrap().status;
        if paused != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
    }
    assert_eq!(paused, StatusCode::NO_CONTENT);
    // A paused sandbox holds no memory: another 512 MiB fits.
    let second = sandbox_of(&create(&b, 512).await);
    let connect = format!("/v2/sandboxes/{}/connect", first.sandbox_id);
    let body = serde_json::json!({"timeout": 60});
    let refused = b.api(Method::POST, &connect, Some(&body)).await.unwrap();
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{:?}",
        refused.body
    );
    assert!(
        message(&refused).contains("--max-memory-mib"),
        "{}",
        message(&refused)
    );
    assert_eq!(
        b.get_sandbox(&first.sandbox_id).await.unwrap().listed.state,
        "paused"
    );
    // With room again it resumes, its files intact.
    b.kill_sandbox(&second.sandbox_id).await.unwrap();
    let resumed = b.api(Method::POST, &connect, Some(&body)).await.unwrap();
    assert_eq!(resumed.status, StatusCode::CREATED, "{:?}", resumed.body);
    let first: Sandbox = serde_json::from_slice(&resumed.body).unwrap();
    assert_eq!(run(&b, &first, "cat /home/user/mark").await.0, "kept\n");
    b.kill_sandbox(&first.sandbox_id).await.unwrap();
    daemon.stop();
}
