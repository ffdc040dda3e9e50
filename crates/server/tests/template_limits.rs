//! Template tenancy and build limits against a real daemon (gvisor runtime, the installed
//! minimal image): another key's private template is 404 on every route and a taken name
//! is refused; a key's endless `RUN` holds up neither another key's build nor the daemon
//! past its step deadline (`--build-step-timeout`, 60 s here: the build fails saying so); a build
//! never started expires (`--build-start-timeout`) and frees its name; uploads past the
//! key's quota (`--default-max-upload-mib`, 1 MiB here) are 413 before they are read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{call, wait_build as wait};
use hyper::{Method, StatusCode};
use sandcell_client::Client;
use serde_json::json;

/// Requests a build of `name` and starts it with one RUN `cmd` on minimal: the build id.
async fn build(c: &Client, name: &str, cmd: &str) -> String {
    let (status, body) = call(
        c,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": name})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["buildID"].as_str().unwrap().to_string();
    let steps =
        json!({"fromTemplate": "minimal", "steps": [{"type": "RUN", "args": [cmd, "root"]}]});
    let path = format!("/v2/templates/{name}/builds/{id}");
    let (status, body) = call(c, Method::POST, &path, Some(steps)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    id
}

#[tokio::test]
async fn private_templates_deadlines_and_caps() {
    let env = common::Env::new();
    let daemon = env.start(&[
        "--build-step-timeout",
        "60",
        "--build-start-timeout",
        "3",
        "--default-max-upload-mib",
        "1",
    ]);
    let a = daemon.client.with_api_key(Some(env.key("a", None).await));
    let b = daemon.client.with_api_key(Some(env.key("b", None).await));

    // B's endless step runs while A builds: A's build is not held up by it.
    let endless = build(&b, "tpl-endless", "sleep infinity").await;
    let mine = build(&a, "tpl-mine", "echo mine > /mine").await;
    let (last, _) = wait(&a, "tpl-mine", &mine).await;
    assert_eq!(last["status"], "ready", "{last}");
    // Blocked, A's build would have started only once B's ended (at its deadline): it
    // ended first. (A's build must take less than the deadline, 60 s, for this to hold.)
    let path = format!("/templates/tpl-endless/builds/{endless}/status");
    let (_, now) = call(&b, Method::GET, &path, None).await;
    assert_eq!(now["status"], "building", "B's build still runs: {now}");

    // A's template is private: B gets 404 wherever it names it, and cannot take the name.
    for (method, path, body) in [
        (Method::GET, "/templates/aliases/tpl-mine".to_string(), None),
        (Method::GET, "/templates/tpl-mine/tags".to_string(), None),
        (Method::DELETE, "/templates/tpl-mine".to_string(), None),
        (
            Method::PATCH,
            "/templates/tpl-mine".to_string(),
            Some(json!({"public": true})),
        ),
        (
            Method::POST,
            "/templates/tags".to_string(),
            Some(json!({"target": "tpl-mine", "tags": ["b"]})),
        ),
        (
            Method::POST,
            "/sandboxes".to_string(),
            Some(json!({"templateID": "tpl-mine"})),
        ),
    ] {
        let (status, answer) = call(&b, method.clone(), &path, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
    }
    let (_, list) = call(&b, Method::GET, "/templates", None).await;
    assert!(!list.to_string().contains("tpl-mine"), "{list}");
    let (status, body) = call(
        &b,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": "tpl-mine"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // Past the step deadline B's build fails, saying so; its sandbox is gone.
    let (last, _) = wait(&b, "tpl-endless", &endless).await;
    assert_eq!(last["status"], "error", "{last}");
    let reason = last["reason"]["message"].as_str().unwrap();
    assert!(reason.contains("step deadline of 1 min"), "{reason}");
    assert!(!reason.contains(env.data().to_str().unwrap()), "{reason}");
    // Its first build failed: the name is free for anyone.
    let (status, body) = call(
        &a,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": "tpl-endless"})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    // A build requested and never started expires, and frees the name.
    let (status, body) = call(
        &b,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": "tpl-idle"})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let idle = body["buildID"].as_str().unwrap().to_string();
    let (last, _) = wait(&b, "tpl-idle", &idle).await;
    assert_eq!(last["status"], "error", "{last}");
    assert!(
        last["reason"]["message"]
            .as_str()
            .unwrap()
            .contains("not started"),
        "{last}"
    );
    let (status, body) = call(
        &a,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": "tpl-idle"})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    // An upload larger than the key's cap is 413 (announced by its length).
    let (_, link) = call(
        &b,
        Method::GET,
        &format!("/templates/x/files/{}", "ab".repeat(32)),
        None,
    )
    .await;
    let url = link["url"].as_str().unwrap();
    let path = &url[url.find("/templates/").unwrap()..];
    let req = hyper::Request::builder()
        .method(Method::PUT)
        .uri(path)
        .header("content-length", (2 << 20).to_string())
        .body(http_body_util::Full::new(bytes::Bytes::from(vec![
            0u8;
            2 << 20
        ])))
        .unwrap();
    let status = b.with_api_key(None).send(req).await.unwrap().status();
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    daemon.stop();
}
