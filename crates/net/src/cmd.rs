//! Running `ip` and `nft`: simple and debuggable (every step can be replayed by hand). These
//! are blocking calls: async callers run them with `spawn_blocking`. nftables changes go
//! through libnftables in-process when it loads (nftlib.rs: the same scripts, without a
//! process each); the `nft` program otherwise.

use crate::{Error, Result};
use std::io::Write;
use std::process::{Command, Stdio};

/// `ip ARGS`, failing with its stderr.
pub(crate) fn ip(args: &[&str]) -> Result<String> {
    run("ip", args, None)
}

/// `nft -f -` with `script` on stdin: one atomic transaction (all or nothing).
pub(crate) fn nft_script(script: &str) -> Result<()> {
    match crate::nftlib::run(script, false) {
        Some(outcome) => in_process("nft -f -", outcome, Some(script)).map(|_| ()),
        None => run("nft", &["-f", "-"], Some(script)).map(|_| ()),
    }
}

/// `nft ARGS` (a leading `-j` asks for JSON, as the program takes it), failing with its
/// stderr.
pub(crate) fn nft(args: &[&str]) -> Result<String> {
    let (json, words) = match args {
        ["-j", rest @ ..] => (true, rest),
        _ => (false, args),
    };
    match crate::nftlib::run(&words.join(" "), json) {
        Some(outcome) => in_process(&format!("nft {}", args.join(" ")), outcome, None),
        None => run("nft", args, None),
    }
}

/// A libnftables outcome as the program's would have been: the same error, with the
/// script appended as `run` does.
fn in_process(
    shown: &str,
    outcome: crate::nftlib::Outcome,
    script: Option<&str>,
) -> Result<String> {
    outcome.map_err(|mut stderr| {
        stderr = stderr.trim().to_string();
        if let Some(script) = script {
            stderr.push_str("\nscript:\n");
            stderr.push_str(script);
        }
        Error::Command {
            command: format!("{shown} (libnftables)"),
            status: "failed".into(),
            stderr,
        }
    })
}

/// `conntrack ARGS` (conntrack-tools), failing with its stderr.
pub(crate) fn conntrack(args: &[&str]) -> Result<String> {
    run("conntrack", args, None)
}

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let shown = || format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Error::io(
                format!("starting `{}` (is iproute2/nftables installed?)", shown()),
                e,
            )
        })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| Error::io(format!("writing the script to `{}`", shown()), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io(format!("waiting for `{}`", shown()), e))?;
    if !out.status.success() {
        let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if let Some(script) = stdin {
            stderr.push_str("\nscript:\n");
            stderr.push_str(script);
        }
        return Err(Error::Command {
            command: shown(),
            status: out.status.to_string(),
            stderr,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
