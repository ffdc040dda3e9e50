//! `sandcell-vmm --jail`: a payload VM runs inside the jail, and the running VMM is what
//! the jail promises from the outside: its own uid and gid, no capabilities, `no_new_privs`,
//! seccomp, the limits asked for, and a filesystem that holds only what was bound (the host's
//! /etc is not there). A forbidden syscall still kills it. Wrong jails are refused.
//! Needs root (mount namespaces, mknod) and /dev/kvm: fails without them.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use common::{
    Control, assert_exit, ok, require_kvm, run, shutdown_and_expect_stopped, spawn, wait,
    wait_until, with_log_and_control,
};
use sandcell_proto::vmm::{ControlRequest, ExitStatus, JailBind, JailSpec, VmConfig, VmState};

/// A uid/gid no account has, different per test process.
fn jail_id() -> u32 {
    1_900_000_000 + std::process::id() % 1_000_000
}

fn require_root() {
    // SAFETY: geteuid has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the jail tests need root (mount namespaces, mknod): CI runs them as root"
    );
}

/// A jail for a payload VM whose log and control socket are in `run_dir` (made the jail
/// uid's), its kernel (the payload) bound read-only.
fn jail_for(cfg: &VmConfig, run_dir: &Path, root: &Path) -> JailSpec {
    let id = jail_id();
    std::os::unix::fs::chown(run_dir, Some(id), Some(id)).expect("chown run dir");
    JailSpec {
        uid: id,
        gid: id,
        root: root.to_path_buf(),
        binds: vec![
            JailBind {
                path: cfg.kernel.clone(),
                writable: false,
            },
            JailBind {
                path: run_dir.to_path_buf(),
                writable: true,
            },
        ],
        devices: vec![PathBuf::from("/dev/kvm")],
        max_open_files: 256,
        max_file_bytes: 256 << 20,
        max_threads: 16,
    }
}

/// `cfg` booting its own copy of its kernel, in `dir`: the shared payload file is rebuilt
/// (renamed over) by tests running beside this one.
fn own_kernel(cfg: VmConfig, dir: &Path) -> VmConfig {
    let kernel = dir.join("kernel.elf");
    std::fs::copy(&cfg.kernel, &kernel).expect("copying the payload");
    VmConfig { kernel, ..cfg }
}

/// A fresh directory (canonical: the jail refuses paths through links) for the test.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = std::fs::canonicalize(tmp.path()).expect("canonical tempdir");
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let run_dir = base.join("run");
    let root = base.join("root");
    std::fs::create_dir(&run_dir).expect("run dir");
    std::fs::create_dir(&root).expect("root dir");
    (tmp, run_dir, root)
}

fn status_field(pid: u32, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
}

