//! Named snapshots, fork, and sandboxes created from a snapshot (the restore path).
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
//! Files go when nothing needs them (snapshot_store.rs): a named snapshot until deleted, a
//! fork's until its last child (and the parent) is gone.

use crate::db::{KeyRow, SandboxRow, State};
use crate::error::{ApiError, ApiResult, Error};
use crate::lifecycle::{DEFAULT_TIMEOUT_SECS, Lifecycle, MAX_TIMEOUT_SECS, disk_mib};
use crate::models::NewSandbox;
use crate::pause::{merged_env, new_snapshot_id, op_lock, parse_handle};
use crate::snapshot_store::{LifecycleRow, SnapshotKind, SnapshotRow};
use crate::util::{now_ms, random_hex};
use sandcell_runtime::SnapshotHandle;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most children one fork makes (E2B: 1 to 100; its SDKs allow up to 20).
pub const MAX_FORK_COUNT: u32 = 100;
/// A fork's children's timeout when the request gives none (E2B's default).
pub const DEFAULT_FORK_TIMEOUT_SECS: u64 = 15;

/// What a sandbox restored from a snapshot is made with.
struct RestoredSpec {
    template_id: String,
    metadata: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    secure: bool,
    timeout: u64,
    auto_pause: bool,
    parent_id: Option<String>,
    network: RestoredNetwork,
}

/// The network rules a restored sandbox gets.
pub(crate) enum RestoredNetwork {
    /// Those of this sandbox (a fork's parent, a named snapshot's source): restored
    /// processes expect the network they had, private networks included.
    Of(String),
    /// The create request's own (a template's snapshot: the build sandbox's rules were
    /// the build's, not the user's); `None` on a daemon without networks.
    Request(Option<crate::networks::NetRequest>),
}

/// Snapshot names: plain names, not ids (`snap-...`), at most 128 characters.
pub fn valid_snapshot_name(name: &str) -> bool {
    crate::lifecycle::valid_template_name(name) && !name.starts_with("snap-")
}

fn check_timeout(timeout: u64) -> ApiResult<()> {
    if timeout > MAX_TIMEOUT_SECS {
        return Err(ApiError::bad_request(format!(
            "timeout {timeout} s is above the maximum of {MAX_TIMEOUT_SECS} s"
        )));
    }
    Ok(())
}

impl Lifecycle {
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

    /// Checkpoints running sandbox `row` into a new snapshot of `kind`; the sandbox keeps
    /// running (gvisor: restored in place). 404 when it is not running.
    pub(crate) async fn checkpoint(
        &self,
        row: &SandboxRow,
        kind: SnapshotKind,
        name: Option<String>,
    ) -> ApiResult<(SnapshotRow, SnapshotHandle)> {
        let id = &row.id;
        let _op = op_lock(id).await;
        let current = self.db.sandbox(id).await?;
        match current.map(|r| r.state) {
            Some(State::Running) => {}
            Some(State::Paused) => {
                return Err(ApiError::conflict(format!(
                    "sandbox {id} is paused: resume it first"
                )));
            }
            _ => return Err(ApiError::sandbox_not_found(id)),
        }
        let live = self
            .live(id)
            .ok_or_else(|| ApiError::sandbox_not_found(id))?;
        let snap_id = new_snapshot_id()?;
        let dir = self.snapshot_dir(&snap_id);
        let mut snap = SnapshotRow {
            id: snap_id.clone(),
            key_id: row.key_id.clone(),
            kind,
            name,
            source_id: id.clone(),
            template_id: row.template_id.clone(),
            dir: dir.to_string_lossy().into_owned(),
            handle: None,
            created_at: now_ms(),
            deleted_at: None,
        };
        // The parent is a user too: it runs on what was restored in place from it.
        self.db.insert_snapshot(&snap, &[id]).await?;
        let runtime_kind = match kind {
            SnapshotKind::Fork => sandcell_runtime::SnapshotKind::Fork,
            SnapshotKind::Named | SnapshotKind::Pause | SnapshotKind::Template => {
                sandcell_runtime::SnapshotKind::Full
            }
        };
        let taken = live.sandbox.snapshot(&dir, runtime_kind).await;
        // Restored in place: a new host process, a new handle for a restarted daemon.
        let sandbox_handle = live
            .sandbox
            .handle()
            .and_then(|h| serde_json::to_string(&h).ok());
        self.db.set_handle(id, sandbox_handle.as_deref()).await?;
        match taken {
            Ok(handle) => {
                let json = serde_json::to_string(&handle)
                    .map_err(|e| ApiError::internal(format!("encoding the snapshot: {e}")))?;
                self.db.set_snapshot_handle(&snap_id, &json).await?;
                snap.handle = Some(json);
                Ok((snap, handle))
            }
            Err(e) => {
                self.db.discard_snapshot(&snap_id, now_ms()).await?;
                self.collect_snapshots().await;
                Err(Error::from(e).into())
            }
        }
    }

