//! virtio-vsock end to end without KVM: the device runs in a real EventManager, host
//! clients are real Unix sockets, and the guest's vsock driver is simulated through the
//! virtqueues (driver-side split queues over real guest memory, test_utils).
//!
//! No timing assertions: "wait" means pumping the event loop until a condition holds,
//! with a generous iteration bound that only matters when the code is broken.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::packet::*;
use super::{CONN_BUF_ALLOC, Vsock};
use crate::devices::virtio::device::lock;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::test_utils::*;
use crate::memory::GuestMemory;

const GUEST_CID: u64 = 3;
const RX_BASE: u64 = 0x10_0000;
const RX_BUF_LEN: u32 = 4096 + HEADER_LEN as u32;
const RX_BUFS: u16 = 64;
const TX_BASE: u64 = 0x80_0000;
const TX_SLOTS: u64 = 8;
const EV_BASE: u64 = 0x1f0_0000;
/// Pump iterations before a wait gives up (each runs the loop for up to 10 ms).
const MAX_PUMPS: usize = 2000;

type Em = EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>>;

struct Guest<'a> {
    mem: &'a GuestMemory,
    dev: Arc<Mutex<Vsock>>,
    t: MmioTransport,
    em: Em,
    rx: DriverQueue<'a>,
    tx: DriverQueue<'a>,
    ev: DriverQueue<'a>,
    /// RX head index -> buffer address, for buffers the device holds.
    rx_posted: HashMap<u16, u64>,
    next_rx_addr: u64,
    tx_slot: u64,
    _dir: tempfile::TempDir,
    uds: PathBuf,
}

impl<'a> Guest<'a> {
    fn new(mem: &'a GuestMemory) -> Self {
        Self::with_rx_buffers(mem, RX_BUFS)
    }

    fn with_rx_buffers(mem: &'a GuestMemory, rx_bufs: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let uds = dir.path().join("v.sock");
        let dev = Arc::new(Mutex::new(Vsock::new(GUEST_CID, uds.clone()).unwrap()));
        let mut em = Em::new().unwrap();
        em.add_subscriber(dev.clone());
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut t = MmioTransport::new(mem.clone(), dev.clone(), irq).unwrap();
        let rx = DriverQueue::new(mem, 0, 256);
        let tx = DriverQueue::new(mem, 1, 256);
        let ev = DriverQueue::new(mem, 2, 256);
        bring_up(&mut t, &[&rx, &tx, &ev]);
        let mut g = Guest {
            mem,
            dev,
            t,
            em,
            rx,
            tx,
            ev,
            rx_posted: HashMap::new(),
            next_rx_addr: RX_BASE,
            tx_slot: 0,
            _dir: dir,
            uds,
        };
        for _ in 0..rx_bufs {
            g.post_rx();
        }
        g.kick(0);
        g.pump();
        g
    }

    /// Notify `queue` if the device asked for it (EVENT_IDX is negotiated).
    fn kick(&mut self, queue: u32) {
        let needed = match queue {
            0 => self.rx.needs_kick(),
            1 => self.tx.needs_kick(),
            _ => self.ev.needs_kick(),
        };
        if needed {
            write_reg(&mut self.t, 0x50, queue);
        }
    }

    /// One RX buffer (header + 4 KiB, one descriptor, like Linux's).
    fn post_rx(&mut self) {
        let addr = self.next_rx_addr;
        self.next_rx_addr += 0x2000;
        if self.next_rx_addr >= RX_BASE + 2 * u64::from(RX_BUFS) * 0x2000 {
            self.next_rx_addr = RX_BASE;
        }
        let head = self.rx.add_chain(&[wr(addr, RX_BUF_LEN)]);
        self.rx_posted.insert(head, addr);
    }

    fn pump(&mut self) {
        self.em.run_with_timeout(10).unwrap();
    }

