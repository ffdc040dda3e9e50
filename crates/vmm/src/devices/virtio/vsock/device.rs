//! The virtio-vsock device model (virtio 1.2 §5.10): RX, TX and event queues, with
//! the muxer behind them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::muxer::{Muxer, MuxerError};
use super::packet::*;
use crate::devices::virtio::device::{
    ActivateError, Interrupt, VIRTIO_F_VERSION_1, VirtioDevice, read_config_bytes,
};
use crate::devices::virtio::ring::{RingError, pop_or_arm, signal_used};
use crate::memory::GuestMemory;
use crate::snapshot::{DeviceStateError, Persist};

pub const QUEUE_SIZE: u16 = 256;
const RXQ: usize = 0;
const TXQ: usize = 1;
const EVQ: usize = 2;
const ACTIVATE_TOKEN: u32 = u32::MAX;
const MUXER_TOKEN: u32 = u32::MAX - 1;

#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    #[error("guest CID {0} is reserved (must be at least 3)")]
    ReservedCid(u64),
    #[error(transparent)]
    Muxer(#[from] MuxerError),
    #[error("creating an eventfd for the vsock device: {0}")]
    EventFd(#[source] std::io::Error),
}

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queues: Vec<Queue>,
    broken: bool,
}

/// A virtio-vsock device in Firecracker's hybrid model (see `muxer.rs`).
pub struct Vsock {
    guest_cid: u64,
    uds_path: PathBuf,
    muxer: Muxer,
    acked_features: u64,
    queue_evts: Vec<EventFd>,
    activate_evt: EventFd,
    active: Option<Active>,
    /// A TRANSPORT_RESET event waits for an event-queue buffer.
    reset_pending: bool,
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
        let new_evt = || EventFd::new(EFD_NONBLOCK).map_err(VsockError::EventFd);
        Ok(Vsock {
            guest_cid,
            uds_path,
            muxer,
            acked_features: 0,
            queue_evts: vec![new_evt()?, new_evt()?, new_evt()?],
            activate_evt: new_evt()?,
            active: None,
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

    fn fail(&mut self, what: &str, e: RingError) {
        crate::log_error!("virtio-vsock: disabling the device after a {what} error: {e}");
        if let Some(a) = self.active.as_mut() {
            a.broken = true;
        }
    }

    /// Guest -> host: consume TX packets until the ring is empty or the muxer has too
    /// many answers queued for the guest (then RX processing resumes TX).
    pub fn process_tx(&mut self) {
        let Some(active) = self.active.as_mut().filter(|a| !a.broken) else {
            return;
        };
        let mem = &active.mem;
        let queue = &mut active.queues[TXQ];
        let mut used = false;
        let result: Result<(), RingError> = (|| {
            // Stopping on a full backlog leaves notifications un-armed on purpose: RX
            // processing resumes TX once the guest has taken our answers.
            while !self.muxer.backlog_full() {
                let Some(chain) = pop_or_arm(queue, mem)? else {
                    break;
                };
                let head = chain.head_index();
                if let Some((hdr, len)) = read_tx_packet(mem, chain, &mut self.tx_buf) {
                    self.muxer.handle_guest_packet(&hdr, &self.tx_buf[..len]);
                }
                queue.add_used(mem, head, 0)?;
                used = true;
            }
            if used {
                signal_used(queue, mem, &active.interrupt)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.fail("TX queue", e);
        }
    }

    /// Host -> guest: fill RX buffers; if that drained a full backlog, let TX (which
    /// paused on it) continue, and fill again with what it produced.
    pub fn process_rx(&mut self) {
        loop {
            let was_full = self.muxer.backlog_full();
            self.fill_rx();
            if !was_full || self.muxer.backlog_full() {
                return;
            }
            self.process_tx();
        }
    }

    /// Fill RX buffers while the muxer has packets (fairly across connections).
    fn fill_rx(&mut self) {
        let now = Instant::now();
        let Some(active) = self.active.as_mut().filter(|a| !a.broken) else {
            return;
        };
        let mem = &active.mem;
        let queue = &mut active.queues[RXQ];
        let mut used = false;
        let result: Result<(), RingError> = (|| {
            while self.muxer.has_rx() {
                let Some(chain) = pop_or_arm(queue, mem)? else {
                    break; // the guest kicks RX when it adds buffers
                };
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
            if used {
                signal_used(queue, mem, &active.interrupt)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.fail("RX queue", e);
        }
    }

    /// Deliver a pending TRANSPORT_RESET event.
    fn process_event_queue(&mut self) {
        if !self.reset_pending {
            return;
        }
        let Some(active) = self.active.as_mut().filter(|a| !a.broken) else {
            return;
        };
        let mem = &active.mem;
        let queue = &mut active.queues[EVQ];
        let mut used = false;
        let result: Result<(), RingError> = (|| {
            while let Some(chain) = pop_or_arm(queue, mem)? {
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
            if used {
                signal_used(queue, mem, &active.interrupt)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.fail("event queue", e);
        }
    }
}

/// A vsock device in a snapshot. Connections are not saved: their host sockets belong
/// to the process that saved them. The save sends TRANSPORT_RESET first
/// ([`Vsock::prepare_save`]) so the restored guest drops its connected sockets (its
/// listening ones survive); if the guest had no event buffer posted, the event is still
/// pending and the restored device delivers it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VsockState {
    pub guest_cid: u64,
    pub uds_path: PathBuf,
    pub reset_pending: bool,
    /// The next host port for a host-initiated connection: a restore continues from here,
    /// never reusing a port the guest may still hold a stale socket for (muxer.rs).
    pub next_host_port: u32,
}

impl Vsock {
    /// Before a save: reset the transport (see [`VsockState`]).
    pub fn prepare_save(&mut self) {
        self.send_transport_reset();
    }
}

impl Persist for Vsock {
    type State = VsockState;
    /// A new host-side socket path (`overrides.vsock_uds_path`).
    type Args = Option<PathBuf>;
    type Error = DeviceStateError;

    fn save(&self) -> VsockState {
        VsockState {
            guest_cid: self.guest_cid,
            uds_path: self.uds_path.clone(),
            reset_pending: self.reset_pending,
            next_host_port: self.muxer.next_local_port(),
        }
    }

    /// Without a new path, the saved one must not belong to a live VMM (a fork's parent):
    /// binding it would take the parent's socket path away.
    fn restore(uds_path: Option<PathBuf>, s: &VsockState) -> Result<Self, DeviceStateError> {
        if uds_path.is_none() && std::os::unix::net::UnixStream::connect(&s.uds_path).is_ok() {
            return Err(DeviceStateError::new(
                "virtio-vsock",
                format!(
                    "{} is the socket of a running VM: give the restore its own \
                     (overrides.vsock_uds_path / --vsock-uds)",
                    s.uds_path.display()
                ),
            ));
        }
        let path = uds_path.unwrap_or_else(|| s.uds_path.clone());
        let mut v = Vsock::new(s.guest_cid, path)
            .map_err(|e| DeviceStateError::new("virtio-vsock", e.to_string()))?;
        v.reset_pending = s.reset_pending;
        v.muxer.set_next_local_port(s.next_host_port);
        Ok(v)
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
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn avail_features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | (1 << VIRTIO_RING_F_EVENT_IDX)
    }

    fn acked_features(&self) -> u64 {
        self.acked_features
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features();
    }

    /// `struct virtio_vsock_config { le64 guest_cid; }`
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.guest_cid.to_le_bytes(), offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if self.active.is_some() {
            return Err(ActivateError::AlreadyActivated);
        }
        if queues.len() != 3 {
            return Err(ActivateError::QueueCount {
                expected: 3,
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
        self.muxer.reset();
        self.reset_pending = false;
        self.active = None;
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn queues(&self) -> Option<&[Queue]> {
        self.active.as_ref().map(|a| a.queues.as_slice())
    }
}

impl MutEventSubscriber for Vsock {
    fn init(&mut self, ops: &mut EventOps) {
        let mut events = vec![
            Events::with_data(&self.activate_evt, ACTIVATE_TOKEN, EventSet::IN),
            Events::with_data_raw(self.muxer.epoll_fd(), MUXER_TOKEN, EventSet::IN),
        ];
        for (i, evt) in self.queue_evts.iter().enumerate() {
            events.push(Events::with_data(evt, i as u32, EventSet::IN));
        }
        for ev in events {
            if let Err(e) = ops.add(ev) {
                crate::log_error!("virtio-vsock: registering fd {} failed: {e}", ev.fd());
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            ACTIVATE_TOKEN => {
                let _ = self.activate_evt.read();
                self.process_all();
            }
            MUXER_TOKEN => {
                self.muxer.process_host_events(Instant::now());
                self.process_rx();
            }
            i => {
                let Some(evt) = self.queue_evts.get(i as usize) else {
                    return;
                };
                let _ = evt.read();
                match i as usize {
                    RXQ => self.process_rx(),
                    TXQ => {
                        self.process_tx();
                        self.process_rx();
                    }
                    _ => self.process_event_queue(),
                }
            }
        }
    }
}
