//! Snapshot, restore, pool mode and fork against the `counter` payload, natively on
//! /dev/kvm (fails without it). The payload counts in a register and in memory and
//! prints each count, so a restored copy that continues (rather than restarting, or
//! running with a different memory) is visible on its console.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{
    Control, assert_exit, describe, ok, require_kvm, shutdown_and_expect_stopped,
    sigterm_and_expect_stopped, spawn, wait, wait_until, with_log_and_control,
};
use sandcell_proto::vmm::{
    ControlRequest, ControlResponse, ExitStatus, RestoreOverrides, SnapshotMode, VmConfig, VmState,
};

const COUNTER_ADDR: u64 = 0x30_0000;

/// The counts printed on a console log, in order (a partial last line is ignored).
fn counts(log: &Path) -> Vec<u32> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(i) => &text[..i],
        None => "",
    };
    complete
        .lines()
        .filter_map(|l| l.strip_prefix("count "))
        .map(|h| u32::from_str_radix(h, 16).unwrap_or_else(|e| panic!("bad count {h:?}: {e}")))
        .collect()
}

fn assert_consecutive(c: &[u32], what: &str) {
    for w in c.windows(2) {
        assert_eq!(w[1], w[0] + 1, "{what}: counts jump: {c:?}");
    }
}

fn no_mismatch(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        !text.contains("MISMATCH"),
        "register and memory counts diverged: {text}"
    );
}

fn vmm(args: &[&str]) -> Child {
    Command::new(common::vmm_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning sandcell-vmm")
}

/// Restores `state` over `mem` in a new VMM, its console logged to `log`.
fn restore_logged(state: &Path, mem: &Path, log: &Path) -> Child {
    vmm(&[
        "--restore",
        s(state),
        "--mem",
        s(mem),
        "--serial-log",
        s(log),
    ])
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A counter VM, running until it printed `min` counts, with a control socket.
struct Parent {
    child: Child,
    ctl: Control,
    log: PathBuf,
}

fn start_counter(dir: &Path, name: &str, min: usize) -> Parent {
    let (cfg, log, sock) = with_log_and_control(dir, name, "counter");
    let child = spawn(&cfg, &[]);
    let ctl = Control::connect(&sock);
    wait_until("the first counts", || counts(&log).len() >= min);
    Parent { child, ctl, log }
}

fn snapshot(ctl: &mut Control, dir: &Path, mode: SnapshotMode) -> (PathBuf, PathBuf) {
    let state_path = dir.join(format!("{mode:?}.state"));
    let mem_path = dir.join(format!("{mode:?}.mem"));
    let resp = ctl.request(&ControlRequest::Snapshot {
        state_path: state_path.clone(),
        mem_path: mem_path.clone(),
        mode,
        disk_new_top: None,
    });
    assert!(matches!(resp, ControlResponse::Ok { .. }), "{resp:?}");
    (state_path, mem_path)
}

fn stop(mut p: Parent) {
    shutdown_and_expect_stopped(&mut p.ctl, p.child);
}

fn terminate(child: Child) {
    sigterm_and_expect_stopped(child);
}

fn memory_u64(mem: &Path, addr: u64) -> u64 {
    let mut b = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(mem).expect("memory image"),
        &mut b,
        addr,
    )
    .expect("reading the memory image");
    u64::from_le_bytes(b)
}

#[test]
fn a_restored_vm_continues_counting_where_it_was_saved() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut parent = start_counter(dir.path(), "parent", 3);
    assert_eq!(
        parent.ctl.request(&ControlRequest::Pause),
        ok(VmState::Paused)
    );
    let (state, mem) = snapshot(&mut parent.ctl, dir.path(), SnapshotMode::Full);
    assert_eq!(
        parent.ctl.request(&ControlRequest::Status),
        ok(VmState::Paused),
        "a paused VM stays paused after a snapshot"
    );
    let saved = counts(&parent.log);
    let last = *saved.last().expect("counts before the snapshot");
    stop(parent);
    // The guest's memory copy of the count is in the image, equal to what it printed
    // (or one more, if the pause fell between the increment and the print).
    let in_memory = memory_u64(&mem, COUNTER_ADDR);
    assert!(
        in_memory == u64::from(last) || in_memory == u64::from(last) + 1,
        "memory image holds count {in_memory}, the console showed {last}"
    );

    let log = dir.path().join("restored.log");
    let child = restore_logged(&state, &mem, &log);
    wait_until("counts from the restored VM", || counts(&log).len() >= 3);
    terminate(child);
    let restored = counts(&log);
    assert!(
        restored[0] == last + 1 || (restored[0] == last + 2 && in_memory == u64::from(last) + 1),
        "the restored VM printed {restored:?} after {last}: it must continue, not restart"
    );
    assert_consecutive(&restored, "restored VM");
    no_mismatch(&log);
    assert_eq!(
        memory_u64(&mem, COUNTER_ADDR),
        in_memory,
        "the memory file is never written by a restored VM"
    );
}

