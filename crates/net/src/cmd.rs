//! Running `ip` and `nft`: simple and debuggable (every step can be replayed by hand). These
//! are blocking calls: async callers run them with `spawn_blocking`.

use crate::{Error, Result};
use std::io::Write;
use std::process::{Command, Stdio};

/// `ip ARGS`, failing with its stderr.
pub(crate) fn ip(args: &[&str]) -> Result<String> {
    run("ip", args, None)
}

/// `nft -f -` with `script` on stdin: one atomic transaction (all or nothing).
pub(crate) fn nft_script(script: &str) -> Result<()> {
    run("nft", &["-f", "-"], Some(script)).map(|_| ())
}

/// `nft ARGS`, failing with its stderr.
pub(crate) fn nft(args: &[&str]) -> Result<String> {
    run("nft", args, None)
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
