//! Sandbox lifecycle: create, kill, timeouts, unexpected ends, restart reconciliation.
//!
//! States (stored in the database, column `state`):
//!
//! ```text
//! creating --start ok--> running --kill/timeout/key revoked--> killing --> killed
//!     |                     |
//!     +--start failed--> error <--ended by itself (OOM, crash)--+
//! ```
//!
//! Every transition is a conditional UPDATE (`WHERE state IN (...)`), so two paths racing
//! to end a sandbox (a DELETE and the reaper) do the work once.
//!
//! Daemon restarts: the runtimes tie each sandbox to the process that created it (a killed
//! daemon takes its sandboxes down through the parent-death signal), so a restarted daemon
//! cannot re-adopt them yet. On start it marks every sandbox it finds live in the database as
//! `error` ("lost when the daemon stopped") and sweeps the runtime's leftovers.

use crate::db::{Db, SandboxRow, State};
use crate::error::{ApiError, ApiResult, Error};
use crate::models::NewSandbox;
use crate::util::{now_ms, random_hex, rfc3339};
use sandcell_runtime::{AGENT_PORT, Dirs, Image, Runtime, Sandbox, SandboxExit, SandboxSpec};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
pub const MAX_TIMEOUT_SECS: u64 = 86_400;
pub const MAX_REFRESH_SECS: u64 = 3_600;
/// Reported when the agent has no `/init` to tell its version (envd's first SDK-compatible
/// version: the SDKs refuse anything lower).
pub const FALLBACK_ENVD_VERSION: &str = "0.1.0";
pub const DEFAULT_VCPUS: u8 = 2;
pub const DEFAULT_MEMORY_MIB: u32 = 512;
const BOOT_TIMEOUT: Duration = Duration::from_secs(30);
const DESTROY_TIMEOUT: Duration = Duration::from_secs(20);
const INIT_TIMEOUT: Duration = Duration::from_secs(10);
const REAP_INTERVAL: Duration = Duration::from_millis(250);

/// A sandbox this daemon runs.
pub struct Live {
    pub sandbox: Arc<dyn Sandbox>,
    /// Required on sandbox traffic when set (`secure`).
    pub access_token: Option<String>,
}

