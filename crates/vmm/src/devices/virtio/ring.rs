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

/// At most this many chains are handled in one pass over a queue. A legitimate driver
/// never has more than a queue's size (256 here) outstanding, and the pass is continued
/// on the next turn of the event loop. The bound matters for a hostile one: a guest can
/// lay the used ring over the avail ring's index (or point a buffer we fill at it), so
/// that every chain we return makes the ring claim more; without a bound, the VMM
/// thread would spin there and never serve its control socket or other devices again.
/// Found by the `mmio_restore` fuzz target.
pub const CHAINS_PER_PASS: usize = 1024;

/// How a pass over a queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The ring is empty (or claims entries it does not have): wait for a notification.
    Done,
    /// [`CHAINS_PER_PASS`] chains were handled and more may wait: serve the queue again
    /// on the next turn of the event loop.
    BudgetSpent,
}

/// Pop available chains, hand each to `handle` (which returns the number of bytes it
/// wrote into the chain), return it to the driver, then interrupt the driver if it asked
/// for it. Notifications are suppressed while draining and re-enabled at the end; if
/// the driver added buffers meanwhile, drain again, up to [`CHAINS_PER_PASS`] chains.
///
/// A round that pops nothing ends the loop even if the ring claims more entries: a
/// corrupt avail index would otherwise spin the VMM thread forever.
pub fn drain_queue<F>(
    queue: &mut Queue,
    mem: &GuestMemory,
    interrupt: &Interrupt,
    mut handle: F,
) -> Result<Pass, RingError>
where
    F: FnMut(DescriptorChain<&GuestMemory>) -> u32,
{
    let mut handled = 0;
    let pass = 'pass: loop {
        queue.disable_notification(mem)?;
        let mut popped = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            popped = true;
            let head = chain.head_index();
            let len = handle(chain);
            queue.add_used(mem, head, len)?;
            handled += 1;
            if handled == CHAINS_PER_PASS {
                // Notifications stay disabled: the device serves this queue again itself.
                break 'pass Pass::BudgetSpent;
            }
        }
        if !queue.enable_notification(mem)? || !popped {
            break Pass::Done;
        }
    };
    if handled > 0 {
        signal_used(queue, mem, interrupt)?;
    }
    Ok(pass)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use virtio_queue::desc::{RawDescriptor, split::Descriptor};
    use virtio_queue::mock::DescriptorTable;
    use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

    use super::*;
    use crate::devices::virtio::device::Interrupt;
    use crate::devices::virtio::test_utils::{DATA_BASE, guest_memory, ring_addr, write_mem};

    /// A driver that lays its used ring over its avail ring, with the device's used index
    /// ahead of its avail position: every chain the device returns bumps the avail index
    /// too, so the ring never runs empty. (A vCPU rewriting the avail index as fast as
    /// the device returns chains does the same.) The pass stops at the budget.
    #[test]
    fn a_ring_that_never_runs_empty_is_served_a_budget_at_a_time() {
        let mem = guest_memory();
        let (desc, rings) = (ring_addr(0), ring_addr(1));
        write_mem(&mem, rings.0, &[0u8; 64]);
        DescriptorTable::new(&mem, desc, 16)
            .store(0, RawDescriptor::from(Descriptor::new(DATA_BASE, 16, 0, 0)))
            .unwrap();
        write_mem(&mem, rings.0 + 2, &1u16.to_le_bytes()); // avail idx: one chain

        let mut queue = Queue::new(16).unwrap();
        queue.set_size(16);
        queue.set_desc_table_address(Some(desc.0 as u32), Some(0));
        queue.set_avail_ring_address(Some(rings.0 as u32), Some(0));
        queue.set_used_ring_address(Some(rings.0 as u32), Some(0));
        queue.set_next_used(4);
        queue.set_ready(true);
        assert!(queue.is_valid(&mem));

        let interrupt = Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let mut served = 0;
        let pass = drain_queue(&mut queue, &mem, &interrupt, |_| {
            served += 1;
            0
        })
        .unwrap();
        assert_eq!(pass, Pass::BudgetSpent);
        assert_eq!(served, CHAINS_PER_PASS);
        // The ring still claims chains: the next pass (the requeued kick) serves more.
        assert!(queue.pop_descriptor_chain(&mem).is_some());
    }
}
