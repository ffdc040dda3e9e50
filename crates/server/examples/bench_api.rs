//! Benchmark of the daemon as a client sees it, driven by `bench/api/run.sh`; prints JSON.
//!
//! - time_to_interactive: `POST /sandboxes` until the first `echo` through the envd proxy
//!   (`process.Process/Start`) has returned its output, one sandbox at a time (each killed,
//!   untimed, before the next).
//! - creates_per_second: `--clients` clients creating `--per-client` sandboxes each, all at
//!   once; created sandboxes divided by the wall time from the first request to the last
//!   answer (all killed afterwards, untimed).
//!
//! It starts its own `sandcell-serve` (gvisor, loopback, a temporary data dir with the
//! image linked in). Usage:
//! bench_api --serve PATH --image DIR [--runs N] [--clients N] [--per-client N]

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use sandcell_client::{Client, NewSandbox, Sandbox};
use sandcell_proto::agent::{Event, ProcessConfig, ProcessEvent, StartRequest, envelope};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Args {
    serve: PathBuf,
    image: PathBuf,
    runs: usize,
    clients: usize,
    per_client: usize,
}

fn args() -> Args {
    let mut a = Args {
        serve: PathBuf::new(),
        image: PathBuf::new(),
        runs: 20,
        clients: 8,
        per_client: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--serve" => a.serve = value.into(),
            "--image" => a.image = value.into(),
            "--runs" => a.runs = value.parse().unwrap(),
            "--clients" => a.clients = value.parse().unwrap(),
            "--per-client" => a.per_client = value.parse().unwrap(),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(a.serve.is_file(), "--serve PATH of sandcell-serve");
    assert!(
        a.image.join("rootfs").is_dir(),
        "--image DIR of an installed image"
    );
    a
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * (s.len() as f64 - 1.0)).round() as usize;
    s[rank.min(s.len() - 1)]
}

fn echo_request() -> Request<Full<Bytes>> {
    let start = StartRequest {
        process: ProcessConfig {
            cmd: "/bin/echo".into(),
            args: vec!["ready".into()],
            ..Default::default()
        },
        stdin: Some(false),
        tag: None,
    };
    let body = envelope::encode(0, &serde_json::to_vec(&start).unwrap());
    Request::post("/process.Process/Start")
        .header("content-type", "application/connect+json")
        .header("content-length", body.len())
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// Runs `echo ready` in the sandbox; its stdout.
async fn echo(client: &Client, sandbox: &Sandbox) -> String {
    let resp = client.envd(sandbox, echo_request()).await.unwrap();
    assert!(resp.status().is_success(), "Start: {}", resp.status());
    let mut body = resp.into_body();
    let mut decoder = envelope::Decoder::new(1 << 20);
    let mut out = Vec::new();
    loop {
        while let Some(env) = decoder.next().unwrap() {
            if env.is_end() {
                return String::from_utf8_lossy(&out).into_owned();
            }
            let ev: ProcessEvent = serde_json::from_slice(&env.message).unwrap();
            match ev.event {
                Event::Data(d) => {
                    if let Some(b64) = d.stdout {
                        out.extend(
                            base64::engine::general_purpose::STANDARD
                                .decode(b64)
                                .unwrap(),
                        );
                    }
                }
                Event::End(_) => return String::from_utf8_lossy(&out).into_owned(),
                _ => {}
            }
        }
        match body.frame().await {
            Some(frame) => {
                if let Ok(data) = frame.unwrap().into_data() {
                    decoder.push(&data);
                }
            }
            None => return String::from_utf8_lossy(&out).into_owned(),
        }
    }
}

fn new_sandbox() -> NewSandbox {
    NewSandbox {
        template_id: "minimal".into(),
        timeout: Some(600),
        ..Default::default()
    }
}

#[tokio::main]
async fn main() {
    let a = args();
    let tmp = tempfile::Builder::new()
        .prefix("sc-bench")
        .tempdir_in("/tmp")
        .unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(data.join("images")).unwrap();
    std::os::unix::fs::symlink(&a.image, data.join("images/minimal")).unwrap();
    let mut daemon = Command::new(&a.serve)
        .env("SANDCELL_RUN_DIR", tmp.path().join("run"))
        .arg("--data-dir")
        .arg(&data)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--runtime",
            "gvisor",
            "--kill-on-exit",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(daemon.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("sandcell serve: listening on ")
        .unwrap_or_else(|| panic!("unexpected first line from the daemon: {line:?}"))
        .to_string();
    let key = std::fs::read_to_string(data.join("admin.key")).unwrap();
    let client = Client::new(&url, Some(key.trim().to_string())).unwrap();

    // Warm-up (page cache, runsc's first start), untimed.
    let warm = client.create_sandbox(&new_sandbox()).await.unwrap();
    echo(&client, &warm).await;
    client.kill_sandbox(&warm.sandbox_id).await.unwrap();

    let mut tti = Vec::new();
    for _ in 0..a.runs {
        let t0 = Instant::now();
        let sbx = client.create_sandbox(&new_sandbox()).await.unwrap();
        let out = echo(&client, &sbx).await;
        tti.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(out, "ready\n");
        client.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    }

    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..a.clients {
        let client = client.clone();
        let per = a.per_client;
        tasks.spawn(async move {
            let mut made = Vec::new();
            for _ in 0..per {
                made.push(client.create_sandbox(&new_sandbox()).await.unwrap());
            }
            made
        });
    }
    let mut made = Vec::new();
    while let Some(r) = tasks.join_next().await {
        made.extend(r.unwrap());
    }
    let wall = t0.elapsed();
    for sbx in &made {
        client.kill_sandbox(&sbx.sandbox_id).await.unwrap();
    }

    // SAFETY: kill with the pid of our own child and a valid signal.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let _ = daemon.wait();
    let result = serde_json::json!({
        "runtime": "gvisor",
        "image": "minimal",
        "time_to_interactive_ms": {
            "what": "POST /v2/sandboxes + first `echo` through the envd proxy (process.Process/Start), sequential",
            "runs": a.runs,
            "p50": percentile(&tti, 50.0),
            "p90": percentile(&tti, 90.0),
            "min": percentile(&tti, 0.0),
            "max": percentile(&tti, 100.0),
        },
        "creates_per_second": {
            "what": "POST /v2/sandboxes from concurrent clients, created / wall time",
            "clients": a.clients,
            "creates": made.len(),
            "wall_s": wall.as_secs_f64(),
            "per_second": made.len() as f64 / wall.as_secs_f64().max(Duration::from_micros(1).as_secs_f64()),
        },
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
    });
    println!("{}", serde_json::to_string_pretty(&result).unwrap());
}
