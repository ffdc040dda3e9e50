//! The virtio-fs device model: a hiprio queue and one request queue, both served by the
//! vhost-user backend; the VMM keeps the config space (the mount tag) and the interrupts.

use std::os::fd::AsRawFd;
use std::path::Path;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_bindings::virtio_ids::VIRTIO_ID_FS;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::backend::{Backend, BackendError};
use crate::devices::virtio::common::{DeviceEvent, VirtioCommon, virtio_common_accessors};
use crate::devices::virtio::device::{InterruptKind, VIRTIO_F_VERSION_1, VirtioDevice};

/// The hiprio queue (FUSE_INTERRUPT, FUSE_FORGET) and one request queue.
pub const NUM_QUEUES: usize = 2;
pub const QUEUE_SIZE: u16 = 1024;
/// `virtio_fs_config.tag` is 36 bytes, NUL-padded.
pub const TAG_MAX_LEN: usize = 36;
/// The features the VMM lets through from the backend to the guest: the ring formats it
/// can describe to the backend. Packed rings, platform access and the rest stay off.
const PASSED_FEATURES: u64 =
    VIRTIO_F_VERSION_1 | (1 << VIRTIO_RING_F_EVENT_IDX) | (1 << VIRTIO_RING_F_INDIRECT_DESC);
/// Event-loop tokens: one per queue's call eventfd, then the backend socket.
const CALL_TOKEN_BASE: u32 = 1 << 16;
const BACKEND_TOKEN: u32 = (1 << 16) + 0x100;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("virtio-fs tag {0:?}: must be 1 to {TAG_MAX_LEN} bytes without NUL")]
    Tag(String),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the vhost-user backend at {0} does not offer VIRTIO_F_VERSION_1")]
    NotModern(String),
    #[error("creating an eventfd for virtio-fs: {0}")]
    EventFd(#[source] std::io::Error),
}

/// `struct virtio_fs_config`: the tag, NUL-padded, then `num_request_queues` (LE).
pub fn config_space(tag: &str) -> Result<Vec<u8>, FsError> {
    if tag.is_empty() || tag.len() > TAG_MAX_LEN || tag.contains('\0') {
        return Err(FsError::Tag(tag.to_string()));
    }
    let mut config = vec![0u8; TAG_MAX_LEN];
    config[..tag.len()].copy_from_slice(tag.as_bytes());
    config.extend_from_slice(&((NUM_QUEUES - 1) as u32).to_le_bytes());
    Ok(config)
}

/// A virtio-fs device connected to its backend.
pub struct Fs {
    common: VirtioCommon,
    backend: Backend,
    /// Duplicates of the queue-notify eventfds (the common's), handed to the backend as
    /// kick fds: KVM signals them and the backend reads them. The VMM never registers
    /// them itself, or it would steal the backend's kicks.
    kicks: Vec<EventFd>,
    /// One per queue, signalled by the backend when it used buffers.
    calls: Vec<EventFd>,
    /// Whether the backend has rings from an activation (a re-activation after a driver
    /// reset stops them first).
    started: bool,
}

impl Fs {
    /// Connects to the backend listening on `socket`; fails if it is not there.
    pub fn new(tag: &str, socket: &Path) -> Result<Fs, FsError> {
        let config = config_space(tag)?;
        let backend = Backend::connect(socket, NUM_QUEUES)?;
        let offered = backend.virtio_features();
        if offered & VIRTIO_F_VERSION_1 == 0 {
            return Err(FsError::NotModern(backend.path().to_string()));
        }
        let common = VirtioCommon::new(
            "virtio-fs",
            VIRTIO_ID_FS,
            offered & PASSED_FEATURES,
            config,
            &[QUEUE_SIZE; NUM_QUEUES],
        )
        .map_err(FsError::EventFd)?;
        let kicks = common
            .queue_events()
            .iter()
            .map(EventFd::try_clone)
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(FsError::EventFd)?;
        let calls = (0..NUM_QUEUES)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(FsError::EventFd)?;
        Ok(Fs {
            common,
            backend,
            kicks,
            calls,
            started: false,
        })
    }

    /// DRIVER_OK reached the VMM thread: give the backend the rings.
    fn start_backend(&mut self) {
        if self.started {
            self.backend.stop(NUM_QUEUES);
            self.started = false;
        }
        let acked = self.common.acked_features();
        let Some(active) = self.common.running() else {
            return;
        };
        match self
            .backend
            .start(acked, &active.mem, &active.queues, &self.kicks, &self.calls)
        {
            Ok(()) => self.started = true,
            // The guest's requests then wait forever; the log says why.
            Err(e) => tracing::error!("virtio-fs: starting the backend's rings: {e}"),
        }
    }

    /// The backend used buffers on queue `index`: interrupt the driver.
    fn forward_call(&mut self, index: usize) {
        if let Some(call) = self.calls.get(index) {
            let _ = call.read();
        }
        if let Some(active) = self.common.running()
            && let Err(e) = active.interrupt.trigger(InterruptKind::Vring)
        {
            tracing::warn!("virtio-fs: signalling the interrupt: {e}");
        }
    }
}

impl VirtioDevice for Fs {
    virtio_common_accessors!();
}

impl MutEventSubscriber for Fs {
    fn init(&mut self, ops: &mut EventOps) {
        let mut extra: Vec<Events> = self
            .calls
            .iter()
            .enumerate()
            .map(|(i, call)| Events::with_data(call, CALL_TOKEN_BASE + i as u32, EventSet::IN))
            .collect();
        extra.push(Events::with_data_raw(
            self.backend.as_raw_fd(),
            BACKEND_TOKEN,
            EventSet::HANG_UP | EventSet::READ_HANG_UP,
        ));
        self.common.register_without_queues(ops, &extra);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match self.common.take_event(events.data()) {
            DeviceEvent::Activate => self.start_backend(),
            DeviceEvent::Other(BACKEND_TOKEN) => {
                tracing::error!(
                    "virtio-fs: the backend at {} hung up; the guest's file requests on it \
                     will not complete",
                    self.backend.path()
                );
                let _ = ops.remove(events);
            }
            DeviceEvent::Other(token) if token >= CALL_TOKEN_BASE => {
                self.forward_call((token - CALL_TOKEN_BASE) as usize);
            }
            DeviceEvent::Queue(_) | DeviceEvent::Other(_) => {}
        }
    }
}
