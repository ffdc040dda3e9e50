//! Helpers shared by the devices for consuming a virtqueue.

use virtio_queue::{DescriptorChain, Queue, QueueT};

use super::device::{Interrupt, InterruptKind};
use crate::memory::GuestMemory;

/// Why a queue could not be serviced; the device stops using the queue until reset.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("virtqueue access failed: {0}")]
    Queue(#[from] virtio_queue::Error),
    #[error("signalling the interrupt eventfd failed: {0}")]
    Interrupt(#[source] std::io::Error),
}

/// Pop every available chain, hand it to `handle` (which returns the number of bytes it
/// wrote into the chain), return it to the driver, then interrupt the driver if it asked
/// for it. Notifications are suppressed while draining and re-enabled at the end; if
/// the driver added buffers meanwhile, drain again.
///
/// A round that pops nothing ends the loop even if the ring claims more entries: a
/// corrupt avail index would otherwise spin the VMM thread forever.
pub fn drain_queue<F>(
    queue: &mut Queue,
    mem: &GuestMemory,
    interrupt: &Interrupt,
    mut handle: F,
) -> Result<(), RingError>
where
    F: FnMut(DescriptorChain<&GuestMemory>) -> u32,
{
    let mut used = false;
    loop {
        queue.disable_notification(mem)?;
        let mut popped = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            popped = true;
            let head = chain.head_index();
            let len = handle(chain);
            queue.add_used(mem, head, len)?;
            used = true;
        }
        if !queue.enable_notification(mem)? || !popped {
            break;
        }
    }
    if used {
        signal_used(queue, mem, interrupt)?;
    }
    Ok(())
}

/// Interrupt the driver after used-ring updates, unless it suppressed interrupts.
pub fn signal_used(
    queue: &mut Queue,
    mem: &GuestMemory,
    interrupt: &Interrupt,
) -> Result<(), RingError> {
    if queue.needs_notification(mem)? {
        interrupt
            .trigger(InterruptKind::Vring)
            .map_err(RingError::Interrupt)?;
    }
    Ok(())
}

/// Pop the next chain. When the ring looks empty, re-arm driver notifications (with
/// VIRTIO_RING_F_EVENT_IDX this publishes `avail_event`, without which the driver
/// would never kick again) and look once more, so a buffer added in between is not
/// missed. Devices that pull buffers on demand (vsock) use this instead of
/// [`drain_queue`].
pub fn pop_or_arm<'m>(
    queue: &mut Queue,
    mem: &'m GuestMemory,
) -> Result<Option<DescriptorChain<&'m GuestMemory>>, RingError> {
    if let Some(chain) = queue.pop_descriptor_chain(mem) {
        return Ok(Some(chain));
    }
    if queue.enable_notification(mem)? {
        return Ok(queue.pop_descriptor_chain(mem));
    }
    Ok(None)
}
