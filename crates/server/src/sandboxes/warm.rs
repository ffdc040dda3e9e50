//! The warm pool (gvisor, `serve --warm N`): booted, idle sandboxes of one template at the
//! default size, each in its own network with no egress, that a create takes instead of
//! booting one (sandboxes/create.rs).
//!
//! A pooled sandbox has no row: no key lists it, it counts against no quota and is not
//! metered. A create that takes one gives it its row under the sandbox's own id (its
//! hostname, container and network are named after it), its identity through the agent's
//! `/init` (env vars, access token, default user and workdir, clock, fresh entropy: the
//! same `/init` every booted create gets, in finish_create), and the request's egress rules
//! and private networks, recorded and put in force before it answers.
//!
//! Restarts: the pool lives in this daemon's memory only. Pooled sandboxes are started like
//! any sandbox (detached, so that one handed out survives a restart), but with no row the
//! next daemon's reconcile never adopts one: its sweep removes them and their networks, so
//! they neither leak nor get handed out stale. A graceful stop destroys them
//! ([`SandboxService::drain_warm`]), the one being booted at that moment included: the stop
//! waits for that boot and no other starts after it.
//!
//! Refill: one boot at a time in the background after each take, never more than the
//! memory cap (`--warm-memory`) allows; a create finding the pool empty boots as before
//! (`sandcell_warm_pool_misses_total`).