    /// `POST /sandboxes/{id}/snapshots`.
    pub async fn snapshot_named(
        &self,
        row: &SandboxRow,
        name: Option<String>,
    ) -> ApiResult<SnapshotRow> {
        if let Some(name) = &name {
            if !valid_snapshot_name(name) {
                return Err(ApiError::bad_request(format!(
                    "invalid snapshot name {name:?}: letters, digits, '-', '_' and '.', \
                     not starting with 'snap-'"
                )));
            }
            if self.dirs.images().join(name).exists() {
                return Err(ApiError::bad_request(format!(
                    "snapshot name {name:?} is the name of an installed template"
                )));
            }
        }
        let (snap, _) = self.checkpoint(row, SnapshotKind::Named, name).await?;
        // A snapshot of the same name before it is replaced: maybe unused now.
        self.collect_snapshots().await;
        Ok(snap)
    }

    /// `POST /sandboxes/{id}/fork`: one result per child, in order.
    pub async fn fork(
        self: &Arc<Self>,
        key: &KeyRow,
        parent: &SandboxRow,
        count: u32,
        timeout: u64,
    ) -> ApiResult<Vec<ApiResult<SandboxRow>>> {
        check_timeout(timeout)?;
        if !(1..=MAX_FORK_COUNT).contains(&count) {
            return Err(ApiError::bad_request(format!(
                "count {count} is out of range: 1 to {MAX_FORK_COUNT}"
            )));
        }
        let (snap, handle) = self.checkpoint(parent, SnapshotKind::Fork, None).await?;
        let auto_pause = self.db.sandbox_lifecycle(&parent.id).await?.auto_pause;
        let mut results = Vec::with_capacity(count as usize);
        // One after the other: the gvisor runtime restores one at a time anyway.
        for _ in 0..count {
            let spec = RestoredSpec {
                template_id: parent.template_id.clone(),
                metadata: parent.metadata.clone(),
                env: handle.env.clone(),
                secure: parent.secure,
                timeout,
                auto_pause,
                parent_id: Some(parent.id.clone()),
                network: RestoredNetwork::Of(parent.id.clone()),
            };
            results.push(self.create_restored(key, spec, &snap, &handle).await);
        }
        Ok(results)
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
    ) -> ApiResult<SandboxRow> {
        let handle = parse_handle(snap)?;
        let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
        check_timeout(timeout)?;
        if let Some(env) = &req.env_vars
            && let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains(['=', '\0']))
        {
            return Err(ApiError::bad_request(format!(
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
            parent_id: None,
            network: network.unwrap_or_else(|| RestoredNetwork::Of(snap.source_id.clone())),
        };
        self.create_restored(key, spec, snap, &handle).await
    }

    /// A new sandbox of `key` restored from `snap`, running and initialised.
    async fn create_restored(
        self: &Arc<Self>,
        key: &KeyRow,
        spec: RestoredSpec,
        snap: &SnapshotRow,
        handle: &SnapshotHandle,
    ) -> ApiResult<SandboxRow> {
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
            disk_mib: disk_mib(&image),
            envd_version: String::new(),
            created_at: now_ms(),
            started_at: None,
            end_at: None,
            ended_at: None,
            end_reason: None,
            handle: None,
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
        self.db
            .set_sandbox_lifecycle(
                &id,
                &LifecycleRow {
                    auto_pause: spec.auto_pause,
                    paused_in: None,
                    parent_id: spec.parent_id,
                },
            )
            .await?;
        // Before the restore: its root layer lies on the snapshot's files.
        self.db.add_snapshot_user(&snap.id, &id).await?;
        match &spec.network {
            RestoredNetwork::Of(source) => {
                if let Some(egress) = crate::networks::egress_of(&self.db, source).await? {
                    crate::networks::store_egress(&self.db, &id, &egress).await?;
                    crate::networks::inherit(&self.db, &key.id, source, &id).await?;
                }
            }
            RestoredNetwork::Request(Some(net)) => {
                crate::networks::record(&self.db, &id, &key.id, net).await?;
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
                        Some(&e.message),
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
