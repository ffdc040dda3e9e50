//! virtio-blk over the real transport and real guest memory, the driver simulated with
//! a driver-side split queue (test_utils); disk files are real files in a temp dir.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_RO, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_DRIVER_OK;
use virtio_queue::desc::split::Descriptor;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::overlay::{CHUNK_SIZE, HEADER_SIZE, Overlay, OverlayError};
use super::{Block, BlockConfig, BlockError, DiskError};
use crate::devices::virtio::device::{VirtioDevice, lock};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::test_utils::*;
use crate::memory::GuestMemory;

const DISK_SIZE: usize = 1 << 20;
const HDR: u64 = DATA_BASE;
const STATUS: u64 = DATA_BASE + 0x100;
const DATA: u64 = DATA_BASE + 0x1000;

fn make_base(dir: &Path, size: usize) -> (PathBuf, Vec<u8>) {
    let path = dir.join("base.img");
    let content = pattern(size, 7);
    fs::write(&path, &content).unwrap();
    (path, content)
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

struct Harness<'a> {
    mem: &'a GuestMemory,
    dev: Arc<Mutex<Block>>,
    transport: MmioTransport,
    q: DriverQueue<'a>,
}

impl<'a> Harness<'a> {
    fn new(mem: &'a GuestMemory, cfg: BlockConfig) -> Self {
        let dev = Arc::new(Mutex::new(Block::new(cfg).unwrap()));
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut transport = MmioTransport::new(mem.clone(), dev.clone(), irq).unwrap();
        let q = DriverQueue::new(mem, 0, 64);
        let status = bring_up(&mut transport, &[&q]);
        assert_ne!(status & VIRTIO_CONFIG_S_DRIVER_OK, 0);
        Harness {
            mem,
            dev,
            transport,
            q,
        }
    }

    fn write_header(&self, req_type: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&req_type.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        write_mem(self.mem, HDR, &h);
        write_mem(self.mem, STATUS, &[0xff]);
    }

    /// Publish `bufs`, let the device run, return (used len, status byte).
    fn submit(&mut self, bufs: &[Buf]) -> (u32, u8) {
        let head = self.q.add_chain(bufs);
        lock(&self.dev).process_queue();
        let (id, len) = self.q.next_used().expect("request not completed");
        assert_eq!(id, u32::from(head));
        (len, read_mem(self.mem, STATUS, 1)[0])
    }

    fn read(&mut self, sector: u64, len: usize) -> (u8, Vec<u8>) {
        self.write_header(VIRTIO_BLK_T_IN, sector);
        let (used, status) = self.submit(&[rd(HDR, 16), wr(DATA, len as u32), wr(STATUS, 1)]);
        if status == VIRTIO_BLK_S_OK as u8 {
            assert_eq!(used as usize, len + 1);
        }
        (status, read_mem(self.mem, DATA, len))
    }

    fn write(&mut self, sector: u64, data: &[u8]) -> u8 {
        self.write_header(VIRTIO_BLK_T_OUT, sector);
        write_mem(self.mem, DATA, data);
        let (used, status) =
            self.submit(&[rd(HDR, 16), rd(DATA, data.len() as u32), wr(STATUS, 1)]);
        assert_eq!(used, 1);
        status
    }

    fn simple(&mut self, req_type: u32) -> u8 {
        self.write_header(req_type, 0);
        self.submit(&[rd(HDR, 16), wr(STATUS, 1)]).1
    }
}

fn cfg(base: &Path, overlay: Option<PathBuf>) -> BlockConfig {
    BlockConfig {
        base: base.to_owned(),
        overlay,
        layers: Vec::new(),
        read_only: false,
    }
}

#[test]
fn capacity_in_config_space() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = make_base(dir.path(), DISK_SIZE + 100);
    let mem = guest_memory();
    let mut h = Harness::new(&mem, cfg(&base, None));
    let lo = read_reg(&mut h.transport, 0x100);
    let hi = read_reg(&mut h.transport, 0x104);
    assert_eq!(
        u64::from(lo) | (u64::from(hi) << 32),
        (DISK_SIZE / 512) as u64
    );
}

#[test]
fn reads_return_base_content() {
    let dir = tempfile::tempdir().unwrap();
    let (base, content) = make_base(dir.path(), DISK_SIZE);
    let mem = guest_memory();
    let mut h = Harness::new(&mem, cfg(&base, None));
    let (status, data) = h.read(3, 8192);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    assert_eq!(data, &content[3 * 512..3 * 512 + 8192]);
}

