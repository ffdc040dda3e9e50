//! The save sequence, on the VMM thread, for the `snapshot` control request.
//!
//! Order, and why (the order Firecracker saves in):
//! 1. Pause (if running): vCPUs first, each completing a pending port/MMIO instruction,
//!    then the devices leave the event loop, so nothing changes guest memory or raises
//!    an interrupt behind the save's back.
//! 2. Devices first: preparing them may still write guest memory and raise interrupts
//!    (vsock queues TRANSPORT_RESET into the event queue; the block device flushes and,
//!    if asked, freezes its top layer). The interrupt reaches the irqchip, whose state is
//!    saved after this; saving KVM state first would lose it.
//! 3. vCPUs, each on its own thread (kvm::vcpu_state gives the order inside).
//! 4. VM state: irqchips, PIT, kvmclock.
//! 5. Memory: written out (`full`), or frozen in place (`fork`, snapshot::memory).
//! 6. The state file last, through a rename: a state file exists only for a complete
//!    snapshot.
//! 7. The VM returns to the state it was in before the request.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandcell_proto::vmm::{ControlErrorKind, SnapshotMode};

use super::file::StateFileError;
use super::memory::{self, SnapshotMemoryError};
use super::state::{DevicesState, MachineState, VirtioDeviceState, VirtioSlotState};
use super::{MicrovmState, Persist, file};
use crate::devices::virtio::block::overlay::OverlayError;
use crate::devices::virtio::device::lock;
use crate::kvm::vcpu::{VcpuCommand, VcpuEvent, VcpuSaveError};
use crate::kvm::vcpu_state::{SaveContext, VcpuState};
use crate::kvm::vm::VmError;
use crate::machine::VirtioHandle;
use crate::vmm::{RunStateError, Vmm};

const SAVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a snapshot failed, by step of the sequence above.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Pausing before the save, or resuming after it.
    #[error(transparent)]
    RunState(#[from] RunStateError),
    #[error("flushing the disk before the snapshot: {0}")]
    FlushDisk(#[source] std::io::Error),
    #[error("freezing the disk's top layer: {0}")]
    FreezeDisk(#[source] OverlayError),
    #[error("disk_new_top was given, but the VM has no disk")]
    NoDisk,
    #[error(
        "this VM has a shared directory (virtio-fs): its open files live in the virtiofsd \
         process, not in the VM, so it cannot be snapshotted"
    )]
    SharedFs,
    /// Listing the MSRs to save, or reading the VM-wide KVM state.
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error("saving vCPU {index}: {source}")]
    Vcpu {
        index: u8,
        #[source]
        source: VcpuSaveError,
    },
    #[error("{pending} vCPU(s) did not save their state within {timeout:?}")]
    VcpuTimeout { pending: usize, timeout: Duration },
    #[error(transparent)]
    WriteMemory(SnapshotMemoryError),
    #[error("freezing guest memory: {0}")]
    FreezeMemory(#[source] SnapshotMemoryError),
    #[error(transparent)]
    LinkMemory(SnapshotMemoryError),
    #[error(transparent)]
    StateFile(#[from] StateFileError),
}

impl SnapshotError {
    pub fn kind(&self) -> ControlErrorKind {
        match self {
            SnapshotError::RunState(e) => e.kind(),
            SnapshotError::NoDisk | SnapshotError::SharedFs => ControlErrorKind::BadRequest,
            SnapshotError::Vcpu { source, .. } => match source {
                VcpuSaveError::State(_) => ControlErrorKind::VcpuState,
                VcpuSaveError::NotPaused(_) | VcpuSaveError::Stopping => {
                    ControlErrorKind::WrongState
                }
            },
            SnapshotError::VcpuTimeout { .. } => ControlErrorKind::Timeout,
            SnapshotError::FlushDisk(_)
            | SnapshotError::FreezeDisk(_)
            | SnapshotError::Vm(_)
            | SnapshotError::WriteMemory(_)
            | SnapshotError::FreezeMemory(_)
            | SnapshotError::LinkMemory(_)
            | SnapshotError::StateFile(_) => ControlErrorKind::Host,
        }
    }
}

/// A `snapshot` request's parameters.
pub struct SnapshotParams<'a> {
    pub state_path: &'a Path,
    pub mem_path: &'a Path,
    pub mode: SnapshotMode,
    pub disk_new_top: Option<&'a Path>,
}

impl Vmm {
    pub(crate) fn snapshot(&mut self, req: SnapshotParams<'_>) -> Result<(), SnapshotError> {
        // Refused before the pause: the guest should not even notice the attempt.
        if (self.machine.devices.virtio.iter()).any(|s| matches!(s.device, VirtioHandle::Fs(_))) {
            return Err(SnapshotError::SharedFs);
        }
        let was_running = !self.paused;
        self.pause()?;
        let result = self.save(&req);
        if was_running {
            // Even after a failed save: the VM goes on as it was.
            self.resume()?;
        }
        result
    }

