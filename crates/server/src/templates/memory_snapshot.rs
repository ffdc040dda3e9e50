//! Templates built through the template API are memory snapshots (E2B semantics).
//!
//! When a build's layers are done, [`take`] creates a sandbox of the new template under the
//! builder's key, which launches its `startCmd` and runs its `readyCmd` until it succeeds
//! (templates/start.rs), checkpoints its whole state (memory, processes, disk) into a snapshot
//! of kind `template`, and kills it. The build fails when the start or ready command does:
//! the template would not work.
//!
//! A create from the template then restores that snapshot ([`usable`]): the start command
//! is running already and is not run again, and the create costs a restore, not a boot.
//! The snapshot fixes the size: a create asking for other vCPUs or memory boots cold and runs
//! the start command itself. The create's own network rules apply, not the build sandbox's.
//!
//! The snapshot id is kept in the template's `e2b.json` (`snapshotID`): a template rebuilt or
//! removed outside the daemon (`sandcell template build|rm`) loses it with that file. A
//! rebuild or `DELETE /templates/{id}` retires the old snapshot; its files go once the
//! sandboxes restored from it are gone (store/snapshots.rs).
//!
//! When the runtime cannot snapshot the sandbox, the template stays without one and creates
//! boot and run the start command; so does a create whose restore fails (sandboxes/service.rs).

use crate::error::Error;
use crate::sandboxes::models::NewSandbox;
use crate::sandboxes::service::SandboxService;
use crate::store::KeyRow;
use crate::store::snapshots::{SnapshotPurpose, SnapshotRow};
use crate::templates::builds::{E2B_FILE, E2bRecord};
use crate::templates::error::TemplateError;
use crate::util::now_ms;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The build sandbox's timeout: long enough for the ready command and the checkpoint.
const BUILD_SANDBOX_TIMEOUT_SECS: u64 = crate::templates::start::READY_TIMEOUT.as_secs() + 300;
/// Metadata that marks the sandbox a build snapshots (it shows in the key's list briefly).
pub const BUILD_METADATA_KEY: &str = "sandcell.templateBuild";

#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    /// The template does not work: its sandbox, start or ready command failed.
    #[error("{0}")]
    Template(String),
    /// The runtime could not snapshot it; the template works without a snapshot.
    #[error("{0}")]
    NoSnapshot(String),
}

/// Who may reach the sandbox a snapshot is taken of, besides the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// An API build's: its builder's key (as any sandbox of the key).
    Builder,
    /// An installed template's, which every tenant's creates restore: no one. Its envd wants
    /// an access token, its ports a traffic token, neither given out, and it has no
    /// internet, so that nothing can be put into it before the checkpoint.
    DaemonOnly,
}

/// Boots template `template` for `key`, runs its start and ready commands and snapshots it;
/// the snapshot's id. `build_id` goes into the sandbox's metadata.
pub async fn take(
    lifecycle: &Arc<SandboxService>,
    key: &KeyRow,
    template: &str,
    build_id: &str,
    reach: Reach,
) -> Result<String, TakeError> {
    // The build's own sandbox: not counted against the key's concurrency limit.
    let mut key = key.clone();
    key.quotas = crate::store::keys::KeyQuotas::UNLIMITED;
    let req = NewSandbox {
        template_id: template.to_string(),
        timeout: Some(BUILD_SANDBOX_TIMEOUT_SECS),
        metadata: Some(BTreeMap::from([(
            BUILD_METADATA_KEY.to_string(),
            build_id.to_string(),
        )])),
        env_vars: None,
        secure: Some(reach == Reach::DaemonOnly),
        cpu_count: None,
        memory_mb: None,
        auto_pause: None,
        auto_resume: None,
        auto_pause_memory: None,
        allow_internet_access: (reach == Reach::DaemonOnly).then_some(false),
        network: (reach == Reach::DaemonOnly).then(|| crate::networks::api::NetworkConfig {
            allow_public_traffic: Some(false),
            ..Default::default()
        }),
        networks: None,
        volume_mounts: None,
    };
    // Runs the start and ready commands (the template has no snapshot yet).
    let row = lifecycle
        .create(&key, req, false)
        .await
        .map_err(|e| TakeError::Template(e.to_string()))?;
    // A daemon stopping meanwhile waits for no checkpoint (its kills would, for the op lock).
    let taken = if lifecycle.creates.is_stopping() {
        Err(TakeError::NoSnapshot("the daemon is stopping".into()))
    } else {
        lifecycle
            .checkpoint(&row, SnapshotPurpose::Template, None)
            .await
            .map_err(|e| TakeError::NoSnapshot(e.to_string()))
    };
    // The build sandbox is done either way; the snapshot does not need it.
    if let Err(e) = lifecycle.kill(&row.id, "template snapshot taken").await {
        tracing::warn!("template {template}: killing build sandbox {}: {e}", row.id);
    }
    taken.map(|(snap, _)| snap.id)
}