    /// Send a packet on TX (header and payload in separate descriptors, as Linux does).
    fn send(&mut self, mut hdr: Header, data: &[u8]) {
        hdr.len = data.len() as u32;
        let base = TX_BASE + (self.tx_slot % TX_SLOTS) * 0x1_1000;
        self.tx_slot += 1;
        write_mem(self.mem, base, &hdr.encode());
        let mut bufs = vec![rd(base, HEADER_LEN as u32)];
        if !data.is_empty() {
            write_mem(self.mem, base + 0x100, data);
            bufs.push(rd(base + 0x100, data.len() as u32));
        }
        self.tx.add_chain(&bufs);
        self.kick(1);
        self.pump();
    }

    /// The next RX packet, if one is already in the used ring; its buffer is reposted.
    fn try_recv(&mut self) -> Option<(Header, Vec<u8>)> {
        let (id, len) = self.rx.next_used()?;
        let Some(addr) = self.rx_posted.remove(&(id as u16)) else {
            panic!("used id {id} len {len} not posted; posted {:?}", {
                let mut k: Vec<_> = self.rx_posted.keys().collect();
                k.sort();
                k
            });
        };
        assert!(len as usize >= HEADER_LEN, "RX used length {len}");
        let raw = read_mem(self.mem, addr, HEADER_LEN);
        let hdr = Header::decode(raw.as_slice().try_into().unwrap());
        assert_eq!(hdr.len as usize + HEADER_LEN, len as usize);
        let data = read_mem(self.mem, addr + HEADER_LEN as u64, hdr.len as usize);
        self.post_rx();
        self.kick(0);
        Some((hdr, data))
    }

    /// Pump until an RX packet arrives.
    fn recv(&mut self) -> (Header, Vec<u8>) {
        for _ in 0..MAX_PUMPS {
            if let Some(p) = self.try_recv() {
                return p;
            }
            self.pump();
        }
        panic!("no RX packet from the device");
    }

    fn assert_quiet(&mut self) {
        for _ in 0..5 {
            self.pump();
        }
        assert_eq!(self.try_recv(), None);
    }

    fn hdr(&self, src_port: u32, dst_port: u32, op: u16) -> Header {
        Header {
            src_cid: GUEST_CID,
            dst_cid: HOST_CID,
            src_port,
            dst_port,
            type_: TYPE_STREAM,
            op,
            buf_alloc: 1 << 20,
            ..Header::default()
        }
    }

