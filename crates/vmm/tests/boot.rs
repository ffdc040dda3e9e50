//! Boots the tiny payloads on the real `sandcell-vmm` binary and checks how each VM ends:
//! exit status, console output, and the VMM's own explanation on stderr.
//! Needs /dev/kvm (fails without it).

mod common;

use common::{config, describe, payload, require_kvm, run};
use sandcell_proto::vmm::ExitStatus;

fn code(out: &std::process::Output) -> Option<ExitStatus> {
    out.status.code().and_then(ExitStatus::from_code)
}

#[test]
fn hello_prints_to_stdout_and_powers_off() {
    require_kvm();
    let out = run(&config(payload("hello")), &[]);
    assert_eq!(code(&out), Some(ExitStatus::PowerOff), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "SANDCELL-PAYLOAD-HELLO\n",
        "{}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("power port"),
        "{}",
        describe(&out)
    );
}

#[test]
fn serial_log_receives_the_console() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("serial.log");
    let cfg = sandcell_proto::vmm::VmConfig {
        serial_log: Some(log.clone()),
        ..config(payload("hello"))
    };
    let out = run(&cfg, &[]);
    assert_eq!(code(&out), Some(ExitStatus::PowerOff), "{}", describe(&out));
    assert_eq!(
        std::fs::read_to_string(&log).expect("serial log"),
        "SANDCELL-PAYLOAD-HELLO\n"
    );
    assert!(out.stdout.is_empty(), "{}", describe(&out));
}

#[test]
fn smp_vm_boots_on_the_first_vcpu_and_tears_down_the_others() {
    require_kvm();
    let cfg = sandcell_proto::vmm::VmConfig {
        vcpus: 4,
        ..config(payload("hello"))
    };
    let out = run(&cfg, &[]);
    assert_eq!(code(&out), Some(ExitStatus::PowerOff), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "SANDCELL-PAYLOAD-HELLO\n"
    );
}

#[test]
fn port_mmio_and_memory_round_trips() {
    require_kvm();
    let out = run(&config(payload("devices")), &["--debug-devices"]);
    assert_eq!(code(&out), Some(ExitStatus::PowerOff), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "pio ok\nmmio ok\nmemory ok\nunknown ok\ndevices done\n",
        "{}",
        describe(&out)
    );
}

#[test]
fn debug_devices_are_absent_by_default() {
    require_kvm();
    // Without --debug-devices the scratch port reads as all ones: the PIO check fails.
    let out = run(&config(payload("devices")), &[]);
    assert_eq!(code(&out), Some(ExitStatus::PowerOff), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("pio FAIL\nmmio FAIL\n"),
        "{}",
        describe(&out)
    );
}

#[test]
fn i8042_reset_is_a_reboot() {
    require_kvm();
    let out = run(&config(payload("reset")), &[]);
    assert_eq!(code(&out), Some(ExitStatus::Reboot), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "about to reset\n");
}

#[test]
fn reset_after_kernel_panic_is_a_guest_panic_and_the_tail_is_shown() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("serial.log");
    let cfg = sandcell_proto::vmm::VmConfig {
        serial_log: Some(log),
        ..config(payload("panic"))
    };
    let out = run(&cfg, &[]);
    assert_eq!(
        code(&out),
        Some(ExitStatus::GuestPanic),
        "{}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("last console output"), "{}", describe(&out));
    assert!(
        stderr.contains("Kernel panic - not syncing: test payload"),
        "{}",
        describe(&out)
    );
}

#[test]
fn exception_with_the_null_boot_idt_is_a_triple_fault() {
    require_kvm();
    let out = run(&config(payload("triple")), &[]);
    assert_eq!(
        code(&out),
        Some(ExitStatus::TripleFault),
        "{}",
        describe(&out)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "about to fault\n");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("KVM_EXIT_SHUTDOWN"),
        "{}",
        describe(&out)
    );
}

#[test]
fn large_memory_spans_the_mmio_gap() {
    require_kvm();
    // 4 GiB: RAM is split around the gap below 4 GiB (two memory slots); nothing is
    // touched, so this costs no host memory.
    let cfg = sandcell_proto::vmm::VmConfig {
        memory_mib: 4096,
        ..config(payload("hello"))
    };
    let out = run(&cfg, &[]);
    assert_eq!(code(&out), Some(ExitStatus::PowerOff), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "SANDCELL-PAYLOAD-HELLO\n"
    );
}

#[test]
fn zero_page_carries_the_command_line_and_virtio_devices_answer_on_mmio() {
    require_kvm();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("base.img");
    std::fs::write(&base, vec![0u8; 1 << 20]).expect("base image");
    let cfg = sandcell_proto::vmm::VmConfig {
        cmdline: "quiet panic=7 -- init-arg".into(),
        disk: Some(sandcell_proto::vmm::DiskConfig {
            base,
            overlay: Some(dir.path().join("overlay")),
            layers: Vec::new(),
        }),
        rng: true,
        vsock: Some(sandcell_proto::vmm::VsockConfig {
            guest_cid: 3,
            uds_path: dir.path().join("v.sock"),
        }),
        ..config(payload("virtio"))
    };
    let out = run(&cfg, &[]);
    assert_eq!(code(&out), Some(ExitStatus::PowerOff), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let cmdline = lines.next().expect("command line");
    assert!(
        cmdline.starts_with("quiet panic=7 console=ttyS0 reboot=k "),
        "{cmdline}"
    );
    assert!(!cmdline.contains("panic=-1"), "{cmdline}");
    assert!(
        cmdline.contains(
            "virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6 \
             virtio_mmio.device=4K@0xd0002000:7"
        ),
        "{cmdline}"
    );
    assert!(cmdline.ends_with(" -- init-arg"), "{cmdline}");
    // virtio device IDs: block 2, entropy 4, vsock 19 (printed as one character: '0' + 19).
    let slots: Vec<&str> = lines.collect();
    assert_eq!(
        slots,
        ["slot0 id=2", "slot1 id=4", "slot2 id=C", "slot3 empty"],
        "{}",
        describe(&out)
    );
}
