//! The VMM's log lines are `tracing` events (`tracing::warn!` and friends at the call sites);
//! this installs the subscriber once at startup: plain text on stderr, which the supervisor
//! captures. The level comes from `SANDCELL_VMM_LOG` (error, warn, info, debug, or
//! `RUST_LOG`-style directives; default warn). No JSON and no ANSI colours: the VMM logs
//! little, and a lean process is worth more than a configurable one.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Most bytes of log lines the VMM writes in its life. Some lines are a guest's doing (a
/// device it breaks after each reset logs each time), and the log is a host file: past this
/// it says so once and drops the rest.
pub const MAX_LOG_BYTES: u64 = 4 << 20;
const LIMIT_LINE: &[u8] = b"sandcell-vmm: log limit reached; later lines are dropped\n";

/// Makes writers to `sink` that share one byte budget.
#[derive(Clone)]
pub struct BoundedLog<F> {
    sink: F,
    written: Arc<AtomicU64>,
    limit: u64,
}

impl<F> BoundedLog<F> {
    pub fn new(sink: F, limit: u64) -> Self {
        BoundedLog {
            sink,
            written: Arc::new(AtomicU64::new(0)),
            limit,
        }
    }
}

/// One event's writer: the formatter hands it the whole line in one `write`.
pub struct BoundedWriter<W> {
    inner: W,
    written: Arc<AtomicU64>,
    limit: u64,
}

impl<W: Write> Write for BoundedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let len = buf.len() as u64;
        let before = self.written.fetch_add(len, Ordering::Relaxed);
        if before.saturating_add(len) <= self.limit {
            self.inner.write_all(buf)?;
        } else if before <= self.limit {
            // The first line over the budget: said once, in its place.
            self.inner.write_all(LIMIT_LINE)?;
        }
        // Dropped lines are "written": a logger that errors would only retry or complain.
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<'a, F, W> MakeWriter<'a> for BoundedLog<F>
where
    F: Fn() -> W + 'static,
    W: Write,
{
    type Writer = BoundedWriter<W>;

    fn make_writer(&'a self) -> Self::Writer {
        BoundedWriter {
            inner: (self.sink)(),
            written: self.written.clone(),
            limit: self.limit,
        }
    }
}

/// The filter `SANDCELL_VMM_LOG` asks for, warn when it is unset or not understood.
fn filter_from(value: Option<&str>) -> EnvFilter {
    value
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new("warn"))
}

/// Reads `SANDCELL_VMM_LOG` and installs the subscriber (a second call is a no-op).
pub fn init_from_env() {
    let filter = filter_from(std::env::var("SANDCELL_VMM_LOG").ok().as_deref());
    // `try_init` fails only when a subscriber is already set (tests, a second call): fine.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(BoundedLog::new(std::io::stderr, MAX_LOG_BYTES))
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Shared(Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_past_the_budget_are_dropped_after_one_notice() {
        let out = Shared::default();
        let sink = out.clone();
        let log = BoundedLog::new(move || sink.clone(), 25);
        for line in ["first line\n", "second line\n", "third line\n", "fourth\n"] {
            log.make_writer().write_all(line.as_bytes()).unwrap();
        }
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let notice = std::str::from_utf8(LIMIT_LINE).unwrap();
        assert_eq!(text, format!("first line\nsecond line\n{notice}"));
    }

    #[test]
    fn unset_or_garbage_levels_fall_back_to_warn() {
        assert_eq!(filter_from(None).to_string(), "warn");
        assert_eq!(filter_from(Some("debug")).to_string(), "debug");
        assert_eq!(filter_from(Some("no=such=level")).to_string(), "warn");
    }
}
