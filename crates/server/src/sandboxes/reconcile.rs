//! Restart re-adoption: what a starting daemon does with the sandboxes the previous one left
//! (see service.rs's crash-consistency notes for why each case is safe).

use crate::error::Error;
use crate::sandboxes::service::{DESTROY_TIMEOUT, Live, SandboxService, lock};
use crate::store::State;
use crate::util::{now_ms, rfc3339};
use sandcell_runtime::{Sandbox, SandboxHandle};
use std::sync::Arc;

impl SandboxService {
    /// At start: takes over the sandboxes the previous daemon left running (adopting them
    /// through their stored handle), finishes interrupted kills, marks the rest `error`
    /// and removes every leftover nobody adopted. Returns (adopted, lost) ids.
    pub async fn reconcile(self: &Arc<Self>) -> Result<(Vec<String>, Vec<String>), Error> {
        let stale = self.db.sandboxes_in(None, &State::LIVE).await?;
        let mut adopted = Vec::new();
        let mut lost = Vec::new();
        for row in stale {
            let handle = row
                .handle
                .as_deref()
                .and_then(|h| serde_json::from_str::<SandboxHandle>(h).ok());
            let found = match &handle {
                Some(h) => Some(self.runtime.adopt(h).await),
                None => None,
            };
            let now = now_ms();
            match (row.state, found) {
                (State::Running, Some(Ok(sandbox))) => {
                    let sandbox: Arc<dyn Sandbox> = Arc::from(sandbox);
                    lock(&self.live).insert(
                        row.id.clone(),
                        Arc::new(Live {
                            sandbox: sandbox.clone(),
                            access_token: row.access_token.clone(),
                        }),
                    );
                    if let Err(e) = self.networks.adopt(&self.db, &row.id).await {
                        tracing::warn!("sandbox {}: its network: {e}", row.id);
                    }
                    self.watch(row.id.clone(), sandbox);
                    adopted.push(row.id);
                }
                (State::Killing, Some(Ok(sandbox))) => {
                    // The previous daemon died while killing it: finish.
                    let end = match tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await {
                        Ok(Ok(())) => (State::Killed, None),
                        Ok(Err(e)) => (State::Error, Some(format!("removing it failed: {e}"))),
                        Err(_) => (State::Error, Some("removing it timed out".to_string())),
                    };
                    self.db
                        .transition(&row.id, &[State::Killing], end.0, end.1.as_deref(), now)
                        .await?;
                }
                // Paused ones have no process: their snapshot waits for a resume (snapshots/pause.rs).
                (State::Paused | State::Pausing | State::Resuming, found) => {
                    self.reconcile_paused(&row, found).await?;
                }
                (state, found) => {
                    let why = match found {
                        Some(Err(e)) => e.to_string(),
                        Some(Ok(sandbox)) => {
                            // Adopted in a state this daemon cannot continue: stop it.
                            let _ = tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await;
                            format!("found {} after a restart", state.as_str())
                        }
                        None => "it had not finished starting".to_string(),
                    };
                    let reason = format!(
                        "lost: the daemon stopped at or before {} while the sandbox was {}: {why}",
                        rfc3339(now),
                        state.as_str()
                    );
                    // Nobody saw when it ended: bill it up to the last flush only.
                    self.db.close_usage_at_last_flush(&row.id).await?;
                    if state == State::Killing {
                        // It was being killed anyway.
                        self.db
                            .transition(
                                &row.id,
                                &[State::Killing],
                                State::Killed,
                                Some(&reason),
                                now,
                            )
                            .await?;
                    } else if self
                        .db
                        .transition(&row.id, &[state], State::Error, Some(&reason), now)
                        .await?
                    {
                        lost.push(row.id);
                    }
                }
            }
        }
        match self.runtime.sweep_unadopted().await {
            Ok(cleaned) if !cleaned.is_empty() => tracing::info!(
                "removed leftovers of {} sandbox(es): {}",
                cleaned.len(),
                cleaned.join(", ")
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!("sweeping leftovers: {e}"),
        }
        match self.networks.reconcile_host().await {
            Ok(removed) if !removed.is_empty() => tracing::info!(
                "removed {} leftover network(s): {}",
                removed.len(),
                removed.join(", ")
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!("removing leftover networks: {e}"),
        }
        // The adopted sandboxes' private-network peers: nftables kept them, the new DNS
        // servers know no peer names yet.
        if let Err(e) = self.networks.refresh_peers(&self.db).await {
            tracing::warn!("restoring private-network peers: {e}");
        }
        // Template snapshots of templates rebuilt or removed without the daemon.
        crate::templates::memory_snapshot::retire_orphans(self).await;
        self.collect_snapshots().await;
        self.remove_orphan_snapshot_dirs().await;
        self.db.flush_usage(now_ms()).await?;
        Ok((adopted, lost))
    }
}
