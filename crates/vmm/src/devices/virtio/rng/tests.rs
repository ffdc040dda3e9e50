//! virtio-rng over the real transport and guest memory.

use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::{MAX_BYTES_PER_REQUEST, Rng};
use crate::devices::virtio::device::lock;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::test_utils::*;

#[test]
fn fills_guest_buffers_with_random_bytes() {
    let mem = guest_memory();
    let dev = Arc::new(Mutex::new(Rng::new().unwrap()));
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::new(mem.clone(), dev.clone(), irq).unwrap();
    let mut q = DriverQueue::new(&mem, 0, 16);
    bring_up(&mut t, &[&q]);

    // Two descriptors, 3000 + 1096 bytes, initially zero.
    let head = q.add_chain(&[wr(DATA_BASE, 3000), wr(DATA_BASE + 0x2000, 1096)]);
    lock(&dev).process_queue();
    assert_eq!(q.next_used(), Some((u32::from(head), 4096)));
    let a = read_mem(&mem, DATA_BASE, 3000);
    let b = read_mem(&mem, DATA_BASE + 0x2000, 1096);
    // 4096 random bytes are all-zero in a 256-byte window with negligible probability.
    assert!(a.chunks(256).all(|c| c.iter().any(|&x| x != 0)));
    assert!(b.chunks(256).all(|c| c.iter().any(|&x| x != 0)));
    assert_eq!(t.interrupt().irq_evt().read().unwrap(), 1);

    // A second request gets different bytes.
    q.add_chain(&[wr(DATA_BASE, 3000)]);
    lock(&dev).process_queue();
    assert_ne!(read_mem(&mem, DATA_BASE, 3000), a);
}

#[test]
fn large_requests_are_bounded() {
    let mem = guest_memory();
    let dev = Arc::new(Mutex::new(Rng::new().unwrap()));
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::new(mem.clone(), dev.clone(), irq).unwrap();
    let mut q = DriverQueue::new(&mem, 0, 16);
    bring_up(&mut t, &[&q]);
    q.add_chain(&[wr(DATA_BASE, 1 << 20)]);
    lock(&dev).process_queue();
    assert_eq!(q.next_used().unwrap().1 as usize, MAX_BYTES_PER_REQUEST);
    let tail = read_mem(&mem, DATA_BASE + MAX_BYTES_PER_REQUEST as u64, 4096);
    assert!(tail.iter().all(|&x| x == 0), "wrote past the bound");
}

#[test]
fn readable_only_or_bad_chains_are_returned_empty() {
    let mem = guest_memory();
    let dev = Arc::new(Mutex::new(Rng::new().unwrap()));
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::new(mem.clone(), dev.clone(), irq).unwrap();
    let mut q = DriverQueue::new(&mem, 0, 16);
    bring_up(&mut t, &[&q]);
    q.add_chain(&[rd(DATA_BASE, 512)]);
    q.add_chain(&[wr(1 << 40, 512)]);
    lock(&dev).process_queue();
    assert_eq!(q.next_used().unwrap().1, 0);
    assert_eq!(q.next_used().unwrap().1, 0);
    assert!(read_mem(&mem, DATA_BASE, 512).iter().all(|&x| x == 0));
}
