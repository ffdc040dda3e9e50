//! Restore: from a state file and a memory image to a running (or paused) `Vmm`.
//!
//! Order, and why (the order Firecracker restores in):
//! 1. The state file is read and checked (size cap, magic, version, checksum), then
//!    its shape validated, before /dev/kvm is touched; the memory image is checked
//!    against the saved memory size (a short file would SIGBUS us later).
//! 2. The VM; the image mapped `MAP_PRIVATE` (shared with every other restore of it
//!    until written) and registered as memory slots before the irqchip exists (cheaper,
//!    see builder); then TSS/identity map, irqchip, PIT.
//! 3. vCPUs created, and each one's state written (kvm::vcpu_state gives the order inside).
//! 4. VM state after the vCPUs': restoring the IOAPIC re-evaluates its pins and may
//!    deliver an interrupt into a LAPIC, which must then already hold its saved state
//!    (a later SET_LAPIC would overwrite the delivery). PIT and kvmclock with it.
//! 5. Devices after all KVM state: restoring one may raise an interrupt (the serial
//!    port re-raises a pending one), which a later SET_IRQCHIP would overwrite. virtio
//!    transports re-activate their devices with the saved queue positions.
//! 6. vCPU threads started, running or parked until a `resume`.

use std::path::PathBuf;

use sandcell_proto::vmm::RestoreOverrides;

use super::{BuildError, LegacyState, Prelude, attach_legacy, attach_virtio, finish};
use crate::bus::Bus;
use crate::devices::virtio::block::{Block, BlockOverrides};
use crate::devices::virtio::net::{Net, NetRestoreArgs};
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::vsock::Vsock;
use crate::kvm::vcpu_state;
use crate::kvm::vm::Vm;
use crate::machine::{DeviceSet, Machine, VirtioHandle};
use crate::snapshot::memory::{self, MemorySource};
use crate::snapshot::state::VirtioDeviceState;
use crate::snapshot::{MicrovmState, Persist, file};
use crate::vmm::Vmm;
use std::os::fd::OwnedFd;

/// What to restore, and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSpec {
    pub state_path: PathBuf,
    pub mem_path: PathBuf,
    pub overrides: RestoreOverrides,
    /// Leave the vCPUs paused (a `resume` starts them).
    pub paused: bool,
}

/// A restored VM whose vCPU threads have not started yet.
pub struct Prepared {
    machine: Machine,
    fds: Vec<kvm_ioctls::VcpuFd>,
    pio: Bus,
    mmio: Bus,
    paused: bool,
}

/// Restores the VM and starts it.
pub fn restore(p: Prelude, spec: &RestoreSpec) -> Result<Vmm, BuildError> {
    let mut p = p;
    let prepared = prepare(&mut p, spec, None)?;
    start(p, prepared)
}

/// Starts a prepared VM's vCPUs with the prelude's event loop and control socket.
pub fn start(p: Prelude, r: Prepared) -> Result<Vmm, BuildError> {
    finish(p, r.machine, r.fds, r.pio, r.mmio, r.paused)
}

