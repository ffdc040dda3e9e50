//! The control socket and signals against a running payload: status, pause (console output
//! stops), resume (it continues), shutdown and SIGTERM (exit Stopped).
//! Needs /dev/kvm (fails without it).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    Control, config, describe, ok, payload, require_kvm, shutdown_and_expect_stopped,
    sigterm_and_expect_stopped, spawn, wait_until, with_log_and_control,
};
use sandcell_proto::vmm::{ControlRequest, VmConfig, VmState};

fn ticks(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.matches('\n').count())
        .unwrap_or(0)
}

#[test]
fn pause_stops_the_guest_and_resume_continues_it() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cfg, log, sock) = with_log_and_control(dir.path(), "ticker", "ticker");
    let child = spawn(&cfg, &[]);
    let mut ctl = Control::connect(&sock);
    assert_eq!(ctl.request(&ControlRequest::Status), ok(VmState::Running));
    wait_until("the first ticks", || ticks(&log) >= 2);

    assert_eq!(ctl.request(&ControlRequest::Pause), ok(VmState::Paused));
    let paused_at = std::fs::read(&log).expect("log");
    // Long enough for several lines to appear if the guest were still running (it prints
    // one every few ms); this is an observation window, not a timing assertion.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        std::fs::read(&log).expect("log"),
        paused_at,
        "console output changed while paused"
    );
    assert_eq!(ctl.request(&ControlRequest::Status), ok(VmState::Paused));
    assert_eq!(
        ctl.request(&ControlRequest::Pause),
        ok(VmState::Paused),
        "pause is idempotent"
    );

    assert_eq!(ctl.request(&ControlRequest::Resume), ok(VmState::Running));
    let before = ticks(&log);
    wait_until("ticks after resume", || ticks(&log) >= before + 2);

    shutdown_and_expect_stopped(&mut ctl, child);
    assert!(!sock.exists(), "the control socket is removed on exit");
}

#[test]
fn shutdown_while_paused_stops_the_vm() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cfg, _log, sock) = with_log_and_control(dir.path(), "ticker", "ticker");
    let child = spawn(&cfg, &[]);
    let mut ctl = Control::connect(&sock);
    assert_eq!(ctl.request(&ControlRequest::Pause), ok(VmState::Paused));
    shutdown_and_expect_stopped(&mut ctl, child);
}

#[test]
fn bad_requests_get_errors_in_order() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cfg, _log, sock) = with_log_and_control(dir.path(), "ticker", "ticker");
    let child = spawn(&cfg, &[]);
    let mut ctl = Control::connect(&sock);
    let resp = ctl.send_raw("not json\n");
    assert!(resp.contains("\"result\":\"error\""), "{resp}");
    let resp = ctl.send_raw("{\"op\":\"fly\"}\n");
    assert!(resp.contains("\"result\":\"error\""), "{resp}");
    // An overlong line is refused without reading it whole; the next request still works.
    let long = format!("{}\n{{\"op\":\"status\"}}\n", "x".repeat(100 * 1024));
    let resp = ctl.send_raw(&long);
    assert!(resp.contains("longer than"), "{resp}");
    let next = ctl.read_line();
    assert!(next.contains("running"), "{next}");
    shutdown_and_expect_stopped(&mut ctl, child);
}

#[test]
fn sigterm_stops_the_vm() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("serial.log");
    let cfg = VmConfig {
        serial_log: Some(log.clone()),
        ..config(payload("ticker"))
    };
    let child = spawn(&cfg, &[]);
    wait_until("the first tick", || ticks(&log) >= 1);
    let out = sigterm_and_expect_stopped(child);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("SIGTERM"),
        "{}",
        describe(&out)
    );
}

#[test]
fn pause_and_resume_with_virtio_devices_and_halted_vcpus() {
    require_kvm();
    // Two vCPUs: the boot vCPU halts after its marker, the other waits for a SIPI that
    // never comes; both sit inside KVM_RUN and must still answer the kicks. The virtio
    // devices' subscribers leave and rejoin the event loop on each pause/resume.
    let dir = tempfile::tempdir().expect("tempdir");
    let (idle, log, sock) = with_log_and_control(dir.path(), "idle", "idle");
    let base = dir.path().join("base.img");
    std::fs::write(&base, vec![0u8; 1 << 20]).expect("base image");
    let cfg = VmConfig {
        vcpus: 2,
        disk: Some(sandcell_proto::vmm::DiskConfig {
            base,
            overlay: None,
            layers: Vec::new(),
        }),
        rng: true,
        vsock: Some(sandcell_proto::vmm::VsockConfig {
            guest_cid: 3,
            uds_path: dir.path().join("v.sock"),
        }),
        ..idle
    };
    let child = spawn(&cfg, &[]);
    let mut ctl = Control::connect(&sock);
    wait_until("the idle marker", || ticks(&log) >= 1);
    for _ in 0..3 {
        assert_eq!(ctl.request(&ControlRequest::Pause), ok(VmState::Paused));
        assert_eq!(ctl.request(&ControlRequest::Resume), ok(VmState::Running));
    }
    assert_eq!(ctl.request(&ControlRequest::Status), ok(VmState::Running));
    shutdown_and_expect_stopped(&mut ctl, child);
    assert_eq!(std::fs::read_to_string(&log).expect("log"), "idle\n");
}
