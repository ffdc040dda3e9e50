//! Test helpers: real guest memory, a driver-side view of a split virtqueue (on
//! virtio-queue's mock descriptor table) and a transport programmed the way Linux's
//! virtio_mmio driver does it. Also the guest side of the fuzz entry points (crate::fuzzing).

#![allow(clippy::unwrap_used)]
#![cfg_attr(not(test), allow(dead_code))]

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{RawDescriptor, split::Descriptor};
use virtio_queue::mock::DescriptorTable;
use vm_memory::{Bytes, GuestAddress};

use super::mmio::MmioTransport;
use crate::bus::BusDevice;
use crate::memory::GuestMemory;

pub const MEM_SIZE: usize = 32 << 20;
/// Where tests put data buffers (rings live below).
pub const DATA_BASE: u64 = 0x10_0000;

pub fn guest_memory() -> GuestMemory {
    GuestMemory::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

/// Guest address of the rings of queue `index` in tests.
pub fn ring_addr(index: usize) -> GuestAddress {
    GuestAddress(0x1_0000 * (index as u64 + 1))
}

/// One buffer of a chain: guest address, length, device-writable?
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

pub fn rd(addr: u64, len: u32) -> Buf {
    Buf {
        addr,
        len,
        write: false,
    }
}

pub fn wr(addr: u64, len: u32) -> Buf {
    Buf {
        addr,
        len,
        write: true,
    }
}

/// The driver's side of one split queue. Descriptors are stored through virtio-queue's
/// mock `DescriptorTable`; the ring layout is computed here because `MockSplitQueue`
/// (0.18) places the used ring inside the avail ring for queues over 128 entries
/// (`SplitQueueRing::end` adds the element count, not the byte size).
pub struct DriverQueue<'a> {
    mem: &'a GuestMemory,
    table: DescriptorTable<'a, GuestMemory>,
    desc_addr: GuestAddress,
    avail_addr: GuestAddress,
    used_addr: GuestAddress,
    size: u16,
    next_desc: u16,
    used_seen: u16,
    last_kick_idx: u16,
}

impl<'a> DriverQueue<'a> {
    pub fn new(mem: &'a GuestMemory, index: usize, size: u16) -> Self {
        let desc_addr = ring_addr(index);
        let avail_addr = GuestAddress(desc_addr.0 + 16 * u64::from(size));
        // flags, idx, ring[size], used_event; the used ring is 4-byte aligned.
        let used_addr = GuestAddress((avail_addr.0 + 6 + 2 * u64::from(size)).div_ceil(4) * 4);
        // Both rings start zeroed (flags, idx, event fields).
        let used_len = 6 + 8 * usize::from(size);
        write_mem(mem, avail_addr.0, &vec![0u8; 6 + 2 * usize::from(size)]);
        write_mem(mem, used_addr.0, &vec![0u8; used_len]);
        DriverQueue {
            mem,
            table: DescriptorTable::new(mem, desc_addr, size),
            desc_addr,
            avail_addr,
            used_addr,
            size,
            next_desc: 0,
            used_seen: 0,
            last_kick_idx: 0,
        }
    }

    pub fn desc_table_addr(&self) -> GuestAddress {
        self.desc_addr
    }

    pub fn avail_addr(&self) -> GuestAddress {
        self.avail_addr
    }

    pub fn used_addr(&self) -> GuestAddress {
        self.used_addr
    }

