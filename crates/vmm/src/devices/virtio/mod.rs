//! virtio devices and the virtio-mmio transport.
//!
//! - [`device`]: the [`VirtioDevice`] trait and the [`Interrupt`] (status bits + irqfd).
//! - [`common`]: [`VirtioCommon`], the features, eventfds and activation state every
//!   device embeds, and its event-loop helpers.
//! - [`mmio`]: [`MmioTransport`], the virtio-mmio v2 register file on a 4 KiB window.
//! - [`ring`]: draining a virtqueue and interrupting the driver.
//! - [`block`], [`fs`], [`net`], [`rng`], [`vsock`]: the devices ([`fs`] is served by a
//!   vhost-user backend process, virtiofsd).
//!
//! # Wiring a device (what vmm-core does, on the VMM thread, before the vCPUs start)
//!
//! ```text
//! // 1. Create the device and share it: the event loop and the transport both use it.
//! let blk = Arc::new(Mutex::new(Block::new(BlockConfig { base, overlay, read_only })?));
//! // 2. Register it with the VMM thread's EventManager. Its `init` adds its activate
//! //    eventfd and its queue eventfds; requests are served from `process` on this
//! //    thread. The EventManager type is
//! //    `EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>>`.
//! event_manager.add_subscriber(blk.clone());
//! // 3. Allocate a 4 KiB MMIO window (MMIO_WINDOW_SIZE) at `base` and a GSI `irq`.
//! let irq_evt = EventFd::new(EFD_NONBLOCK)?;
//! vm_fd.register_irqfd(&irq_evt, irq)?;                       // irqfd on the GSI
//! let transport = MmioTransport::new(guest_mem.clone(), blk.clone(), irq_evt)?;
//! // 4. Optional (saves a VM exit per notification): one KVM ioeventfd per queue.
//! for (i, evt) in transport.queue_notify_evts().into_iter().enumerate() {
//!     vm_fd.register_ioevent(evt, &IoEventAddress::Mmio(base + QUEUE_NOTIFY_OFFSET),
//!                            i as u32)?;                      // 4-byte write, datamatch = i
//! }
//! //    Without it, the QueueNotify exit reaches the transport, which signals the same
//! //    eventfd: both paths work.
//! // 5. Put the transport on the MMIO bus and tell the guest kernel where it is.
//! mmio_bus.insert(base, MMIO_WINDOW_SIZE, Arc::new(Mutex::new(transport)))?;
//! cmdline.add_virtio_mmio_device(MMIO_WINDOW_SIZE, GuestAddress(base), irq, None)?;
//! //    i.e. `virtio_mmio.device=4K@0x<base>:<irq>`
//! ```
//!
//! Threads: MMIO exits run the transport on vCPU threads; DRIVER_OK calls
//! [`VirtioDevice::activate`] there, which only stores the queues and signals the
//! device's activate eventfd; all queue processing and file/socket I/O happens in the
//! device's `MutEventSubscriber::process` on the VMM thread. Queue eventfds are owned
//! by the device and registered once in `init` (events before DRIVER_OK are drained
//! and ignored; the activate event then processes whatever the driver queued), so a
//! driver reset and re-initialisation needs no epoll changes.
//!
//! Lock order: transport lock, then device lock. The device never takes the transport
//! lock, and the event loop takes only the device lock.

pub mod block;
pub mod common;
pub mod device;
pub mod fs;
pub mod mmio;
pub mod net;
pub mod ring;
pub mod rng;
pub mod vsock;

pub use common::{ActiveQueues, DeviceEvent, VirtioCommon};
pub use device::{Interrupt, InterruptKind, VirtioDevice};
pub use mmio::{MMIO_WINDOW_SIZE, MmioError, MmioTransport, QUEUE_NOTIFY_OFFSET};

#[cfg(test)]
mod mmio_tests;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod test_utils;
