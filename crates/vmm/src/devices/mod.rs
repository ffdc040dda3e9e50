//! Emulated devices. Each gets an interrupt trigger and its queue eventfds, never the VM fd.
//!
//! - [`serial`]: COM1, a vm-superio 16550 whose output goes to the console sink.
//! - [`i8042`]: the keyboard controller, only for the guest's CPU reset.
//! - [`power`]: Sandcell's power-off port.
//! - [`debug`]: scratch registers on PIO and MMIO for the test payloads (`--debug-devices`).
//! - [`virtio`]: the virtio-mmio transport and the virtio devices.

pub mod debug;
pub mod i8042;
pub mod power;
pub mod serial;
pub mod virtio;

use vmm_sys_util::eventfd::EventFd;

/// An interrupt line backed by an eventfd that KVM watches as an irqfd: a write raises the
/// line (edge) in the in-kernel irqchip without any exit to the VMM.
pub struct IrqTrigger(pub EventFd);

impl vm_superio::Trigger for IrqTrigger {
    type E = std::io::Error;

    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}
