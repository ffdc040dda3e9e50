//! A gVisor sandbox's disk ([`crate::SandboxSpec::disk_mib`]): without one, the root's
//! writes live in the sandbox's memory (`--overlay2=root:memory`), so filling the root ends
//! the sandbox for memory and `df /` shows no size (issue 12). With one:
//!
//! - a sparse file `<data-dir>/disks/<id>.ext4` of that size (on the data disk, not the run
//!   dir, which is often RAM), formatted ext4 and loop-mounted on the host at
//!   `<run-dir>/<id>/layer`, where the root overlay's upper and work dirs live;
//! - runsc runs with `--overlay2=none`, so the root's writes go through the gofer to that
//!   upper layer: a full disk is ENOSPC inside, and `df /` reports the disk's size.
//!
//! The guest never touches the file's blocks: it sees files through runsc's gofer, and the
//! host's ext4 driver reads only what the host wrote. The mount goes with the sandbox's
//! other leftovers (`Shared::remove_leftovers`: kill, sweep, a failed create), and `mount
//! -o loop` sets the loop device to detach itself once unmounted. A sweep also removes disk
//! files left without their sandbox ([`remove_orphans`]).

use super::RT;
use crate::{Dirs, Error, Result};
use std::path::{Path, PathBuf};

/// Smallest disk: ext4's own metadata needs a few MiB.
pub const MIN_DISK_MIB: u32 = 64;

/// Where sandbox `id`'s disk file is.
pub(super) fn file(dirs: &Dirs, id: &str) -> PathBuf {
    dirs.data.join("disks").join(format!("{id}.ext4"))
}

/// Where it is mounted (the overlay's upper and work dirs are inside).
pub(super) fn mount_point(dirs: &Dirs, id: &str) -> PathBuf {
    dirs.sandbox_run_dir(id).join("layer")
}

/// What sandbox `id`'s mounted disk holds and can hold, from the host's `statvfs` of it
/// (`None` when it has no disk mounted).
pub(super) fn usage(dirs: &Dirs, id: &str) -> Option<crate::DiskUsage> {
    let st = statvfs(&mount_point(dirs, id))?;
    let frsize = st.f_frsize;
    let total = st.f_blocks.saturating_mul(frsize);
    let free = st.f_bfree.saturating_mul(frsize);
    Some(crate::DiskUsage {
        used_bytes: total.saturating_sub(free),
        total_bytes: total,
    })
}

/// The host's `statvfs` of the filesystem holding `path` (`None` if it cannot be read).
pub(crate) fn statvfs(path: &Path) -> Option<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data: all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and `st` is a
    // statvfs the call fills in; nothing else is read or kept.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st)
}

/// Makes sandbox `id`'s disk of `mib` MiB and mounts it (see the module docs).
pub(super) async fn create(dirs: &Dirs, id: &str, mib: u32) -> Result<()> {
    if mib < MIN_DISK_MIB {
        return Err(Error::InvalidSpec {
            runtime: RT,
            problem: format!("a disk of {mib} MiB: need at least {MIN_DISK_MIB} MiB"),
        });
    }
    make(&file(dirs, id), &mount_point(dirs, id), mib).await
}

/// A sparse ext4 file `file` of `mib` MiB (it must not exist), loop-mounted `nosuid,nodev`
/// at `target` (made if missing): a sandbox's disk, or a build step's (build_disk.rs).
pub(crate) async fn make(file: &Path, target: &Path, mib: u32) -> Result<()> {
    let io = |what: String| move |e| Error::io(RT, what, e);
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)
        .map_err(io(format!("creating the disk file {}", file.display())))?;
    // Sparse: blocks are taken on the data disk only as the sandbox writes.
    f.set_len(u64::from(mib) << 20)
        .map_err(io(format!("sizing {} to {mib} MiB", file.display())))?;
    drop(f);
    // No reserved blocks (root inside is the only user); lazy init keeps mkfs fast.
    run(
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-E".as_ref(),
            "lazy_itable_init=1,lazy_journal_init=1,nodiscard".as_ref(),
            file.as_os_str(),
        ],
        "install e2fsprogs",
    )
    .await?;
    std::fs::create_dir_all(target).map_err(io(format!("creating {}", target.display())))?;
    run(
        "mount",
        &[
            "-o".as_ref(),
            "loop,nosuid,nodev".as_ref(),
            file.as_os_str(),
            target.as_os_str(),
        ],
        "the host needs loop devices (modprobe loop)",
    )
    .await
}

/// Unmounts `target` if it is mounted (the loop device detaches itself) and deletes the
/// disk file `file` if it exists.
pub(crate) fn unmount_and_delete(target: &Path, file: &Path) -> Result<()> {
    crate::util::unmount_if_mounted(target)?;
    match std::fs::remove_file(file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(
            RT,
            format!("removing the disk file {}", file.display()),
            e,
        )),
        _ => Ok(()),
    }
}

/// Unmounts and deletes sandbox `id`'s disk, if it has one (cheap when not).
pub(super) fn remove(dirs: &Dirs, id: &str) -> Result<()> {
    unmount_and_delete(&mount_point(dirs, id), &file(dirs, id))
}

/// Removes disk files that no sandbox of `dirs` has (no run dir) and no loop device
/// holds: what a crash between a sandbox's unmount and its file's removal leaves. Returns
/// the ids whose disks went.
pub(super) fn remove_orphans(dirs: &Dirs) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dirs.data.join("disks")) else {
        return Vec::new();
    };
    let held = loop_backing_files();
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".ext4")) else {
            continue;
        };
        let path = entry.path();
        // A held one is in use (by a sandbox of another run dir, say): never touched.
        let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if !crate::validate_id(id)
            || dirs.sandbox_run_dir(id).exists()
            || held.contains(&canonical)
            || held.contains(&path)
        {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(id.to_string()),
            Err(e) => tracing::warn!("removing orphaned disk {}: {e}", path.display()),
        }
    }
    removed
}

/// The files behind the host's loop devices (`/sys/block/loop*/loop/backing_file`).
fn loop_backing_files() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .map(|s| PathBuf::from(s.trim_end_matches('\n')))
        .collect()
}

async fn run(program: &str, args: &[&std::ffi::OsStr], hint: &str) -> Result<()> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| Error::io(RT, format!("running {program} ({hint})"), e))?;
    if !out.status.success() {
        let shown: Vec<String> = args
            .iter()
            .map(|a| Path::new(a).display().to_string())
            .collect();
        return Err(Error::Command {
            runtime: RT,
            command: format!("{program} {}", shown.join(" ")),
            status: out.status.to_string(),
            stderr: format!("{} ({hint})", String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    Ok(())
}
