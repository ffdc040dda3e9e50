//! The first start of a sandbox created from a template snapshot
//! ([`super::super::boot_snapshot`]): take an idle VMM from the warm pool, move its
//! control socket and log to the sandbox's paths, and send it `restore` with the sandbox's
//! own vsock socket, serial log and new empty disk top over the snapshot's frozen layers.
//! The VMM then is this sandbox's, like a cold-booted one (stop, snapshot, adopt).
//!
//! Until the pooled VMM has accepted the restore nothing is lost by giving up: the caller
//! boots cold (one log line). After that, a failure is the start's failure.
//!
//! A jailed pooled VMM (jail/pooled.rs) is given its sandbox first: the snapshot's files
//! linked into its state directory, it moves into a cgroup of the sandbox's, its two directories
//! renamed to the sandbox's; the restore then names paths as its jail shows them.

use super::super::boot_snapshot::{TemplateKey, TemplateSnapshots};
use super::super::jail::VMM_DIR;
use super::super::jail::pooled::{VmmView, link_inputs};
use super::super::warm_pool::{PooledVmm, WarmPool};
use super::*;
use crate::snapshot::SnapshotFiles;
use sandcell_proto::sync::lock;
use sandcell_proto::vmm::RestoreOverrides;
use std::path::Path;
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
    /// The network settings a networked template VM boots with (`key.network`).
    pub(in crate::microvm) network: Option<sandcell_net::NetConfig>,
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
        .get_or_build(
            &plan.key,
            &plan.image,
            plan.network.as_ref(),
            sb.boot_timeout,
        )
        .await
    {
        Ok(s) => s,
        Err(e) => return Outcome::ColdBoot(format!("the template snapshot: {e}")),
    };
    let SnapshotFiles::Microvm {
        state,
        memory,
        disk_base,
        disk_layers,
        network: has_net_device,
        ..
    } = &snapshot.files
    else {
        return Outcome::ColdBoot("the template snapshot is not a microvm one".into());
    };
    let snapshot_ms = began.elapsed().as_millis();
    // The sandbox's TAP for the snapshot's net device, attached here in its namespace
    // (the pooled VMM is in none of the sandbox's); the guest is readdressed once up.
    let net = sb.network();
    let (tap, readdress) = match (*has_net_device, &net) {
        (false, None) => (None, None),
        (true, Some(net)) => match network::open_tap(net.network()).await {
            Ok(fd) => (Some(fd), Some(network::init_value(net.network()))),
            Err(e) => return Outcome::ColdBoot(format!("the sandbox's TAP: {e}")),
        },
        (has, _) => {
            return Outcome::ColdBoot(format!(
                "the template snapshot {} a net device and the sandbox {} a network",
                if has { "has" } else { "has no" },
                if has { "has no" } else { "has" },
            ));
        }
    };
    let mut vmm = match plan.pool.take().await {
        Ok(v) => v,
        Err(e) => return Outcome::ColdBoot(format!("the warm VMM pool: {e}")),
    };
    let mut request = ControlRequest::Restore {
        state_path: state.clone(),
        mem_path: memory.clone(),
        overrides: RestoreOverrides {
            vsock_uds_path: Some(sb.paths.vsock.clone()),
            disk_overlay: Some(sb.paths.overlay.clone()),
            disk_layers: Some(disk_layers.clone()),
            disk_base: None,
            net_tap: None,
            net_tap_fd: tap.is_some(),
            serial_log: Some(sb.paths.console.clone()),
        },
        paused: false,
    };
    let inputs = SnapshotInputs {
        state,
        memory,
        base: disk_base.as_deref(),
        layers: disk_layers,
    };
    if let Err(e) = adopt_files(sb, &mut vmm, &inputs, &mut request) {
        vmm.discard();
        remove_vmm_dirs(sb);
        return Outcome::ColdBoot(e);
    }
    let restore_began = Instant::now();
    if let Err(e) = sb.control_passing(&request, tap, RESTORE_TIMEOUT).await {
        vmm.discard();
        // The cold boot makes its own socket, log and disk top.
        for path in [&sb.paths.control, &sb.paths.vmm_log, &sb.paths.overlay] {
            let _ = std::fs::remove_file(path);
        }
        remove_vmm_dirs(sb);
        return Outcome::ColdBoot(format!("restoring into the pooled VMM: {e}"));
    }
    let restore_ms = restore_began.elapsed().as_millis();
    *lock(&sb.snap.layers) = disk_layers.clone();
    let PooledVmm {
        child,
        pid,
        slot,
        jail,
    } = vmm;
    let _ = crate::util::remove_dir_all_if_exists(&slot);
    if let Some((jail, state_slot)) = jail {
        let _ = crate::util::remove_dir_all_if_exists(&state_slot);
        *lock(&sb.jail) = Some(jail);
    }
    let mut result = sb.supervise(child, pid).await;
    // The guest still has the template VM's address, gateway and resolver: readdressed
    // before anyone else talks to it (as a restored snapshot's, snapshot.rs).
    if let (Ok(()), Some(value)) = (&result, readdress) {
        result = super::snapshot::readdress_guest(sb, value).await;
    }
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