#[test]
fn read_only_without_overlay() {
    let dir = tempfile::tempdir().unwrap();
    let (base, content) = make_base(dir.path(), DISK_SIZE);
    let mem = guest_memory();
    let mut h = Harness::new(&mem, cfg(&base, None));
    assert_ne!(lock(&h.dev).acked_features() & (1 << VIRTIO_BLK_F_RO), 0);
    assert_eq!(h.write(0, &[1u8; 512]), VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(fs::read(&base).unwrap(), content);
}

#[test]
fn writes_go_to_overlay_never_to_base() {
    let dir = tempfile::tempdir().unwrap();
    let (base, content) = make_base(dir.path(), DISK_SIZE);
    let before = fnv(&fs::read(&base).unwrap());
    let overlay = dir.path().join("top.ovl");
    let mem = guest_memory();
    let mut h = Harness::new(&mem, cfg(&base, Some(overlay.clone())));
    assert_eq!(lock(&h.dev).acked_features() & (1 << VIRTIO_BLK_F_RO), 0);

    let new = pattern(16384, 99);
    assert_eq!(h.write(16, &new), VIRTIO_BLK_S_OK as u8);
    assert_eq!(h.simple(VIRTIO_BLK_T_FLUSH), VIRTIO_BLK_S_OK as u8);
    let (status, data) = h.read(16, 16384);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    assert_eq!(data, new);
    // Neighbours still come from the base.
    let (_, data) = h.read(0, 8192);
    assert_eq!(data, &content[..8192]);

    assert_eq!(
        fnv(&fs::read(&base).unwrap()),
        before,
        "base image modified"
    );
    assert!(overlay.exists());
}

#[test]
fn partial_chunk_write_copies_up_from_base() {
    let dir = tempfile::tempdir().unwrap();
    let (base, content) = make_base(dir.path(), DISK_SIZE);
    let mem = guest_memory();
    let mut h = Harness::new(&mem, cfg(&base, Some(dir.path().join("o"))));
    // One sector in the middle of chunk 1, and a write straddling chunks 2..4 unaligned.
    let a = pattern(512, 1);
    assert_eq!(h.write(9, &a), VIRTIO_BLK_S_OK as u8);
    let b = pattern(3 * 4096, 2);
    assert_eq!(h.write(20, &b), VIRTIO_BLK_S_OK as u8);

    let mut expect = content[..6 * 4096].to_vec();
    expect[9 * 512..10 * 512].copy_from_slice(&a);
    expect[20 * 512..20 * 512 + b.len()].copy_from_slice(&b);
    let (status, data) = h.read(0, 6 * 4096);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    assert_eq!(data, expect);
}

#[test]
fn overlay_reopen_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    let (base, content) = make_base(dir.path(), DISK_SIZE);
    let overlay = dir.path().join("o");
    let new = pattern(4096 + 512, 3);
    {
        let mem = guest_memory();
        let mut h = Harness::new(&mem, cfg(&base, Some(overlay.clone())));
        assert_eq!(h.write(100, &new), VIRTIO_BLK_S_OK as u8);
        assert_eq!(h.simple(VIRTIO_BLK_T_FLUSH), VIRTIO_BLK_S_OK as u8);
    }
    let mem = guest_memory();
    let mut h = Harness::new(&mem, cfg(&base, Some(overlay)));
    let (_, data) = h.read(96, 4 * 4096);
    let mut expect = content[96 * 512..96 * 512 + 4 * 4096].to_vec();
    expect[4 * 512..4 * 512 + new.len()].copy_from_slice(&new);
    assert_eq!(data, expect);
}

#[test]
fn read_only_flag_with_existing_overlay() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = make_base(dir.path(), DISK_SIZE);
    let overlay = dir.path().join("o");
    let new = pattern(512, 4);
    {
        let mem = guest_memory();
        let mut h = Harness::new(&mem, cfg(&base, Some(overlay.clone())));
        assert_eq!(h.write(0, &new), VIRTIO_BLK_S_OK as u8);
    }
    let mem = guest_memory();
    let ro = BlockConfig {
        read_only: true,
        ..cfg(&base, Some(overlay.clone()))
    };
    let mut h = Harness::new(&mem, ro.clone());
    assert_eq!(
        h.read(0, 512).1,
        new,
        "data written before (flushed on drop)"
    );
    assert_eq!(h.write(0, &[0u8; 512]), VIRTIO_BLK_S_IOERR as u8);
    // A read-only overlay must exist.
    let missing = BlockConfig {
        overlay: Some(dir.path().join("nope")),
        ..ro
    };
    assert!(Block::new(missing).is_err());
}

