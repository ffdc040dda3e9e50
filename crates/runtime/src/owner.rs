//! Who owns a sandbox: the run dir of every sandbox holds `owner.json` with the pid and start
//! time of the process that created it (CLI or daemon). A sweep removes the sandboxes whose
//! owner is gone, and only those: several `sandcell run` share the run dir.
//!
//! The run dir appears with its owner record already inside (built under a dot-name, then
//! renamed into place), so a concurrent sweep never sees an ownerless sandbox in creation.
//!
//! A sandbox made to outlive its owner (the daemon's) says so in its record: ordinary sweeps
//! (every `sandcell run` does one) leave it alone, so that a daemon restart can adopt it,
//! which rewrites the record with the new owner ([`adopt`]). Only the daemon's own sweep
//! after adoption ([`Sweep::Unadopted`]) removes those nobody took over.

use crate::util::path_cstring;
use crate::{Dirs, Error, Result, RuntimeKind};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub(crate) const OWNER_FILE: &str = "owner.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Owner {
    pub pid: u32,
    /// Field 22 of /proc/<pid>/stat, so that a reused pid does not pass for the owner.
    pub start_time: u64,
    pub runtime: RuntimeKind,
    /// Made to outlive the owner ([`crate::SandboxSpec::outlive_owner`]).
    #[serde(default)]
    pub outlives: bool,
}

/// Which sandboxes of dead owners a sweep removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// Those tied to their owner's life (the others wait for adoption).
    Attached,
    /// Also those made to outlive their owner that nobody adopted.
    Unadopted,
}

impl Owner {
    fn current(runtime: RuntimeKind, outlives: bool) -> Option<Owner> {
        let pid = std::process::id();
        Some(Owner {
            pid,
            start_time: process_start_time(pid)?,
            runtime,
            outlives,
        })
    }

    pub fn is_alive(&self) -> bool {
        process_start_time(self.pid) == Some(self.start_time)
    }
}

/// The start time of `pid` in clock ticks since boot, `None` if there is no such process.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields resume after the
    // last ')'. Field 3 is then the first, so field 22 is the 20th.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Creates `<run-dir>/<id>/` holding `owner.json`; fails if the sandbox exists.
pub(crate) fn create_run_dir(
    dirs: &Dirs,
    id: &str,
    runtime: RuntimeKind,
    outlives: bool,
) -> Result<PathBuf> {
    let final_dir = dirs.sandbox_run_dir(id);
    let staging = dirs.run.join(format!(".new-{id}"));
    let owner = Owner::current(runtime, outlives).ok_or_else(|| {
        Error::host(
            "reading our own /proc/self/stat",
            std::io::Error::last_os_error(),
        )
    })?;
    crate::dirs::create_private_dir(&staging)
        .map_err(|e| Error::host(format!("creating {}", staging.display()), e))?;
    let json =
        serde_json::to_vec(&owner).map_err(|e| Error::host("encoding owner.json", e.into()))?;
    let result = std::fs::write(staging.join(OWNER_FILE), json)
        .map_err(|e| Error::host(format!("writing {}/{OWNER_FILE}", staging.display()), e))
        .and_then(|()| rename_noreplace(&staging, &final_dir));
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result.map(|()| final_dir)
}

fn rename_noreplace(from: &Path, to: &Path) -> Result<()> {
    let (cfrom, cto) = (path_cstring(from)?, path_cstring(to)?);
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cfrom.as_ptr(),
            libc::AT_FDCWD,
            cto.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(Error::host(
            format!(
                "renaming {} to {} (a sandbox with this id exists?)",
                from.display(),
                to.display()
            ),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Makes this process the owner of the sandbox in `run_dir` (made to outlive its owner).
/// Atomic (write and rename), so a concurrent sweep sees the old owner or the new one.
pub(crate) fn adopt(run_dir: &Path, runtime: RuntimeKind) -> Result<()> {
    let owner = Owner::current(runtime, true).ok_or_else(|| {
        Error::host(
            "reading our own /proc/self/stat",
            std::io::Error::last_os_error(),
        )
    })?;
    let json =
        serde_json::to_vec(&owner).map_err(|e| Error::host("encoding owner.json", e.into()))?;
    let file = run_dir.join(OWNER_FILE);
    crate::util::write_atomic(&file, &json)
        .map_err(|e| Error::host(format!("writing {}", file.display()), e))
}

pub(crate) fn read(run_dir: &Path) -> Option<Owner> {
    let bytes = std::fs::read(run_dir.join(OWNER_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Run dirs (and half-made staging dirs) of `runtime` whose owner is gone, as
/// `(id, dir)`.
pub(crate) fn dead_sandboxes(
    dirs: &Dirs,
    runtime: RuntimeKind,
    scope: Sweep,
) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(&dirs.run) else {
        return Vec::new();
    };
    let mut dead = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let id = name.strip_prefix(".new-").unwrap_or(&name).to_string();
        if !crate::validate_id(&id) {
            continue;
        }
        let dir = entry.path();
        match read(&dir) {
            Some(owner)
                if owner.runtime == runtime
                    && !owner.is_alive()
                    && (!owner.outlives || scope == Sweep::Unadopted) =>
            {
                dead.push((id, dir))
            }
            // A staging dir without an owner file is a creation that died before writing it.
            None if name.starts_with(".new-") && older_than_a_minute(&dir) => dead.push((id, dir)),
            _ => {}
        }
    }
    dead
}

fn older_than_a_minute(path: &Path) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age.as_secs() > 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_process_is_alive_and_a_fake_one_is_not() {
        let me = Owner::current(RuntimeKind::Gvisor, false).unwrap();
        assert!(me.is_alive());
        let stale = Owner {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(!stale.is_alive());
    }

    #[test]
    fn run_dir_is_exclusive_and_swept_only_when_owner_died() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
        let dir = create_run_dir(&dirs, "sc-a", RuntimeKind::Gvisor, false).unwrap();
        assert!(create_run_dir(&dirs, "sc-a", RuntimeKind::Gvisor, false).is_err());
        assert!(dead_sandboxes(&dirs, RuntimeKind::Gvisor, Sweep::Attached).is_empty());

        let mut owner = read(&dir).unwrap();
        owner.start_time += 1;
        std::fs::write(dir.join(OWNER_FILE), serde_json::to_vec(&owner).unwrap()).unwrap();
        assert!(dead_sandboxes(&dirs, RuntimeKind::Microvm, Sweep::Attached).is_empty());
        let dead = dead_sandboxes(&dirs, RuntimeKind::Gvisor, Sweep::Attached);
        assert_eq!(dead, vec![("sc-a".to_string(), dir)]);
    }

    #[test]
    fn outliving_sandboxes_wait_for_adoption() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
        let dir = create_run_dir(&dirs, "sc-b", RuntimeKind::Gvisor, true).unwrap();
        let mut owner = read(&dir).unwrap();
        assert!(owner.outlives);
        owner.start_time += 1;
        std::fs::write(dir.join(OWNER_FILE), serde_json::to_vec(&owner).unwrap()).unwrap();
        let dead = |scope| dead_sandboxes(&dirs, RuntimeKind::Gvisor, scope);
        assert!(dead(Sweep::Attached).is_empty(), "plain sweeps leave it");
        assert_eq!(dead(Sweep::Unadopted).len(), 1);
        adopt(&dir, RuntimeKind::Gvisor).unwrap();
        assert!(read(&dir).unwrap().is_alive());
        assert!(dead(Sweep::Unadopted).is_empty(), "adopted: ours now");
    }
}
