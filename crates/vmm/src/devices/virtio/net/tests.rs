//! virtio-net without KVM: the device in a real EventManager, the guest driver simulated
//! through driver-side split queues over real guest memory (test_utils), and the host
//! side a SOCK_SEQPACKET socketpair standing in for the TAP (one message = one frame, as
//! on a TAP). `real_tap_*` runs the same paths on a real TAP in a private network
//! namespace and needs root and /dev/net/tun: it fails, loudly, without them.
//!
//! No timing assertions: "wait" means pumping the event loop a bounded number of times.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_MAC, VIRTIO_NET_HDR_GSO_TCPV4,
};
use virtio_queue::desc::split::Descriptor;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::tap::{TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6};
use super::*;
use crate::bus::BusDevice;
use crate::devices::virtio::device::{VIRTIO_F_VERSION_1, VirtioDevice, lock};
use crate::devices::virtio::mmio::{MmioState, MmioTransport};
use crate::devices::virtio::test_utils::*;
use crate::memory::GuestMemory;
use crate::snapshot::Persist;

type Em = EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>>;

const MAC: [u8; 6] = [0x02, 0x5c, 0x00, 0x00, 0x00, 0x07];
const RX_BASE: u64 = 0x10_0000;
const RX_BUF_LEN: u32 = 2048;
const TX_BASE: u64 = 0x100_0000;

/// The test backend: one end of a socketpair; the test holds the other.
struct PairBackend {
    fd: OwnedFd,
    offload: Arc<AtomicU32>,
}

impl AsRawFd for PairBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl NetBackend for PairBackend {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        recv_fd(self.fd.as_raw_fd(), buf)
    }
    fn send(&mut self, frame: &[u8]) -> io::Result<usize> {
        send_fd(self.fd.as_raw_fd(), frame)
    }
    fn set_offload(&mut self, flags: u32) -> io::Result<()> {
        self.offload.store(flags, Ordering::SeqCst);
        Ok(())
    }
    fn name(&self) -> &str {
        "pair0"
    }
}

fn recv_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the kernel writes at most buf.len() bytes into the live buffer.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn send_fd(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: the kernel reads buf.len() bytes from the live buffer.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn pair() -> (PairBackend, OwnedFd, Arc<AtomicU32>) {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two fds into the array we own.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "socketpair: {}", io::Error::last_os_error());
    // SAFETY: both fds were just created and are owned by nobody else.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Room for a few 64 KiB frames in flight.
    for fd in [&a, &b] {
        let size: libc::c_int = 1 << 20;
        // SAFETY: setsockopt reads one int from a live pointer.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&size as *const libc::c_int).cast(),
                4,
            )
        };
    }
    let offload = Arc::new(AtomicU32::new(u32::MAX));
    (
        PairBackend {
            fd: a,
            offload: offload.clone(),
        },
        b,
        offload,
    )
}

/// A vnet header + Ethernet frame of `len` bytes in total, with a recognisable payload.
fn frame(len: usize, seed: u64) -> Vec<u8> {
    let mut f = pattern(len, seed);
    f[..VNET_HDR_LEN].fill(0);
    f
}

struct Guest<'a> {
    mem: &'a GuestMemory,
    dev: Arc<Mutex<Net>>,
    t: MmioTransport,
    em: Em,
    rx: DriverQueue<'a>,
    tx: DriverQueue<'a>,
    host: OwnedFd,
    offload: Arc<AtomicU32>,
    rx_next: u64,
}

impl<'a> Guest<'a> {
    /// A device brought up with the features in `want` and `rx_bufs` RX buffers posted.
    fn new(mem: &'a GuestMemory, want: u64, rx_bufs: u16) -> Self {
        let (backend, host, offload) = pair();
        let dev = Arc::new(Mutex::new(Net::new(Box::new(backend), MAC).unwrap()));
        Self::attach(mem, dev, host, offload, want, rx_bufs)
    }

