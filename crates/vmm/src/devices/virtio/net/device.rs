//! The virtio-net device model: RX queue 0, TX queue 1, MAC in config space.
//!
//! Everything runs on the VMM thread (`MutEventSubscriber::process`):
//! - TX (queue notify): each chain's readable bytes are one vnet header plus one frame,
//!   bounded by [`MAX_FRAME_LEN`], written to the backend as one message.
//! - RX (backend readable, or RX queue notify): one frame is read into `rx_frame` and
//!   copied into one guest chain. When the guest has no buffer posted, the frame stays
//!   pending and the backend is taken out of the poll set (it would be readable
//!   forever); the guest's next RX notify delivers the pending frame and puts the
//!   backend back. Nothing is dropped for lack of buffers, nothing spins.
//!
//! Without `VIRTIO_NET_F_MRG_RXBUF` each frame takes one chain: a guest that acked
//! GUEST_TSO posts 64 KiB chains (Linux's "big packets"), one that did not posts chains
//! of at least one MTU-sized frame. A frame larger than the chain it lands in is dropped
//! and the chain returned empty.

use std::io::{Read, Write};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MAC, VIRTIO_NET_HDR_GSO_NONE,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{DescriptorChain, QueueT};

use super::tap::{NetBackend, offload_flags};
use crate::devices::virtio::common::{DeviceEvent, VirtioCommon, virtio_common_accessors};
use crate::devices::virtio::device::{VIRTIO_F_VERSION_1, VirtioDevice};
use crate::devices::virtio::ring::pop_or_arm;
use crate::memory::GuestMemory;

pub const RX_QUEUE: usize = 0;
pub const TX_QUEUE: usize = 1;
pub const QUEUE_SIZE: u16 = 256;
/// `virtio_net_hdr_v1`: flags, gso_type, hdr_len, gso_size, csum_start, csum_offset,
/// num_buffers.
pub const VNET_HDR_LEN: usize = 12;
const ETH_HLEN: usize = 14;
/// The largest header + frame either way: a 64 KiB GSO packet with an Ethernet and a
/// VLAN header. TX chains offering more are refused; RX reads never need more.
pub const MAX_FRAME_LEN: usize = VNET_HDR_LEN + ETH_HLEN + 4 + 65535;
/// Frames moved per event before returning to the loop (the other queue, the other
/// devices and the control socket get their turn; epoll is level-triggered, so the
/// rest comes back on the next round).
const FRAMES_PER_EVENT: usize = 256;

/// Event-manager token of the backend fd (not a queue index, not the activate token).
const BACKEND_TOKEN: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("creating an eventfd for the net device: {0}")]
    EventFd(#[source] std::io::Error),
}

/// What went through the device (kept for tests and logs; not saved).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetCounters {
    pub tx_frames: u64,
    /// TX chains refused (too short, too long, unreadable, GSO not negotiated) or frames
    /// the backend would not take.
    pub tx_dropped: u64,
    pub rx_frames: u64,
    /// RX frames that did not fit the guest's chain, or were shorter than a header.
    pub rx_dropped: u64,
}

/// A virtio-net device on a [`NetBackend`].
pub struct Net {
    backend: Box<dyn NetBackend>,
    mac: [u8; 6],
    common: VirtioCommon,
    /// A frame read from the backend and not yet delivered: `rx_frame[..rx_len]`.
    rx_frame: Vec<u8>,
    rx_len: usize,
    tx_buf: Vec<u8>,
    /// Whether the backend fd is armed for EPOLLIN in the event loop.
    backend_armed: bool,
    counters: NetCounters,
}

