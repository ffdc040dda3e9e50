//! Creating a sandbox from a template, as one sequence:
//!
//! 1. [`resolve`](SandboxService::resolve): what `templateID` names. A named snapshot of
//!    the key is restored as it is; else its tag is resolved (templates/tags.rs) and an
//!    API-built template's `e2b.json` (templates/start.rs) and current memory snapshot
//!    (templates/memory_snapshot.rs) are looked up, once.
//! 2. admission of the network request (networks/service.rs: rules, private networks).
//! 3. a template with a memory snapshot is restored from it; a restore failing on the host
//!    or in the restored sandbox ([`SandboxError::falls_back_to_boot`]) falls back to a boot
//!    (the template works without its snapshot).
//! 4. [`plan_boot`](SandboxService::plan_boot): size (the template's when the request
//!    names none), image, timeout, env (an OCI image's defaults under the request's),
//!    access token: the row to create.
//! 5. [`admit`](SandboxService::admit): the key's quotas and the host's capacity
//!    (sandboxes/admission.rs: the row is inserted `creating` only within them), `autoPause`,
//!    the network's rules recorded before the runtime makes anything (crash consistency:
//!    see service.rs).
//! 6. boot, then [`finish_create`](SandboxService::finish_create): the agent's `/init`,
//!    `running`, and an API-built template's start and ready commands.
//!
//! The order of the checks is the order their errors are answered in.