/// Where a template snapshot's files are.
struct SnapshotInputs<'a> {
    state: &'a Path,
    memory: &'a Path,
    base: Option<&'a Path>,
    layers: &'a [PathBuf],
}

/// The jailed layout's `vmm/` directories of a sandbox that a failed take may have left
/// (the cold boot makes its own, for another uid).
fn remove_vmm_dirs(sb: &MicrovmSandbox) {
    if sb.paths.jailed {
        let _ =
            crate::util::remove_dir_all_if_exists(&sb.dirs.sandbox_run_dir(&sb.id).join(VMM_DIR));
        let _ = crate::util::remove_dir_all_if_exists(&sb.paths.vmm_state_dir);
    }
}

/// Gives a jailed pooled VMM its sandbox (module documentation), and points `request` at
/// the paths its jail shows.
fn adopt_jailed(
    sb: &MicrovmSandbox,
    vmm: &mut PooledVmm,
    inputs: &SnapshotInputs<'_>,
    request: &mut ControlRequest,
) -> std::result::Result<(), String> {
    let slot_run = vmm.slot.join(VMM_DIR);
    let Some((jail, state_slot)) = vmm.jail.as_mut() else {
        return Ok(());
    };
    let slot_state = state_slot.join(VMM_DIR);
    let mut files: Vec<(String, &Path)> = vec![
        ("in.state".into(), inputs.state),
        ("in.memory".into(), inputs.memory),
    ];
    files.extend(inputs.base.map(|b| ("in.base".to_string(), b)));
    for (i, layer) in inputs.layers.iter().enumerate() {
        files.push((format!("in.layer.{i}"), layer));
    }
    let mut links = link_inputs(&slot_state, &files)
        .map_err(|e| format!("giving the pooled VMM the snapshot: {e}"))?
        .into_iter();
    jail.assign(&sb.id, sb.memory_mib, sb.vcpus)
        .map_err(|e| format!("giving the pooled VMM's jail to {}: {e}", sb.id))?;
    let run = sb.dirs.sandbox_run_dir(&sb.id);
    for dir in [&run, &sb.paths.state_dir] {
        super::super::jail::private_dir(dir).map_err(|e| e.to_string())?;
    }
    let run_vmm = run.join(VMM_DIR);
    let moves = [
        (&slot_run, &run_vmm),
        (&slot_state, &sb.paths.vmm_state_dir),
    ];
    for (from, to) in moves {
        // A directory renamed over an empty one replaces it: there must be none.
        if std::fs::symlink_metadata(to).is_ok() {
            return Err(format!("{} exists already", to.display()));
        }
        std::fs::rename(from, to)
            .map_err(|e| format!("moving {} to {}: {e}", from.display(), to.display()))?;
    }
    let view = VmmView {
        run: (run_vmm, slot_run),
        state: (sb.paths.vmm_state_dir.clone(), slot_state),
    };
    if let ControlRequest::Restore {
        state_path,
        mem_path,
        overrides,
        ..
    } = request
    {
        let mut next = || links.next().unwrap_or_default();
        *state_path = next();
        *mem_path = next();
        if inputs.base.is_some() {
            overrides.disk_base = Some(next());
        }
        overrides.disk_layers = Some(links.collect());
        for path in [
            &mut overrides.vsock_uds_path,
            &mut overrides.disk_overlay,
            &mut overrides.serial_log,
        ]
        .into_iter()
        .flatten()
        {
            *path = view.in_vmm(path);
        }
    }
    *lock(&sb.vmm_view) = Some(view);
    Ok(())
}

/// Moves the pooled VMM's control socket and log to the sandbox's paths (the VMM keeps its
/// bound socket and open log through a rename; a jailed one's socket moves with its
/// directory) and records its pid where the sweep of a dead owner looks for it.
fn adopt_files(
    sb: &MicrovmSandbox,
    vmm: &mut PooledVmm,
    inputs: &SnapshotInputs<'_>,
    request: &mut ControlRequest,
) -> std::result::Result<(), String> {
    std::fs::create_dir_all(&sb.paths.state_dir)
        .map_err(|e| format!("creating {}: {e}", sb.paths.state_dir.display()))?;
    let mut moves = vec![(vmm.log(), sb.paths.vmm_log.clone())];
    if vmm.jail.is_some() {
        adopt_jailed(sb, vmm, inputs, request)?;
    } else {
        moves.push((vmm.control(), sb.paths.control.clone()));
    }
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
    .map_err(|e| format!("writing {}/{POOL_MARK}: {e}", run.display()))
}

/// In the run dir of a sandbox whose VMM came from the pool: the control socket path its
/// command line names (the sweep's check that a pid is still that VMM).
pub(in crate::microvm) const POOL_MARK: &str = "vmm.pool-socket";
