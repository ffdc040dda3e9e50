//! Port-I/O and MMIO buses: address ranges mapped to devices.
//!
//! A vCPU thread that takes a PIO or MMIO exit looks the address up here and calls the
//! device with the offset into its range. Devices never see the VM file descriptor.

use std::sync::{Arc, Mutex};

/// A device on a bus. `offset` is relative to the start of the range the device was
/// inserted at; `data.len()` is the access width (1, 2, 4 or 8 bytes).
pub trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

pub type SharedBusDevice = Arc<Mutex<dyn BusDevice>>;
