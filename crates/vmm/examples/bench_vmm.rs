//! Benchmarks of `sandcell-vmm` on tiny payloads (see bench/vmm/run.sh), printed as JSON:
//! - `start_to_first_output_ms`: from spawning the process to the first console byte on
//!   its stdout (1 vCPU, 128 MiB, the `hello` payload), with the seccomp filters (the
//!   default); `start_to_first_output_no_seccomp_ms`: the same with `--no-seccomp`, the runs
//!   interleaved so both see the same host; `start_to_first_output_jailed_ms`: the same
//!   with `--jail` (own mount namespace, tmpfs root with the payload bound, /dev/kvm node,
//!   unprivileged uid; needs root), interleaved too;
//! - `idle_rss_mib` / `idle_pss_mib`: /proc/<pid>/smaps_rollup of a 128 MiB VM whose guest
//!   printed a line and halted (the `idle` payload), measured after it settles.
//!
//!   bench_vmm --vmm PATH --hello ELF --idle ELF [--runs N]

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Args {
    vmm: String,
    hello: String,
    idle: String,
    runs: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        vmm: String::new(),
        hello: String::new(),
        idle: String::new(),
        runs: 20,
    };
    common::parse_pairs(|k, v| {
        match k {
            "--vmm" => a.vmm = v,
            "--hello" => a.hello = v,
            "--idle" => a.idle = v,
            "--runs" => a.runs = v.parse().map_err(|e| format!("--runs: {e}"))?,
            _ => return Err(format!("unknown argument {k}")),
        }
        Ok(())
    })?;
    if a.vmm.is_empty() || a.hello.is_empty() || a.idle.is_empty() || a.runs == 0 {
        return Err("usage: bench_vmm --vmm PATH --hello ELF --idle ELF [--runs N]".into());
    }
    Ok(a)
}

fn config(kernel: &str) -> String {
    format!(r#"{{"vcpus":1,"memory_mib":128,"kernel":"{kernel}"}}"#)
}

/// The percentiles of `samples`, with the samples themselves.
fn summary(samples: Vec<f64>) -> serde_json::Value {
    let (mut stats, sorted) = common::summary(samples);
    stats["samples"] = sorted.into();
    stats
}

fn first_output_ms(a: &Args, extra: &[&str]) -> Result<f64, String> {
    let start = Instant::now();
    let mut child = Command::new(&a.vmm)
        .args(["--config-json", &config(&a.hello)])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", a.vmm))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut byte = [0u8; 1];
    stdout
        .read_exact(&mut byte)
        .map_err(|e| format!("reading the first console byte: {e}"))?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    let mut rest = Vec::new();
    let _ = stdout.read_to_end(&mut rest);
    let status = child.wait().map_err(|e| e.to_string())?;
    if status.code() != Some(0) {
        return Err(format!("the hello payload VM exited with {status}"));
    }
    Ok(ms)
}

/// (Rss, Pss) in MiB of an idle VM.
fn idle_memory_mib(a: &Args) -> Result<(f64, f64), String> {
    let mut child = Command::new(&a.vmm)
        .args(["--config-json", &config(&a.idle)])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", a.vmm))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = [0u8; 5];
    stdout
        .read_exact(&mut line)
        .map_err(|e| format!("waiting for the idle marker: {e}"))?;
    // Let the VMM reach its idle state (threads parked in epoll_wait / KVM_RUN).
    std::thread::sleep(Duration::from_millis(200));
    let result = common::rollup_mib(child.id());
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    result
}

/// A `--jail` for the hello payload: an empty root dir, the payload bound read-only.
fn jail_json(a: &Args, root: &std::path::Path) -> Result<String, String> {
    let kernel = std::fs::canonicalize(&a.hello).map_err(|e| format!("{}: {e}", a.hello))?;
    let spec = sandcell_proto::vmm::JailSpec {
        uid: 1_899_999_000,
        gid: 1_899_999_000,
        root: root.to_path_buf(),
        binds: vec![sandcell_proto::vmm::JailBind {
            path: kernel,
            writable: false,
        }],
        devices: vec!["/dev/kvm".into()],
        max_open_files: 256,
        max_file_bytes: 256 << 20,
        max_threads: 16,
    };
    serde_json::to_string(&spec).map_err(|e| e.to_string())
}

fn main() {
    let a = common::args_or_exit("bench_vmm", parse_args());
    let run = || -> Result<serde_json::Value, String> {
        let jail_dir = tempfile::tempdir().map_err(|e| format!("a jail root: {e}"))?;
        let jail_root = std::fs::canonicalize(jail_dir.path()).map_err(|e| e.to_string())?;
        let jail = jail_json(&a, &jail_root)?;
        let mut first = Vec::new();
        let mut first_jailed = Vec::new();
        let mut first_unfiltered = Vec::new();
        let mut rss = Vec::new();
        let mut pss = Vec::new();
        for _ in 0..a.runs {
            first.push(first_output_ms(&a, &[])?);
            first_unfiltered.push(first_output_ms(&a, &["--no-seccomp"])?);
            first_jailed.push(first_output_ms(&a, &["--jail", &jail])?);
            let (r, p) = idle_memory_mib(&a)?;
            rss.push(r);
            pss.push(p);
        }
        Ok(serde_json::json!({
            "runs": a.runs,
            "vm": { "vcpus": 1, "memory_mib": 128 },
            "start_to_first_output_ms": summary(first),
            "start_to_first_output_no_seccomp_ms": summary(first_unfiltered),
            "start_to_first_output_jailed_ms": summary(first_jailed),
            "idle_rss_mib": summary(rss),
            "idle_pss_mib": summary(pss),
            "firecracker_same_host": {
                "start_to_first_output_ms_p50": 8.8,
                "idle_rss_mib": 4.3,
                "idle_pss_mib": 3.0
            }
        }))
    };
    common::print_or_exit("bench_vmm", run());
}
