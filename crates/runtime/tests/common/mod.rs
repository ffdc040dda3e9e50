//! What the gvisor snapshot tests share: running a shell command in a sandbox (bounded in
//! time, with the console on failure) and sweeping what a failed test left.

#![allow(dead_code)]

use sandcell_agent::client::{OutputKind, decode_data};
use sandcell_proto::agent::{Event, ProcessConfig, StartRequest};
use sandcell_runtime::cgroup::{self, SandboxCgroup};
use sandcell_runtime::{Dirs, Sandbox, agent_client};
use std::sync::Arc;
use std::time::Duration;

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
