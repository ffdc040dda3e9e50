//! Getting out of the way of a gVisor checkpoint (`POST /sandcell/checkpoint-hold`).
//!
//! gVisor refuses to save a sandbox that holds a host socket ("Cannot save endpoint with
//! bound host socket"): our Unix listener in the host-shared directory is one, and so is
//! every connection accepted on it. So on request the agent closes them all (the server
//! returns [`crate::server::ServeOutcome::CheckpointRequested`] once its connections are
//! gone, and the listener is dropped then: the host sees its connections refused from that
//! moment) and waits here, without any host socket, until the file
//! [`sandcell_proto::agent::RESUME_MARKER`] appears next to where its socket was. The runtime
//! writes that marker into the socket directory of each restored copy before `runsc restore`
//! (a fresh directory per copy), and into the original one when the checkpoint failed or the
//! original resumes. The agent then removes the marker and listens again. The socket file
//! itself is the host's to remove (gVisor refuses to unlink a host socket from inside).
//!
//! Processes started through the agent keep running throughout; only the host's streams to
//! the agent end (clients reconnect, as after any network cut).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandcell_proto::agent::{HELD_MARKER, RESUME_MARKER};

use crate::listen::ListenAddr;

/// How often the marker is looked for: the delay it adds to a restore's agent-ready time.
const POLL: Duration = Duration::from_millis(2);

/// Where the resume marker of a listener at `addr` is; `None` for listeners that are not
/// host sockets (vsock, TCP), which need no hold.
pub fn marker_path(addr: &ListenAddr) -> Option<PathBuf> {
    match addr {
        ListenAddr::Unix(path) => Some(path.parent()?.join(RESUME_MARKER)),
        ListenAddr::Vsock { .. } | ListenAddr::Tcp(_) => None,
    }
}

/// Tells the host that the agent holds no host socket any more: writes
/// [`HELD_MARKER`] next to the resume marker `resume_marker`. Returns the file to remove
/// when the hold ends.
pub fn mark_held(resume_marker: &Path) -> Option<PathBuf> {
    let held = resume_marker.parent()?.join(HELD_MARKER);
    match std::fs::write(&held, b"") {
        Ok(()) => Some(held),
        Err(e) => {
            crate::log!("writing the hold marker {}: {e}", held.display());
            None
        }
    }
}

/// Waits (the listener already closed) until `marker` exists or `max` passed, then removes
/// the marker. Returns whether the marker was seen (false: gave up waiting, and the caller
/// listens again anyway, so that a runtime that died mid-checkpoint does not leave a deaf
/// agent behind).
pub async fn hold_until_resumed(marker: &Path, max: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + max;
    let seen = loop {
        if std::fs::symlink_metadata(marker).is_ok() {
            break true;
        }
        if tokio::time::Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(POLL).await;
    };
    if seen && let Err(e) = std::fs::remove_file(marker) {
        crate::log!("removing the resume marker {}: {e}", marker.display());
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unix_listeners_hold() {
        let unix: ListenAddr = "unix:/run/sandcell-host/agent.sock"
            .parse()
            .unwrap_or(ListenAddr::Vsock { port: 0 });
        assert_eq!(
            marker_path(&unix),
            Some(PathBuf::from("/run/sandcell-host").join(RESUME_MARKER))
        );
        assert_eq!(marker_path(&ListenAddr::Vsock { port: 1 }), None);
    }

    #[tokio::test]
    async fn waits_for_the_marker_and_consumes_it() {
        let dir = std::env::temp_dir().join(format!("sc-hold-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let marker = dir.join(RESUME_MARKER);
        let writer = {
            let marker = marker.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let _ = std::fs::write(&marker, b"");
            })
        };
        assert!(hold_until_resumed(&marker, Duration::from_secs(10)).await);
        let _ = writer.await;
        assert!(!marker.exists(), "the marker is consumed");
        assert!(!hold_until_resumed(&marker, Duration::from_millis(10)).await);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
