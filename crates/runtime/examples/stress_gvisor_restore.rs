//! Stress reproducer for restored gVisor sandboxes whose agent does not answer (issue 5):
//! runs N pause-to-disk / restore cycles of one sandbox (a counter process running in it,
//! as the daemon's pause/resume test does) and checks after each restore that the agent
//! answers `GET /health` and runs a command, each within a few seconds.
//!
//! ```text
//! stress_gvisor_restore [--image DIR] [--cycles N] [--fresh-ids] [--keep-stuck] [--env K=V]...
//!                       [--restore SNAPSHOT_DIR]
//! ```
//! `--fresh-ids`: each restore gets a new id (as fork children and templates do) instead
//! of the same one (as the daemon's resume does). `--keep-stuck`: on the first failed
//! check, leave that sandbox running and print how to inspect it (`runsc debug --stacks`),
//! then wait until the file it names is removed. Prints one line per cycle and a JSON
//! summary (failures by kind) on stdout. `--restore`: restore that snapshot N times (fresh
//! ids) and check each: does a bad snapshot fail every time, or only sometimes?

#![allow(clippy::unwrap_used)]

use sandcell_envd_client::{OutputKind, decode_data};
use sandcell_proto::agent::{Event, ProcessConfig, StartRequest};
use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::{
    Dirs, Image, RestoreSpec, Runtime, Sandbox, SandboxSpec, agent_client, new_sandbox_id,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a restored agent gets to answer one check (a healthy one takes milliseconds).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

const COUNTER: &str = "setsid sh -c 'echo $$ > /tmp/counter.pid; i=0; while true; do \
     i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done' </dev/null >/dev/null 2>&1 & \
     while [ ! -s /tmp/count ]; do sleep 0.01; done";

/// Runs `script` with `sh -c` through the agent; stdout, or what went wrong.
async fn sh(sb: &Arc<dyn Sandbox>, script: &str) -> Result<String, String> {
    let req = StartRequest {
        process: ProcessConfig {
            cmd: "sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Default::default()
        },
        ..Default::default()
    };
    let run = async {
        let mut stream = agent_client(sb.clone())
            .start(&req)
            .await
            .map_err(|e| format!("start: {e}"))?;
        let mut out = Vec::new();
        while let Some(ev) = stream.next().await {
            match ev.map_err(|e| format!("stream: {e}"))?.event {
                Event::Data(d) => {
                    if let Ok((OutputKind::Stdout, b)) = decode_data(&d) {
                        out.extend(b);
                    }
                }
                Event::End(_) => return Ok(String::from_utf8_lossy(&out).into_owned()),
                _ => {}
            }
        }
        Err("stream ended without an end event".to_string())
    };
    match tokio::time::timeout(CHECK_TIMEOUT, run).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
    }
}

async fn health(sb: &Arc<dyn Sandbox>) -> Result<(), String> {
    match tokio::time::timeout(CHECK_TIMEOUT, agent_client(sb.clone()).health()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("health: {e}")),
        Err(_) => Err(format!("health: no answer within {CHECK_TIMEOUT:?}")),
    }
}

/// A failure's kind, for the summary.
fn kind_of(problem: &str) -> &'static str {
    if problem.contains("no answer within") {
        "mute"
    } else if problem.contains("reset") || problem.contains("closed") || problem.contains("EOF") {
        "reset"
    } else if problem.starts_with("restore") {
        "restore"
    } else {
        "other"
    }
}

struct Args {
    image: PathBuf,
    cycles: usize,
    fresh_ids: bool,
    keep_stuck: bool,
    /// `--env K=V`: extra environment of the sandbox (e.g. RUST_BACKTRACE=1 for the agent).
    env: Vec<(String, String)>,
    /// `--restore DIR`: only restore this snapshot `cycles` times (fresh ids), checking each.
    restore: Option<PathBuf>,
}

