//! The one place that calls `waitpid`. Exit statuses are handed to whoever registered the pid;
//! everything else (orphans re-parented to PID 1) is reaped and dropped.
//!
//! Why not `tokio::process`: as PID 1 the agent must `waitpid(-1)` to reap orphans, which would
//! steal the statuses tokio waits for. Instead every child is spawned under the waiter-table
//! lock and registered before the lock is released; the reaper looks a reaped pid up under the
//! same lock, so a child that exits before registration finishes is still dispatched.

use sandcell_proto::sync::lock;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

/// Which children the reaper waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReapMode {
    /// `waitpid(-1)`: every child, including orphans re-parented to us. For PID 1.
    AllChildren,
    /// `waitpid(pid)` for registered pids only, so a host process embedding the server (a
    /// test) keeps the statuses of its own other children.
    OwnChildren,
}

impl ReapMode {
    /// `AllChildren` when we are PID 1, `OwnChildren` otherwise.
    pub fn for_this_process() -> Self {
        if std::process::id() == 1 {
            ReapMode::AllChildren
        } else {
            ReapMode::OwnChildren
        }
    }
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    Exited(i32),
    Signaled(i32),
}

impl ExitKind {
    fn from_wait_status(status: libc::c_int) -> Option<Self> {
        if libc::WIFEXITED(status) {
            Some(ExitKind::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(ExitKind::Signaled(libc::WTERMSIG(status)))
        } else {
            None // stopped/continued: we never ask for those (no WUNTRACED)
        }
    }
}

type Waiters = HashMap<i32, oneshot::Sender<ExitKind>>;

#[derive(Debug)]
pub struct Reaper {
    mode: ReapMode,
    waiters: Mutex<Waiters>,
}

impl Reaper {
    /// Installs the SIGCHLD handler and starts the reaping task on the current runtime. The
    /// handler is installed before this returns, so no child spawned afterwards is missed.
    pub fn start(mode: ReapMode) -> io::Result<Arc<Self>> {
        let mut sigchld = signal(SignalKind::child())?;
        let reaper = Arc::new(Reaper {
            mode,
            waiters: Mutex::new(HashMap::new()),
        });
        let weak: Weak<Reaper> = Arc::downgrade(&reaper);
        tokio::spawn(async move {
            loop {
                match weak.upgrade() {
                    Some(reaper) => reaper.reap_ready(),
                    None => break,
                }
                if sigchld.recv().await.is_none() {
                    break;
                }
            }
        });
        Ok(reaper)
    }

    fn lock(&self) -> MutexGuard<'_, Waiters> {
        // A panic while holding this lock leaves the map consistent (single inserts/removes).
        lock(&self.waiters)
    }

    /// Runs `spawn` (which starts a child and returns it with its pid) under the table lock
    /// and registers the pid, returning a receiver for its exit.
    pub fn spawn_registered<T>(
        &self,
        spawn: impl FnOnce() -> io::Result<(T, i32)>,
    ) -> io::Result<(T, i32, oneshot::Receiver<ExitKind>)> {
        let mut waiters = self.lock();
        let (child, pid) = spawn()?;
        let (tx, rx) = oneshot::channel();
        waiters.insert(pid, tx);
        Ok((child, pid, rx))
    }

    /// Reaps every child that has exited, without blocking.
    fn reap_ready(&self) {
        match self.mode {
            ReapMode::AllChildren => loop {
                let mut status = 0;
                // SAFETY: waitpid with a valid out-pointer; WNOHANG never blocks. __WALL: also
                // orphans whose exit signal is not SIGCHLD (gVisor keeps the original one when
                // it re-parents a process to PID 1, and plain waitpid(-1) never sees them).
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
                if pid <= 0 {
                    break; // 0: none ready; -1: ECHILD (no children) or EINTR, retried on next SIGCHLD
                }
                // Lookup after taking the lock: see the module comment.
                let waiter = self.lock().remove(&pid);
                dispatch(waiter, ExitKind::from_wait_status(status));
            },
            ReapMode::OwnChildren => {
                let mut waiters = self.lock();
                let pids: Vec<i32> = waiters.keys().copied().collect();
                for pid in pids {
                    let mut status = 0;
                    // SAFETY: as above, for one pid we spawned and have not reaped yet.
                    let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                    if got == pid {
                        dispatch(waiters.remove(&pid), ExitKind::from_wait_status(status));
                    } else if got < 0 {
                        // ECHILD: someone else in this process reaped it. Dropping the sender
                        // tells the waiter the status is lost instead of leaving it hanging.
                        waiters.remove(&pid);
                    }
                }
            }
        }
    }
}

fn dispatch(waiter: Option<oneshot::Sender<ExitKind>>, kind: Option<ExitKind>) {
    if let (Some(tx), Some(kind)) = (waiter, kind) {
        // The receiver may be gone (its stream task ended); nothing else wants the status.
        let _ = tx.send(kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    async fn run(reaper: &Reaper, script: &str) -> ExitKind {
        let (_child, _pid, rx) = reaper
            .spawn_registered(|| {
                let child = Command::new("sh").args(["-c", script]).spawn()?;
                let pid = child.id() as i32;
                Ok((child, pid))
            })
            .expect("spawn sh");
        rx.await.expect("reaper dropped the waiter")
    }

    #[tokio::test]
    async fn dispatches_exit_codes_and_signals() {
        let reaper = Reaper::start(ReapMode::OwnChildren).expect("start reaper");
        assert_eq!(run(&reaper, "exit 7").await, ExitKind::Exited(7));
        assert_eq!(run(&reaper, "kill -KILL $$").await, ExitKind::Signaled(9));
        // A child that exits before the reaper task ever runs is still dispatched.
        let (a, b) = tokio::join!(run(&reaper, "true"), run(&reaper, "exit 1"));
        assert_eq!((a, b), (ExitKind::Exited(0), ExitKind::Exited(1)));
    }
}
