//! What pausing, resuming, snapshotting and forking a sandbox fail with. Services return
//! it; only http/error.rs turns it into an HTTP answer (the statuses are E2B's).

use crate::error::Error;
use crate::sandboxes::error::SandboxError;
use crate::snapshots::fork::MAX_FORK_COUNT;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The sandbox is not there, not the caller's, or not in a state the operation needs.
    #[error("sandbox \"{0}\" doesn't exist or you don't have access to it")]
    SandboxNotFound(String),
    #[error("sandbox {0} is already paused")]
    AlreadyPaused(String),
    #[error(
        "sandbox {0} has no disk, so its files live in its memory: pause it with memory (omit \
         `memory: false`), or run the daemon with `sandcell serve --disk-mib N` (gvisor)"
    )]
    FilesOnlyWithoutDisk(String),
    /// A snapshot or fork of a paused sandbox.
    #[error("sandbox {0} is paused: resume it first")]
    Paused(String),
    #[error(
        "invalid snapshot name {0:?}: up to 128 letters, digits, '-', '_' and '.', not starting \
         with '.', and not of a snapshot id's form ('snap-' and 16 hex digits)"
    )]
    InvalidName(String),
    #[error("snapshot name {0:?} is the name of an installed template")]
    NameOfTemplate(String),
    #[error("count {0} is out of range: 1 to {MAX_FORK_COUNT}")]
    ForkCount(u32),
    /// The runtime's snapshot handle could not be written into its row.
    #[error("encoding the snapshot: {0}")]
    Encode(#[source] serde_json::Error),
    /// The pause failed and the sandbox still runs (E2B: 503, try again later).
    #[error("pausing sandbox {id} failed: {why}; the sandbox keeps running")]
    PauseFailedStillRunning { id: String, why: String },
    /// The pause failed and took the sandbox down with it (its row is `error`).
    #[error("pausing sandbox {id} failed: {why}")]
    PauseFailed { id: String, why: String },
    /// A paused sandbox's row does not lead to a snapshot.
    #[error("paused sandbox {id}: {why}")]
    PausedWithoutSnapshot { id: String, why: &'static str },
    #[error(transparent)]
    Handle(#[from] HandleError),
    /// Restoring a sandbox from the snapshot (resume, fork's checks).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Runtime(#[from] sandcell_runtime::Error),
    /// The database or the host failed.
    #[error(transparent)]
    Host(#[from] Error),
}

impl SnapshotError {
    /// Whether a pause was refused because the sandbox is paused already or no longer
    /// runs: an auto-pause at the timeout then has nothing to do.
    pub fn is_not_running(&self) -> bool {
        matches!(
            self,
            SnapshotError::AlreadyPaused(_) | SnapshotError::SandboxNotFound(_)
        )
    }
}

/// A snapshot's row whose runtime handle cannot be restored from.
#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    #[error("snapshot {0} was never completed")]
    NeverCompleted(String),
    #[error("snapshot {id}: unreadable handle: {source}")]
    Unreadable {
        id: String,
        #[source]
        source: serde_json::Error,
    },
}
