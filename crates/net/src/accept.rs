//! Accepting (and receiving) without spinning: the DNS server and the Host/SNI proxy loop
//! on `accept`/`recv_from`, and an error such as EMFILE (out of descriptors) comes back at
//! once for as long as it lasts. Retrying straight away would burn a core on the host
//! exactly when it is short of resources, so a failed call sleeps first, twice as long
//! after each failure in a row (from [`FIRST_DELAY`] to [`MAX_DELAY`]), and a success
//! resets the delay. The guest agent's accept loop does the same with a fixed pause
//! (crates/agent/src/server.rs); it cannot share this code (it depends on proto only).

use std::future::Future;
use std::io;
use std::time::Duration;

/// Pause after the first failure in a row.
pub(crate) const FIRST_DELAY: Duration = Duration::from_millis(5);
/// Longest pause: a listener recovers within a second of the descriptors coming back.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(1);

/// The delay before the next retry of one loop.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Self { next: FIRST_DELAY }
    }

    /// The pause to take now; doubles the next one, up to [`MAX_DELAY`].
    pub(crate) fn failed(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(MAX_DELAY);
        now
    }

    pub(crate) fn succeeded(&mut self) {
        self.next = FIRST_DELAY;
    }
}

/// Calls `op` until it succeeds, sleeping per `backoff` after each error.
pub(crate) async fn retry<T, F, Fut>(backoff: &mut Backoff, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = io::Result<T>>,
{
    loop {
        match op().await {
            Ok(v) => {
                backoff.succeeded();
                return v;
            }
            Err(_) => tokio::time::sleep(backoff.failed()).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn delay_doubles_to_the_cap_and_resets_on_success() {
        let mut b = Backoff::new();
        assert_eq!(b.failed(), FIRST_DELAY);
        assert_eq!(b.failed(), FIRST_DELAY * 2);
        assert_eq!(b.failed(), FIRST_DELAY * 4);
        for _ in 0..20 {
            b.failed();
        }
        assert_eq!(b.failed(), MAX_DELAY);
        b.succeeded();
        assert_eq!(b.failed(), FIRST_DELAY);
    }

    #[tokio::test]
    async fn retry_sleeps_between_errors_then_returns_the_success() {
        let mut b = Backoff::new();
        let mut calls = 0;
        let start = Instant::now();
        let v = retry(&mut b, || {
            calls += 1;
            let n = calls;
            async move {
                if n <= 3 {
                    Err(io::Error::from_raw_os_error(libc::EMFILE))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(v, 4);
        // Three failures: 5 + 10 + 20 ms of pauses, not a spin.
        assert!(start.elapsed() >= FIRST_DELAY * 7, "{:?}", start.elapsed());
        assert_eq!(b.failed(), FIRST_DELAY, "the success reset the delay");
    }
}
