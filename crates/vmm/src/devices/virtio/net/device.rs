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
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MAC, VIRTIO_NET_HDR_GSO_NONE,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::tap::{NetBackend, offload_flags};
use crate::devices::virtio::device::{
    ActivateError, Interrupt, VIRTIO_F_VERSION_1, VirtioDevice, read_config_bytes,
};
use crate::devices::virtio::ring::{RingError, drain_queue, pop_or_arm, signal_used};
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

const ACTIVATE_TOKEN: u32 = u32::MAX;
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

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queues: Vec<Queue>,
    broken: bool,
}

/// A virtio-net device on a [`NetBackend`].
pub struct Net {
    backend: Box<dyn NetBackend>,
    mac: [u8; 6],
    acked_features: u64,
    queue_evts: Vec<EventFd>,
    activate_evt: EventFd,
    active: Option<Active>,
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
        let new_evt = || EventFd::new(EFD_NONBLOCK).map_err(NetError::EventFd);
        Ok(Net {
            backend,
            mac,
            acked_features: 0,
            queue_evts: vec![new_evt()?, new_evt()?],
            activate_evt: new_evt()?,
            active: None,
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

    fn has(&self, bit: u32) -> bool {
        self.acked_features & (1u64 << bit) != 0
    }

    /// Send every frame the guest queued. Runs on the VMM thread.
    pub fn process_tx(&mut self) {
        let host_tso = self.has(VIRTIO_NET_F_HOST_TSO4) || self.has(VIRTIO_NET_F_HOST_TSO6);
        let Some(active) = self.active.as_mut().filter(|a| !a.broken) else {
            return;
        };
        let (backend, buf, counters) = (&mut self.backend, &mut self.tx_buf, &mut self.counters);
        let mem = &active.mem;
        let queue = &mut active.queues[TX_QUEUE];
        let result = drain_queue(queue, mem, &active.interrupt, |chain| {
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
            crate::log_error!("virtio-net: disabling the device: TX queue: {e}");
            active.broken = true;
        }
    }

    /// Move frames from the backend into guest buffers until the backend is empty, the
    /// guest has no buffer left, or the per-event budget is spent. Returns true when a
    /// frame waits for a guest buffer (the caller disarms the backend).
    pub fn process_rx(&mut self) -> bool {
        let Some(active) = self.active.as_mut().filter(|a| !a.broken) else {
            return false;
        };
        let mem = &active.mem;
        let queue = &mut active.queues[RX_QUEUE];
        let mut used = false;
        let mut blocked = false;
        let result: Result<(), RingError> = (|| {
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
                            crate::log_warn!("virtio-net: reading {}: {e}", self.backend.name());
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
            Ok(())
        })();
        let result = result.and_then(|()| {
            if used {
                signal_used(queue, mem, &active.interrupt)?;
            }
            Ok(())
        });
        if let Err(e) = result {
            crate::log_error!("virtio-net: disabling the device: RX queue: {e}");
            active.broken = true;
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
            Err(e) => crate::log_error!("virtio-net: re-arming {}: {e}", self.backend.name()),
        }
    }

    /// What activation does on the VMM thread: offloads for what the guest acked, then
    /// whatever the driver queued already.
    fn on_activate(&mut self, ops: &mut EventOps) {
        let flags = offload_flags(self.acked_features);
        if let Err(e) = self.backend.set_offload(flags) {
            crate::log_error!(
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

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn avail_features(&self) -> u64 {
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

    fn acked_features(&self) -> u64 {
        self.acked_features
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_net_config: only `mac` (VIRTIO_NET_F_MAC) is offered.
        read_config_bytes(&self.mac, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // The MAC is ours to set (the legacy writable MAC is not offered).
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if self.active.is_some() {
            return Err(ActivateError::AlreadyActivated);
        }
        if queues.len() != 2 {
            return Err(ActivateError::QueueCount {
                expected: 2,
                got: queues.len(),
            });
        }
        self.activate_evt
            .write(1)
            .map_err(ActivateError::ActivateEvent)?;
        self.active = Some(Active {
            mem,
            interrupt,
            queues,
            broken: false,
        });
        Ok(())
    }

    fn reset(&mut self) {
        self.active = None;
        self.rx_len = 0;
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn queues(&self) -> Option<&[Queue]> {
        self.active.as_ref().map(|a| a.queues.as_slice())
    }
}

impl MutEventSubscriber for Net {
    fn init(&mut self, ops: &mut EventOps) {
        let mut events = vec![
            Events::with_data(&self.activate_evt, ACTIVATE_TOKEN, EventSet::IN),
            Events::with_data_raw(self.backend.as_raw_fd(), BACKEND_TOKEN, EventSet::IN),
        ];
        for (i, evt) in self.queue_evts.iter().enumerate() {
            events.push(Events::with_data(evt, i as u32, EventSet::IN));
        }
        for ev in events {
            if let Err(e) = ops.add(ev) {
                crate::log_error!("virtio-net: registering fd {} failed: {e}", ev.fd());
            }
        }
        // Armed on (re-)registration, e.g. at resume; a pending frame disarms it again
        // on its first event.
        self.backend_armed = true;
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            ACTIVATE_TOKEN => {
                let _ = self.activate_evt.read();
                if self.active.is_some() {
                    self.on_activate(ops);
                }
            }
            BACKEND_TOKEN => {
                if self.active.as_ref().is_none_or(|a| a.broken) {
                    self.discard_rx();
                    return;
                }
                let blocked = self.process_rx();
                self.arm_backend(ops, !blocked);
            }
            i => {
                let Some(evt) = self.queue_evts.get(i as usize) else {
                    return;
                };
                let _ = evt.read();
                if i as usize == TX_QUEUE {
                    self.process_tx();
                } else {
                    let blocked = self.process_rx();
                    self.arm_backend(ops, !blocked);
                }
            }
        }
    }
}
