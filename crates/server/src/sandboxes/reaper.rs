//! The reaper: kills (or pauses, with `autoPause`) sandboxes past their timeout or whose key
//! was revoked, and flushes the metering of running ones.

use crate::sandboxes::service::SandboxService;
use crate::util::now_ms;
use std::sync::Arc;
use std::time::Duration;

/// How often the reaper looks for sandboxes to end.
const REAP_INTERVAL: Duration = Duration::from_millis(250);

impl SandboxService {
    /// Kills sandboxes past their timeout (or whose key was revoked), forever.
    pub async fn reap_forever(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REAP_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flushed = std::time::Instant::now();
        loop {
            tick.tick().await;
            if flushed.elapsed() >= crate::sandboxes::metering::FLUSH_INTERVAL {
                flushed = std::time::Instant::now();
                if let Err(e) = self.db.flush_usage(now_ms()).await {
                    eprintln!("sandcell serve: metering: {e}");
                }
            }
            let due = match self.db.due_for_kill(now_ms()).await {
                Ok(due) => due,
                Err(e) => {
                    eprintln!("sandcell serve: reaper: {e}");
                    continue;
                }
            };
            for (id, reason) in due {
                let this = self.clone();
                // In parallel: one slow destroy must not hold the others past their time.
                tokio::spawn(async move {
                    // Pauses instead where the sandbox was created with autoPause.
                    if let Err(e) = this.expire(&id, reason).await {
                        eprintln!("sandcell serve: killing sandbox {id} ({reason}): {e}");
                    }
                });
            }
        }
    }
}
