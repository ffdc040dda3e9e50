//! What a state file holds: the machine's shape, the KVM state of the VM and of each
//! vCPU, and every device's state, in the order the restore needs them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{MAX_MEMORY_MIB, MAX_VCPUS, MIN_VCPUS};
use crate::devices::debug::DebugState;
use crate::devices::serial::SerialState;
use crate::devices::virtio::block::BlockState;
use crate::devices::virtio::mmio::MmioState;
use crate::devices::virtio::net::NetState;
use crate::devices::virtio::rng::RngState;
use crate::devices::virtio::vsock::VsockState;
use crate::kvm::vcpu_state::VcpuState;
use crate::kvm::vm::VmKvmState;

#[derive(Clone, Serialize, Deserialize)]
pub struct MicrovmState {
    pub machine: MachineState,
    pub vm: VmKvmState,
    pub vcpus: Vec<VcpuState>,
    pub devices: DevicesState,
}

/// The shape of the machine: what the restore must recreate before any state goes in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineState {
    pub vcpus: u8,
    pub memory_bytes: u64,
    /// The console log of the saved VM (a restore may name another).
    pub serial_log: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DevicesState {
    pub serial: SerialState,
    /// The test-only debug devices (PIO copy, MMIO copy), when the VM had them.
    pub debug: Option<(DebugState, DebugState)>,
    pub virtio: Vec<VirtioSlotState>,
}

/// One virtio-mmio device: where it sits, its transport and its device model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VirtioSlotState {
    pub base: u64,
    pub irq: u32,
    pub transport: MmioState,
    pub device: VirtioDeviceState,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum VirtioDeviceState {
    Block(BlockState),
    Rng(RngState),
    Vsock(VsockState),
    /// Since state format 3.
    Net(NetState),
}

impl MicrovmState {
    /// Checks the shape before anything is created from it: a checksum proves the file
    /// is what was written, not that what was written is sane.
    pub fn validate(&self) -> Result<(), String> {
        let m = &self.machine;
        if !(MIN_VCPUS..=MAX_VCPUS).contains(&m.vcpus) {
            return Err(format!("{} vCPUs", m.vcpus));
        }
        if m.memory_bytes == 0
            || m.memory_bytes > u64::from(MAX_MEMORY_MIB) << 20
            || !m.memory_bytes.is_multiple_of(4096)
        {
            return Err(format!("{} bytes of memory", m.memory_bytes));
        }
        if self.vcpus.len() != usize::from(m.vcpus) {
            return Err(format!(
                "{} vCPU states for {} vCPUs",
                self.vcpus.len(),
                m.vcpus
            ));
        }
        let slots = crate::builder::virtio_slots();
        if self.devices.virtio.len() > slots.len() {
            return Err(format!("{} virtio devices", self.devices.virtio.len()));
        }
        for (i, (slot, want)) in self.devices.virtio.iter().zip(slots).enumerate() {
            if (slot.base, slot.irq) != want {
                return Err(format!(
                    "virtio device {i} at {:#x} IRQ {}, expected {:#x} IRQ {}",
                    slot.base, slot.irq, want.0, want.1
                ));
            }
        }
        Ok(())
    }
}
