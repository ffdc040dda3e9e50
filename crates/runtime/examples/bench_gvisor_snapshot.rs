//! Benchmark: gvisor snapshot operations through the runtime against `runsc` driven
//! directly, interleaved run by run. Driven by `bench/snapshot/run.sh`; prints JSON.
//!
//! Sandcell (a sandbox with the agent, 256 MiB; each time ends when the agent answers
//! `GET /health`, where a sandbox results):
//! - checkpoint: `pause_to_disk` of a running sandbox (agent hold, `runsc checkpoint`,
//!   frozen upper copy, manifest, removal of the stopped sandbox).
//! - restore: `Runtime::restore` of that snapshot under the same id (the daemon's resume).
//! - fork_1 / fork_4: `Sandbox::fork(n)` of the resumed sandbox (checkpoint, parent restored
//!   in place, n children restored one after the other), to the last child answering.
//! - create_from_snapshot: `Runtime::restore` of a template snapshot under a new id.
//!
//! runsc directly (`runsc run -detach` of a bundle over the same image tree with the same
//! global flags, PID 1 a shell counter: runsc cannot checkpoint a sandbox holding a host
//! socket, which is why Sandcell asks its agent to let go first); each time ends when the
//! runsc command(s) return:
//! - checkpoint: `runsc checkpoint`; restore: `runsc restore -detach` into a new id;
//! - fork_n: `runsc checkpoint` + `delete` + `restore` of the parent + n `restore`s;
//! - create_from_snapshot: `runsc restore -detach` of a template image into a new id.
//!
//! Usage: bench_gvisor_snapshot --image DIR [--runs N] [--subreaper on|off|alternate]
//!   [--direct-only on]
//! (`alternate`: even runs with the subreaper, odd runs without, reported apart under
//! `without_subreaper_interleaved`.)

#![allow(clippy::unwrap_used)]

use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::{
    Dirs, Image, RestoreSpec, Runtime, Sandbox, SandboxSpec, SnapshotKind, agent_client,
    new_sandbox_id,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

const OPS: [&str; 5] = [
    "checkpoint",
    "restore",
    "fork_1",
    "fork_4",
    "create_from_snapshot",
];

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 10.0).round() / 10.0
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * (s.len() as f64 - 1.0)).round() as usize;
    s[rank.min(s.len() - 1)]
}

fn stats(samples: &[f64]) -> serde_json::Value {
    if samples.is_empty() {
        return serde_json::json!({"runs": 0});
    }
    serde_json::json!({
        "p50_ms": percentile(samples, 50.0),
        "p90_ms": percentile(samples, 90.0),
        "p99_ms": percentile(samples, 99.0),
        "min_ms": percentile(samples, 0.0),
        "max_ms": percentile(samples, 100.0),
        "runs": samples.len(),
    })
}

/// The 1-minute load average.
fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(-1.0)
}

/// runsc with the global flags the runtime uses for a sandbox without a network.
fn runsc(rt: &GvisorRuntime, root: &Path) -> std::process::Command {
    let info = rt.runsc();
    let mut c = std::process::Command::new(&info.path);
    c.arg(format!("--root={}", root.display()))
        .arg(format!("--platform={}", info.platform))
        .args(["--network=none", "--host-uds=create"]);
    if info.overlay2 {
        c.arg("--overlay2=root:memory");
    }
    // Not piped: a detached sandbox inherits them and would keep a pipe open for good.
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

fn run_ok(mut c: std::process::Command, what: &str) {
    let status = c.status().unwrap();
    assert!(status.success(), "{what}: {status}");
}

fn checkpoint_args(rt: &GvisorRuntime, image: &Path, id: &str) -> Vec<String> {
    let mut args = vec![
        "checkpoint".to_string(),
        format!("--image-path={}", image.display()),
    ];
    if rt.runsc().checkpoint_compression {
        args.push("--compression=none".into());
    }
    args.push(id.into());
    args
}

/// A bundle whose PID 1 is a shell counter, over a host overlay of the image tree.
fn direct_bundle(dir: &Path, tree: &Path) -> PathBuf {
    for d in ["upper", "work", "rootfs", "bundle"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        tree.display(),
        dir.join("upper").display(),
        dir.join("work").display()
    );
    let ok = std::process::Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(dir.join("rootfs"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "mounting the overlay for the direct bundle");
    let config = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"terminal": false, "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"],
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "cwd": "/"},
        "root": {"path": dir.join("rootfs"), "readonly": false},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}]}
    });
    let bundle = dir.join("bundle");
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    bundle
}

struct Direct<'a> {
    rt: &'a GvisorRuntime,
    root: PathBuf,
    bundle: PathBuf,
    tmp: PathBuf,
    /// Every container id started, for the final cleanup.
    ids: Vec<String>,
}

