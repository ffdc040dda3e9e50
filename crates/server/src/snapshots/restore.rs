//! Sandboxes created from a snapshot (the restore path); the checkpoints they restore are
//! made in fork.rs (named snapshots, fork) and snapshots/pause.rs.
//!
//! - `POST /sandboxes/{id}/snapshots` checkpoints a running sandbox into
//!   `<data-dir>/snapshots/<id>/`; the sandbox keeps running. The snapshot is a template of
//!   the key: `templateID` on create takes its id or name and restores it.
//! - `POST /sandboxes/{id}/fork` checkpoints once and restores `count` children from it,
//!   each a sandbox of its own (id, token, timeout) of the same key, counted against its
//!   limit; each succeeds or fails on its own (E2B's answer: one result per fork).
//! - gvisor: the runsc in use cannot checkpoint and keep running, so the runtime restores
//!   the parent in place right after its checkpoint: its processes continue, but the
//!   connections open to it at that moment end (a running command's stream breaks).
//!
//! Files go when nothing needs them (store/snapshots.rs): a named snapshot until deleted, a
//! fork's until its last child (and the parent) is gone.

use crate::error::Error;
use crate::sandboxes::error::SandboxError;
use crate::sandboxes::models::NewSandbox;
use crate::sandboxes::service::{DEFAULT_TIMEOUT_SECS, SandboxService, disk_mib};
use crate::snapshots::pause::{merged_env, parse_handle};
use crate::store::snapshots::{LifecycleRow, SnapshotRow};
use crate::store::{KeyRow, SandboxRow, State};
use crate::util::{now_ms, random_hex};
use sandcell_runtime::SnapshotHandle;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a sandbox restored from a snapshot is made with.
pub(super) struct RestoredSpec {
    pub(super) template_id: String,
    pub(super) metadata: BTreeMap<String, String>,
    pub(super) env: BTreeMap<String, String>,
    pub(super) secure: bool,
    pub(super) timeout: u64,
    pub(super) auto_pause: bool,
    /// The timeout an auto-resume gives (http/wake.rs); `None`: no auto-resume.
    pub(super) auto_resume: Option<u64>,
    /// E2B's `autoPauseMemory: false` (with `auto_pause`).
    pub(super) auto_pause_files_only: bool,
    pub(super) parent_id: Option<String>,
    pub(super) network: RestoredNetwork,
}

/// The network rules a restored sandbox gets.
pub(crate) enum RestoredNetwork {
    /// Those of this sandbox (a fork's parent, a named snapshot's source): restored
    /// processes expect the network they had, private networks included.
    Of(String),
    /// The create request's own (a template's snapshot: the build sandbox's rules were
    /// the build's, not the user's); `None` on a daemon without networks.
    Request(Option<crate::networks::service::NetRequest>),
}

impl SandboxService {
    /// The key's named snapshot that `template` names: its id or name, E2B's `:default`
    /// tag allowed.
    pub(crate) async fn snapshot_template(
        &self,
        key_id: &str,
        template: &str,
    ) -> Result<Option<SnapshotRow>, Error> {
        let name = template.strip_suffix(":default").unwrap_or(template);
        self.db.named_snapshot(key_id, name).await
    }

    /// Create with a snapshot as `templateID` (a named snapshot: its source's network), or
    /// from a template's snapshot (`network` from the request).
    pub(crate) async fn create_from_snapshot(
        self: &Arc<Self>,
        key: &KeyRow,
        req: NewSandbox,
        snap: &SnapshotRow,
        secure_by_default: bool,
        network: Option<RestoredNetwork>,
    ) -> Result<SandboxRow, SandboxError> {
        let handle = parse_handle(snap)?;
        let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
        self.check_timeout(timeout)?;
        let auto_resume = self.auto_resume(&req, timeout)?;
        if let Some(env) = &req.env_vars
            && let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0']))
        {
            return Err(SandboxError::Invalid(format!(
                "invalid envVars name {bad:?}"
            )));
        }
        let spec = RestoredSpec {
            template_id: req.template_id.clone(),
            metadata: req.metadata.unwrap_or_default(),
            env: merged_env(&handle, req.env_vars),
            secure: req.secure.unwrap_or(secure_by_default),
            timeout,
            auto_pause: req.auto_pause.unwrap_or(false),
            auto_resume,
            auto_pause_files_only: req.auto_pause == Some(true)
                && req.auto_pause_memory == Some(false),
            parent_id: None,
            network: network.unwrap_or_else(|| RestoredNetwork::Of(snap.source_id.clone())),
        };
        self.create_restored(key, spec, snap, &handle).await
    }

