//! Memory snapshots of installed templates with a start command (`code-interpreter-v1`):
//! the template's sandboxes restore its start command running, as E2B's do, instead of
//! booting and waiting for it (issue 16: `run_code` answers at once after create).
//!
//! An installed template (`make install`, scripts/install-artifacts.sh) has an `e2b.json`
//! whose `buildId` is `installed`; the daemon never writes into it (test daemons share the
//! installed image directories). Its snapshot is recorded in the database instead
//! (store/installed_snapshots.rs), with a fingerprint of what it was taken of: the image's
//! `.installed` identity, its `e2b.json` and the runtime. A reinstalled image no longer
//! matches and boots until a new snapshot replaces the old.
//!
//! The first create of such a template boots (and runs the start command) as before; once it
//! has answered, [`take_later`] takes the snapshot in the background, once per template and
//! daemon run, under the daemon's own key (store/keys.rs `SYSTEM_KEY_ID`), so that the
//! sandbox it is taken of belongs to no tenant. Later creates of the snapshot's size restore
//! it ([`usable`]); a restore that fails on our side boots. [`FORGET_AFTER_FALLBACKS`] such
//! failures in a row (a create of some key can make its own restore fail, so one failure
//! says little about the snapshot) retire the snapshot, and the next booted create takes a
//! new one; a snapshot that could not be taken, or was retired so twice, is not tried again
//! until the daemon restarts.

use crate::sandboxes::models::NewSandbox;
use crate::sandboxes::service::{SandboxService, lock};
use crate::store::installed_snapshots::InstalledSnapshotRow;
use crate::store::keys::SYSTEM_KEY_ID;
use crate::store::snapshots::SnapshotRow;
use crate::templates::builds::{E2B_FILE, E2bRecord};
use crate::templates::error::TemplateError;
use crate::templates::memory_snapshot;
use crate::util::now_ms;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::{Arc, Mutex};

/// The `buildId` of an installed template's `e2b.json`.
pub const INSTALLED_BUILD_ID: &str = "installed";
/// The image's identity file, written by scripts/install-artifacts.sh.
const INSTALLED_FILE: &str = ".installed";
/// Largest identity or `e2b.json` file read for a fingerprint.
const MAX_FINGERPRINT_INPUT: u64 = 1 << 20;
/// Restores of one snapshot failing in a row (no restore of it succeeding between) before it
/// is retired.
pub const FORGET_AFTER_FALLBACKS: u32 = 3;
/// Snapshots of one template retired in one daemon run before it is not taken again.
const MAX_FORGETS: u32 = 2;

/// The templates whose snapshot is being taken, those not to take again in this daemon run,
/// and the restores failing in a row and snapshots retired so far, per template.
#[derive(Debug, Default)]
pub struct Takes {
    in_flight: Mutex<HashSet<String>>,
    failed: Mutex<HashSet<String>>,
    fallbacks: Mutex<HashMap<String, u32>>,
    forgets: Mutex<HashMap<String, u32>>,
}

/// How a take ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// A new snapshot is recorded.
    New,
    /// The recorded one is current: nothing to do.
    Current,
    /// None could be taken (logged).
    Failed,
}

/// Takes `template` out of the in-flight set when the take ends, a panic included.
struct InFlight<'a> {
    takes: &'a Takes,
    template: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.takes.in_flight).remove(&self.template);
    }
}

/// Whether `rec` is an installed template that starts something (what a snapshot saves).
pub fn applies(rec: Option<&E2bRecord>) -> bool {
    rec.is_some_and(|r| r.build_id == INSTALLED_BUILD_ID && r.start_cmd.is_some())
}

