//! The host side of the hybrid vsock: maps guest vsock streams onto Unix sockets.
//!
//! - Host-initiated: a client connects to the listener at `uds_path` and writes
//!   `CONNECT <port>\n`; we send the guest a REQUEST for `port` from a fresh host port
//!   and, once the guest answers RESPONSE, write `OK <host port>\n` to the client; from
//!   then on the socket carries the stream. A guest RST (or no answer within
//!   CONNECT_TIMEOUT) closes the client's socket.
//! - Guest-initiated: a REQUEST to host port P connects to `<uds_path>_P`; RESPONSE on
//!   success, RST if nothing listens there.
//!
//! The muxer owns a private epoll set (listener, client sockets, a timer) whose fd the
//! device registers with the VMM's event loop, so connections come and go without
//! touching the event manager. Connection sockets are edge-triggered: an edge marks
//! the connection readable/writable and the data moves when the guest has buffers and
//! credit, which never busy-loops on a full RX ring. Packets for the guest are handed
//! out round-robin across connections so one busy stream cannot starve the others.
//! Everything is bounded: connections, clients still handshaking, queued RSTs.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use super::connection::{Connection, RxPacket, Verdict};
use super::packet::*;
use super::uds;

/// Open connections at most (each may buffer CONN_BUF_ALLOC bytes toward its socket).
pub const MAX_CONNECTIONS: usize = 256;
/// Host clients that connected but have not finished their `CONNECT` line.
pub const MAX_PENDING_CLIENTS: usize = 64;
/// Control packets (RSTs) waiting for guest RX buffers; past this, TX processing
/// pauses so a guest cannot make us queue answers without bound.
pub const MAX_CTRL_BACKLOG: usize = 256;
const MAX_CONNECT_LINE: usize = 32;
const CONNECT_LINE_TIMEOUT: Duration = Duration::from_secs(5);
const TIMER_TICK: Duration = Duration::from_millis(250);
/// First host port handed to host-initiated connections.
const FIRST_LOCAL_PORT: u32 = 1 << 30;

const TOKEN_LISTENER: u64 = u64::MAX;
const TOKEN_TIMER: u64 = u64::MAX - 1;

