//! The daemon's API end to end: a real `sandcell-serve` on an ephemeral port, the gvisor
//! runtime, the installed minimal image, and the Rust client (crates/client).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use common::{EventStream, GUARD, minimal, run, start_request};
use http_body_util::Full;
use hyper::{Method, Request, StatusCode};
use sandcell_client::{Client, ClientError, NewSandbox, read_whole};
use sandcell_proto::agent::Event;

fn status(e: ClientError) -> StatusCode {
    e.status()
        .unwrap_or_else(|| panic!("not an API error: {e}"))
}

#[tokio::test]
async fn create_list_get_kill() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    assert_eq!(c.health().await.unwrap().runtime, "gvisor");
    let templates = c.list_templates().await.unwrap();
    assert!(templates.iter().any(|t| t.template_id == "minimal"));

    let mut req = minimal(Some(120));
    req.metadata = Some([("owner".to_string(), "test".to_string())].into());
    req.env_vars = Some([("GREETING".to_string(), "hello".to_string())].into());
    let sbx = c.create_sandbox(&req).await.unwrap();
    assert_eq!(sbx.template_id, "minimal");
    assert!(sbx.sandbox_id.starts_with("sc-"));
    assert!(sbx.envd_access_token.is_some(), "v2 sandboxes are secure");

    let listed = c.list_sandboxes().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].sandbox_id, sbx.sandbox_id);
    assert_eq!(listed[0].state, "running");
    assert_eq!(
        listed[0].metadata.get("owner").map(String::as_str),
        Some("test")
    );

    let detail = c.get_sandbox(&sbx.sandbox_id).await.unwrap();
    assert_eq!(detail.envd_access_token, sbx.envd_access_token);
    assert!(detail.listed.end_at > detail.listed.started_at);

    let (out, code) = run(c, &sbx, "echo $GREETING from $(hostname)").await;
    assert_eq!(code, 0);
    assert_eq!(out, format!("hello from {}\n", sbx.sandbox_id));

    c.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    assert_eq!(
        status(c.get_sandbox(&sbx.sandbox_id).await.unwrap_err()),
        404
    );
    assert_eq!(
        status(c.kill_sandbox(&sbx.sandbox_id).await.unwrap_err()),
        404
    );
    assert!(c.list_sandboxes().await.unwrap().is_empty());
    assert!(env.leftovers().is_empty(), "left: {:?}", env.leftovers());
    // Its envd traffic now gets the proxy's "not found" (502, as E2B's proxy).
    let resp = c.envd(&sbx, start_request("true")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    daemon.stop();
}

#[tokio::test]
async fn auth_errors_are_401_in_e2b_shape() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let anonymous = daemon.client.with_api_key(None);
    let resp = anonymous
        .api(Method::GET, "/v2/sandboxes", None)
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    assert_eq!(body["code"], 401);
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));

    let wrong = daemon
        .client
        .with_api_key(Some(format!("e2b_{}", "0".repeat(40))));
    assert_eq!(status(wrong.list_sandboxes().await.unwrap_err()), 401);

    // `Authorization: Bearer <key>` works as well as X-API-KEY.
    let req = Request::get("/v2/sandboxes")
        .header("authorization", format!("Bearer {}", daemon.admin_key))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = read_whole(anonymous.send(req).await.unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::OK);

    // Revoked keys stop working.
    let key = env.key("short-lived", None).await;
    let client = daemon.client.with_api_key(Some(key));
    client.list_sandboxes().await.unwrap();
    let db = sandcell_server::keys::open_db(&env.data()).await.unwrap();
    db.revoke_key("short-lived", 1).await.unwrap();
    assert_eq!(status(client.list_sandboxes().await.unwrap_err()), 401);
    daemon.stop();
}

#[tokio::test]
async fn keys_see_only_their_own_sandboxes() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let alice = daemon.client.clone();
    let bob = daemon.client.with_api_key(Some(env.key("bob", None).await));
    let sbx = alice.create_sandbox(&minimal(Some(120))).await.unwrap();

    assert!(bob.list_sandboxes().await.unwrap().is_empty());
    assert_eq!(
        status(bob.get_sandbox(&sbx.sandbox_id).await.unwrap_err()),
        404
    );
    assert_eq!(
        status(bob.kill_sandbox(&sbx.sandbox_id).await.unwrap_err()),
        404
    );
    assert_eq!(
        status(bob.set_timeout(&sbx.sandbox_id, 5).await.unwrap_err()),
        404
    );
    assert_eq!(alice.list_sandboxes().await.unwrap().len(), 1);
    alice.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    daemon.stop();
}