fn read_bounded(path: &std::path::Path) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_FINGERPRINT_INPUT)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// What a snapshot of installed template `template` is valid for; `None` when the image has
/// no identity file (not installed by install-artifacts.sh: never snapshotted).
pub fn fingerprint(lifecycle: &SandboxService, template: &str) -> Option<String> {
    let dir = lifecycle.dirs().images().join(template);
    let identity = read_bounded(&dir.join(INSTALLED_FILE))?;
    let record = read_bounded(&dir.join(E2B_FILE))?;
    let mut h = Sha256::new();
    // Length-prefixed, so that no two inputs hash alike by moving bytes between parts.
    for part in [
        identity.as_slice(),
        record.as_slice(),
        lifecycle.runtime_name().as_bytes(),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    Some(crate::util::hex(&h.finalize()))
}

/// The snapshot a create of installed template `req.template_id` restores: the recorded one,
/// if it was taken of the image as installed now, is live, and has the requested size.
pub async fn usable(
    lifecycle: &SandboxService,
    req: &NewSandbox,
    rec: Option<&E2bRecord>,
) -> Result<Option<SnapshotRow>, TemplateError> {
    if !applies(rec) {
        return Ok(None);
    }
    let Some(row) = lifecycle.db.installed_snapshot(&req.template_id).await? else {
        return Ok(None);
    };
    if fingerprint(lifecycle, &req.template_id).as_deref() != Some(row.fingerprint.as_str()) {
        return Ok(None);
    }
    let Some(snap) = lifecycle.db.snapshot(&row.snapshot_id).await? else {
        return Ok(None);
    };
    memory_snapshot::fitting(req, snap)
}

/// After a booted create of installed template `template`: takes its snapshot in the
/// background unless one is current, being taken, or failed in this daemon run.
pub fn take_later(lifecycle: &Arc<SandboxService>, template: &str) {
    if lock(&lifecycle.installed_snapshots.failed).contains(template)
        || !lock(&lifecycle.installed_snapshots.in_flight).insert(template.to_string())
    {
        return;
    }
    let lifecycle = lifecycle.clone();
    let template = template.to_string();
    tokio::spawn(async move {
        let _in_flight = InFlight {
            takes: &lifecycle.installed_snapshots,
            template: template.clone(),
        };
        match take(&lifecycle, &template).await {
            Taken::New => lifecycle.metrics.count_installed_snapshot(true),
            Taken::Current => {}
            Taken::Failed => {
                lifecycle.metrics.count_installed_snapshot(false);
                lock(&lifecycle.installed_snapshots.failed).insert(template.clone());
            }
        }
    });
}

/// Takes and records the snapshot unless the recorded one is current.
async fn take(lifecycle: &Arc<SandboxService>, template: &str) -> Taken {
    let Some(before) = fingerprint(lifecycle, template) else {
        return Taken::Failed;
    };
    if let Ok(Some(row)) = lifecycle.db.installed_snapshot(template).await
        && row.fingerprint == before
        && memory_snapshot::is_current(lifecycle, &row.snapshot_id).await
    {
        return Taken::Current;
    }
    let key = match lifecycle.db.key_by_id(SYSTEM_KEY_ID).await {
        Ok(Some(key)) => key,
        Ok(None) => {
            tracing::warn!("installed template {template}: the daemon's own key is missing");
            return Taken::Failed;
        }
        Err(e) => {
            tracing::warn!("installed template {template}: {e}");
            return Taken::Failed;
        }
    };
    tracing::info!("installed template {template}: taking its memory snapshot");
    let snapshot_id = match memory_snapshot::take(
        lifecycle,
        &key,
        template,
        INSTALLED_BUILD_ID,
        memory_snapshot::Reach::DaemonOnly,
    )
    .await
    {
        Ok(id) => id,
        Err(e) => {
            tracing::warn!(
                "installed template {template}: no memory snapshot ({e}); its creates boot"
            );
            return Taken::Failed;
        }
    };
    // Reinstalled while the snapshot was taken: it is of the old image.
    if fingerprint(lifecycle, template).as_deref() != Some(before.as_str()) {
        tracing::info!("installed template {template} changed during its snapshot: retired");
        memory_snapshot::retire(lifecycle, &snapshot_id).await;
        return Taken::Failed;
    }
    let row = InstalledSnapshotRow {
        template_id: template.to_string(),
        fingerprint: before,
        snapshot_id: snapshot_id.clone(),
    };
    match lifecycle.db.set_installed_snapshot(&row, now_ms()).await {
        Ok(old) => {
            tracing::info!("installed template {template}: memory snapshot {snapshot_id}");
            if let Some(old) = old {
                memory_snapshot::retire(lifecycle, &old).await;
            }
            Taken::New
        }
        Err(e) => {
            tracing::warn!("{e}");
            memory_snapshot::retire(lifecycle, &snapshot_id).await;
            Taken::Failed
        }
    }
}

/// A restore of installed template `template`'s snapshot succeeded.
pub fn restored(lifecycle: &SandboxService, template: &str) {
    lock(&lifecycle.installed_snapshots.fallbacks).remove(template);
}

/// A restore of installed template `template`'s snapshot `snapshot_id` failed on our side
/// (the create boots): the [`FORGET_AFTER_FALLBACKS`]th in a row retires the snapshot.
pub async fn fell_back(lifecycle: &SandboxService, template: &str, snapshot_id: &str) {
    let takes = &lifecycle.installed_snapshots;
    {
        let mut fallbacks = lock(&takes.fallbacks);
        let n = fallbacks.entry(template.to_string()).or_default();
        *n += 1;
        if *n < FORGET_AFTER_FALLBACKS {
            return;
        }
        fallbacks.remove(template);
    }
    let forgets = {
        let mut forgets = lock(&takes.forgets);
        let n = forgets.entry(template.to_string()).or_default();
        *n += 1;
        *n
    };
    tracing::warn!(
        "installed template {template}: {FORGET_AFTER_FALLBACKS} restores of snapshot \
         {snapshot_id} failed in a row: retired"
    );
    if forgets >= MAX_FORGETS {
        lock(&takes.failed).insert(template.to_string());
    }
    forget(lifecycle, template, snapshot_id).await;
}

/// Retires installed template `template`'s snapshot `snapshot_id` and its record.
async fn forget(lifecycle: &SandboxService, template: &str, snapshot_id: &str) {
    if let Err(e) = lifecycle
        .db
        .forget_installed_snapshot(template, snapshot_id)
        .await
    {
        tracing::warn!("{e}");
    }
    memory_snapshot::retire(lifecycle, snapshot_id).await;
}

/// The template snapshots recorded for installed templates as installed now; the records of
/// others (image reinstalled or removed, runtime changed) are dropped, and their snapshots
/// are left for the caller to retire. `None`: the records could not be read (the caller
/// then retires nothing).
pub async fn current(lifecycle: &SandboxService) -> Option<HashSet<String>> {
    let rows = match lifecycle.db.installed_snapshots().await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!("{e}");
            return None;
        }
    };
    let mut keep = HashSet::new();
    for row in rows {
        if fingerprint(lifecycle, &row.template_id).as_deref() == Some(row.fingerprint.as_str()) {
            keep.insert(row.snapshot_id);
            continue;
        }
        tracing::info!(
            "installed template {} changed since snapshot {}: dropped",
            row.template_id,
            row.snapshot_id
        );
        if let Err(e) = lifecycle
            .db
            .forget_installed_snapshot(&row.template_id, &row.snapshot_id)
            .await
        {
            tracing::warn!("{e}");
        }
    }
    Some(keep)
}
