//! What the gvisor runtime tests share: their setup (root, the installed minimal image, temp
//! dirs, the runtime), running a shell command in a sandbox (bounded in time, with the
//! console on failure), checking that nothing of a sandbox is left, and sweeping what a
//! failed test left.

#![allow(dead_code)]

use sandcell_envd_client::{OutputKind, decode_data};
use sandcell_proto::agent::{Event, ProcessConfig, StartRequest};
use sandcell_runtime::cgroup::{self, SandboxCgroup};
use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::{Dirs, Image, Sandbox, SandboxSpec, agent_client, new_sandbox_id};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Fails (loudly) unless the tests run as root; `tests` names them in the message.
pub fn require_root(tests: &str) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the {tests} tests need root (runsc, overlayfs, cgroups)"
    );
}

/// The installed minimal image (under `$SANDCELL_DATA_DIR`, default /var/lib/sandcell).
pub fn minimal_image() -> Image {
    let data = std::env::var("SANDCELL_DATA_DIR").unwrap_or_else(|_| "/var/lib/sandcell".into());
    Image::resolve(&Path::new(&data).join("images"), "minimal").unwrap_or_else(|e| {
        panic!("the tests need the minimal image (run `make images install`): {e}")
    })
}

/// A temp dir in /tmp named `<prefix>…` and the test's own data and run dirs inside it.
pub fn temp_dirs(prefix: &str) -> (tempfile::TempDir, Dirs) {
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
    (tmp, dirs)
}

pub async fn gvisor_runtime(dirs: &Dirs) -> GvisorRuntime {
    GvisorRuntime::new(dirs.clone(), sandcell_runtime::net::NetRegistry::new())
        .await
        .expect("runsc is needed (apt install runsc)")
}

/// A spec for a new sandbox of `image` with `memory_mib` and a 60 s boot timeout.
pub fn sandbox_spec(image: &Image, memory_mib: u32) -> SandboxSpec {
    let mut spec = SandboxSpec::new(new_sandbox_id().unwrap(), image.clone());
    spec.memory_mib = memory_mib;
    spec.boot_timeout = Duration::from_secs(60);
    spec
}

/// The ids of the containers runsc lists under the runtime's root.
pub async fn runsc_containers(rt: &GvisorRuntime) -> String {
    let out = tokio::process::Command::new("runsc")
        .arg(format!("--root={}", rt.runsc_root().display()))
        .args(["list", "--quiet"])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Nothing of sandbox `id` is left: run dir, runsc container, cgroup, mount.
pub async fn assert_gone(dirs: &Dirs, rt: &GvisorRuntime, id: &str) {
    let run_dir = dirs.sandbox_run_dir(id);
    assert!(!run_dir.exists(), "{} is left", run_dir.display());
    let listed = runsc_containers(rt).await;
    assert!(!listed.contains(id), "runsc still lists {id}: {listed}");
    let version = cgroup::detect_version().unwrap();
    assert!(
        !SandboxCgroup::existing_ids(version).contains(&id.to_string()),
        "cgroup of {id} is left"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(id), "a mount of {id} is left");
}

/// Removes what a failed test left of every sandbox under `dirs`: the runsc container, the
/// network, the cgroup, the root mount.
pub struct SweepGuard {
    pub dirs: Dirs,
}

impl Drop for SweepGuard {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.dirs.run) else {
            return;
        };
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            let _ = std::process::Command::new("runsc")
                .arg(format!("--root={}", self.dirs.runsc_root().display()))
                .args(["delete", "--force", &id])
                .output();
            let _ = sandcell_runtime::net::network::remove(&id);
            if let Some(version) = cgroup::detect_version() {
                let _ = SandboxCgroup::of(version, &id).remove();
            }
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(entry.path().join("rootfs"))
                .status();
        }
    }
}

/// `sh -c SCRIPT` in the sandbox: stdout, and the exit status. Fails after 60 s rather than
/// hanging the test run when an agent stops answering.
pub async fn sh(sb: &Arc<dyn Sandbox>, script: &str) -> (String, i32) {
    match tokio::time::timeout(Duration::from_secs(60), sh_unbounded(sb, script)).await {
        Ok(result) => result,
        Err(_) => panic!(
            "{script:?} in {} got no answer within 60 s; its console:\n{}",
            sb.id(),
            console_of(sb.id())
        ),
    }
}

/// The console log of sandbox `id` (found under the tests' temp dirs), for failure messages.
pub fn console_of(id: &str) -> String {
    let Ok(tmps) = std::fs::read_dir("/tmp") else {
        return String::new();
    };
    tmps.flatten()
        .map(|e| e.path().join("run").join(id).join("console.log"))
        .find(|p| p.exists())
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_else(|| "(no console log found)".into())
}

async fn sh_unbounded(sb: &Arc<dyn Sandbox>, script: &str) -> (String, i32) {
    let req = StartRequest {
        process: ProcessConfig {
            cmd: "sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Default::default()
        },
        ..Default::default()
    };
    // A just-restored gVisor agent sometimes resets the first connection made to it (a
    // runsc defect, seen about once in fifty restores under load): one more try on a new
    // connection. Anything else, or a second reset, fails the test.
    let mut stream = match agent_client(sb.clone()).start(&req).await {
        Ok(s) => s,
        Err(first) => {
            eprintln!(
                "{}: Start failed once ({first}); trying a new connection",
                sb.id()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            agent_client(sb.clone()).start(&req).await.unwrap()
        }
    };
    let mut out = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev.unwrap().event {
            Event::Data(d) => {
                if let (OutputKind::Stdout, b) = decode_data(&d).unwrap() {
                    out.extend(b);
                }
            }
            Event::End(end) => {
                return (
                    String::from_utf8_lossy(&out).into_owned(),
                    end.shell_status(),
                );
            }
            _ => {}
        }
    }
    panic!("the process stream of {script:?} ended without an end event");
}
