//! Snapshots on the gvisor runtime against the real runsc, agent and minimal image: a
//! sandbox's files and processes (a counter in memory) survive checkpoint and restore,
//! restores of one snapshot are independent, a bad snapshot is refused, pause-to-disk and
//! fork work, and nothing is left behind. Needs root, runsc and `<data-dir>/images/minimal`
//! built with the current agent (`make images install`); fails loudly without them.

#![allow(clippy::unwrap_used)]

mod common;

use common::{sh, temp_dirs};

use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::{
    Dirs, Error, Image, RestoreSpec, Runtime, Sandbox, SnapshotHandle, SnapshotKind, new_sandbox_id,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

struct Env {
    // Declared first: dropped (cleaning up) before the temp dir goes.
    _sweep: common::SweepGuard,
    tmp: tempfile::TempDir,
    dirs: Dirs,
    image: Image,
}

fn env() -> Env {
    common::require_root("gvisor snapshot");
    let image = common::minimal_image();
    let (tmp, dirs) = temp_dirs("sc-snap");
    Env {
        _sweep: common::SweepGuard { dirs: dirs.clone() },
        tmp,
        dirs,
        image,
    }
}

impl Env {
    fn snapshot_dir(&self, name: &str) -> PathBuf {
        self.tmp.path().join("snapshots").join(name)
    }
}

async fn runtime(env: &Env) -> GvisorRuntime {
    common::gvisor_runtime(&env.dirs).await
}

async fn start(env: &Env, rt: &GvisorRuntime) -> Arc<dyn Sandbox> {
    let spec = common::sandbox_spec(&env.image, 256);
    let sb: Arc<dyn Sandbox> = Arc::from(rt.create(spec).await.unwrap());
    sb.start().await.unwrap();
    sb
}

fn restore_spec() -> RestoreSpec {
    let mut spec = RestoreSpec::new(new_sandbox_id().unwrap());
    spec.boot_timeout = Duration::from_secs(60);
    spec
}

/// Starts the counter: a background shell that counts in its own memory and writes each
/// value to /tmp/count; its pid goes to /tmp/counter.pid.
async fn start_counter(sb: &Arc<dyn Sandbox>) {
    let script = "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done) \
                  >/dev/null 2>&1 & echo $! > /tmp/counter.pid";
    assert_eq!(sh(sb, script).await.1, 0);
}

async fn count(sb: &Arc<dyn Sandbox>) -> u64 {
    // The counter rewrites the file: a read can fall between truncation and write.
    let mut last = String::new();
    for _ in 0..20 {
        let (out, status) = sh(sb, "cat /tmp/count").await;
        assert_eq!(status, 0, "no /tmp/count");
        if let Ok(n) = out.trim().parse() {
            return n;
        }
        last = out;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("/tmp/count holds {last:?}");
}

/// Waits until the counter has reached at least `n` (and so provably counts).
async fn count_at_least(sb: &Arc<dyn Sandbox>, n: u64) -> u64 {
    for _ in 0..600 {
        let c = count(sb).await;
        if c >= n {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the counter never reached {n}");
}

/// The counter process is the one from before the snapshot: same pid, still alive.
async fn same_counter_runs(sb: &Arc<dyn Sandbox>, pid_before: &str) {
    let (pid, _) = sh(sb, "cat /tmp/counter.pid").await;
    assert_eq!(pid.trim(), pid_before);
    let (ps, status) = sh(sb, &format!("test -d /proc/{pid_before} && ps")).await;
    assert_eq!(status, 0, "process {pid_before} is gone: {ps}");
}

async fn assert_gone(env: &Env, rt: &GvisorRuntime, id: &str) {
    common::assert_gone(&env.dirs, rt, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_and_restores_keep_files_and_processes_and_diverge() {
    let env = env();
    let rt = runtime(&env).await;
    let parent = start(&env, &rt).await;
    assert_eq!(sh(&parent, "echo kept > /root/before").await.1, 0);
    start_counter(&parent).await;
    let (pid, _) = sh(&parent, "cat /tmp/counter.pid").await;
    let pid = pid.trim().to_string();
    let at_snapshot = count_at_least(&parent, 20).await;

    let snap = parent
        .snapshot(&env.snapshot_dir("one"), SnapshotKind::Full)
        .await
        .unwrap();
    assert_eq!(SnapshotHandle::load(&snap.dir).unwrap(), snap);

    // The parent runs on (restored in place): same processes, still counting.
    same_counter_runs(&parent, &pid).await;
    let parent_now = count(&parent).await;
    assert!(parent_now >= at_snapshot, "{parent_now} < {at_snapshot}");
    count_at_least(&parent, parent_now + 3).await;

    let a: Arc<dyn Sandbox> = Arc::from(rt.restore(&snap, restore_spec()).await.unwrap());
    let b: Arc<dyn Sandbox> = Arc::from(rt.restore(&snap, restore_spec()).await.unwrap());
    for clone in [&a, &b] {
        assert_eq!(sh(clone, "cat /root/before").await.0, "kept\n");
        // Continues from where it was: a restarted counter would start again at 1.
        let first = count(clone).await;
        assert!(first >= at_snapshot, "restarted? {first} < {at_snapshot}");
        same_counter_runs(clone, &pid).await;
        count_at_least(clone, first + 3).await;
    }

    // Each clone writes its own file; no one sees another's.
    assert_eq!(sh(&a, "echo a > /root/mine").await.1, 0);
    assert_eq!(sh(&b, "echo b > /root/mine").await.1, 0);
    assert_eq!(sh(&a, "cat /root/mine").await.0, "a\n");
    assert_eq!(sh(&b, "cat /root/mine").await.0, "b\n");
    assert_ne!(
        sh(&parent, "cat /root/mine").await.1,
        0,
        "the parent sees a clone's file"
    );

    let ids: Vec<String> = [&parent, &a, &b]
        .iter()
        .map(|s| s.id().to_string())
        .collect();
    for sb in [&parent, &a, &b] {
        sb.destroy().await.unwrap();
    }
    for id in &ids {
        assert_gone(&env, &rt, id).await;
    }
    snap.delete().unwrap();
    assert!(!snap.dir.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_to_disk_then_restore_and_bad_snapshots_are_refused() {
    let env = env();
    let rt = runtime(&env).await;
    let sb = start(&env, &rt).await;
    assert_eq!(sh(&sb, "echo paused > /root/data").await.1, 0);
    start_counter(&sb).await;
    let (pid, _) = sh(&sb, "cat /tmp/counter.pid").await;
    let at_pause = count_at_least(&sb, 10).await;
    let id = sb.id().to_string();

    let snap = sb.pause_to_disk(&env.snapshot_dir("paused")).await.unwrap();
    assert_gone(&env, &rt, &id).await;

    // A corrupt image: runsc refuses it and the error says which snapshot.
    let corrupt = env.snapshot_dir("corrupt");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&snap.dir)
        .arg(&corrupt)
        .status()
        .unwrap();
    assert!(status.success());
    let corrupt_snap = rebase(&snap, &corrupt);
    std::fs::write(
        corrupt.join("checkpoint/checkpoint.img"),
        b"not a checkpoint",
    )
    .unwrap();
    let spec = restore_spec();
    let failed_id = spec.id.clone();
    let err = match rt.restore(&corrupt_snap, spec).await {
        Ok(_) => panic!("a corrupt checkpoint image was restored"),
        Err(e) => e,
    };
    assert!(matches!(err, Error::Snapshot { .. }), "{err}");
    assert!(
        err.to_string().contains(&*corrupt.to_string_lossy()),
        "{err}"
    );
    assert_gone(&env, &rt, &failed_id).await;

    // A missing image.
    std::fs::remove_file(corrupt.join("checkpoint/checkpoint.img")).unwrap();
    let err = match rt.restore(&corrupt_snap, restore_spec()).await {
        Ok(_) => panic!("a snapshot without its image was restored"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("checkpoint image is missing"), "{err}");

    let resumed: Arc<dyn Sandbox> = Arc::from(rt.restore(&snap, restore_spec()).await.unwrap());
    assert_eq!(sh(&resumed, "cat /root/data").await.0, "paused\n");
    same_counter_runs(&resumed, pid.trim()).await;
    let now = count(&resumed).await;
    assert!(now >= at_pause, "{now} < {at_pause}");
    count_at_least(&resumed, now + 3).await;
    let resumed_id = resumed.id().to_string();
    resumed.destroy().await.unwrap();
    assert_gone(&env, &rt, &resumed_id).await;
}

/// `snap` as if it had been taken into `dir` (its files moved along).
fn rebase(snap: &SnapshotHandle, dir: &Path) -> SnapshotHandle {
    let mut h = snap.clone();
    h.dir = dir.to_path_buf();
    h.files = sandcell_runtime::snapshot::SnapshotFiles::Gvisor {
        checkpoint_dir: Some(dir.join("checkpoint")),
        upper_dir: dir.join("upper"),
        disk_mib: None,
    };
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_children_are_independent_and_the_parent_runs_on() {
    let env = env();
    let rt = runtime(&env).await;
    let parent = start(&env, &rt).await;
    assert_eq!(sh(&parent, "echo family > /root/shared").await.1, 0);
    start_counter(&parent).await;
    let (pid, _) = sh(&parent, "cat /tmp/counter.pid").await;
    count_at_least(&parent, 5).await;

    let children: Vec<Arc<dyn Sandbox>> = parent
        .fork(2, &env.snapshot_dir("fork"))
        .await
        .unwrap()
        .into_iter()
        .map(Arc::from)
        .collect();
    assert_eq!(children.len(), 2);
    assert_ne!(children[0].id(), children[1].id());
    for (i, child) in children.iter().enumerate() {
        assert_eq!(sh(child, "cat /root/shared").await.0, "family\n");
        same_counter_runs(child, pid.trim()).await;
        assert_eq!(sh(child, &format!("echo {i} > /root/child")).await.1, 0);
    }
    same_counter_runs(&parent, pid.trim()).await;
    assert_eq!(sh(&children[0], "cat /root/child").await.0, "0\n");
    assert_eq!(sh(&children[1], "cat /root/child").await.0, "1\n");
    assert_ne!(sh(&parent, "cat /root/child").await.1, 0);

    let mut ids = vec![parent.id().to_string()];
    for child in &children {
        ids.push(child.id().to_string());
        child.destroy().await.unwrap();
    }
    parent.destroy().await.unwrap();
    for id in &ids {
        assert_gone(&env, &rt, id).await;
    }
}

/// A sandbox restored from a checkpoint can be checkpointed again, over and over (pause and
/// resume cycles do exactly this): the restored agent lets go of its host sockets again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_sandbox_checkpoints_again() {
    let env = env();
    let rt = runtime(&env).await;
    let sb = start(&env, &rt).await;
    start_counter(&sb).await;
    let mut last = count_at_least(&sb, 3).await;
    for round in 0..3 {
        let snap = sb
            .snapshot(
                &env.snapshot_dir(&format!("round{round}")),
                SnapshotKind::Full,
            )
            .await
            .unwrap_or_else(|e| panic!("snapshot {round}: {e}"));
        let now = count(&sb).await;
        assert!(now >= last, "round {round}: {now} < {last}");
        last = count_at_least(&sb, now + 2).await;
        snap.delete().unwrap();
    }
    let id = sb.id().to_string();
    sb.destroy().await.unwrap();
    assert_gone(&env, &rt, &id).await;
}

/// Restores of restores: a sandbox paused to disk and resumed (same id) can be paused again,
/// and forked, and the children of that chain answer (the daemon's pause, resume and fork
/// cycles do exactly this).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_restores_answer() {
    let env = env();
    let rt = runtime(&env).await;
    let first = start(&env, &rt).await;
    assert_eq!(sh(&first, "echo one > /root/data").await.1, 0);
    let id = first.id().to_string();
    let mut current = first;
    for round in 0..2 {
        let snap = current
            .pause_to_disk(&env.snapshot_dir(&format!("pause{round}")))
            .await
            .unwrap_or_else(|e| panic!("pause {round}: {e}"));
        let mut spec = RestoreSpec::new(id.clone());
        spec.boot_timeout = Duration::from_secs(60);
        current = Arc::from(
            rt.restore(&snap, spec)
                .await
                .unwrap_or_else(|e| panic!("resume {round}: {e}")),
        );
        assert_eq!(
            sh(&current, "cat /root/data").await.0,
            "one\n",
            "round {round}"
        );
        assert_eq!(
            sh(&current, &format!("echo {round} >> /root/rounds"))
                .await
                .1,
            0
        );
    }
    let children = current
        .fork(1, &env.snapshot_dir("fork"))
        .await
        .unwrap_or_else(|e| panic!("fork of a resumed sandbox: {e}"));
    let child: Arc<dyn Sandbox> = Arc::from(children.into_iter().next().unwrap());
    assert_eq!(sh(&child, "cat /root/rounds").await.0, "0\n1\n");
    assert_eq!(sh(&current, "cat /root/rounds").await.0, "0\n1\n");
    let ids = [current.id().to_string(), child.id().to_string()];
    child.destroy().await.unwrap();
    current.destroy().await.unwrap();
    for id in &ids {
        assert_gone(&env, &rt, id).await;
    }
}

/// A sandbox with a disk, restored from a snapshot (its root: its upper over the snapshot's
/// layer over the image), paused to disk, resumes with both layers' files, a deletion of a
/// file of the snapshot's layer included, and its pause does not need the first snapshot
/// (deleted before the resume). A filesystem-only pause of it keeps the files, not the
/// processes. Disks go with the sandboxes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_sandbox_with_a_disk_pauses_on_its_flattened_layers() {
    let env = env();
    let rt = runtime(&env).await;
    let mut spec = common::sandbox_spec(&env.image, 256);
    spec.disk_mib = Some(128);
    let parent: Arc<dyn Sandbox> = Arc::from(rt.create(spec).await.unwrap());
    parent.start().await.unwrap();
    let script = "mkdir -p /root/d && echo one > /root/d/a && echo two > /root/d/b";
    assert_eq!(sh(&parent, script).await.1, 0);
    let first = parent
        .snapshot(&env.snapshot_dir("first"), SnapshotKind::Full)
        .await
        .unwrap();
    parent.destroy().await.unwrap();

    let restored: Arc<dyn Sandbox> = Arc::from(rt.restore(&first, restore_spec()).await.unwrap());
    let script = "rm /root/d/b && echo three > /root/d/c && echo done";
    assert_eq!(sh(&restored, script).await, ("done\n".to_string(), 0));
    let paused = restored
        .pause_to_disk(&env.snapshot_dir("paused"))
        .await
        .unwrap();
    first.delete().unwrap();

    let resumed: Arc<dyn Sandbox> = Arc::from(rt.restore(&paused, restore_spec()).await.unwrap());
    let (out, status) = sh(&resumed, "cat /root/d/a /root/d/c; ls /root/d").await;
    assert_eq!((out.as_str(), status), ("one\nthree\na\nc\n", 0));
    start_counter(&resumed).await;
    count_at_least(&resumed, 2).await;

    let files = resumed
        .pause_files_to_disk(&env.snapshot_dir("files"))
        .await
        .unwrap();
    paused.delete().unwrap();
    let booted: Arc<dyn Sandbox> = Arc::from(rt.restore(&files, restore_spec()).await.unwrap());
    let (out, _) = sh(&booted, "cat /root/d/a /root/d/c; ls /root/d").await;
    assert_eq!(out, "one\nthree\na\nc\n");
    let before = count(&booted).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&booted).await, before, "the counter came back");
    let id = booted.id().to_string();
    booted.destroy().await.unwrap();
    files.delete().unwrap();
    assert_gone(&env, &rt, &id).await;
    let disks = std::fs::read_dir(env.dirs.data.join("disks"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(disks, 0, "disk files left");
}
