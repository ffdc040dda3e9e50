//! The vhost-user frontend side of a virtio-fs device: one session with virtiofsd over
//! its Unix socket.
//!
//! Order matters, as the vhost-user specification sets it: the owner and the feature
//! bits first (the backend sizes its state from them), then the memory table (ring
//! addresses are translated through it), then per ring its size, addresses, base index,
//! call and kick eventfds, and last the enable (with `VHOST_USER_F_PROTOCOL_FEATURES`
//! negotiated, rings start disabled and process nothing until enabled).

use std::os::unix::net::UnixStream;
use std::path::Path;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::EventFd;

use crate::memory::GuestMemory;

/// `VHOST_USER_F_PROTOCOL_FEATURES`: a vhost-user bit in the virtio feature word, never
/// shown to the guest.
const PROTOCOL_FEATURES_BIT: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("connecting to the vhost-user backend at {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("vhost-user {step} with the backend at {path}: {source}")]
    Protocol {
        step: &'static str,
        path: String,
        source: vhost::Error,
    },
    #[error("guest memory region at {addr:#x} is not backed by a file the backend can map")]
    Memory { addr: u64 },
    #[error("ring address {addr:#x} of queue {queue} is outside guest memory")]
    RingAddress { queue: usize, addr: u64 },
}

/// The error of vhost-user message `step` with the backend at `path`, for `map_err`.
fn failed(step: &'static str, path: &str) -> impl FnOnce(vhost::Error) -> BackendError {
    let path = path.to_string();
    move |source| BackendError::Protocol { step, path, source }
}

/// A connected, owned backend and the virtio features it offers.
pub struct Backend {
    frontend: Frontend,
    path: String,
    /// What the backend offers, `VHOST_USER_F_PROTOCOL_FEATURES` included.
    features: u64,
}

impl Backend {
    /// Connects to `socket` (the backend listens there; no retries: the runtime starts
    /// virtiofsd and waits for its socket before it starts the VMM), takes ownership and
    /// reads the features. Protocol features are negotiated down to none: Sandcell needs
    /// none of the optional messages (no migration, no config space from the backend).
    pub fn connect(socket: &Path, queues: usize) -> Result<Backend, BackendError> {
        let path = socket.display().to_string();
        let stream = UnixStream::connect(socket).map_err(|source| BackendError::Connect {
            path: path.clone(),
            source,
        })?;
        let mut frontend = Frontend::from_stream(stream, queues as u64);
        frontend.set_owner().map_err(failed("SET_OWNER", &path))?;
        let features = frontend
            .get_features()
            .map_err(failed("GET_FEATURES", &path))?;
        if features & PROTOCOL_FEATURES_BIT != 0 {
            // Acking the bit before GET_PROTOCOL_FEATURES is what the spec asks for.
            frontend
                .set_features(PROTOCOL_FEATURES_BIT)
                .map_err(failed("SET_FEATURES", &path))?;
            frontend
                .get_protocol_features()
                .map_err(failed("GET_PROTOCOL_FEATURES", &path))?;
            frontend
                .set_protocol_features(VhostUserProtocolFeatures::empty())
                .map_err(failed("SET_PROTOCOL_FEATURES", &path))?;
        }
        Ok(Backend {
            frontend,
            path,
            features,
        })
    }

    /// The virtio feature bits the backend offers (without the vhost-user bit).
    pub fn virtio_features(&self) -> u64 {
        self.features & !PROTOCOL_FEATURES_BIT
    }

    /// Hands the backend the driver's rings: features, memory, then each ring. `kicks`
    /// are the queue-notify eventfds KVM signals, `calls` the eventfds the backend
    /// signals when it used buffers. Runs on the VMM thread at activation.
    pub fn start(
        &mut self,
        acked: u64,
        mem: &GuestMemory,
        queues: &[Queue],
        kicks: &[EventFd],
        calls: &[EventFd],
    ) -> Result<(), BackendError> {
        let protocol = self.features & PROTOCOL_FEATURES_BIT;
        self.frontend
            .set_features(acked | protocol)
            .map_err(failed("SET_FEATURES", &self.path))?;
        let mut regions = Vec::new();
        for region in mem.iter() {
            let info = VhostUserMemoryRegionInfo::from_guest_region(region).map_err(|_| {
                BackendError::Memory {
                    addr: vm_memory::GuestMemoryRegion::start_addr(region).0,
                }
            })?;
            regions.push(info);
        }
        self.frontend
            .set_mem_table(&regions)
            .map_err(failed("SET_MEM_TABLE", &self.path))?;
        for (index, queue) in queues.iter().enumerate() {
            if !queue.ready() {
                continue;
            }
            let host = |addr: u64| {
                mem.get_host_address(GuestAddress(addr))
                    .map(|p| p as u64)
                    .map_err(|_| BackendError::RingAddress { queue: index, addr })
            };
            let config = VringConfigData {
                queue_max_size: queue.max_size(),
                queue_size: queue.size(),
                flags: 0,
                desc_table_addr: host(queue.desc_table())?,
                used_ring_addr: host(queue.used_ring())?,
                avail_ring_addr: host(queue.avail_ring())?,
                log_addr: None,
            };
            self.frontend
                .set_vring_num(index, queue.size())
                .map_err(failed("SET_VRING_NUM", &self.path))?;
            self.frontend
                .set_vring_addr(index, &config)
                .map_err(failed("SET_VRING_ADDR", &self.path))?;
            self.frontend
                .set_vring_base(index, queue.next_avail())
                .map_err(failed("SET_VRING_BASE", &self.path))?;
            self.frontend
                .set_vring_call(index, &calls[index])
                .map_err(failed("SET_VRING_CALL", &self.path))?;
            self.frontend
                .set_vring_kick(index, &kicks[index])
                .map_err(failed("SET_VRING_KICK", &self.path))?;
        }
        if protocol != 0 {
            for (index, queue) in queues.iter().enumerate() {
                if queue.ready() {
                    self.frontend
                        .set_vring_enable(index, true)
                        .map_err(failed("SET_VRING_ENABLE", &self.path))?;
                }
            }
        }
        Ok(())
    }

    /// Stops every ring (GET_VRING_BASE stops a ring in the backend), for a driver reset.
    pub fn stop(&mut self, queues: usize) {
        for index in 0..queues {
            if let Err(e) = self.frontend.get_vring_base(index) {
                tracing::warn!("virtio-fs: stopping ring {index} at {}: {e}", self.path);
            }
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }
}

impl std::os::fd::AsRawFd for Backend {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.frontend.as_raw_fd()
    }
}
