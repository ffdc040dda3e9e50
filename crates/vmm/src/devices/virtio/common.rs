//! What every virtio device model has in common, so that a device file holds only what
//! makes it that device (its features, config space, request handling, persistence).
//!
//! [`VirtioCommon`] keeps the feature bits, the config space, the queue eventfds, the
//! activate eventfd and the activation state ([`ActiveQueues`]: guest memory, interrupt,
//! queues, whether a queue failed). A device embeds one in a field named `common` and
//! says so with `virtio_common_accessors!`; the `VirtioDevice` trait's default methods
//! then answer the transport (type, queues, features, config space, activation, reset)
//! from it.
//!
//! The event loop side: [`VirtioCommon::register`] adds the activate eventfd, the
//! device's own extra fds and the queue eventfds in the device's
//! `MutEventSubscriber::init`; [`VirtioCommon::take_event`] turns an event's token into
//! a [`DeviceEvent`], resetting the eventfd it came from, in `process`.
//!
//! A new device therefore needs: a constructor calling [`VirtioCommon::new`], a
//! `VirtioDevice` impl of one macro call (plus `reset` if it keeps per-activation state
//! of its own), an `init`/`process` pair of a few lines (or `serve_on_every_event!` if
//! every event means "serve the queues"), and its request handling over
//! [`ActiveQueues::drain`] or [`ActiveQueues::serve`].

use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events};
use virtio_queue::{DescriptorChain, Queue};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::device::{ActivateError, Interrupt, read_config_bytes};
use super::ring::{Pass, RingError, drain_queue, signal_used};
use crate::memory::GuestMemory;

/// Event-manager token of the activate eventfd. Queue eventfds use their queue index;
/// a device's own fds use tokens that are neither.
pub const ACTIVATE_TOKEN: u32 = u32::MAX;

/// What an event-loop token stood for, its eventfd (if it was one of ours) already read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// The transport activated the device (DRIVER_OK, or a restore).
    Activate,
    /// The driver notified this queue.
    Queue(usize),
    /// A token the device registered itself (a backend fd, say).
    Other(u32),
}

/// The device's view of an activated transport: what `activate` handed over.
pub struct ActiveQueues {
    pub mem: GuestMemory,
    pub interrupt: Arc<Interrupt>,
    /// In queue order, as many as the device declared.
    pub queues: Vec<Queue>,
    /// Set when a queue could not be accessed; the device leaves its queues alone
    /// until the driver resets it.
    pub broken: bool,
    /// The queue eventfds (shared with [`VirtioCommon`]), for [`ActiveQueues::requeue`].
    kicks: Arc<[EventFd]>,
}

impl ActiveQueues {
    /// [`drain_queue`] on queue `index`: `handle` gets each chain with guest memory and
    /// returns how many bytes it wrote into it. A pass that spent its budget is continued
    /// on the next turn of the event loop ([`ActiveQueues::requeue`]).
    pub fn drain<F>(&mut self, index: usize, mut handle: F) -> Result<(), RingError>
    where
        F: FnMut(&GuestMemory, DescriptorChain<&GuestMemory>) -> u32,
    {
        let mem = &self.mem;
        let pass = drain_queue(&mut self.queues[index], mem, &self.interrupt, |chain| {
            handle(mem, chain)
        })?;
        if pass == Pass::BudgetSpent {
            self.requeue(index);
        }
        Ok(())
    }

    /// Serve queue `index` again on the next turn of the event loop, after whatever
    /// else is ready: for a pass that stopped at [`super::ring::CHAINS_PER_PASS`]. This
    /// is the driver's own notification, so the device handles it as it would a kick.
    pub fn requeue(&self, index: usize) {
        if let Some(evt) = self.kicks.get(index)
            && let Err(e) = evt.write(1)
        {
            // Only an eventfd at its counter's maximum fails, and that one is ready anyway.
            tracing::warn!("re-notifying queue {index}: {e}");
        }
    }

    /// For devices that pull buffers on demand (`ring::pop_or_arm`): `serve` works on
    /// queue `index` and returns whether it returned any chain to the driver; if so, the
    /// driver is interrupted (unless it suppressed interrupts). Nothing is signalled when
    /// `serve` fails.
    pub fn serve<F>(&mut self, index: usize, serve: F) -> Result<(), RingError>
    where
        F: FnOnce(&mut Queue, &GuestMemory) -> Result<bool, RingError>,
    {
        let queue = &mut self.queues[index];
        if serve(queue, &self.mem)? {
            signal_used(queue, &self.mem, &self.interrupt)?;
        }
        Ok(())
    }
}

/// Features, eventfds and activation state of one virtio device (see the module docs).
pub struct VirtioCommon {
    /// For log lines: "virtio-blk", "virtio-net", ...
    name: &'static str,
    device_type: u32,
    avail_features: u64,
    acked_features: u64,
    /// The device's config structure as the driver reads it; fixed once created.
    config_space: Vec<u8>,
    queue_max_sizes: Vec<u16>,
    /// One per queue, created here so that they can be registered with the event loop
    /// once and stay valid across driver resets (see `VirtioDevice`).
    queue_evts: Arc<[EventFd]>,
    /// Signalled by `activate` (a vCPU thread) so that the VMM thread starts serving.
    activate_evt: EventFd,
    active: Option<ActiveQueues>,
}

