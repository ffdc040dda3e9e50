//! Sandboxes that outlive their owner ([`crate::SandboxSpec::outlive_owner`]): how their host
//! process is started (its own session, no parent-death signal) and how a process that did
//! not start it (so cannot `wait(2)` for it) learns when it ends: a pidfd, which becomes
//! readable when the process exits, opened only after checking that the pid still names the
//! same process (its start time), so a reused pid is never mistaken for the sandbox.

use crate::owner::process_start_time;
use std::os::fd::{FromRawFd, OwnedFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Makes `cmd` a process that survives us: a session of its own (no terminal's signals
/// reach it) and no parent-death signal. When we die it is re-parented to init, which
/// reaps it.
pub(crate) fn detached(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    // SAFETY: the closure runs between fork and exec and calls only setsid(2), which is
    // async-signal-safe; a fresh child is never a process-group leader, so it cannot fail
    // for that reason.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Whether `pid` is the process that started at `start_time` and has not exited (a zombie
/// has exited).
pub(crate) fn is_running(pid: u32, start_time: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    state != Some("Z") && process_start_time(pid) == Some(start_time)
}

/// A pidfd of `pid` if it is still the process that started at `start_time`; `None` if it
/// has ended (or the pid now names another process).
pub(crate) fn open(pid: u32, start_time: u64) -> Option<OwnedFd> {
    let raw_pid = libc::pid_t::try_from(pid).ok().filter(|p| *p > 1)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no
    // memory is shared with the kernel.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // Checked after opening: from here on the descriptor pins this very process, so if the
    // start time still matches, it is ours.
    is_running(pid, start_time).then_some(fd)
}

/// Resolves when the process behind `pidfd` has exited.
pub(crate) async fn exited(pidfd: OwnedFd) {
    // A pidfd never stops being readable once the process exited; errors mean the
    // descriptor itself broke: treat both as the end.
    // SAFETY: the AsyncFd owns `pidfd` (an OwnedFd, whose as_raw_fd is always the same open
    // descriptor) for its whole life.
    if let Ok(fd) = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) } {
        let _ = fd.readable().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_detached_child_is_watched_until_it_exits() {
        let mut cmd = tokio::process::Command::new("sleep");
        cmd.arg("0.2");
        let mut child = detached(&mut cmd).spawn().unwrap();
        let pid = child.id().unwrap();
        let start = process_start_time(pid).unwrap();
        let fd = open(pid, start).unwrap();
        assert!(
            open(pid, start + 1).is_none(),
            "another start time is another process"
        );
        // The session is its own: setsid made it the leader.
        // SAFETY: getsid only reads the session id of a pid.
        assert_eq!(unsafe { libc::getsid(pid as i32) }, pid as i32);
        tokio::time::timeout(Duration::from_secs(20), exited(fd))
            .await
            .unwrap();
        assert!(!is_running(pid, start), "exited (a zombie until reaped)");
        child.wait().await.unwrap();
        assert!(open(pid, start).is_none());
    }
}
