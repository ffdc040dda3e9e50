//! Lifecycle that survives faults, limits and metering, against a real `sandcell-serve` on
//! the gvisor runtime: kill -9 of the daemon and re-adoption, a sandbox killed behind the
//! daemon's back, nothing left after DELETE, vCPU/memory validation, `/usage`, `/metrics`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{minimal, run};
use hyper::{Method, StatusCode};
use sandcell_client::Client;
use sandcell_server::store::State;
use std::time::Duration;

async fn row(env: &common::Env, id: &str) -> sandcell_server::store::SandboxRow {
    let db = sandcell_server::keys::open_db(&env.data()).await.unwrap();
    let row = db.sandbox(id).await.unwrap().unwrap();
    db.close().await;
    row
}

fn handle_of(row: &sandcell_server::store::SandboxRow) -> sandcell_runtime::SandboxHandle {
    serde_json::from_str(
        row.handle
            .as_deref()
            .expect("a running sandbox has a handle"),
    )
    .unwrap()
}

async fn usage(c: &Client, query: &str) -> serde_json::Value {
    let resp = c
        .api(Method::GET, &format!("/usage{query}"), None)
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::OK, "{:?}", resp.body);
    serde_json::from_slice(&resp.body).unwrap()
}

fn vcpu_seconds(u: &serde_json::Value) -> f64 {
    u["vcpuSeconds"].as_f64().unwrap()
}

/// kill -9 of the daemon leaves its sandboxes running; the next daemon adopts them (same
/// sandbox: a file written before is still there), and one killed behind the daemon's back
/// meanwhile is marked `error` and cleaned. Metering carries on across the restart.
#[tokio::test]
async fn a_restarted_daemon_adopts_its_sandboxes_and_reaps_the_dead() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = daemon.client.clone();
    let kept = c.create_sandbox(&minimal(Some(300))).await.unwrap();
    let doomed = c.create_sandbox(&minimal(Some(300))).await.unwrap();
    assert_eq!(run(&c, &kept, "echo before > /tmp/mark").await.1, 0);
    let doomed_handle = handle_of(&row(&env, &doomed.sandbox_id).await);
    let used_before = vcpu_seconds(&usage(&c, "").await);
    daemon.kill9();

    // Behind the daemon's back: the doomed sandbox's runsc dies.
    // SAFETY: kill with a pid read from our own database and a valid signal.
    unsafe { libc::kill(doomed_handle.pid as i32, libc::SIGKILL) };
    for _ in 0..200 {
        if !std::path::Path::new(&format!("/proc/{}", doomed_handle.pid)).exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let daemon = env.start(&[]);
    let c = daemon.client.clone();
    let detail = c.get_sandbox(&kept.sandbox_id).await.unwrap();
    assert_eq!(detail.listed.state, "running");
    assert_eq!(row(&env, &kept.sandbox_id).await.state, State::Running);
    let (out, code) = run(&c, &kept, "cat /tmp/mark; echo after").await;
    assert_eq!(
        (out.as_str(), code),
        ("before\nafter\n", 0),
        "the same sandbox"
    );

    let dead = row(&env, &doomed.sandbox_id).await;
    assert_eq!(dead.state, State::Error);
    assert!(
        dead.end_reason.clone().unwrap_or_default().contains("lost"),
        "{:?}",
        dead.end_reason
    );
    assert_eq!(
        c.get_sandbox(&doomed.sandbox_id)
            .await
            .unwrap_err()
            .status()
            .unwrap(),
        StatusCode::NOT_FOUND
    );
    assert!(
        env.traces_of(&doomed.sandbox_id).is_empty(),
        "{:?}",
        env.traces_of(&doomed.sandbox_id)
    );
    let listed = c.list_sandboxes().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        vcpu_seconds(&usage(&c, "").await) > used_before,
        "metered across the restart"
    );

    // An adopted sandbox is killed like any other, leaving nothing.
    c.kill_sandbox(&kept.sandbox_id).await.unwrap();
    assert_eq!(row(&env, &kept.sandbox_id).await.state, State::Killed);
    assert!(
        env.traces_of(&kept.sandbox_id).is_empty(),
        "{:?}",
        env.traces_of(&kept.sandbox_id)
    );
    daemon.stop();
}

/// A graceful stop without --kill-on-exit leaves sandboxes running too.
#[tokio::test]
async fn a_graceful_stop_keeps_sandboxes_running() {
    let env = common::Env::new();
    let daemon = env.start_with(&[]);
    let sbx = daemon
        .client
        .create_sandbox(&minimal(Some(300)))
        .await
        .unwrap();
    daemon.stop();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    assert_eq!(run(c, &sbx, "echo still").await, ("still\n".to_string(), 0));
    c.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    assert!(env.traces_of(&sbx.sandbox_id).is_empty());
    daemon.stop();
}