#[test]
fn out_of_range_and_unaligned_requests_fail_with_ioerr() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = make_base(dir.path(), DISK_SIZE);
    let mem = guest_memory();
    let mut h = Harness::new(&mem, cfg(&base, Some(dir.path().join("o"))));
    let last = (DISK_SIZE / 512) as u64;
    assert_eq!(h.read(last - 1, 512).0, VIRTIO_BLK_S_OK as u8);
    assert_eq!(h.read(last, 512).0, VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(h.read(last - 1, 1024).0, VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(h.read(u64::MAX / 256, 512).0, VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(h.read(0, 100).0, VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(h.write(last, &[0u8; 512]), VIRTIO_BLK_S_IOERR as u8);
    assert_eq!(h.write(0, &[0u8; 10]), VIRTIO_BLK_S_IOERR as u8);
}

#[test]
fn get_id_and_unsupported_types() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = make_base(dir.path(), DISK_SIZE);
    let mem = guest_memory();
    let mut h = Harness::new(&mem, cfg(&base, None));
    h.write_header(VIRTIO_BLK_T_GET_ID, 0);
    let (used, status) = h.submit(&[rd(HDR, 16), wr(DATA, 20), wr(STATUS, 1)]);
    assert_eq!((used, status), (21, VIRTIO_BLK_S_OK as u8));
    assert_eq!(&read_mem(&mem, DATA, 8), b"base.img");
    assert_eq!(h.simple(77), VIRTIO_BLK_S_UNSUPP as u8);
}

#[test]
fn malformed_chains_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = make_base(dir.path(), DISK_SIZE);
    let mem = guest_memory();
    let mut h = Harness::new(&mem, cfg(&base, Some(dir.path().join("o"))));

    // No writable descriptor: nowhere to put a status, used length 0.
    h.write_header(VIRTIO_BLK_T_IN, 0);
    h.q.add_chain(&[rd(HDR, 16)]);
    lock(&h.dev).process_queue();
    assert_eq!(h.q.next_used().map(|u| u.1), Some(0));

    // Header shorter than 16 bytes: IOERR.
    h.write_header(VIRTIO_BLK_T_IN, 0);
    assert_eq!(
        h.submit(&[rd(HDR, 8), wr(STATUS, 1)]).1,
        VIRTIO_BLK_S_IOERR as u8
    );

    // Buffer outside guest memory: the chain is returned unprocessed.
    h.q.add_chain(&[rd(HDR, 16), wr(1 << 40, 512), wr(STATUS, 1)]);
    lock(&h.dev).process_queue();
    assert_eq!(h.q.next_used().map(|u| u.1), Some(0));

    // Huge length that wraps the guest address space.
    h.q.add_chain(&[rd(u64::MAX - 4, 16), wr(STATUS, 1)]);
    lock(&h.dev).process_queue();
    assert!(h.q.next_used().is_some());

    // A descriptor whose `next` points to itself: bounded by the queue size.
    h.write_header(VIRTIO_BLK_T_IN, 0);
    let looped = Descriptor::new(HDR, 16, 1 /* NEXT */, 40);
    h.q.add_raw(&[looped], 40);
    lock(&h.dev).process_queue();
    assert!(h.q.next_used().is_some());

    // A next index beyond the table.
    let bad = Descriptor::new(HDR, 16, 1, 1000);
    h.q.add_raw(&[bad], 41);
    lock(&h.dev).process_queue();
    assert!(h.q.next_used().is_some());

    // The device still works afterwards.
    assert_eq!(h.read(0, 512).0, VIRTIO_BLK_S_OK as u8);
}

#[test]
fn served_through_event_manager_after_driver_ok() {
    let dir = tempfile::tempdir().unwrap();
    let (base, content) = make_base(dir.path(), DISK_SIZE);
    let mem = guest_memory();
    let dev = Arc::new(Mutex::new(Block::new(cfg(&base, None)).unwrap()));
    let mut em = EventManager::<Arc<Mutex<dyn MutEventSubscriber + Send>>>::new().unwrap();
    em.add_subscriber(dev.clone());
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::new(mem.clone(), dev.clone(), irq).unwrap();
    let mut q = DriverQueue::new(&mem, 0, 16);

    // A request published before DRIVER_OK is served once the device activates.
    let mut hdr = [0u8; 16];
    hdr[8..16].copy_from_slice(&2u64.to_le_bytes());
    write_mem(&mem, HDR, &hdr);
    q.add_chain(&[rd(HDR, 16), wr(DATA, 512), wr(STATUS, 1)]);
    bring_up(&mut t, &[&q]);
    em.run_with_timeout(1000).unwrap();
    assert_eq!(q.next_used().map(|u| u.1), Some(513));
    assert_eq!(read_mem(&mem, DATA, 512), &content[1024..1536]);
    assert_eq!(t.interrupt().irq_evt().read().unwrap(), 1);
    assert_eq!(read_reg(&mut t, 0x60), 1);

    // A later request, kicked through QueueNotify.
    hdr[8..16].copy_from_slice(&5u64.to_le_bytes());
    write_mem(&mem, HDR, &hdr);
    q.add_chain(&[rd(HDR, 16), wr(DATA, 512), wr(STATUS, 1)]);
    write_reg(&mut t, 0x50, 0);
    em.run_with_timeout(1000).unwrap();
    assert_eq!(q.next_used().map(|u| u.1), Some(513));
    assert_eq!(read_mem(&mem, DATA, 512), &content[5 * 512..6 * 512]);
}

// ---- overlay file format, directly ----

fn open_overlay(base: &Path, path: &Path) -> Result<Overlay, OverlayError> {
    let f = fs::File::open(base).unwrap();
    let size = f.metadata().unwrap().len();
    Overlay::open(f, size, path, true)
}

#[test]
fn overlay_is_sparse_and_counts_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let (base, content) = make_base(dir.path(), DISK_SIZE);
    let path = dir.path().join("o");
    let mut o = open_overlay(&base, &path).unwrap();
    assert_eq!(o.chunks_written(), 0);
    o.write_at(&[9u8; 10], CHUNK_SIZE * 3 + 5).unwrap();
    assert_eq!(o.chunks_written(), 1);
    let mut buf = vec![0u8; CHUNK_SIZE as usize];
    o.read_at(&mut buf, CHUNK_SIZE * 3).unwrap();
    let c3 = &content[3 * CHUNK_SIZE as usize..4 * CHUNK_SIZE as usize];
    assert_eq!(&buf[..5], &c3[..5]);
    assert_eq!(&buf[5..15], &[9u8; 10]);
    assert_eq!(&buf[15..], &c3[15..]);
    o.flush().unwrap();
    let len = fs::metadata(&path).unwrap().len();
    assert!(
        len <= HEADER_SIZE + 4096 + 5 * CHUNK_SIZE,
        "overlay is {len} bytes"
    );
}

