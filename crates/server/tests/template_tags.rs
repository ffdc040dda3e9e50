//! E2B template tags (template_tags.rs) against a real daemon (gvisor runtime, the installed
//! minimal image): the tags a build takes when it succeeds (and a failed one does not),
//! assign, list, creates from `name:tag`, removal, a tag left on a replaced build, 400s for
//! malformed names and tags, 404 for unknown ones and for another key. The stock SDK's
//! tag functions: tests/e2b/test_template.py.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::call;
use hyper::{Method, StatusCode};
use sandcell_client::Client;
use serde_json::{Value, json};
use std::collections::BTreeMap;

const NAME: &str = "tpl-tags";

/// Requests and runs a build of `NAME` (`name` may carry a tag) with `steps`; waits for it
/// to end. Returns the build id, the tags the request answered and the final status.
async fn build(c: &Client, name: &str, tags: &[&str], run: &str) -> (String, Value, String) {
    let (status, body) = call(
        c,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": name, "tags": tags})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["buildID"].as_str().unwrap().to_string();
    let steps = json!({"fromTemplate": "minimal", "steps": [{"type": "RUN", "args": [run]}]});
    let path = format!("/v2/templates/{NAME}/builds/{id}");
    let (status, answer) = call(c, Method::POST, &path, Some(steps)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let (last, _) = common::wait_build(c, NAME, &id).await;
    let s = last["status"].as_str().unwrap().to_string();
    (id, body["tags"].clone(), s)
}

/// `GET /templates/NAME/tags` as tag → build id.
async fn tags(c: &Client) -> BTreeMap<String, String> {
    let (status, body) = call(c, Method::GET, &format!("/templates/{NAME}/tags"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body.as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert!(t["createdAt"].as_str().unwrap().ends_with('Z'), "{t}");
            let tag = t["tag"].as_str().unwrap().to_string();
            (tag, t["buildID"].as_str().unwrap().to_string())
        })
        .collect()
}

/// Creates a sandbox from `template`: the status and body; a created one is killed.
async fn create(c: &Client, template: &str) -> (StatusCode, Value) {
    let (status, body) = call(
        c,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": template, "timeout": 60})),
    )
    .await;
    if status == StatusCode::CREATED {
        let id = body["sandboxID"].as_str().unwrap();
        let (gone, _) = call(c, Method::DELETE, &format!("/sandboxes/{id}"), None).await;
        assert_eq!(gone, StatusCode::NO_CONTENT);
    }
    (status, body)
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn tags_name_builds_and_creates_follow_them() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;

    // A successful build takes its name's tag, `tags` and `default`.
    let (b1, answered, state) = build(c, &format!("{NAME}:v1"), &["stable"], "true").await;
    assert_eq!(state, "ready");
    assert_eq!(answered, json!(["v1", "stable", "default"]));
    assert_eq!(
        tags(c).await,
        map(&[("default", &b1), ("stable", &b1), ("v1", &b1)])
    );

    // Assign: the target's build gets the new tags.
    let (status, body) = call(
        c,
        Method::POST,
        "/templates/tags",
        Some(json!({"target": format!("{NAME}:v1"), "tags": ["prod", "prod", "canary"]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body, json!({"tags": ["prod", "canary"], "buildID": b1}));
    assert_eq!(tags(c).await.get("prod"), Some(&b1));

    // Creates from name:tag, and from an installed image's `default`.
    for template in [
        format!("{NAME}:prod"),
        format!("{NAME}:default"),
        "minimal:default".into(),
    ] {
        let (status, body) = create(c, &template).await;
        assert_eq!(status, StatusCode::CREATED, "{template}: {body}");
        let plain = template.split(':').next().unwrap();
        assert_eq!(body["templateID"], plain, "{body}");
    }

    // Removal: the tag is gone, creates from it are 404, removing it again is 404.
    let remove = |tags: Value| json!({"name": NAME, "tags": tags});
    let (status, body) = call(
        c,
        Method::DELETE,
        "/templates/tags",
        Some(remove(json!(["prod"]))),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert!(!tags(c).await.contains_key("prod"));
    let (status, body) = create(c, &format!("{NAME}:prod")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["code"], 404);
    // One unknown tag in the list: 404 and nothing removed.
    let (status, _) = call(
        c,
        Method::DELETE,
        "/templates/tags",
        Some(remove(json!(["canary", "prod"]))),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(tags(c).await.contains_key("canary"));

    // Malformed names and tags are 400 with E2B's error body.
    let bad: [(Method, &str, Option<Value>); 8] = [
        (
            Method::POST,
            "/templates/tags",
            Some(json!({"target": "Bad Name:v1", "tags": ["x"]})),
        ),
        (
            Method::POST,
            "/templates/tags",
            Some(json!({"target": format!("{NAME}:Bad!"), "tags": ["x"]})),
        ),
        (
            Method::POST,
            "/templates/tags",
            Some(json!({"target": NAME, "tags": []})),
        ),
        (
            Method::POST,
            "/templates/tags",
            Some(json!({"target": NAME, "tags": ["UPPER"]})),
        ),
        (
            Method::POST,
            "/templates/tags",
            Some(json!({"tags": ["x"]})),
        ),
        (
            Method::DELETE,
            "/templates/tags",
            Some(json!({"name": format!("{NAME}:v1"), "tags": ["x"]})),
        ),
        (Method::GET, "/templates/Bad!/tags", None),
        (
            Method::POST,
            "/v3/templates",
            Some(json!({"name": format!("{NAME}:no way")})),
        ),
    ];
    for (method, path, body) in bad {
        let (status, answer) = call(c, method.clone(), path, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{method} {path} {body:?}: {answer}"
        );
        assert_eq!(answer["code"], 400, "{answer}");
        assert!(answer["message"].is_string(), "{answer}");
    }
    let (status, _) = create(c, &format!("{NAME}:Bad!")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Unknown templates and tags are 404; an installed image has no tags to list.
    for (method, path, body) in [
        (
            Method::POST,
            "/templates/tags",
            Some(json!({"target": "no-such-tpl:v1", "tags": ["x"]})),
        ),
        (
            Method::POST,
            "/templates/tags",
            Some(json!({"target": format!("{NAME}:nope"), "tags": ["x"]})),
        ),
        (Method::GET, "/templates/no-such-tpl/tags", None),
        (Method::GET, "/templates/minimal/tags", None),
    ] {
        let (status, answer) = call(c, method.clone(), path, body.clone()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
        assert_eq!(answer["code"], 404);
    }
    for template in [format!("{NAME}:nope"), "minimal:v1".into()] {
        let (status, body) = create(c, &template).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{template}: {body}");
    }

    // Another key's private template is 404 on every tag route and for creates.
    let other = c.with_api_key(Some(env.key("other", None).await));
    for (method, path, body) in [
        (Method::GET, format!("/templates/{NAME}/tags"), None),
        (
            Method::POST,
            "/templates/tags".to_string(),
            Some(json!({"target": format!("{NAME}:v1"), "tags": ["mine"]})),
        ),
        (
            Method::DELETE,
            "/templates/tags".to_string(),
            Some(remove(json!(["v1"]))),
        ),
    ] {
        let (status, answer) = call(&other, method.clone(), &path, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
    }
    assert!(tags(c).await.contains_key("v1"));
    let (status, body) = create(&other, &format!("{NAME}:v1")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // Made public (E2B's PATCH), it is created from, and its tags listed, by every key;
    // still changed by its owner only.
    let path = format!("/templates/{NAME}");
    let (status, body) = call(c, Method::PATCH, &path, Some(json!({"public": true}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = create(&other, &format!("{NAME}:v1")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = call(&other, Method::GET, &format!("{path}/tags"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(&other, Method::PATCH, &path, Some(json!({"public": false}))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    // A failed build takes no tags.
    let (_, _, state) = build(c, NAME, &["broken"], "exit 1").await;
    assert_eq!(state, "error");
    assert!(!tags(c).await.contains_key("broken"));

    // A rebuild replaces the image: `default` follows it, the tags left on the first build
    // stay listed but creates from them say the build was replaced.
    let (b2, _, state) = build(c, NAME, &[], "echo again > /tmp/again").await;
    assert_eq!(state, "ready");
    let now = tags(c).await;
    assert_eq!(now.get("default"), Some(&b2));
    assert_eq!(now.get("v1"), Some(&b1));
    let (status, body) = create(c, &format!("{NAME}:v1")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("replaced"),
        "{body}"
    );
    let (status, body) = create(c, &format!("{NAME}:default")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Moving v1 onto the current build makes it usable again.
    let (status, body) = call(
        c,
        Method::POST,
        "/templates/tags",
        Some(json!({"target": NAME, "tags": ["v1"]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["buildID"], b2.as_str());
    let (status, body) = create(c, &format!("{NAME}:v1")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // Tags survive a restart; deleting the template drops them.
    daemon.stop();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    assert_eq!(tags(c).await.get("v1"), Some(&b2));
    let (status, body) = call(c, Method::DELETE, &format!("/templates/{NAME}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, _) = call(c, Method::GET, &format!("/templates/{NAME}/tags"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = create(c, &format!("{NAME}:v1")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Built again, it has the new build's tags only.
    let (b3, _, state) = build(c, NAME, &[], "true").await;
    assert_eq!(state, "ready");
    assert_eq!(tags(c).await, map(&[("default", &b3)]));
    daemon.stop();
}