/// (Rss, Pss, Shared_Clean + Shared_Dirty) in KiB of the mappings of `file` in process
/// `pid` (the image's pages are dirty in the page cache when it was just written).
fn mapping_kib(pid: u32, file: &Path) -> (u64, u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let name = s(file);
    let (mut rss, mut pss, mut shared, mut inside) = (0, 0, 0, false);
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            inside = line.ends_with(name);
            continue;
        }
        if !inside {
            continue;
        }
        let kib = f.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match first {
            "Rss:" => rss += kib,
            "Pss:" => pss += kib,
            "Shared_Clean:" | "Shared_Dirty:" => shared += kib,
            _ => {}
        }
    }
    (rss, pss, shared)
}

#[test]
fn twenty_concurrent_restores_all_run_and_share_their_memory_image() {
    require_kvm();
    const N: usize = 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut parent = start_counter(dir.path(), "parent", 2);
    let (state, mem) = snapshot(&mut parent.ctl, dir.path(), SnapshotMode::Full);
    stop(parent);
    let logs: Vec<PathBuf> = (0..N)
        .map(|i| dir.path().join(format!("c{i}.log")))
        .collect();
    let children: Vec<Child> = logs
        .iter()
        .map(|log| restore_logged(&state, &mem, log))
        .collect();
    for log in &logs {
        wait_until("every clone counting", || counts(log).len() >= 2);
    }
    let mut totals = (0, 0, 0);
    for c in &children {
        let (rss, pss, shared) = mapping_kib(c.id(), &mem);
        totals = (totals.0 + rss, totals.1 + pss, totals.2 + shared);
    }
    eprintln!(
        "{N} restored clones, memory image mappings: Rss {} KiB, Pss {} KiB, Shared {} KiB",
        totals.0, totals.1, totals.2
    );
    for c in children {
        terminate(c);
    }
    for log in &logs {
        let c = counts(log);
        assert_consecutive(&c, "a clone");
        no_mismatch(log);
    }
    // Each clone read the payload's 2 MiB pattern from the image: those pages are shared
    // through the page cache, so together they are counted (Pss) far below their Rss.
    assert!(totals.2 >= (N as u64) * 2048, "shared pages: {totals:?}");
    assert!(totals.1 * 4 < totals.0, "Pss well under Rss: {totals:?}");
}

#[test]
fn corrupt_truncated_or_foreign_snapshots_are_refused_with_bad_config() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut parent = start_counter(dir.path(), "parent", 1);
    let (state, mem) = snapshot(&mut parent.ctl, dir.path(), SnapshotMode::Full);
    stop(parent);
    let good = std::fs::read(&state).expect("state file");
    let variants: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "flipped",
            {
                let mut b = good.clone();
                let mid = b.len() / 2;
                b[mid] ^= 0x01;
                b
            },
            "checksum",
        ),
        ("truncated", good[..good.len() - 100].to_vec(), "truncated"),
        (
            "version",
            {
                let mut b = good.clone();
                b[8] = b[8].wrapping_add(1);
                b
            },
            "format version",
        ),
        (
            "foreign",
            b"#!/bin/sh\necho not a snapshot\n".to_vec(),
            "not a Sandcell snapshot",
        ),
        ("empty", Vec::new(), "truncated"),
    ];
    for (name, bytes, expect) in variants {
        let path = dir.path().join(format!("{name}.state"));
        std::fs::write(&path, bytes).expect("write variant");
        let out = wait(vmm(&["--restore", s(&path), "--mem", s(&mem)]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(ExitStatus::BadConfig.code()),
            "{name}: {}",
            describe(&out)
        );
        assert!(err.contains(expect), "{name}: expected {expect:?} in {err}");
    }
    // A memory file shorter than the guest's memory.
    let short = dir.path().join("short.mem");
    std::fs::write(&short, vec![0u8; 1 << 20]).expect("short memory");
    let out = wait(vmm(&["--restore", s(&state), "--mem", s(&short)]));
    assert_exit(&out, ExitStatus::BadConfig);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("memory file"),
        "{}",
        describe(&out)
    );
}

