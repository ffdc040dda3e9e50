//! Auto-resume (E2B's `autoResume: {"enabled": true}`, http/wake.rs) against a real
//! `sandcell-serve` on the gvisor runtime (real runsc, no mocks; needs root: fails loudly
//! without, see common/mod.rs).
//!
//! Ports are reached through the sandboxes' networks; the envd and restart case runs on a
//! daemon without networks (every port then goes through the agent).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{call, run};
use hyper::{Method, Request, StatusCode};
use sandcell_client::{Client, Sandbox, read_whole};
use serde_json::{Value, json};

/// Creates a `minimal` sandbox with `body`'s fields on top; with its traffic token.
async fn create_with_token(c: &Client, body: Value) -> (Sandbox, Option<String>) {
    let mut body = body;
    body["templateID"] = json!("minimal");
    let (status, v) = call(c, Method::POST, "/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let token = v["trafficAccessToken"].as_str().map(str::to_string);
    (serde_json::from_value(v).unwrap(), token)
}

async fn create(c: &Client, body: Value) -> Sandbox {
    create_with_token(c, body).await.0
}

fn waking() -> Value {
    json!({"timeout": 60, "autoPause": true, "autoResume": {"enabled": true}})
}

async fn info(c: &Client, id: &str) -> Value {
    let (status, v) = call(c, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

async fn state(c: &Client, id: &str) -> String {
    info(c, id).await["state"].as_str().unwrap().to_string()
}

/// Pauses `id` (retried on 503: a loaded host's agent may be slow to let go of its sockets).
async fn pause(c: &Client, id: &str) {
    for _ in 0..3 {
        let (status, v) = call(c, Method::POST, &format!("/sandboxes/{id}/pause"), None).await;
        if status == StatusCode::NO_CONTENT {
            assert_eq!(state(c, id).await, "paused");
            return;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "pause {id}: {v}");
    }
    panic!("pause {id}: 503 three times");
}

/// A GET through the proxy to `port` of sandbox `id`, with extra `headers`.
async fn via_proxy(
    c: &Client,
    id: &str,
    port: u16,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let mut req = Request::get("/")
        .header("E2b-Sandbox-Id", id)
        .header("E2b-Sandbox-Port", port.to_string());
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = read_whole(c.send(req).await.unwrap()).await.unwrap();
    (
        resp.status,
        String::from_utf8_lossy(&resp.body).into_owned(),
    )
}

/// Serves `text` on port 8080 inside the sandbox (busybox httpd, a daemon of its own).
async fn serve(c: &Client, s: &Sandbox, text: &str) {
    let script = format!(
        "mkdir -p /tmp/www && echo {text} > /tmp/www/index.html && httpd -p 8080 -h /tmp/www"
    );
    assert_eq!(run(c, s, &script).await.1, 0);
}

/// `sandcell_auto_resumes_total{outcome="resumed"}` of the daemon's `/metrics`.
async fn auto_resumes(c: &Client) -> u64 {
    let resp = c.api(Method::GET, "/metrics", None).await.unwrap();
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("sandcell_auto_resumes_total{outcome=\"resumed\"} "))
        .unwrap_or_else(|| panic!("no auto-resume counter in {text}"))
        .parse()
        .unwrap()
}

/// The create's checks, the info's lifecycle; through the port proxy: requests a running
/// sandbox would refuse are refused and wake nothing, eight at once wake it with one
/// resume and all get the answer; the traffic token guards the ports after the wake too;
/// without auto-resume a paused sandbox answers as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_to_a_port_wakes_a_paused_sandbox() {
    let env = common::Env::new();
    let daemon = env.start(&["--net-pool", "10.222.0.0/17"]);
    let c = daemon.client.clone();

    for (body, says) in [
        (
            json!({"templateID": "minimal", "autoResume": {"enabled": true}}),
            "needs autoPause: true",
        ),
        (
            json!({"templateID": "minimal", "autoPause": true, "autoResume": true}),
            r#"{"enabled": true}"#,
        ),
    ] {
        let (status, v) = call(&c, Method::POST, "/sandboxes", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        assert!(v["message"].as_str().unwrap().contains(says), "{v}");
    }

    let public = create(&c, waking()).await;
    let id = public.sandbox_id.clone();
    assert_eq!(
        info(&c, &id).await["lifecycle"],
        json!({"autoResume": true, "onTimeout": "pause"})
    );
    serve(&c, &public, "awake").await;
    pause(&c, &id).await;

    // Refused as they would be if it ran, and it stays paused: envd without its token, an
    // internal route with it.
    let envd = sandcell_runtime::AGENT_PORT as u16;
    let (status, body) = via_proxy(&c, &id, envd, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let token = public.envd_access_token.clone().unwrap();
    let req = Request::get("/init")
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", envd.to_string())
        .header("X-Access-Token", &token)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = read_whole(c.send(req).await.unwrap()).await.unwrap();
    assert_eq!(resp.status, StatusCode::NOT_FOUND);
    assert_eq!(state(&c, &id).await, "paused");
    assert_eq!(auto_resumes(&c).await, 0);

    // Eight requests at once: one resume, every one served.
    let mut all = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (c, id) = (c.clone(), id.clone());
        all.spawn(async move { via_proxy(&c, &id, 8080, &[]).await });
    }
    while let Some(answer) = all.join_next().await {
        let (status, body) = answer.unwrap();
        assert_eq!((status, body.trim()), (StatusCode::OK, "awake"));
    }
    assert_eq!(auto_resumes(&c).await, 1);
    let now = info(&c, &id).await;
    assert_eq!(now["state"], "running");
    // A wake gives at least 5 minutes (E2B), not the create's 60 s.
    let end = now["endAt"].as_str().unwrap();
    let left = sandcell_server::util::parse_rfc3339(end).unwrap() - sandcell_server::util::now_ms();
    assert!(left > 120_000, "{end}: {left} ms left");

    // allowPublicTraffic: false: without the traffic token the port refuses and nothing
    // wakes; with it, it wakes; after the wake the port still wants it.
    let mut body = waking();
    body["network"] = json!({"allowPublicTraffic": false});
    let (private, traffic) = create_with_token(&c, body).await;
    let traffic = traffic.unwrap();
    let pid = private.sandbox_id.clone();
    let (_, v) = call(&c, Method::GET, &format!("/sandboxes/{pid}"), None).await;
    assert_eq!(v["lifecycle"]["autoResume"], true);
    serve(&c, &private, "private").await;
    pause(&c, &pid).await;
    let (status, _) = via_proxy(&c, &pid, 8080, &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = via_proxy(&c, &pid, 8080, &[("X-Access-Token", &token)]).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "another sandbox's envd token"
    );
    assert_eq!(state(&c, &pid).await, "paused");
    let with_token = [("E2b-Traffic-Access-Token", traffic.as_str())];
    let (status, body) = via_proxy(&c, &pid, 8080, &with_token).await;
    assert_eq!((status, body.trim()), (StatusCode::OK, "private"));
    let (status, _) = via_proxy(&c, &pid, 8080, &[]).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the token guards the resumed ports"
    );
    assert_eq!(run(&c, &private, "echo up").await, ("up\n".to_string(), 0));

    // Without auto-resume: paused, it answers as before and stays paused.
    let plain = create(&c, json!({"timeout": 60, "autoPause": true})).await;
    assert_eq!(
        info(&c, &plain.sandbox_id).await["lifecycle"]["autoResume"],
        false
    );
    serve(&c, &plain, "plain").await;
    pause(&c, &plain.sandbox_id).await;
    let (status, body) = via_proxy(&c, &plain.sandbox_id, 8080, &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains("was not found"), "{body}");
    assert_eq!(state(&c, &plain.sandbox_id).await, "paused");
    assert_eq!(auto_resumes(&c).await, 2);
    c.kill_sandbox(&plain.sandbox_id).await.unwrap();
    daemon.stop();
}

/// Through envd: a command sent to a paused sandbox runs once it woke, in the same
/// sandbox; the setting outlives a daemon restart; connect still resumes it.
#[tokio::test(flavor = "multi_thread")]
async fn a_command_wakes_a_paused_sandbox_also_after_a_restart() {
    let env = common::Env::new();
    let daemon = env.start(&["--no-network"]);
    let c = daemon.client.clone();
    let sb = create(&c, waking()).await;
    let id = sb.sandbox_id.clone();
    assert_eq!(run(&c, &sb, "echo kept > /tmp/mark").await.1, 0);
    pause(&c, &id).await;
    assert_eq!(
        run(&c, &sb, "cat /tmp/mark").await,
        ("kept\n".to_string(), 0)
    );
    assert_eq!(state(&c, &id).await, "running");

    pause(&c, &id).await;
    daemon.kill9();
    let daemon = env.start(&["--no-network"]);
    let c = daemon.client.clone();
    assert_eq!(
        info(&c, &id).await["lifecycle"],
        json!({"autoResume": true, "onTimeout": "pause"})
    );
    assert_eq!(state(&c, &id).await, "paused");
    assert_eq!(
        run(&c, &sb, "cat /tmp/mark").await,
        ("kept\n".to_string(), 0)
    );
    assert_eq!(auto_resumes(&c).await, 1);

    // connect resumes it as before (201), and so does nothing else.
    pause(&c, &id).await;
    let (status, v) = call(
        &c,
        Method::POST,
        &format!("/v2/sandboxes/{id}/connect"),
        Some(json!({"timeout": 120})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(
        run(&c, &sb, "cat /tmp/mark").await,
        ("kept\n".to_string(), 0)
    );
    assert_eq!(auto_resumes(&c).await, 1);
    c.kill_sandbox(&id).await.unwrap();
    daemon.stop();
}