#[tokio::test]
async fn concurrency_limit_is_429() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let limited = daemon
        .client
        .with_api_key(Some(env.key("limited", Some(2)).await));
    let req = minimal(Some(60));
    let (a, b, c) = tokio::join!(
        limited.create_sandbox(&req),
        limited.create_sandbox(&req),
        limited.create_sandbox(&req),
    );
    let results = [a, b, c];
    let created: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let refused: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(created.len(), 2, "{refused:?}");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].status(), Some(StatusCode::TOO_MANY_REQUESTS));
    // Another key is not affected; a freed slot can be used again.
    let other = daemon
        .client
        .create_sandbox(&minimal(Some(60)))
        .await
        .unwrap();
    limited.kill_sandbox(&created[0].sandbox_id).await.unwrap();
    let again = limited.create_sandbox(&minimal(Some(60))).await.unwrap();
    for id in [&created[1].sandbox_id, &again.sandbox_id] {
        limited.kill_sandbox(id).await.unwrap();
    }
    daemon.client.kill_sandbox(&other.sandbox_id).await.unwrap();
    daemon.stop();
}

#[tokio::test]
async fn bad_requests_are_400_with_code_and_message() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let raw = |body: &'static str| {
        Request::post("/v2/sandboxes")
            .header("x-api-key", &daemon.admin_key)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    for body in [
        "{not json",
        "",
        "{}",
        r#"{"templateID": 5}"#,
        r#"{"templateID": "minimal", "timeout": -1}"#,
        r#"{"templateID": "minimal", "timeout": 999999}"#,
        r#"{"templateID": "../etc"}"#,
        r#"{"templateID": "minimal", "metadata": {"a": 1}}"#,
    ] {
        let resp = read_whole(c.send(raw(body)).await.unwrap()).await.unwrap();
        assert_eq!(resp.status, StatusCode::BAD_REQUEST, "body {body:?}");
        let err: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(err["code"], 400, "body {body:?}");
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let unknown = c
        .create_sandbox(&NewSandbox {
            template_id: "no-such-template".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status(unknown), 404);
    let resp = c.api(Method::GET, "/no/such/route", None).await.unwrap();
    assert_eq!(resp.status, StatusCode::NOT_FOUND);
    let resp = c.api(Method::PUT, "/templates", None).await.unwrap();
    assert_eq!(resp.status, StatusCode::METHOD_NOT_ALLOWED);
    let err: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    assert_eq!(err["code"], 405);
    assert!(c.list_sandboxes().await.unwrap().is_empty());
    daemon.stop();
}

#[tokio::test]
async fn sandboxes_are_killed_at_their_timeout_and_timeouts_move() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let short = c.create_sandbox(&minimal(Some(1))).await.unwrap();
    let kept = c.create_sandbox(&minimal(Some(1))).await.unwrap();
    c.set_timeout(&kept.sandbox_id, 300).await.unwrap();

    let deadline = tokio::time::Instant::now() + GUARD;
    while c.get_sandbox(&short.sandbox_id).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sandbox outlived its timeout by the guard time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let listed: Vec<_> = c
        .list_sandboxes()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.sandbox_id)
        .collect();
    assert_eq!(listed, vec![kept.sandbox_id.clone()]);
    // The API forgets a sandbox as soon as its kill starts; its files go when it ends.
    while env.leftovers() != vec![kept.sandbox_id.clone()] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "left: {:?}",
            env.leftovers()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (out, _) = run(c, &kept, "echo alive").await;
    assert_eq!(out, "alive\n");
    daemon.stop();
    assert!(env.leftovers().is_empty(), "left: {:?}", env.leftovers());
}

/// A Start stream through the proxy delivers output while the process still runs: the
/// process waits for a file that a second request (routed by Host) creates only after the
/// first output arrived. A proxy that buffered bodies would never get there.
#[tokio::test]
async fn proxy_streams_by_header_and_by_host() {
    let env = common::Env::new();
    let daemon = env.start(&["--domain", "sandbox.test", "--https-port", "0"]);
    let c = &daemon.client;
    let sbx = c.create_sandbox(&minimal(Some(120))).await.unwrap();
    assert_eq!(sbx.domain.as_deref(), Some("sandbox.test"));

    let resp = c
        .envd(
            &sbx,
            start_request("echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second"),
        )
        .await
        .unwrap();
    let mut events = EventStream::new(resp);
    assert!(matches!(events.next().await, Some(Event::Start(_))));
    assert!(events.stdout_until("first").await.contains("first"));

    // The second request carries no E2b-* headers: the Host names the sandbox.
    let mut req = start_request("touch /tmp/go");
    let headers = req.headers_mut();
    headers.insert(
        "host",
        format!("49983-{}.sandbox.test", sbx.sandbox_id)
            .parse()
            .unwrap(),
    );
    headers.insert(
        "x-access-token",
        sbx.envd_access_token.clone().unwrap().parse().unwrap(),
    );
    let mut toucher = EventStream::new(c.send(req).await.unwrap());
    assert_eq!(toucher.exit_code().await, 0);

    assert!(events.stdout_until("second").await.contains("second"));
    assert_eq!(events.exit_code().await, 0);
    c.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    daemon.stop();
}

