//! The seccomp filters are in force in a running `sandcell-vmm`: a syscall outside them
//! kills the process with SIGSYS (and dumps no core), `--no-seccomp` turns them off, and
//! /proc shows the mode.
//! Every other payload test in this directory also runs under the filters (the default),
//! so a code path that needs a syscall missing from a table kills its VMM and fails there.
//! Needs /dev/kvm (fails without it) and the `test-control` feature (enabled for this
//! crate's tests by its dev-dependency on itself).

mod common;

use std::os::unix::process::ExitStatusExt;

use common::{
    Control, ok, require_kvm, shutdown_and_expect_stopped, spawn, wait, wait_until,
    with_log_and_control,
};
use sandcell_proto::vmm::{ControlRequest, VmState};

const FORBIDDEN: &str = "{\"op\":\"test_forbidden_syscall\"}\n";

/// The `Seccomp:` and `NoNewPrivs:` lines of a process's /proc status.
fn seccomp_status(pid: u32) -> (String, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("Seccomp:"), field("NoNewPrivs:"))
}

/// The `Seccomp:` line of each of the process's threads, by thread name.
fn thread_modes(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("task dir") {
        let t = t.expect("task entry").path();
        let status = std::fs::read_to_string(t.join("status")).expect("task status");
        let get = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        out.push((get("Name:"), get("Seccomp:")));
    }
    out.sort();
    out
}

#[test]
fn a_forbidden_syscall_kills_the_vmm_with_sigsys() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cfg, log, sock) = with_log_and_control(dir.path(), "ticker", "ticker");
    let child = spawn(&cfg, &[]);
    let mut ctl = Control::connect(&sock);
    assert_eq!(ctl.request(&ControlRequest::Status), ok(VmState::Running));
    // Status answered: the VMM thread is in its loop, so its filter is installed. A tick on
    // the console: the vCPU ran guest code, so its filter is installed too.
    wait_until("the first tick", || {
        std::fs::read(&log).is_ok_and(|l| l.contains(&b'\n'))
    });
    let pid = child.id();
    assert_eq!(seccomp_status(pid), ("2".into(), "1".into()));
    let threads = thread_modes(pid);
    assert!(
        threads.iter().any(|(n, _)| n == "vcpu0"),
        "no vcpu0 thread: {threads:?}"
    );
    for (name, mode) in &threads {
        assert_eq!(
            mode, "2",
            "thread {name} runs without a filter: {threads:?}"
        );
    }

    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .expect("core limit line");
    assert_eq!(
        core.split_whitespace().skip(4).take(2).collect::<Vec<_>>(),
        ["0", "0"],
        "a VMM never dumps core (its guest's memory): {core}"
    );

    ctl.send_only(FORBIDDEN);
    let out = wait(child);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSYS),
        "the VMM did not die of SIGSYS: {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn no_seccomp_runs_without_filters() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cfg, _log, sock) = with_log_and_control(dir.path(), "ticker", "ticker");
    let child = spawn(&cfg, &["--no-seccomp"]);
    let mut ctl = Control::connect(&sock);
    assert_eq!(ctl.request(&ControlRequest::Status), ok(VmState::Running));
    assert_eq!(seccomp_status(child.id()).0, "0");
    // Unfiltered, the forbidden syscall returns and the line is refused as unknown.
    let resp = ctl.send_raw(FORBIDDEN);
    assert!(resp.contains("\"result\":\"error\""), "{resp}");
    shutdown_and_expect_stopped(&mut ctl, child);
}
