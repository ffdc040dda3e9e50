//! Creates under way when the daemon stops. A create is minutes of work at worst (a boot, a
//! template's start and ready commands) that holds a sandbox nobody has recorded as running
//! yet; a daemon that exited under it would leave that sandbox's mounts and files for its next
//! start to sweep, and with `--kill-on-exit` there may be no next start. So a stopping daemon
//! refuses new creates, lets the ones under way end (killed sandboxes make theirs end early:
//! `SandboxService::shutdown`), and only then kills what is left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// The creates under way, and whether the daemon is stopping.
pub struct Creates {
    stopping: AtomicBool,
    active: watch::Sender<usize>,
}

impl Default for Creates {
    fn default() -> Self {
        Creates {
            stopping: AtomicBool::new(false),
            active: watch::Sender::new(0),
        }
    }
}

/// One create under way; dropped when it ends, however it ends.
pub struct CreateGuard<'a> {
    creates: &'a Creates,
}

impl Drop for CreateGuard<'_> {
    fn drop(&mut self) {
        self.creates.active.send_modify(|n| *n -= 1);
    }
}

impl Creates {
    /// A create begins; `None` once the daemon is stopping.
    pub fn enter(&self) -> Option<CreateGuard<'_>> {
        // Counted before the check: a `stop` that lands between the two sees this create in
        // `settled` (and this create, seeing `stopping`, ends at once).
        self.active.send_modify(|n| *n += 1);
        let guard = CreateGuard { creates: self };
        (!self.stopping.load(Ordering::SeqCst)).then_some(guard)
    }

    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Waits until no create is under way, for at most `within`; false when some still are.
    pub async fn settled(&self, within: Duration) -> bool {
        let mut rx = self.active.subscribe();
        tokio::time::timeout(within, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    pub fn under_way(&self) -> usize {
        *self.active.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stopped_gate_refuses_creates_and_waits_for_the_ones_under_way() {
        let creates = std::sync::Arc::new(Creates::default());
        let first = creates.enter().expect("not stopping yet");
        assert_eq!(creates.under_way(), 1);
        creates.stop();
        assert!(creates.enter().is_none(), "a create after stop is refused");
        assert_eq!(creates.under_way(), 1, "the refused one is not counted");
        assert!(!creates.settled(Duration::from_millis(50)).await);
        let waiter = {
            let creates = creates.clone();
            tokio::spawn(async move { creates.settled(Duration::from_secs(10)).await })
        };
        drop(first);
        assert!(waiter.await.expect("the waiter ran"));
    }
}
