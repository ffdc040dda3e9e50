//! How the VM ends: the first reason recorded wins, and the VMM thread is woken to tear
//! down the vCPUs and leave with that reason's exit status.

use sandcell_proto::sync::lock;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use sandcell_proto::vmm::ExitStatus;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

pub struct ExitLatch {
    set: AtomicBool,
    reason: Mutex<Option<(ExitStatus, String)>>,
    evt: EventFd,
}

impl ExitLatch {
    pub fn new() -> std::io::Result<ExitLatch> {
        Ok(ExitLatch {
            set: AtomicBool::new(false),
            reason: Mutex::new(None),
            evt: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Records `status` unless a reason was already recorded; wakes the VMM thread.
    /// Returns whether this call was the one that decided.
    pub fn request(&self, status: ExitStatus, message: impl Into<String>) -> bool {
        let mut reason = lock(&self.reason);
        if reason.is_some() {
            return false;
        }
        *reason = Some((status, message.into()));
        self.set.store(true, Ordering::Release);
        // A failed eventfd write means the counter is saturated: the VMM thread is woken
        // either way.
        let _ = self.evt.write(1);
        true
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    pub fn reason(&self) -> Option<(ExitStatus, String)> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn event_fd(&self) -> &EventFd {
        &self.evt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reason_wins() {
        let l = ExitLatch::new().expect("eventfd");
        assert!(!l.is_set());
        assert!(l.request(ExitStatus::PowerOff, "off"));
        assert!(!l.request(ExitStatus::TripleFault, "later"));
        assert!(l.is_set());
        assert_eq!(l.reason(), Some((ExitStatus::PowerOff, "off".to_string())));
        assert_eq!(l.event_fd().read().expect("woken"), 1);
    }
}
