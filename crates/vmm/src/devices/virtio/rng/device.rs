//! The virtio-rng device model (virtio 1.2 §5.4): one queue of device-writable buffers.

use std::io::Write;

use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::DescriptorChain;

use crate::devices::virtio::common::{VirtioCommon, serve_on_every_event, virtio_common_accessors};
use crate::devices::virtio::device::{VIRTIO_F_VERSION_1, VirtioDevice};
use crate::memory::GuestMemory;

pub const QUEUE_SIZE: u16 = 256;
/// At most this many random bytes per request, however large the guest's buffer: the
/// guest asks again if it wants more, and one request never costs us more than this.
pub const MAX_BYTES_PER_REQUEST: usize = 64 * 1024;
/// The request queue, the only one.
const REQUEST_QUEUE: usize = 0;

#[derive(Debug, thiserror::Error)]
pub enum RngError {
    #[error("creating an eventfd for the rng device: {0}")]
    EventFd(#[source] std::io::Error),
}

/// A virtio-rng device.
pub struct Rng {
    common: VirtioCommon,
    buf: Vec<u8>,
}

impl Rng {
    pub fn new() -> Result<Rng, RngError> {
        let features = VIRTIO_F_VERSION_1 | (1 << VIRTIO_RING_F_EVENT_IDX);
        Ok(Rng {
            // virtio-rng has no config space.
            common: VirtioCommon::new(
                "virtio-rng",
                VIRTIO_ID_RNG,
                features,
                Vec::new(),
                &[QUEUE_SIZE],
            )
            .map_err(RngError::EventFd)?,
            buf: Vec::new(),
        })
    }

    /// Answer every pending request. Runs on the VMM thread.
    pub fn process_queue(&mut self) {
        let Some(active) = self.common.running() else {
            return;
        };
        let buf = &mut self.buf;
        let result = active.drain(REQUEST_QUEUE, |mem, chain| fill_chain(buf, mem, chain));
        if let Err(e) = result {
            self.common.fail("request queue", &e);
        }
    }
}

/// Fill the writable part of `chain` with random bytes, up to the per-request bound.
/// Returns how many bytes were written (0 if the chain is unusable).
fn fill_chain(buf: &mut Vec<u8>, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> u32 {
    let Ok(mut writer) = chain.writer(mem) else {
        return 0;
    };
    let n = writer.available_bytes().min(MAX_BYTES_PER_REQUEST);
    buf.resize(n, 0);
    // getrandom(2) blocks only before the host's pool is initialised, long before a VMM runs.
    if sandcell_proto::random::fill(buf).is_err() {
        return 0;
    }
    match writer.write_all(buf) {
        Ok(()) => n as u32,
        Err(_) => 0,
    }
}

impl VirtioDevice for Rng {
    virtio_common_accessors!();
}

serve_on_every_event!(Rng, process_queue);
