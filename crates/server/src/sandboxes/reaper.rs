//! The reaper: kills (or pauses, with `autoPause`) sandboxes past their timeout or whose key
//! was revoked, and flushes the metering of running ones.

use crate::sandboxes::service::SandboxService;
use crate::util::now_ms;
use std::sync::Arc;
use std::time::Duration;

/// How often the reaper looks for sandboxes to end.
const REAP_INTERVAL: Duration = Duration::from_millis(250);

impl SandboxService {
    /// Kills the running sandboxes that ran their longest lifetime (`--max-lifetime`,
    /// paused time not counted), whatever their timeout or `autoPause` say.
    async fn end_past_lifetime(self: &Arc<Self>) {
        let lifetime_ms =
            i64::try_from(self.max_lifetime_secs().saturating_mul(1000)).unwrap_or(i64::MAX);
        let ids = match self.db.past_lifetime(now_ms(), lifetime_ms).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!("reaper: {e}");
                return;
            }
        };
        for id in ids {
            let this = self.clone();
            tokio::spawn(async move {
                let reason = format!(
                    "it ran this server's longest sandbox lifetime ({} s)",
                    this.max_lifetime_secs()
                );
                match this.kill(&id, &reason).await {
                    Ok(true) => tracing::info!("sandbox {id}: killed: {reason}"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!("killing sandbox {id} ({reason}): {e}"),
                }
            });
        }
    }

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
                    tracing::warn!("metering: {e}");
                }
                self.end_past_lifetime().await;
            }
            let due = match self.db.due_for_kill(now_ms()).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!("reaper: {e}");
                    continue;
                }
            };
            for (id, reason) in due {
                let this = self.clone();
                // In parallel: one slow destroy must not hold the others past their time.
                tokio::spawn(async move {
                    // Pauses instead where the sandbox was created with autoPause.
                    if let Err(e) = this.expire(&id, reason).await {
                        tracing::warn!("killing sandbox {id} ({reason}): {e}");
                    }
                });
            }
        }
    }
}
