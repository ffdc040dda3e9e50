//! virtio-fs: the config space, refusals, and the whole path from a driver's ring to a
//! real virtiofsd and back (FUSE_INIT, then a FUSE_LOOKUP of a file in the shared
//! directory), with guest memory in a memfd as the VMM has it. No KVM: the test plays
//! the guest driver through the real transport.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::{Fs, FsError, NUM_QUEUES, TAG_MAX_LEN, config_space};
use crate::devices::virtio::VirtioDevice;
use crate::devices::virtio::device::lock;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::test_utils::*;
use crate::memory::{GuestMemory, create_guest_memory};

#[test]
fn config_space_holds_the_tag_and_one_request_queue() {
    let c = config_space("vol0").unwrap();
    assert_eq!(c.len(), TAG_MAX_LEN + 4);
    assert_eq!(&c[..4], b"vol0");
    assert!(c[4..TAG_MAX_LEN].iter().all(|&b| b == 0));
    assert_eq!(c[TAG_MAX_LEN..], ((NUM_QUEUES - 1) as u32).to_le_bytes());
    assert!(config_space(&"t".repeat(TAG_MAX_LEN)).is_ok());
}

#[test]
fn bad_tags_are_refused() {
    for bad in ["", "a\0b", &"t".repeat(TAG_MAX_LEN + 1)] {
        assert!(matches!(config_space(bad), Err(FsError::Tag(_))), "{bad:?}");
    }
}

#[test]
fn a_missing_backend_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nobody.sock");
    let err = Fs::new("vol0", &sock).err().expect("no backend there");
    assert!(err.to_string().contains("nobody.sock"), "{err}");
}

/// The virtiofsd to test with: `SANDCELL_VIRTIOFSD`, else the one on PATH or in
/// /usr/libexec (Debian's). Missing, the test fails saying how to get it.
fn virtiofsd() -> PathBuf {
    if let Some(p) = std::env::var_os("SANDCELL_VIRTIOFSD").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([
            PathBuf::from("/usr/libexec"),
            PathBuf::from("/usr/lib/qemu"),
        ])
        .map(|d| d.join("virtiofsd"))
        .find(|p| p.is_file())
        .expect(
            "virtiofsd not found: set SANDCELL_VIRTIOFSD, or install it (.ci/install-deps \
             does; see docs/volumes.md)",
        )
}

struct Virtiofsd(Child);

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_virtiofsd(socket: &Path, shared: &Path) -> Virtiofsd {
    let child = Command::new(virtiofsd())
        .arg(format!("--socket-path={}", socket.display()))
        .arg(format!("--shared-dir={}", shared.display()))
        .args(["--sandbox=none", "--cache=never", "--log-level=error"])
        .spawn()
        .expect("spawning virtiofsd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "virtiofsd made no socket in 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Virtiofsd(child)
}

const FUSE_LOOKUP: u32 = 1;
const FUSE_INIT: u32 = 26;
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

/// A FUSE request: `fuse_in_header` then `body`.
fn fuse_request(opcode: u32, unique: u64, nodeid: u64, body: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(IN_HEADER + body.len());
    r.extend_from_slice(&((IN_HEADER + body.len()) as u32).to_le_bytes());
    r.extend_from_slice(&opcode.to_le_bytes());
    r.extend_from_slice(&unique.to_le_bytes());
    r.extend_from_slice(&nodeid.to_le_bytes());
    r.extend_from_slice(&[0u8; 16]); // uid, gid, pid, total_extlen, padding
    r.extend_from_slice(body);
    r
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Sends one request on the request queue, kicks the backend, runs the device's events
/// until the reply is used; returns the reply's bytes.
fn round_trip(
    em: &mut EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>>,
    mem: &GuestMemory,
    q: &mut DriverQueue<'_>,
    kick: &EventFd,
    request: &[u8],
    reply_len: u32,
) -> Vec<u8> {
    write_mem(mem, DATA_BASE, request);
    let head = q.add_chain(&[
        rd(DATA_BASE, request.len() as u32),
        wr(DATA_BASE + 0x1_0000, reply_len),
    ]);
    kick.write(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        em.run_with_timeout(50).unwrap();
        if let Some((id, len)) = q.next_used() {
            assert_eq!(id, u32::from(head));
            return read_mem(mem, DATA_BASE + 0x1_0000, len as usize);
        }
        assert!(Instant::now() < deadline, "no reply from virtiofsd in 10 s");
    }
}

#[test]
fn fuse_requests_reach_a_real_virtiofsd_and_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("hello.txt"), b"twelve bytes").unwrap();
    let socket = dir.path().join("fs.sock");
    let _backend = start_virtiofsd(&socket, &shared);

    let (mem, _memfd) = create_guest_memory(MEM_SIZE as u64).unwrap();
    let dev = Arc::new(Mutex::new(Fs::new("vol0", &socket).unwrap()));
    let mut em = EventManager::<Arc<Mutex<dyn MutEventSubscriber + Send>>>::new().unwrap();
    em.add_subscriber(dev.clone() as Arc<Mutex<dyn MutEventSubscriber + Send>>);
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let kick = lock(&dev).queue_events()[1].try_clone().unwrap();
    let mut t = MmioTransport::new(mem.clone(), dev.clone(), irq).unwrap();
    let hiprio = DriverQueue::new(&mem, 0, 16);
    let mut requests = DriverQueue::new(&mem, 1, 16);
    bring_up(&mut t, &[&hiprio, &requests]);
    assert!(lock(&dev).is_activated());

    // FUSE_INIT: protocol 7.31, no flags.
    let mut init = Vec::new();
    for v in [7u32, 31, 0, 0] {
        init.extend_from_slice(&v.to_le_bytes());
    }
    init.extend_from_slice(&[0u8; 48]);
    let reply = round_trip(
        &mut em,
        &mem,
        &mut requests,
        &kick,
        &fuse_request(FUSE_INIT, 1, 0, &init),
        OUT_HEADER as u32 + 64,
    );
    assert_eq!(u32_at(&reply, 4), 0, "FUSE_INIT error");
    assert_eq!(u64_at(&reply, 8), 1, "unique");
    assert_eq!(u32_at(&reply, OUT_HEADER), 7, "major version");
    assert!(t.interrupt().irq_evt().read().unwrap() >= 1, "no interrupt");

    // FUSE_LOOKUP of hello.txt under the root (node 1): its size comes back.
    let reply = round_trip(
        &mut em,
        &mem,
        &mut requests,
        &kick,
        &fuse_request(FUSE_LOOKUP, 2, 1, b"hello.txt\0"),
        OUT_HEADER as u32 + 128,
    );
    assert_eq!(u32_at(&reply, 4), 0, "FUSE_LOOKUP error");
    // fuse_entry_out: nodeid, generation, entry_valid, attr_valid, two nsecs, then attr
    // (ino, size, ...).
    assert_eq!(u64_at(&reply, OUT_HEADER + 48), 12, "hello.txt's size");
}