    fn attach(
        mem: &'a GuestMemory,
        dev: Arc<Mutex<Net>>,
        host: OwnedFd,
        offload: Arc<AtomicU32>,
        want: u64,
        rx_bufs: u16,
    ) -> Self {
        let mut em = Em::new().unwrap();
        em.add_subscriber(dev.clone());
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut t = MmioTransport::new(mem.clone(), dev.clone(), irq).unwrap();
        let rx = DriverQueue::new(mem, 0, QUEUE_SIZE);
        let tx = DriverQueue::new(mem, 1, QUEUE_SIZE);
        let status = negotiate(&mut t, want);
        assert_ne!(status & 8, 0, "FEATURES_OK refused");
        setup_queue(&mut t, 0, &rx, QUEUE_SIZE);
        setup_queue(&mut t, 1, &tx, QUEUE_SIZE);
        write_reg(&mut t, 0x70, status | 4); // DRIVER_OK
        let mut g = Guest {
            mem,
            dev,
            t,
            em,
            rx,
            tx,
            host,
            offload,
            rx_next: RX_BASE,
        };
        for _ in 0..rx_bufs {
            g.post_rx(RX_BUF_LEN);
        }
        g.pump();
        g
    }

    fn pump(&mut self) -> usize {
        self.em.run_with_timeout(10).unwrap()
    }

    fn kick(&mut self, queue: u32) {
        let needed = if queue == 0 {
            self.rx.needs_kick()
        } else {
            self.tx.needs_kick()
        };
        if needed {
            write_reg(&mut self.t, 0x50, queue);
        }
    }

    /// Post one RX buffer of `len` bytes; returns its address.
    fn post_rx(&mut self, len: u32) -> u64 {
        let addr = self.rx_next;
        self.rx_next += u64::from(len).div_ceil(4096) * 4096;
        self.rx.add_chain(&[wr(addr, len)]);
        addr
    }

    /// Queue a frame on TX, header and frame in separate descriptors (as Linux does).
    fn send(&mut self, f: &[u8]) {
        write_mem(self.mem, TX_BASE, &f[..VNET_HDR_LEN]);
        write_mem(self.mem, TX_BASE + 0x100, &f[VNET_HDR_LEN..]);
        self.tx.add_chain(&[
            rd(TX_BASE, VNET_HDR_LEN as u32),
            rd(TX_BASE + 0x100, (f.len() - VNET_HDR_LEN) as u32),
        ]);
        self.kick(1);
    }

    fn host_recv(&self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        match recv_fd(self.host.as_raw_fd(), &mut buf) {
            Ok(n) => Some(buf[..n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) => panic!("recv: {e}"),
        }
    }

    fn host_send(&self, f: &[u8]) {
        assert_eq!(send_fd(self.host.as_raw_fd(), f).unwrap(), f.len());
    }

    fn counters(&self) -> NetCounters {
        lock(&self.dev).counters()
    }
}

fn all_features() -> u64 {
    u64::MAX
}

#[test]
fn offers_its_features_and_mac() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem, all_features(), 0);
    let acked = lock(&g.dev).acked_features();
    for bit in [VIRTIO_NET_F_MAC, VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM] {
        assert_ne!(acked & (1 << bit), 0, "feature {bit} not offered");
    }
    assert_ne!(acked & VIRTIO_F_VERSION_1, 0);
    let mut mac = [0u8; 8];
    g.t.read(0x100, &mut mac);
    assert_eq!(&mac[..6], &MAC);
    assert_eq!(&mac[6..], &[0, 0], "bytes past the MAC read as zero");
    // Every receive offload the guest acked reaches the TAP at activation.
    assert_eq!(
        g.offload.load(Ordering::SeqCst),
        TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6
    );
    assert_eq!(g.dev.lock().unwrap().backend_name(), "pair0");
    let _ = g.pump();
}

#[test]
fn no_receive_offloads_without_guest_csum() {
    let mem = guest_memory();
    let want = VIRTIO_F_VERSION_1 | (1 << VIRTIO_NET_F_MAC) | (1 << VIRTIO_NET_F_CSUM);
    let g = Guest::new(&mem, want, 0);
    assert_eq!(g.offload.load(Ordering::SeqCst), 0);
}

