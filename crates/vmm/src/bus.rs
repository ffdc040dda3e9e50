//! Port-I/O and MMIO buses: address ranges mapped to devices.
//!
//! A vCPU thread that takes a PIO or MMIO exit looks the address up here and calls the
//! device with the offset into its range. Devices never see the VM file descriptor.

use sandcell_proto::sync::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device on a bus. `offset` is relative to the start of the range the device was
/// inserted at; `data.len()` is the access width (1, 2, 4 or 8 bytes).
pub trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

pub type SharedBusDevice = Arc<Mutex<dyn BusDevice>>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("bus range {base:#x}+{len:#x} is empty or wraps around")]
    BadRange { base: u64, len: u64 },
    #[error("bus range {base:#x}+{len:#x} overlaps the device at {other:#x}+{other_len:#x}")]
    Overlap {
        base: u64,
        len: u64,
        other: u64,
        other_len: u64,
    },
}

struct Entry {
    len: u64,
    device: SharedBusDevice,
}

/// Non-overlapping ranges, each owned by one device. Built before the vCPUs start and
/// read-only afterwards (shared between vCPU threads behind an `Arc`).
#[derive(Default)]
pub struct Bus {
    ranges: BTreeMap<u64, Entry>,
}

impl Bus {
    pub fn new() -> Bus {
        Bus::default()
    }

    pub fn insert(&mut self, base: u64, len: u64, device: SharedBusDevice) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::BadRange { base, len })?;
        // The only candidates for overlap: the last range starting before `end`.
        if let Some((&other, e)) = self.ranges.range(..end).next_back()
            && other + e.len > base
        {
            return Err(BusError::Overlap {
                base,
                len,
                other,
                other_len: e.len,
            });
        }
        self.ranges.insert(base, Entry { len, device });
        Ok(())
    }

    /// The device whose range holds the whole access `[addr, addr + size)`, and the offset
    /// of `addr` in that range. Accesses straddling the end of a range match nothing.
    pub fn resolve(&self, addr: u64, size: usize) -> Option<(&SharedBusDevice, u64)> {
        let (&base, e) = self.ranges.range(..=addr).next_back()?;
        let offset = addr - base;
        let last = offset.checked_add(size.max(1) as u64)?;
        (last <= e.len).then_some((&e.device, offset))
    }

    /// Dispatches a read; returns false (and leaves `data` alone) if no device matches.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((dev, offset)) => {
                lock_device(dev).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a write; returns false if no device matches.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((dev, offset)) => {
                lock_device(dev).write(offset, data);
                true
            }
            None => false,
        }
    }
}

/// Locks a device, recovering from poisoning: a device whose handler panicked on another
/// vCPU thread is still a set of registers; refusing all further access would hang the guest
/// with no better outcome.
fn lock_device(dev: &SharedBusDevice) -> std::sync::MutexGuard<'_, dyn BusDevice + 'static> {
    lock(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Remembers the last write and answers reads with offset + 1 in every byte.
    struct Probe {
        last_write: Option<(u64, Vec<u8>)>,
    }

    impl BusDevice for Probe {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8 + 1);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.last_write = Some((offset, data.to_vec()));
        }
    }

    fn probe() -> Arc<Mutex<Probe>> {
        Arc::new(Mutex::new(Probe { last_write: None }))
    }

    #[test]
    fn lookup_gives_the_offset_inside_the_range() {
        let mut bus = Bus::new();
        let a = probe();
        bus.insert(0x3f8, 8, a.clone()).expect("insert");
        bus.insert(0x60, 1, probe()).expect("insert");
        let mut d = [0u8; 1];
        assert!(bus.read(0x3fd, &mut d));
        assert_eq!(d, [6]);
        assert!(bus.write(0x3f9, &[0xab]));
        assert_eq!(a.lock().expect("lock").last_write, Some((1, vec![0xab])));
        assert!(!bus.read(0x3f7, &mut d));
        assert!(!bus.read(0x400, &mut d));
        assert!(!bus.read(0x61, &mut d));
    }

    #[test]
    fn accesses_straddling_the_end_do_not_match() {
        let mut bus = Bus::new();
        bus.insert(0x1000, 0x10, probe()).expect("insert");
        let mut d = [0u8; 4];
        assert!(bus.read(0x100c, &mut d));
        assert!(!bus.read(0x100d, &mut d));
    }

    #[test]
    fn overlapping_ranges_are_refused() {
        let mut bus = Bus::new();
        bus.insert(0x100, 0x10, probe()).expect("insert");
        assert!(matches!(
            bus.insert(0x108, 0x10, probe()),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(0xf8, 0x10, probe()),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(0x0, 0x1000, probe()),
            Err(BusError::Overlap { .. })
        ));
        assert!(bus.insert(0x110, 0x10, probe()).is_ok());
        assert!(bus.insert(0xf0, 0x10, probe()).is_ok());
        assert!(matches!(
            bus.insert(u64::MAX, 2, probe()),
            Err(BusError::BadRange { .. })
        ));
        assert!(matches!(
            bus.insert(0x5000, 0, probe()),
            Err(BusError::BadRange { .. })
        ));
    }
}