    fn connect_host(&mut self) -> UnixStream {
        let s = UnixStream::connect(&self.uds).unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    /// Pump until `s` yields `n` bytes (or EOF, then fewer).
    fn host_read(&mut self, s: &mut UnixStream, n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        for _ in 0..MAX_PUMPS {
            if out.len() >= n {
                break;
            }
            match s.read(&mut buf[..(n - out.len()).min(65536)]) {
                Ok(0) => break,
                Ok(k) => out.extend_from_slice(&buf[..k]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.pump(),
                Err(e) => panic!("host read: {e}"),
            }
        }
        out
    }

    /// Pump until the host side sees EOF or a reset on `s`.
    fn host_expect_closed(&mut self, s: &mut UnixStream) {
        let mut buf = [0u8; 256];
        for _ in 0..MAX_PUMPS {
            match s.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.pump(),
                Err(_) => return,
            }
        }
        panic!("host socket still open");
    }

    /// Host-initiated handshake to guest port `port`; returns (stream, host port).
    fn host_connect(&mut self, port: u32) -> (UnixStream, u32) {
        let mut s = self.connect_host();
        s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
        let (req, data) = self.recv();
        assert_eq!(req.op, OP_REQUEST);
        assert!(data.is_empty());
        let mut resp = self.hdr(port, req.src_port, OP_RESPONSE);
        resp.buf_alloc = 1 << 20;
        self.send(resp, &[]);
        let line = self.host_read_line(&mut s);
        assert_eq!(line, format!("OK {}\n", req.src_port));
        (s, req.src_port)
    }

    fn host_read_line(&mut self, s: &mut UnixStream) -> String {
        let mut line = Vec::new();
        for _ in 0..MAX_PUMPS {
            let mut b = [0u8; 1];
            match s.read(&mut b) {
                Ok(0) => break,
                Ok(_) => {
                    line.push(b[0]);
                    if b[0] == b'\n' {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.pump(),
                Err(e) => panic!("host read: {e}"),
            }
        }
        String::from_utf8(line).unwrap()
    }

    fn connections(&self) -> usize {
        lock(&self.dev).connection_count()
    }
}

fn listen_port(uds: &Path, port: u32) -> UnixListener {
    let mut p = uds.as_os_str().to_owned();
    p.push(format!("_{port}"));
    UnixListener::bind(PathBuf::from(p)).unwrap()
}

#[test]
fn config_space_holds_guest_cid() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    assert_eq!(read_reg(&mut g.t, 0x100), GUEST_CID as u32);
    assert_eq!(read_reg(&mut g.t, 0x104), 0);
    assert_eq!(read_reg(&mut g.t, 0x08), 19);
}

#[test]
fn reserved_cids_refused() {
    let dir = tempfile::tempdir().unwrap();
    for cid in [0, 1, 2, 1 << 40] {
        assert!(Vsock::new(cid, dir.path().join("s")).is_err(), "cid {cid}");
    }
}

#[test]
fn host_connect_handshake_and_data_both_ways() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let mut s = g.connect_host();
    s.write_all(b"CONNECT 1234\n").unwrap();
    let (req, _) = g.recv();
    assert_eq!(req.op, OP_REQUEST);
    assert_eq!((req.src_cid, req.dst_cid), (HOST_CID, GUEST_CID));
    assert_eq!(req.dst_port, 1234);
    assert_eq!(req.type_, TYPE_STREAM);
    assert_eq!(req.buf_alloc, CONN_BUF_ALLOC);
    let host_port = req.src_port;

    // Nothing reaches the client before the guest accepts.
    let mut b = [0u8; 8];
    assert_eq!(s.read(&mut b).unwrap_err().kind(), ErrorKind::WouldBlock);

    g.send(g.hdr(1234, host_port, OP_RESPONSE), &[]);
    assert_eq!(g.host_read_line(&mut s), format!("OK {host_port}\n"));
    assert_eq!(g.connections(), 1);

    s.write_all(b"hello guest").unwrap();
    let (rw, data) = g.recv();
    assert_eq!((rw.op, rw.src_port, rw.dst_port), (OP_RW, host_port, 1234));
    assert_eq!(data, b"hello guest");

    g.send(g.hdr(1234, host_port, OP_RW), b"hello host");
    assert_eq!(g.host_read(&mut s, 10), b"hello host");
}

#[test]
fn guest_rst_closes_host_client() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let mut s = g.connect_host();
    s.write_all(b"CONNECT 99\n").unwrap();
    let (req, _) = g.recv();
    g.send(g.hdr(99, req.src_port, OP_RST), &[]);
    g.host_expect_closed(&mut s);
    assert_eq!(g.connections(), 0);
}

#[test]
fn malformed_connect_line_closes_client() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let mut s = g.connect_host();
    s.write_all(b"HELLO 1\n").unwrap();
    g.host_expect_closed(&mut s);
    let mut s = g.connect_host();
    s.write_all(&[b'x'; 100]).unwrap();
    g.host_expect_closed(&mut s);
    g.assert_quiet();
}

#[test]
fn unanswered_request_times_out() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let mut s = g.connect_host();
    s.write_all(b"CONNECT 7\n").unwrap();
    let (req, _) = g.recv();
    // The guest never answers: after CONNECT_TIMEOUT the client is closed and the
    // guest told with an RST.
    g.host_expect_closed(&mut s);
    let (rst, _) = g.recv();
    assert_eq!(
        (rst.op, rst.src_port, rst.dst_port),
        (OP_RST, req.src_port, 7)
    );
}