#[test]
fn transmits_a_frame() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem, all_features(), 0);
    let f = frame(VNET_HDR_LEN + 1514, 1);
    g.send(&f);
    g.pump();
    assert_eq!(g.host_recv().as_deref(), Some(&f[..]));
    assert_eq!(g.tx.next_used().map(|u| u.1), Some(0));
    assert_eq!(g.counters().tx_frames, 1);
    assert_eq!(g.t.interrupt().irq_evt().read().unwrap(), 1);
}

#[test]
fn transmits_a_64k_gso_frame() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem, all_features(), 0);
    let mut f = frame(MAX_FRAME_LEN, 2);
    f[1] = VIRTIO_NET_HDR_GSO_TCPV4 as u8;
    g.send(&f);
    g.pump();
    assert_eq!(g.host_recv().map(|r| r == f), Some(true));
}

#[test]
fn receives_a_frame_into_a_guest_buffer() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem, all_features(), 4);
    let f = frame(VNET_HDR_LEN + 1514, 3);
    g.host_send(&f);
    g.pump();
    let (_, len) = g.rx.next_used().expect("frame delivered");
    assert_eq!(len as usize, f.len());
    let got = read_mem(&mem, RX_BASE, f.len());
    assert_eq!(&got[..10], &f[..10], "header as the TAP wrote it");
    assert_eq!(&got[10..12], &1u16.to_le_bytes(), "num_buffers = 1");
    assert_eq!(&got[12..], &f[12..]);
    assert_eq!(g.counters().rx_frames, 1);
}

#[test]
fn without_buffers_frames_wait_and_the_tap_is_not_polled() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem, all_features(), 0);
    let frames: Vec<Vec<u8>> = (0..3)
        .map(|i| frame(VNET_HDR_LEN + 100 + i, i as u64))
        .collect();
    for f in &frames {
        g.host_send(f);
    }
    g.pump();
    assert!(
        lock(&g.dev).rx_pending(),
        "the first frame waits for a buffer"
    );
    // The backend is still readable, but disarmed: the loop has nothing to do.
    assert_eq!(
        g.pump(),
        0,
        "the event loop still polls a backend it cannot serve"
    );
    assert_eq!(g.counters().rx_dropped, 0);
    // Buffers arrive (the device re-armed the RX notification): all frames, in order.
    for _ in 0..3 {
        g.post_rx(RX_BUF_LEN);
    }
    g.kick(0);
    for _ in 0..10 {
        g.pump();
    }
    let mut addr = RX_BASE;
    for f in &frames {
        let (_, len) = g.rx.next_used().expect("delivered after the notify");
        assert_eq!(len as usize, f.len());
        assert_eq!(read_mem(&mem, addr + 12, f.len() - 12), f[12..]);
        addr += 4096;
    }
    assert!(!lock(&g.dev).rx_pending());
    // And the backend is polled again: a new frame goes straight in.
    g.post_rx(RX_BUF_LEN);
    g.kick(0);
    g.pump();
    g.host_send(&frames[0]);
    g.pump();
    assert_eq!(
        g.rx.next_used().map(|u| u.1 as usize),
        Some(frames[0].len())
    );
}

