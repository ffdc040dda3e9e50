//! Volumes without a bucket: a daemon started without `--s3-endpoint` answers every
//! `/volumes` route, the content API and a create with `volumeMounts` with 501 naming the
//! flag (the volumes themselves are tested against a real S3 server in tests/e2b).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::call;
use hyper::{Method, StatusCode};

#[tokio::test]
async fn volumes_are_501_naming_the_flag_without_a_bucket() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let mounts = serde_json::json!({
        "templateID": "minimal",
        "volumeMounts": [{"name": "v", "path": "/mnt/v"}],
    });
    for (method, path, body) in [
        (Method::GET, "/volumes", None),
        (
            Method::POST,
            "/volumes",
            Some(serde_json::json!({"name": "v"})),
        ),
        (Method::GET, "/volumes/v", None),
        (Method::DELETE, "/volumes/v", None),
        (Method::GET, "/volumecontent/vol-0/dir?path=/", None),
        (Method::POST, "/sandboxes", Some(mounts)),
    ] {
        let (status, json) = call(c, method.clone(), path, body).await;
        assert_eq!(
            status,
            StatusCode::NOT_IMPLEMENTED,
            "{method} {path}: {json}"
        );
        let message = json["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("--s3-endpoint"),
            "{method} {path}: {message}"
        );
    }
    // A create without volumes is untouched.
    let (status, json) = call(
        c,
        Method::POST,
        "/sandboxes",
        Some(serde_json::json!({"templateID": "minimal"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    daemon.stop();
}
