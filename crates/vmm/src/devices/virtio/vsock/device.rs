//! The virtio-vsock device model (virtio 1.2 §5.10): RX, TX and event queues, with
//! the muxer behind them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT};

use super::muxer::{Muxer, MuxerError};
use super::packet::*;
use crate::devices::virtio::common::{DeviceEvent, VirtioCommon, virtio_common_accessors};
use crate::devices::virtio::device::{VIRTIO_F_VERSION_1, VirtioDevice};
use crate::devices::virtio::ring::{CHAINS_PER_PASS, pop_or_arm};
use crate::memory::GuestMemory;

pub const QUEUE_SIZE: u16 = 256;
const RXQ: usize = 0;
const TXQ: usize = 1;
const EVQ: usize = 2;
/// Event-manager token of the muxer's epoll fd (not a queue index, not the activate
/// token).
const MUXER_TOKEN: u32 = u32::MAX - 1;
/// How many fill-RX/resume-TX rounds one RX pass may take (see `process_rx`).
const RX_TX_ROUNDS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    #[error("guest CID {0} is reserved (must be at least 3)")]
    ReservedCid(u64),
    #[error(transparent)]
    Muxer(#[from] MuxerError),
    #[error("creating an eventfd for the vsock device: {0}")]
    EventFd(#[source] std::io::Error),
}

/// A virtio-vsock device in Firecracker's hybrid model (see `muxer.rs`).
pub struct Vsock {
    pub(super) guest_cid: u64,
    pub(super) uds_path: PathBuf,
    pub(super) muxer: Muxer,
    common: VirtioCommon,
    /// A TRANSPORT_RESET event waits for an event-queue buffer.
    pub(super) reset_pending: bool,
    rx_buf: Vec<u8>,
    tx_buf: Vec<u8>,
}

impl Vsock {
    /// A device for guest `guest_cid` whose host side listens at `uds_path`.
    pub fn new(guest_cid: u64, uds_path: PathBuf) -> Result<Vsock, VsockError> {
        if guest_cid < 3 || guest_cid > u64::from(u32::MAX) {
            return Err(VsockError::ReservedCid(guest_cid));
        }
        let muxer = Muxer::new(guest_cid, &uds_path)?;
        let features = VIRTIO_F_VERSION_1 | (1 << VIRTIO_RING_F_EVENT_IDX);
        // `struct virtio_vsock_config { le64 guest_cid; }`
        let config = guest_cid.to_le_bytes().to_vec();
        let common = VirtioCommon::new(
            "virtio-vsock",
            VIRTIO_ID_VSOCK,
            features,
            config,
            &[QUEUE_SIZE; 3],
        )
        .map_err(VsockError::EventFd)?;
        Ok(Vsock {
            guest_cid,
            uds_path,
            muxer,
            common,
            reset_pending: false,
            rx_buf: vec![0u8; MAX_PKT_DATA],
            tx_buf: vec![0u8; MAX_PKT_DATA],
        })
    }

    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    /// Open connections (for tests and metrics).
    pub fn connection_count(&self) -> usize {
        self.muxer.connection_count()
    }

    /// Drop every connection and tell the guest with VIRTIO_VSOCK_EVENT_TRANSPORT_RESET
    /// (snapshots: the host sockets do not survive a restore). The guest closes its
    /// connected sockets; listening sockets survive. If the event queue has no buffer
    /// yet the event is delivered when it gets one.
    pub fn send_transport_reset(&mut self) {
        self.muxer.reset();
        self.reset_pending = true;
        self.process_event_queue();
    }

    /// Move everything that can move: guest TX, guest RX, events, host sockets.
    pub fn process_all(&mut self) {
        self.muxer.process_host_events(Instant::now());
        self.process_tx();
        self.process_rx();
        self.process_event_queue();
    }

    /// Guest -> host: consume TX packets until the ring is empty or the muxer has too
    /// many answers queued for the guest (then RX processing resumes TX), at most
    /// [`CHAINS_PER_PASS`] of them per pass (then the queue is served again next turn).
    pub fn process_tx(&mut self) {
        let Some(active) = self.common.running() else {
            return;
        };
        let mut handled = 0;
        let result = active.serve(TXQ, |queue, mem| {
            let mut used = false;
            // Stopping on a full backlog leaves notifications un-armed on purpose: RX
            // processing resumes TX once the guest has taken our answers.
            while !self.muxer.backlog_full() && handled < CHAINS_PER_PASS {
                let Some(chain) = pop_or_arm(queue, mem)? else {
                    break;
                };
                handled += 1;
                let head = chain.head_index();
                if let Some((hdr, len)) = read_tx_packet(mem, chain, &mut self.tx_buf) {
                    self.muxer.handle_guest_packet(&hdr, &self.tx_buf[..len]);
                }
                queue.add_used(mem, head, 0)?;
                used = true;
            }
            Ok(used)
        });
        match result {
            Ok(()) if handled == CHAINS_PER_PASS => active.requeue(TXQ),
            Ok(()) => {}
            Err(e) => self.common.fail("TX queue", &e),
        }
    }

    /// Host -> guest: fill RX buffers; if that drained a full backlog, let TX (which
    /// paused on it) continue, and fill again with what it produced.
    /// A few rounds at most: a guest whose every TX packet earns an answer (a reset, say)
    /// would otherwise keep this going; what is left is served on the next turn.
    pub fn process_rx(&mut self) {
        for _ in 0..RX_TX_ROUNDS {
            let was_full = self.muxer.backlog_full();
            self.fill_rx();
            if !was_full || self.muxer.backlog_full() {
                return;
            }
            self.process_tx();
        }
        if let Some(active) = self.common.running() {
            active.requeue(RXQ);
        }
    }

    /// Fill RX buffers while the muxer has packets (fairly across connections), at most
    /// [`CHAINS_PER_PASS`] per pass (then the queue is served again next turn).
    fn fill_rx(&mut self) {
        let now = Instant::now();
        let Some(active) = self.common.running() else {
            return;
        };
        let mut handled = 0;
        let result = active.serve(RXQ, |queue, mem| {
            let mut used = false;
            while self.muxer.has_rx() && handled < CHAINS_PER_PASS {
                let Some(chain) = pop_or_arm(queue, mem)? else {
                    break; // the guest kicks RX when it adds buffers
                };
                handled += 1;
                let head = chain.head_index();
                let Ok(mut writer) = chain.writer(mem) else {
                    queue.add_used(mem, head, 0)?; // unusable buffer: return it empty
                    used = true;
                    continue;
                };
                let space = writer.available_bytes();
                if space < HEADER_LEN {
                    queue.add_used(mem, head, 0)?;
                    used = true;
                    continue;
                }
                let max = (space - HEADER_LEN).min(MAX_PKT_DATA);
                let Some((mut hdr, n)) = self.muxer.next_rx(&mut self.rx_buf[..max], now) else {
                    // Nothing after all (a socket had no data): give the buffer back
                    // to the ring unconsumed.
                    queue.go_to_previous_position();
                    break;
                };
                hdr.len = n as u32;
                let ok = writer.write_all(&hdr.encode()).is_ok()
                    && writer.write_all(&self.rx_buf[..n]).is_ok();
                let len = if ok { (HEADER_LEN + n) as u32 } else { 0 };
                queue.add_used(mem, head, len)?;
                used = true;
            }
            Ok(used)
        });
        match result {
            Ok(()) if handled == CHAINS_PER_PASS => active.requeue(RXQ),
            Ok(()) => {}
            Err(e) => self.common.fail("RX queue", &e),
        }
    }

    /// Deliver a pending TRANSPORT_RESET event.
    fn process_event_queue(&mut self) {
        if !self.reset_pending {
            return;
        }
        let Some(active) = self.common.running() else {
            return;
        };
        // Unusable buffers are returned empty, at most CHAINS_PER_PASS of them: the event
        // stays pending, and the next notification of this queue tries again.
        let result = active.serve(EVQ, |queue, mem| {
            let mut used = false;
            for _ in 0..CHAINS_PER_PASS {
                let Some(chain) = pop_or_arm(queue, mem)? else {
                    break;
                };
                let head = chain.head_index();
                let written = match chain.writer(mem) {
                    Ok(mut w) if w.available_bytes() >= EVENT_LEN => {
                        w.write_all(&EVENT_TRANSPORT_RESET.to_le_bytes()).is_ok()
                    }
                    _ => false,
                };
                let len = if written { EVENT_LEN as u32 } else { 0 };
                queue.add_used(mem, head, len)?;
                used = true;
                if written {
                    self.reset_pending = false;
                    break;
                }
            }
            Ok(used)
        });
        if let Err(e) = result {
            self.common.fail("event queue", &e);
        }
    }
}

/// Read a TX packet: its header and (for RW) payload into `buf`. Malformed packets
/// (short header, length beyond the chain or beyond MAX_PKT_DATA, memory outside the
/// guest) yield `None` and are dropped.
fn read_tx_packet(
    mem: &GuestMemory,
    chain: DescriptorChain<&GuestMemory>,
    buf: &mut [u8],
) -> Option<(Header, usize)> {
    let mut reader = chain.reader(mem).ok()?;
    let mut raw = [0u8; HEADER_LEN];
    reader.read_exact(&mut raw).ok()?;
    let hdr = Header::decode(&raw);
    let len = if hdr.op == OP_RW { hdr.len as usize } else { 0 };
    if len > MAX_PKT_DATA || len > reader.available_bytes() || len > buf.len() {
        return None;
    }
    reader.read_exact(&mut buf[..len]).ok()?;
    Some((hdr, len))
}

impl VirtioDevice for Vsock {
    virtio_common_accessors!();

    fn reset(&mut self) {
        self.muxer.reset();
        self.reset_pending = false;
        self.common.reset();
    }
}

impl MutEventSubscriber for Vsock {
    fn init(&mut self, ops: &mut EventOps) {
        let muxer = Events::with_data_raw(self.muxer.epoll_fd(), MUXER_TOKEN, EventSet::IN);
        self.common.register(ops, &[muxer]);
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match self.common.take_event(events.data()) {
            DeviceEvent::Activate => self.process_all(),
            DeviceEvent::Other(MUXER_TOKEN) => {
                self.muxer.process_host_events(Instant::now());
                self.process_rx();
            }
            DeviceEvent::Other(_) => {}
            DeviceEvent::Queue(RXQ) => self.process_rx(),
            DeviceEvent::Queue(TXQ) => {
                self.process_tx();
                self.process_rx();
            }
            DeviceEvent::Queue(_) => self.process_event_queue(),
        }
    }
}
