//! Shared helpers for the integration tests: the real `sandcell-vmm` binary, the tiny
//! payloads assembled from tests/payloads/*.S, and a bounded wait for the VMM to exit.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sandcell_proto::vmm::{ControlRequest, ControlResponse, ExitStatus, VmConfig, VmState};

/// Longest any payload VM may take before the test gives up on it (a hang guard, not a
/// timing assertion).
pub const HANG_GUARD: Duration = Duration::from_secs(60);

pub fn vmm_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sandcell-vmm")
}

/// These tests run guests: without a usable /dev/kvm they fail, loudly, by design.
pub fn require_kvm() {
    let kvm = Path::new("/dev/kvm");
    assert!(
        kvm.exists(),
        "/dev/kvm does not exist: the sandcell-vmm KVM tests need a host with KVM (CI has it)"
    );
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(kvm) {
        panic!("/dev/kvm cannot be opened read-write ({e}): the KVM tests need access to it");
    }
}

/// Assembles tests/payloads/<name>.S into a tiny ELF64 (cached per test run).
pub fn payload(name: &str) -> PathBuf {
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/payloads");
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vmm-payloads");
    std::fs::create_dir_all(&out_dir).expect("creating the payload output directory");
    let elf = out_dir.join(format!("{name}.elf"));
    // Per process and thread: tests run in parallel and may build the same payload.
    let tag = format!("{}-{:?}", std::process::id(), std::thread::current().id())
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    let obj = out_dir.join(format!("{name}.{tag}.o"));
    let tmp = out_dir.join(format!("{name}.{tag}.elf"));
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running {what} (binutils) failed: {e}"));
        assert!(
            out.status.success(),
            "{what} failed for payload {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        Command::new("as")
            .arg("-I")
            .arg(&src_dir)
            .arg("-o")
            .arg(&obj)
            .arg(src_dir.join(format!("{name}.S"))),
        "as",
    );
    run(
        Command::new("ld")
            .args(["-n", "--build-id=none", "-z", "noexecstack", "-T"])
            .arg(src_dir.join("payload.ld"))
            .arg("-o")
            .arg(&tmp)
            .arg(&obj),
        "ld",
    );
    std::fs::rename(&tmp, &elf).expect("moving the payload in place");
    let _ = std::fs::remove_file(&obj);
    elf
}

pub fn config(kernel: PathBuf) -> VmConfig {
    VmConfig {
        vcpus: 1,
        memory_mib: 128,
        kernel,
        cmdline: String::new(),
        disk: None,
        vsock: None,
        rng: false,
        net: None,
        fs: Vec::new(),
        serial_log: None,
        control_socket: None,
    }
}

/// A config for payload `payload_name` with its console logged to `<dir>/<name>.log` and
/// a control socket at `<dir>/<name>.sock`; returns the config, the log and the socket.
pub fn with_log_and_control(
    dir: &Path,
    name: &str,
    payload_name: &str,
) -> (VmConfig, PathBuf, PathBuf) {
    let log = dir.join(format!("{name}.log"));
    let sock = dir.join(format!("{name}.sock"));
    let cfg = VmConfig {
        serial_log: Some(log.clone()),
        control_socket: Some(sock.clone()),
        ..config(payload(payload_name))
    };
    (cfg, log, sock)
}

pub fn spawn(cfg: &VmConfig, extra_args: &[&str]) -> Child {
    let json = serde_json::to_string(cfg).expect("config to JSON");
    Command::new(vmm_bin())
        .arg("--config-json")
        .arg(json)
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning sandcell-vmm")
}

/// Waits for the child, killing it (and failing the test) if it outlives HANG_GUARD.
pub fn wait(mut child: Child) -> Output {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        match child.try_wait().expect("waiting for sandcell-vmm") {
            Some(_) => return child.wait_with_output().expect("collecting output"),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("collecting output");
                panic!(
                    "sandcell-vmm did not exit within {HANG_GUARD:?}; stdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Runs a VM to its end.
pub fn run(cfg: &VmConfig, extra_args: &[&str]) -> Output {
    wait(spawn(cfg, extra_args))
}

pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts that the VMM exited with `status` (the message shows its output).
pub fn assert_exit(out: &Output, status: ExitStatus) {
    assert_eq!(out.status.code(), Some(status.code()), "{}", describe(out));
}

/// The control-socket answer `Ok` in `state`.
pub fn ok(state: VmState) -> ControlResponse {
    ControlResponse::Ok { state }
}

/// Asks the VMM to shut down (answered `Stopping`), waits for it and asserts it exited
/// `Stopped`.
pub fn shutdown_and_expect_stopped(ctl: &mut Control, child: Child) -> Output {
    assert_eq!(
        ctl.request(&ControlRequest::Shutdown),
        ok(VmState::Stopping)
    );
    let out = wait(child);
    assert_exit(&out, ExitStatus::Stopped);
    out
}

/// Sends SIGTERM to the VMM, waits for it and asserts it exited `Stopped`.
pub fn sigterm_and_expect_stopped(child: Child) -> Output {
    // SAFETY: sending a signal to our own child process, identified by its pid.
    let rc = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let out = wait(child);
    assert_exit(&out, ExitStatus::Stopped);
    out
}

/// Polls until `cond` holds (bounded by HANG_GUARD).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A control-socket client.
pub struct Control {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Control {
    pub fn connect(path: &Path) -> Control {
        let mut stream = None;
        wait_until("the control socket", || {
            stream = UnixStream::connect(path).ok();
            stream.is_some()
        });
        let stream = stream.expect("connected");
        stream
            .set_read_timeout(Some(HANG_GUARD))
            .expect("read timeout");
        Control {
            reader: BufReader::new(stream.try_clone().expect("clone")),
            writer: stream,
        }
    }

    /// Writes `line` (which should end in a newline) and reads one response line.
    pub fn send_raw(&mut self, line: &str) -> String {
        self.writer
            .write_all(line.as_bytes())
            .expect("writing a request");
        self.read_line()
    }

    /// Writes `line` without waiting for an answer (for requests that end the process).
    pub fn send_only(&mut self, line: &str) {
        self.writer
            .write_all(line.as_bytes())
            .expect("writing a request");
    }

    pub fn read_line(&mut self) -> String {
        let mut resp = String::new();
        self.reader
            .read_line(&mut resp)
            .expect("reading a response");
        resp
    }

    pub fn request(&mut self, req: &ControlRequest) -> ControlResponse {
        let line = format!("{}\n", serde_json::to_string(req).expect("request JSON"));
        let resp = self.send_raw(&line);
        serde_json::from_str(&resp).unwrap_or_else(|e| panic!("bad response {resp:?}: {e}"))
    }
}
