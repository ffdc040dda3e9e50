//! The contract between a virtio device model and its transport.
//!
//! A device knows its type, queues, features and config space and how to process its
//! queues. The transport (`mmio.rs`) owns the guest-visible register file and the status
//! state machine and calls [`VirtioDevice::activate`] when the driver sets DRIVER_OK.
//! What devices share beyond this contract is in `common.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use super::common::VirtioCommon;
use crate::memory::GuestMemory;

/// `VIRTIO_F_VERSION_1`: every device we expose is a modern (virtio 1.x) device.
pub const VIRTIO_F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// Why a device refused to activate. The transport then sets DEVICE_NEEDS_RESET.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("device got {got} queues, expected {expected}")]
    QueueCount { expected: usize, got: usize },
    #[error("device is already activated")]
    AlreadyActivated,
    #[error("signalling the activate eventfd failed: {0}")]
    ActivateEvent(#[source] std::io::Error),
}

/// What an interrupt is about; the value is its bit in the InterruptStatus register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum InterruptKind {
    /// A used ring was updated.
    Vring = 1,
    /// The device configuration space changed.
    Config = 2,
}

/// The device's interrupt line: the InterruptStatus bits the driver reads and acknowledges
/// through the transport, and the irqfd that KVM turns into the guest interrupt.
///
/// Shared by the transport (vCPU threads read/ack the status) and the device (VMM thread
/// sets bits and signals), hence the atomic.
#[derive(Debug)]
pub struct Interrupt {
    status: AtomicU32,
    irq_evt: EventFd,
}

impl Interrupt {
    pub fn new(irq_evt: EventFd) -> Self {
        Interrupt {
            status: AtomicU32::new(0),
            irq_evt,
        }
    }

    /// Set the status bit for `kind`, then signal the irqfd. The bit is set first so the
    /// driver's interrupt handler, which reads InterruptStatus, always sees why it ran.
    pub fn trigger(&self, kind: InterruptKind) -> std::io::Result<()> {
        self.status.fetch_or(kind as u32, Ordering::SeqCst);
        self.irq_evt.write(1)
    }

    /// Current InterruptStatus register value.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// InterruptACK: clear the bits the driver acknowledged.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Set the status bits as saved in a snapshot (no interrupt: the irqchip state
    /// already holds whatever line was raised).
    pub fn restore_status(&self, bits: u32) {
        self.status.store(bits, Ordering::SeqCst);
    }

    /// Forget pending bits (device reset).
    pub fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
    }

    /// The irqfd, for tests and for whoever registers it with KVM.
    pub fn irq_evt(&self) -> &EventFd {
        &self.irq_evt
    }
}

/// A virtio device model behind a transport.
///
/// Queue notification eventfds belong to the device (its [`VirtioCommon`], created in its
/// constructor) so that they can be registered with the VMM thread's epoll once, in
/// `MutEventSubscriber::init`, and stay valid across driver resets and re-activations;
/// the transport keeps duplicates of them to signal QueueNotify writes and hands them to
/// vmm-core for KVM ioeventfds.
///
/// A device implements [`common`](Self::common) and [`common_mut`](Self::common_mut)
/// (`common::virtio_common_accessors!`); the other methods default to its
/// [`VirtioCommon`]. A device with per-activation state of its own overrides
/// [`reset`](Self::reset) and calls `common_mut().reset()` from it.
pub trait VirtioDevice: Send {
    /// The features, eventfds and activation state every device has.
    fn common(&self) -> &VirtioCommon;
    fn common_mut(&mut self) -> &mut VirtioCommon;

    /// virtio device ID (`virtio_bindings::virtio_ids`).
    fn device_type(&self) -> u32 {
        self.common().device_type()
    }
    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16] {
        self.common().queue_max_sizes()
    }
    /// One eventfd per queue, signalled when the driver notifies that queue.
    fn queue_events(&self) -> &[EventFd] {
        self.common().queue_events()
    }
    /// Feature bits the device offers. Must include [`VIRTIO_F_VERSION_1`].
    fn avail_features(&self) -> u64 {
        self.common().avail_features()
    }
    /// Features the driver acknowledged (already masked to `avail_features`).
    fn acked_features(&self) -> u64 {
        self.common().acked_features()
    }
    fn set_acked_features(&mut self, features: u64) {
        self.common_mut().set_acked_features(features);
    }
    /// Read device config space at `offset`. Bytes past the end read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.common().read_config(offset, data);
    }
    /// Write device config space at `offset`. Our devices have nothing the driver may
    /// write, so the default ignores it.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Start operating on validated queues. Called from a vCPU thread (the DRIVER_OK
    /// write); devices defer real work to their event loop via the activate eventfd.
    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        self.common_mut().activate(mem, interrupt, queues)
    }
    /// Return to the pre-activation state (driver wrote 0 to Status).
    fn reset(&mut self) {
        self.common_mut().reset();
    }
    fn is_activated(&self) -> bool {
        self.common().is_activated()
    }
    /// The queues the device was activated with (snapshots save their positions);
    /// `None` before activation.
    fn queues(&self) -> Option<&[Queue]> {
        self.common().queues()
    }
}

/// Copy a device config structure's bytes into `data` from `offset`, zero-filling what is
/// out of range. Shared by the devices' `read_config`.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if start >= config.len() {
        return;
    }
    let n = data.len().min(config.len() - start);
    data[..n].copy_from_slice(&config[start..start + n]);
}

/// Locks a mutex, recovering the data if a previous holder panicked: device state stays
/// usable (a panic is a bug we want reported, not a reason to wedge the VM further).
pub use sandcell_proto::sync::lock;