#[test]
fn malformed_tx_chains_are_refused() {
    let mem = guest_memory();
    // HOST_TSO not negotiated: a GSO frame is refused.
    let want = VIRTIO_F_VERSION_1 | (1 << VIRTIO_NET_F_CSUM);
    let mut g = Guest::new(&mem, want, 0);
    let mut gso = frame(VNET_HDR_LEN + 1514, 4);
    gso[1] = VIRTIO_NET_HDR_GSO_TCPV4 as u8;
    g.send(&gso);
    // Shorter than a vnet header and an Ethernet header.
    g.tx.add_chain(&[rd(TX_BASE, 20)]);
    // Longer than any frame, spread over descriptors.
    g.tx.add_chain(&[rd(TX_BASE, 40_000), rd(TX_BASE, 40_000)]);
    // Outside guest memory.
    g.tx.add_chain(&[rd(1 << 40, 100)]);
    // Only writable buffers (nothing to send).
    g.tx.add_chain(&[wr(TX_BASE, 100)]);
    // A descriptor loop: 0 -> 1 -> 0.
    let a = Descriptor::new(TX_BASE, 4096, 1, 101);
    let b = Descriptor::new(TX_BASE, 4096, 1, 100);
    g.tx.add_raw(&[a, b], 100);
    write_reg(&mut g.t, 0x50, 1);
    g.pump();
    assert!(g.host_recv().is_none(), "a malformed chain reached the TAP");
    assert_eq!(g.counters().tx_dropped, 6);
    assert_eq!(g.counters().tx_frames, 0);
    // The device is still fine.
    let ok = frame(VNET_HDR_LEN + 60, 5);
    g.send(&ok);
    write_reg(&mut g.t, 0x50, 1);
    g.pump();
    assert_eq!(g.host_recv().as_deref(), Some(&ok[..]));
}

#[test]
fn rx_frames_that_do_not_fit_are_dropped_not_truncated() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem, all_features(), 0);
    g.post_rx(256);
    g.rx.add_chain(&[rd(RX_BASE + 0x10_0000, 4096)]); // read-only: unusable for RX
    g.rx.add_chain(&[wr(1 << 40, 4096)]); // outside guest memory
    g.post_rx(RX_BUF_LEN);
    g.kick(0);
    g.pump();
    let big = frame(VNET_HDR_LEN + 1000, 6);
    for _ in 0..4 {
        g.host_send(&big);
    }
    g.pump();
    let lens: Vec<u32> = std::iter::from_fn(|| g.rx.next_used().map(|u| u.1)).collect();
    assert_eq!(lens, vec![0, 0, 0, big.len() as u32]);
    assert_eq!(g.counters().rx_dropped, 3);
    // Short garbage from the TAP is dropped too.
    g.host_send(&[0u8; 5]);
    g.pump();
    assert_eq!(g.counters().rx_dropped, 4);
}

#[test]
fn state_round_trips_and_a_restored_device_carries_on() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem, all_features(), 2);
    let f = frame(VNET_HDR_LEN + 300, 7);
    g.host_send(&f);
    g.send(&f);
    g.pump();
    assert_eq!(g.rx.next_used().map(|u| u.1 as usize), Some(f.len()));
    assert!(g.host_recv().is_some());

    let net_state = lock(&g.dev).save();
    let mmio_state: MmioState = g.t.save();
    let bytes = postcard::to_allocvec(&(net_state.clone(), mmio_state.clone())).unwrap();
    let (net_state2, mmio_state2): (NetState, MmioState) = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(net_state2, net_state);
    assert_eq!(net_state2.tap_name, "pair0");
    assert_eq!(net_state2.mac, MAC);

    // Restore onto a new backend (the new process's TAP) and the same guest memory.
    let (backend, host, _offload) = pair();
    let dev = Net::restore(NetRestoreArgs::Backend(Box::new(backend)), &net_state2).unwrap();
    let dev = Arc::new(Mutex::new(dev));
    let mut em = Em::new().unwrap();
    em.add_subscriber(dev.clone());
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::restore((mem.clone(), dev.clone(), irq), &mmio_state2).unwrap();
    em.run_with_timeout(10).unwrap();
    // The one RX buffer still posted takes the next frame; TX goes on from its position.
    let f2 = frame(VNET_HDR_LEN + 400, 8);
    assert_eq!(send_fd(host.as_raw_fd(), &f2).unwrap(), f2.len());
    em.run_with_timeout(10).unwrap();
    assert_eq!(g.rx.next_used().map(|u| u.1 as usize), Some(f2.len()));
    assert_eq!(read_mem(&mem, RX_BASE + 4096 + 12, f2.len() - 12), f2[12..]);
    g.send(&f2); // kicks the old transport's eventfd: notify the new one instead
    write_reg(&mut t, 0x50, 1);
    em.run_with_timeout(10).unwrap();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let n = recv_fd(host.as_raw_fd(), &mut buf).unwrap();
    assert_eq!(&buf[..n], &f2[..]);
    let mut mac = [0u8; 6];
    t.read(0x100, &mut mac);
    assert_eq!(mac, MAC);
}

