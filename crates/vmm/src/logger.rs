//! The VMM's log lines are `tracing` events (`tracing::warn!` and friends at the call sites);
//! this installs the subscriber once at startup: plain text on stderr, which the supervisor
//! captures. The level comes from `SANDCELL_VMM_LOG` (error, warn, info, debug, or
//! `RUST_LOG`-style directives; default warn). No JSON and no ANSI colours: the VMM logs
//! little, and a lean process is worth more than a configurable one.

use tracing_subscriber::EnvFilter;

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
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_garbage_levels_fall_back_to_warn() {
        assert_eq!(filter_from(None).to_string(), "warn");
        assert_eq!(filter_from(Some("debug")).to_string(), "debug");
        assert_eq!(filter_from(Some("no=such=level")).to_string(), "warn");
    }
}
