//! Finding `runsc` and what it can do. Versions differ: Debian bookworm's 20221219 has the
//! `ptrace` and `kvm` platforms and `--overlay2=root:memory`; newer releases add `systrap`
//! (faster than ptrace) and more overlay media. We use `systrap` where it exists, else
//! `ptrace` (never `kvm`: it needs a KVM that can run gVisor's ring-0 code, which is exactly
//! what hosts that fall back to gVisor tend to lack).
//!
//! Asking runsc takes four process spawns (~25 ms each), so the answer is cached under the
//! data dir keyed by the binary's path, size and mtime.

use crate::{Dirs, Error, Result, RuntimeKind};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

const RT: RuntimeKind = RuntimeKind::Gvisor;
const CACHE_FILE: &str = "runsc.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunscInfo {
    pub path: PathBuf,
    /// First line of `runsc --version`.
    pub version: String,
    /// From `runsc help platforms`.
    pub platforms: Vec<String>,
    /// The one we use.
    pub platform: String,
    /// `--overlay2` exists (writes to the root then stay inside the sandbox's memory).
    pub overlay2: bool,
    /// `--host-uds` exists (our agent transport needs it).
    pub host_uds: bool,
    /// `--net-disconnect-ok` exists (runsc 2023+): a sandbox with a network can then be
    /// checkpointed while it has TCP connections (they are reset on restore). Without it
    /// gVisor refuses to save any connected endpoint, TIME_WAIT included (60 s after a
    /// connection the sandbox closed).
    #[serde(default)]
    pub net_disconnect_ok: bool,
    /// `runsc checkpoint --compression` exists (2024+, default flate): we ask for none,
    /// which makes checkpoints several times faster for a little more disk.
    #[serde(default)]
    pub checkpoint_compression: bool,
}

#[derive(Serialize, Deserialize)]
struct Cached {
    key: String,
    info: RunscInfo,
}

/// `$SANDCELL_RUNSC`, else `runsc` on `$PATH`.
pub fn find_runsc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SANDCELL_RUNSC").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join("runsc"))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl RunscInfo {
    /// Finds runsc and learns its version, platforms and flags (cached).
    pub async fn detect(dirs: &Dirs) -> Result<RunscInfo> {
        let path = find_runsc().ok_or_else(|| Error::Unavailable {
            runtime: RT,
            what: "runsc (gVisor) was not found on $PATH".into(),
            hint: "install it (Debian/Ubuntu: `apt install runsc`, or gvisor.dev) or set SANDCELL_RUNSC".into(),
        })?;
        let meta = std::fs::metadata(&path)
            .map_err(|e| Error::io(RT, format!("reading {}", path.display()), e))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let key = format!("{}|{}|{}", path.display(), meta.len(), mtime);
        let cache = dirs.cache_file(CACHE_FILE);
        if let Some(info) = std::fs::read(&cache)
            .ok()
            .and_then(|b| serde_json::from_slice::<Cached>(&b).ok())
            .filter(|c| c.key == key)
            .map(|c| c.info)
        {
            return Ok(info);
        }
        let info = RunscInfo::probe(path).await?;
        // A cache we cannot write only costs time next run.
        if let Ok(json) = serde_json::to_vec_pretty(&Cached {
            key,
            info: info.clone(),
        }) {
            let _ = crate::util::write_atomic(&cache, &json);
        }
        Ok(info)
    }

    async fn probe(path: PathBuf) -> Result<RunscInfo> {
        let (version, platforms, flags, checkpoint_help) = tokio::join!(
            output(&path, &["--version"]),
            output(&path, &["help", "platforms"]),
            output(&path, &["flags"]),
            output(&path, &["help", "checkpoint"]),
        );
        let version = version?.lines().next().unwrap_or("").trim().to_string();
        let platforms: Vec<String> = platforms?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_lowercase()))
            .map(String::from)
            .collect();
        let flags = flags?;
        let has_flag = |name: &str| {
            flags.lines().any(|l| {
                l.trim_start()
                    .trim_start_matches('-')
                    .split_whitespace()
                    .next()
                    == Some(name)
            })
        };
        let platform = if platforms.iter().any(|p| p == "systrap") {
            "systrap"
        } else {
            "ptrace"
        };
        let info = RunscInfo {
            version,
            platform: platform.to_string(),
            overlay2: has_flag("overlay2"),
            host_uds: has_flag("host-uds"),
            net_disconnect_ok: has_flag("net-disconnect-ok"),
            checkpoint_compression: checkpoint_help
                .map(|h| h.contains("-compression"))
                .unwrap_or(false),
            platforms,
            path,
        };
        if !info.platforms.iter().any(|p| p == &info.platform) {
            return Err(Error::Unavailable {
                runtime: RT,
                what: format!(
                    "{} offers neither the systrap nor the ptrace platform ({:?})",
                    info.path.display(),
                    info.platforms
                ),
                hint: "install a gVisor release from gvisor.dev".into(),
            });
        }
        if !info.host_uds {
            return Err(Error::Unavailable {
                runtime: RT,
                what: format!(
                    "{} ({}) has no --host-uds flag, which the agent transport needs",
                    info.path.display(),
                    info.version
                ),
                hint: "install a gVisor release from 2021 or later".into(),
            });
        }
        Ok(info)
    }
}

/// stdout and stderr of `runsc ARGS` (runsc prints `flags` and `help` on stderr).
async fn output(path: &Path, args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new(path)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| {
            Error::io(
                RT,
                format!("running {} {}", path.display(), args.join(" ")),
                e,
            )
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            runtime: RT,
            command: format!("{} {}", path.display(), args.join(" ")),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok(text)
}
