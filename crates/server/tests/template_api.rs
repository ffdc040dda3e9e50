//! The E2B template build routes (template_api.rs) against a real daemon (gvisor runtime,
//! the installed minimal image): malformed requests, a failing RUN step whose status says
//! why with its output, and that status after a restart; a built template's size in
//! GET /templates and its DELETE (refused while a sandbox or snapshot needs it). The stock
//! SDK's round trip is tests/e2b/test_template.py.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{call, wait_build as wait};
use hyper::{Method, StatusCode};
use sandcell_client::Client;
use serde_json::{Value, json};

/// `POST /v3/templates` for `name`: the build id.
async fn request(c: &Client, name: &str) -> String {
    let (status, body) = call(
        c,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": name})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["templateID"], name);
    body["buildID"].as_str().unwrap().to_string()
}

/// A one-file ustar archive (the test crates have no tar writer).
fn tar_of(name: &str, content: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    let fields: [(usize, String); 5] = [
        (100, "0000644\0".into()),
        (108, "0000000\0".into()),
        (116, "0000000\0".into()),
        (124, format!("{:011o}\0", content.len())),
        (136, "00000000000\0".into()),
    ];
    for (at, text) in fields {
        header[at..at + text.len()].copy_from_slice(text.as_bytes());
    }
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(content);
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

/// PUTs `body` to the upload URL `GET .../files/{hash}` gave (no API key: its token).
async fn upload(c: &Client, url: &str, body: Vec<u8>) -> StatusCode {
    let path = &url[url.find("/templates/").unwrap()..];
    let req = hyper::Request::builder()
        .method(Method::PUT)
        .uri(path)
        .header("content-length", body.len())
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    c.with_api_key(None).send(req).await.unwrap().status()
}

#[tokio::test]
async fn malformed_requests_are_400_and_names_are_checked() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let (status, body) = call(
        c,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": "Bad Name!"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["code"], 400);
    let (status, _) = call(c, Method::POST, "/v3/templates", Some(json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = call(
        c,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": "minimal"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "an installed image: {body}");

    let build = request(c, "tpl-bad").await;
    let start = format!("/v2/templates/tpl-bad/builds/{build}");
    for bad in [
        json!({"fromTemplate": "minimal", "steps": [{"type": "MAGIC", "args": []}]}),
        json!({"fromTemplate": "minimal", "steps": [{"type": "RUN"}]}),
        json!({"fromTemplate": "minimal", "steps": [{"type": "COPY", "args": ["a", "/b"]}]}),
        json!({"fromTemplate": "minimal", "steps": [{"type": "COPY", "args": ["a", "/b"],
            "filesHash": "0123456789abcdef0123"}]}),
        json!({"fromTemplate": "no-such-template", "steps": []}),
        json!({"steps": [{"type": "RUN", "args": ["true"]}]}),
        json!({"fromTemplate": "minimal", "steps": "RUN true"}),
    ] {
        let (status, body) = call(c, Method::POST, &start, Some(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad} -> {body}");
        assert!(body["message"].is_string());
    }
    // Unknown builds, and builds of another key, are 404.
    let (status, _) = call(
        c,
        Method::POST,
        "/v2/templates/tpl-bad/builds/nope",
        Some(json!({"fromTemplate": "minimal"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let other = c.with_api_key(Some(env.key("other", None).await));
    let (status, _) = call(
        &other,
        Method::GET,
        &format!("/templates/tpl-bad/builds/{build}/status"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Upload URLs take their token, not an API key.
    let (status, body) = call(
        c,
        Method::GET,
        "/templates/tpl-bad/files/0123456789abcdef0123",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["present"], false);
    assert!(body["url"].as_str().unwrap().contains("token="));
    let (status, _) = call(
        c,
        Method::PUT,
        "/templates/tpl-bad/files/0123456789abcdef0123?token=forged",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // An archive with a path out of its directory is refused and nothing is kept.
    let files = "/templates/tpl-bad/files/0123456789abcdef0123";
    let url = body["url"].as_str().unwrap();
    let evil = tar_of("../escaped.txt", b"x");
    assert_eq!(upload(c, url, evil).await, StatusCode::BAD_REQUEST);
    let (_, body) = call(c, Method::GET, files, None).await;
    assert_eq!(body["present"], false);
    assert!(!env.data().join("cache/e2b-files/escaped.txt").exists());
    // A good one is then present, for that key only.
    let url = body["url"].as_str().unwrap();
    let good = tar_of("dir/ok.txt", b"fine");
    assert_eq!(upload(c, url, good).await, StatusCode::OK);
    let (_, body) = call(c, Method::GET, files, None).await;
    assert_eq!(body["present"], true);
    let (_, body) = call(&other, Method::GET, files, None).await;
    assert_eq!(body["present"], false, "another key's uploads are its own");
    daemon.stop();
}

#[tokio::test]
async fn a_failing_run_step_is_an_error_with_its_output_and_survives_a_restart() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let build = request(c, "tpl-fail").await;
    let steps = json!({
        "fromTemplate": "minimal",
        "steps": [
            {"type": "ENV", "args": ["WHO", "the step"]},
            {"type": "RUN", "args": ["echo output of $WHO; exit 3"]},
            {"type": "RUN", "args": ["echo never"]},
        ],
    });
    let path = format!("/v2/templates/tpl-fail/builds/{build}");
    let (status, body) = call(c, Method::POST, &path, Some(steps.clone())).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, _) = call(c, Method::POST, &path, Some(steps)).await;
    assert_eq!(status, StatusCode::CONFLICT, "started twice");

    let (last, messages) = wait(c, "tpl-fail", &build).await;
    assert_eq!(last["status"], "error", "{last}");
    let reason = &last["reason"];
    assert_eq!(reason["step"], "2", "{reason}");
    assert!(
        reason["message"]
            .as_str()
            .unwrap()
            .contains("exit status 3"),
        "{reason}"
    );
    assert!(
        messages.iter().any(|m| m == "output of the step"),
        "{messages:?}"
    );
    assert!(!messages.iter().any(|m| m == "never"), "{messages:?}");
    assert!(
        reason["logEntries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["level"] == "error"),
        "{reason}"
    );
    assert!(
        !env.data().join("images/tpl-fail").exists(),
        "no template from a failed build"
    );

    // A restarted daemon answers from the database.
    daemon.stop();
    let daemon = env.start(&[]);
    let (again, messages_again) = wait(&daemon.client, "tpl-fail", &build).await;
    assert_eq!(again["status"], "error");
    assert_eq!(again["reason"]["step"], "2");
    assert_eq!(messages_again, messages);

    // The logs route gives the same log by time: forward from the start, backward newest
    // first, a level filter, and 400 for a bad direction.
    let logs_path = format!("/templates/tpl-fail/builds/{build}/logs");
    let c = &daemon.client;
    let (status, body) = call(c, Method::GET, &logs_path, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let forward: Vec<String> = body["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert!(
        forward.iter().any(|m| m == "output of the step"),
        "{forward:?}"
    );
    let (_, body) = call(
        c,
        Method::GET,
        &format!("{logs_path}?direction=backward&limit=1"),
        None,
    )
    .await;
    let newest = body["logs"].as_array().unwrap();
    assert_eq!(newest.len(), 1, "{body}");
    assert_eq!(
        newest[0]["message"].as_str().unwrap(),
        forward.last().unwrap(),
        "backward starts at the newest entry"
    );
    let (_, body) = call(c, Method::GET, &format!("{logs_path}?level=error"), None).await;
    let errors = body["logs"].as_array().unwrap();
    assert!(!errors.is_empty(), "{body}");
    assert!(errors.iter().all(|e| e["level"] == "error"), "{body}");
    let (status, _) = call(c, Method::GET, &format!("{logs_path}?direction=up"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    daemon.stop();
}

#[tokio::test]
async fn built_templates_are_listed_with_their_size_and_deleted_when_unused() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    // DELETE: unknown is 404, an installed image is 400 and stays.
    let (status, body) = call(c, Method::DELETE, "/templates/no-such-tpl", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = call(c, Method::DELETE, "/templates/minimal", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("installed image"),
        "{body}"
    );
    assert!(env.data().join("images/minimal").is_dir());

    let (status, body) = call(
        c,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": "tpl-del", "cpuCount": 1, "memoryMB": 256})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let build = body["buildID"].as_str().unwrap().to_string();
    let steps = json!({
        "fromTemplate": "minimal",
        "steps": [{"type": "RUN", "args": ["echo built > /built.txt", "root"]}],
    });
    let path = format!("/v2/templates/tpl-del/builds/{build}");
    let (status, body) = call(c, Method::POST, &path, Some(steps)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (last, _) = wait(c, "tpl-del", &build).await;
    assert_eq!(last["status"], "ready", "{last}");

    // GET /templates: the built template's own size and build id; the installed ones' defaults.
    let (status, list) = call(c, Method::GET, "/templates", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let find = |list: &Value, name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|t| t["templateID"] == name)
            .cloned()
    };
    let tpl = find(&list, "tpl-del").expect("the built template is listed");
    assert_eq!(tpl["cpuCount"], 1, "{tpl}");
    assert_eq!(tpl["memoryMB"], 256, "{tpl}");
    assert_eq!(tpl["buildID"], build.as_str(), "{tpl}");
    let minimal = find(&list, "minimal").expect("minimal is listed");
    assert_eq!(minimal["memoryMB"], 512, "{minimal}");

    // In use by a running sandbox, then by a paused one: 409, and it stays.
    let (status, sbx) = call(
        c,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "tpl-del", "timeout": 120})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{sbx}");
    let id = sbx["sandboxID"].as_str().unwrap().to_string();
    let (status, body) = call(c, Method::DELETE, "/templates/tpl-del", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["message"].as_str().unwrap().contains(&id), "{body}");
    let (status, body) = call(c, Method::POST, &format!("/sandboxes/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = call(c, Method::DELETE, "/templates/tpl-del", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "paused: {body}");
    assert!(env.data().join("images/tpl-del/template.json").is_file());

    let (status, body) = call(c, Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");

    // A snapshot taken of a sandbox from it needs it too, after that sandbox is gone.
    let (status, sbx) = call(
        c,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "tpl-del", "timeout": 120})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{sbx}");
    let id = sbx["sandboxID"].as_str().unwrap().to_string();
    let snapshots = format!("/sandboxes/{id}/snapshots");
    let (status, body) = call(
        c,
        Method::POST,
        &snapshots,
        Some(json!({"name": "tpl-del-snap"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = call(c, Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = call(c, Method::DELETE, "/templates/tpl-del", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("snapshot"),
        "{body}"
    );
    let (status, body) = call(c, Method::DELETE, "/templates/tpl-del-snap", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "the snapshot: {body}");

    // Unused: deleted, gone from the list, and creates from it fail.
    let (status, body) = call(c, Method::DELETE, "/templates/tpl-del", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert!(!env.data().join("images/tpl-del").exists());
    let (_, list) = call(c, Method::GET, "/templates", None).await;
    assert!(find(&list, "tpl-del").is_none(), "{list}");
    let (status, body) = call(
        c,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "tpl-del"})),
    )
    .await;
    assert!(
        status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST,
        "{status} {body}"
    );
    let (status, _) = call(c, Method::DELETE, "/templates/tpl-del", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    daemon.stop();
}