pub struct Lifecycle {
    db: Db,
    runtime: Arc<dyn Runtime>,
    dirs: Dirs,
    live: Mutex<HashMap<String, Arc<Live>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Template names are plain names under `<data-dir>/images/`, never paths.
pub fn valid_template_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

pub fn resolve_template(dirs: &Dirs, name: &str) -> ApiResult<Image> {
    if !valid_template_name(name) {
        return Err(ApiError::bad_request(format!(
            "invalid templateID {name:?}: letters, digits, '-', '_' and '.' only"
        )));
    }
    if !dirs.images().join(name).is_dir() {
        return Err(ApiError::not_found(format!("template '{name}' not found")));
    }
    Image::resolve(&dirs.images(), name).map_err(|e| ApiError::internal(e.to_string()))
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

impl Lifecycle {
    pub fn new(db: Db, runtime: Arc<dyn Runtime>, dirs: Dirs) -> Lifecycle {
        Lifecycle {
            db,
            runtime,
            dirs,
            live: Mutex::new(HashMap::new()),
        }
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

    /// Creates and starts a sandbox for `key`; returns its row (state running).
    pub async fn create(
        self: &Arc<Self>,
        key: &crate::db::KeyRow,
        req: NewSandbox,
        secure_by_default: bool,
    ) -> ApiResult<SandboxRow> {
        let image = resolve_template(&self.dirs, &req.template_id)?;
        let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
        if timeout > MAX_TIMEOUT_SECS {
            return Err(ApiError::bad_request(format!(
                "timeout {timeout} s is above the maximum of {MAX_TIMEOUT_SECS} s"
            )));
        }
        let env = req.env_vars.unwrap_or_default();
        if let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
            return Err(ApiError::bad_request(format!(
                "invalid envVars name {bad:?}"
            )));
        }
        let secure = req.secure.unwrap_or(secure_by_default);
        let access_token = if secure {
            Some(random_hex(20).map_err(Error::io("getrandom for an access token"))?)
        } else {
            None
        };
        let id = sandcell_runtime::new_sandbox_id().map_err(Error::from)?;
        let row = SandboxRow {
            id: id.clone(),
            key_id: key.id.clone(),
            template_id: req.template_id.clone(),
            runtime: self.runtime_name().to_string(),
            state: State::Creating,
            secure,
            access_token: access_token.clone(),
            metadata: req.metadata.unwrap_or_default(),
            vcpus: u32::from(DEFAULT_VCPUS),
            memory_mib: DEFAULT_MEMORY_MIB,
            disk_mib: disk_mib(&image),
            envd_version: String::new(),
            created_at: now_ms(),
            started_at: None,
            end_at: None,
            ended_at: None,
            end_reason: None,
        };
        if !self
            .db
            .insert_sandbox_within_limit(&row, key.max_sandboxes)
            .await?
        {
            return Err(ApiError::too_many(format!(
                "you have reached the maximum number of concurrent sandboxes ({}) for this API key",
                key.max_sandboxes.unwrap_or(0)
            )));
        }
        match self.boot(&row, image, env.clone()).await {
            Ok(sandbox) => self.finish_create(row, sandbox, &env, timeout).await,
            Err(e) => {
                let _ = self
                    .db
                    .transition(
                        &id,
                        &[State::Creating],
                        State::Error,
                        Some(&e.to_string()),
                        now_ms(),
                    )
                    .await;
                Err(e.into())
            }
        }
    }

    async fn boot(
        &self,
        row: &SandboxRow,
        image: Image,
        env: BTreeMap<String, String>,
    ) -> Result<Arc<dyn Sandbox>, Error> {
        let mut spec = SandboxSpec::new(row.id.clone(), image);
        spec.vcpus = DEFAULT_VCPUS;
        spec.memory_mib = DEFAULT_MEMORY_MIB;
        // Also given to the agent's own environment so that processes inherit them from an
        // agent without `/init`.
        spec.env = env;
        spec.boot_timeout = BOOT_TIMEOUT;
        let sandbox: Arc<dyn Sandbox> = Arc::from(self.runtime.create(spec).await?);
        if let Err(e) = sandbox.start().await {
            let _ = tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await;
            return Err(e.into());
        }
        Ok(sandbox)
    }

    async fn finish_create(
        self: &Arc<Self>,
        mut row: SandboxRow,
        sandbox: Arc<dyn Sandbox>,
        env: &BTreeMap<String, String>,
        timeout: u64,
    ) -> ApiResult<SandboxRow> {
        let envd_version = match tokio::time::timeout(
            INIT_TIMEOUT,
            init_agent(&sandbox, env, row.access_token.as_deref()),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(ApiError::internal(format!(
                "sandbox {}: the agent did not answer /init within {INIT_TIMEOUT:?}",
                row.id
            ))),
        };
        let envd_version = match envd_version {
            Ok(v) => v,
            Err(e) => {
                let _ = tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await;
                let _ = self
                    .db
                    .transition(
                        &row.id,
                        &[State::Creating],
                        State::Error,
                        Some(&e.message),
                        now_ms(),
                    )
                    .await;
                return Err(e);
            }
        };
        lock(&self.live).insert(
            row.id.clone(),
            Arc::new(Live {
                sandbox: sandbox.clone(),
                access_token: row.access_token.clone(),
            }),
        );
        let started = now_ms();
        let end_at = started + (timeout as i64) * 1000;
        self.db
            .mark_running(&row.id, started, end_at, &envd_version)
            .await?;
        self.watch(row.id.clone(), sandbox);
        row.state = State::Running;
        row.started_at = Some(started);
        row.end_at = Some(end_at);
        row.envd_version = envd_version;
        Ok(row)
    }

    /// Notices a sandbox that ends without being asked to (OOM, crash).
    fn watch(self: &Arc<Self>, id: String, sandbox: Arc<dyn Sandbox>) {
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
                    eprintln!("sandcell serve: sandbox {id}: {reason}");
                }
                Ok(false) => {}
                Err(e) => eprintln!("sandcell serve: sandbox {id} ended: {e}"),
            }
        });
    }

    /// Kills running sandbox `id`; false if it was not running (already ending or ended).
    pub async fn kill(&self, id: &str, reason: &str) -> Result<bool, Error> {
        if !self
            .db
            .transition(id, &[State::Running], State::Killing, None, now_ms())
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
        self.db
            .transition(id, &[State::Killing], end.0, Some(&end.1), now_ms())
            .await?;
        Ok(true)
    }

    /// Kills sandboxes past their timeout (or whose key was revoked), forever.
    pub async fn reap_forever(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REAP_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
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
                    if let Err(e) = this.kill(&id, reason).await {
                        eprintln!("sandcell serve: killing sandbox {id} ({reason}): {e}");
                    }
                });
            }
        }
    }

    /// At start: sandboxes the database thinks are live were lost with the previous daemon
    /// process; record that and remove what they left on the host. Returns their ids.
    pub async fn reconcile(&self) -> Result<Vec<String>, Error> {
        let stale = self.db.sandboxes_in(None, &State::LIVE).await?;
        let now = now_ms();
        let mut lost = Vec::new();
        for row in stale {
            let reason = format!(
                "lost: the daemon stopped at or before {} while the sandbox was {}",
                rfc3339(now),
                row.state.as_str()
            );
            if self
                .db
                .transition(&row.id, &State::LIVE, State::Error, Some(&reason), now)
                .await?
            {
                lost.push(row.id);
            }
        }
        match self.runtime.sweep().await {
            Ok(cleaned) if !cleaned.is_empty() => eprintln!(
                "sandcell serve: removed leftovers of {} sandbox(es): {}",
                cleaned.len(),
                cleaned.join(", ")
            ),
            Ok(_) => {}
            Err(e) => eprintln!("sandcell serve: sweeping leftovers: {e}"),
        }
        Ok(lost)
    }

    /// On daemon shutdown: kills every sandbox (they cannot outlive the daemon yet).
    pub async fn shutdown(self: &Arc<Self>) {
        let ids: Vec<String> = lock(&self.live).keys().cloned().collect();
        let mut kills = tokio::task::JoinSet::new();
        for id in ids {
            let this = self.clone();
            kills.spawn(async move {
                if let Err(e) = this.kill(&id, "the daemon stopped").await {
                    eprintln!("sandcell serve: stopping sandbox {id}: {e}");
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
async fn init_agent(
    sandbox: &Arc<dyn Sandbox>,
    env: &BTreeMap<String, String>,
    access_token: Option<&str>,
) -> ApiResult<String> {
    let mut body = serde_json::json!({
        "envVars": env,
        "timestamp": rfc3339(now_ms()),
    });
    if let Some(token) = access_token {
        body["accessToken"] = serde_json::Value::String(token.to_string());
    }
    let (status, headers) = crate::proxy::post_json(sandbox, AGENT_PORT, "/init", &body).await?;
    if status == axum::http::StatusCode::NOT_FOUND {
        return Ok(FALLBACK_ENVD_VERSION.to_string());
    }
    if !status.is_success() {
        return Err(ApiError::internal(format!(
            "sandbox {}: the agent answered /init with {status}",
            sandbox.id()
        )));
    }
    Ok(headers
        .get("x-envd-version")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() < 32)
        .unwrap_or(FALLBACK_ENVD_VERSION)
        .to_string())
}
