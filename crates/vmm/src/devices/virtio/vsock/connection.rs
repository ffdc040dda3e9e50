//! One vsock stream connection between a guest port and a host Unix socket: its state
//! machine and its credit-based flow control (virtio 1.2 §5.10.6.3).
//!
//! Credit, in both directions:
//! - Guest -> host: we advertise `buf_alloc` = [`CONN_BUF_ALLOC`] and `fwd_cnt` = bytes
//!   we have written to the Unix socket. The guest may have at most `buf_alloc` bytes
//!   "in flight" (sent but not yet forwarded); those wait in `tx_buf` while the socket
//!   is full. A guest that sends beyond its credit overflows `tx_buf` and gets RST:
//!   host memory per connection is bounded by `buf_alloc`.
//! - Host -> guest: we never send more RW payload than the guest's
//!   `peer_buf_alloc - (rx_cnt - peer_fwd_cnt)`. Out of credit, we stop reading the
//!   socket (its data waits in the kernel) and send one CREDIT_REQUEST.
//!
//! The connection never touches epoll or the virtqueues; the muxer drives it with
//! host-socket events and guest packets and pulls packets for the guest out of it.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::num::Wrapping;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::packet::*;

/// Receive buffer we advertise to the guest for each connection.
pub const CONN_BUF_ALLOC: u32 = 256 * 1024;
/// Tell the guest about freed buffer space once this much has been forwarded since we
/// last told it (any packet to the guest carries `fwd_cnt`).
const CREDIT_UPDATE_THRESHOLD: u32 = CONN_BUF_ALLOC / 4;
/// How long the guest has to answer our REQUEST.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the guest has to RST after we announced a full shutdown.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

const P_REQUEST: u8 = 1;
const P_RESPONSE: u8 = 2;
const P_SHUTDOWN: u8 = 4;
const P_CREDIT_REQUEST: u8 = 8;
const P_CREDIT_UPDATE: u8 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Host-initiated: REQUEST queued or sent, no RESPONSE yet.
    AwaitingResponse,
    Established,
}

/// What the muxer should do with the connection after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Drop the connection; send the guest an RST if `rst`.
    Close {
        rst: bool,
    },
}

/// The next packet for the guest, if any.
#[derive(Debug, PartialEq, Eq)]
pub enum RxPacket {
    /// A header, plus `n` payload bytes already placed at the start of the buffer.
    Packet(Header, usize),
    Nothing,
    /// The host socket failed: close the connection and RST the guest.
    Close,
}

#[derive(Debug)]
pub struct Connection {
    stream: UnixStream,
    guest_cid: u64,
    local_port: u32,
    peer_port: u32,
    state: State,
    /// Guest bytes written to the socket (our credit counter).
    fwd_cnt: Wrapping<u32>,
    last_fwd_cnt_sent: Wrapping<u32>,
    /// Guest bytes waiting for the socket to become writable; at most CONN_BUF_ALLOC.
    tx_buf: VecDeque<u8>,
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// Payload bytes sent to the guest.
    rx_cnt: Wrapping<u32>,
    pending: u8,
    shutdown_flags: u32,
    /// The socket may have data (or EOF) to read: set by epoll edges, cleared on EAGAIN.
    readable: bool,
    /// The host end hung up entirely (EPOLLHUP), not just shut its write side.
    hup: bool,
    /// We read EOF from the host.
    local_eof: bool,
    /// SHUTDOWN flags received from the guest.
    peer_shutdown: u32,
    write_shut: bool,
    credit_requested: bool,
    /// When the muxer should give up on the guest (REQUEST or SHUTDOWN unanswered).
    pub deadline: Option<Instant>,
    /// In the muxer's RX round-robin queue.
    pub queued: bool,
}

impl Connection {
    fn new(stream: UnixStream, guest_cid: u64, local_port: u32, peer_port: u32) -> Self {
        Connection {
            stream,
            guest_cid,
            local_port,
            peer_port,
            state: State::AwaitingResponse,
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            tx_buf: VecDeque::new(),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            rx_cnt: Wrapping(0),
            pending: 0,
            shutdown_flags: 0,
            readable: false,
            hup: false,
            local_eof: false,
            peer_shutdown: 0,
            write_shut: false,
            credit_requested: false,
            deadline: None,
            queued: false,
        }
    }

