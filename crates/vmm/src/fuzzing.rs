//! Fuzz entry points for what a guest (or a snapshot file) feeds the VMM: the virtqueues of
//! each virtio device, and a transport restored from saved state. Built with the `fuzzing`
//! feature only (fuzz/, never the release binary); each takes the fuzzer's bytes as the
//! guest's side of the machine and checks what must hold whatever the guest wrote.
//!
//! The guest's side: after a Linux-like bring-up of the device (fuzz/README.md says why the
//! bring-up is not fuzzed here: the MMIO registers are a separate target), the bytes are
//! written over each queue's descriptor table and available ring and over a data region,
//! so descriptors, chains, indexes and buffer contents are all the guest's, then the device
//! processes its queues twice. What must hold: no panic, no hang (the fuzzer's timeout),
//! and a device never completes more chains than the guest offered.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::devices::virtio::block::{Block, BlockConfig};
use crate::devices::virtio::device::{VirtioDevice, lock};
use crate::devices::virtio::mmio::MmioState;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::{Net, NetBackend};
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::test_utils::{DATA_BASE, DriverQueue, bring_up, write_mem};
use crate::devices::virtio::vsock::Vsock;
use crate::memory::GuestMemory;
use crate::snapshot::Persist;

/// Entries per queue: small, so the fuzzer's bytes cover whole tables.
const QUEUE_SIZE: u16 = 16;
/// Guest memory: the rings (below 1 MiB) and a data region of [`DATA_LEN`] at DATA_BASE.
const MEM_SIZE: usize = 2 << 20;
const DATA_LEN: usize = 64 << 10;

fn memory() -> GuestMemory {
    GuestMemory::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

/// A directory for the devices' host files, made once per fuzzing process.
fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir for the fuzz devices"))
        .path()
}

/// Takes `n` bytes off the front of `data` (fewer at its end).
fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, rest) = data.split_at(n.min(data.len()));
    *data = rest;
    head
}