#[test]
fn parses_macs() {
    assert_eq!(parse_mac("02:5c:00:00:00:07"), Some(MAC));
    assert_eq!(parse_mac("02:5c:00:00:00"), None);
    assert_eq!(parse_mac("02:5c:00:00:00:07:01"), None);
    assert_eq!(parse_mac("02:5c:00:00:00:zz"), None);
    assert_eq!(parse_mac("025c:00:00:00:07"), None);
}

#[test]
fn tap_names_are_checked() {
    assert!(matches!(Tap::open(""), Err(TapError::BadName(_))));
    assert!(matches!(
        Tap::open("a-name-longer-than-15"),
        Err(TapError::BadName(_))
    ));
}

/// The device on a real TAP (`Tap::open`: TUNSETIFF with IFF_VNET_HDR, TUNSETVNETHDRSZ,
/// TUNSETOFFLOAD at activation) in a private network namespace, the other side an
/// AF_PACKET socket on the interface: a guest frame comes out on the interface, a frame
/// sent on the interface lands in a guest buffer behind a 12-byte vnet header.
/// Needs root and /dev/net/tun: fails loudly without them.
#[test]
fn real_tap_carries_frames_both_ways() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "needs root (a network namespace and a TAP)");
    assert!(
        std::path::Path::new("/dev/net/tun").exists(),
        "needs /dev/net/tun"
    );
    // This test's own namespace (nextest runs each test in its own process; under plain
    // `cargo test` unshare affects only this thread).
    // SAFETY: unshare has no memory preconditions.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "unshare(CLONE_NEWNET): {}",
        io::Error::last_os_error()
    );
    let tap = Tap::open("sctest0").unwrap();
    let ifindex = link_up("sctest0");
    let mem = guest_memory();
    let dev = Arc::new(Mutex::new(Net::new(Box::new(tap), MAC).unwrap()));
    let (_, host, offload) = pair(); // unused stand-ins for the socketpair side
    let mut g = Guest::attach(&mem, dev, host, offload, all_features(), 8);
    let pkt = packet_socket(ifindex);

    // Guest -> host: an Ethernet frame with a custom ethertype behind a zero vnet header.
    let mut f = frame(VNET_HDR_LEN + 200, 9);
    f[VNET_HDR_LEN..VNET_HDR_LEN + 6].copy_from_slice(&[0xff; 6]);
    f[VNET_HDR_LEN + 6..VNET_HDR_LEN + 12].copy_from_slice(&MAC);
    f[VNET_HDR_LEN + 12..VNET_HDR_LEN + 14].copy_from_slice(&[0x88, 0xb5]);
    g.send(&f);
    g.pump();
    let mut buf = vec![0u8; 4096];
    let got = recv_matching(&pkt, &mut buf, |fr| {
        fr.get(12..14) == Some(&[0x88, 0xb5][..])
    });
    assert_eq!(
        got.as_deref(),
        Some(&f[VNET_HDR_LEN..]),
        "the guest's frame on the TAP"
    );
    assert_eq!(g.counters().tx_frames, 1);

    // Host -> guest: a frame sent on the interface reaches a guest buffer.
    let mut out = pattern(300, 10);
    out[..6].copy_from_slice(&MAC);
    out[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    out[12..14].copy_from_slice(&[0x88, 0xb6]);
    assert_eq!(send_fd(pkt.as_raw_fd(), &out).unwrap(), out.len());
    let mut delivered = None;
    for _ in 0..50 {
        g.pump();
        delivered = std::iter::from_fn(|| g.rx.next_used())
            .map(|(_, len)| len)
            .find(|&len| len as usize == VNET_HDR_LEN + out.len());
        if delivered.is_some() {
            break;
        }
    }
    assert!(
        delivered.is_some(),
        "the host's frame never reached the guest"
    );
    // Which buffer it landed in depends on what else the kernel sent first (IPv6 router
    // solicitations...): find it among the posted ones.
    let found = (0..8).any(|i| {
        let at = RX_BASE + i * 4096;
        let hdr = read_mem(&mem, at, VNET_HDR_LEN);
        read_mem(&mem, at + VNET_HDR_LEN as u64, out.len()) == out
            && hdr[..10] == [0; 10]
            && hdr[10..12] == 1u16.to_le_bytes()
    });
    assert!(
        found,
        "no guest buffer holds the host's frame behind a plain vnet header"
    );
}