impl VirtioCommon {
    /// A device of `device_type` offering `avail_features` and `config_space`, with one
    /// queue of each size in `queue_max_sizes`. Fails only if an eventfd cannot be
    /// created.
    pub fn new(
        name: &'static str,
        device_type: u32,
        avail_features: u64,
        config_space: Vec<u8>,
        queue_max_sizes: &[u16],
    ) -> std::io::Result<VirtioCommon> {
        let queue_evts = queue_max_sizes
            .iter()
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<std::io::Result<Arc<[_]>>>()?;
        Ok(VirtioCommon {
            name,
            device_type,
            avail_features,
            acked_features: 0,
            config_space,
            queue_max_sizes: queue_max_sizes.to_vec(),
            queue_evts,
            activate_evt: EventFd::new(EFD_NONBLOCK)?,
            active: None,
        })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn device_type(&self) -> u32 {
        self.device_type
    }

    pub fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_max_sizes
    }

    pub fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    pub fn avail_features(&self) -> u64 {
        self.avail_features
    }

    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Keeps only the offered bits.
    pub fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features;
    }

    /// Read the config space at `offset`; bytes past its end read as zero.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config_space, offset, data);
    }

    /// Whether the driver acknowledged feature bit `bit`.
    pub fn has_feature(&self, bit: u32) -> bool {
        self.acked_features & (1u64 << bit) != 0
    }

    /// Takes the validated queues (one per declared queue) and wakes the VMM thread
    /// through the activate eventfd; nothing else happens on the calling vCPU thread.
    pub fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if self.active.is_some() {
            return Err(ActivateError::AlreadyActivated);
        }
        if queues.len() != self.queue_max_sizes.len() {
            return Err(ActivateError::QueueCount {
                expected: self.queue_max_sizes.len(),
                got: queues.len(),
            });
        }
        self.activate_evt
            .write(1)
            .map_err(ActivateError::ActivateEvent)?;
        self.active = Some(ActiveQueues {
            mem,
            interrupt,
            queues,
            broken: false,
            kicks: Arc::clone(&self.queue_evts),
        });
        Ok(())
    }

    /// Back to before activation (the transport clears the acked features itself).
    pub fn reset(&mut self) {
        self.active = None;
    }

    pub fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    /// The activated queues; `None` before activation.
    pub fn queues(&self) -> Option<&[Queue]> {
        self.active.as_ref().map(|a| a.queues.as_slice())
    }

    /// The activation, if there is one and no queue has failed: what request handling
    /// works on.
    pub fn running(&mut self) -> Option<&mut ActiveQueues> {
        self.active.as_mut().filter(|a| !a.broken)
    }

    /// Whether the device is activated and no queue has failed.
    pub fn is_running(&self) -> bool {
        self.active.as_ref().is_some_and(|a| !a.broken)
    }

    /// A queue failed: log it and leave the queues alone until reset.
    pub fn fail(&mut self, what: &str, e: &RingError) {
        tracing::error!(
            "{}: disabling the device after a {what} error: {e}",
            self.name
        );
        if let Some(a) = self.active.as_mut() {
            a.broken = true;
        }
    }

    /// Registers the activate eventfd, then `extra` (the device's own fds), then the
    /// queue eventfds with the event loop. Called from the device's `init`, which runs
    /// again on every resume (the device is re-added then).
    pub fn register(&self, ops: &mut EventOps, extra: &[Events]) {
        self.register_without_queues(ops, extra);
        for (i, evt) in self.queue_evts.iter().enumerate() {
            let ev = Events::with_data(evt, i as u32, EventSet::IN);
            if let Err(e) = ops.add(ev) {
                tracing::error!("{}: registering fd {} failed: {e}", self.name, ev.fd());
            }
        }
    }

    /// [`register`](Self::register) without the queue eventfds: for a device whose
    /// queues another process serves (vhost-user), which reads those eventfds itself.
    pub fn register_without_queues(&self, ops: &mut EventOps, extra: &[Events]) {
        let mut events = vec![Events::with_data(
            &self.activate_evt,
            ACTIVATE_TOKEN,
            EventSet::IN,
        )];
        events.extend_from_slice(extra);
        for ev in events {
            if let Err(e) = ops.add(ev) {
                tracing::error!("{}: registering fd {} failed: {e}", self.name, ev.fd());
            }
        }
    }

    /// What the token `data` of an event stands for. The activate or queue eventfd it
    /// names is read first, which resets its counter (EAGAIN, already reset, is
    /// harmless); level-triggered epoll would report it again otherwise.
    pub fn take_event(&self, data: u32) -> DeviceEvent {
        if data == ACTIVATE_TOKEN {
            let _ = self.activate_evt.read();
            return DeviceEvent::Activate;
        }
        match self.queue_evts.get(data as usize) {
            Some(evt) => {
                let _ = evt.read();
                DeviceEvent::Queue(data as usize)
            }
            None => DeviceEvent::Other(data),
        }
    }
}

