//! nested-probe: the one piece of the nested-KVM harness that busybox cannot do. It starts
//! `sandcell-vmm`, waits until the guest agent answers `GET /health` through the VMM's
//! hybrid-vsock socket (`CONNECT <port>\n` -> `OK <n>\n`, then HTTP/1.1), says how long that
//! took, then ends the VM the way it is asked to and reports the VMM's exit status.
//!
//!   nested-probe boot --vmm BIN --config CFG.json --uds VSOCK_SOCKET
//!                     [--control CONTROL_SOCKET] [--then poweroff|shutdown|wait]
//!                     [--ready-timeout SECS] [--exit-timeout SECS]
//!
//! stdout, one `key=value` a line: `ready_ms=N` (VMM spawn to the first 2xx from /health),
//! `poweroff_status=N` when asked, `vmm_exit=N` (or `vmm_exit=signal:N`). Exit status 0 when
//! every step happened, 1 otherwise (the reason on stderr).
//!
//! Other operations (exec, post, control, wait-agent): see ops.rs.
//!
//! Built with plain `rustc` (std only, static) by tests/nested/build-initramfs.sh, so it
//! needs no crate of the workspace and no cargo.

mod ops;
mod tap;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const AGENT_PORT: u32 = 49983;
/// The longest line we accept from the VMM or the agent: they are hostile like any peer.
const MAX_LINE: u64 = 4096;

struct Args {
    vmm: String,
    config: String,
    uds: String,
    control: Option<String>,
    then: String,
    ready_timeout: Duration,
    exit_timeout: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    if it.next().as_deref() != Some("boot") {
        return Err("usage: nested-probe boot --vmm BIN --config CFG --uds SOCK [...]".into());
    }
    let mut a = Args {
        vmm: String::new(),
        config: String::new(),
        uds: String::new(),
        control: None,
        then: "poweroff".into(),
        ready_timeout: Duration::from_secs(120),
        exit_timeout: Duration::from_secs(60),
    };
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let secs = || -> Result<Duration, String> {
            value
                .parse::<u64>()
                .map(Duration::from_secs)
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--vmm" => a.vmm = value,
            "--config" => a.config = value,
            "--uds" => a.uds = value,
            "--control" => a.control = Some(value),
            "--then" => a.then = value,
            "--ready-timeout" => a.ready_timeout = secs()?,
            "--exit-timeout" => a.exit_timeout = secs()?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.vmm.is_empty() || a.config.is_empty() || a.uds.is_empty() {
        return Err("--vmm, --config and --uds are required".into());
    }
    if !["poweroff", "shutdown", "wait"].contains(&a.then.as_str()) {
        return Err(format!(
            "--then {}: expected poweroff, shutdown or wait",
            a.then
        ));
    }
    if a.then == "shutdown" && a.control.is_none() {
        return Err("--then shutdown needs --control".into());
    }
    Ok(a)
}

fn read_line_bounded(r: &mut impl BufRead) -> Result<String, String> {
    let mut line = String::new();
    r.take(MAX_LINE)
        .read_line(&mut line)
        .map_err(|e| format!("read: {e}"))?;
    if line.is_empty() {
        return Err("connection closed".into());
    }
    Ok(line.trim_end().to_string())
}

/// One HTTP/1.1 request to the agent through the hybrid-vsock socket; returns the status.
fn agent_request(uds: &str, method: &str, path: &str) -> Result<u16, String> {
    let mut stream = UnixStream::connect(uds).map_err(|e| format!("connect {uds}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("CONNECT {AGENT_PORT}\n").as_bytes())
        .map_err(|e| format!("write CONNECT: {e}"))?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let ok = read_line_bounded(&mut reader)?;
    if !ok.starts_with("OK ") {
        return Err(format!("CONNECT {AGENT_PORT} answered {ok:?}"));
    }
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("write request: {e}"))?;
    let status = read_line_bounded(&mut reader)?;
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status:?}"))?;
    Ok(code)
}

fn exit_text(status: std::process::ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => code.to_string(),
        (None, Some(sig)) => format!("signal:{sig}"),
        _ => "unknown".into(),
    }
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("wait: {e}"))? {
            return Ok(exit_text(status));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the VMM did not exit within {}s; killed",
                timeout.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn shutdown(control: &str) -> Result<String, String> {
    let mut stream = UnixStream::connect(control).map_err(|e| format!("connect {control}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"{\"op\":\"shutdown\"}\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut reader = BufReader::new(stream);
    // The VMM may exit before answering; an answer is not required.
    Ok(read_line_bounded(&mut reader).unwrap_or_default())
}

fn run(a: &Args) -> Result<(), String> {
    let start = Instant::now();
    let mut child = Command::new(&a.vmm)
        .arg("--config")
        .arg(&a.config)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", a.vmm))?;
    let mut last_error = String::from("never tried");
    let ready = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("wait: {e}"))? {
            println!("vmm_exit={}", exit_text(status));
            return Err(format!(
                "the VMM exited before the agent answered (last: {last_error})"
            ));
        }
        if start.elapsed() > a.ready_timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "no answer from the agent within {}s (last: {last_error})",
                a.ready_timeout.as_secs()
            ));
        }
        match agent_request(&a.uds, "GET", "/health") {
            Ok(code) if (200..300).contains(&code) => break start.elapsed(),
            Ok(code) => last_error = format!("/health answered {code}"),
            Err(e) => last_error = e,
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    println!("ready_ms={}", ready.as_millis());
    match a.then.as_str() {
        "poweroff" => match agent_request(&a.uds, "POST", "/sandcell/poweroff") {
            Ok(code) => println!("poweroff_status={code}"),
            // The guest may go down before the answer is out; the exit status tells.
            Err(e) => eprintln!("nested-probe: POST /sandcell/poweroff: {e}"),
        },
        "shutdown" => {
            let control = a.control.as_deref().unwrap_or_default();
            let answer = shutdown(control)?;
            println!("shutdown_answer={answer}");
        }
        _ => {}
    }
    let exit = wait_exit(&mut child, a.exit_timeout)?;
    println!("vmm_exit={exit}");
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if let Some(op) = argv.first().filter(|op| op.as_str() != "boot")
        && let Some(code) = ops::run(op, &argv[1..])
    {
        return code;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nested-probe: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nested-probe: {e}");
            ExitCode::FAILURE
        }
    }
}
