//! Benchmark: gvisor snapshots through the runtime against `runsc checkpoint`/`restore`
//! driven directly, interleaved run by run. Driven by `bench/snapshot/run.sh`; prints JSON.
//!
//! - checkpoint: Sandcell `pause_to_disk` of a running sandbox (agent hold + `runsc
//!   checkpoint` + frozen upper copy + manifest + removal). Direct: `runsc checkpoint` of a
//!   detached container running a shell counter as PID 1 (no agent: runsc cannot checkpoint
//!   one that holds a host socket, which is why Sandcell asks the agent to let go first).
//! - restore_ready: Sandcell `Runtime::restore` to the agent answering `GET /health`.
//!   Direct: `runsc restore -detach` of that checkpoint returning.
//!
//! Usage: bench_gvisor_snapshot --image DIR [--runs N]

#![allow(clippy::unwrap_used)]

use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::{
    Dirs, Image, RestoreSpec, Runtime, Sandbox, SandboxSpec, agent_client, new_sandbox_id,
};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * (s.len() as f64 - 1.0)).round() as usize;
    s[rank.min(s.len() - 1)]
}

fn stats(samples: &[f64]) -> serde_json::Value {
    serde_json::json!({
        "p50_ms": percentile(samples, 50.0),
        "p90_ms": percentile(samples, 90.0),
        "runs": samples.len(),
    })
}

fn runsc(root: &Path) -> std::process::Command {
    let mut c = std::process::Command::new("runsc");
    c.arg(format!("--root={}", root.display()))
        .args([
            "--platform=ptrace",
            "--network=none",
            "--host-uds=create",
            "--overlay2=root:memory",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut image_dir = PathBuf::new();
    let mut runs = 20usize;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--image" => image_dir = value.into(),
            "--runs" => runs = value.parse().unwrap(),
            other => panic!("unknown flag {other}"),
        }
    }
    let image = Image::resolve(Path::new("/nonexistent"), &image_dir.to_string_lossy()).unwrap();
    let tree = image.rootfs_dir.clone().unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("sc-bsnap")
        .tempdir_in("/tmp")
        .unwrap();
    let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
    let rt = GvisorRuntime::new(dirs.clone()).await.unwrap();
    let direct_root = tmp.path().join("direct-root");
    let direct_dir = tmp.path().join("direct");
    let bundle = direct_bundle(&direct_dir, &tree);

    let (mut ours_ck, mut ours_rs, mut direct_ck, mut direct_rs) = (vec![], vec![], vec![], vec![]);
    for run in 0..runs {
        // Sandcell.
        let mut spec = SandboxSpec::new(new_sandbox_id().unwrap(), image.clone());
        spec.memory_mib = 256;
        let sb = rt.create(spec).await.unwrap();
        sb.start().await.unwrap();
        let snap_dir = tmp.path().join(format!("snap-{run}"));
        let t = Instant::now();
        let snap = sb.pause_to_disk(&snap_dir).await.unwrap();
        ours_ck.push(ms(t.elapsed()));
        let t = Instant::now();
        let restored: Arc<dyn Sandbox> = Arc::from(
            rt.restore(&snap, RestoreSpec::new(new_sandbox_id().unwrap()))
                .await
                .unwrap(),
        );
        agent_client(restored.clone()).health().await.unwrap();
        ours_rs.push(ms(t.elapsed()));
        restored.destroy().await.unwrap();
        snap.delete().unwrap();

        // runsc directly.
        let (a, b) = (format!("d{run}a"), format!("d{run}b"));
        let image_path = tmp.path().join(format!("direct-img-{run}"));
        std::fs::create_dir_all(&image_path).unwrap();
        let ok = runsc(&direct_root)
            .args(["run", "-detach", "--bundle"])
            .arg(&bundle)
            .arg(&a)
            .status()
            .unwrap()
            .success();
        assert!(ok, "runsc run");
        let t = Instant::now();
        let ok = runsc(&direct_root)
            .arg("checkpoint")
            .arg(format!("--image-path={}", image_path.display()))
            .arg(&a)
            .status()
            .unwrap()
            .success();
        direct_ck.push(ms(t.elapsed()));
        assert!(ok, "runsc checkpoint");
        let t = Instant::now();
        let ok = runsc(&direct_root)
            .args(["restore", "-detach", "--bundle"])
            .arg(&bundle)
            .arg(format!("--image-path={}", image_path.display()))
            .arg(&b)
            .status()
            .unwrap()
            .success();
        direct_rs.push(ms(t.elapsed()));
        assert!(ok, "runsc restore");
        for id in [&a, &b] {
            let _ = runsc(&direct_root).args(["delete", "--force", id]).status();
        }
    }
    let _ = std::process::Command::new("umount")
        .arg(direct_dir.join("rootfs"))
        .status();
    let out = serde_json::json!({
        "suite": "snapshot-gvisor",
        "runsc": rt.runsc().version,
        "checkpoint": {"sandcell": stats(&ours_ck), "runsc": stats(&direct_ck)},
        "restore_to_ready": {"sandcell": stats(&ours_rs), "runsc": stats(&direct_rs)},
        "notes": "sandcell checkpoint = pause_to_disk (agent hold + runsc checkpoint + upper copy + cleanup); sandcell restore = new sandbox to agent /health; runsc = the same operations on a shell-counter container without an agent",
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