#[test]
fn guest_initiated_connection_to_host_port_socket() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let listener = listen_port(&g.uds, 5000);
    g.send(g.hdr(777, 5000, OP_REQUEST), &[]);
    let (resp, _) = g.recv();
    assert_eq!(
        (resp.op, resp.src_port, resp.dst_port, resp.dst_cid),
        (OP_RESPONSE, 5000, 777, GUEST_CID)
    );
    let (mut host, _) = listener.accept().unwrap();
    host.set_nonblocking(true).unwrap();

    g.send(g.hdr(777, 5000, OP_RW), b"ping");
    assert_eq!(g.host_read(&mut host, 4), b"ping");
    host.write_all(b"pong").unwrap();
    let (rw, data) = g.recv();
    assert_eq!((rw.op, data.as_slice()), (OP_RW, &b"pong"[..]));
}

#[test]
fn guest_connect_to_missing_socket_gets_rst() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    g.send(g.hdr(778, 5001, OP_REQUEST), &[]);
    let (rst, _) = g.recv();
    assert_eq!((rst.op, rst.src_port, rst.dst_port), (OP_RST, 5001, 778));
    assert_eq!(g.connections(), 0);
}

#[test]
fn packets_for_unknown_connections_get_rst() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    g.send(g.hdr(10, 20, OP_RW), b"stray");
    assert_eq!(g.recv().0.op, OP_RST);
    // An RST for an unknown connection is not answered.
    g.send(g.hdr(10, 20, OP_RST), &[]);
    g.assert_quiet();
}

#[test]
fn credit_limits_data_in_flight_to_guest() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let (mut s, host_port) = g.host_connect(4000);
    // The guest shrinks its buffer to 10000 bytes and stops consuming.
    let mut credit = g.hdr(4000, host_port, OP_CREDIT_UPDATE);
    credit.buf_alloc = 10_000;
    g.send(credit, &[]);
    s.write_all(&pattern(100_000, 5)).unwrap();

    let mut got = 0usize;
    loop {
        let (h, data) = g.recv();
        match h.op {
            OP_RW => got += data.len(),
            OP_CREDIT_REQUEST => break,
            op => panic!("unexpected op {op}"),
        }
        assert!(
            got <= 10_000,
            "{got} bytes in flight beyond the guest's credit"
        );
    }
    assert_eq!(got, 10_000);
    g.assert_quiet();

    // The guest consumed everything: the next 10000 bytes flow.
    credit.fwd_cnt = 10_000;
    g.send(credit, &[]);
    let mut more = 0usize;
    while more < 10_000 {
        let (h, data) = g.recv();
        assert_eq!(h.op, OP_RW);
        more += data.len();
    }
    assert_eq!(more, 10_000);
}

#[test]
fn credit_request_answered_with_credit_update() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let (_s, host_port) = g.host_connect(4001);
    g.send(g.hdr(4001, host_port, OP_CREDIT_REQUEST), &[]);
    let (h, _) = g.recv();
    assert_eq!(h.op, OP_CREDIT_UPDATE);
    assert_eq!((h.buf_alloc, h.fwd_cnt), (CONN_BUF_ALLOC, 0));
}