use crate::error::Error;
use crate::http::metrics::TemplateCreate;
use crate::networks::service::{NetRequest, NetworkError};
use crate::sandboxes::error::{InitError, SandboxError};
use crate::sandboxes::models::NewSandbox;
use crate::sandboxes::service::{
    DEFAULT_TIMEOUT_SECS, DEFAULT_VCPUS, DESTROY_TIMEOUT, INIT_TIMEOUT, Live, SandboxService,
    disk_mib, init_agent_with, lock, resolve_template,
};
use crate::snapshots::restore::RestoredNetwork;
use crate::store::snapshots::{LifecycleRow, SnapshotRow};
use crate::store::{KeyRow, SandboxRow, State};
use crate::templates::builds::E2bRecord;
use crate::util::{now_ms, random_hex};
use sandcell_runtime::{Image, Sandbox, SandboxSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The shortest timeout an auto-resume gives (E2B's: 5 minutes, or the create's timeout
/// when longer).
pub const AUTO_RESUME_MIN_TIMEOUT_SECS: u64 = 300;

/// What a create's `templateID` resolved to.
enum Resolved {
    /// A named snapshot of the key: restored as it is.
    NamedSnapshot(NewSandbox, SnapshotRow),
    /// An image template (installed, built from a Dockerfile or through the template API).
    Template(TemplateCreateRequest),
}

/// A create from an image template, its template looked up once.
struct TemplateCreateRequest {
    /// The request, its `templateID` untagged.
    req: NewSandbox,
    /// An API-built template's `e2b.json`.
    e2b: Option<E2bRecord>,
    /// The template's memory snapshot, when it has a current one of the requested size.
    memory_snapshot: Option<SnapshotRow>,
    /// An installed template with a start command (templates/installed_snapshot.rs): its
    /// snapshot is the daemon's, taken after its first booted create.
    installed: bool,
}

/// A booted create, checked and ready to be admitted.
struct BootPlan {
    row: SandboxRow,
    image: Image,
    env: BTreeMap<String, String>,
    timeout: u64,
    auto_pause: bool,
    /// The timeout an auto-resume gives, when the create asked for auto-resume.
    auto_resume: Option<u64>,
    /// E2B's `autoPauseMemory: false`.
    auto_pause_files_only: bool,
    /// The volumes to mount (volumes/), checked.
    volumes: Vec<crate::store::volumes::MountRow>,
}

impl SandboxService {
    /// Creates and starts a sandbox for `key`; returns its row (state running).
    pub async fn create(
        self: &Arc<Self>,
        key: &KeyRow,
        req: NewSandbox,
        secure_by_default: bool,
    ) -> Result<SandboxRow, SandboxError> {
        let begun = Instant::now();
        // Held to the end, whatever the path: a stopping daemon waits for it.
        let _under_way = self.creates.enter().ok_or(SandboxError::Stopping)?;
        // Volumes first: a name that is not the key's is 404 whatever else is asked.
        let mounts = self
            .volumes
            .resolve_mounts(&key.id, req.volume_mounts.as_deref().unwrap_or_default())
            .await?;
        if !mounts.is_empty() && req.auto_pause == Some(true) {
            return Err(SandboxError::Invalid(
                "autoPause with volumeMounts is not supported: a paused sandbox's snapshot \
                 would not hold its volumes (docs/volumes.md)"
                    .into(),
            ));
        }
        let mut template = match self.resolve(key, req).await? {
            Resolved::NamedSnapshot(..) if !mounts.is_empty() => {
                return Err(SandboxError::Invalid(
                    "volumeMounts cannot be used with a snapshot as templateID: the snapshot \
                     restores a sandbox as it was, without mounts (docs/volumes.md)"
                        .into(),
                ));
            }
            Resolved::NamedSnapshot(req, snap) => {
                let row = self
                    .create_from_snapshot(key, req, &snap, secure_by_default, None)
                    .await?;
                self.metrics.observe_create(begun.elapsed());
                return Ok(row);
            }
            Resolved::Template(template) => template,
        };
        let net_req = self.admit_network(key, &template.req).await?;
        if !mounts.is_empty() {
            // A memory snapshot and the warm pool's sandboxes were made without the mounts:
            // a sandbox with volumes boots.
            template.memory_snapshot = None;
        }
        let mut template_path = TemplateCreate::Booted;
        if let Some(snap) = &template.memory_snapshot {
            match self
                .restore_memory_snapshot(key, &template.req, snap, &net_req, secure_by_default)
                .await?
            {
                Some(row) => {
                    if template.installed {
                        crate::templates::installed_snapshot::restored(self, &row.template_id);
                    }
                    self.metrics.observe_create(begun.elapsed());
                    self.metrics.count_template_create(TemplateCreate::Restored);
                    return Ok(row);
                }
                None => {
                    template_path = TemplateCreate::Fallback;
                    if template.installed {
                        crate::templates::installed_snapshot::fell_back(
                            self,
                            &template.req.template_id,
                            &snap.id,
                        )
                        .await;
                    }
                }
            }
        }
        let mut plan =
            self.plan_boot(key, template.req, template.e2b.as_ref(), secure_by_default)?;
        plan.volumes = mounts;
        // A plain image template at the default size: an idle sandbox of the warm pool
        // (sandboxes/warm.rs) becomes this one, under its own id.
        // Not with an egressProxy: a pooled network gets the request's rules before `/init`
        // and the proxy only after it, so its processes could connect directly in between;
        // a booted create starts with the proxy in force.
        let warm = (template.e2b.is_none()
            && template.memory_snapshot.is_none()
            && plan.volumes.is_empty()
            && net_req.as_ref().is_none_or(|n| n.egress_proxy.is_none())
            && self.warm_fits(&plan.row.template_id, plan.row.vcpus, plan.row.memory_mib))
        .then(|| self.take_warm())
        .flatten();
        if let Some(sb) = &warm {
            plan.row.id = sb.id().to_string();
        }
        let admitting = Instant::now();
        if let Err(e) = self.admit(key, &plan, net_req.as_ref()).await {
            if let Some(sb) = warm {
                self.return_warm(sb, &e);
            }
            return Err(e);
        }
        let row = match warm {
            Some(sb) => {
                tracing::debug!(
                    "create {} from the warm pool: resolved and planned in {:?}, admitted in {:?}",
                    plan.row.id,
                    admitting.duration_since(begun),
                    admitting.elapsed()
                );
                self.finish_warm(plan, sb, net_req.as_ref()).await?
            }
            None => self.boot_and_finish(plan, template.e2b.as_ref()).await?,
        };
        if template.installed && template_path == TemplateCreate::Booted {
            crate::templates::installed_snapshot::take_later(self, &row.template_id);
        }
        self.metrics.observe_create(begun.elapsed());
        if template.e2b.is_some() {
            self.metrics.count_template_create(template_path);
        }
        Ok(row)
    }

    /// Step 1: what `req.templateID` names, looked up once.
    async fn resolve(&self, key: &KeyRow, req: NewSandbox) -> Result<Resolved, SandboxError> {
        // A named snapshot of the key is a template too (snapshots/).
        if let Some(snap) = self.snapshot_template(&key.id, &req.template_id).await? {
            return Ok(Resolved::NamedSnapshot(req, snap));
        }
        // Another key's private template is not found (templates/access.rs), before its
        // tags are looked at: their answers would tell that it exists.
        let name = req
            .template_id
            .split_once(':')
            .map_or(req.template_id.as_str(), |(name, _)| name);
        crate::templates::access::check_visible(&self.db, key, name).await?;
        // `name:tag` is `name` when the tag names its current build (templates/tags.rs).
        let req = crate::templates::tags::untag_request(self, req).await?;
        // An API-built template's `e2b.json` (templates/start.rs), read once for this create.
        let e2b = crate::templates::start::record(self, &req.template_id);
        // An API-built template restores the state its build snapshotted
        // (templates/memory_snapshot.rs), an installed one the state the daemon snapshotted
        // after its first create (templates/installed_snapshot.rs).
        let installed = crate::templates::installed_snapshot::applies(e2b.as_ref());
        let memory_snapshot = if installed {
            crate::templates::installed_snapshot::usable(self, &req, e2b.as_ref()).await?
        } else {
            crate::templates::memory_snapshot::usable(self, &req, e2b.as_ref()).await?
        };
        Ok(Resolved::Template(TemplateCreateRequest {
            req,
            e2b,
            memory_snapshot,
            installed,
        }))
    }

    /// Step 2: the request's network (rules, private networks of the key); `None` on a
    /// daemon without networks.
    async fn admit_network(
        &self,
        key: &KeyRow,
        req: &NewSandbox,
    ) -> Result<Option<NetRequest>, NetworkError> {
        self.networks
            .check_request(
                &self.db,
                &key.id,
                req.allow_internet_access,
                req.network.as_ref(),
                req.networks.as_deref(),
            )
            .await
    }

    /// Step 3: restores an API-built template's memory snapshot. `None`: the restore failed
    /// on our side and the create boots instead (the template works without its snapshot).
    async fn restore_memory_snapshot(
        self: &Arc<Self>,
        key: &KeyRow,
        req: &NewSandbox,
        snap: &SnapshotRow,
        net_req: &Option<NetRequest>,
        secure_by_default: bool,
    ) -> Result<Option<SandboxRow>, SandboxError> {
        let network = Some(RestoredNetwork::Request(net_req.clone()));
        match self
            .create_from_snapshot(key, req.clone(), snap, secure_by_default, network)
            .await
        {
            Ok(row) => Ok(Some(row)),
            Err(e) if e.falls_back_to_boot() => {
                tracing::warn!(
                    "template {}: restoring snapshot {} failed ({e}); \
                     booting instead",
                    req.template_id,
                    snap.id
                );
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Step 4: size, image, timeout and environment of a booted create, checked; the row it
    /// will be (state `creating`).
    fn plan_boot(
        &self,
        key: &KeyRow,
        req: NewSandbox,
        e2b: Option<&E2bRecord>,
        secure_by_default: bool,
    ) -> Result<BootPlan, SandboxError> {
        // An API-built template's size when the request names none (templates/start.rs).
        let (cpu_count, memory_mb) =
            crate::templates::start::default_size(e2b, req.cpu_count, req.memory_mb);
        let (vcpus, memory_mib) = self.size(cpu_count, memory_mb)?;
        let image = resolve_template(&self.dirs, &req.template_id)?;
        let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
        self.check_timeout(timeout)?;
        let auto_resume = self.auto_resume(&req, timeout)?;
        let env = req.env_vars.unwrap_or_default();
        if let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
            return Err(SandboxError::Invalid(format!(
                "invalid envVars name {bad:?}"
            )));
        }
        // An OCI-made template's Env under the request's (templates/defaults.rs).
        let env = crate::templates::defaults::merge_env(
            crate::templates::defaults::load(&self.dirs, &req.template_id).as_ref(),
            env,
        );
        let secure = req.secure.unwrap_or(secure_by_default);
        let access_token = if secure {
            Some(random_hex(20).map_err(Error::io("getrandom for an access token"))?)
        } else {
            None
        };
        let id = sandcell_runtime::new_sandbox_id().map_err(Error::from)?;
        let row = SandboxRow {
            id,
            key_id: key.id.clone(),
            template_id: req.template_id.clone(),
            runtime: self.runtime_name().to_string(),
            state: State::Creating,
            secure,
            access_token,
            metadata: req.metadata.unwrap_or_default(),
            vcpus: u32::from(vcpus),
            memory_mib,
            disk_mib: self.sandbox_disk_mib().unwrap_or_else(|| disk_mib(&image)),
            envd_version: String::new(),
            created_at: now_ms(),
            started_at: None,
            end_at: None,
            ended_at: None,
            end_reason: None,
            handle: None,
        };
        Ok(BootPlan {
            row,
            image,
            env,
            timeout,
            auto_pause: req.auto_pause == Some(true),
            auto_resume,
            auto_pause_files_only: req.auto_pause == Some(true)
                && req.auto_pause_memory == Some(false),
            volumes: Vec::new(),
        })
    }

    /// `autoResume` of a create whose timeout is `timeout`: the timeout a wake gives
    /// (http/wake.rs), or `None` without auto-resume. As E2B: only with `autoPause` (a
    /// sandbox killed at its timeout has nothing to resume), and a wake gives the timeout
    /// asked for at create, at least [`AUTO_RESUME_MIN_TIMEOUT_SECS`] (within the longest
    /// lifetime).
    pub(crate) fn auto_resume(
        &self,
        req: &NewSandbox,
        timeout: u64,
    ) -> Result<Option<u64>, SandboxError> {
        if !req.auto_resume.is_some_and(|a| a.enabled) {
            return Ok(None);
        }
        if req.auto_pause != Some(true) {
            return Err(SandboxError::Invalid(
                "autoResume {\"enabled\": true} needs autoPause: true (lifecycle on_timeout \
                 \"pause\"): a sandbox killed at its timeout has nothing to resume"
                    .into(),
            ));
        }
        Ok(Some(self.auto_resume_timeout(timeout)))
    }

    /// The timeout a wake of a sandbox made with `timeout` gives.
    pub(crate) fn auto_resume_timeout(&self, timeout: u64) -> u64 {
        timeout
            .max(AUTO_RESUME_MIN_TIMEOUT_SECS)
            .min(self.max_lifetime_secs())
    }

    /// Step 5: the row is inserted within the key's quotas (429 beyond them) and the host's
    /// capacity (503), with its
    /// `autoPause`; the network's rules are recorded before the runtime makes it
    /// (networks/service.rs). A failed network record marks the row `error`.
    async fn admit(
        &self,
        key: &KeyRow,
        plan: &BootPlan,
        net_req: Option<&NetRequest>,
    ) -> Result<(), SandboxError> {
        let id = &plan.row.id;
        self.admit_new(key, &plan.row).await?;
        if plan.auto_pause {
            self.db
                .set_sandbox_lifecycle(
                    id,
                    &LifecycleRow {
                        auto_pause: true,
                        auto_resume: plan.auto_resume,
                        auto_pause_files_only: plan.auto_pause_files_only,
                        ..Default::default()
                    },
                )
                .await?;
        }
        if let Some(n) = net_req
            && let Err(e) = self.networks.record(&self.db, id, &key.id, n).await
        {
            self.mark_create_failed(id, &e).await;
            return Err(e.into());
        }
        // Recorded with the row live: from here a delete of these volumes is refused.
        if !plan.volumes.is_empty()
            && let Err(e) = self.db.insert_sandbox_volumes(id, &plan.volumes).await
        {
            self.mark_create_failed(id, &e).await;
            return Err(e.into());
        }
        Ok(())
    }

    /// Step 6: boots the admitted sandbox and finishes the create (`/init`, running, an
    /// API-built template's start and ready commands).
    async fn boot_and_finish(
        self: &Arc<Self>,
        plan: BootPlan,
        e2b: Option<&E2bRecord>,
    ) -> Result<SandboxRow, SandboxError> {
        let BootPlan {
            row,
            image,
            env,
            timeout,
            volumes,
            ..
        } = plan;
        let binds = match self.volumes.bind(&volumes).await {
            Ok(binds) => binds,
            Err(e) => {
                let host = Error::Io {
                    what: format!("mounting the volumes of {}: {e}", row.id),
                    source: std::io::Error::other("volume mount failed"),
                };
                self.mark_create_failed(&row.id, &host).await;
                return Err(e.into());
            }
        };
        let sandbox = match self.boot(&row, image, env.clone(), binds).await {
            Ok(sandbox) => sandbox,
            Err(e) => {
                self.mark_create_failed(&row.id, &e).await;
                return Err(e.into());
            }
        };
        let row = self.finish_create(row, sandbox, &env, timeout).await?;
        // E2B's startCmd/readyCmd of an API-built template (templates/start.rs).
        crate::templates::start::after_create(self, &row, e2b).await?;
        Ok(row)
    }

    /// Step 6 for a sandbox taken from the warm pool: the request's egress rules put in
    /// force on its network (it had none), then the same `/init` and bookkeeping as a boot.
    async fn finish_warm(
        self: &Arc<Self>,
        plan: BootPlan,
        sandbox: Arc<dyn Sandbox>,
        net_req: Option<&NetRequest>,
    ) -> Result<SandboxRow, SandboxError> {
        let begun = Instant::now();
        if let (Some(n), Some(net)) = (net_req, sandbox.network())
            && let Err(e) = net.set_policy(&n.egress).await
        {
            let e = Error::Io {
                what: format!("sandbox {}: putting its egress rules in force", plan.row.id),
                source: std::io::Error::other(e),
            };
            let _ = tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await;
            self.mark_create_failed(&plan.row.id, &e).await;
            return Err(e.into());
        }
        let egress = begun.elapsed();
        let id = plan.row.id.clone();
        let row = self
            .finish_create(plan.row, sandbox, &plan.env, plan.timeout)
            .await;
        tracing::debug!(
            "create {id} from the warm pool: egress rules in {egress:?}, /init and records in {:?}",
            begun.elapsed() - egress
        );
        row
    }

    /// A create refused after it took a pooled sandbox: refused before its row existed
    /// (quotas, capacity), the sandbox is as it was and goes back; otherwise it is destroyed
    /// (its id is on an `error` row now).
    fn return_warm(&self, sb: Arc<dyn Sandbox>, why: &SandboxError) {
        if matches!(why, SandboxError::Admission(_)) {
            self.put_back_warm(sb);
        } else {
            self.discard_warm(sb);
        }
    }

    /// A create that failed before the sandbox ran: its row goes `error` with the reason.
    async fn mark_create_failed(&self, id: &str, e: &Error) {
        let _ = self
            .db
            .transition(
                id,
                &[State::Creating],
                State::Error,
                Some(&e.to_string()),
                now_ms(),
            )
            .await;
    }

    /// Boots the sandbox `row` describes (its network as recorded by [`Self::admit`]).
    async fn boot(
        &self,
        row: &SandboxRow,
        image: Image,
        env: BTreeMap<String, String>,
        volumes: Vec<sandcell_runtime::VolumeBind>,
    ) -> Result<Arc<dyn Sandbox>, Error> {
        let mut spec = SandboxSpec::new(row.id.clone(), image);
        spec.volumes = volumes;
        spec.vcpus = u8::try_from(row.vcpus).unwrap_or(DEFAULT_VCPUS);
        spec.memory_mib = row.memory_mib;
        // The daemon is infrastructure: its restart must not kill user sandboxes.
        spec.outlive_owner = true;
        // Also given to the agent's own environment so that processes inherit them from an
        // agent without `/init`.
        spec.env = env;
        spec.network = self.networks.spec_of(&self.db, &row.id).await?;
        spec.disk_mib = self.sandbox_disk_mib();
        let sandbox: Arc<dyn Sandbox> = Arc::from(self.runtime.create(spec).await?);
        if let Err(e) = sandbox.start().await {
            let _ = tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await;
            return Err(e.into());
        }
        Ok(sandbox)
    }

    /// The agent's `/init` (a sandbox whose agent does not answer is destroyed, its row
    /// `error`), then the row `running` with its timeout, handle and network.
    pub(crate) async fn finish_create(
        self: &Arc<Self>,
        mut row: SandboxRow,
        sandbox: Arc<dyn Sandbox>,
        env: &BTreeMap<String, String>,
        timeout: u64,
    ) -> Result<SandboxRow, SandboxError> {
        let initing = Instant::now();
        let envd_version = match tokio::time::timeout(
            INIT_TIMEOUT,
            init_agent_with(
                &sandbox,
                env,
                row.access_token.as_deref(),
                crate::templates::defaults::load(&self.dirs, &row.template_id).as_ref(),
            ),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(InitError::Timeout {
                id: row.id.clone(),
                after: INIT_TIMEOUT,
            }),
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
                        Some(&e.to_string()),
                        now_ms(),
                    )
                    .await;
                return Err(SandboxError::Agent(e));
            }
        };
        tracing::debug!("sandbox {}: /init took {:?}", row.id, initing.elapsed());
        lock(&self.live).insert(
            row.id.clone(),
            Arc::new(Live {
                sandbox: sandbox.clone(),
                access_token: row.access_token.clone(),
            }),
        );
        let started = now_ms();
        let end_at = started + (timeout as i64) * 1000;
        let handle = sandbox
            .handle()
            .and_then(|h| serde_json::to_string(&h).ok());
        if let Err(e) = self
            .networks
            .started(&self.db, &row.id, sandbox.network())
            .await
        {
            tracing::warn!("sandbox {}: its network: {e}", row.id);
        }
        self.db
            .mark_running(&row, started, end_at, &envd_version, handle.as_deref())
            .await?;
        self.watch(row.id.clone(), sandbox);
        row.state = State::Running;
        row.started_at = Some(started);
        row.end_at = Some(end_at);
        row.envd_version = envd_version;
        Ok(row)
    }
}
