//! Sandbox lifecycle: create, kill, timeouts, unexpected ends, restart re-adoption.
//!
//! States and their allowed moves are in `sandboxes/state.rs`; every move is a conditional UPDATE
//! (`WHERE state IN (...)`) checked against that table, so two paths racing to end a
//! sandbox (a DELETE and the reaper) do the work once.
//!
//! Sandboxes outlive the daemon (the daemon is infrastructure: restarting it must not kill
//! user sandboxes): they are started with `outlive_owner`, and a restarted daemon adopts
//! them from the runtime handle stored with their row. `--kill-on-exit` kills them on a
//! graceful stop instead.
//!
//! Crash consistency: the database is written BEFORE each side effect it must survive.
//! - The `creating` row exists before the runtime makes anything. A crash while creating
//!   leaves a row without a handle: the next start marks it `error`, and the runtime's
//!   sweep of unadopted sandboxes removes whatever was made (its owner is dead, nobody
//!   adopted it).
//! - `running` and the handle are written in one statement after the start; a crash just
//!   before it is the case above.
//! - `killing` is written before the sandbox is destroyed; a crash in between leaves a
//!   `killing` row with a handle: the next start adopts it and finishes the kill.
//! - A `running` row whose sandbox ended while no daemon watched (adopt finds it gone) is
//!   marked `error` and the runtime removes its leftovers.

use crate::error::Error;
use crate::sandboxes::error::{InitError, SandboxError};
use crate::store::{Db, State};
use crate::util::{now_ms, random_hex, rfc3339};
use sandcell_runtime::{AGENT_PORT, Dirs, Image, Runtime, Sandbox, SandboxExit};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// The default longest lifetime (`serve --max-lifetime`): E2B's 24 hours.
pub const DEFAULT_MAX_LIFETIME_SECS: u64 = 86_400;
pub const MAX_REFRESH_SECS: u64 = 3_600;
/// Reported when the agent has no `/init` to tell its version (envd's first SDK-compatible
/// version: the SDKs refuse anything lower).
pub const FALLBACK_ENVD_VERSION: &str = "0.1.0";
pub const DEFAULT_VCPUS: u8 = 2;
pub const DEFAULT_MEMORY_MIB: u32 = 512;
pub(crate) const DESTROY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a stopping daemon waits for the creates under way (sandboxes/stopping.rs): a
/// boot and `/init`, or a template's first snapshot; the start command of a create whose
/// sandbox the shutdown killed ends at once.
const SHUTDOWN_CREATE_GRACE: Duration = Duration::from_secs(30);
pub(crate) const INIT_TIMEOUT: Duration = Duration::from_secs(10);
/// The smallest memory a sandbox may ask for.
pub const MIN_MEMORY_MIB: u32 = 128;

/// Server-wide bounds and behaviour of the lifecycle (from `sandcell serve`'s options).
#[derive(Debug, Clone)]
pub struct SandboxServiceConfig {
    /// Largest `cpuCount` a create may ask for.
    pub max_vcpus: u32,
    /// Largest `memoryMB` a create may ask for.
    pub max_memory_mib: u32,
    /// Kill every sandbox when the daemon stops gracefully (default: they keep running and
    /// the next daemon adopts them).
    pub kill_on_exit: bool,
    /// The longest a sandbox may run, in seconds of running (paused time does not count),
    /// and so the longest `timeout` a request may ask for.
    pub max_lifetime_secs: u64,
    /// Keys' default quotas and the host's limits (sandboxes/admission.rs).
    pub admission: crate::sandboxes::admission::AdmissionConfig,
    /// `serve --disk-mib` (gvisor): each sandbox's disk; 0: none (root writes in memory).
    pub disk_mib: u32,
    /// `serve --warm`: the pool of idle sandboxes creates take (sandboxes/warm.rs).
    pub warm: super::warm::WarmConfig,
}

impl Default for SandboxServiceConfig {
    fn default() -> Self {
        SandboxServiceConfig {
            max_vcpus: 8,
            max_memory_mib: 8192,
            kill_on_exit: false,
            max_lifetime_secs: DEFAULT_MAX_LIFETIME_SECS,
            admission: Default::default(),
            disk_mib: 0,
            warm: Default::default(),
        }
    }
}

/// A sandbox this daemon runs.
pub struct Live {
    pub sandbox: Arc<dyn Sandbox>,
    /// Required on sandbox traffic when set (`secure`).
    pub access_token: Option<String>,
}

