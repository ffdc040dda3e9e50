//! Benchmark: the gvisor runtime against `runsc` driven directly, same bundle, same flags,
//! same host, interleaved run by run. Driven by `bench/gvisor/run.sh`; prints JSON.
//!
//! - agent_ready: from nothing to the agent answering `GET /health`. Sandcell: `create` +
//!   `start` + health. Direct: `runsc run` of a bundle Sandcell prepared (untimed) + polling
//!   the agent's socket + health.
//! - run_true: `sandcell run --runtime gvisor -- true`, process start to exit. Direct:
//!   `runsc run` of the same bundle with `/bin/true` as its process, start to exit.
//!
//! Usage: bench_gvisor --sandcell PATH --image DIR [--runs N]

#![allow(clippy::unwrap_used)]

use sandcell_envd_client::{EnvdClient, UnixConnector};
use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::{Dirs, Image, Runtime, Sandbox, SandboxSpec, agent_client, new_sandbox_id};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    sandcell: PathBuf,
    image: PathBuf,
    runs: usize,
}

fn args() -> Args {
    let mut a = Args {
        sandcell: PathBuf::new(),
        image: PathBuf::new(),
        runs: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--sandcell" => a.sandcell = value.into(),
            "--image" => a.image = value.into(),
            "--runs" => a.runs = value.parse().unwrap(),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(
        a.sandcell.is_file(),
        "--sandcell PATH of the sandcell binary"
    );
    a
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * (s.len() as f64 - 1.0)).round() as usize;
    s[rank.min(s.len() - 1)]
}

fn summary(name: &str, sandcell: &[f64], direct: &[f64]) -> serde_json::Value {
    let (s50, s90, d50, d90) = (
        percentile(sandcell, 50.0),
        percentile(sandcell, 90.0),
        percentile(direct, 50.0),
        percentile(direct, 90.0),
    );
    let overhead = s50 - d50;
    serde_json::json!({
        "what": name,
        "sandcell_ms": {"p50": s50, "p90": s90},
        "runsc_direct_ms": {"p50": d50, "p90": d90},
        "ratio_p50": s50 / d50,
        "ratio_p90": s90 / d90,
        "overhead_p50_ms": overhead,
        "goal_met": overhead <= 5.0 || s50 <= d50 * 1.10,
        "samples_sandcell_ms": sandcell,
        "samples_direct_ms": direct,
    })
}

