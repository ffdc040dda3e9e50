//! Snapshot benchmarks of `sandcell-vmm` on the `counter` payload (see bench/vmm/run.sh),
//! printed as JSON, p50/p90/p99 over N runs, beside the Firecracker figures measured on
//! the same machines (`firecracker_same_host` below):
//! - `pause_ms`: a `pause` request on a running VM, request to answer;
//! - `snapshot_full_ms` (128 and 512 MiB guests) to tmpfs: request to answer. Memory is
//!   written sparse: only the pages the guest touched (here a few MiB);
//! - `snapshot_fork_ms` (128 and 512 MiB): a `fork` snapshot, memory frozen in place;
//! - `restore_spawn_to_answer_ms`: spawning `sandcell-vmm --restore` to the restored
//!   guest's first console byte;
//! - `pool_restore_to_answer_ms`: a `restore` request to a pre-started `--wait-restore`
//!   process, to the restored guest's first console byte;
//! - `clones`: RSS/PSS of 50 concurrent restores of one snapshot (smaps_rollup), and
//!   whether all ran.
//!
//! Snapshots are of the `counter` payload (it has filled 2 MiB of memory), restores of
//! the `chatter` payload (it prints within a fraction of a millisecond of running, so the
//! figure is the restore's, not the guest's loop).
//!
//!   bench_snapshot --vmm PATH --counter ELF --chatter ELF [--runs N] [--clones N] [--dir DIR]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Args {
    vmm: String,
    counter: String,
    chatter: String,
    runs: usize,
    clones: usize,
    dir: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        vmm: String::new(),
        counter: String::new(),
        chatter: String::new(),
        runs: 20,
        clones: 50,
        dir: PathBuf::from("/dev/shm"),
    };
    common::parse_pairs(|k, v| {
        match k {
            "--vmm" => a.vmm = v,
            "--counter" => a.counter = v,
            "--chatter" => a.chatter = v,
            "--runs" => a.runs = v.parse().map_err(|e| format!("--runs: {e}"))?,
            "--clones" => a.clones = v.parse().map_err(|e| format!("--clones: {e}"))?,
            "--dir" => a.dir = PathBuf::from(v),
            _ => return Err(format!("unknown argument {k}")),
        }
        Ok(())
    })?;
    if a.vmm.is_empty() || a.counter.is_empty() || a.chatter.is_empty() || a.runs == 0 {
        return Err(
            "usage: bench_snapshot --vmm PATH --counter ELF --chatter ELF [--runs N] \
                    [--clones N] [--dir DIR]"
                .into(),
        );
    }
    Ok(a)
}

/// The percentiles of `samples` (not the samples: there are many series).
fn summary(samples: Vec<f64>) -> serde_json::Value {
    common::summary(samples).0
}

fn p50(v: &serde_json::Value) -> f64 {
    v["p50"].as_f64().unwrap_or(f64::NAN)
}

struct Ctl {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Ctl {
    fn connect(path: &Path) -> Result<Ctl, String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match UnixStream::connect(path) {
                Ok(s) => {
                    let r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
                    return Ok(Ctl { r, w: s });
                }
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(format!("connecting {}: {e}", path.display())),
            }
        }
    }

    /// Sends one request; returns the answer and the round-trip time in ms.
    fn call(&mut self, req: serde_json::Value) -> Result<(String, f64), String> {
        let start = Instant::now();
        writeln!(self.w, "{req}").map_err(|e| e.to_string())?;
        let mut line = String::new();
        self.r.read_line(&mut line).map_err(|e| e.to_string())?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        if !line.contains("\"ok\"") {
            return Err(format!("{req} answered {line}"));
        }
        Ok((line, ms))
    }
}

