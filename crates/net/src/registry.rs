//! The networks of one owner's sandboxes, by sandbox id, and that owner's warm pool.
//!
//! An owner (the daemon, `sandcell run`, a test) makes one [`NetRegistry`] and gives it to
//! the runtime it builds; the runtime makes a sandbox's network with
//! [`NetRegistry::attach`] (also for restores and fork children, which it makes itself)
//! and hands it out through the sandbox. The owner keeps a clone to take over the networks
//! of adopted sandboxes ([`NetRegistry::adopt`]), to tell which networks are in use at a
//! reconcile ([`NetRegistry::get_by_net`]) and to drain its pool at shutdown. A daemon that
//! wants networks ready ahead of time installs a [`NetPool`]: attach then takes from it.
//!
//! Owned rather than process-wide: two daemons (or a daemon and its tests) in one process
//! each see only their own networks and settings.

use crate::{EgressSpec, NetConfig, NetPool, Result, SandboxNet};
use sandcell_proto::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Clones share one registry.
#[derive(Clone, Default)]
pub struct NetRegistry {
    inner: Arc<Inner>,
}

#[derive(Default)]
pub(crate) struct Inner {
    pool: OnceLock<Arc<NetPool>>,
    live: Mutex<HashMap<String, SandboxNet>>,
}

impl Inner {
    fn live<T>(&self, f: impl FnOnce(&mut HashMap<String, SandboxNet>) -> T) -> T {
        f(&mut lock(&self.live))
    }

    /// Drops the entry of network `net_id` (its teardown calls this).
    pub(crate) fn forget_net(&self, net_id: &str) {
        self.live(|m| m.retain(|_, n| n.network().id != net_id));
    }
}

impl NetRegistry {
    /// An empty registry without a pool: every attach makes its network.
    pub fn new() -> NetRegistry {
        NetRegistry::default()
    }

    /// Makes `pool` this registry's pool (once; later calls are ignored and return false).
    pub fn install(&self, pool: Arc<NetPool>) -> bool {
        self.inner.pool.set(pool).is_ok()
    }

    pub fn pool(&self) -> Option<&Arc<NetPool>> {
        self.inner.pool.get()
    }

    /// Records `net` as sandbox `sandbox`'s; its teardown removes the entry again.
    fn register(&self, sandbox: &str, mut net: SandboxNet) -> SandboxNet {
        net.registry = Some(Arc::downgrade(&self.inner));
        self.inner
            .live(|m| m.insert(sandbox.to_string(), net.clone()));
        net
    }

    /// The network of sandbox `sandbox` with `spec` in force: from the installed pool when
    /// its address pool is `cfg`'s, else made now (named by the sandbox id).
    pub async fn attach(
        &self,
        cfg: &NetConfig,
        sandbox: &str,
        spec: &EgressSpec,
    ) -> Result<SandboxNet> {
        let net = match self.pool().filter(|p| p.config().pool == cfg.pool) {
            Some(pool) => {
                let net = pool.take().await?;
                if *spec != EgressSpec::default()
                    && let Err(e) = net.set_policy(spec).await
                {
                    let _ = net.teardown().await;
                    return Err(e);
                }
                net
            }
            None => SandboxNet::create(cfg, sandbox, spec).await?,
        };
        Ok(self.register(sandbox, net))
    }

    /// Registers network `net_id`, left running by a dead owner, as sandbox `sandbox`'s,
    /// with `spec` in force again and a new DNS server. `None` if it is gone.
    pub async fn adopt(
        &self,
        cfg: &NetConfig,
        sandbox: &str,
        net_id: &str,
        spec: &EgressSpec,
    ) -> Result<Option<SandboxNet>> {
        let net = SandboxNet::adopt(cfg, net_id, spec).await?;
        Ok(net.map(|n| self.register(sandbox, n)))
    }

    /// The network of sandbox `sandbox`, if it has one in this registry.
    pub fn get(&self, sandbox: &str) -> Option<SandboxNet> {
        self.inner.live(|m| m.get(sandbox).cloned())
    }

    /// The network whose id is `net_id`, if a sandbox of this registry has it.
    pub fn get_by_net(&self, net_id: &str) -> Option<SandboxNet> {
        self.inner
            .live(|m| m.values().find(|n| n.network().id == net_id).cloned())
    }

    /// Removes the network of sandbox `sandbox`, if it has one here. Idempotent.
    pub async fn release(&self, sandbox: &str) -> Result<()> {
        match self.inner.live(|m| m.remove(sandbox)) {
            Some(net) => net.teardown().await,
            None => Ok(()),
        }
    }
}

/// What a registered network keeps of its registry: a weak reference, so that a network
/// outliving its registry (a clone held by a task) does not keep the registry alive.
pub(crate) type Owner = Option<Weak<Inner>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pool: &str) -> NetConfig {
        NetConfig {
            pool: pool.parse().unwrap_or_else(|e| panic!("{pool}: {e}")),
            upstream_dns: Vec::new(),
            allow_private: Default::default(),
        }
    }

    /// Two owners in one process: a pool installed in one is not the other's, and clones
    /// share theirs.
    #[test]
    fn registries_do_not_share_pools() {
        let a = NetRegistry::new();
        let b = NetRegistry::new();
        // Target 0: no filler task, so no tokio runtime is needed.
        assert!(a.install(NetPool::start(config("10.201.0.0/16"), "ta", 0)));
        assert!(!a.install(NetPool::start(config("10.202.0.0/16"), "ta", 0)));
        assert!(b.pool().is_none());
        assert!(b.install(NetPool::start(config("10.203.0.0/16"), "tb", 0)));
        let pool_of = |r: &NetRegistry| r.pool().map(|p| p.config().pool);
        assert_eq!(pool_of(&a.clone()), Some(config("10.201.0.0/16").pool));
        assert_eq!(pool_of(&b), Some(config("10.203.0.0/16").pool));
        assert!(a.get("sc-1").is_none() && b.get_by_net("tb000000000000").is_none());
    }
}