async fn wait_health(socket: &Path) {
    let client = EnvdClient::new(UnixConnector(socket.to_path_buf()));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if client.health().await.is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "agent at {} never answered",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

struct Bench {
    rt: GvisorRuntime,
    dirs: Dirs,
    image: Image,
}

impl Bench {
    fn spec(&self) -> SandboxSpec {
        SandboxSpec::new(new_sandbox_id().unwrap(), self.image.clone())
    }

    async fn sandcell_ready(&self) -> f64 {
        let t = Instant::now();
        let sb: Arc<dyn Sandbox> = Arc::from(self.rt.create(self.spec()).await.unwrap());
        sb.start().await.unwrap();
        agent_client(sb.clone()).health().await.unwrap();
        let took = ms(t.elapsed());
        sb.destroy().await.unwrap();
        took
    }

    /// A sandbox prepared by Sandcell but not started: its bundle, for runsc to run.
    async fn prepared(&self, args: Option<&[&str]>) -> (Box<dyn Sandbox>, PathBuf) {
        let sb = self.rt.create(self.spec()).await.unwrap();
        let bundle = self.dirs.sandbox_run_dir(sb.id()).join("bundle");
        if let Some(args) = args {
            let file = bundle.join("config.json");
            let mut config: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
            config["process"]["args"] = serde_json::json!(args);
            std::fs::write(&file, serde_json::to_vec(&config).unwrap()).unwrap();
        }
        (sb, bundle)
    }

    async fn direct_ready(&self) -> f64 {
        let (sb, bundle) = self.prepared(None).await;
        let id = format!("direct-{}", sb.id());
        let socket = self.dirs.sandbox_run_dir(sb.id()).join("host/agent.sock");
        let t = Instant::now();
        let mut child = self
            .rt
            .run_command(&bundle, &id)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_health(&socket).await;
        let took = ms(t.elapsed());
        let _ = tokio::process::Command::new("runsc")
            .arg(format!("--root={}", self.rt.runsc_root().display()))
            .args(["kill", &id, "KILL"])
            .output()
            .await;
        child.wait().await.unwrap();
        sb.destroy().await.unwrap();
        took
    }

    /// The same job with runsc alone: start the agent's bundle, `runsc exec` the command in
    /// it, kill the container; start to `runsc run` returning.
    async fn direct_exec_true(&self) -> f64 {
        let (sb, bundle) = self.prepared(None).await;
        let id = format!("direct-{}", sb.id());
        let socket = self.dirs.sandbox_run_dir(sb.id()).join("host/agent.sock");
        let runsc = |args: &[&str]| {
            let mut cmd = tokio::process::Command::new("runsc");
            cmd.arg(format!("--root={}", self.rt.runsc_root().display()))
                .args(args);
            cmd
        };
        let t = Instant::now();
        let mut child = self
            .rt
            .run_command(&bundle, &id)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_health(&socket).await;
        let status = runsc(&["exec", &id, "/bin/true"]).status().await.unwrap();
        assert!(status.success(), "runsc exec /bin/true failed");
        runsc(&["kill", &id, "KILL"]).output().await.unwrap();
        child.wait().await.unwrap();
        let took = ms(t.elapsed());
        sb.destroy().await.unwrap();
        took
    }

    async fn sandcell_true(&self, sandcell: &Path) -> f64 {
        let t = Instant::now();
        let status = tokio::process::Command::new(sandcell)
            .env("SANDCELL_DATA_DIR", &self.dirs.data)
            .env("SANDCELL_RUN_DIR", &self.dirs.run)
            .args(["run", "--runtime", "gvisor", "--image"])
            .arg(self.image.rootfs_dir.as_ref().unwrap().parent().unwrap())
            .args(["--", "true"])
            .stdin(Stdio::null())
            .status()
            .await
            .unwrap();
        let took = ms(t.elapsed());
        assert!(status.success(), "sandcell run -- true failed");
        took
    }

    async fn direct_true(&self) -> f64 {
        let (sb, bundle) = self.prepared(Some(&["/bin/true"])).await;
        let id = format!("direct-{}", sb.id());
        let t = Instant::now();
        let status = self
            .rt
            .run_command(&bundle, &id)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .unwrap();
        let took = ms(t.elapsed());
        assert!(status.success(), "runsc run of /bin/true failed");
        sb.destroy().await.unwrap();
        took
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let tmp = tempfile::Builder::new()
        .prefix("sc-bench")
        .tempdir_in("/tmp")
        .unwrap();
    let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
    let image = Image::resolve(Path::new("/nonexistent"), args.image.to_str().unwrap()).unwrap();
    let rt = GvisorRuntime::new(dirs.clone(), sandcell_runtime::net::NetRegistry::new())
        .await
        .unwrap();
    let info = rt.runsc().clone();
    let bench = Bench { rt, dirs, image };

    // One of each first, to warm caches (page cache, runsc-info cache), not counted.
    bench.sandcell_ready().await;
    bench.direct_ready().await;
    bench.sandcell_true(&args.sandcell).await;
    bench.direct_true().await;
    bench.direct_exec_true().await;

    let (mut ready_s, mut ready_d, mut true_s, mut true_d, mut exec_d) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..args.runs {
        // Alternate which goes first, so drift on a shared machine hits both alike.
        if i % 2 == 0 {
            ready_s.push(bench.sandcell_ready().await);
            ready_d.push(bench.direct_ready().await);
            true_s.push(bench.sandcell_true(&args.sandcell).await);
            true_d.push(bench.direct_true().await);
            exec_d.push(bench.direct_exec_true().await);
        } else {
            exec_d.push(bench.direct_exec_true().await);
            ready_d.push(bench.direct_ready().await);
            ready_s.push(bench.sandcell_ready().await);
            true_d.push(bench.direct_true().await);
            true_s.push(bench.sandcell_true(&args.sandcell).await);
        }
    }
    let report = serde_json::json!({
        "bench": "gvisor",
        "runs": args.runs,
        "host_kernel": sandcell_runtime::host::host_kernel_release(),
        "runsc": {"version": info.version, "platform": info.platform, "overlay2": info.overlay2},
        "goal": "Sandcell adds at most 10% or 5 ms over runsc driven directly",
        "agent_ready": summary("create + start of the minimal image until the agent answers /health", &ready_s, &ready_d),
        "run_true": summary("`sandcell run --runtime gvisor -- true` vs `runsc run` of /bin/true, same bundle", &true_s, &true_d),
        "run_true_in_agent_sandbox": summary(
            "`sandcell run --runtime gvisor -- true` vs runsc doing the same job: `runsc run` of the agent bundle, `runsc exec /bin/true`, `runsc kill`",
            &true_s,
            &exec_d,
        ),
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
