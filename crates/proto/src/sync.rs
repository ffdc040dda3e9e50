//! A poison-tolerant lock. A panic while a lock is held (a bug, already reported by the
//! panic itself) must not take every later user of the lock down with it: the data behind
//! Sandcell's mutexes are maps and slots that stay consistent between statements.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the guard over from a poisoned lock.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_locks() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}