    /// Publish a chain; returns its head descriptor index. Descriptor slots are reused
    /// round-robin, so tests must let the device consume chains before wrapping.
    pub fn add_chain(&mut self, bufs: &[Buf]) -> u16 {
        assert!(!bufs.is_empty() && bufs.len() <= usize::from(self.size));
        if usize::from(self.next_desc) + bufs.len() > usize::from(self.size) {
            self.next_desc = 0;
        }
        let head = self.next_desc;
        let descs: Vec<Descriptor> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut flags = if b.write {
                    VRING_DESC_F_WRITE as u16
                } else {
                    0
                };
                let last = i + 1 == bufs.len();
                if !last {
                    flags |= VRING_DESC_F_NEXT as u16;
                }
                let next = if last { 0 } else { head + i as u16 + 1 };
                Descriptor::new(b.addr, b.len, flags, next)
            })
            .collect();
        self.add_raw(&descs, head);
        self.next_desc += bufs.len() as u16;
        head
    }

    /// Store `descs` at table index `at` and publish `at` as one chain head (flags and
    /// `next` are taken as given: malformed-chain tests rely on that).
    pub fn add_raw(&mut self, descs: &[Descriptor], at: u16) {
        for (i, d) in descs.iter().enumerate() {
            self.table
                .store(at + i as u16, RawDescriptor::from(*d))
                .unwrap();
        }
        // The avail ring: flags u16, idx u16, ring[size] u16.
        let avail = self.avail_addr.0;
        let idx: u16 = self.mem.read_obj(GuestAddress(avail + 2)).unwrap();
        let slot = avail + 4 + 2 * u64::from(idx % self.size);
        self.mem.write_obj(at, GuestAddress(slot)).unwrap();
        self.mem
            .write_obj(idx.wrapping_add(1), GuestAddress(avail + 2))
            .unwrap();
    }

    /// Whether the driver must notify the device about what it published since the last
    /// call, as Linux decides with VIRTIO_RING_F_EVENT_IDX (`vring_need_event`): only if
    /// the avail index moved past the `avail_event` the device wrote at the end of the
    /// used ring. A device that forgets to publish `avail_event` stops getting kicks.
    pub fn needs_kick(&mut self) -> bool {
        let new: u16 = self
            .mem
            .read_obj(GuestAddress(self.avail_addr.0 + 2))
            .unwrap();
        let old = std::mem::replace(&mut self.last_kick_idx, new);
        let event_addr = self.used_addr.0 + 4 + 8 * u64::from(self.size);
        let event: u16 = self.mem.read_obj(GuestAddress(event_addr)).unwrap();
        new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
    }

    /// Next used element the driver has not looked at yet: (head id, length).
    pub fn next_used(&mut self) -> Option<(u32, u32)> {
        let used = self.used_addr.0;
        let idx: u16 = self.mem.read_obj(GuestAddress(used + 2)).unwrap();
        if idx == self.used_seen {
            return None;
        }
        let elem = used + 4 + 8 * u64::from(self.used_seen % self.size);
        let id: u32 = self.mem.read_obj(GuestAddress(elem)).unwrap();
        let len: u32 = self.mem.read_obj(GuestAddress(elem + 4)).unwrap();
        self.used_seen = self.used_seen.wrapping_add(1);
        Some((id, len))
    }
}

pub fn read_reg(t: &mut MmioTransport, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(offset, &mut b);
    u32::from_le_bytes(b)
}

pub fn write_reg(t: &mut MmioTransport, offset: u64, value: u32) {
    t.write(offset, &value.to_le_bytes());
}

/// Negotiate `features` (masked with what the device offers) and stop after
/// FEATURES_OK; returns the status register.
pub fn negotiate(t: &mut MmioTransport, want: u64) -> u32 {
    write_reg(t, 0x70, 0);
    write_reg(t, 0x70, VIRTIO_CONFIG_S_ACKNOWLEDGE);
    write_reg(
        t,
        0x70,
        VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
    );
    let mut offered = 0u64;
    for sel in 0..2u32 {
        write_reg(t, 0x14, sel);
        offered |= u64::from(read_reg(t, 0x10)) << (32 * sel);
    }
    let acked = offered & want;
    for sel in 0..2u32 {
        write_reg(t, 0x24, sel);
        write_reg(t, 0x20, (acked >> (32 * sel)) as u32);
    }
    write_reg(
        t,
        0x70,
        VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK,
    );
    read_reg(t, 0x70)
}

/// Program queue `index` to the rings of `q` (size `size`) and mark it ready.
pub fn setup_queue(t: &mut MmioTransport, index: u32, q: &DriverQueue<'_>, size: u16) {
    write_reg(t, 0x30, index);
    write_reg(t, 0x38, u32::from(size));
    let set = |t: &mut MmioTransport, lo: u64, addr: GuestAddress| {
        write_reg(t, lo, addr.0 as u32);
        write_reg(t, lo + 4, (addr.0 >> 32) as u32);
    };
    set(t, 0x80, q.desc_table_addr());
    set(t, 0x90, q.avail_addr());
    set(t, 0xa0, q.used_addr());
    write_reg(t, 0x44, 1);
}

/// Full Linux-like bring-up: negotiate all offered features, set up `queues` (queue i
/// = queues[i]) and set DRIVER_OK. Returns the final status register.
pub fn bring_up(t: &mut MmioTransport, queues: &[&DriverQueue<'_>]) -> u32 {
    let status = negotiate(t, u64::MAX);
    assert_ne!(status & VIRTIO_CONFIG_S_FEATURES_OK, 0, "features refused");
    for (i, q) in queues.iter().enumerate() {
        setup_queue(t, i as u32, q, q.size);
    }
    write_reg(
        t,
        0x70,
        VIRTIO_CONFIG_S_ACKNOWLEDGE
            | VIRTIO_CONFIG_S_DRIVER
            | VIRTIO_CONFIG_S_FEATURES_OK
            | VIRTIO_CONFIG_S_DRIVER_OK,
    );
    read_reg(t, 0x70)
}

pub fn write_mem(mem: &GuestMemory, addr: u64, data: &[u8]) {
    mem.write_slice(data, GuestAddress(addr)).unwrap();
}

pub fn read_mem(mem: &GuestMemory, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
    v
}

/// Deterministic test pattern (xorshift), so no two sectors look alike.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Bytes from their hex text (golden state files in the persist tests).
pub fn unhex(hex: &str) -> Vec<u8> {
    let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).expect("ascii");
            u8::from_str_radix(text, 16).expect("hex digits")
        })
        .collect()
}
