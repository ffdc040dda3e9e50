//! What a hostile guest can do to the host on the gvisor runtime, against the real runsc,
//! agent and installed images: a symlink planted in the agent directory does not make the
//! host write through it, a guest flooding its stdout leaves a bounded console log, and a
//! guest holding a host socket in its agent directory makes a snapshot fail with a message
//! while the sandbox runs on. Needs root, runsc and the `minimal` and `base` images.

#![allow(clippy::unwrap_used)]

mod common;

use common::{sh, temp_dirs};
use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::{Dirs, Image, Runtime, Sandbox, SnapshotKind};
use std::path::Path;
use std::sync::Arc;

struct Env {
    // Declared first: dropped (cleaning up) before the temp dir goes.
    _sweep: common::SweepGuard,
    tmp: tempfile::TempDir,
    dirs: Dirs,
}

fn env() -> Env {
    common::require_root("hostile guest");
    let (tmp, dirs) = temp_dirs("sc-hostile");
    Env {
        _sweep: common::SweepGuard { dirs: dirs.clone() },
        tmp,
        dirs,
    }
}

fn image(name: &str) -> Image {
    let data = std::env::var("SANDCELL_DATA_DIR").unwrap_or_else(|_| "/var/lib/sandcell".into());
    Image::resolve(&Path::new(&data).join("images"), name)
        .unwrap_or_else(|e| panic!("the tests need the {name} image (`make images install`): {e}"))
}