/// Brings `name` up; returns its ifindex.
fn link_up(name: &str) -> i32 {
    // SAFETY: plain socket(2); checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    assert!(raw >= 0, "socket: {}", io::Error::last_os_error());
    // SAFETY: a descriptor we just created.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS / SIOCSIFFLAGS / SIOCGIFINDEX on the ifreq we own.
    unsafe {
        assert!(libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) >= 0);
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        assert!(libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) >= 0);
        assert!(libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFINDEX, &mut ifr) >= 0);
        ifr.ifr_ifru.ifru_ifindex
    }
}

/// A raw AF_PACKET socket bound to `ifindex`, every ethertype.
fn packet_socket(ifindex: i32) -> OwnedFd {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); checked.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    assert!(raw >= 0, "AF_PACKET socket: {}", io::Error::last_os_error());
    // SAFETY: a descriptor we just created.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex;
    // SAFETY: bind reads a sockaddr_ll of the size given.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(rc, 0, "bind AF_PACKET: {}", io::Error::last_os_error());
    sock
}

/// Reads frames from `sock` (bounded waits) until one matches.
fn recv_matching(sock: &OwnedFd, buf: &mut [u8], want: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    for _ in 0..50 {
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own; the timeout only bounds a broken device.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        let n = recv_fd(sock.as_raw_fd(), buf).ok()?;
        if want(&buf[..n]) {
            return Some(buf[..n].to_vec());
        }
    }
    None
}

/// A TAP attached in blocking mode with `flags`, as another process would before passing
/// it to a waiting VMM.
fn attach_elsewhere(name: &str, flags: libc::c_int) -> OwnedFd {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .expect("opening /dev/net/tun");
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = flags as libc::c_short;
    // SAFETY: TUNSETIFF reads the ifreq we own.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), super::tap::TUNSETIFF, &mut ifr) };
    assert_eq!(rc, 0, "TUNSETIFF: {}", io::Error::last_os_error());
    file.into()
}

/// A TAP passed in by descriptor (a `--wait-restore` VMM's): its name comes from the
/// kernel, it is made non-blocking, and one attached without the vnet header, or a file
/// that is no TAP, is refused with what is wrong. Needs root and /dev/net/tun.
#[test]
fn a_passed_tap_is_checked_and_taken_over() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root (a TAP)");
    // SAFETY: unshare has no memory preconditions (nextest: this process only).
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare: {}", io::Error::last_os_error());
    let full = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
    let mut tap = Tap::from_fd(attach_elsewhere("scpass0", full)).expect("a good TAP");
    assert_eq!(tap.name(), "scpass0");
    // SAFETY: F_GETFL on the TAP's open descriptor.
    let fl = unsafe { libc::fcntl(tap.as_raw_fd(), libc::F_GETFL) };
    assert_ne!(fl & libc::O_NONBLOCK, 0, "made non-blocking");
    let mut buf = [0u8; 64];
    let err = tap.recv(&mut buf).expect_err("nothing to read");
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);

    let err = Tap::from_fd(attach_elsewhere("scpass1", libc::IFF_TAP | libc::IFF_NO_PI))
        .expect_err("no vnet header");
    assert!(
        matches!(&err, TapError::Mode { name, .. } if name == "scpass1"),
        "{err}"
    );
    let file = tempfile::tempfile().expect("tempfile");
    let err = Tap::from_fd(file.into()).expect_err("not a TAP");
    assert!(matches!(err, TapError::NotATap(_)), "{err}");
}