/// Everything but starting the vCPUs. On failure `p` can serve again (a
/// `--wait-restore` VMM answers the error and keeps waiting); only a VM it created ahead
/// of time ([`Prelude::vm`]) is used up. `passed_tap`: the TAP sent with the request, for
/// a snapshot with a net device restored with `net_tap_fd`.
pub fn prepare(
    p: &mut Prelude,
    spec: &RestoreSpec,
    passed_tap: Option<OwnedFd>,
) -> Result<Prepared, BuildError> {
    let mut passed_tap = passed_tap;
    let started = std::time::Instant::now();
    let state: MicrovmState = file::read(&spec.state_path)?;
    let bad = |reason: String| BuildError::BadSnapshot {
        path: spec.state_path.display().to_string(),
        reason,
    };
    state.validate().map_err(bad)?;
    for (i, v) in state.vcpus.iter().enumerate() {
        vcpu_state::validate(v, i as u8)?;
    }
    let size = state.machine.memory_bytes;
    let image = memory::open_image(&spec.mem_path, size)?;
    tracing::debug!("restore: state read at {:?}", started.elapsed());

    let vm = match p.vm.take() {
        Some(vm) => vm,
        None => Vm::new()?,
    };
    tracing::debug!("restore: VM created at {:?}", started.elapsed());
    let mem = memory::map_image(&image, size, &spec.mem_path)?;
    vm.register_memory(&mem)?;
    tracing::debug!("restore: memory registered at {:?}", started.elapsed());
    vm.setup_x86()?;
    tracing::debug!("restore: memory mapped at {:?}", started.elapsed());

    let has_tsc_control = vm.has_cap(kvm_ioctls::Cap::TscControl);
    let mut fds = Vec::with_capacity(state.vcpus.len());
    for v in &state.vcpus {
        let fd = vm.create_vcpu(v.index)?;
        vcpu_state::restore(&fd, v, has_tsc_control)?;
        fds.push(fd);
    }
    vm.restore_state(&state.vm)?;
    tracing::debug!("restore: KVM state set at {:?}", started.elapsed());

    let serial_log = spec
        .overrides
        .serial_log
        .clone()
        .or_else(|| state.machine.serial_log.clone());
    let mut pio = Bus::new();
    let mut mmio = Bus::new();
    let (serial, debug) = attach_legacy(
        &vm,
        &mem,
        &*p,
        &mut pio,
        &mut mmio,
        serial_log.as_deref(),
        LegacyState::Saved(&state.devices),
    )?;
    let mut virtio = Vec::with_capacity(state.devices.virtio.len());
    for slot in &state.devices.virtio {
        let handle = match &slot.device {
            VirtioDeviceState::Block(s) => VirtioHandle::Block(shared(Block::restore(
                BlockOverrides {
                    top: spec.overrides.disk_overlay.clone(),
                    layers: spec.overrides.disk_layers.clone(),
                    base: spec.overrides.disk_base.clone(),
                },
                s,
            )?)),
            VirtioDeviceState::Net(s) => {
                let args = match (spec.overrides.net_tap_fd, passed_tap.take()) {
                    (false, _) => NetRestoreArgs::Tap {
                        name_override: spec.overrides.net_tap.clone(),
                    },
                    (true, Some(fd)) => NetRestoreArgs::Passed(fd),
                    (true, None) => {
                        return Err(BuildError::BadSnapshot {
                            path: spec.state_path.display().to_string(),
                            reason: "the restore asks for a TAP passed with it (net_tap_fd), \
                                     and none came (or the snapshot has two net devices)"
                                .into(),
                        });
                    }
                };
                VirtioHandle::Net(shared(Net::restore(args, s)?))
            }
            VirtioDeviceState::Rng(s) => VirtioHandle::Rng(shared(Rng::restore((), s)?)),
            VirtioDeviceState::Vsock(s) => VirtioHandle::Vsock(shared(Vsock::restore(
                spec.overrides.vsock_uds_path.clone(),
                s,
            )?)),
        };
        virtio.push(attach_virtio(
            &vm,
            &mem,
            &mut mmio,
            slot.base,
            slot.irq,
            handle,
            Some(&slot.transport),
        )?);
    }
    let machine = Machine {
        vcpu_count: state.machine.vcpus,
        memory_bytes: size,
        serial_log,
        devices: DeviceSet {
            serial,
            debug,
            virtio,
        },
        memory_source: MemorySource::Image(image),
        frozen_images: Vec::new(),
        memory: mem,
        vm,
    };
    tracing::debug!("restore: devices ready at {:?}", started.elapsed());
    Ok(Prepared {
        machine,
        fds,
        pio,
        mmio,
        paused: spec.paused,
    })
}

fn shared<T>(t: T) -> std::sync::Arc<std::sync::Mutex<T>> {
    std::sync::Arc::new(std::sync::Mutex::new(t))
}