fn parse_args() -> Args {
    let mut args = Args {
        image: PathBuf::from("/var/lib/sandcell/images/minimal"),
        cycles: 50,
        fresh_ids: false,
        keep_stuck: false,
        env: Vec::new(),
        restore: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--image" => args.image = it.next().expect("--image needs a value").into(),
            "--cycles" => {
                args.cycles = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--cycles needs a number")
            }
            "--fresh-ids" => args.fresh_ids = true,
            "--keep-stuck" => args.keep_stuck = true,
            "--restore" => args.restore = Some(it.next().expect("--restore needs a dir").into()),
            "--env" => {
                let kv = it.next().expect("--env needs K=V");
                let (k, v) = kv.split_once('=').expect("--env needs K=V");
                args.env.push((k.to_string(), v.to_string()));
            }
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// Leaves `sb` running for inspection until `flag` is removed.
async fn keep_for_inspection(rt: &GvisorRuntime, sb: &Arc<dyn Sandbox>, dirs: &Dirs, flag: &Path) {
    std::fs::write(flag, b"").unwrap();
    eprintln!(
        "KEPT {id}: runsc --root={root} debug --stacks {id}\n  console: {console}\n  \
         remove {flag} to go on",
        id = sb.id(),
        root = rt.runsc_root().display(),
        console = dirs.sandbox_run_dir(sb.id()).join("console.log").display(),
        flag = flag.display()
    );
    while flag.exists() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse_args();
    let image = Image::resolve(Path::new("/nonexistent"), &args.image.to_string_lossy()).unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("sc-stress")
        .tempdir_in("/tmp")
        .unwrap();
    let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
    let rt = GvisorRuntime::new(dirs.clone(), sandcell_runtime::net::NetRegistry::new())
        .await
        .unwrap();
    if let Some(dir) = &args.restore {
        restore_only(&rt, dir, args.cycles).await;
        return;
    }
    let mut spec = SandboxSpec::new(new_sandbox_id().unwrap(), image);
    spec.memory_mib = 256;
    spec.boot_timeout = Duration::from_secs(60);
    spec.env.extend(args.env.iter().cloned());
    let mut sb: Arc<dyn Sandbox> = Arc::from(rt.create(spec).await.unwrap());
    sb.start().await.unwrap();
    sh(&sb, COUNTER).await.unwrap();

    let mut failures: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut restores = 0usize;
    for cycle in 0..args.cycles {
        let snap_dir = tmp.path().join(format!("snap-{cycle}"));
        let t = Instant::now();
        let snap = match sb.pause_to_disk(&snap_dir).await {
            Ok(s) => s,
            Err(e) => {
                println!("cycle {cycle}: pause_to_disk FAILED: {e}");
                *failures.entry("checkpoint").or_default() += 1;
                break;
            }
        };
        let paused = t.elapsed();
        // Up to three restores of this snapshot, as the daemon does.
        let mut next: Option<Arc<dyn Sandbox>> = None;
        for attempt in 1..=3 {
            let id = if args.fresh_ids {
                new_sandbox_id().unwrap()
            } else {
                sb.id().to_string()
            };
            let mut spec = RestoreSpec::new(id);
            spec.boot_timeout = Duration::from_secs(60);
            let t = Instant::now();
            restores += 1;
            let restored = match rt.restore(&snap, spec).await {
                Ok(r) => Arc::<dyn Sandbox>::from(r),
                Err(e) => {
                    println!("cycle {cycle}.{attempt}: restore FAILED: {e}");
                    *failures.entry("restore").or_default() += 1;
                    continue;
                }
            };
            let ready = t.elapsed();
            let checked = match health(&restored).await {
                Ok(()) => sh(&restored, "cat /tmp/count")
                    .await
                    .map(|s| s.trim().to_string()),
                Err(e) => Err(e),
            };
            match checked {
                Ok(count) => {
                    println!(
                        "cycle {cycle}.{attempt}: ok (pause {paused:?}, restore to listening \
                         {ready:?}, count {count})"
                    );
                    next = Some(restored);
                    break;
                }
                Err(problem) => {
                    let kind = kind_of(&problem);
                    *failures.entry(kind).or_default() += 1;
                    println!("cycle {cycle}.{attempt}: {kind}: {problem} (restore took {ready:?})");
                    if args.keep_stuck {
                        let flag = tmp.path().join("KEEP");
                        keep_for_inspection(&rt, &restored, &dirs, &flag).await;
                    }
                    // Does a second connection get an answer?
                    let again = health(&restored).await;
                    println!("cycle {cycle}.{attempt}: second health check: {again:?}");
                    let _ = restored.destroy().await;
                }
            }
        }
        snap.delete().unwrap();
        match next {
            Some(n) => sb = n,
            None => {
                println!("cycle {cycle}: three restores failed; stopping");
                break;
            }
        }
    }
    let _ = sb.destroy().await;
    let failed: usize = failures.values().sum();
    println!(
        "{}",
        serde_json::json!({
            "restores": restores,
            "failed": failed,
            "failures": failures,
            "runsc": rt.runsc().version,
            "load": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        })
    );
}

/// Restores the snapshot in `dir` `n` times, one at a time, checking each restored agent.
async fn restore_only(rt: &GvisorRuntime, dir: &Path, n: usize) {
    let snap = sandcell_runtime::SnapshotHandle::load(dir).unwrap();
    let mut failed = 0;
    for i in 0..n {
        let mut spec = RestoreSpec::new(new_sandbox_id().unwrap());
        spec.boot_timeout = Duration::from_secs(60);
        let outcome = match rt.restore(&snap, spec).await {
            Ok(r) => {
                let r = Arc::<dyn Sandbox>::from(r);
                let checked = match health(&r).await {
                    Ok(()) => sh(&r, "cat /tmp/count").await.map(|_| ()),
                    Err(e) => Err(e),
                };
                let _ = r.destroy().await;
                checked
            }
            Err(e) => Err(format!("restore: {e}")),
        };
        if outcome.is_err() {
            failed += 1;
        }
        println!("restore {i}: {outcome:?}");
    }
    println!("{}", serde_json::json!({"restores": n, "failed": failed}));
}