#[tokio::test]
async fn proxy_checks_the_access_token_and_hides_internal_routes() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let secure = c.create_sandbox(&minimal(Some(120))).await.unwrap();
    let health = |token: Option<&str>, path: &str| {
        let mut b = Request::get(path)
            .header("e2b-sandbox-id", &secure.sandbox_id)
            .header("e2b-sandbox-port", "49983");
        if let Some(t) = token {
            b = b.header("x-access-token", t);
        }
        b.body(Full::new(Bytes::new())).unwrap()
    };
    let token = secure.envd_access_token.clone().unwrap();
    let status_of = |req| async { c.send(req).await.unwrap().status() };
    assert_eq!(
        status_of(health(None, "/health")).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status_of(health(Some("wrong"), "/health")).await,
        StatusCode::UNAUTHORIZED
    );
    assert!(
        status_of(health(Some(&token), "/health"))
            .await
            .is_success()
    );
    assert_eq!(
        status_of(health(Some(&token), "/init")).await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        status_of(health(Some(&token), "/sandcell/poweroff")).await,
        StatusCode::NOT_FOUND
    );

    // `secure: false` (and the v1 route) still get a token, as E2B's API does now: an id
    // alone opens no envd.
    for body in [
        serde_json::json!({"templateID": "minimal", "timeout": 60}),
        serde_json::json!({"templateID": "minimal", "timeout": 60, "secure": false}),
    ] {
        let resp = c
            .api(Method::POST, "/sandboxes", Some(&body))
            .await
            .unwrap();
        assert_eq!(resp.status, StatusCode::CREATED);
        let sbx: sandcell_client::Sandbox = serde_json::from_slice(&resp.body).unwrap();
        assert!(sbx.envd_access_token.is_some(), "{body}");
        let req = Request::get("/health")
            .header("e2b-sandbox-id", &sbx.sandbox_id)
            .header("e2b-sandbox-port", "49983")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(status_of(req).await, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(run(c, &sbx, "echo ok").await, ("ok\n".to_string(), 0));
    }
    daemon.stop();
}

#[tokio::test]
async fn openapi_describes_every_route() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let resp = daemon
        .client
        .api(Method::GET, "/openapi.json", None)
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::OK);
    let spec: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    let paths = spec["paths"].as_object().unwrap();
    for (path, method) in [
        ("/health", "get"),
        ("/sandboxes", "post"),
        ("/sandboxes", "get"),
        ("/v2/sandboxes", "post"),
        ("/v2/sandboxes", "get"),
        ("/sandboxes/{sandboxID}", "get"),
        ("/sandboxes/{sandboxID}", "delete"),
        ("/sandboxes/{sandboxID}/timeout", "post"),
        ("/sandboxes/{sandboxID}/refreshes", "post"),
        ("/sandboxes/{sandboxID}/connect", "post"),
        ("/v2/sandboxes/{sandboxID}/connect", "post"),
        ("/templates", "get"),
    ] {
        assert!(
            paths[path][method].is_object(),
            "{method} {path} is missing"
        );
    }
    assert!(spec["components"]["schemas"]["NewSandbox"].is_object());
    daemon.stop();
}

#[tokio::test]
async fn connect_and_refresh_only_extend() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c: &Client = &daemon.client;
    let sbx = c.create_sandbox(&minimal(Some(600))).await.unwrap();
    let end0 = c.get_sandbox(&sbx.sandbox_id).await.unwrap().listed.end_at;
    let path = format!("/v2/sandboxes/{}/connect", sbx.sandbox_id);
    let resp = c
        .api(
            Method::POST,
            &path,
            Some(&serde_json::json!({"timeout": 10})),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::OK);
    let end1 = c.get_sandbox(&sbx.sandbox_id).await.unwrap().listed.end_at;
    assert_eq!(
        end1, end0,
        "connect with a shorter timeout keeps the later end"
    );
    let path = format!("/sandboxes/{}/refreshes", sbx.sandbox_id);
    let resp = c
        .api(
            Method::POST,
            &path,
            Some(&serde_json::json!({"duration": 3600})),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::NO_CONTENT);
    let end2 = c.get_sandbox(&sbx.sandbox_id).await.unwrap().listed.end_at;
    assert!(end2 > end1, "{end2} > {end1}");
    let resp = c.api(Method::POST, &path, None).await.unwrap();
    assert_eq!(resp.status, StatusCode::NO_CONTENT, "the body is optional");
    let resp = c
        .api(
            Method::POST,
            "/v2/sandboxes/sc-0000000000000000/connect",
            Some(&serde_json::json!({"timeout": 10})),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::NOT_FOUND);
    c.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    daemon.stop();
}