    /// A new sandbox of `key` restored from `snap`, running and initialised.
    pub(super) async fn create_restored(
        self: &Arc<Self>,
        key: &KeyRow,
        spec: RestoredSpec,
        snap: &SnapshotRow,
        handle: &SnapshotHandle,
    ) -> Result<SandboxRow, SandboxError> {
        let access_token = if spec.secure {
            Some(random_hex(20).map_err(Error::io("getrandom for an access token"))?)
        } else {
            None
        };
        let id = sandcell_runtime::new_sandbox_id().map_err(Error::from)?;
        let image: sandcell_runtime::Image = (&handle.image).into();
        let row = SandboxRow {
            id: id.clone(),
            key_id: key.id.clone(),
            template_id: spec.template_id,
            runtime: self.runtime_name().to_string(),
            state: State::Creating,
            secure: spec.secure,
            access_token,
            metadata: spec.metadata,
            vcpus: u32::from(handle.vcpus),
            memory_mib: handle.memory_mib,
            // A gvisor snapshot of a sandbox with a disk is restored with one of its size.
            disk_mib: match &handle.files {
                sandcell_runtime::snapshot::SnapshotFiles::Gvisor {
                    disk_mib: Some(mib),
                    ..
                } => *mib,
                _ => disk_mib(&image),
            },
            envd_version: String::new(),
            created_at: now_ms(),
            started_at: None,
            end_at: None,
            ended_at: None,
            end_reason: None,
            handle: None,
        };
        // The key's quotas and the host's capacity (sandboxes/admission.rs).
        self.admit_new(key, &row).await?;
        self.db
            .set_sandbox_lifecycle(
                &id,
                &LifecycleRow {
                    auto_pause: spec.auto_pause,
                    auto_pause_files_only: spec.auto_pause_files_only,
                    paused_in: None,
                    parent_id: spec.parent_id,
                    auto_resume: spec.auto_resume,
                },
            )
            .await?;
        // Before the restore: its root layer lies on the snapshot's files.
        self.db.add_snapshot_user(&snap.id, &id).await?;
        match &spec.network {
            RestoredNetwork::Of(source) => {
                if let Some(egress) = crate::networks::service::egress_of(&self.db, source).await? {
                    crate::networks::service::store_egress(&self.db, &id, &egress).await?;
                    crate::networks::service::inherit(&self.db, &key.id, source, &id).await?;
                    crate::networks::egress_proxy::inherit(
                        &self.db,
                        self.networks.key_ring(),
                        source,
                        &id,
                    )
                    .await?;
                    self.networks
                        .inherit_port_access(&self.db, source, &id)
                        .await?;
                }
            }
            RestoredNetwork::Request(Some(net)) => {
                self.networks.record(&self.db, &id, &key.id, net).await?;
            }
            RestoredNetwork::Request(None) => {}
        }
        // Restored (and retried) until its agent answers /init; finish_create then sends it
        // again with the same identity, a no-op for the agent.
        let sandbox = match self
            .restore_and_init(handle, &id, &spec.env, row.access_token.as_deref())
            .await
        {
            Ok(sandbox) => sandbox,
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
                self.collect_snapshots().await;
                return Err(e);
            }
        };
        let created = self
            .finish_create(row, sandbox, &spec.env, spec.timeout)
            .await;
        if created.is_err() {
            self.collect_snapshots().await;
        }
        created
    }
}