#[test]
fn a_waiting_vmm_restores_on_command_and_keeps_serving_its_socket() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut parent = start_counter(dir.path(), "parent", 2);
    // A full snapshot lets the parent run on: the count it froze lies between the last one
    // logged before the request and the last one logged after the answer (CI once saw the
    // parent log 8 more counts before a read after the snapshot).
    let before = *counts(&parent.log).last().expect("counts");
    let (state, mem) = snapshot(&mut parent.ctl, dir.path(), SnapshotMode::Full);
    let after = *counts(&parent.log).last().expect("counts");
    stop(parent);

    let sock = dir.path().join("pool.sock");
    let child = vmm(&["--wait-restore", "--control-socket", s(&sock)]);
    let mut ctl = Control::connect(&sock);
    assert_eq!(ctl.request(&ControlRequest::Status), ok(VmState::Waiting));
    let resp = ctl.request(&ControlRequest::Pause);
    assert!(matches!(resp, ControlResponse::Error { .. }), "{resp:?}");
    // A bad restore is answered and the VMM keeps waiting.
    let resp = ctl.request(&ControlRequest::Restore {
        state_path: dir.path().join("nope.state"),
        mem_path: mem.clone(),
        overrides: RestoreOverrides::default(),
        paused: false,
    });
    assert!(
        matches!(&resp, ControlResponse::Error { message, .. } if message.contains("nope.state")),
        "{resp:?}"
    );
    let log = dir.path().join("pool.log");
    let resp = ctl.request(&ControlRequest::Restore {
        state_path: state,
        mem_path: mem,
        overrides: RestoreOverrides {
            serial_log: Some(log.clone()),
            ..Default::default()
        },
        paused: true,
    });
    assert_eq!(resp, ok(VmState::Paused));
    assert!(
        counts(&log).is_empty(),
        "a restore asked to stay paused does not run"
    );
    assert_eq!(ctl.request(&ControlRequest::Resume), ok(VmState::Running));
    wait_until("counts after the pool restore", || counts(&log).len() >= 2);
    let c = counts(&log);
    assert!(
        c[0] > before && c[0] <= after + 1,
        "{c:?}: the restored counter must go on from the frozen count, between {before} (before the snapshot) and {after} (after it)"
    );
    shutdown_and_expect_stopped(&mut ctl, child);
}

#[test]
fn a_fork_leaves_the_parent_running_and_children_diverge_from_the_frozen_image() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut parent = start_counter(dir.path(), "parent", 2);
    let (state, image) = snapshot(&mut parent.ctl, dir.path(), SnapshotMode::Fork);
    assert_eq!(
        parent.ctl.request(&ControlRequest::Status),
        ok(VmState::Running),
        "the parent runs on after the fork"
    );
    let at_fork = memory_u64(&image, COUNTER_ADDR);
    let before = counts(&parent.log).len();
    wait_until("the parent counting after the fork", || {
        counts(&parent.log).len() >= before + 3
    });

    let log = dir.path().join("child.log");
    let child = restore_logged(&state, &image, &log);
    wait_until("the child counting", || counts(&log).len() >= 3);
    let c = counts(&log);
    assert!(
        u64::from(c[0]) == at_fork + 1 || u64::from(c[0]) == at_fork,
        "the child starts from the fork point {at_fork}: {c:?}"
    );
    // Both write the same counter page; neither sees the other's writes (each checks its
    // memory copy against its register on every step), and the image stays frozen.
    assert_eq!(memory_u64(&image, COUNTER_ADDR), at_fork);

    // A second fork of the same parent materialises its current memory into a new image.
    let second_dir = dir.path().join("second");
    std::fs::create_dir(&second_dir).expect("dir");
    let (state2, image2) = snapshot(&mut parent.ctl, &second_dir, SnapshotMode::Fork);
    let at_second = memory_u64(&image2, COUNTER_ADDR);
    assert!(at_second > at_fork, "{at_second} after {at_fork}");
    let log2 = dir.path().join("child2.log");
    let child2 = restore_logged(&state2, &image2, &log2);
    wait_until("the second child counting", || counts(&log2).len() >= 2);
    let before = counts(&parent.log).len();
    wait_until("the parent still counting", || {
        counts(&parent.log).len() >= before + 2
    });

    terminate(child);
    terminate(child2);
    let parent_log = parent.log.clone();
    stop(parent);
    for log in [&parent_log, &log, &log2] {
        no_mismatch(log);
        assert_consecutive(&counts(log), &log.display().to_string());
    }
}