/// The template snapshot a create restores: that of `rec`, the `e2b.json` of the
/// API-built template `req` names, if it has a current one and `req` asks for no other size.
pub async fn usable(
    lifecycle: &SandboxService,
    req: &NewSandbox,
    rec: Option<&E2bRecord>,
) -> Result<Option<SnapshotRow>, TemplateError> {
    let Some(id) = rec.and_then(|r| r.snapshot_id.as_deref()) else {
        return Ok(None);
    };
    let Some(snap) = lifecycle.db.snapshot(id).await? else {
        return Ok(None);
    };
    fitting(req, snap)
}

/// `snap` if it is a live template snapshot of the size `req` asks for (or names none).
pub fn fitting(req: &NewSandbox, snap: SnapshotRow) -> Result<Option<SnapshotRow>, TemplateError> {
    if !is_live_template(&snap) {
        return Ok(None);
    }
    let handle = crate::snapshots::pause::parse_handle(&snap)?;
    let same_cpus = req.cpu_count.is_none_or(|c| c == u32::from(handle.vcpus));
    let same_memory = req.memory_mb.is_none_or(|m| m == handle.memory_mib);
    Ok((same_cpus && same_memory).then_some(snap))
}

/// A template snapshot not retired, with its files written.
fn is_live_template(snap: &SnapshotRow) -> bool {
    snap.kind == SnapshotPurpose::Template && snap.deleted_at.is_none() && snap.handle.is_some()
}

/// Whether `id` is a template snapshot not retired, with its files written.
pub async fn is_current(lifecycle: &SandboxService, id: &str) -> bool {
    matches!(lifecycle.db.snapshot(id).await, Ok(Some(snap)) if is_live_template(&snap))
}

/// Writes the snapshot id into the template's `e2b.json`.
pub fn record_in(lifecycle: &SandboxService, template: &str, rec: &E2bRecord) -> Result<(), Error> {
    let path = lifecycle.dirs().images().join(template).join(E2B_FILE);
    let bytes = serde_json::to_vec_pretty(rec).map_err(|e| Error::Io {
        what: format!("encoding {}", path.display()),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(&path, bytes).map_err(Error::io(format!("writing {}", path.display())))
}

/// The template's snapshot is no longer its own (rebuilt or deleted): its files go once no
/// sandbox restored from it runs.
pub async fn retire(lifecycle: &SandboxService, snapshot_id: &str) {
    if let Err(e) = lifecycle
        .db
        .retire_template_snapshot(snapshot_id, now_ms())
        .await
    {
        tracing::warn!("{e}");
    }
    lifecycle.collect_snapshots().await;
}

/// Retires the template snapshots whose template no longer names them: rebuilt or removed
/// with `sandcell template build|rm` while the daemon was down, a build cut off between
/// its snapshot and its `e2b.json`, or an installed template's snapshot of an image
/// reinstalled since (templates/installed_snapshot.rs). Collected by the caller.
pub async fn retire_orphans(lifecycle: &SandboxService) {
    let snapshots = match lifecycle.db.template_snapshots().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("{e}");
            return;
        }
    };
    let Some(installed) = crate::templates::installed_snapshot::current(lifecycle).await else {
        return;
    };
    for (id, template) in snapshots {
        if installed.contains(&id) {
            continue;
        }
        let current =
            crate::templates::start::record(lifecycle, &template).and_then(|r| r.snapshot_id);
        if current.as_deref() == Some(id.as_str()) {
            continue;
        }
        tracing::info!("template {template} no longer uses snapshot {id}: retired");
        if let Err(e) = lifecycle.db.retire_template_snapshot(&id, now_ms()).await {
            tracing::warn!("{e}");
        }
    }
}
