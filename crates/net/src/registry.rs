//! The networks of this process's sandboxes, by sandbox id, and the process's warm pool.
//!
//! Runtimes make a sandbox's network with [`attach`] (also for restores and fork children,
//! which the runtime makes itself); the daemon finds it again with [`get`] to change its
//! rules, read its log, set its private-network peers or reach its ports, without the
//! runtime having to hand it out. A daemon that wants networks ready ahead of time
//! [`install`]s a [`NetPool`]: [`attach`] then takes from it.

use crate::{EgressSpec, NetConfig, NetPool, Result, SandboxNet};
use sandcell_proto::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

static POOL: OnceLock<Arc<NetPool>> = OnceLock::new();
static LIVE: Mutex<Option<HashMap<String, SandboxNet>>> = Mutex::new(None);

fn live<T>(f: impl FnOnce(&mut HashMap<String, SandboxNet>) -> T) -> T {
    let mut guard = lock(&LIVE);
    f(guard.get_or_insert_with(HashMap::new))
}

/// Makes `pool` this process's pool (once; later calls are ignored and return false).
pub fn install(pool: Arc<NetPool>) -> bool {
    POOL.set(pool).is_ok()
}

pub fn pool() -> Option<&'static Arc<NetPool>> {
    POOL.get()
}

/// The network of sandbox `sandbox` with `spec` in force: from the installed pool when its
/// address pool is `cfg`'s, else made now (named by the sandbox id).
pub async fn attach(cfg: &NetConfig, sandbox: &str, spec: &EgressSpec) -> Result<SandboxNet> {
    let net = match POOL.get().filter(|p| p.config().pool == cfg.pool) {
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
    live(|m| m.insert(sandbox.to_string(), net.clone()));
    Ok(net)
}

/// Registers network `net_id`, left running by a dead owner, as sandbox `sandbox`'s, with
/// `spec` in force again and a new DNS server. `None` if it is gone.
pub async fn adopt(
    cfg: &NetConfig,
    sandbox: &str,
    net_id: &str,
    spec: &EgressSpec,
) -> Result<Option<SandboxNet>> {
    let net = SandboxNet::adopt(cfg, net_id, spec).await?;
    if let Some(n) = &net {
        live(|m| m.insert(sandbox.to_string(), n.clone()));
    }
    Ok(net)
}

/// The network of sandbox `sandbox`, if it has one in this process.
pub fn get(sandbox: &str) -> Option<SandboxNet> {
    live(|m| m.get(sandbox).cloned())
}

/// The network whose id is `net_id`, if a sandbox of this process has it.
pub fn get_by_net(net_id: &str) -> Option<SandboxNet> {
    live(|m| m.values().find(|n| n.network().id == net_id).cloned())
}

/// Removes the network of sandbox `sandbox`, if it has one here. Idempotent.
pub async fn release(sandbox: &str) -> Result<()> {
    match live(|m| m.remove(sandbox)) {
        Some(net) => net.teardown().await,
        None => Ok(()),
    }
}

/// Drops the entry of network `net_id` (its teardown calls this).
pub(crate) fn forget_net(net_id: &str) {
    live(|m| m.retain(|_, n| n.network().id != net_id));
}
