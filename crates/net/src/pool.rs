//! A warm pool of prepared sandbox networks, so that making a sandbox does not wait for the
//! ~10 `ip`/`nft` processes a network costs: namespace, veth, open policy and DNS server
//! are ready; taking one is a queue pop, and only a non-default policy costs one `nft`
//! transaction ([`SandboxNet::set_policy`]).
//!
//! Networks are named `<prefix><12 hex digits>`: an owner gives its own prefix, so that
//! [`crate::reconcile`] at its start can remove its leftovers (prepared or used) and leave
//! the networks of other owners on the host alone.

use crate::{EgressSpec, Error, NetConfig, Result, SandboxNet};
use sandcell_proto::sync::lock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// After a failed preparation (pool exhausted, `ip` missing): wait before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// After a take, the refill waits this long (unless the pool ran dry): its `ip`/`nft`
/// processes would otherwise compete with the very create that took the network.
const REFILL_DELAY: Duration = Duration::from_millis(500);

pub struct NetPool {
    cfg: NetConfig,
    prefix: String,
    target: usize,
    ready: Mutex<VecDeque<SandboxNet>>,
    wake: Arc<Notify>,
    /// Set by [`NetPool::drain`]: the filler stops and removes what it was making.
    closed: AtomicBool,
    filler: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for NetPool {
    fn drop(&mut self) {
        // Lets the filler see that the pool is gone.
        self.wake.notify_one();
    }
}

impl NetPool {
    /// A pool keeping `target` networks ready (0: none, every take creates one), filled by
    /// a background task that ends when the pool is dropped.
    pub fn start(cfg: NetConfig, prefix: &str, target: usize) -> Arc<NetPool> {
        let pool = Arc::new(NetPool {
            cfg,
            prefix: prefix.to_string(),
            target,
            ready: Mutex::new(VecDeque::new()),
            wake: Arc::new(Notify::new()),
            closed: AtomicBool::new(false),
            filler: Mutex::new(None),
        });
        if target > 0 {
            let task = tokio::spawn(fill(Arc::downgrade(&pool), pool.wake.clone()));
            *lock(&pool.filler) = Some(task);
        }
        pool
    }

    pub fn config(&self) -> &NetConfig {
        &self.cfg
    }

    /// Whether network `id` is one of this owner's (by its prefix).
    pub fn owns(&self, id: &str) -> bool {
        id.starts_with(&self.prefix)
    }

    fn new_id(&self) -> Result<String> {
        let hex = sandcell_proto::random::hex(6)
            .map_err(|e| Error::io("getrandom for a network id", e))?;
        Ok(format!("{}{hex}", self.prefix))
    }

    fn pop(&self) -> Option<SandboxNet> {
        lock(&self.ready).pop_front()
    }

    fn len(&self) -> usize {
        lock(&self.ready).len()
    }

    /// A network with the open policy and no peers: a prepared one, or a new one when none
    /// is ready.
    pub async fn take(&self) -> Result<SandboxNet> {
        let got = self.pop();
        self.wake.notify_one();
        match got {
            Some(net) => Ok(net),
            None => SandboxNet::create(&self.cfg, &self.new_id()?, &EgressSpec::default()).await,
        }
    }

    /// Removes the prepared networks (at shutdown; a crash leaves them to `reconcile`).
    pub async fn drain(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        let filler = lock(&self.filler).take();
        if let Some(task) = filler {
            let _ = task.await;
        }
        while let Some(net) = self.pop() {
            let _ = net.teardown().await;
        }
    }
}

async fn fill(pool: Weak<NetPool>, wake: Arc<Notify>) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        if p.closed.load(Ordering::SeqCst) {
            return;
        }
        if p.len() >= p.target {
            drop(p);
            wake.notified().await;
            let Some(p) = pool.upgrade() else { return };
            let dry = p.len() == 0;
            drop(p);
            if !dry {
                tokio::time::sleep(REFILL_DELAY).await;
            }
            continue;
        }
        let made = match p.new_id() {
            Ok(id) => SandboxNet::create(&p.cfg, &id, &EgressSpec::default()).await,
            Err(e) => Err(e),
        };
        match made {
            Ok(net) if p.closed.load(Ordering::SeqCst) => {
                let _ = net.teardown().await;
                return;
            }
            Ok(net) => lock(&p.ready).push_back(net),
            Err(e) => {
                tracing::warn!("preparing a sandbox network for the pool: {e}");
                drop(p);
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}