async fn start(rt: &GvisorRuntime, image: &Image) -> Arc<dyn Sandbox> {
    let spec = common::sandbox_spec(image, 256);
    let sb: Arc<dyn Sandbox> = Arc::from(rt.create(spec).await.unwrap());
    sb.start().await.unwrap();
    sb
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_socket_in_the_agent_dir_fails_the_snapshot_and_the_sandbox_runs_on() {
    let env = env();
    let rt = common::gvisor_runtime(&env.dirs).await;
    let sb = start(&rt, &image("base")).await;
    let script = "nohup python3 -c 'import socket,time
s=socket.socket(socket.AF_UNIX); s.bind(\"/run/sandcell-host/guest.sock\"); s.listen(1)
time.sleep(3600)' >/dev/null 2>&1 & for i in $(seq 300); do \
        [ -S /run/sandcell-host/guest.sock ] && break; sleep 0.1; done; ls -l /run/sandcell-host";
    let (out, status) = sh(&sb, script).await;
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("guest.sock"), "{out}");
    let err = sb
        .snapshot(&env.tmp.path().join("snap"), SnapshotKind::Full)
        .await
        .expect_err("a sandbox holding a bound host socket cannot be checkpointed");
    let message = err.to_string();
    eprintln!("snapshot failed: {message}");
    assert!(message.contains("guest.sock"), "{message}");
    assert!(
        matches!(err, sandcell_runtime::Error::Refused { .. }),
        "{err:?}"
    );
    // It runs on, as it was; a pause to disk and a fork are refused the same way.
    assert_eq!(sh(&sb, "echo still here").await, ("still here\n".into(), 0));
    let err = sb
        .pause_to_disk(&env.tmp.path().join("paused"))
        .await
        .expect_err("paused with a bound host socket");
    assert!(err.to_string().contains("guest.sock"), "{err}");
    assert!(sb.fork(1, &env.tmp.path().join("fork")).await.is_err());
    assert_eq!(sh(&sb, "echo still here").await, ("still here\n".into(), 0));
    let (ps, _) = sh(&sb, "ps").await;
    assert!(ps.contains("python3"), "{ps}");
    sb.destroy().await.unwrap();
    common::assert_gone(&env.dirs, &rt, sb.id()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_planted_in_the_agent_dir_during_a_snapshot_are_not_written_through() {
    let env = env();
    let rt = common::gvisor_runtime(&env.dirs).await;
    let sb = start(&rt, &common::minimal_image()).await;
    let pwned = env.tmp.path().join("PWNED");
    let victim = env.tmp.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    // The guest keeps pointing the resume marker (which the host writes) at a new host
    // file and at an existing one.
    let script = format!(
        "nohup sh -c 'while :; do ln -sfn {} /run/sandcell-host/agent.resume; \
         ln -sfn {} /run/sandcell-host/agent.resume; done' >/dev/null 2>&1 & sleep 0.5; \
         ls -l /run/sandcell-host",
        pwned.display(),
        victim.display()
    );
    let (out, status) = sh(&sb, &script).await;
    assert_eq!(status, 0, "{out}");
    for i in 0..3 {
        // May fail (the guest fights the markers); must not write through the links.
        let result = sb
            .snapshot(&env.tmp.path().join(format!("snap{i}")), SnapshotKind::Full)
            .await;
        eprintln!("snapshot {i}: {:?}", result.as_ref().map(|_| ()));
        assert!(!pwned.exists(), "the host created the guest's file");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }
    // Fighting over the marker may have broken the guest's own agent (its loss only):
    // whatever state it is in, it is cleaned up.
    sb.destroy().await.unwrap();
    common::assert_gone(&env.dirs, &rt, sb.id()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_flooding_its_console_leaves_a_capped_log() {
    let env = env();
    let rt = common::gvisor_runtime(&env.dirs).await;
    let sb = start(&rt, &common::minimal_image()).await;
    let (out, status) = sh(
        &sb,
        "dd if=/dev/zero bs=1M count=300 of=/proc/1/fd/1 2>&1; echo marker-after >/proc/1/fd/1",
    )
    .await;
    assert_eq!(status, 0, "{out}");
    let console = env.dirs.sandbox_run_dir(sb.id()).join("console.log");
    let cap = sandcell_runtime::capped_log::CONSOLE_LOG_CAP;
    let mut size = 0;
    // The writer may still be behind the guest: until the marker is in.
    for _ in 0..300 {
        // Missing for a moment while it rotates.
        let text = std::fs::read(&console).unwrap_or_default();
        size = text.len() as u64;
        if text.ends_with(b"marker-after\n") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let text = std::fs::read(&console).unwrap();
    assert!(
        text.ends_with(b"marker-after\n"),
        "the latest output is missing"
    );
    assert!(
        size <= cap,
        "console.log is {size} bytes, over the cap of {cap}"
    );
    let rotated = sandcell_runtime::capped_log::rotated(&console);
    assert!(std::fs::metadata(&rotated).unwrap().len() <= cap);
    assert_eq!(sh(&sb, "echo still here").await, ("still here\n".into(), 0));
    sb.destroy().await.unwrap();
    common::assert_gone(&env.dirs, &rt, sb.id()).await;
}

/// Loop devices backed by `file` (`losetup -j`).
fn loops_of(file: &Path) -> String {
    let out = std::process::Command::new("losetup")
        .arg("-j")
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_enospc_and_survives_snapshots_and_nothing_leaks() {
    let env = env();
    let rt = common::gvisor_runtime(&env.dirs).await;
    let mut spec = common::sandbox_spec(&common::minimal_image(), 256);
    spec.disk_mib = Some(128);
    let id = spec.id.clone();
    let sb: Arc<dyn Sandbox> = Arc::from(rt.create(spec).await.unwrap());
    sb.start().await.unwrap();
    let disk = env.dirs.data.join("disks").join(format!("{id}.ext4"));
    assert!(
        !loops_of(&disk).is_empty(),
        "no loop device for {}",
        disk.display()
    );

    // `df /` tells the disk's size (in 1K blocks: ext4 keeps some for itself).
    let (df, status) = sh(&sb, "df -k / | tail -1").await;
    assert_eq!(status, 0, "{df}");
    let size_k: u64 = df.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        (100_000..=131_072).contains(&size_k),
        "df / says {size_k} KiB: {df}"
    );

    // Writing past it is ENOSPC, not the end of the sandbox (256 MiB of memory > 128 MiB).
    let (out, status) = sh(
        &sb,
        "dd if=/dev/zero of=/root/big bs=1M count=400 2>&1; echo rc=$?",
    )
    .await;
    assert_eq!(status, 0);
    assert!(out.contains("No space left on device"), "{out}");
    assert!(!out.contains("rc=0"), "{out}");
    assert_eq!(
        sh(&sb, "rm /root/big; echo kept > /root/file; cat /root/file")
            .await
            .0,
        "kept\n"
    );

    // A snapshot restores in place onto the same disk, a restore gets a disk of its own.
    let snap = sb
        .snapshot(&env.tmp.path().join("snap"), SnapshotKind::Full)
        .await
        .unwrap();
    assert_eq!(sh(&sb, "cat /root/file").await.0, "kept\n");
    let mut restore =
        sandcell_runtime::RestoreSpec::new(sandcell_runtime::new_sandbox_id().unwrap());
    restore.boot_timeout = std::time::Duration::from_secs(60);
    let child: Arc<dyn Sandbox> = Arc::from(rt.restore(&snap, restore).await.unwrap());
    assert_eq!(sh(&child, "cat /root/file").await.0, "kept\n");
    let (out, _) = sh(&child, "dd if=/dev/zero of=/root/big bs=1M count=400 2>&1").await;
    assert!(out.contains("No space left on device"), "{out}");
    let child_disk = env
        .dirs
        .data
        .join("disks")
        .join(format!("{}.ext4", child.id()));
    assert!(child_disk.exists());

    for s in [&sb, &child] {
        s.destroy().await.unwrap();
        common::assert_gone(&env.dirs, &rt, s.id()).await;
    }
    for d in [&disk, &child_disk] {
        assert!(!d.exists(), "{} is left", d.display());
    }
    // losetup -j needs the file; the autoclear loop devices are gone with their mounts.
    let all = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&all.stdout);
    assert!(
        !all.contains(&id) && !all.contains(child.id()),
        "loop devices left: {all}"
    );
}
