//! The i8042 keyboard controller at ports 0x60 (data) and 0x64 (status/command), only for
//! its CPU reset command: with `reboot=k` Linux reboots (and, with `panic=-1`, panics) by
//! writing 0xFE to port 0x64. Sandcell treats a reboot as the end of the VM.

use std::sync::Arc;

use sandcell_proto::vmm::ExitStatus;
use vm_superio::I8042Device;

use super::serial::ConsoleWatch;
use crate::bus::BusDevice;
use crate::exit::ExitLatch;

/// The port range the device occupies: 0x60..=0x64 (offset 0 = data, offset 4 = command,
/// as vm-superio numbers them). Port 0x61 (speaker) never exits: the in-kernel PIT with
/// `KVM_PIT_SPEAKER_DUMMY` handles it.
pub const I8042_BASE: u64 = 0x60;
pub const I8042_LEN: u64 = 5;

/// Fired by vm-superio on a CPU reset command.
pub struct ResetTrigger {
    latch: Arc<ExitLatch>,
    console: Arc<ConsoleWatch>,
}

impl vm_superio::Trigger for ResetTrigger {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        // A reset that follows "Kernel panic" on the console is the panic=-1 reboot.
        if self.console.panic_seen() {
            self.latch.request(
                ExitStatus::GuestPanic,
                "the guest kernel panicked, then reset the CPU",
            );
        } else {
            self.latch.request(
                ExitStatus::Reboot,
                "the guest reset the CPU through the i8042",
            );
        }
        Ok(())
    }
}

pub struct I8042 {
    inner: I8042Device<ResetTrigger>,
}

impl I8042 {
    pub fn new(latch: Arc<ExitLatch>, console: Arc<ConsoleWatch>) -> I8042 {
        I8042 {
            inner: I8042Device::new(ResetTrigger { latch, console }),
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = self.inner.read((offset + i as u64) as u8);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, byte) in data.iter().enumerate() {
            // The only error source is the trigger, which cannot fail.
            let _ = self.inner.write((offset + i as u64) as u8, *byte);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command_is_a_reboot_or_after_a_panic_a_guest_panic() {
        for panicked in [false, true] {
            let latch = Arc::new(ExitLatch::new().expect("eventfd"));
            let console = Arc::new(ConsoleWatch::default());
            if panicked {
                console.observe(b"[ 1.0] Kernel panic - not syncing: VFS\n");
            }
            let mut dev = I8042::new(latch.clone(), console);
            dev.write(0, &[0xfe]);
            assert!(!latch.is_set(), "0xfe on the data port is not a reset");
            dev.write(4, &[0xfe]);
            let want = if panicked {
                ExitStatus::GuestPanic
            } else {
                ExitStatus::Reboot
            };
            assert_eq!(latch.reason().map(|r| r.0), Some(want));
        }
    }
}
