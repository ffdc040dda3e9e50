//! The first start of a sandbox created from a template snapshot
//! ([`super::super::boot_snapshot`]): take an idle VMM from the warm pool, move its
//! control socket and log to the sandbox's paths, and send it `restore` with the sandbox's
//! own vsock socket, serial log and new empty disk top over the snapshot's frozen layers.
//! The VMM then is this sandbox's, like a cold-booted one (stop, snapshot, adopt).
//!
//! Until the pooled VMM has accepted the restore nothing is lost by giving up: the caller
//! boots cold (one log line). After that, a failure is the start's failure.

use super::super::boot_snapshot::{TemplateKey, TemplateSnapshots};
use super::super::warm_pool::{PooledVmm, WarmPool};
use super::*;
use crate::snapshot::SnapshotFiles;
use sandcell_proto::sync::lock;
use sandcell_proto::vmm::RestoreOverrides;
use std::sync::Arc;
use std::time::Instant;

/// The restore answers once memory is mapped and devices are rebuilt: seconds at most even
/// under nested virtualization.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a create from a template snapshot needs at start.
pub(in crate::microvm) struct TemplatePlan {
    pub(in crate::microvm) store: Arc<TemplateSnapshots>,
    pub(in crate::microvm) pool: Arc<WarmPool>,
    pub(in crate::microvm) key: TemplateKey,
    pub(in crate::microvm) image: crate::Image,
}

pub(super) enum Outcome {
    /// The pooled VMM became this sandbox's: the start's result.
    Started(Result<()>),
    /// Nothing was started: boot cold, for this reason.
    ColdBoot(String),
}

pub(super) async fn start(sb: &MicrovmSandbox, plan: TemplatePlan) -> Outcome {
    let began = Instant::now();
    let (snapshot, built) = match plan
        .store
        .get_or_build(&plan.key, &plan.image, sb.boot_timeout)
        .await
    {
        Ok(s) => s,
        Err(e) => return Outcome::ColdBoot(format!("the template snapshot: {e}")),
    };
    let SnapshotFiles::Microvm {
        state,
        memory,
        disk_layers,
        ..
    } = &snapshot.files
    else {
        return Outcome::ColdBoot("the template snapshot is not a microvm one".into());
    };
    let snapshot_ms = began.elapsed().as_millis();
    let vmm = match plan.pool.take().await {
        Ok(v) => v,
        Err(e) => return Outcome::ColdBoot(format!("the warm VMM pool: {e}")),
    };
    let request = ControlRequest::Restore {
        state_path: state.clone(),
        mem_path: memory.clone(),
        overrides: RestoreOverrides {
            vsock_uds_path: Some(sb.paths.vsock.clone()),
            disk_overlay: Some(sb.paths.overlay.clone()),
            disk_layers: Some(disk_layers.clone()),
            net_tap: None,
            serial_log: Some(sb.paths.console.clone()),
        },
        paused: false,
    };
    if let Err(e) = adopt_files(sb, &vmm) {
        vmm.discard();
        return Outcome::ColdBoot(e);
    }
    let restore_began = Instant::now();
    if let Err(e) = sb.control_within(&request, RESTORE_TIMEOUT).await {
        vmm.discard();
        // The cold boot makes its own socket, log and disk top.
        for path in [&sb.paths.control, &sb.paths.vmm_log, &sb.paths.overlay] {
            let _ = std::fs::remove_file(path);
        }
        return Outcome::ColdBoot(format!("restoring into the pooled VMM: {e}"));
    }
    let restore_ms = restore_began.elapsed().as_millis();
    *lock(&sb.snap.layers) = disk_layers.clone();
    let PooledVmm { child, pid, slot } = vmm;
    let _ = crate::util::remove_dir_all_if_exists(&slot);
    let result = sb.supervise(child, pid).await;
    if result.is_ok() {
        // The nested harness (tests/nested/l1/template.sh) finds this line by its text.
        tracing::info!(
            "microvm sandbox {}: restored from template snapshot {} in pooled VMM {pid} \
             (snapshot {}: {snapshot_ms} ms, restore {restore_ms} ms, agent answering after \
             {} ms in all)",
            sb.id,
            snapshot.dir.display(),
            if built { "built now" } else { "ready" },
            began.elapsed().as_millis()
        );
    }
    Outcome::Started(result)
}

/// Moves the pooled VMM's control socket and log to the sandbox's paths (the VMM keeps its
/// bound socket and open log through a rename) and records its pid where the sweep of a
/// dead owner looks for it.
fn adopt_files(sb: &MicrovmSandbox, vmm: &PooledVmm) -> std::result::Result<(), String> {
    let moves = [
        (vmm.control(), sb.paths.control.clone()),
        (vmm.log(), sb.paths.vmm_log.clone()),
    ];
    for (from, to) in moves {
        std::fs::rename(&from, &to)
            .map_err(|e| format!("moving {} to {}: {e}", from.display(), to.display()))?;
    }
    let run = sb.dirs.sandbox_run_dir(&sb.id);
    std::fs::write(run.join("vmm.pid"), vmm.pid.to_string())
        .map_err(|e| format!("writing {}/vmm.pid: {e}", run.display()))?;
    std::fs::write(
        run.join(POOL_MARK),
        vmm.control().as_os_str().as_encoded_bytes(),
    )
    .map_err(|e| format!("writing {}/{POOL_MARK}: {e}", run.display()))?;
    std::fs::create_dir_all(&sb.paths.state_dir)
        .map_err(|e| format!("creating {}: {e}", sb.paths.state_dir.display()))
}

/// In the run dir of a sandbox whose VMM came from the pool: the control socket path its
/// command line names (the sweep's check that a pid is still that VMM).
pub(in crate::microvm) const POOL_MARK: &str = "vmm.pool-socket";