    fn save(&mut self, req: &SnapshotParams<'_>) -> Result<(), SnapshotError> {
        let started = Instant::now();
        let devices = self.save_devices(req.disk_new_top)?;
        let vcpus = self.save_vcpus()?;
        let m = &mut self.machine;
        let vm = m.vm.save_state()?;
        tracing::debug!("snapshot: KVM state saved at {:?}", started.elapsed());
        match req.mode {
            SnapshotMode::Full => {
                memory::write_file(&m.memory, &m.memory_source, m.memory_bytes, req.mem_path)
                    .map_err(SnapshotError::WriteMemory)?;
            }
            SnapshotMode::Fork => {
                let image = memory::freeze(&m.memory, &mut m.memory_source, m.memory_bytes)
                    .map_err(SnapshotError::FreezeMemory)?;
                let target = format!(
                    "/proc/{}/fd/{}",
                    std::process::id(),
                    std::os::fd::AsRawFd::as_raw_fd(&image)
                );
                m.frozen_images.push(image);
                memory::replace_symlink(Path::new(&target), req.mem_path)
                    .map_err(SnapshotError::LinkMemory)?;
            }
        }
        tracing::debug!("snapshot: memory saved at {:?}", started.elapsed());
        let state = MicrovmState {
            machine: MachineState {
                vcpus: m.vcpu_count,
                memory_bytes: m.memory_bytes,
                serial_log: m.serial_log.clone(),
            },
            vm,
            vcpus,
            devices,
        };
        file::write(req.state_path, &state)?;
        tracing::debug!("snapshot: state written at {:?}", started.elapsed());
        Ok(())
    }

    fn save_devices(&mut self, disk_new_top: Option<&Path>) -> Result<DevicesState, SnapshotError> {
        let d = &self.machine.devices;
        let mut virtio = Vec::with_capacity(d.virtio.len());
        let mut froze_disk = disk_new_top.is_none();
        for slot in &d.virtio {
            let device = match &slot.device {
                VirtioHandle::Block(b) => {
                    let mut b = lock(b);
                    b.prepare_save().map_err(SnapshotError::FlushDisk)?;
                    let state = b.save();
                    if let Some(new_top) = disk_new_top {
                        b.freeze_top(new_top).map_err(SnapshotError::FreezeDisk)?;
                        froze_disk = true;
                        VirtioDeviceState::Block(crate::devices::virtio::block::BlockState {
                            layers: b.save().layers,
                            top: None,
                            ..state
                        })
                    } else {
                        VirtioDeviceState::Block(state)
                    }
                }
                VirtioHandle::Net(n) => VirtioDeviceState::Net(lock(n).save()),
                VirtioHandle::Rng(r) => VirtioDeviceState::Rng(lock(r).save()),
                // `snapshot` refuses these before it pauses.
                VirtioHandle::Fs(_) => return Err(SnapshotError::SharedFs),
                VirtioHandle::Vsock(v) => {
                    let mut v = lock(v);
                    v.prepare_save();
                    VirtioDeviceState::Vsock(v.save())
                }
            };
            // After the device's own preparation, which may have moved its queues.
            let transport = lock(&slot.transport).save();
            virtio.push(VirtioSlotState {
                base: slot.base,
                irq: slot.irq,
                transport,
                device,
            });
        }
        if !froze_disk {
            return Err(SnapshotError::NoDisk);
        }
        Ok(DevicesState {
            serial: lock(&d.serial).save(),
            debug: d
                .debug
                .as_ref()
                .map(|(p, m)| (lock(p).save(), lock(m).save())),
            virtio,
        })
    }

    fn save_vcpus(&mut self) -> Result<Vec<VcpuState>, SnapshotError> {
        let vm = &self.machine.vm;
        let ctx = Arc::new(SaveContext {
            msrs: vm.snapshot_msrs()?,
            xsave2_size: vm.xsave2_size(),
            has_xcrs: vm.has_cap(kvm_ioctls::Cap::Xcrs),
        });
        while self.vcpu_events.try_recv().is_ok() {}
        for v in &self.vcpus {
            v.command(VcpuCommand::Save(ctx.clone()));
        }
        let mut states: Vec<Option<VcpuState>> = vec![None; self.vcpus.len()];
        let deadline = Instant::now() + SAVE_TIMEOUT;
        let mut pending = self.vcpus.len();
        while pending > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.vcpu_events.recv_timeout(left) {
                Ok(VcpuEvent::Saved(index, result)) => {
                    let state =
                        (*result).map_err(|source| SnapshotError::Vcpu { index, source })?;
                    if let Some(slot) = states.get_mut(usize::from(index)) {
                        *slot = Some(state);
                        pending -= 1;
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    return Err(SnapshotError::VcpuTimeout {
                        pending,
                        timeout: SAVE_TIMEOUT,
                    });
                }
            }
        }
        Ok(states.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvm::vcpu_state::VcpuStateError;

    #[test]
    fn vcpu_state_errors_keep_their_kind_and_their_words() {
        let e = SnapshotError::Vcpu {
            index: 1,
            source: VcpuSaveError::State(VcpuStateError::Invalid {
                index: 1,
                what: "no MSRs".into(),
            }),
        };
        assert_eq!(e.kind(), ControlErrorKind::VcpuState);
        assert_eq!(
            e.to_string(),
            "saving vCPU 1: vCPU 1: the saved state has no MSRs"
        );
        let refused = SnapshotError::Vcpu {
            index: 0,
            source: VcpuSaveError::NotPaused(0),
        };
        assert_eq!(refused.kind(), ControlErrorKind::WrongState);
        assert_eq!(refused.to_string(), "saving vCPU 0: vCPU 0 is not paused");
    }

    #[test]
    fn pause_timeouts_and_missing_disks_have_kinds_and_the_old_messages() {
        let e = SnapshotError::RunState(RunStateError::NoAnswer {
            pending: 2,
            command: VcpuCommand::Pause,
            timeout: Duration::from_secs(5),
        });
        assert_eq!(e.kind(), ControlErrorKind::Timeout);
        assert_eq!(e.to_string(), "2 vCPU(s) did not answer Pause within 5s");
        assert_eq!(SnapshotError::NoDisk.kind(), ControlErrorKind::BadRequest);
        assert_eq!(
            SnapshotError::NoDisk.to_string(),
            "disk_new_top was given, but the VM has no disk"
        );
    }
}