pub struct SandboxService {
    pub(crate) db: Db,
    pub(crate) runtime: Arc<dyn Runtime>,
    pub(crate) dirs: Dirs,
    pub(crate) config: SandboxServiceConfig,
    pub(crate) metrics: Arc<crate::http::metrics::Metrics>,
    pub(crate) live: Mutex<HashMap<String, Arc<Live>>>,
    /// The daemon's side of the sandboxes' networks.
    pub networks: Arc<crate::networks::service::Networks>,
    /// The keys' volumes, which creates mount (volumes/).
    pub volumes: Arc<crate::volumes::service::Volumes>,
    /// One pause, resume, snapshot, fork or kill per sandbox at a time.
    pub(crate) ops: crate::snapshots::ops::OpLocks,
    /// Keys' default quotas and the host's limits (sandboxes/admission.rs).
    pub(crate) admission: crate::sandboxes::admission::AdmissionConfig,
    /// Where admission reads the host's memory and free disk.
    pub(crate) host: Arc<dyn crate::sandboxes::admission::HostProbe>,
    /// Admission checks and inserts run one at a time (sandboxes/admission.rs).
    pub(crate) admission_lock: tokio::sync::Mutex<()>,
    /// CPU, memory and disk samples of the running sandboxes (sandboxes/metrics.rs).
    pub samples: super::metrics::SampleStore,
    /// Idle booted sandboxes that creates take (sandboxes/warm.rs).
    pub warm: super::warm::WarmPool,
    /// Installed templates' memory snapshots being taken (templates/installed_snapshot.rs).
    pub(crate) installed_snapshots: crate::templates::installed_snapshot::Takes,
    /// The creates under way, which a stopping daemon refuses more of and waits for.
    pub(crate) creates: super::stopping::Creates,
}

pub(crate) use sandcell_proto::sync::lock;

/// Template names are plain names under `<data-dir>/images/`, never paths.
pub fn valid_template_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

pub fn resolve_template(dirs: &Dirs, name: &str) -> Result<Image, SandboxError> {
    if !valid_template_name(name) {
        return Err(SandboxError::Invalid(format!(
            "invalid templateID {name:?}: letters, digits, '-', '_' and '.' only"
        )));
    }
    if !dirs.images().join(name).is_dir() {
        return Err(SandboxError::TemplateNotFound(name.to_string()));
    }
    Image::resolve(&dirs.images(), name)
        .map_err(|e| SandboxError::TemplateUnreadable(e.to_string()))
}

/// The image's disk size in MiB (its ext4 file), 0 when it has none.
pub fn disk_mib(image: &Image) -> u32 {
    image
        .rootfs_ext4
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| {
            (m.len() / (1024 * 1024)).min(u64::from(u32::MAX)) as u32
        })
}

impl SandboxService {
    pub fn new(
        db: Db,
        runtime: Arc<dyn Runtime>,
        dirs: Dirs,
        config: SandboxServiceConfig,
        metrics: Arc<crate::http::metrics::Metrics>,
        networks: Arc<crate::networks::service::Networks>,
    ) -> SandboxService {
        let host = Arc::new(crate::sandboxes::admission::ProcHost {
            data_dir: dirs.data.clone(),
        });
        SandboxService {
            volumes: Arc::new(crate::volumes::service::Volumes::off(db.clone())),
            admission: config.admission,
            host,
            db,
            runtime,
            dirs,
            config,
            metrics,
            live: Mutex::new(HashMap::new()),
            networks,
            ops: Default::default(),
            admission_lock: tokio::sync::Mutex::new(()),
            samples: Default::default(),
            warm: Default::default(),
            installed_snapshots: Default::default(),
            creates: Default::default(),
        }
    }

    /// Creates mount volumes of `volumes` (without it, volumes are off).
    pub fn with_volumes(
        mut self,
        volumes: Arc<crate::volumes::service::Volumes>,
    ) -> SandboxService {
        self.volumes = volumes;
        self
    }

    /// Reads the host through `probe` instead of /proc and the data dir (tests).
    pub fn with_host_probe(
        mut self,
        probe: Arc<dyn crate::sandboxes::admission::HostProbe>,
    ) -> SandboxService {
        self.host = probe;
        self
    }

    /// The disk a new sandbox gets (`serve --disk-mib`, gvisor only; the runtime's
    /// gvisor/disk.rs), or `None`: its root's writes live in its memory.
    pub fn sandbox_disk_mib(&self) -> Option<u32> {
        (self.config.disk_mib > 0 && self.runtime.kind() == sandcell_runtime::RuntimeKind::Gvisor)
            .then_some(self.config.disk_mib)
    }

    /// The network of sandbox `id` if this daemon runs it and it has one (through the
    /// runtime's [`Sandbox::network`]).
    pub fn network_of(&self, id: &str) -> Option<sandcell_runtime::net::SandboxNet> {
        self.live(id).and_then(|l| l.sandbox.network())
    }