/// The guest's writes: each queue's descriptor table and available ring, then the data
/// region, from `data`. Returns the available index the guest published per queue.
fn scribble(mem: &GuestMemory, queues: &[DriverQueue<'_>], mut data: &[u8]) -> Vec<u16> {
    let size = usize::from(QUEUE_SIZE);
    let mut published = Vec::new();
    for q in queues {
        write_mem(mem, q.desc_table_addr().0, take(&mut data, 16 * size));
        // flags, idx, ring[size], used_event
        write_mem(mem, q.avail_addr().0, take(&mut data, 6 + 2 * size));
        published.push(mem.read_obj(GuestAddress(q.avail_addr().0 + 2)).unwrap());
    }
    write_mem(mem, DATA_BASE, take(&mut data, DATA_LEN));
    published
}

/// What must hold after the device ran: it completed no more chains than were offered.
fn check_used(mem: &GuestMemory, queues: &[DriverQueue<'_>], published: &[u16]) {
    for (q, avail) in queues.iter().zip(published) {
        let used: u16 = mem.read_obj(GuestAddress(q.used_addr().0 + 2)).unwrap();
        assert!(
            used <= *avail,
            "the device completed {used} chains, the guest offered {avail}"
        );
    }
}

/// Brings `dev` up with `nqueues` queues, writes `data` as the guest and runs `process`
/// twice.
fn drive<D: VirtioDevice + 'static>(dev: D, nqueues: usize, data: &[u8], process: impl Fn(&mut D)) {
    let mem = memory();
    let dev = Arc::new(Mutex::new(dev));
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::new(mem.clone(), dev.clone(), irq).unwrap();
    let queues: Vec<DriverQueue<'_>> = (0..nqueues)
        .map(|i| DriverQueue::new(&mem, i, QUEUE_SIZE))
        .collect();
    let refs: Vec<&DriverQueue<'_>> = queues.iter().collect();
    bring_up(&mut t, &refs);
    let published = scribble(&mem, &queues, data);
    process(&mut lock(&dev));
    process(&mut lock(&dev));
    check_used(&mem, &queues, &published);
}

/// virtio-rng: requests of any shape (the device fills writable buffers, bounded).
pub fn virtio_rng(data: &[u8]) {
    drive(Rng::new().unwrap(), 1, data, Rng::process_queue);
}

/// virtio-blk over a 64 KiB base and a fresh overlay: reads, writes, flushes, get-id and
/// whatever else a header says, at any sector.
pub fn virtio_block(data: &[u8]) {
    let base = scratch().join("base.img");
    if !base.exists() {
        std::fs::write(&base, vec![0x5a; 64 << 10]).unwrap();
    }
    let overlay = scratch().join("overlay");
    let _ = std::fs::remove_file(&overlay);
    let cfg = BlockConfig {
        base,
        overlay: Some(overlay),
        layers: Vec::new(),
        read_only: false,
    };
    drive(Block::new(cfg).unwrap(), 1, data, Block::process_queue);
}

/// A host end that takes every frame and has none to give (the guest is the side fuzzed).
struct Sink(EventFd);

impl AsRawFd for Sink {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl NetBackend for Sink {
    fn recv(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }
    fn send(&mut self, frame: &[u8]) -> io::Result<usize> {
        Ok(frame.len())
    }
    fn set_offload(&mut self, _flags: u32) -> io::Result<()> {
        Ok(())
    }
    fn name(&self) -> &str {
        "fuzz0"
    }
}

/// virtio-net: TX frames (vnet headers, chains of any shape) and posted RX buffers.
pub fn virtio_net(data: &[u8]) {
    let sink = Sink(EventFd::new(EFD_NONBLOCK).unwrap());
    let net = Net::new(Box::new(sink), [2, 0, 0, 0, 0, 1]).unwrap();
    drive(net, 2, data, |n: &mut Net| {
        n.process_tx();
        n.process_rx();
    });
}

/// virtio-vsock: packets of any header (connects to host ports nobody listens on, data on
/// connections that do not exist, credit updates, shutdowns) and posted RX buffers.
pub fn virtio_vsock(data: &[u8]) {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let uds: PathBuf = scratch().join(format!("v{}.sock", n % 4));
    let _ = std::fs::remove_file(&uds);
    drive(Vsock::new(3, uds).unwrap(), 3, data, Vsock::process_all);
}

/// A virtio-mmio transport restored from a saved state (postcard, as in a snapshot's state
/// file after its checksum: a snapshot is outside input) onto virtio-rng over guest memory
/// the rest of `data` fills, then driven once. A state the restore accepts must not make
/// the device misbehave.
pub fn mmio_restore(data: &[u8]) {
    let Ok((state, rest)) = postcard::take_from_bytes::<MmioState>(data) else {
        return;
    };
    let mem = memory();
    write_mem(&mem, 0, &rest[..rest.len().min(MEM_SIZE)]);
    let dev = Arc::new(Mutex::new(Rng::new().unwrap()));
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let as_dyn: Arc<Mutex<dyn VirtioDevice>> = dev.clone();
    if MmioTransport::restore((mem, as_dyn, irq), &state).is_ok() {
        lock(&dev).process_queue();
    }
}

#[cfg(test)]
mod tests {
    //! The entry points run on a few inputs in the normal test run, so they cannot rot
    //! between fuzzing sessions; the seeds in fuzz/seeds/ run in `make fuzz-smoke`.
    use super::*;

    #[test]
    fn every_entry_point_takes_empty_short_and_patterned_input() {
        let patterned = crate::devices::virtio::test_utils::pattern(4096, 3);
        for input in [&[][..], &[0xff; 7][..], &patterned[..]] {
            virtio_rng(input);
            virtio_block(input);
            virtio_net(input);
            virtio_vsock(input);
            mmio_restore(input);
        }
    }
}