impl Direct<'_> {
    fn run(&mut self, id: &str) {
        let mut c = runsc(self.rt, &self.root);
        c.args(["run", "-detach", "--bundle"])
            .arg(&self.bundle)
            .arg(id);
        self.ids.push(id.into());
        run_ok(c, "runsc run");
    }
    fn checkpoint(&self, id: &str, image: &Path) {
        std::fs::create_dir_all(image).unwrap();
        let mut c = runsc(self.rt, &self.root);
        c.args(checkpoint_args(self.rt, image, id));
        run_ok(c, "runsc checkpoint");
    }
    fn restore(&mut self, image: &Path, id: &str) {
        let mut c = runsc(self.rt, &self.root);
        c.args(["restore", "-detach", "--bundle"])
            .arg(&self.bundle)
            .arg(format!("--image-path={}", image.display()))
            .arg(id);
        self.ids.push(id.into());
        run_ok(c, "runsc restore");
    }
    fn delete(&self, id: &str) {
        let _ = runsc(self.rt, &self.root)
            .args(["delete", "--force", id])
            .status();
    }
    fn image(&self, name: String) -> PathBuf {
        self.tmp.join(name)
    }
}

async fn healthy(sb: &Arc<dyn Sandbox>) {
    agent_client(sb.clone()).health().await.unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // RUST_LOG=sandcell_runtime=debug shows each checkpoint's steps (gvisor/checkpoint.rs).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut image_dir = PathBuf::new();
    let mut runs = 10usize;
    let mut subreaper = false;
    // Even runs with the subreaper, odd ones without, in one process (the load hits both).
    let mut alternate = false;
    let mut direct_only = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--image" => image_dir = value.into(),
            "--runs" => runs = value.parse().unwrap(),
            // As the daemon does (runtime/src/subreaper.rs); off: orphans go to init.
            "--subreaper" => {
                subreaper = value == "on" || value == "alternate";
                alternate = value == "alternate";
            }
            // Only the runsc-direct column (what the subreaper changes for runsc itself).
            "--direct-only" => direct_only = value == "on",
            other => panic!("unknown flag {other}"),
        }
    }
    if subreaper {
        sandcell_runtime::subreaper::become_subreaper().unwrap();
        sandcell_runtime::subreaper::spawn_reaper();
    }
    let image = Image::resolve(Path::new("/nonexistent"), &image_dir.to_string_lossy()).unwrap();
    let tree = image.rootfs_dir.clone().unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("sc-bsnap")
        .tempdir_in("/tmp")
        .unwrap();
    let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
    let rt = GvisorRuntime::new(dirs.clone(), sandcell_runtime::net::NetRegistry::new())
        .await
        .unwrap();
    let direct_dir = tmp.path().join("direct");
    let mut direct = Direct {
        rt: &rt,
        root: tmp.path().join("direct-root"),
        bundle: direct_bundle(&direct_dir, &tree),
        tmp: tmp.path().to_path_buf(),
        ids: Vec::new(),
    };
    let spec = |image: &Image| {
        let mut spec = SandboxSpec::new(new_sandbox_id().unwrap(), image.clone());
        spec.memory_mib = 256;
        spec
    };
    let restore_spec = |id: String| {
        let mut s = RestoreSpec::new(id);
        s.boot_timeout = Duration::from_secs(60);
        s
    };

    // The templates: a snapshot of a running sandbox (it keeps running: destroyed now), and
    // a checkpoint image of a direct container.
    let base: Arc<dyn Sandbox> = Arc::from(rt.create(spec(&image)).await.unwrap());
    base.start().await.unwrap();
    healthy(&base).await;
    let template = base
        .snapshot(&tmp.path().join("template"), SnapshotKind::Full)
        .await
        .unwrap();
    base.destroy().await.unwrap();
    direct.run("tmpl");
    let direct_template = direct.image("direct-template".into());
    direct.checkpoint("tmpl", &direct_template);
    direct.delete("tmpl");

    let mut ours_on: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut theirs_on: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut ours_off: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut theirs_off: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut loads = Vec::new();
    for run in 0..runs {
        loads.push(load1());
        let off = alternate && run % 2 == 1;
        if alternate {
            sandcell_runtime::subreaper::set_subreaper(!off).unwrap();
        }
        let (ours, theirs) = if off {
            (&mut ours_off, &mut theirs_off)
        } else {
            (&mut ours_on, &mut theirs_on)
        };
        // Sandcell.
        if !direct_only {
            let sb: Arc<dyn Sandbox> = Arc::from(rt.create(spec(&image)).await.unwrap());
            sb.start().await.unwrap();
            healthy(&sb).await;
            let id = sb.id().to_string();
            let snap_dir = tmp.path().join(format!("pause-{run}"));
            let t = Instant::now();
            let snap = sb.pause_to_disk(&snap_dir).await.unwrap();
            ours.entry("checkpoint").or_default().push(ms(t.elapsed()));
            let t = Instant::now();
            let sb: Arc<dyn Sandbox> =
                Arc::from(rt.restore(&snap, restore_spec(id)).await.unwrap());
            healthy(&sb).await;
            ours.entry("restore").or_default().push(ms(t.elapsed()));
            for (op, n) in [("fork_1", 1usize), ("fork_4", 4)] {
                let fork_dir = tmp.path().join(format!("{op}-{run}"));
                let t = Instant::now();
                let children = sb.fork(n, &fork_dir).await.unwrap();
                let children: Vec<Arc<dyn Sandbox>> = children.into_iter().map(Arc::from).collect();
                for child in &children {
                    healthy(child).await;
                }
                ours.entry(op).or_default().push(ms(t.elapsed()));
                for child in &children {
                    child.destroy().await.unwrap();
                }
                let _ = std::fs::remove_dir_all(&fork_dir);
            }
            sb.destroy().await.unwrap();
            // Only now: the restored sandbox stands on the snapshot's flattened root, which
            // its forks record as their lower layer.
            snap.delete().unwrap();
            let t = Instant::now();
            let created: Arc<dyn Sandbox> = Arc::from(
                rt.restore(&template, restore_spec(new_sandbox_id().unwrap()))
                    .await
                    .unwrap(),
            );
            healthy(&created).await;
            ours.entry("create_from_snapshot")
                .or_default()
                .push(ms(t.elapsed()));
            created.destroy().await.unwrap();
        }

        // runsc directly.
        let (a, b) = (format!("d{run}a"), format!("d{run}b"));
        direct.run(&a);
        let img = direct.image(format!("direct-pause-{run}"));
        let t = Instant::now();
        direct.checkpoint(&a, &img);
        theirs
            .entry("checkpoint")
            .or_default()
            .push(ms(t.elapsed()));
        direct.delete(&a);
        let t = Instant::now();
        direct.restore(&img, &b);
        theirs.entry("restore").or_default().push(ms(t.elapsed()));
        for (op, n) in [("fork_1", 1usize), ("fork_4", 4)] {
            let img = direct.image(format!("direct-{op}-{run}"));
            let t = Instant::now();
            direct.checkpoint(&b, &img);
            direct.delete(&b);
            direct.restore(&img, &b);
            for k in 0..n {
                direct.restore(&img, &format!("d{run}{op}c{k}"));
            }
            theirs.entry(op).or_default().push(ms(t.elapsed()));
            for k in 0..n {
                direct.delete(&format!("d{run}{op}c{k}"));
            }
            let _ = std::fs::remove_dir_all(&img);
        }
        direct.delete(&b);
        let _ = std::fs::remove_dir_all(&img);
        let c = format!("d{run}c");
        let t = Instant::now();
        direct.restore(&direct_template, &c);
        theirs
            .entry("create_from_snapshot")
            .or_default()
            .push(ms(t.elapsed()));
        direct.delete(&c);
        eprintln!("run {run} done (load {:.2})", load1());
    }
    loads.push(load1());
    for id in &direct.ids {
        direct.delete(id);
    }
    template.delete().unwrap();
    let _ = std::process::Command::new("umount")
        .arg(direct_dir.join("rootfs"))
        .status();

    let mut interleaved_off = serde_json::Map::new();
    for op in OPS {
        let (o, d) = (
            ours_off.get(op).cloned().unwrap_or_default(),
            theirs_off.get(op).cloned().unwrap_or_default(),
        );
        interleaved_off.insert(
            op.to_string(),
            serde_json::json!({"sandcell": stats(&o), "runsc": stats(&d)}),
        );
    }
    let (ours, theirs) = (ours_on, theirs_on);
    let mut results = serde_json::Map::new();
    for op in OPS {
        let (o, d) = (
            ours.get(op).cloned().unwrap_or_default(),
            theirs.get(op).cloned().unwrap_or_default(),
        );
        let ratio = if d.is_empty() || o.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::json!((percentile(&o, 50.0) / percentile(&d, 50.0) * 100.0).round() / 100.0)
        };
        results.insert(
            op.to_string(),
            serde_json::json!({"sandcell": stats(&o), "runsc": stats(&d), "p50_ratio": ratio}),
        );
    }
    let mut sorted = loads.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let out = serde_json::json!({
        "suite": "snapshot-gvisor",
        "runsc": rt.runsc().version,
        "platform": rt.runsc().platform,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "runs": runs,
        "subreaper": subreaper,
        "alternate": alternate,
        "direct_only": direct_only,
        "without_subreaper_interleaved": interleaved_off,
        "load1": {"min": sorted.first(), "max": sorted.last(), "samples": loads},
        "results": results,
        "notes": "sandcell: 256 MiB sandbox with the agent, each time to the agent answering /health; fork_n and restore include the parent's checkpoint and in-place restore (gVisor cannot fork without stopping the parent). runsc: the same runsc commands on a shell-counter container over the same image tree with the same flags, each time to the commands returning. Interleaved run by run; load1 = 1-minute load average sampled before each run.",
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
