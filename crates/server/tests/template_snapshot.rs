//! Templates built through the template API are memory snapshots (template_snapshot.rs),
//! against a real daemon (gvisor runtime, the installed minimal image): the start command
//! runs once, at build time, and every create restores its running state; a create asking
//! for another size boots and runs it itself; a rebuild and a DELETE retire the snapshot
//! and remove its files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::call;
use hyper::{Method, StatusCode};
use sandcell_client::{Client, Sandbox};
use serde_json::{Value, json};
use std::path::Path;

/// The start command writes random bytes once, then stays running.
const START_CMD: &str =
    "head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /tmp/started; exec sleep 100000";
const READY_CMD: &str = "test -s /tmp/started";

/// Builds template `name` from minimal with the start and ready commands; the log messages
/// and the snapshot id from its `e2b.json`.
async fn build(c: &Client, data: &Path, name: &str, marker: &str) -> (Vec<String>, String) {
    let (status, body) = call(
        c,
        Method::POST,
        "/v3/templates",
        Some(json!({"name": name, "cpuCount": 1, "memoryMB": 256})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let build = body["buildID"].as_str().unwrap().to_string();
    let steps = json!({
        "fromTemplate": "minimal",
        "steps": [
            {"type": "RUN", "args": [format!("echo {marker} > /built.txt"), "root"]},
            // E2B's default user and workdir for steps.
            {"type": "RUN", "args": ["whoami > who.txt; pwd >> who.txt"]},
        ],
        "startCmd": START_CMD,
        "readyCmd": READY_CMD,
    });
    let path = format!("/v2/templates/{name}/builds/{build}");
    let (status, body) = call(c, Method::POST, &path, Some(steps)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (last, messages) = common::wait_build(c, name, &build).await;
    assert_eq!(last["status"], "ready", "{last} {messages:#?}");
    let record: Value = serde_json::from_slice(
        &std::fs::read(data.join("images").join(name).join("e2b.json")).unwrap(),
    )
    .unwrap();
    let snapshot = record["snapshotID"]
        .as_str()
        .unwrap_or_else(|| panic!("no snapshotID in e2b.json: {record} {messages:#?}"))
        .to_string();
    (messages, snapshot)
}

async fn create(c: &Client, body: Value) -> Sandbox {
    let (status, body) = call(c, Method::POST, "/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    serde_json::from_value(body).unwrap()
}

/// `sandcell_template_creates_total{path="<path>"}` from `GET /metrics`.
async fn template_creates(c: &Client, path: &str) -> u64 {
    let resp = c.api(Method::GET, "/metrics", None).await.unwrap();
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    let prefix = format!("sandcell_template_creates_total{{path=\"{path}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
        .parse()
        .unwrap()
}

/// What the start command wrote, and whether it still runs, in sandbox `s`.
async fn start_state(c: &Client, s: &Sandbox) -> (String, bool) {
    let (out, code) = common::run(c, s, "cat /tmp/started").await;
    assert_eq!(code, 0, "{out}");
    let (ps, _) = common::run(c, s, "ps -o args 2>/dev/null || ps").await;
    (out, ps.contains("sleep 100000"))
}

#[tokio::test]
async fn creates_restore_the_state_the_build_snapshotted() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let data = env.data();
    let (messages, snap) = build(c, &data, "tpl-snap", "one").await;
    assert!(
        messages
            .iter()
            .any(|m| m.contains(&format!("memory snapshot {snap} taken"))),
        "{messages:#?}"
    );
    assert!(data.join("snapshots").join(&snap).is_dir());

    // Two creates: the start command ran once (same bytes), is running in both, and each is
    // a sandbox of its own with the request's env.
    let a = create(
        c,
        json!({"templateID": "tpl-snap", "timeout": 120, "envVars": {"WHO": "a"}}),
    )
    .await;
    let b = create(c, json!({"templateID": "tpl-snap:default", "timeout": 120})).await;
    let (started_a, running_a) = start_state(c, &a).await;
    let (started_b, running_b) = start_state(c, &b).await;
    assert_eq!(started_a.len(), 16, "{started_a:?}");
    assert_eq!(
        started_a, started_b,
        "the start command ran again on a create"
    );
    assert!(running_a && running_b, "the start command is not running");
    let (out, _) = common::run(c, &a, "echo $WHO $E2B_SANDBOX_ID; cat /built.txt").await;
    assert_eq!(out, format!("a {}\none\n", a.sandbox_id));
    let (out, _) = common::run(c, &b, "echo $E2B_SANDBOX_ID").await;
    assert_eq!(out.trim(), b.sandbox_id);
    // Steps ran as E2B's `user` in /home/user, and the sandboxes default to the same.
    let (out, _) = common::run(c, &b, "cat /home/user/who.txt; whoami; pwd").await;
    assert_eq!(out, "user\n/home/user\nuser\n/home/user\n");
    // The build's sandbox is gone.
    let list = c.list_sandboxes().await.unwrap();
    assert_eq!(list.len(), 2, "{list:?}");
    // Both were restores, which the metrics tell operators.
    assert_eq!(template_creates(c, "restored").await, 2);
    assert_eq!(template_creates(c, "fallback").await, 0);

    // An unchanged rebuild (while sandboxes run on it) keeps the image and the snapshot.
    let (messages, same) = build(c, &data, "tpl-snap", "one").await;
    assert_eq!(same, snap, "{messages:#?}");
    assert!(
        messages.iter().any(|m| m.contains("up to date"))
            && messages
                .iter()
                .any(|m| m.contains(&format!("memory snapshot {snap} kept"))),
        "{messages:#?}"
    );
    let again = create(c, json!({"templateID": "tpl-snap", "timeout": 120})).await;
    assert_eq!(start_state(c, &again).await.0, started_a);
    c.kill_sandbox(&again.sandbox_id).await.unwrap();

    // Another size than the snapshot's boots cold and runs the start command itself.
    let cold = create(
        c,
        json!({"templateID": "tpl-snap", "timeout": 120, "cpuCount": 2}),
    )
    .await;
    let (started_cold, running_cold) = start_state(c, &cold).await;
    assert_ne!(
        started_cold, started_a,
        "a create of another size restored the snapshot"
    );
    assert!(running_cold);
    c.kill_sandbox(&cold.sandbox_id).await.unwrap();

    // A rebuild (the image store refuses to replace an image sandboxes run on): a new
    // snapshot, and the old one's files are gone.
    c.kill_sandbox(&a.sandbox_id).await.unwrap();
    c.kill_sandbox(&b.sandbox_id).await.unwrap();
    let (_, snap2) = build(c, &data, "tpl-snap", "two").await;
    assert_ne!(snap2, snap);
    assert!(
        !data.join("snapshots").join(&snap).exists(),
        "the retired snapshot stayed"
    );
    let c2 = create(c, json!({"templateID": "tpl-snap", "timeout": 120})).await;
    let (out, _) = common::run(c, &c2, "cat /built.txt").await;
    assert_eq!(out, "two\n");
    let (started_c2, running_c2) = start_state(c, &c2).await;
    assert_ne!(started_c2, started_a);
    assert!(running_c2);

    // DELETE: refused while c2 runs, then the template and its snapshot go.
    let (status, body) = call(c, Method::DELETE, "/templates/tpl-snap", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    c.kill_sandbox(&c2.sandbox_id).await.unwrap();
    let (status, body) = call(c, Method::DELETE, "/templates/tpl-snap", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert!(
        !data.join("snapshots").join(&snap2).exists(),
        "the template's snapshot stayed"
    );
    daemon.stop();
}

/// A template rebuilt without the daemon (its `e2b.json` no longer names the snapshot): the
/// next daemon start retires the snapshot, and creates boot and run the start command.
#[tokio::test]
async fn a_snapshot_its_template_no_longer_names_is_retired_at_start() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let data = env.data();
    let (_, snap) = build(&daemon.client, &data, "tpl-orphan", "one").await;
    daemon.stop();
    let path = data.join("images/tpl-orphan/e2b.json");
    let mut record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record.as_object_mut().unwrap().remove("snapshotID");
    std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();

    let daemon = env.start(&[]);
    let c = &daemon.client;
    assert!(
        !data.join("snapshots").join(&snap).exists(),
        "the orphan snapshot stayed"
    );
    let a = create(c, json!({"templateID": "tpl-orphan", "timeout": 120})).await;
    let b = create(c, json!({"templateID": "tpl-orphan", "timeout": 120})).await;
    let (started_a, running_a) = start_state(c, &a).await;
    let (started_b, running_b) = start_state(c, &b).await;
    assert_ne!(
        started_a, started_b,
        "without a snapshot each create runs the start command"
    );
    assert!(running_a && running_b);
    daemon.stop();
}

/// A template snapshot that cannot be restored (its files damaged): creates still work, by
/// booting and running the start command.
#[tokio::test]
async fn a_broken_template_snapshot_falls_back_to_a_boot() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let data = env.data();
    let (_, snap) = build(c, &data, "tpl-broken", "one").await;
    // Every file of the snapshot emptied (the manifest stays readable in the database).
    let mut emptied = 0;
    let mut dirs = vec![data.join("snapshots").join(&snap)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.is_file() {
                std::fs::write(&path, b"").unwrap();
                emptied += 1;
            }
        }
    }
    assert!(emptied > 0);
    let a = create(c, json!({"templateID": "tpl-broken", "timeout": 120})).await;
    assert_eq!(template_creates(c, "fallback").await, 1);
    assert_eq!(template_creates(c, "restored").await, 0);
    let (started, running) = start_state(c, &a).await;
    assert_eq!(started.len(), 16, "{started:?}");
    assert!(running, "the boot did not run the start command");
    let (out, _) = common::run(c, &a, "cat /built.txt").await;
    assert_eq!(out, "one\n");
    daemon.stop();
}