#[tokio::test]
async fn a_daemon_stopped_during_creates_leaves_nothing_behind() {
    // --kill-on-exit stopped while creates are under way: they end (a sandbox, or 503 once the
    // daemon stops taking creates) and nothing of theirs stays on the host. Before the daemon
    // waited for them, an unrecorded sandbox's mounts and run dir outlived it.
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let creates: Vec<_> = (0..3)
        .map(|_| {
            let c = daemon.client.clone();
            tokio::spawn(async move { c.create_sandbox(&minimal(Some(300))).await })
        })
        .collect();
    // A run dir is the first thing a boot makes: a create is under way.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while env.leftovers().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no create began");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::task::spawn_blocking(move || daemon.stop())
        .await
        .unwrap();
    let mut ids = Vec::new();
    for create in creates {
        match create.await.unwrap() {
            Ok(sbx) => ids.push(sbx.sandbox_id),
            // refused (503) or cut off by the stop: either way no sandbox was promised
            Err(e) => eprintln!("create during the stop: {e}"),
        }
    }
    assert!(env.leftovers().is_empty(), "left: {:?}", env.leftovers());
    for id in &ids {
        assert!(
            env.traces_of(id).is_empty(),
            "{id}: {:?}",
            env.traces_of(id)
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let run_dir = env.run_dir().to_string_lossy().into_owned();
    assert!(
        !mounts.lines().any(|l| l.contains(&run_dir)),
        "mounts left under {run_dir}"
    );
}

#[tokio::test]
async fn delete_leaves_no_process_container_cgroup_mount_or_file() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let sbx = c.create_sandbox(&minimal(Some(300))).await.unwrap();
    let handle = handle_of(&row(&env, &sbx.sandbox_id).await);
    let traces = env.traces_of(&sbx.sandbox_id);
    for kind in ["run dir", "runsc state", "cgroup", "mount", "process"] {
        assert!(
            traces.iter().any(|t| t.starts_with(kind)),
            "a running sandbox has a {kind} (the check can fail): {traces:?}"
        );
    }
    c.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    assert!(
        env.traces_of(&sbx.sandbox_id).is_empty(),
        "{:?}",
        env.traces_of(&sbx.sandbox_id)
    );
    assert!(!std::path::Path::new(&format!("/proc/{}", handle.pid)).exists());
    daemon.stop();
}

#[tokio::test]
async fn the_longest_lifetime_bounds_timeouts_and_ends_sandboxes_however_refreshed() {
    let env = common::Env::new();
    let daemon = env.start(&["--max-lifetime", "6s"]);
    let c = &daemon.client;
    let resp = c
        .api(
            Method::POST,
            "/sandboxes",
            Some(&serde_json::json!({"templateID": "minimal", "timeout": 7})),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::BAD_REQUEST);
    let err: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("longest sandbox lifetime of 6 s"),
        "{err}"
    );
    let sbx = c.create_sandbox(&minimal(Some(6))).await.unwrap();
    // Refreshes keep pushing its end out; the lifetime ends it anyway (the reaper checks
    // every 10 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let mut ended = false;
    while std::time::Instant::now() < deadline {
        let path = format!("/sandboxes/{}/refreshes", sbx.sandbox_id);
        let body = serde_json::json!({"duration": 60});
        let resp = c.api(Method::POST, &path, Some(&body)).await.unwrap();
        if resp.status == StatusCode::NOT_FOUND {
            ended = true;
            break;
        }
        assert_eq!(resp.status, StatusCode::NO_CONTENT);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(ended, "the sandbox outlived the longest lifetime");
    // 404 from the moment the kill begins; the reason is written when it is done.
    let mut r = row(&env, &sbx.sandbox_id).await;
    for _ in 0..100 {
        if r.state.is_final() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        r = row(&env, &sbx.sandbox_id).await;
    }
    assert!(
        r.end_reason
            .as_deref()
            .unwrap_or("")
            .contains("longest sandbox lifetime"),
        "{:?}",
        r.end_reason
    );
    daemon.stop();
}

#[tokio::test]
async fn vcpu_and_memory_are_validated_and_applied() {
    let env = common::Env::new();
    let daemon = env.start(&["--max-vcpus", "2", "--max-memory-mib", "1024"]);
    let c = &daemon.client;
    for (body, needle) in [
        (
            serde_json::json!({"templateID": "minimal", "cpuCount": 0}),
            "cpuCount",
        ),
        (
            serde_json::json!({"templateID": "minimal", "cpuCount": 3}),
            "1 to 2 vCPUs",
        ),
        (
            serde_json::json!({"templateID": "minimal", "memoryMB": 64}),
            "memoryMB",
        ),
        (
            serde_json::json!({"templateID": "minimal", "memoryMB": 2048}),
            "128 to 1024 MiB",
        ),
        (
            serde_json::json!({"templateID": "minimal", "cpuCount": "two"}),
            "invalid",
        ),
    ] {
        let resp = c
            .api(Method::POST, "/sandboxes", Some(&body))
            .await
            .unwrap();
        assert_eq!(resp.status, StatusCode::BAD_REQUEST, "{body}");
        let err: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(err["code"], 400);
        assert!(
            err["message"].as_str().unwrap().contains(needle),
            "{body}: {err}"
        );
    }
    assert!(c.list_sandboxes().await.unwrap().is_empty(), "nothing made");
    let resp = c
        .api(
            Method::POST,
            "/sandboxes",
            Some(&serde_json::json!({"templateID": "minimal", "cpuCount": 1, "memoryMB": 256})),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::CREATED);
    let sbx: sandcell_client::Sandbox = serde_json::from_slice(&resp.body).unwrap();
    let detail = c.get_sandbox(&sbx.sandbox_id).await.unwrap();
    assert_eq!((detail.listed.cpu_count, detail.listed.memory_mb), (1, 256));
    // The sandbox itself sees its memory limit.
    let (out, _) = run(c, &sbx, "grep MemTotal /proc/meminfo").await;
    let kib: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(kib <= 256 * 1024, "{out}");
    c.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    daemon.stop();
}

#[tokio::test]
async fn usage_grows_for_the_running_keys_sandboxes_only() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let user = daemon
        .client
        .with_api_key(Some(env.key("user", None).await));
    let idle = daemon
        .client
        .with_api_key(Some(env.key("idle", None).await));
    let resp = user
        .api(
            Method::POST,
            "/sandboxes",
            Some(&serde_json::json!({"templateID": "minimal", "cpuCount": 2, "memoryMB": 512})),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::CREATED);
    let sbx: sandcell_client::Sandbox = serde_json::from_slice(&resp.body).unwrap();
    let first = usage(&user, "").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = usage(&user, "").await;
    assert!(
        vcpu_seconds(&second) >= vcpu_seconds(&first) + 2.0 * 1.4,
        "2 vCPUs for 1.5 s: {first} then {second}"
    );
    let per = &second["sandboxes"][0];
    assert_eq!(per["sandboxID"], sbx.sandbox_id.as_str());
    // 512 MiB is half a GiB: GiB-seconds are a quarter of 2-vCPU-seconds.
    let ratio = per["gibSeconds"].as_f64().unwrap() / per["vcpuSeconds"].as_f64().unwrap();
    assert!((ratio - 0.25).abs() < 1e-9, "{per}");

    let nothing = usage(&idle, "").await;
    assert_eq!(vcpu_seconds(&nothing), 0.0);
    assert!(nothing["sandboxes"].as_array().unwrap().is_empty());
    let later = usage(
        &user,
        "?start=2100-01-01T00:00:00Z&end=2100-01-02T00:00:00Z",
    )
    .await;
    assert_eq!(vcpu_seconds(&later), 0.0, "a range with nothing in it");
    let resp = user
        .api(Method::GET, "/usage?start=yesterday", None)
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::BAD_REQUEST);

    user.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    let stopped = usage(&user, "").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        vcpu_seconds(&usage(&user, "").await),
        vcpu_seconds(&stopped),
        "a killed sandbox costs nothing more"
    );
    daemon.stop();
}

