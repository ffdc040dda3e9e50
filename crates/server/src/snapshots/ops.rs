//! One operation at a time per sandbox: pauses, resumes, snapshots, forks and kills of the
//! same sandbox wait for each other (snapshots/pause.rs, fork.rs; sandboxes/service.rs).

use crate::sandboxes::service::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type OpMap = Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// One lock per sandbox for its pauses, resumes, snapshots, forks and kills (one daemon's:
/// [`SandboxService`](crate::sandboxes::service::SandboxService) owns it).
#[derive(Default)]
pub struct OpLocks {
    ops: Arc<OpMap>,
}

/// Held while one pause, resume, snapshot, fork or kill of sandbox `id` runs.
pub struct OpGuard {
    id: String,
    ops: Arc<OpMap>,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        // The map only keeps entries someone holds or waits for.
        let mut ops = lock(&self.ops);
        if let Some(m) = ops.get(&self.id)
            && Arc::strong_count(m) <= 2
        {
            ops.remove(&self.id);
        }
    }
}

impl OpLocks {
    /// Waits until no other operation of sandbox `id` runs.
    pub async fn lock(&self, id: &str) -> OpGuard {
        let m = lock(&self.ops)
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone();
        OpGuard {
            id: id.to_string(),
            ops: self.ops.clone(),
            _guard: m.lock_owned().await,
        }
    }
}
