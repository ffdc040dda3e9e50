//! What both runtimes do with the one host process that embodies a sandbox (`runsc run`,
//! `sandcell-vmm`): remember how it ended, let any number of tasks wait for that, and poll
//! the agent's transport until it answers or the process ends first.

use crate::SandboxExit;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// `None` while the sandbox lives, then how it ended. Cloning shares it.
#[derive(Clone)]
pub(crate) struct ExitCell {
    tx: Arc<watch::Sender<Option<SandboxExit>>>,
}

impl ExitCell {
    pub fn new() -> ExitCell {
        ExitCell {
            tx: Arc::new(watch::channel(None).0),
        }
    }

    pub fn get(&self) -> Option<SandboxExit> {
        self.tx.borrow().clone()
    }

    /// Records how the sandbox ended; the first record wins.
    pub fn set(&self, exit: SandboxExit) {
        self.tx.send_if_modified(|slot| {
            let unset = slot.is_none();
            if unset {
                *slot = Some(exit);
            }
            unset
        });
    }

    pub async fn wait(&self) -> SandboxExit {
        let mut rx = self.tx.subscribe();
        loop {
            if let Some(exit) = rx.borrow_and_update().clone() {
                return exit;
            }
            // Cannot fail: `self` holds the sender.
            if rx.changed().await.is_err() {
                return SandboxExit::Destroyed;
            }
        }
    }
}

pub(crate) enum NotReady {
    Ended(SandboxExit),
    Timeout,
}

/// Calls `probe` (a short connection attempt) with a growing pause (0.5 ms doubling up to
/// 2 ms: a probe costs a failed connect(2), the pause is latency added to every start) until it succeeds, the sandbox ends, or `timeout` passes.
pub(crate) async fn poll_ready<F, Fut>(
    exit: &ExitCell,
    timeout: Duration,
    mut probe: F,
) -> Result<(), NotReady>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_micros(500);
    loop {
        if let Some(ended) = exit.get() {
            return Err(NotReady::Ended(ended));
        }
        if probe().await {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(NotReady::Timeout);
        }
        tokio::select! {
            ended = exit.wait() => return Err(NotReady::Ended(ended)),
            _ = tokio::time::sleep(delay.min(deadline - now)) => {}
        }
        delay = (delay * 2).min(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_exit_wins_and_wakes_waiters() {
        let cell = ExitCell::new();
        let waiter = tokio::spawn({
            let cell = cell.clone();
            async move { cell.wait().await }
        });
        cell.set(SandboxExit::OutOfMemory { limit_mib: 64 });
        cell.set(SandboxExit::Destroyed);
        assert_eq!(
            waiter.await.unwrap(),
            SandboxExit::OutOfMemory { limit_mib: 64 }
        );
        assert_eq!(cell.get(), Some(SandboxExit::OutOfMemory { limit_mib: 64 }));
    }

    #[tokio::test]
    async fn readiness_stops_when_the_sandbox_ends() {
        let cell = ExitCell::new();
        let c2 = cell.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            c2.set(SandboxExit::Destroyed);
        });
        let r = poll_ready(&cell, Duration::from_secs(60), || async { false }).await;
        assert!(matches!(r, Err(NotReady::Ended(SandboxExit::Destroyed))));
        let mut n = 0;
        let ok = poll_ready(&ExitCell::new(), Duration::from_secs(60), || {
            n += 1;
            let done = n >= 3;
            async move { done }
        })
        .await;
        assert!(ok.is_ok());
    }
}
