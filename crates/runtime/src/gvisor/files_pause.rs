//! Filesystem-only pauses of gVisor sandboxes (E2B's `pause(memory=False)`, issue 15): no
//! `runsc checkpoint`, so they work where a checkpoint would be refused (a socket bound in
//! the agent directory, TCP state an old runsc cannot save).
//!
//! - The agent is asked to power off: it `sync`s (crates/agent/src/power.rs), so what the
//!   processes wrote is on the sandbox's disk, and exits, which ends the sandbox. One that
//!   does not is killed (what it had not written yet is lost, as on a power cut).
//! - Its root's layers are then flattened into `<dest>/upper` (flatten.rs) and the sandbox's
//!   own files removed. The handle has no checkpoint: a restore of it boots a fresh sandbox
//!   on `[upper/, image tree]` (checkpoint.rs, `restore_new`): same files, no processes.
//! - Only a sandbox with a disk: without one its writes live in its memory
//!   (`--overlay2=root:memory`), which only a checkpoint saves.
//!
//! A failure after the stop (the copy) cannot hand the sandbox back running: it is an
//! error, and the sandbox is gone.

use super::*;
use crate::snapshot::{SnapshotFiles, SnapshotHandle, SnapshotKind};

const OP: &str = "pause without memory";
/// How long the agent gets to sync and exit after the power-off request.
const POWEROFF_EXIT: Duration = Duration::from_secs(10);

pub(super) async fn pause_files_to_disk(sb: &GvisorSandbox, dest: &Path) -> Result<SnapshotHandle> {
    let pid = check_pausable(sb)?;
    let upper = checkpoint::create_snapshot_dir(dest)?;
    stop(sb, pid).await;
    let saved = match checkpoint::flatten_root(sb, &upper).await {
        Ok(()) => {
            let handle = SnapshotHandle {
                format: crate::snapshot::SNAPSHOT_FORMAT,
                runtime: RT,
                kind: SnapshotKind::Full,
                dir: dest.to_path_buf(),
                source_id: sb.id.clone(),
                image: (&sb.image).into(),
                vcpus: sb.vcpus,
                memory_mib: sb.memory_mib,
                env: sb.env.clone(),
                files: SnapshotFiles::Gvisor {
                    checkpoint_dir: None,
                    upper_dir: upper,
                    disk_mib: sb.disk_mib,
                },
            };
            handle.save().map(|()| handle)
        }
        Err(e) => Err(e),
    };
    // Stopped either way: its own files go.
    let destroyed = sb.destroy().await;
    match saved {
        Ok(handle) => destroyed.map(|()| handle),
        Err(e) => {
            let _ = crate::util::remove_dir_all_if_exists(dest);
            Err(e)
        }
    }
}

/// Refuses, before touching the sandbox, what cannot be paused this way; its `runsc run`
/// pid.
fn check_pausable(sb: &GvisorSandbox) -> Result<u32> {
    sb.require_running(OP)?;
    let unsupported = |why: &str| Error::Unsupported {
        runtime: RT,
        op: OP,
        why: why.into(),
    };
    if sb.paused.load(Ordering::SeqCst) {
        return Err(unsupported(
            "the sandbox is frozen (runsc pause): resume it first",
        ));
    }
    if sb.disk_mib.is_none() {
        return Err(unsupported(
            "the sandbox has no disk (sandcell serve --disk-mib 0): its files live in its \
             memory, which only a pause with memory saves",
        ));
    }
    if sb.image.rootfs_dir.is_none() {
        return Err(unsupported(
            "the image of an adopted sandbox is not known to this process",
        ));
    }
    match *lock(&sb.phase) {
        Phase::Started(pid) => Ok(pid),
        _ => Err(Error::WrongState {
            runtime: RT,
            id: sb.id.clone(),
            state: sb.phase_name().into(),
            op: OP,
        }),
    }
}

/// Ends the sandbox, its files kept: the agent syncs and exits, or it is killed.
async fn stop(sb: &GvisorSandbox, pid: u32) {
    // Ordering: marked as stopping first, so that its end reads as requested (the daemon's
    // watcher then leaves it alone).
    sb.stopping.store(true, Ordering::SeqCst);
    if sb.poweroff().await && sb.ended_within(POWEROFF_EXIT).await {
        return;
    }
    tracing::warn!(
        "gvisor sandbox {}: the agent did not power off within {POWEROFF_EXIT:?}; killing it \
         (unsynced writes are lost)",
        sb.id
    );
    if let Err(e) = sb.shared.kill(&sb.id).await {
        tracing::warn!("gvisor sandbox {}: {e}", sb.id);
    }
    if !sb.ended_within(Duration::from_secs(5)).await {
        kill_pid(pid, libc::SIGKILL);
        sb.ended_within(Duration::from_secs(2)).await;
    }
}