struct Vm {
    child: Child,
    ctl: Ctl,
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A VM of `mib` MiB running `kernel`, console on stdout (so its restores print to
/// theirs), once it printed `lines` lines (or bytes, for a payload without newlines).
fn boot(a: &Args, kernel: &str, mib: u32, sock: &Path, lines: usize) -> Result<Vm, String> {
    let cfg = format!(
        r#"{{"vcpus":1,"memory_mib":{mib},"kernel":"{kernel}","control_socket":"{}"}}"#,
        sock.display()
    );
    let mut child = Command::new(&a.vmm)
        .args(["--config-json", &cfg])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", a.vmm))?;
    let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut line = Vec::new();
    for _ in 0..lines {
        line.clear();
        out.read_until(if lines > 1 { b'\n' } else { b'.' }, &mut line)
            .map_err(|e| e.to_string())?;
    }
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Ok(Vm {
        child,
        ctl: Ctl::connect(sock)?,
    })
}

fn snapshot_req(dir: &Path, tag: &str, mode: &str) -> serde_json::Value {
    serde_json::json!({
        "op": "snapshot",
        "state_path": dir.join(format!("{tag}.state")),
        "mem_path": dir.join(format!("{tag}.mem")),
        "mode": mode,
    })
}

/// Time from `start` to the first byte on the child's stdout.
fn first_byte_ms(child: &mut Child, start: Instant) -> Result<f64, String> {
    let mut out = child.stdout.take().ok_or("no stdout")?;
    let mut b = [0u8; 1];
    out.read_exact(&mut b)
        .map_err(|e| format!("waiting for the restored guest's output: {e}"))?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Ok(ms)
}

fn restore_cmd(a: &Args, state: &Path, mem: &Path) -> Command {
    let mut c = Command::new(&a.vmm);
    c.arg("--restore")
        .arg(state)
        .arg("--mem")
        .arg(mem)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    c
}

fn run(a: &Args) -> Result<serde_json::Value, String> {
    let work = a.dir.join(format!("sandcell-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let result = measure(a, &work);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn measure(a: &Args, work: &Path) -> Result<serde_json::Value, String> {
    let mut out = serde_json::Map::new();
    let mut pause = Vec::new();
    for mib in [128u32, 512] {
        let mut full = Vec::new();
        let mut fork = Vec::new();
        for i in 0..a.runs {
            // "ready", then a first count: the pattern is filled and it is counting.
            let mut vm = boot(a, &a.counter, mib, &work.join("b.sock"), 2)?;
            let (_, ms) = vm.ctl.call(serde_json::json!({"op": "pause"}))?;
            if mib == 128 {
                pause.push(ms);
            }
            vm.ctl.call(serde_json::json!({"op": "resume"}))?;
            let (_, ms) = vm
                .ctl
                .call(snapshot_req(work, &format!("full{i}"), "full"))?;
            full.push(ms);
            let (_, ms) = vm
                .ctl
                .call(snapshot_req(work, &format!("fork{i}"), "fork"))?;
            fork.push(ms);
            drop(vm);
            for tag in [format!("full{i}"), format!("fork{i}")] {
                let _ = std::fs::remove_file(work.join(format!("{tag}.state")));
                let _ = std::fs::remove_file(work.join(format!("{tag}.mem")));
            }
        }
        out.insert(format!("snapshot_full_{mib}mib_ms"), summary(full));
        out.insert(format!("snapshot_fork_{mib}mib_ms"), summary(fork));
    }
    out.insert("pause_ms".into(), summary(pause));

    // 128 MiB snapshots: `chatter` for the restore times, `counter` for the clones.
    let mut vm = boot(a, &a.chatter, 128, &work.join("b.sock"), 1)?;
    vm.ctl.call(snapshot_req(work, "t", "full"))?;
    drop(vm);
    let (state, mem) = (work.join("t.state"), work.join("t.mem"));
    let mut vm = boot(a, &a.counter, 128, &work.join("b.sock"), 2)?;
    vm.ctl.call(snapshot_req(work, "c", "full"))?;
    drop(vm);
    let (cstate, cmem) = (work.join("c.state"), work.join("c.mem"));
    let mut spawn_ms = Vec::new();
    let mut pool_ms = Vec::new();
    for i in 0..a.runs {
        let start = Instant::now();
        let mut child = restore_cmd(a, &state, &mem)
            .spawn()
            .map_err(|e| e.to_string())?;
        spawn_ms.push(first_byte_ms(&mut child, start)?);
        let _ = child.kill();
        let _ = child.wait();

        let sock = work.join(format!("pool{i}.sock"));
        let mut child = Command::new(&a.vmm)
            .arg("--wait-restore")
            .arg("--control-socket")
            .arg(&sock)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut ctl = Ctl::connect(&sock)?;
        ctl.call(serde_json::json!({"op": "status"}))?;
        let start = Instant::now();
        writeln!(
            ctl.w,
            "{}",
            serde_json::json!({"op": "restore", "state_path": state, "mem_path": mem})
        )
        .map_err(|e| e.to_string())?;
        pool_ms.push(first_byte_ms(&mut child, start)?);
        let _ = child.kill();
        let _ = child.wait();
    }
    out.insert("restore_spawn_to_answer_ms".into(), summary(spawn_ms));
    out.insert("pool_restore_to_answer_ms".into(), summary(pool_ms));

    // Clones: all restored at once, measured once every one has printed.
    let mut clones = Vec::new();
    for _ in 0..a.clones {
        let mut c = restore_cmd(a, &cstate, &cmem)
            .spawn()
            .map_err(|e| e.to_string())?;
        first_byte_ms(&mut c, Instant::now())?;
        clones.push(c);
    }
    std::thread::sleep(Duration::from_millis(300));
    let (mut rss, mut pss, mut running) = (0.0, 0.0, 0);
    for c in &mut clones {
        if c.try_wait().map_err(|e| e.to_string())?.is_none() {
            running += 1;
        }
        let (r, p) = common::rollup_mib(c.id())?;
        rss += r;
        pss += p;
    }
    for c in &mut clones {
        let _ = c.kill();
        let _ = c.wait();
    }
    out.insert(
        "clones".into(),
        serde_json::json!({
            "count": a.clones, "all_ran": running == a.clones,
            "total_rss_mib": rss, "total_pss_mib": pss,
            "pss_per_clone_mib": pss / a.clones as f64,
        }),
    );

    let fc = serde_json::json!({
        "pause_ms_p50": 1.2,
        "snapshot_full_128mib_ms_p50": 185.0,
        "snapshot_full_512mib_ms_p50": 716.0,
        "snapshot_load_ms_p50": 11.0,
        "restore_spawn_to_answer_ms_p50": 15.7,
        "clones_50": "all ran",
    });
    let ratio =
        |ours: &str, theirs: &str| p50(&out[ours]) / fc[theirs].as_f64().unwrap_or(f64::NAN);
    let ratios = serde_json::json!({
        "pause": ratio("pause_ms", "pause_ms_p50"),
        "snapshot_full_128mib": ratio("snapshot_full_128mib_ms", "snapshot_full_128mib_ms_p50"),
        "snapshot_full_512mib": ratio("snapshot_full_512mib_ms", "snapshot_full_512mib_ms_p50"),
        "snapshot_fork_128mib_vs_full": ratio("snapshot_fork_128mib_ms", "snapshot_full_128mib_ms_p50"),
        "restore_spawn_to_answer": ratio("restore_spawn_to_answer_ms", "restore_spawn_to_answer_ms_p50"),
        "pool_restore_to_answer_vs_snapshot_load": ratio("pool_restore_to_answer_ms", "snapshot_load_ms_p50"),
    });
    out.insert("runs".into(), a.runs.into());
    out.insert(
        "note".into(),
        "ours / Firecracker p50. Our full snapshot writes only the pages the guest touched \
         (sparse); Firecracker's figure writes memory whole."
            .into(),
    );
    out.insert("firecracker_same_host".into(), fc);
    out.insert("ratio_ours_over_firecracker".into(), ratios);
    Ok(serde_json::Value::Object(out))
}

fn main() {
    let a = common::args_or_exit("bench_snapshot", parse_args());
    common::print_or_exit("bench_snapshot", run(&a));
}
