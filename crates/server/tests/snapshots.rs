//! Pause/resume, fork and named snapshots against a real `sandcell-serve` on the gvisor
//! runtime (real runsc, no mocks; needs root: fails loudly without, see common/mod.rs).
//!
//! gvisor checkpoints and restores are serialised host-wide (crates/runtime checkpoint.rs),
//! so these tests take seconds each; they assert behaviour, never speed.
//!
//! The daemon runs with `--no-network`: with a network, a sandbox resumed from a pause
//! cannot be restored again (its agent never answers: the second of the ten cycles fails
//! every time, runsc 20240729), a runtime issue reported apart; without one, ten cycles
//! pass. One pause and resume with a network is covered by tests/e2b (the SDKs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{GUARD, minimal, run};
use hyper::{Method, StatusCode};
use sandcell_client::{Client, Sandbox};
use serde_json::{Value, json};
use std::time::Duration;

async fn call(c: &Client, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let resp = c.api(method, path, body.as_ref()).await.unwrap();
    let value = if resp.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&resp.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&resp.body).into_owned()))
    };
    (resp.status, value)
}

/// Pauses `id`; retried on 503 (E2B: "cannot be paused right now; it keeps running; retry
/// later", which a loaded host gives when the agent is slow to let go of its sockets).
async fn pause(c: &Client, id: &str) -> StatusCode {
    for _ in 0..3 {
        let (status, body) = call(c, Method::POST, &format!("/sandboxes/{id}/pause"), None).await;
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return status;
        }
        eprintln!("pause {id}: 503 {body}; retrying");
    }
    StatusCode::SERVICE_UNAVAILABLE
}

/// Resume through connect (what the SDKs do); the status and the sandbox.
async fn connect(c: &Client, id: &str) -> (StatusCode, Sandbox) {
    let (status, body) = call(
        c,
        Method::POST,
        &format!("/v2/sandboxes/{id}/connect"),
        Some(json!({"timeout": 600})),
    )
    .await;
    assert!(status.is_success(), "connect: {status} {body}");
    (status, serde_json::from_value(body).unwrap())
}

async fn state(c: &Client, id: &str) -> String {
    c.get_sandbox(id).await.unwrap().listed.state
}

async fn sh(c: &Client, sb: &Sandbox, script: &str) -> String {
    let (out, code) = run(c, sb, script).await;
    assert_eq!(code, 0, "{script}: {out}");
    out
}

fn snapshot_dirs(env: &common::Env) -> Vec<String> {
    match std::fs::read_dir(env.data().join("snapshots")) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// A daemon without sandbox networks (see the module docs).
fn start(env: &common::Env) -> common::Daemon {
    env.start(&["--no-network"])
}

/// A counter started in the background (its pid in /tmp/counter.pid, its count in
/// /tmp/count every 50 ms, replaced by a rename: a filesystem-only pause that kills it
/// between a truncate and its write would leave the file empty for good).
const COUNTER: &str = "setsid sh -c 'echo $$ > /tmp/counter.pid; i=0; while true; do \
     i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done' \
     </dev/null >/dev/null 2>&1 & \
     while [ ! -s /tmp/count ]; do sleep 0.01; done";

/// The counter's last value (the file is rewritten as it counts: read until whole).
async fn count(c: &Client, sb: &Sandbox) -> u64 {
    let out = sh(
        c,
        sb,
        "for i in 1 2 3 4 5 6 7 8 9 10; do n=$(cat /tmp/count); [ -n \"$n\" ] && break; \
         sleep 0.01; done; echo $n",
    )
    .await;
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("count {out:?}"))
}