impl Net {
    pub fn new(backend: Box<dyn NetBackend>, mac: [u8; 6]) -> Result<Net, NetError> {
        let common = VirtioCommon::new(
            "virtio-net",
            VIRTIO_ID_NET,
            avail_features(),
            // struct virtio_net_config: only `mac` (VIRTIO_NET_F_MAC) is offered; the MAC
            // is ours to set (the legacy writable MAC is not offered).
            mac.to_vec(),
            &[QUEUE_SIZE, QUEUE_SIZE],
        )
        .map_err(NetError::EventFd)?;
        Ok(Net {
            backend,
            mac,
            common,
            rx_frame: vec![0; MAX_FRAME_LEN],
            rx_len: 0,
            tx_buf: vec![0; MAX_FRAME_LEN],
            backend_armed: false,
            counters: NetCounters::default(),
        })
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    pub fn backend_name(&self) -> &str {
        self.backend.name()
    }

    pub fn counters(&self) -> NetCounters {
        self.counters
    }

    /// Whether a received frame waits for a guest buffer.
    pub fn rx_pending(&self) -> bool {
        self.rx_len > 0
    }

    /// Send every frame the guest queued. Runs on the VMM thread.
    pub fn process_tx(&mut self) {
        let host_tso = self.common.has_feature(VIRTIO_NET_F_HOST_TSO4)
            || self.common.has_feature(VIRTIO_NET_F_HOST_TSO6);
        let Some(active) = self.common.running() else {
            return;
        };
        let (backend, buf, counters) = (&mut self.backend, &mut self.tx_buf, &mut self.counters);
        let result = active.drain(TX_QUEUE, |mem, chain| {
            match read_tx_frame(mem, chain, buf, host_tso) {
                Some(n) => match backend.send(&buf[..n]) {
                    Ok(_) => counters.tx_frames += 1,
                    // A full or gone interface drops the frame, as a wire would.
                    Err(_) => counters.tx_dropped += 1,
                },
                None => counters.tx_dropped += 1,
            }
            0 // the device writes nothing into TX buffers
        });
        if let Err(e) = result {
            self.common.fail("TX queue", &e);
        }
    }

    /// Move frames from the backend into guest buffers until the backend is empty, the
    /// guest has no buffer left, or the per-event budget is spent. Returns true when a
    /// frame waits for a guest buffer (the caller disarms the backend).
    pub fn process_rx(&mut self) -> bool {
        let Some(active) = self.common.running() else {
            return false;
        };
        let mut blocked = false;
        let result = active.serve(RX_QUEUE, |queue, mem| {
            let mut used = false;
            for _ in 0..FRAMES_PER_EVENT {
                if self.rx_len == 0 {
                    match self.backend.recv(&mut self.rx_frame) {
                        Ok(n) if n >= VNET_HDR_LEN + ETH_HLEN => self.rx_len = n,
                        Ok(_) => {
                            self.counters.rx_dropped += 1;
                            continue;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            tracing::warn!("virtio-net: reading {}: {e}", self.backend.name());
                            break;
                        }
                    }
                }
                let Some(chain) = pop_or_arm(queue, mem)? else {
                    blocked = true; // the guest notifies RX when it posts buffers
                    break;
                };
                let head = chain.head_index();
                let frame = &mut self.rx_frame[..self.rx_len];
                // One chain per frame (no MRG_RXBUF).
                frame[10..12].copy_from_slice(&1u16.to_le_bytes());
                let delivered = match chain.writer(mem) {
                    Ok(mut w) => w.available_bytes() >= frame.len() && w.write_all(frame).is_ok(),
                    Err(_) => false,
                };
                let len = if delivered {
                    self.counters.rx_frames += 1;
                    frame.len() as u32
                } else {
                    self.counters.rx_dropped += 1;
                    0
                };
                self.rx_len = 0;
                queue.add_used(mem, head, len)?;
                used = true;
            }
            Ok(used)
        });
        if let Err(e) = result {
            self.common.fail("RX queue", &e);
            return false;
        }
        blocked
    }

    /// Without an active driver, received frames have nowhere to go: drop a bounded
    /// number (the link is as good as down) so a level-triggered poll does not spin.
    fn discard_rx(&mut self) {
        self.rx_len = 0;
        for _ in 0..FRAMES_PER_EVENT {
            match self.backend.recv(&mut self.rx_frame) {
                Ok(_) => self.counters.rx_dropped += 1,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }

    fn arm_backend(&mut self, ops: &mut EventOps, armed: bool) {
        if self.backend_armed == armed {
            return;
        }
        let set = if armed {
            EventSet::IN
        } else {
            EventSet::empty()
        };
        let ev = Events::with_data_raw(self.backend.as_raw_fd(), BACKEND_TOKEN, set);
        match ops.modify(ev) {
            Ok(()) => self.backend_armed = armed,
            Err(e) => tracing::error!("virtio-net: re-arming {}: {e}", self.backend.name()),
        }
    }

    /// What activation does on the VMM thread: offloads for what the guest acked, then
    /// whatever the driver queued already.
    fn on_activate(&mut self, ops: &mut EventOps) {
        let flags = offload_flags(self.common.acked_features());
        if let Err(e) = self.backend.set_offload(flags) {
            tracing::error!(
                "virtio-net: TUNSETOFFLOAD {flags:#x} on {}: {e}",
                self.backend.name()
            );
        }
        self.process_tx();
        let blocked = self.process_rx();
        self.arm_backend(ops, !blocked);
    }
}

/// Read one TX chain (vnet header + frame) into `buf`. `None` if the chain is unusable:
/// unreadable, shorter than a header and an Ethernet header, longer than
/// [`MAX_FRAME_LEN`], or a GSO frame the driver never negotiated.
fn read_tx_frame(
    mem: &GuestMemory,
    chain: DescriptorChain<&GuestMemory>,
    buf: &mut [u8],
    host_tso: bool,
) -> Option<usize> {
    let mut reader = chain.reader(mem).ok()?;
    let n = reader.available_bytes();
    if !(VNET_HDR_LEN + ETH_HLEN..=MAX_FRAME_LEN.min(buf.len())).contains(&n) {
        return None;
    }
    reader.read_exact(&mut buf[..n]).ok()?;
    let gso_type = buf[1];
    if u32::from(gso_type) != VIRTIO_NET_HDR_GSO_NONE && !host_tso {
        return None;
    }
    Some(n)
}

/// What the device offers: checksum and TSO offloads both ways (the TAP does the rest).
fn avail_features() -> u64 {
    let bit = |b: u32| 1u64 << b;
    VIRTIO_F_VERSION_1
        | bit(VIRTIO_RING_F_EVENT_IDX)
        | bit(VIRTIO_NET_F_MAC)
        | bit(VIRTIO_NET_F_CSUM)
        | bit(VIRTIO_NET_F_GUEST_CSUM)
        | bit(VIRTIO_NET_F_HOST_TSO4)
        | bit(VIRTIO_NET_F_HOST_TSO6)
        | bit(VIRTIO_NET_F_GUEST_TSO4)
        | bit(VIRTIO_NET_F_GUEST_TSO6)
}

impl VirtioDevice for Net {
    virtio_common_accessors!();

    fn reset(&mut self) {
        self.common.reset();
        self.rx_len = 0;
    }
}

impl MutEventSubscriber for Net {
    fn init(&mut self, ops: &mut EventOps) {
        let backend = Events::with_data_raw(self.backend.as_raw_fd(), BACKEND_TOKEN, EventSet::IN);
        self.common.register(ops, &[backend]);
        // Armed on (re-)registration, e.g. at resume; a pending frame disarms it again
        // on its first event.
        self.backend_armed = true;
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match self.common.take_event(events.data()) {
            DeviceEvent::Activate => {
                if self.common.is_activated() {
                    self.on_activate(ops);
                }
            }
            DeviceEvent::Other(BACKEND_TOKEN) => {
                if !self.common.is_running() {
                    self.discard_rx();
                    return;
                }
                let blocked = self.process_rx();
                self.arm_backend(ops, !blocked);
            }
            DeviceEvent::Other(_) => {}
            DeviceEvent::Queue(TX_QUEUE) => self.process_tx(),
            DeviceEvent::Queue(_) => {
                let blocked = self.process_rx();
                self.arm_backend(ops, !blocked);
            }
        }
    }
}
