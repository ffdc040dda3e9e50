//! The virtio-rng device model (virtio 1.2 §5.4): one queue of device-writable buffers.

use std::io::Write;
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{DescriptorChain, Queue};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::devices::virtio::device::{ActivateError, Interrupt, VIRTIO_F_VERSION_1, VirtioDevice};
use crate::devices::virtio::ring::drain_queue;
use crate::memory::GuestMemory;
use crate::snapshot::{DeviceStateError, Persist};

pub const QUEUE_SIZE: u16 = 256;
/// At most this many random bytes per request, however large the guest's buffer: the
/// guest asks again if it wants more, and one request never costs us more than this.
pub const MAX_BYTES_PER_REQUEST: usize = 64 * 1024;
const ACTIVATE_TOKEN: u32 = u32::MAX;

#[derive(Debug, thiserror::Error)]
pub enum RngError {
    #[error("creating an eventfd for the rng device: {0}")]
    EventFd(#[source] std::io::Error),
}

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queue: Queue,
    broken: bool,
}

/// A virtio-rng device.
pub struct Rng {
    acked_features: u64,
    queue_evts: Vec<EventFd>,
    activate_evt: EventFd,
    active: Option<Active>,
    buf: Vec<u8>,
}

impl Rng {
    pub fn new() -> Result<Rng, RngError> {
        let new_evt = || EventFd::new(EFD_NONBLOCK).map_err(RngError::EventFd);
        Ok(Rng {
            acked_features: 0,
            queue_evts: vec![new_evt()?],
            activate_evt: new_evt()?,
            active: None,
            buf: Vec::new(),
        })
    }

    /// Answer every pending request. Runs on the VMM thread.
    pub fn process_queue(&mut self) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        if active.broken {
            return;
        }
        let buf = &mut self.buf;
        let mem = &active.mem;
        let result = drain_queue(&mut active.queue, mem, &active.interrupt, |chain| {
            fill_chain(buf, mem, chain)
        });
        if let Err(e) = result {
            crate::log_error!("virtio-rng: disabling the request queue: {e}");
            active.broken = true;
        }
    }
}

/// virtio-rng has no state of its own (its queue is in the transport's state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RngState {}

impl Persist for Rng {
    type State = RngState;
    type Args = ();
    type Error = DeviceStateError;

    fn save(&self) -> RngState {
        RngState {}
    }

    fn restore(_: (), _: &RngState) -> Result<Self, DeviceStateError> {
        Rng::new().map_err(|e| DeviceStateError::new("virtio-rng", e.to_string()))
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
    if getrandom(buf).is_err() {
        return 0;
    }
    match writer.write_all(buf) {
        Ok(()) => n as u32,
        Err(_) => 0,
    }
}

/// Fill `buf` from the kernel CSPRNG (getrandom(2), blocking only before the host's
/// pool is initialised, which is long past when a VMM runs).
fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the kernel writes at most `rest.len()` bytes into `rest`, which is a
        // valid, exclusively borrowed buffer of that length.
        let r = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += r as usize;
    }
    Ok(())
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
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

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0); // virtio-rng has no config space
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        mut queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if self.active.is_some() {
            return Err(ActivateError::AlreadyActivated);
        }
        if queues.len() != 1 {
            return Err(ActivateError::QueueCount {
                expected: 1,
                got: queues.len(),
            });
        }
        self.activate_evt
            .write(1)
            .map_err(ActivateError::ActivateEvent)?;
        self.active = Some(Active {
            mem,
            interrupt,
            queue: queues.remove(0),
            broken: false,
        });
        Ok(())
    }

    fn reset(&mut self) {
        self.active = None;
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn queues(&self) -> Option<&[Queue]> {
        self.active.as_ref().map(|a| std::slice::from_ref(&a.queue))
    }
}

impl MutEventSubscriber for Rng {
    fn init(&mut self, ops: &mut EventOps) {
        let mut events = vec![Events::with_data(
            &self.activate_evt,
            ACTIVATE_TOKEN,
            EventSet::IN,
        )];
        for (i, evt) in self.queue_evts.iter().enumerate() {
            events.push(Events::with_data(evt, i as u32, EventSet::IN));
        }
        for ev in events {
            if let Err(e) = ops.add(ev) {
                crate::log_error!("virtio-rng: registering eventfd {} failed: {e}", ev.fd());
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let evt = match events.data() {
            ACTIVATE_TOKEN => &self.activate_evt,
            i => match self.queue_evts.get(i as usize) {
                Some(e) => e,
                None => return,
            },
        };
        let _ = evt.read();
        self.process_queue();
    }
}