#[test]
fn large_transfers_arrive_intact_both_ways() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let (mut s, host_port) = g.host_connect(4100);
    const N: usize = 3 << 20;

    // Host -> guest; the guest acknowledges what it consumed every 64 KiB.
    let sent = pattern(N, 11);
    let mut received = Vec::with_capacity(N);
    let mut written = 0usize;
    let mut acked = 0usize;
    while received.len() < N {
        if written < N {
            match s.write(&sent[written..(written + 65536).min(N)]) {
                Ok(k) => written += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        g.pump();
        while let Some((h, data)) = g.try_recv() {
            assert_eq!(h.op, OP_RW, "op {}", h.op);
            received.extend_from_slice(&data);
        }
        if received.len() - acked >= 65536 || received.len() == N {
            acked = received.len();
            let mut c = g.hdr(4100, host_port, OP_CREDIT_UPDATE);
            c.fwd_cnt = acked as u32;
            g.send(c, &[]);
        }
    }
    assert!(received == sent, "host -> guest stream corrupted");

    // Guest -> host, 4 KiB packets, respecting the credit the device advertises.
    let up = pattern(N, 12);
    let mut host_got = Vec::with_capacity(N);
    let (mut peer_alloc, mut peer_fwd) = (CONN_BUF_ALLOC as usize, 0usize);
    let mut tx_cnt = 0usize;
    let mut buf = vec![0u8; 65536];
    while host_got.len() < N {
        while tx_cnt < N && tx_cnt + 4096 - peer_fwd <= peer_alloc {
            let end = (tx_cnt + 4096).min(N);
            g.send(g.hdr(4100, host_port, OP_RW), &up[tx_cnt..end]);
            tx_cnt = end;
        }
        match s.read(&mut buf) {
            Ok(0) => panic!("host socket closed"),
            Ok(k) => host_got.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        g.pump();
        while let Some((h, _)) = g.try_recv() {
            assert_ne!(h.op, OP_RST);
            peer_alloc = h.buf_alloc as usize;
            peer_fwd = h.fwd_cnt as usize;
        }
    }
    assert!(host_got == up, "guest -> host stream corrupted");
}

#[test]
fn guest_ignoring_credit_is_reset_not_buffered_forever() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let (_s, host_port) = g.host_connect(4200); // the host never reads
    let chunk = vec![7u8; 65536];
    let mut rst = false;
    // Far more than CONN_BUF_ALLOC plus what the socket buffer can hold.
    for _ in 0..256 {
        g.send(g.hdr(4200, host_port, OP_RW), &chunk);
        while let Some((h, _)) = g.try_recv() {
            rst |= h.op == OP_RST;
        }
        if rst {
            break;
        }
    }
    assert!(rst, "no RST after the guest overran its credit");
    assert_eq!(g.connections(), 0);
}

#[test]
fn shutdown_half_close_and_full_close() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let (mut s, host_port) = g.host_connect(4300);

    // Guest stops sending: the client sees EOF but can still send to the guest.
    g.send(g.hdr(4300, host_port, OP_RW), b"last words");
    let mut sh = g.hdr(4300, host_port, OP_SHUTDOWN);
    sh.flags = SHUTDOWN_SEND;
    g.send(sh, &[]);
    assert_eq!(g.host_read(&mut s, 100), b"last words");
    s.write_all(b"reply").unwrap();
    let (h, data) = g.recv();
    assert_eq!((h.op, data.as_slice()), (OP_RW, &b"reply"[..]));

    // Now both directions: the device resets the connection.
    sh.flags = SHUTDOWN_BOTH;
    g.send(sh, &[]);
    let (h, _) = g.recv();
    assert_eq!(h.op, OP_RST);
    assert_eq!(g.connections(), 0);
    g.host_expect_closed(&mut s);
}

#[test]
fn host_half_close_and_hang_up_reach_the_guest() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let (s, host_port) = g.host_connect(4400);
    s.shutdown(Shutdown::Write).unwrap();
    let (h, _) = g.recv();
    assert_eq!((h.op, h.flags), (OP_SHUTDOWN, SHUTDOWN_SEND));
    // The guest can still answer a half-closed client.
    let mut s = s;
    g.send(g.hdr(4400, host_port, OP_RW), b"answer");
    assert_eq!(g.host_read(&mut s, 6), b"answer");

    // A client that hangs up entirely: SHUTDOWN with both flags.
    let (s2, _) = g.host_connect(4401);
    drop(s2);
    let (h, _) = g.recv();
    assert_eq!((h.op, h.flags), (OP_SHUTDOWN, SHUTDOWN_BOTH));
}