    /// The vCPUs and memory a create asks for (E2B takes them from the template; we also
    /// accept `cpuCount` and `memoryMB` on create), checked against the server's bounds.
    pub fn size(
        &self,
        cpu_count: Option<u32>,
        memory_mb: Option<u32>,
    ) -> Result<(u8, u32), SandboxError> {
        let max_vcpus = self.config.max_vcpus.min(u32::from(u8::MAX));
        let vcpus = cpu_count.unwrap_or(u32::from(DEFAULT_VCPUS).min(max_vcpus));
        if vcpus == 0 || vcpus > max_vcpus {
            return Err(SandboxError::Invalid(format!(
                "cpuCount {vcpus} is out of range: this server allows 1 to {max_vcpus} vCPUs"
            )));
        }
        let max_mib = self.config.max_memory_mib;
        let memory = memory_mb.unwrap_or(DEFAULT_MEMORY_MIB.min(max_mib));
        if memory < MIN_MEMORY_MIB || memory > max_mib {
            return Err(SandboxError::Invalid(format!(
                "memoryMB {memory} is out of range: this server allows {MIN_MEMORY_MIB} to {max_mib} MiB"
            )));
        }
        Ok((vcpus as u8, memory))
    }

    /// Refuses a `timeout` longer than the longest lifetime.
    pub fn check_timeout(&self, timeout: u64) -> Result<(), SandboxError> {
        let max = self.config.max_lifetime_secs;
        if timeout > max {
            return Err(SandboxError::Invalid(format!(
                "timeout {timeout} s is above this server's longest sandbox lifetime of {max} s \
                 (serve --max-lifetime): ask for {max} s or less"
            )));
        }
        Ok(())
    }

    pub fn max_lifetime_secs(&self) -> u64 {
        self.config.max_lifetime_secs
    }

    pub fn runtime_name(&self) -> &'static str {
        self.runtime.kind().name()
    }

    pub fn dirs(&self) -> &Dirs {
        &self.dirs
    }

    pub fn live(&self, id: &str) -> Option<Arc<Live>> {
        lock(&self.live).get(id).cloned()
    }

    /// Notices a sandbox that ends without being asked to (OOM, crash).
    pub(crate) fn watch(self: &Arc<Self>, id: String, sandbox: Arc<dyn Sandbox>) {
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            let exit = sandbox.wait().await;
            if exit == SandboxExit::Destroyed {
                return;
            }
            let Some(this) = this.upgrade() else { return };
            let reason = format!("the sandbox ended by itself: {exit}");
            match this
                .db
                .transition(&id, &[State::Running], State::Killing, None, now_ms())
                .await
            {
                Ok(true) => {
                    lock(&this.live).remove(&id);
                    let _ = tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await;
                    this.networks.ended(&this.db, &id).await;
                    let _ = this
                        .db
                        .transition(
                            &id,
                            &[State::Killing],
                            State::Error,
                            Some(&reason),
                            now_ms(),
                        )
                        .await;
                    this.collect_snapshots().await;
                    tracing::info!("sandbox {id}: {reason}");
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("sandbox {id} ended: {e}"),
            }
        });
    }

    /// Kills running or paused sandbox `id`; false if it was neither (already ending or
    /// ended). Waits for a pause, resume, snapshot or fork of it to finish first.
    pub async fn kill(&self, id: &str, reason: &str) -> Result<bool, Error> {
        let _op = self.ops.lock(id).await;
        if !self
            .db
            .transition(
                id,
                &[State::Running, State::Paused],
                State::Killing,
                None,
                now_ms(),
            )
            .await?
        {
            return Ok(false);
        }
        let live = lock(&self.live).remove(id);
        let mut end = (State::Killed, reason.to_string());
        if let Some(live) = live {
            match tokio::time::timeout(DESTROY_TIMEOUT, live.sandbox.destroy()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => end = (State::Error, format!("{reason}; removing it failed: {e}")),
                Err(_) => {
                    end = (
                        State::Error,
                        format!("{reason}; removing it timed out after {DESTROY_TIMEOUT:?}"),
                    )
                }
            }
        }
        self.networks.ended(&self.db, id).await;
        self.db
            .transition(id, &[State::Killing], end.0, Some(&end.1), now_ms())
            .await?;
        // Its snapshot files (a paused one's, the one it was restored from) may be unused now.
        self.collect_snapshots().await;
        Ok(true)
    }

    /// On daemon shutdown: with `kill_on_exit`, kills every sandbox; else leaves them
    /// running for the next daemon (their metering is flushed).
    pub async fn shutdown(self: &Arc<Self>) {
        // No create begins from here on (sandboxes/stopping.rs).
        self.creates.stop();
        // Idle pooled sandboxes are no one's: they go with the daemon either way.
        self.drain_warm().await;
        if !self.config.kill_on_exit {
            // The creates under way finish and are recorded, for the next daemon to adopt.
            self.settle_creates().await;
            if let Err(e) = self.db.flush_usage(now_ms()).await {
                tracing::warn!("metering: {e}");
            }
            return;
        }
        // Twice: the first kills make the creates running a template's start command end
        // (their sandbox is live already); the second takes the ones that became live since.
        self.kill_live().await;
        self.settle_creates().await;
        self.kill_live().await;
    }

    /// Waits for the creates under way, at most [`SHUTDOWN_CREATE_GRACE`].
    async fn settle_creates(&self) {
        let under_way = self.creates.under_way();
        if under_way == 0 {
            return;
        }
        tracing::info!("waiting for {under_way} create(s) under way");
        if !self.creates.settled(SHUTDOWN_CREATE_GRACE).await {
            tracing::warn!(
                "{} create(s) still under way after {SHUTDOWN_CREATE_GRACE:?}: their sandboxes' \
                 files are swept at the next start",
                self.creates.under_way()
            );
        }
    }

    async fn kill_live(self: &Arc<Self>) {
        let ids: Vec<String> = lock(&self.live).keys().cloned().collect();
        let mut kills = tokio::task::JoinSet::new();
        for id in ids {
            let this = self.clone();
            kills.spawn(async move {
                if let Err(e) = this.kill(&id, "the daemon stopped").await {
                    tracing::warn!("stopping sandbox {id}: {e}");
                }
            });
        }
        while kills.join_next().await.is_some() {}
    }
}

