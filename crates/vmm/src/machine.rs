//! What a running VM is made of, kept by the `Vmm` for as long as it runs: the VM fd,
//! guest memory and where its pages come from, and the stateful devices (the snapshot
//! code saves each of them; the buses and the event loop hold their own references).

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::devices::debug::DebugDevice;
use crate::devices::serial::SerialConsole;
use crate::devices::virtio::MmioTransport;
use crate::devices::virtio::block::Block;
use crate::devices::virtio::fs::Fs;
use crate::devices::virtio::net::Net;
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::vsock::Vsock;
use crate::kvm::vm::Vm;
use crate::memory::GuestMemory;
use crate::snapshot::memory::MemorySource;

pub struct Machine {
    pub vcpu_count: u8,
    pub memory_bytes: u64,
    pub serial_log: Option<PathBuf>,
    pub devices: DeviceSet,
    pub memory_source: MemorySource,
    /// Memory images this VM froze for forks: kept open so that the paths handed out for
    /// them (`/proc/<pid>/fd/<n>`) stay valid while this process lives.
    pub frozen_images: Vec<File>,
    // Dropped last: the memory slots point into `memory`, and the vCPU threads (joined
    // before the Vmm is dropped) use the VM.
    pub memory: GuestMemory,
    pub vm: Vm,
}

/// The test-only debug devices: PIO copy, MMIO copy.
pub type DebugPair = (Arc<Mutex<DebugDevice>>, Arc<Mutex<DebugDevice>>);

pub struct DeviceSet {
    pub serial: Arc<Mutex<SerialConsole>>,
    pub debug: Option<DebugPair>,
    /// In placement order (the order of their MMIO windows and IRQs).
    pub virtio: Vec<VirtioSlot>,
}

pub struct VirtioSlot {
    pub base: u64,
    pub irq: u32,
    pub transport: Arc<Mutex<MmioTransport>>,
    pub device: VirtioHandle,
}

/// A virtio device model, by type (the snapshot saves each type's own state).
#[derive(Clone)]
pub enum VirtioHandle {
    Block(Arc<Mutex<Block>>),
    Net(Arc<Mutex<Net>>),
    Rng(Arc<Mutex<Rng>>),
    Vsock(Arc<Mutex<Vsock>>),
    /// Never in a snapshot (see `devices::virtio::fs`).
    Fs(Arc<Mutex<Fs>>),
}
