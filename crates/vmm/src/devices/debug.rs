//! Test-only scratch registers, present only when `sandcell-vmm` runs with
//! `--debug-devices`. The test payloads use them to prove that port and MMIO exits carry
//! data both ways, and that the host's view of guest memory (the memfd mapping) is the
//! guest's.
//!
//! Registers (offsets from the base, 32-bit little-endian accesses):
//! - 0x0 SCRATCH: a write stores the value; a read returns its bitwise NOT (so a guest
//!   that reads back the complement knows a device, not memory, answered).
//! - 0x4 ADDRESS: the guest physical address for PEEK.
//! - 0x8 PEEK (read): the 32-bit value at ADDRESS as the VMM reads it through its own
//!   mapping of guest memory, or 0xffff_ffff if ADDRESS is not RAM.

use vm_memory::{Bytes, GuestAddress};

use crate::bus::BusDevice;
use crate::memory::GuestMemory;
use crate::snapshot::Persist;

pub const DEBUG_PORT_BASE: u64 = 0x0520;
pub const DEBUG_LEN: u64 = 12;
const SCRATCH: u64 = 0x0;
const ADDRESS: u64 = 0x4;
const PEEK: u64 = 0x8;

pub struct DebugDevice {
    mem: GuestMemory,
    scratch: u32,
    address: u32,
}

impl DebugDevice {
    pub fn new(mem: GuestMemory) -> DebugDevice {
        DebugDevice {
            mem,
            scratch: 0,
            address: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DebugState {
    pub scratch: u32,
    pub address: u32,
}

impl Persist for DebugDevice {
    type State = DebugState;
    type Args = GuestMemory;
    type Error = std::convert::Infallible;

    fn save(&self) -> DebugState {
        DebugState {
            scratch: self.scratch,
            address: self.address,
        }
    }

    fn restore(mem: GuestMemory, s: &DebugState) -> Result<Self, Self::Error> {
        Ok(DebugDevice {
            mem,
            scratch: s.scratch,
            address: s.address,
        })
    }
}

fn to_u32(data: &[u8]) -> Option<u32> {
    let b: [u8; 4] = data.try_into().ok()?;
    Some(u32::from_le_bytes(b))
}

impl BusDevice for DebugDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = match offset {
            SCRATCH => !self.scratch,
            ADDRESS => self.address,
            PEEK => self
                .mem
                .read_obj::<u32>(GuestAddress(u64::from(self.address)))
                .unwrap_or(u32::MAX),
            _ => u32::MAX,
        };
        let bytes = value.to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&bytes[..n]);
        data[n..].fill(0xff);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(value) = to_u32(data) else { return };
        match offset {
            SCRATCH => self.scratch = value,
            ADDRESS => self.address = value,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    #[test]
    fn scratch_reads_back_inverted_and_peek_sees_guest_memory() {
        let (mem, _f) = create_guest_memory(1 << 20).expect("memory");
        mem.write_obj(0xcafe_f00du32, GuestAddress(0x4000))
            .expect("write");
        let mut d = DebugDevice::new(mem);
        d.write(SCRATCH, &0x1234_5678u32.to_le_bytes());
        let mut buf = [0u8; 4];
        d.read(SCRATCH, &mut buf);
        assert_eq!(u32::from_le_bytes(buf), !0x1234_5678);
        d.write(ADDRESS, &0x4000u32.to_le_bytes());
        d.read(PEEK, &mut buf);
        assert_eq!(u32::from_le_bytes(buf), 0xcafe_f00d);
        d.write(ADDRESS, &0x8000_0000u32.to_le_bytes());
        d.read(PEEK, &mut buf);
        assert_eq!(u32::from_le_bytes(buf), u32::MAX);
    }
}