/// Hands the agent its env vars and access token (envd's `POST /init`). Returns the envd
/// version the agent reports; an agent without `/init` (404) gets
/// [`FALLBACK_ENVD_VERSION`]: its processes still see the env vars (given to the agent's own
/// environment at boot) and the proxy enforces the token.
pub(crate) async fn init_agent(
    sandbox: &Arc<dyn Sandbox>,
    env: &BTreeMap<String, String>,
    access_token: Option<&str>,
) -> Result<String, InitError> {
    init_agent_with(sandbox, env, access_token, None).await
}

/// [`init_agent`] with a template's defaults (user, working directory) applied.
pub(crate) async fn init_agent_with(
    sandbox: &Arc<dyn Sandbox>,
    env: &BTreeMap<String, String>,
    access_token: Option<&str>,
    defaults: Option<&sandcell_proto::image::ImageDefaults>,
) -> Result<String, InitError> {
    // E2B runs commands as `user` unless a request names another; the agent keeps root for
    // images that have no such account.
    let mut body = serde_json::json!({
        "envVars": env,
        "timestamp": rfc3339(now_ms()),
        "defaultUser": "user",
    });
    crate::templates::defaults::apply_to_init(&mut body, defaults);
    if let Some(token) = access_token {
        body["accessToken"] = serde_json::Value::String(token.to_string());
    }
    // Our extensions: who the agent is now (a restore from a snapshot, pause or fork is a
    // new identity in an old memory image) and fresh entropy for its kernel RNG (no two
    // restores of one snapshot share RNG state).
    body["sandcellSandboxId"] = serde_json::Value::String(sandbox.id().to_string());
    body["sandcellEntropy"] =
        serde_json::Value::String(random_hex(64).map_err(InitError::Entropy)?);
    // The egress CA, when the daemon intercepts TLS to inject secrets: sent at every /init
    // (rules change live, and a restored memory image may predate the CA). Empty when it
    // does not: the agent takes out a CA an earlier daemon's /init installed.
    let ca = sandcell_runtime::net::intercept::sandbox_ca_pem().unwrap_or_default();
    body["sandcellCaBundle"] = serde_json::Value::String(ca);
    let (status, headers) = crate::http::proxy::post_json(sandbox, AGENT_PORT, "/init", &body)
        .await
        .map_err(InitError::Unreachable)?;
    if status == axum::http::StatusCode::NOT_FOUND {
        return Ok(FALLBACK_ENVD_VERSION.to_string());
    }
    if !status.is_success() {
        return Err(InitError::Refused {
            id: sandbox.id().to_string(),
            status,
        });
    }
    Ok(headers
        .get("x-envd-version")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() < 32)
        .unwrap_or(FALLBACK_ENVD_VERSION)
        .to_string())
}