#[test]
fn a_jailed_vmm_runs_its_vm_unprivileged_and_sees_only_its_binds() {
    require_root();
    require_kvm();
    let (_tmp, run_dir, root) = dirs();
    let (cfg, log, sock) = with_log_and_control(&run_dir, "ticker", "ticker");
    let cfg = own_kernel(cfg, root.parent().expect("the test's dir"));
    let spec = jail_for(&cfg, &run_dir, &root);
    let json = serde_json::to_string(&spec).expect("jail JSON");
    let child = spawn(&cfg, &["--jail", &json]);
    let mut ctl = Control::connect(&sock);
    assert_eq!(ctl.request(&ControlRequest::Status), ok(VmState::Running));
    wait_until("the first tick in the console log", || {
        std::fs::read(&log).is_ok_and(|l| l.contains(&b'\n'))
    });
    let pid = child.id();
    let id = spec.uid.to_string();
    assert_eq!(status_field(pid, "Uid:"), [id.as_str(); 4].join(" "));
    assert_eq!(status_field(pid, "Gid:"), [id.as_str(); 4].join(" "));
    assert_eq!(status_field(pid, "Groups:"), "");
    for caps in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(status_field(pid, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    assert_eq!(status_field(pid, "Seccomp:"), "2");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let limit = |name: &str| {
        let line = limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in limits"));
        line[name.len()..]
            .split_whitespace()
            .take(2)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(limit("Max open files"), ["256", "256"]);
    assert_eq!(limit("Max file size"), ["268435456", "268435456"]);
    assert_eq!(limit("Max processes"), ["16", "16"]);

    // Its filesystem, seen through /proc/<pid>/root: the binds, dev, proc; nothing else.
    let jail_root = PathBuf::from(format!("/proc/{pid}/root"));
    let mut top: Vec<String> = std::fs::read_dir(&jail_root)
        .expect("the jail's root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    let mut expected: Vec<String> = ["dev", "proc"].iter().map(|s| s.to_string()).collect();
    for b in &spec.binds {
        let first = b.path.components().nth(1).expect("a first component");
        expected.push(first.as_os_str().to_string_lossy().into_owned());
    }
    expected.sort();
    expected.dedup();
    assert_eq!(top, expected, "the jail's / holds more than its binds");
    assert!(!jail_root.join("etc/passwd").exists());
    let inner_kernel = jail_root.join(cfg.kernel.strip_prefix("/").expect("absolute"));
    assert_eq!(
        std::fs::read(&inner_kernel).expect("the bound kernel"),
        std::fs::read(&cfg.kernel).expect("the kernel")
    );
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    let kernel_mount = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == cfg.kernel.to_str())
        .unwrap_or_else(|| panic!("the kernel is not a mount in the jail:\n{mounts}"));
    assert!(
        kernel_mount
            .split_whitespace()
            .nth(5)
            .is_some_and(|o| o.starts_with("ro")),
        "the kernel bind is writable: {kernel_mount}"
    );

    shutdown_and_expect_stopped(&mut ctl, child);
    // The host's mount table never saw the jail's mounts.
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!host_mounts.contains(root.to_str().expect("utf-8")));
}

#[test]
fn a_forbidden_syscall_still_kills_a_jailed_vmm() {
    require_root();
    require_kvm();
    let (_tmp, run_dir, root) = dirs();
    let (cfg, _log, sock) = with_log_and_control(&run_dir, "ticker", "ticker");
    let json = serde_json::to_string(&jail_for(&cfg, &run_dir, &root)).expect("JSON");
    let child = spawn(&cfg, &["--jail", &json]);
    let mut ctl = Control::connect(&sock);
    assert_eq!(ctl.request(&ControlRequest::Status), ok(VmState::Running));
    ctl.send_only("{\"op\":\"test_forbidden_syscall\"}\n");
    let out = wait(child);
    assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{:?}", out.status);
}

#[test]
fn wrong_jails_are_refused_before_the_vm_starts() {
    require_root();
    require_kvm();
    let (_tmp, run_dir, root) = dirs();
    let (cfg, _log, _sock) = with_log_and_control(&run_dir, "ticker", "ticker");
    let good = jail_for(&cfg, &run_dir, &root);
    let link = run_dir.join("etc-link");
    std::os::unix::fs::symlink("/etc", &link).expect("symlink");
    let cases: Vec<(&str, JailSpec)> = vec![
        (
            "uid 0",
            JailSpec {
                uid: 0,
                ..good.clone()
            },
        ),
        (
            "a bind through a link",
            JailSpec {
                binds: vec![JailBind {
                    path: link.clone(),
                    writable: false,
                }],
                ..good.clone()
            },
        ),
        (
            "a relative root",
            JailSpec {
                root: PathBuf::from("root"),
                ..good.clone()
            },
        ),
        (
            "a device that is a file",
            JailSpec {
                devices: vec![cfg.kernel.clone()],
                ..good.clone()
            },
        ),
    ];
    for (what, spec) in cases {
        let json = serde_json::to_string(&spec).expect("JSON");
        let out = run(&cfg, &["--jail", &json]);
        assert_exit(&out, ExitStatus::BadConfig);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("jail"),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run(&cfg, &["--jail", "{not json"]);
    assert_exit(&out, ExitStatus::BadConfig);
}