/// Ten pause/resume cycles: a counter process keeps counting from where it was (same pid),
/// a 50 MiB file keeps its checksum, the id and token stay; paused time is not billed.
/// (It was off the default run while runsc's epoll defect made about one restore in 14
/// crash or go mute: see `crates/agent/src/checkpoint.rs` for the cause and the workaround.)
#[tokio::test]
async fn ten_pause_resume_cycles_lose_nothing() {
    let env = common::Env::new();
    let daemon = start(&env);
    let c = daemon.client.clone();
    let sb = c.create_sandbox(&minimal(Some(600))).await.unwrap();
    sh(&c, &sb, COUNTER).await;
    let sum = sh(
        &c,
        &sb,
        "head -c 52428800 /dev/urandom > /home/user/big && sha256sum /home/user/big",
    )
    .await;
    let pid = sh(&c, &sb, "cat /tmp/counter.pid").await;
    let mut last = count(&c, &sb).await;
    for cycle in 0..10 {
        let begun = std::time::Instant::now();
        assert_eq!(pause(&c, &sb.sandbox_id).await, StatusCode::NO_CONTENT);
        let paused = begun.elapsed();
        assert_eq!(state(&c, &sb.sandbox_id).await, "paused", "cycle {cycle}");
        let begun = std::time::Instant::now();
        let (status, resumed) = connect(&c, &sb.sandbox_id).await;
        // For the log (not asserted): what a cycle costs.
        eprintln!(
            "cycle {cycle}: pause {paused:?}, resume {:?}",
            begun.elapsed()
        );
        assert_eq!(status, StatusCode::CREATED, "cycle {cycle}: resumed");
        assert_eq!(resumed.sandbox_id, sb.sandbox_id);
        assert_eq!(resumed.envd_access_token, sb.envd_access_token);
        let now = count(&c, &sb).await;
        assert!(
            now >= last,
            "cycle {cycle}: the count went back: {now} < {last}"
        );
        // It keeps counting after the resume.
        let mut later = now;
        for _ in 0..200 {
            later = count(&c, &sb).await;
            if later > now {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(later > now, "cycle {cycle}: the counter stopped at {now}");
        last = later;
        assert_eq!(sh(&c, &sb, "cat /tmp/counter.pid").await, pid);
        assert_eq!(
            sh(&c, &sb, "sha256sum /home/user/big").await,
            sum,
            "cycle {cycle}"
        );
    }
    c.kill_sandbox(&sb.sandbox_id).await.unwrap();
    assert!(snapshot_dirs(&env).is_empty(), "{:?}", snapshot_dirs(&env));
    assert!(env.traces_of(&sb.sandbox_id).is_empty());
    daemon.stop();
}

/// E2B's codes: 409 pausing a paused sandbox, 404 unknown or another key's, /resume 409 on
/// a running one, connect 200 running / 201 resumed; list's state filter; paused time is
/// not billed; autoPause pauses at the timeout; a paused sandbox can be killed.
#[tokio::test]
async fn pause_codes_listing_metering_and_auto_pause() {
    let env = common::Env::new();
    let daemon = start(&env);
    let c = daemon.client.clone();
    let other = c.with_api_key(Some(env.key("other", None).await));
    let sb = c.create_sandbox(&minimal(Some(600))).await.unwrap();
    let id = sb.sandbox_id.clone();

    assert_eq!(
        pause(&c, "sc-0000000000000000").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(pause(&other, &id).await, StatusCode::NOT_FOUND);
    let (status, _) = call(&c, Method::POST, &format!("/sandboxes/{id}/resume"), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "resume of a running one");
    assert_eq!(connect(&c, &id).await.0, StatusCode::OK);
    assert_eq!(pause(&c, &id).await, StatusCode::NO_CONTENT);
    assert_eq!(pause(&c, &id).await, StatusCode::CONFLICT);
    let paused = c
        .list_sandboxes_where(&sandcell_client::ListFilter {
            states: vec!["paused".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].state, "paused");
    let running = c
        .list_sandboxes_where(&sandcell_client::ListFilter {
            states: vec!["running".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(running.is_empty());
    // The envd proxy does not reach a paused sandbox.
    let resp = c.envd(&sb, common::start_request("true")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);

    // Paused: its usage does not grow.
    let used = |u: Value| u["sandboxes"][0]["runningSeconds"].as_f64().unwrap();
    let (_, before) = call(&c, Method::GET, "/usage", None).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, after) = call(&c, Method::GET, "/usage", None).await;
    assert_eq!(used(before.clone()), used(after), "paused time is billed");

    let (status, body) = call(
        &c,
        Method::POST,
        &format!("/sandboxes/{id}/resume"),
        Some(json!({"timeout": 300})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(sh(&c, &sb, "echo back").await, "back\n");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (_, resumed) = call(&c, Method::GET, "/usage", None).await;
    assert!(used(resumed) > used(before), "running again is billed");

    // A paused sandbox is killed like a running one, its snapshot with it.
    assert_eq!(pause(&c, &id).await, StatusCode::NO_CONTENT);
    assert_eq!(snapshot_dirs(&env).len(), 1);
    c.kill_sandbox(&id).await.unwrap();
    assert!(snapshot_dirs(&env).is_empty(), "{:?}", snapshot_dirs(&env));
    assert_eq!(pause(&c, &id).await, StatusCode::NOT_FOUND);

    // autoPause: paused, not killed, at the timeout; connect resumes it.
    let (status, body) = call(
        &c,
        Method::POST,
        "/v2/sandboxes",
        Some(json!({"templateID": "minimal", "timeout": 5, "autoPause": true})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let auto: Sandbox = serde_json::from_value(body).unwrap();
    let (_, detail) = call(
        &c,
        Method::GET,
        &format!("/sandboxes/{}", auto.sandbox_id),
        None,
    )
    .await;
    assert_eq!(detail["lifecycle"]["onTimeout"], "pause");
    sh(&c, &auto, "echo kept > /home/user/kept").await;
    let deadline = tokio::time::Instant::now() + GUARD;
    while state(&c, &auto.sandbox_id).await != "paused" {
        assert!(tokio::time::Instant::now() < deadline, "never auto-paused");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(connect(&c, &auto.sandbox_id).await.0, StatusCode::CREATED);
    assert_eq!(sh(&c, &auto, "cat /home/user/kept").await, "kept\n");
    c.kill_sandbox(&auto.sandbox_id).await.unwrap();
    daemon.stop();
}

/// A paused sandbox survives a daemon restart (kill -9): the next daemon leaves it paused
/// and resumes it with the same id, processes and files.
#[tokio::test]
async fn a_paused_sandbox_survives_a_daemon_restart() {
    let env = common::Env::new();
    let daemon = start(&env);
    let c = daemon.client.clone();
    let sb = c.create_sandbox(&minimal(Some(600))).await.unwrap();
    sh(&c, &sb, COUNTER).await;
    sh(&c, &sb, "echo before > /home/user/mark").await;
    let pid = sh(&c, &sb, "cat /tmp/counter.pid").await;
    assert_eq!(pause(&c, &sb.sandbox_id).await, StatusCode::NO_CONTENT);
    daemon.kill9();

    let daemon = start(&env);
    let c = daemon.client.clone();
    assert_eq!(state(&c, &sb.sandbox_id).await, "paused");
    let (status, resumed) = connect(&c, &sb.sandbox_id).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(sh(&c, &resumed, "cat /home/user/mark").await, "before\n");
    assert_eq!(sh(&c, &resumed, "cat /tmp/counter.pid").await, pid);
    let (out, _) = run(&c, &resumed, &format!("kill -0 {}", pid.trim())).await;
    assert!(out.is_empty());
    c.kill_sandbox(&sb.sandbox_id).await.unwrap();
    assert!(snapshot_dirs(&env).is_empty(), "{:?}", snapshot_dirs(&env));
    daemon.stop();
}

/// Fork: children are sandboxes of their own (a write in one is seen neither in the other
/// nor in the parent), get different random numbers and the host's wall clock, count
/// against the key's limit, and show their parent; the parent keeps running.
#[tokio::test]
async fn fork_children_are_independent() {
    let env = common::Env::new();
    let daemon = start(&env);
    let key = env.key("three", Some(3)).await;
    let c = daemon.client.with_api_key(Some(key));
    let parent = c.create_sandbox(&minimal(Some(600))).await.unwrap();
    sh(&c, &parent, "echo parent > /home/user/mark").await;
    let (status, body) = call(
        &c,
        Method::POST,
        &format!("/sandboxes/{}/fork", parent.sandbox_id),
        Some(json!({"count": 3, "timeout": 600})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let results = body.as_array().unwrap();
    assert_eq!(results.len(), 3);
    // The limit of 3 leaves room for two children.
    assert_eq!(results[2]["error"]["code"], 429, "{body}");
    assert!(results[2].get("sandbox").is_none());
    let children: Vec<Sandbox> = results[..2]
        .iter()
        .map(|r| serde_json::from_value(r["sandbox"].clone()).unwrap())
        .collect();
    assert_ne!(children[0].sandbox_id, children[1].sandbox_id);
    assert_ne!(children[0].envd_access_token, parent.envd_access_token);

    for (i, child) in children.iter().enumerate() {
        assert_eq!(sh(&c, child, "cat /home/user/mark").await, "parent\n");
        sh(&c, child, &format!("echo child{i} > /home/user/mark")).await;
    }
    assert_eq!(
        sh(&c, &children[0], "cat /home/user/mark").await,
        "child0\n"
    );
    assert_eq!(
        sh(&c, &children[1], "cat /home/user/mark").await,
        "child1\n"
    );
    assert_eq!(sh(&c, &parent, "cat /home/user/mark").await, "parent\n");

    let random = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'";
    let r0 = sh(&c, &children[0], random).await;
    let r1 = sh(&c, &children[1], random).await;
    let rp = sh(&c, &parent, random).await;
    assert_eq!(r0.len(), 32, "{r0}");
    assert!(r0 != r1 && r0 != rp && r1 != rp, "{r0} {r1} {rp}");
    for child in &children {
        let guest: i64 = sh(&c, child, "date +%s").await.trim().parse().unwrap();
        let host = (crate_now_ms() / 1000) as i64;
        assert!(
            (guest - host).abs() <= 5,
            "guest clock {guest}, host {host}"
        );
    }

    let (_, detail) = call(
        &c,
        Method::GET,
        &format!("/sandboxes/{}", children[0].sandbox_id),
        None,
    )
    .await;
    assert_eq!(detail["parentID"], parent.sandbox_id.as_str());
    let (_, detail) = call(
        &c,
        Method::GET,
        &format!("/sandboxes/{}", parent.sandbox_id),
        None,
    )
    .await;
    let listed: Vec<&str> = detail["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        vec![
            children[0].sandbox_id.as_str(),
            children[1].sandbox_id.as_str()
        ]
    );

    // The fork's files stay while a sandbox uses them, and go with the last one.
    c.kill_sandbox(&children[0].sandbox_id).await.unwrap();
    assert_eq!(
        sh(&c, &children[1], "cat /home/user/mark").await,
        "child1\n"
    );
    assert_eq!(snapshot_dirs(&env).len(), 1);
    c.kill_sandbox(&children[1].sandbox_id).await.unwrap();
    c.kill_sandbox(&parent.sandbox_id).await.unwrap();
    assert!(snapshot_dirs(&env).is_empty(), "{:?}", snapshot_dirs(&env));
    let (status, _) = call(
        &c,
        Method::POST,
        &format!("/sandboxes/{}/fork", parent.sandbox_id),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    daemon.stop();
}

fn crate_now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// A named snapshot (the source keeps running) used as a template by 20 concurrent
/// creates; listed, deleted (404 after), its files gone with the last sandbox using them.
#[tokio::test]
async fn a_snapshot_is_a_template_for_twenty_concurrent_creates() {
    let env = common::Env::new();
    let daemon = start(&env);
    let c = daemon.client.clone();
    let source = c.create_sandbox(&minimal(Some(600))).await.unwrap();
    sh(&c, &source, "echo from-snapshot > /home/user/mark").await;
    let (status, info) = call(
        &c,
        Method::POST,
        &format!("/sandboxes/{}/snapshots", source.sandbox_id),
        Some(json!({"name": "tmpl"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{info}");
    assert_eq!(info["snapshotID"], "tmpl");
    assert_eq!(info["names"], json!(["tmpl"]));
    // The source keeps running, its files and state intact.
    assert_eq!(state(&c, &source.sandbox_id).await, "running");
    assert_eq!(
        sh(&c, &source, "cat /home/user/mark").await,
        "from-snapshot\n"
    );
    let (status, list) = call(&c, Method::GET, "/snapshots", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["sandboxID"], source.sandbox_id.as_str());

    let mut creates = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let c = c.clone();
        creates.spawn(async move {
            let req = sandcell_client::NewSandbox {
                template_id: "tmpl".into(),
                timeout: Some(600),
                ..Default::default()
            };
            c.create_sandbox(&req).await
        });
    }
    let mut made = Vec::new();
    while let Some(done) = creates.join_next().await {
        made.push(done.unwrap().unwrap());
    }
    let mut ids: Vec<&str> = made.iter().map(|s| s.sandbox_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20);
    for sb in &made {
        assert_eq!(sh(&c, sb, "cat /home/user/mark").await, "from-snapshot\n");
        assert_eq!(sb.template_id, "tmpl");
    }

    // Deleted: no longer a template, its files kept while sandboxes use them.
    let (status, _) = call(&c, Method::DELETE, "/snapshots/tmpl", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = call(&c, Method::DELETE, "/snapshots/tmpl", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let err = c
        .create_sandbox(&sandcell_client::NewSandbox {
            template_id: "tmpl".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::NOT_FOUND));
    assert_eq!(snapshot_dirs(&env).len(), 1);
    for sb in &made {
        c.kill_sandbox(&sb.sandbox_id).await.unwrap();
    }
    c.kill_sandbox(&source.sandbox_id).await.unwrap();
    assert!(snapshot_dirs(&env).is_empty(), "{:?}", snapshot_dirs(&env));
    daemon.stop();
}

/// `pause` with `memory: false` (E2B's filesystem-only pause; every sandbox has a disk by
/// default): the files, deletions of image files included, come back, the processes do not,
/// the id, token and env stay; state paused with `pauseMode: filesystem`. A later pause with
/// memory of the resumed sandbox (whose root stands on the saved files) resumes too, and
/// kill leaves no snapshot and no disk.
#[tokio::test]
async fn a_filesystem_only_pause_keeps_the_files_and_ends_the_processes() {
    let env = common::Env::new();
    let daemon = start(&env);
    let c = daemon.client.clone();
    let sb = c.create_sandbox(&minimal(Some(600))).await.unwrap();
    let id = sb.sandbox_id.clone();
    sh(&c, &sb, COUNTER).await;
    sh(
        &c,
        &sb,
        "mkdir -p /home/user/d && echo kept > /home/user/d/f && echo x > /home/user/d/g",
    )
    .await;

    let (status, body) = call(
        &c,
        Method::POST,
        &format!("/sandboxes/{id}/pause"),
        Some(json!({"memory": false})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(state(&c, &id).await, "paused");
    let (_, detail) = call(&c, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(detail["pauseMode"], "filesystem", "{detail}");

    let (status, resumed) = connect(&c, &id).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(resumed.sandbox_id, id);
    assert_eq!(resumed.envd_access_token, sb.envd_access_token);
    assert_eq!(sh(&c, &sb, "cat /home/user/d/f").await.trim(), "kept");
    assert_eq!(sh(&c, &sb, "echo $E2B_SANDBOX_ID").await.trim(), id);
    // The counter did not come back: its count stands still.
    let before = count(&c, &sb).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(count(&c, &sb).await, before, "a process survived the pause");

    // Its root is [its upper, the saved files, image]: a pause with memory flattens both.
    // A deletion of a saved file is a whiteout in its upper: it stays deleted.
    sh(
        &c,
        &sb,
        "echo second > /home/user/second && rm /home/user/d/g",
    )
    .await;
    assert_eq!(pause(&c, &id).await, StatusCode::NO_CONTENT);
    let (status, _) = connect(&c, &id).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        sh(
            &c,
            &sb,
            "cat /home/user/d/f /home/user/second; ls /home/user/d"
        )
        .await,
        "kept\nsecond\nf\n"
    );
    c.kill_sandbox(&id).await.unwrap();
    assert!(snapshot_dirs(&env).is_empty(), "{:?}", snapshot_dirs(&env));
    let disks: Vec<_> = std::fs::read_dir(env.data().join("disks"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(disks.is_empty(), "disks left: {disks:?}");
    assert!(env.traces_of(&id).is_empty());
    daemon.stop();
}

/// Without a disk the files live in the sandbox's memory: `memory: false` is 400, saying
/// what to do, and the sandbox runs on.
#[tokio::test]
async fn a_filesystem_only_pause_without_a_disk_is_refused() {
    let env = common::Env::new();
    let daemon = env.start(&["--no-network", "--disk-mib", "0"]);
    let c = daemon.client.clone();
    let sb = c.create_sandbox(&minimal(Some(600))).await.unwrap();
    let (status, body) = call(
        &c,
        Method::POST,
        &format!("/sandboxes/{}/pause", sb.sandbox_id),
        Some(json!({"memory": false})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("--disk-mib"),
        "{body}"
    );
    assert_eq!(state(&c, &sb.sandbox_id).await, "running");
    assert_eq!(sh(&c, &sb, "echo up").await.trim(), "up");
    c.kill_sandbox(&sb.sandbox_id).await.unwrap();
    daemon.stop();
}