/// Inside `impl VirtioDevice for X`: `common` and `common_mut` for a device that keeps
/// its [`VirtioCommon`] in a field named `common`.
macro_rules! virtio_common_accessors {
    () => {
        fn common(&self) -> &$crate::devices::virtio::common::VirtioCommon {
            &self.common
        }

        fn common_mut(&mut self) -> &mut $crate::devices::virtio::common::VirtioCommon {
            &mut self.common
        }
    };
}
pub(crate) use virtio_common_accessors;

/// `MutEventSubscriber` for a device (field `common`) whose every event, activation or
/// queue notification, means the same thing: call `$serve` (block, rng).
macro_rules! serve_on_every_event {
    ($device:ty, $serve:ident) => {
        impl event_manager::MutEventSubscriber for $device {
            fn init(&mut self, ops: &mut event_manager::EventOps) {
                self.common.register(ops, &[]);
            }

            fn process(&mut self, events: event_manager::Events, _: &mut event_manager::EventOps) {
                use $crate::devices::virtio::common::DeviceEvent;
                match self.common.take_event(events.data()) {
                    DeviceEvent::Activate | DeviceEvent::Queue(_) => self.$serve(),
                    DeviceEvent::Other(_) => {}
                }
            }
        }
    };
}
pub(crate) use serve_on_every_event;

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::QueueT;

    use crate::devices::virtio::test_utils::guest_memory;

    fn common() -> VirtioCommon {
        VirtioCommon::new("virtio-test", 4, 1 << 32 | 1, vec![1, 2, 3], &[16, 16])
            .expect("eventfds")
    }

    fn queues(n: usize) -> Vec<Queue> {
        (0..n)
            .map(|_| Queue::new(16).expect("a valid size"))
            .collect()
    }

    fn interrupt() -> Arc<Interrupt> {
        Arc::new(Interrupt::new(
            EventFd::new(EFD_NONBLOCK).expect("an eventfd"),
        ))
    }

    #[test]
    fn activation_wants_every_declared_queue_once_and_reset_forgets_it() {
        let mut c = common();
        let wrong = c.activate(guest_memory(), interrupt(), queues(1));
        assert!(matches!(
            wrong,
            Err(ActivateError::QueueCount {
                expected: 2,
                got: 1
            })
        ));
        assert!(!c.is_activated());
        c.activate(guest_memory(), interrupt(), queues(2))
            .expect("activates");
        assert_eq!(c.queues().map(<[Queue]>::len), Some(2));
        assert_eq!(c.take_event(ACTIVATE_TOKEN), DeviceEvent::Activate);
        let again = c.activate(guest_memory(), interrupt(), queues(2));
        assert!(matches!(again, Err(ActivateError::AlreadyActivated)));
        c.reset();
        assert!(!c.is_activated() && c.queues().is_none());
    }

    #[test]
    fn a_failed_queue_stops_service_until_reset() {
        let mut c = common();
        c.activate(guest_memory(), interrupt(), queues(2))
            .expect("activates");
        assert!(c.is_running());
        c.fail(
            "test queue",
            &RingError::Interrupt(std::io::Error::other("x")),
        );
        assert!(c.is_activated() && !c.is_running() && c.running().is_none());
        c.reset();
        c.activate(guest_memory(), interrupt(), queues(2))
            .expect("activates");
        assert!(c.is_running());
    }

    #[test]
    fn tokens_name_the_activation_a_queue_or_the_device_own_fds() {
        let c = common();
        c.queue_events()[1].write(1).expect("eventfd write");
        assert_eq!(c.take_event(1), DeviceEvent::Queue(1));
        assert!(c.queue_events()[1].read().is_err(), "the eventfd was read");
        assert_eq!(c.take_event(2), DeviceEvent::Other(2));
        assert_eq!(
            c.take_event(ACTIVATE_TOKEN - 1),
            DeviceEvent::Other(ACTIVATE_TOKEN - 1)
        );
    }

    #[test]
    fn requeue_notifies_the_queue_again_for_the_next_turn_of_the_loop() {
        let mut c = common();
        c.activate(guest_memory(), interrupt(), queues(2))
            .expect("activates");
        assert!(c.queue_events()[1].read().is_err(), "no kick yet");
        c.running().expect("running").requeue(1);
        assert_eq!(c.take_event(1), DeviceEvent::Queue(1));
        assert!(c.queue_events()[0].read().is_err(), "only that queue");
    }

    #[test]
    fn features_are_masked_to_the_offer_and_config_reads_zero_past_its_end() {
        let mut c = common();
        c.set_acked_features(u64::MAX);
        assert_eq!(c.acked_features(), 1 << 32 | 1);
        assert!(c.has_feature(32) && !c.has_feature(1));
        let mut data = [0xff; 4];
        c.read_config(1, &mut data);
        assert_eq!(data, [2, 3, 0, 0]);
    }
}