    /// A host client asked (`CONNECT <peer_port>`) for the guest's port.
    pub fn host_initiated(stream: UnixStream, guest_cid: u64, local: u32, peer: u32) -> Self {
        let mut c = Connection::new(stream, guest_cid, local, peer);
        c.pending = P_REQUEST;
        c
    }

    /// The guest connected (REQUEST `req`) and the host socket is connected.
    pub fn guest_initiated(stream: UnixStream, guest_cid: u64, req: &Header) -> Self {
        let mut c = Connection::new(stream, guest_cid, req.dst_port, req.src_port);
        c.state = State::Established;
        c.pending = P_RESPONSE;
        c.update_peer_credit(req);
        c.readable = true;
        c
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Guest credit left for our RW payload.
    fn peer_free(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    fn update_peer_credit(&mut self, hdr: &Header) {
        if hdr.buf_alloc != self.peer_buf_alloc || Wrapping(hdr.fwd_cnt) != self.peer_fwd_cnt {
            self.credit_requested = false;
        }
        self.peer_buf_alloc = hdr.buf_alloc;
        self.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
    }

    /// A packet from the guest for this connection (`data` is its RW payload).
    pub fn on_guest_packet(&mut self, hdr: &Header, data: &[u8]) -> Verdict {
        self.update_peer_credit(hdr);
        match hdr.op {
            OP_RST => Verdict::Close { rst: false },
            OP_RESPONSE if self.state == State::AwaitingResponse => {
                self.state = State::Established;
                self.deadline = None;
                self.readable = true;
                // A fresh socket has room for a short line; if it has not, the host
                // end is unusable anyway.
                let line = format!("OK {}\n", self.local_port);
                match self.stream.write(line.as_bytes()) {
                    Ok(n) if n == line.len() => Verdict::Keep,
                    _ => Verdict::Close { rst: true },
                }
            }
            OP_RW
                if self.state == State::Established && self.peer_shutdown & SHUTDOWN_SEND == 0 =>
            {
                self.send_to_host(data)
            }
            OP_CREDIT_UPDATE => Verdict::Keep,
            OP_CREDIT_REQUEST => {
                self.pending |= P_CREDIT_UPDATE;
                Verdict::Keep
            }
            OP_SHUTDOWN => {
                self.peer_shutdown |= hdr.flags & SHUTDOWN_BOTH;
                self.shutdown_progress()
            }
            // REQUEST on a live connection, RESPONSE when not expected, RW before the
            // handshake or after the guest said it would send no more, unknown ops.
            _ => Verdict::Close { rst: true },
        }
    }

    fn send_to_host(&mut self, data: &[u8]) -> Verdict {
        if self.tx_buf.len() + data.len() > CONN_BUF_ALLOC as usize {
            return Verdict::Close { rst: true }; // the guest ignored our credit
        }
        let mut written = 0;
        if self.tx_buf.is_empty() {
            while written < data.len() {
                match self.stream.write(&data[written..]) {
                    Ok(0) => return Verdict::Close { rst: true },
                    Ok(n) => written += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return Verdict::Close { rst: true },
                }
            }
        }
        self.tx_buf.extend(&data[written..]);
        self.forwarded(written);
        Verdict::Keep
    }

    fn forwarded(&mut self, n: usize) {
        self.fwd_cnt += Wrapping(n as u32);
        if (self.fwd_cnt - self.last_fwd_cnt_sent).0 >= CREDIT_UPDATE_THRESHOLD {
            self.pending |= P_CREDIT_UPDATE;
        }
    }

    /// Write what `tx_buf` holds; called when the socket signals writable.
    fn flush_tx(&mut self) -> Verdict {
        while !self.tx_buf.is_empty() {
            let (front, _) = self.tx_buf.as_slices();
            match self.stream.write(front) {
                Ok(0) => return Verdict::Close { rst: true },
                Ok(n) => {
                    self.tx_buf.drain(..n);
                    self.forwarded(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Verdict::Keep,
                Err(_) => return Verdict::Close { rst: true },
            }
        }
        self.shutdown_progress()
    }

    /// Act on the guest's SHUTDOWN flags once everything it sent has been forwarded:
    /// SEND -> half-close the socket; both -> done, RST.
    fn shutdown_progress(&mut self) -> Verdict {
        if !self.tx_buf.is_empty() {
            return Verdict::Keep;
        }
        if self.peer_shutdown == SHUTDOWN_BOTH {
            return Verdict::Close { rst: true };
        }
        if self.peer_shutdown & SHUTDOWN_SEND != 0 && !self.write_shut {
            self.write_shut = true;
            // ENOTCONN means the host already went away; the read side will see it.
            let _ = self.stream.shutdown(Shutdown::Write);
        }
        Verdict::Keep
    }

    /// Epoll reported `readable`/`hangup`/`writable` on the host socket.
    pub fn on_host_event(&mut self, readable: bool, hangup: bool, writable: bool) -> Verdict {
        if readable || hangup {
            self.readable = true;
        }
        if hangup {
            self.hup = true;
        }
        if writable {
            return self.flush_tx();
        }
        Verdict::Keep
    }

    /// Whether `next_packet` may produce something.
    pub fn has_rx_work(&self) -> bool {
        self.pending != 0 || (self.can_read() && (self.peer_free() > 0 || !self.credit_requested))
    }

    fn can_read(&self) -> bool {
        self.state == State::Established
            && self.readable
            && !self.local_eof
            && self.peer_shutdown & SHUTDOWN_RCV == 0
    }

    fn header(&mut self, op: u16) -> Header {
        let mut h = Header::to_guest(self.guest_cid, self.local_port, self.peer_port, op);
        h.buf_alloc = CONN_BUF_ALLOC;
        h.fwd_cnt = self.fwd_cnt.0;
        self.last_fwd_cnt_sent = self.fwd_cnt;
        // Every packet carries our credit, so none is owed any more.
        self.pending &= !P_CREDIT_UPDATE;
        h
    }

    /// Produce the next packet for the guest, RW payload (at most `buf.len()` bytes)
    /// read from the socket into `buf`. Control packets go first.
    pub fn next_packet(&mut self, buf: &mut [u8], now: Instant) -> RxPacket {
        if self.pending & P_REQUEST != 0 {
            self.pending &= !P_REQUEST;
            self.deadline = Some(now + CONNECT_TIMEOUT);
            return RxPacket::Packet(self.header(OP_REQUEST), 0);
        }
        if self.pending & P_RESPONSE != 0 {
            self.pending &= !P_RESPONSE;
            return RxPacket::Packet(self.header(OP_RESPONSE), 0);
        }
        if self.pending & P_SHUTDOWN != 0 {
            self.pending &= !P_SHUTDOWN;
            let mut h = self.header(OP_SHUTDOWN);
            h.flags = self.shutdown_flags;
            if self.shutdown_flags == SHUTDOWN_BOTH {
                self.deadline = Some(now + SHUTDOWN_TIMEOUT);
            }
            return RxPacket::Packet(h, 0);
        }
        if self.pending & P_CREDIT_REQUEST != 0 {
            self.pending &= !P_CREDIT_REQUEST;
            return RxPacket::Packet(self.header(OP_CREDIT_REQUEST), 0);
        }
        if self.can_read() {
            let credit = self.peer_free() as usize;
            if credit == 0 {
                if !self.credit_requested {
                    self.credit_requested = true;
                    return RxPacket::Packet(self.header(OP_CREDIT_REQUEST), 0);
                }
            } else {
                let n = credit.min(buf.len()).min(MAX_PKT_DATA);
                match self.stream.read(&mut buf[..n]) {
                    Ok(0) => {
                        // EOF. A half-close (host shut its write side) still lets the
                        // guest answer; a full hang-up ends both directions.
                        self.local_eof = true;
                        self.readable = false;
                        self.shutdown_flags = if self.hup {
                            SHUTDOWN_BOTH
                        } else {
                            SHUTDOWN_SEND
                        };
                        self.pending |= P_SHUTDOWN;
                        return self.next_packet(buf, now);
                    }
                    Ok(k) => {
                        self.rx_cnt += Wrapping(k as u32);
                        let mut h = self.header(OP_RW);
                        h.len = k as u32;
                        return RxPacket::Packet(h, k);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.readable = false,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return RxPacket::Close,
                }
            }
        }
        if self.pending & P_CREDIT_UPDATE != 0 {
            return RxPacket::Packet(self.header(OP_CREDIT_UPDATE), 0);
        }
        RxPacket::Nothing
    }
}