use crate::error::Error;
use crate::sandboxes::error::{InitError, SandboxError};
use crate::sandboxes::service::{
    DEFAULT_MEMORY_MIB, DEFAULT_VCPUS, DESTROY_TIMEOUT, SandboxService, lock, resolve_template,
};
use sandcell_runtime::net::EgressSpec;
use sandcell_runtime::{NetworkSpec, RuntimeKind, Sandbox, SandboxSpec};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A failed refill boot waits this long before the next try (a missing template, a full
/// host: not worth a busy loop).
const REFILL_BACKOFF: Duration = Duration::from_secs(5);

/// How long a stop waits for a refill boot under way (then the next daemon's sweep removes
/// what it left).
const STOP_WAIT: Duration = Duration::from_secs(30);

/// How often a pool whose template is not installed looks again.
const TEMPLATE_MISSING_RECHECK: Duration = Duration::from_secs(30);
/// How long an idle sandbox's agent has to take the egress CA ([`preinstall_egress_ca`]).
const PREINSTALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `serve --warm`, `--warm-memory`, `--warm-template` (the daemon's default is 2 idle
/// sandboxes; this struct's, for services made in tests, none).
#[derive(Debug, Clone)]
pub struct WarmConfig {
    /// Idle sandboxes kept; 0: no pool.
    pub count: usize,
    /// Most memory the idle sandboxes may be given, in MiB.
    pub memory_mib: u64,
    /// The template they boot.
    pub template: String,
}

impl Default for WarmConfig {
    fn default() -> Self {
        WarmConfig {
            count: 0,
            memory_mib: 2048,
            template: "base".into(),
        }
    }
}

/// The idle sandboxes and the pool's counters.
#[derive(Default)]
pub struct WarmPool {
    idle: std::sync::Mutex<Vec<Arc<dyn Sandbox>>>,
    /// Woken after a take (a refill is due).
    wake: tokio::sync::Notify,
    /// Creates served from the pool.
    pub hits: AtomicU64,
    /// Creates the pool could have served but found empty.
    pub misses: AtomicU64,
    /// Held while a refill boots; a stop takes it to wait for that boot.
    booting: tokio::sync::Mutex<()>,
    /// Set by a stop: no refill boots after it.
    stopped: AtomicBool,
}

impl WarmPool {
    /// Idle sandboxes now.
    pub fn idle(&self) -> usize {
        lock(&self.idle).len()
    }
}

impl SandboxService {
    /// How many idle sandboxes the pool keeps: `--warm`, bounded by `--warm-memory`; 0 but
    /// on gvisor (the microvm runtime has its own pool of VMMs).
    pub fn warm_target(&self) -> usize {
        let cfg = &self.config.warm;
        if self.runtime.kind() != RuntimeKind::Gvisor {
            return 0;
        }
        let by_memory = cfg.memory_mib / u64::from(DEFAULT_MEMORY_MIB);
        cfg.count
            .min(usize::try_from(by_memory).unwrap_or(usize::MAX))
    }

    /// Memory given to the idle sandboxes, in MiB (`sandcell_warm_pool_memory_mib`).
    pub fn warm_memory_mib(&self) -> u64 {
        self.warm.idle() as u64 * u64::from(DEFAULT_MEMORY_MIB)
    }

    /// Whether a create of `template` at this size could be served from the pool (the
    /// caller has checked it is a plain image template: no memory snapshot, no start
    /// command).
    pub(crate) fn warm_fits(&self, template: &str, vcpus: u32, memory_mib: u32) -> bool {
        self.warm_target() > 0
            && template == self.config.warm.template
            && vcpus == u32::from(DEFAULT_VCPUS)
            && memory_mib == DEFAULT_MEMORY_MIB
    }

    /// An idle sandbox that is still running, or `None` (counted as a miss); a refill is
    /// started either way.
    pub(crate) fn take_warm(&self) -> Option<Arc<dyn Sandbox>> {
        let mut dead = Vec::new();
        let found = {
            let mut idle = lock(&self.warm.idle);
            let mut found = None;
            while let Some(sb) = idle.pop() {
                if ended(&sb) {
                    dead.push(sb);
                } else {
                    found = Some(sb);
                    break;
                }
            }
            found
        };
        for sb in dead {
            tracing::warn!("warm sandbox {} ended while idle", sb.id());
            self.destroy_warm(sb);
        }
        match &found {
            Some(_) => self.warm.hits.fetch_add(1, Ordering::Relaxed),
            None => self.warm.misses.fetch_add(1, Ordering::Relaxed),
        };
        self.warm.wake.notify_one();
        found
    }

    /// Keeps the pool filled, one boot at a time, until the daemon stops.
    pub fn start_warm_pool(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        if self.warm_target() == 0 {
            return None;
        }
        let this = self.clone();
        Some(tokio::spawn(async move {
            loop {
                while this.warm.idle() < this.warm_target() {
                    // A daemon without the template (test daemons with `minimal` only):
                    // nothing to boot until it is installed; no warning every few seconds.
                    if !this.dirs.images().join(&this.config.warm.template).is_dir() {
                        tracing::debug!(
                            "warm pool: template {} is not installed",
                            this.config.warm.template
                        );
                        tokio::time::sleep(TEMPLATE_MISSING_RECHECK).await;
                        continue;
                    }
                    let booting = this.warm.booting.lock().await;
                    if this.warm.stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    // Pushed while `booting` is held: a stop then finds it in `idle`.
                    let booted = this.boot_warm().await;
                    match booted {
                        Ok(sb) => lock(&this.warm.idle).push(sb),
                        Err(e) => {
                            drop(booting);
                            tracing::warn!("warm pool: booting a sandbox: {e}");
                            tokio::time::sleep(REFILL_BACKOFF).await;
                        }
                    }
                }
                this.warm.wake.notified().await;
            }
        }))
    }

    /// Boots one idle sandbox of the pool's template at the default size, in a network with
    /// no egress at all (the create that takes it puts its own rules in force).
    async fn boot_warm(&self) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let image = resolve_template(&self.dirs, &self.config.warm.template)?;
        let id = sandcell_runtime::new_sandbox_id().map_err(Error::from)?;
        let mut spec = SandboxSpec::new(id, image);
        spec.vcpus = DEFAULT_VCPUS;
        spec.memory_mib = DEFAULT_MEMORY_MIB;
        // As a booted create's (create.rs): once handed out it must survive a restart.
        spec.outlive_owner = true;
        spec.disk_mib = self.sandbox_disk_mib();
        spec.network = self.networks.settings().map(|s| NetworkSpec {
            egress: EgressSpec {
                allow_internet_access: false,
                allow_out: Vec::new(),
                deny_out: Vec::new(),
                rules: Default::default(),
            },
            config: s.config.clone(),
        });
        let sandbox: Arc<dyn Sandbox> =
            Arc::from(self.runtime.create(spec).await.map_err(Error::from)?);
        // A sandbox that did not start or take the CA goes with its network: the runtime's
        // create reserved the network's addresses, and destroy_warm releases them too.
        if let Err(e) = sandbox.start().await {
            self.destroy_warm(sandbox);
            return Err(Error::from(e).into());
        }
        if let Err(e) = preinstall_egress_ca(&sandbox).await {
            self.destroy_warm(sandbox);
            return Err(e);
        }
        Ok(sandbox)
    }

    /// An unused pooled sandbox back into the pool (a refused create took it).
    pub(crate) fn put_back_warm(&self, sb: Arc<dyn Sandbox>) {
        if self.warm.stopped.load(Ordering::SeqCst) {
            // Drained already: nothing would destroy it.
            self.destroy_warm(sb);
            return;
        }
        lock(&self.warm.idle).push(sb);
    }

    /// A pooled sandbox that must not serve another create, destroyed (in the background).
    pub(crate) fn discard_warm(&self, sb: Arc<dyn Sandbox>) {
        self.destroy_warm(sb);
    }

    /// Destroys a pooled sandbox and its network in the background.
    fn destroy_warm(&self, sb: Arc<dyn Sandbox>) {
        let registry = self.networks.registry().clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(DESTROY_TIMEOUT, sb.destroy()).await;
            let _ = registry.release(sb.id()).await;
        });
    }

    /// The pool's gauges and counters in the `/metrics` exposition.
    pub fn render_warm(&self, out: &mut String) {
        use std::fmt::Write as _;
        let lines = [
            (
                "sandcell_warm_pool_target",
                "gauge",
                "Idle sandboxes the warm pool keeps.",
                self.warm_target() as u64,
            ),
            (
                "sandcell_warm_pool_idle",
                "gauge",
                "Idle sandboxes in the warm pool now.",
                self.warm.idle() as u64,
            ),
            (
                "sandcell_warm_pool_memory_mib",
                "gauge",
                "Memory given to the warm pool's idle sandboxes, MiB.",
                self.warm_memory_mib(),
            ),
            (
                "sandcell_warm_pool_hits_total",
                "counter",
                "Creates served from the warm pool.",
                self.warm.hits.load(Ordering::Relaxed),
            ),
            (
                "sandcell_warm_pool_misses_total",
                "counter",
                "Creates the warm pool could serve but found empty (booted instead).",
                self.warm.misses.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, help, value) in lines {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
    }

    /// On a graceful stop: the idle sandboxes go with the daemon (they are no one's).
    pub async fn drain_warm(&self) {
        // Stopped first, then the boot under way (if any) is waited for: its sandbox is in
        // `idle` when the lock is ours, and no refill boots after.
        self.warm.stopped.store(true, Ordering::SeqCst);
        let _no_boot = tokio::time::timeout(STOP_WAIT, self.warm.booting.lock()).await;
        let idle: Vec<_> = std::mem::take(&mut *lock(&self.warm.idle));
        for sb in idle {
            let _ = tokio::time::timeout(DESTROY_TIMEOUT, sb.destroy()).await;
            let _ = self.networks.registry().release(sb.id()).await;
        }
    }
}

/// The egress CA (when the daemon intercepts TLS to inject secrets) into the idle
/// sandbox's trust store, ahead of the create: the agent rewrites the store only when the
/// CA differs, so the create's own `/init`, which sends it again, skips the ~9 ms this
/// takes under gVisor. This `/init` carries nothing else: no identity, token or env, which
/// the create's `/init` gives.
async fn preinstall_egress_ca(sandbox: &Arc<dyn Sandbox>) -> Result<(), SandboxError> {
    let Some(ca) = sandcell_runtime::net::intercept::sandbox_ca_pem() else {
        return Ok(());
    };
    let body = serde_json::json!({ "sandcellCaBundle": ca });
    let answer = tokio::time::timeout(
        PREINSTALL_TIMEOUT,
        crate::http::proxy::post_json(sandbox, sandcell_runtime::AGENT_PORT, "/init", &body),
    )
    .await;
    let id = sandbox.id().to_string();
    match answer {
        Ok(Ok((status, _))) if status.is_success() => Ok(()),
        Ok(Ok((status, _))) => Err(InitError::Refused { id, status }.into()),
        Ok(Err(e)) => Err(InitError::Unreachable(e).into()),
        Err(_) => Err(InitError::Timeout {
            id,
            after: PREINSTALL_TIMEOUT,
        }
        .into()),
    }
}

/// Whether a sandbox has ended (its `wait` is ready at the first poll: it resolves at once
/// for an ended sandbox, and polling it once has no effect on one that runs).
fn ended(sb: &Arc<dyn Sandbox>) -> bool {
    let mut wait = sb.wait();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    wait.as_mut().poll(&mut cx).is_ready()
}
