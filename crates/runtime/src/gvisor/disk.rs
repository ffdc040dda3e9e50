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
//! -o loop` sets the loop device to detach itself once unmounted.

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

/// Makes sandbox `id`'s disk of `mib` MiB and mounts it (see the module docs).
pub(super) async fn create(dirs: &Dirs, id: &str, mib: u32) -> Result<()> {
    if mib < MIN_DISK_MIB {
        return Err(Error::InvalidSpec {
            runtime: RT,
            problem: format!("a disk of {mib} MiB: need at least {MIN_DISK_MIB} MiB"),
        });
    }
    let file = file(dirs, id);
    let io = |what: String| move |e| Error::io(RT, what, e);
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
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
    let target = mount_point(dirs, id);
    std::fs::create_dir_all(&target).map_err(io(format!("creating {}", target.display())))?;
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

/// Unmounts and deletes sandbox `id`'s disk, if it has one (cheap when not).
pub(super) fn remove(dirs: &Dirs, id: &str) -> Result<()> {
    crate::util::unmount_if_mounted(&mount_point(dirs, id))?;
    let file = file(dirs, id);
    match std::fs::remove_file(&file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(
            RT,
            format!("removing the disk file {}", file.display()),
            e,
        )),
        _ => Ok(()),
    }
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