#[derive(Debug, thiserror::Error)]
pub enum MuxerError {
    #[error("binding the vsock listener at {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("setting up the vsock muxer ({what}): {source}")]
    Setup {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// A connection is named by its two ports (the CIDs are fixed: host 2, our guest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnKey {
    pub local_port: u32,
    pub peer_port: u32,
}

struct PendingClient {
    stream: UnixStream,
    line: Vec<u8>,
    deadline: Instant,
}

pub struct Muxer {
    guest_cid: u64,
    uds_path: PathBuf,
    epoll: Epoll,
    listener: UnixListener,
    timer: TimerFd,
    timer_armed: bool,
    conns: HashMap<ConnKey, Connection>,
    by_fd: HashMap<RawFd, ConnKey>,
    clients: HashMap<RawFd, PendingClient>,
    /// Connections with something for the guest, served round-robin.
    rxq: VecDeque<ConnKey>,
    /// RSTs for connections that no longer exist (or never did).
    ctrl: VecDeque<Header>,
    next_local_port: u32,
}

fn setup_err(what: &'static str) -> impl FnOnce(io::Error) -> MuxerError {
    move |source| MuxerError::Setup { what, source }
}

impl Muxer {
    pub fn new(guest_cid: u64, uds_path: &Path) -> Result<Muxer, MuxerError> {
        let listener = uds::bind_listener(uds_path).map_err(|source| MuxerError::Bind {
            path: uds_path.to_owned(),
            source,
        })?;
        let epoll = Epoll::new().map_err(setup_err("epoll_create"))?;
        let timer = TimerFd::new()
            .map_err(|e| io::Error::from_raw_os_error(e.errno()))
            .map_err(setup_err("timerfd_create"))?;
        epoll
            .ctl(
                ControlOperation::Add,
                listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TOKEN_LISTENER),
            )
            .map_err(setup_err("epoll_ctl(listener)"))?;
        epoll
            .ctl(
                ControlOperation::Add,
                timer.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TOKEN_TIMER),
            )
            .map_err(setup_err("epoll_ctl(timerfd)"))?;
        Ok(Muxer {
            guest_cid,
            uds_path: uds_path.to_owned(),
            epoll,
            listener,
            timer,
            timer_armed: false,
            conns: HashMap::new(),
            by_fd: HashMap::new(),
            clients: HashMap::new(),
            rxq: VecDeque::new(),
            ctrl: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
        })
    }

    /// The muxer's epoll fd: readable whenever a host socket or the timer needs us.
    pub fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Something is waiting for a guest RX buffer.
    pub fn has_rx(&self) -> bool {
        !self.ctrl.is_empty() || !self.rxq.is_empty()
    }

    /// Too many answers queued: stop taking guest TX packets until RX drains.
    pub fn backlog_full(&self) -> bool {
        self.ctrl.len() >= MAX_CTRL_BACKLOG
    }

    /// Handle whatever the host sockets and the timer reported.
    pub fn process_host_events(&mut self, now: Instant) {
        let mut events = [EpollEvent::default(); 64];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("vsock: epoll_wait on the muxer failed: {e}");
                    return;
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_LISTENER => self.accept_clients(now),
                    TOKEN_TIMER => {
                        // The timer is readable, so this read does not block.
                        let _ = self.timer.wait();
                        self.expire(now);
                    }
                    fd => self.socket_event(fd as RawFd, ev.event_set()),
                }
            }
            if n < events.len() {
                return;
            }
        }
    }

    fn accept_clients(&mut self, now: Instant) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return, // WouldBlock, or a client that vanished meanwhile
            };
            // Over the limits, the client is closed right away (it sees EOF).
            if self.clients.len() >= MAX_PENDING_CLIENTS || self.conns.len() >= MAX_CONNECTIONS {
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let fd = stream.as_raw_fd();
            let ev = EpollEvent::new(EventSet::IN | EventSet::READ_HANG_UP, fd as u64);
            if self.epoll.ctl(ControlOperation::Add, fd, ev).is_err() {
                continue;
            }
            self.clients.insert(
                fd,
                PendingClient {
                    stream,
                    line: Vec::new(),
                    deadline: now + CONNECT_LINE_TIMEOUT,
                },
            );
            self.update_timer();
        }
    }

    fn socket_event(&mut self, fd: RawFd, set: EventSet) {
        if self.clients.contains_key(&fd) {
            self.read_connect_line(fd);
            return;
        }
        let Some(&key) = self.by_fd.get(&fd) else {
            return;
        };
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        let readable = set.intersects(EventSet::IN | EventSet::READ_HANG_UP | EventSet::ERROR);
        let hangup = set.contains(EventSet::HANG_UP);
        let writable = set.contains(EventSet::OUT);
        let verdict = conn.on_host_event(readable, hangup, writable);
        self.apply(key, verdict);
    }

    /// Read a client's `CONNECT <port>\n` byte by byte (it is short, and reading past
    /// the newline would swallow stream data).
    fn read_connect_line(&mut self, fd: RawFd) {
        let Some(client) = self.clients.get_mut(&fd) else {
            return;
        };
        let mut byte = [0u8; 1];
        let port = loop {
            match client.stream.read(&mut byte) {
                Ok(0) => break None,
                Ok(_) if byte[0] == b'\n' => break parse_connect(&client.line),
                Ok(_) if client.line.len() < MAX_CONNECT_LINE => client.line.push(byte[0]),
                Ok(_) => break None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => break None,
            }
        };
        let Some(client) = self.clients.remove(&fd) else {
            return;
        };
        let Some((port, local_port)) =
            port.and_then(|p| self.alloc_local_port(p).map(|local| (p, local)))
        else {
            let _ = self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
            return; // dropping the stream closes the client
        };
        let conn_events =
            EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED;
        if self
            .epoll
            .ctl(
                ControlOperation::Modify,
                fd,
                EpollEvent::new(conn_events, fd as u64),
            )
            .is_err()
        {
            let _ = self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
            return;
        }
        let key = ConnKey {
            local_port,
            peer_port: port,
        };
        let conn = Connection::host_initiated(client.stream, self.guest_cid, local_port, port);
        self.by_fd.insert(fd, key);
        self.conns.insert(key, conn);
        self.schedule(key);
    }

    fn alloc_local_port(&mut self, peer_port: u32) -> Option<u32> {
        if self.conns.len() >= MAX_CONNECTIONS {
            return None;
        }
        for _ in 0..=MAX_CONNECTIONS {
            let port = self.next_local_port;
            self.next_local_port = if port == u32::MAX {
                FIRST_LOCAL_PORT
            } else {
                port + 1
            };
            let key = ConnKey {
                local_port: port,
                peer_port,
            };
            if !self.conns.contains_key(&key) {
                return Some(port);
            }
        }
        None
    }

    /// A packet the guest sent on the TX queue (`data` = its payload).
    pub fn handle_guest_packet(&mut self, hdr: &Header, data: &[u8]) {
        // Not addressed from our guest to the host: not ours to answer.
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID {
            return;
        }
        if hdr.type_ != TYPE_STREAM {
            if hdr.op != OP_RST {
                self.push_ctrl(hdr.rst_reply());
            }
            return;
        }
        let key = ConnKey {
            local_port: hdr.dst_port,
            peer_port: hdr.src_port,
        };
        if let Some(conn) = self.conns.get_mut(&key) {
            let verdict = conn.on_guest_packet(hdr, data);
            self.apply(key, verdict);
            return;
        }
        match hdr.op {
            OP_REQUEST => self.guest_connect(hdr, key),
            OP_RST => {}
            _ => self.push_ctrl(hdr.rst_reply()),
        }
    }

    fn guest_connect(&mut self, req: &Header, key: ConnKey) {
        if self.conns.len() >= MAX_CONNECTIONS {
            self.push_ctrl(req.rst_reply());
            return;
        }
        let path = uds::port_path(&self.uds_path, req.dst_port);
        let Ok(stream) = uds::connect_nonblocking(&path) else {
            self.push_ctrl(req.rst_reply());
            return;
        };
        let fd = stream.as_raw_fd();
        let ev = EpollEvent::new(
            EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED,
            fd as u64,
        );
        if self.epoll.ctl(ControlOperation::Add, fd, ev).is_err() {
            self.push_ctrl(req.rst_reply());
            return;
        }
        self.by_fd.insert(fd, key);
        self.conns.insert(
            key,
            Connection::guest_initiated(stream, self.guest_cid, req),
        );
        self.schedule(key);
    }

    fn push_ctrl(&mut self, hdr: Header) {
        // The backlog bound is enforced by pausing TX (`backlog_full`); connection
        // teardown adds at most one RST per connection on top.
        self.ctrl.push_back(hdr);
    }

    fn apply(&mut self, key: ConnKey, verdict: Verdict) {
        match verdict {
            Verdict::Keep => self.schedule(key),
            Verdict::Close { rst } => self.close(key, rst),
        }
    }

    fn close(&mut self, key: ConnKey, rst: bool) {
        let Some(conn) = self.conns.remove(&key) else {
            return;
        };
        let fd = conn.fd();
        self.by_fd.remove(&fd);
        // Removing before the drop closes the fd keeps the epoll set exact.
        let _ = self
            .epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        if rst {
            self.push_ctrl(Header::to_guest(
                self.guest_cid,
                key.local_port,
                key.peer_port,
                OP_RST,
            ));
        }
    }

    fn schedule(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.get_mut(&key)
            && !conn.queued
            && conn.has_rx_work()
        {
            conn.queued = true;
            self.rxq.push_back(key);
        }
    }

    /// The next packet for the guest; RW payload goes to the start of `buf`.
    pub fn next_rx(&mut self, buf: &mut [u8], now: Instant) -> Option<(Header, usize)> {
        loop {
            if let Some(h) = self.ctrl.pop_front() {
                return Some((h, 0));
            }
            let key = self.rxq.pop_front()?;
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            conn.queued = false;
            match conn.next_packet(buf, now) {
                RxPacket::Packet(h, n) => {
                    self.schedule(key);
                    if h.op == OP_REQUEST || h.op == OP_SHUTDOWN {
                        self.update_timer(); // the packet started a deadline
                    }
                    return Some((h, n));
                }
                RxPacket::Nothing => {}
                RxPacket::Close => self.close(key, true),
            }
        }
    }

    /// Close connections and clients whose deadline passed.
    fn expire(&mut self, now: Instant) {
        let expired: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        for key in expired {
            self.close(key, true);
        }
        let stale: Vec<RawFd> = self
            .clients
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(fd, _)| *fd)
            .collect();
        for fd in stale {
            let _ = self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
            self.clients.remove(&fd);
        }
        self.update_timer();
    }

    /// Tick while anything has a deadline; stay quiet otherwise.
    fn update_timer(&mut self) {
        let needed = !self.clients.is_empty() || self.conns.values().any(|c| c.deadline.is_some());
        if needed == self.timer_armed {
            return;
        }
        let result = if needed {
            self.timer.reset(TIMER_TICK, Some(TIMER_TICK))
        } else {
            self.timer.clear()
        };
        match result {
            Ok(()) => self.timer_armed = needed,
            Err(e) => tracing::error!("vsock: arming the muxer timer failed: {e}"),
        }
    }

    /// The host port the next host-initiated connection gets (saved in snapshots).
    pub fn next_local_port(&self) -> u32 {
        self.next_local_port
    }

    /// Continues host port numbering where a saved VM left it. A restored guest may still
    /// hold a connected socket for a port it used before the snapshot: a transport reset
    /// only marks such sockets closed, they stay in the guest's connection table until
    /// their owner closes them, and a REQUEST from a port that matches one is answered
    /// with RST. Ports below `FIRST_LOCAL_PORT` are not ours to hand out.
    pub fn set_next_local_port(&mut self, port: u32) {
        self.next_local_port = port.max(FIRST_LOCAL_PORT);
    }

    /// Drop every connection without telling the guest (a device or transport reset
    /// already tells it). Host clients still handshaking stay.
    pub fn reset(&mut self) {
        let keys: Vec<ConnKey> = self.conns.keys().copied().collect();
        for key in keys {
            self.close(key, false);
        }
        self.rxq.clear();
        self.ctrl.clear();
    }
}

impl Drop for Muxer {
    fn drop(&mut self) {
        // The socket file is ours; leaving it would only confuse the next bind.
        let _ = std::fs::remove_file(&self.uds_path);
    }
}

/// Parse `CONNECT <port>` (an optional trailing `\r` is tolerated).
fn parse_connect(line: &[u8]) -> Option<u32> {
    let line = std::str::from_utf8(line).ok()?;
    let line = line.strip_suffix('\r').unwrap_or(line);
    let port = line.strip_prefix("CONNECT ")?;
    port.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_connect;

    #[test]
    fn connect_line_parsing() {
        assert_eq!(parse_connect(b"CONNECT 52"), Some(52));
        assert_eq!(parse_connect(b"CONNECT 49983\r"), Some(49983));
        assert_eq!(parse_connect(b"CONNECT"), None);
        assert_eq!(parse_connect(b"CONNECT -1"), None);
        assert_eq!(parse_connect(b"CONNECT 99999999999"), None);
        assert_eq!(parse_connect(b"connect 52"), None);
        assert_eq!(parse_connect(&[0xff, 0xfe]), None);
    }
}