#[test]
fn transport_reset_event_drops_connections() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let (mut s, _) = g.host_connect(4500);
    // No event buffer yet: the event waits for one.
    lock(&g.dev).send_transport_reset();
    assert_eq!(g.connections(), 0);
    g.host_expect_closed(&mut s);
    assert_eq!(g.ev.next_used(), None);
    g.ev.add_chain(&[wr(EV_BASE, 4)]);
    g.kick(2);
    g.pump();
    assert_eq!(g.ev.next_used().map(|u| u.1), Some(4));
    assert_eq!(
        read_mem(&mem, EV_BASE, 4),
        EVENT_TRANSPORT_RESET.to_le_bytes()
    );
    // Connections work again afterwards.
    g.host_connect(4501);
}

#[test]
fn a_restore_continues_host_port_numbering() {
    use crate::snapshot::Persist;
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let (_s, used) = g.host_connect(4500);
    let state = lock(&g.dev).save();
    assert_eq!(state.next_host_port, used + 1);
    // A restored guest may still hold a stale socket for `used` (a transport reset only
    // marks it closed): the restore must not hand that port out again.
    let restored = Vsock::restore(Some(g.uds.with_extension("restored")), &state).unwrap();
    assert_eq!(restored.save().next_host_port, used + 1);
}

#[test]
fn rx_is_shared_fairly_between_connections() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    let (mut a, pa) = g.host_connect(4600);
    let (mut b, pb) = g.host_connect(4601);
    a.write_all(&vec![1u8; 60_000]).unwrap();
    b.write_all(&vec![2u8; 60_000]).unwrap();
    g.pump();
    let mut order = Vec::new();
    for _ in 0..8 {
        let (h, _) = g.recv();
        order.push(h.src_port);
    }
    // Round robin: neither connection gets two packets in a row while both have data.
    for w in order.windows(2) {
        assert_ne!(w[0], w[1], "order {order:?} (a={pa}, b={pb})");
    }
}

#[test]
fn malformed_tx_and_rx_buffers_never_panic() {
    let mem = guest_memory();
    let mut g = Guest::new(&mem);
    // Header shorter than 44 bytes.
    g.tx.add_chain(&[rd(TX_BASE, 20)]);
    // Length larger than the chain.
    let mut h = g.hdr(1, 2, OP_RW);
    h.len = 5000;
    write_mem(&mem, TX_BASE + 0x1000, &h.encode());
    g.tx.add_chain(&[rd(TX_BASE + 0x1000, 44), rd(TX_BASE + 0x2000, 100)]);
    // Length beyond the packet limit.
    h.len = u32::MAX;
    write_mem(&mem, TX_BASE + 0x3000, &h.encode());
    g.tx.add_chain(&[rd(TX_BASE + 0x3000, 44)]);
    // Outside guest memory.
    g.tx.add_chain(&[rd(1 << 40, 44)]);
    // Wrong CIDs: dropped silently.
    let mut wrong = g.hdr(1, 2, OP_REQUEST);
    wrong.src_cid = 42;
    write_mem(&mem, TX_BASE + 0x4000, &wrong.encode());
    g.tx.add_chain(&[rd(TX_BASE + 0x4000, 44)]);
    g.kick(1);
    g.pump();
    assert_eq!(g.tx.next_used().map(|u| u.1), Some(0));
    g.assert_quiet();

    // A non-stream packet is answered with RST.
    let mut dgram = g.hdr(1, 2, OP_REQUEST);
    dgram.type_ = 2;
    g.send(dgram, &[]);
    assert_eq!(g.recv().0.op, OP_RST);
}

#[test]
fn rx_buffers_too_small_are_returned_empty() {
    let mem = guest_memory();
    let mut g = Guest::with_rx_buffers(&mem, 0);
    let tiny = g.rx.add_chain(&[wr(RX_BASE + 0x10_0000, 20)]);
    let readable = g.rx.add_chain(&[rd(RX_BASE + 0x10_1000, 100)]);
    g.post_rx();
    g.kick(0);
    g.send(g.hdr(1, 2, OP_RW), b"x");
    assert_eq!(g.rx.next_used(), Some((u32::from(tiny), 0)));
    assert_eq!(g.rx.next_used(), Some((u32::from(readable), 0)));
    assert_eq!(g.try_recv().unwrap().0.op, OP_RST);
}
