//! Configurations refused before anything starts: exit status BadConfig (2) with a message
//! that names the problem. These need no KVM.

mod common;

use std::process::Command;

use common::{config, describe, payload, run};
use sandcell_proto::vmm::{ExitStatus, VmConfig};

fn assert_bad_config(out: &std::process::Output, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(ExitStatus::BadConfig.code()),
        "{}",
        describe(out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(needle),
        "stderr should mention {needle:?}: {}",
        describe(out)
    );
}

#[test]
fn too_many_vcpus() {
    let out = run(
        &VmConfig {
            vcpus: 33,
            ..config(payload("hello"))
        },
        &[],
    );
    assert_bad_config(&out, "vcpus = 33");
}

#[test]
fn zero_memory() {
    let out = run(
        &VmConfig {
            memory_mib: 0,
            ..config(payload("hello"))
        },
        &[],
    );
    assert_bad_config(&out, "memory_mib = 0");
}

#[test]
fn missing_kernel() {
    let out = run(&config("/nonexistent/vmlinux".into()), &[]);
    assert_bad_config(&out, "/nonexistent/vmlinux");
}

#[test]
fn malformed_json_and_unknown_fields() {
    let out = Command::new(common::vmm_bin())
        .args(["--config-json", "{"])
        .output()
        .expect("run");
    assert_bad_config(&out, "parsing the VM configuration");
    let out = Command::new(common::vmm_bin())
        .args([
            "--config-json",
            r#"{"vcpus":1,"memory_mib":8,"kernel":"/x","bogus":1}"#,
        ])
        .output()
        .expect("run");
    assert_bad_config(&out, "bogus");
}

#[test]
fn missing_config_file_and_usage() {
    let out = Command::new(common::vmm_bin())
        .args(["--config", "/nonexistent.json"])
        .output()
        .expect("run");
    assert_bad_config(&out, "/nonexistent.json");
    let out = Command::new(common::vmm_bin()).output().expect("run");
    assert_bad_config(&out, "usage");
}
