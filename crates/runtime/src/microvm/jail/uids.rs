//! A uid (and gid) per jailed VMM: leased from the base upwards, never one another VMM of
//! this process holds nor one any running process has.

use super::{JailError, UID_COUNT};
use sandcell_proto::sync::lock;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Uids leased to VMMs of this process, freed when their lease drops.
pub(super) static HELD: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
/// Where the next search starts: leases rotate through the range, so a uid just freed is
/// the last to be leased again.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// One VMM's uid, held until dropped.
#[derive(Debug)]
pub(super) struct UidLease(u32);

impl UidLease {
    pub(super) fn uid(&self) -> u32 {
        self.0
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        lock(&HELD).remove(&self.0);
    }
}

/// The first uid from offset `start` (wrapping in `base..base + count`) that `taken` refuses.
fn pick(base: u32, count: u32, start: u32, taken: impl Fn(u32) -> bool) -> Option<(u32, u32)> {
    (0..count)
        .map(|i| (start.wrapping_add(i)) % count)
        .find(|offset| !taken(base + offset))
        .map(|offset| (base + offset, offset))
}

/// The real uids of every running process (owners of `/proc/<pid>`).
fn running_uids() -> BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| e.metadata().ok().map(|m| m.uid()))
        .collect()
}

pub(super) fn lease_uid(base: u32) -> Result<UidLease, JailError> {
    let running = running_uids();
    let mut held = lock(&HELD);
    let start = NEXT.load(Ordering::Relaxed);
    let (uid, offset) = pick(base, UID_COUNT, start, |u| {
        held.contains(&u) || running.contains(&u)
    })
    .ok_or(JailError::NoFreeUid {
        base,
        end: u64::from(base) + u64::from(UID_COUNT),
    })?;
    held.insert(uid);
    NEXT.store((offset + 1) % UID_COUNT, Ordering::Relaxed);
    Ok(UidLease(uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_in_use_are_skipped_and_the_search_wraps() {
        assert_eq!(pick(100, 4, 0, |_| false), Some((100, 0)));
        assert_eq!(pick(100, 4, 1, |u| u == 101 || u == 102), Some((103, 3)));
        assert_eq!(pick(100, 4, 3, |u| u == 103), Some((100, 0)));
        assert_eq!(pick(100, 4, 0, |_| true), None);
    }

    #[test]
    fn a_leased_uid_is_not_leased_again_until_dropped() {
        // A base no process runs as (the test's own uids are far below).
        let base = 3_000_000_000;
        let a = lease_uid(base).expect("a uid");
        let b = lease_uid(base).expect("another uid");
        assert_ne!(a.uid(), b.uid());
        let (ua, ub) = (a.uid(), b.uid());
        drop(a);
        assert!(!lock(&HELD).contains(&ua));
        assert!(lock(&HELD).contains(&ub));
    }
}
