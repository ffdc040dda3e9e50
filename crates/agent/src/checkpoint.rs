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
//!
//! ## gVisor's resurrected epoll registrations
//!
//! runsc before release-20260406 (Debian's 20240729 included) has an epoll defect that
//! checkpoints turn into use-after-free in the agent: `EpollInstance.ReadEvents` parks the
//! interests it reports (all of tokio's: they are edge-triggered) on a temporary intrusive
//! list and drops the list without unlinking them, so a live registration keeps `next`/`prev`
//! pointers to the others reported in the same `epoll_wait`. When one of those is deleted
//! later (a process's pipe after it exited, a connection), the live one still points at it,
//! so the checkpoint saves it, and on restore `epollInterest.afterLoad` marks every loaded
//! interest ready, the deleted one too: the first `epoll_wait` after the restore returns
//! EPOLLHUP with the deleted registration's user data, which tokio takes for the address of
//! a `ScheduledIo` it has freed long ago. Seen as a tokio panic (`ref_count() > 0`), a jump
//! to a heap or stack address (SIGSEGV, the sandbox exits), or an agent that never answers;
//! about one restore in 10-20, and every restore of such a checkpoint fails the same way.
//! Fixed upstream by gVisor commit 5d857245b ("vfs: clear temporary notReady lists").
//!
//! The stale pointers live in registrations that have had no event since: in the agent, the
//! ones that stay registered for good and rarely fire, tokio's signal pipe (SIGCHLD comes
//! with the HUPs of an exited process's pipes, which are deleted right after) and its wakeup
//! eventfd. An event re-queues a registration and rewrites its pointers, so
//! [`refresh_wakeup_registrations`] gives both an event before the hold is announced and
//! again while it lasts. Left: a long-lived registration of a running process (its output
//! pipe, a PTY, a watcher) reported together with another process's pipes that are deleted
//! later and not fired again before the checkpoint can still carry a stale pointer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandcell_proto::agent::{HELD_MARKER, RESUME_MARKER};

use crate::listen::ListenAddr;

/// How often the marker is looked for: the delay it adds to a restore's agent-ready time.
const POLL: Duration = Duration::from_millis(2);

/// How often the hold re-fires tokio's wakeup registrations (see the module docs): a
/// process that ends while the agent holds deletes registrations that the last refresh
/// may have linked to.
const REFRESH_EVERY: Duration = Duration::from_millis(10);

/// Gives tokio's signal pipe and wakeup eventfd an event each, so that gVisor re-queues their
/// epoll registrations and drops any stale pointer they hold to deleted ones (see the module
/// docs). Harmless anywhere: a spurious SIGCHLD makes the reaper find nothing to reap, and a
/// remote no-op task makes the runtime wake once.
pub fn refresh_wakeup_registrations() {
    // SAFETY: raise(2) only sends a signal to this thread; SIGCHLD's action is tokio's
    // handler (the reaper's, which writes to tokio's signal pipe) or the default (ignored).
    unsafe { libc::raise(libc::SIGCHLD) };
    // A task spawned from another thread unparks the runtime through its eventfd.
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new().spawn_scoped(scope, || {
            drop(handle.spawn(async {}));
        });
        if let Err(e) = spawned {
            crate::log!("refreshing the runtime's wakeup registration: {e}");
        }
    });
}

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
    // After every host socket is gone (their registrations deleted), before the host may
    // checkpoint.
    refresh_wakeup_registrations();
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
    let mut refreshed = tokio::time::Instant::now();
    let seen = loop {
        if std::fs::symlink_metadata(marker).is_ok() {
            break true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break false;
        }
        if now.duration_since(refreshed) >= REFRESH_EVERY {
            refresh_wakeup_registrations();
            refreshed = now;
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
    async fn a_refresh_fires_the_sigchld_registration() {
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            .unwrap_or_else(|e| panic!("SIGCHLD handler: {e}"));
        refresh_wakeup_registrations();
        assert!(
            tokio::time::timeout(Duration::from_secs(10), sigchld.recv())
                .await
                .is_ok(),
            "the refresh raised no SIGCHLD"
        );
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