#[test]
fn a_snapshot_freezes_the_disk_top_and_restores_bring_their_own() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("base.img");
    std::fs::write(&base, vec![0x11u8; 1 << 20]).expect("base image");
    let top = dir.path().join("top.scovl");
    let (counter, log, sock) = with_log_and_control(dir.path(), "parent", "counter");
    let cfg = VmConfig {
        disk: Some(sandcell_proto::vmm::DiskConfig {
            base: base.clone(),
            overlay: Some(top.clone()),
            layers: Vec::new(),
        }),
        ..counter
    };
    let child = spawn(&cfg, &[]);
    let mut ctl = Control::connect(&sock);
    wait_until("the first counts", || counts(&log).len() >= 2);
    let new_top = dir.path().join("top2.scovl");
    let state = dir.path().join("vm.state");
    let mem = dir.path().join("vm.mem");
    let resp = ctl.request(&ControlRequest::Snapshot {
        state_path: state.clone(),
        mem_path: mem.clone(),
        mode: SnapshotMode::Full,
        disk_new_top: Some(new_top.clone()),
    });
    assert_eq!(resp, ok(VmState::Running));
    assert!(new_top.exists(), "the parent continues on a new top layer");
    // The old top is frozen: flag bit 0 of the header's flags word (overlay.rs).
    let header = std::fs::read(&top).expect("frozen layer");
    assert_eq!(header[48] & 1, 1, "the frozen layer is marked immutable");

    // A restore without its own top layer is refused; with one it runs.
    let out = wait(vmm(&["--restore", s(&state), "--mem", s(&mem)]));
    assert_exit(&out, ExitStatus::BadConfig);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("disk-overlay"),
        "{}",
        describe(&out)
    );
    let clog = dir.path().join("child.log");
    let child_top = dir.path().join("child.scovl");
    let c = vmm(&[
        "--restore",
        s(&state),
        "--mem",
        s(&mem),
        "--serial-log",
        s(&clog),
        "--disk-overlay",
        s(&child_top),
    ]);
    wait_until("the child counting", || counts(&clog).len() >= 2);
    terminate(c);
    assert!(child_top.exists());
    // `sandcell-vmm flatten` merges the chain into one frozen layer over the base.
    let flat = dir.path().join("flat.scovl");
    let out = wait(vmm(&[
        "flatten",
        "--base",
        s(&base),
        "--layer",
        s(&top),
        "--out",
        s(&flat),
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(std::fs::read(&flat).expect("flattened")[48] & 1, 1);
    let out = wait(vmm(&["flatten", "--base", s(&base), "--out", s(&flat)]));
    assert_eq!(
        out.status.code(),
        Some(ExitStatus::BadConfig.code()),
        "an existing output is refused"
    );
    // A snapshot may move its frozen layers (into its own directory, say): the restore
    // names where they are now, as many as were saved.
    let moved = dir.path().join("moved.scovl");
    std::fs::rename(&top, &moved).expect("move the frozen layer");
    let restore_moved = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["--restore", s(&state), "--mem", s(&mem), "--disk-overlay"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let vmm_owned = |args: Vec<String>| vmm(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let out = wait(vmm_owned(restore_moved(&[s(&dir.path().join("c3.scovl"))])));
    assert_eq!(
        out.status.code(),
        Some(ExitStatus::BadConfig.code()),
        "without the layer's new path: {}",
        describe(&out)
    );
    let out = wait(vmm_owned(restore_moved(&[
        s(&dir.path().join("c4.scovl")),
        "--disk-layer",
        s(&moved),
        "--disk-layer",
        s(&moved),
    ])));
    assert_eq!(
        out.status.code(),
        Some(ExitStatus::BadConfig.code()),
        "one layer saved, two named: {}",
        describe(&out)
    );
    let mlog = dir.path().join("moved.log");
    let c = vmm_owned(restore_moved(&[
        s(&dir.path().join("c5.scovl")),
        "--disk-layer",
        s(&moved),
        "--serial-log",
        s(&mlog),
    ]));
    wait_until("the restore over the moved layer counting", || {
        counts(&mlog).len() >= 2
    });
    terminate(c);
    // The base may move too (a jailed VMM sees its inputs where its jail shows them): the
    // restore names it with --disk-base, and one of another size is refused.
    let moved_base = dir.path().join("moved-base.img");
    std::fs::hard_link(&base, &moved_base).expect("link the base");
    let other_base = dir.path().join("other-base.img");
    std::fs::write(&other_base, vec![0x11u8; 2 << 20]).expect("a bigger base");
    let with_base = |top: &str, base: &Path| {
        let mut args = restore_moved(&[s(&dir.path().join(top)), "--disk-layer", s(&moved)]);
        args.extend(["--disk-base".to_string(), s(base).to_string()]);
        args
    };
    let out = wait(vmm_owned(with_base("c6.scovl", &other_base)));
    assert_eq!(
        out.status.code(),
        Some(ExitStatus::BadConfig.code()),
        "a base of another size: {}",
        describe(&out)
    );
    std::fs::rename(&base, dir.path().join("gone.img")).expect("move the base away");
    let blog = dir.path().join("base.log");
    let mut args = with_base("c7.scovl", &moved_base);
    args.extend(["--serial-log".to_string(), s(&blog).to_string()]);
    let c = vmm_owned(args);
    wait_until("the restore over the moved base counting", || {
        counts(&blog).len() >= 2
    });
    terminate(c);
    std::fs::rename(dir.path().join("gone.img"), &base).expect("put the base back");
    shutdown_and_expect_stopped(&mut ctl, child);
    assert_eq!(std::fs::read(&base).expect("base"), vec![0x11u8; 1 << 20]);
}