#[test]
fn overlay_on_disk_size_not_chunk_aligned() {
    let dir = tempfile::tempdir().unwrap();
    let (base, content) = make_base(dir.path(), 3 * 4096 + 1536);
    let mut o = open_overlay(&base, &dir.path().join("o")).unwrap();
    // Last sector of the disk, inside the partial last chunk.
    o.write_at(&[5u8; 512], 3 * 4096 + 1024).unwrap();
    let mut buf = vec![0u8; 1536];
    o.read_at(&mut buf, 3 * 4096).unwrap();
    assert_eq!(&buf[..1024], &content[3 * 4096..3 * 4096 + 1024]);
    assert_eq!(&buf[1024..], &[5u8; 512]);
}

#[test]
fn corrupt_or_mismatched_overlay_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = make_base(dir.path(), DISK_SIZE);
    let path = dir.path().join("o");
    drop(open_overlay(&base, &path).unwrap());

    // Flip one header byte (the disk size): checksum catches it.
    let mut bytes = fs::read(&path).unwrap();
    bytes[17] ^= 1;
    let bad = dir.path().join("bad");
    fs::write(&bad, &bytes).unwrap();
    let err = open_overlay(&base, &bad).unwrap_err();
    assert!(matches!(err, OverlayError::BadHeader { .. }), "{err}");

    // Not an overlay at all.
    let junk = dir.path().join("junk");
    fs::write(&junk, vec![0x42u8; 8192]).unwrap();
    let err = open_overlay(&base, &junk).unwrap_err();
    assert!(err.to_string().contains("bad magic"), "{err}");

    // Truncated file.
    let short = dir.path().join("short");
    fs::write(&short, &bytes[..100]).unwrap();
    assert!(matches!(
        open_overlay(&base, &short).unwrap_err(),
        OverlayError::BadHeader { .. }
    ));

    // A valid overlay made for another base size.
    let (other, _) = {
        let p = dir.path().join("other.img");
        fs::write(&p, vec![0u8; DISK_SIZE * 2]).unwrap();
        (p, ())
    };
    let err = open_overlay(&other, &path).unwrap_err();
    assert!(matches!(err, OverlayError::SizeMismatch { .. }), "{err}");

    // Through the device constructor the error is typed too.
    let err = Block::new(cfg(&base, Some(bad))).err().unwrap();
    assert!(matches!(
        err,
        BlockError::Disk(DiskError::Overlay(OverlayError::BadHeader { .. }))
    ));
}

#[test]
fn overlay_locked_against_second_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = make_base(dir.path(), DISK_SIZE);
    let path = dir.path().join("o");
    let _first = open_overlay(&base, &path).unwrap();
    assert!(matches!(
        open_overlay(&base, &path).unwrap_err(),
        OverlayError::Locked { .. }
    ));
}

#[test]
fn missing_base_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Block::new(cfg(&dir.path().join("nope.img"), None))
        .err()
        .unwrap();
    assert!(err.to_string().contains("nope.img"), "{err}");
}
