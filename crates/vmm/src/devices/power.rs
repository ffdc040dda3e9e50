//! Sandcell's power port ([`sandcell_proto::vmm::POWER_PORT`]): a 1-byte write of
//! `POWER_OFF` ends the VM with `ExitStatus::PowerOff`. The guest kernel has no ACPI, so this
//! port is how the agent tells the VMM that the guest is done.

use std::sync::Arc;

use sandcell_proto::vmm::{ExitStatus, POWER_OFF};

use crate::bus::BusDevice;
use crate::exit::ExitLatch;

pub struct PowerPort {
    latch: Arc<ExitLatch>,
}

impl PowerPort {
    pub fn new(latch: Arc<ExitLatch>) -> PowerPort {
        PowerPort { latch }
    }
}

impl BusDevice for PowerPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == 0 && data == [POWER_OFF] {
            self.latch.request(
                ExitStatus::PowerOff,
                "the guest wrote POWER_OFF to the power port",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_one_byte_power_off_write_powers_off() {
        let latch = Arc::new(ExitLatch::new().expect("eventfd"));
        let mut p = PowerPort::new(latch.clone());
        p.write(0, &[0x01]);
        p.write(0, &[POWER_OFF, 0]);
        assert!(!latch.is_set());
        p.write(0, &[POWER_OFF]);
        assert_eq!(latch.reason().map(|r| r.0), Some(ExitStatus::PowerOff));
    }
}
