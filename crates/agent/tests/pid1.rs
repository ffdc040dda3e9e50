//! The agent as PID 1, in fresh PID, mount, UTS, IPC and network namespaces (`unshare`): its
//! mounts, orphan reaping with `waitpid(-1)`, and power-off ending the namespace.
//!
//! Needs root and util-linux `unshare`; fails (does not skip) without them. Safe on the host:
//! every mount is in the private mount namespace, and the power port is only written by the
//! init of the initial PID namespace (see `power.rs`).

mod common;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use common::{run, sh};
use sandcell_envd_client::{EnvdClient, UnixConnector};

struct Pid1Agent {
    child: Child,
    _dir: tempfile::TempDir,
    client: EnvdClient<UnixConnector>,
}

impl Drop for Pid1Agent {
    fn drop(&mut self) {
        // unshare runs with --kill-child: killing it SIGKILLs the agent (PID 1 ignores a
        // SIGTERM it has no handler for), which tears the whole namespace down.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn spawn_pid1() -> Pid1Agent {
    // SAFETY: geteuid(2) has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (unshare of PID and mount namespaces)"
    );
    // The agent mounts a tmpfs on /tmp and /run in its namespace: the socket lives elsewhere,
    // also when the checkout (and so CARGO_TARGET_TMPDIR) is itself under /tmp or /run.
    let target_tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let masked = target_tmp.starts_with("/tmp") || target_tmp.starts_with("/run");
    let base = if masked {
        PathBuf::from("/var/tmp")
    } else {
        target_tmp
    };
    std::fs::create_dir_all(&base).expect("creating the socket's parent dir");
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    let sock = dir.path().join("agent.sock");
    let mut child = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--mount-proc",
            "--uts",
            "--ipc",
            "--net",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_sandcell-agent"))
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .spawn()
        .expect("running unshare (util-linux) for the PID-1 test");
    let client = EnvdClient::unix(&sock);
    for _ in 0..400 {
        if client.health().await.is_ok() {
            return Pid1Agent {
                child,
                _dir: dir,
                client,
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the PID-1 agent never became healthy");
}

#[tokio::test]
async fn as_pid_1_it_mounts_reaps_orphans_and_powers_off() {
    let mut agent = spawn_pid1().await;

    let out = run(&agent.client, &sh("cat /proc/1/comm; exit 5")).await;
    assert_eq!(out.stdout, b"sandcell-agent\n");
    assert_eq!(
        out.end.exit_code, 5,
        "waitpid(-1) must still hand the status to its stream"
    );

    let mounts = run(&agent.client, &sh("cut -d' ' -f5 /proc/self/mountinfo")).await;
    let mounts = String::from_utf8_lossy(&mounts.stdout).into_owned();
    for target in [
        "/proc", "/sys", "/dev", "/dev/pts", "/dev/shm", "/tmp", "/run",
    ] {
        assert!(
            mounts.lines().any(|m| m == target),
            "{target} is not mounted:\n{mounts}"
        );
    }
    let fd = run(&agent.client, &sh("readlink /dev/fd")).await;
    assert_eq!(fd.stdout, b"/proc/self/fd\n");

    // The shell exits at once, leaving `sleep` to be re-parented to PID 1 (the agent).
    let out = run(&agent.client, &sh("sleep 0.2 & exit 0")).await;
    assert_eq!(out.end.exit_code, 0);
    let mut zombies = String::from("(not checked)");
    for _ in 0..200 {
        let ps = run(
            &agent.client,
            &sh("for s in /proc/[0-9]*/stat; do cat $s; echo; done 2>/dev/null"),
        )
        .await;
        let text = String::from_utf8_lossy(&ps.stdout).into_owned();
        // Field 3 of /proc/PID/stat is the state; the command (field 2) is in parentheses.
        zombies = text
            .lines()
            .filter(|l| {
                l.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z'))
            })
            .collect::<Vec<_>>()
            .join("\n");
        let sleeping = text.contains("(sleep)");
        if zombies.is_empty() && !sleeping {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(zombies.is_empty(), "zombies left: {zombies}");

    agent.client.poweroff().await.expect("poweroff answered");
    let mut exited = false;
    for _ in 0..400 {
        if agent
            .child
            .try_wait()
            .expect("try_wait on unshare")
            .is_some()
        {
            exited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(exited, "powering off did not end the namespace");
}

/// SIGTERM (`runsc kill`), SIGUSR2 (busybox `poweroff`) and SIGUSR1 (busybox `halt`) each
/// power PID 1 off.
#[tokio::test]
async fn as_pid_1_power_signals_power_off() {
    for (sig, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGUSR1, "SIGUSR1"),
    ] {
        let mut agent = spawn_pid1().await;
        let unshare = agent.child.id();
        let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
            .expect("reading unshare's children");
        let agent_pid: libc::pid_t = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .expect("unshare has the agent as its child");
        // SAFETY: kill(2) on the agent we started (seen from the parent namespace).
        assert_eq!(unsafe { libc::kill(agent_pid, sig) }, 0);
        let mut exited = false;
        for _ in 0..400 {
            if agent
                .child
                .try_wait()
                .expect("try_wait on unshare")
                .is_some()
            {
                exited = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(exited, "{name} did not end the PID-1 agent");
    }
}