#[tokio::test]
async fn metrics_expose_states_create_latency_and_requests() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let c = &daemon.client;
    let sbx = c.create_sandbox(&minimal(Some(300))).await.unwrap();
    assert_eq!(run(c, &sbx, "true").await.1, 0);
    let anonymous = c.with_api_key(None);
    let resp = anonymous.api(Method::GET, "/metrics", None).await.unwrap();
    assert_eq!(resp.status, StatusCode::OK);
    let text = String::from_utf8(resp.body.to_vec()).unwrap();
    for line in [
        "sandcell_sandboxes{state=\"running\"} 1\n",
        "sandcell_sandboxes{state=\"killed\"} 0\n",
        "sandcell_sandbox_create_seconds_count 1\n",
        "sandcell_sandbox_create_seconds_bucket{le=\"+Inf\"} 1\n",
        "sandcell_api_requests_total{route=\"/v2/sandboxes\",method=\"POST\",status=\"201\"} 1\n",
        "sandcell_api_requests_total{route=\"envd-proxy\",method=\"POST\",status=\"200\"} 1\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    c.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    let resp = anonymous.api(Method::GET, "/metrics", None).await.unwrap();
    let text = String::from_utf8(resp.body.to_vec()).unwrap();
    assert!(
        text.contains("sandcell_sandboxes{state=\"killed\"} 1\n"),
        "{text}"
    );
    assert!(text.contains(
        "sandcell_api_requests_total{route=\"/sandboxes/{sandboxID}\",method=\"DELETE\",status=\"204\"} 1\n"
    ), "{text}");
    daemon.stop();
}
