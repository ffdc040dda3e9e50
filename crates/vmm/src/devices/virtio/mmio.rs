//! The virtio-mmio transport, version 2 ("modern"), virtio 1.2 spec §4.2.2.
//!
//! One [`MmioTransport`] per device, on a 4 KiB window of the MMIO bus. It holds the
//! register file the driver programs (feature windows, per-queue configuration, status)
//! and turns it into validated `virtio_queue::Queue`s when the driver sets DRIVER_OK.
//! Register writes that the spec forbids in the current state are ignored; queue
//! parameters are checked only at activation, where a bad one fails activation (the
//! device then reports DEVICE_NEEDS_RESET) instead of reaching the device.

use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use super::device::{Interrupt, InterruptKind, VIRTIO_F_VERSION_1, VirtioDevice, lock};
use crate::bus::BusDevice;
use crate::memory::GuestMemory;

mod persist;
pub use persist::{MmioState, QueueProgress, QueueRegsState};

/// Size of the MMIO window of one device (the `4K` of `virtio_mmio.device=4K@...`).
pub const MMIO_WINDOW_SIZE: u64 = 0x1000;
/// Offset of the QueueNotify register, for KVM ioeventfds (datamatch = queue index).
pub const QUEUE_NOTIFY_OFFSET: u64 = 0x50;

const MAGIC_VALUE: u32 = 0x7472_6976; // "virt", little endian
const MMIO_VERSION: u32 = 2;
/// Our PCI-style vendor ID, informative only ("SCEL").
const VENDOR_ID: u32 = 0x4c45_4353;
const CONFIG_SPACE_OFFSET: u64 = 0x100;

// Register offsets (virtio 1.2 §4.2.2, table "MMIO Device Register Layout").
const REG_MAGIC: u64 = 0x00;
const REG_VERSION: u64 = 0x04;
const REG_DEVICE_ID: u64 = 0x08;
const REG_VENDOR_ID: u64 = 0x0c;
const REG_DEVICE_FEATURES: u64 = 0x10;
const REG_DEVICE_FEATURES_SEL: u64 = 0x14;
const REG_DRIVER_FEATURES: u64 = 0x20;
const REG_DRIVER_FEATURES_SEL: u64 = 0x24;
const REG_QUEUE_SEL: u64 = 0x30;
const REG_QUEUE_NUM_MAX: u64 = 0x34;
const REG_QUEUE_NUM: u64 = 0x38;
const REG_QUEUE_READY: u64 = 0x44;
const REG_QUEUE_NOTIFY: u64 = QUEUE_NOTIFY_OFFSET;
const REG_INTERRUPT_STATUS: u64 = 0x60;
const REG_INTERRUPT_ACK: u64 = 0x64;
const REG_STATUS: u64 = 0x70;
const REG_QUEUE_DESC_LOW: u64 = 0x80;
const REG_QUEUE_DESC_HIGH: u64 = 0x84;
const REG_QUEUE_AVAIL_LOW: u64 = 0x90;
const REG_QUEUE_AVAIL_HIGH: u64 = 0x94;
const REG_QUEUE_USED_LOW: u64 = 0xa0;
const REG_QUEUE_USED_HIGH: u64 = 0xa4;
const REG_SHM_SEL: u64 = 0xac;
const REG_SHM_LEN_LOW: u64 = 0xb0;
const REG_SHM_LEN_HIGH: u64 = 0xb4;
const REG_SHM_BASE_LOW: u64 = 0xb8;
const REG_SHM_BASE_HIGH: u64 = 0xbc;
const REG_CONFIG_GENERATION: u64 = 0xfc;

#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    #[error("device declares {0} queues; virtio-mmio devices need 1..=64")]
    QueueCount(usize),
    #[error("device declares {events} queue eventfds for {queues} queues")]
    QueueEventCount { queues: usize, events: usize },
    #[error("duplicating the eventfd of queue {index} failed: {source}")]
    CloneQueueEvent {
        index: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("device does not offer VIRTIO_F_VERSION_1 (required by virtio-mmio v2)")]
    NoVersion1,
}

/// Why the transport refused DRIVER_OK. Kept for diagnostics (`last_activation_error`).
#[derive(Debug, thiserror::Error)]
pub enum QueueSetupError {
    #[error("queue {index}: size {size} is not a power of two in 1..={max}")]
    Size { index: usize, size: u32, max: u16 },
    #[error("queue {index}: {what} address {addr:#x} is misaligned")]
    Align {
        index: usize,
        what: &'static str,
        addr: u64,
    },
    #[error("queue {index}: rings are not inside guest memory")]
    OutsideMemory { index: usize },
    #[error("device activation failed: {0}")]
    Device(#[from] super::device::ActivateError),
}

/// What the driver wrote for one queue; turned into a `Queue` at activation.
#[derive(Debug, Clone, Default)]
struct QueueRegs {
    size: u32,
    ready: bool,
    desc: u64,
    avail: u64,
    used: u64,
}

/// The virtio-mmio v2 register file of one device.
pub struct MmioTransport {
    mem: GuestMemory,
    device: Arc<Mutex<dyn VirtioDevice>>,
    interrupt: Arc<Interrupt>,
    /// Duplicates of the device's queue eventfds, signalled on QueueNotify writes.
    queue_evts: Vec<EventFd>,
    queue_max: Vec<u16>,
    queues: Vec<QueueRegs>,
    device_features_sel: u32,
    driver_features_sel: u32,
    /// Features the driver wrote so far; handed to the device on FEATURES_OK.
    driver_features: u64,
    queue_sel: u32,
    status: u32,
    config_generation: u32,
    last_activation_error: Option<QueueSetupError>,
}

impl MmioTransport {
    /// Wrap `device`. `irq_evt` is the eventfd vmm-core registers as irqfd for this
    /// device's GSI.
    pub fn new(
        mem: GuestMemory,
        device: Arc<Mutex<dyn VirtioDevice>>,
        irq_evt: EventFd,
    ) -> Result<MmioTransport, MmioError> {
        let (queue_max, queue_evts) = {
            let dev = lock(&device);
            let queue_max = dev.queue_max_sizes().to_vec();
            if queue_max.is_empty() || queue_max.len() > 64 {
                return Err(MmioError::QueueCount(queue_max.len()));
            }
            if dev.queue_events().len() != queue_max.len() {
                return Err(MmioError::QueueEventCount {
                    queues: queue_max.len(),
                    events: dev.queue_events().len(),
                });
            }
            if dev.avail_features() & VIRTIO_F_VERSION_1 == 0 {
                return Err(MmioError::NoVersion1);
            }
            let evts = dev
                .queue_events()
                .iter()
                .enumerate()
                .map(|(index, e)| {
                    e.try_clone()
                        .map_err(|source| MmioError::CloneQueueEvent { index, source })
                })
                .collect::<Result<Vec<_>, _>>()?;
            (queue_max, evts)
        };
        Ok(MmioTransport {
            mem,
            device,
            interrupt: Arc::new(Interrupt::new(irq_evt)),
            queues: vec![QueueRegs::default(); queue_max.len()],
            queue_evts,
            queue_max,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            status: 0,
            config_generation: 0,
            last_activation_error: None,
        })
    }

    /// The queue eventfds, in queue order. vmm-core may register each as a KVM ioeventfd
    /// at `base + QUEUE_NOTIFY_OFFSET`, 4 bytes, datamatch = its index; without that, the
    /// transport signals them itself on QueueNotify exits.
    pub fn queue_notify_evts(&self) -> Vec<&EventFd> {
        self.queue_evts.iter().collect()
    }

    /// The interrupt shared with the device (status bits + irqfd).
    pub fn interrupt(&self) -> &Arc<Interrupt> {
        &self.interrupt
    }

    /// Device status register as the driver last set it (plus NEEDS_RESET).
    pub fn device_status(&self) -> u32 {
        self.status
    }

    /// Why the last DRIVER_OK was refused, if it was.
    pub fn last_activation_error(&self) -> Option<&QueueSetupError> {
        self.last_activation_error.as_ref()
    }

    /// Tell the driver the config space changed (e.g. a resized disk).
    pub fn notify_config_change(&mut self) -> std::io::Result<()> {
        self.config_generation = self.config_generation.wrapping_add(1);
        self.interrupt.trigger(InterruptKind::Config)
    }

    fn selected_queue(&mut self) -> Option<&mut QueueRegs> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    fn has(&self, bit: u32) -> bool {
        self.status & bit != 0
    }

    /// Queue registers may change only between FEATURES_OK and DRIVER_OK, and only while
    /// the selected queue is not ready (virtio 1.2 §4.2.3.2).
    fn queue_config_allowed(&self) -> bool {
        self.has(VIRTIO_CONFIG_S_FEATURES_OK)
            && !self.has(VIRTIO_CONFIG_S_DRIVER_OK)
            && !self.has(VIRTIO_CONFIG_S_FAILED)
    }

    fn read_reg(&self, offset: u64) -> u32 {
        let q = self.queues.get(self.queue_sel as usize);
        match offset {
            REG_MAGIC => MAGIC_VALUE,
            REG_VERSION => MMIO_VERSION,
            REG_DEVICE_ID => lock(&self.device).device_type(),
            REG_VENDOR_ID => VENDOR_ID,
            REG_DEVICE_FEATURES => {
                let features = lock(&self.device).avail_features();
                match self.device_features_sel {
                    0 => features as u32,
                    1 => (features >> 32) as u32,
                    _ => 0,
                }
            }
            REG_QUEUE_NUM_MAX => self
                .queue_max
                .get(self.queue_sel as usize)
                .map_or(0, |&m| u32::from(m)),
            REG_QUEUE_READY => q.map_or(0, |q| u32::from(q.ready)),
            REG_INTERRUPT_STATUS => self.interrupt.status(),
            REG_STATUS => self.status,
            // No shared memory regions: a length of all ones means "absent".
            REG_SHM_LEN_LOW | REG_SHM_LEN_HIGH => u32::MAX,
            REG_SHM_BASE_LOW | REG_SHM_BASE_HIGH => u32::MAX,
            REG_CONFIG_GENERATION => self.config_generation,
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, value: u32) {
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            REG_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            REG_DRIVER_FEATURES => {
                // Features are negotiable only after DRIVER and before FEATURES_OK.
                if !self.has(VIRTIO_CONFIG_S_DRIVER) || self.has(VIRTIO_CONFIG_S_FEATURES_OK) {
                    return;
                }
                let shift = match self.driver_features_sel {
                    0 => 0,
                    1 => 32,
                    _ => return,
                };
                let mask = 0xffff_ffffu64 << shift;
                self.driver_features = (self.driver_features & !mask) | (u64::from(value) << shift);
            }
            REG_QUEUE_SEL => self.queue_sel = value,
            REG_QUEUE_NUM | REG_QUEUE_DESC_LOW | REG_QUEUE_DESC_HIGH | REG_QUEUE_AVAIL_LOW
            | REG_QUEUE_AVAIL_HIGH | REG_QUEUE_USED_LOW | REG_QUEUE_USED_HIGH => {
                if !self.queue_config_allowed() {
                    return;
                }
                let Some(q) = self.selected_queue() else {
                    return;
                };
                if q.ready {
                    return;
                }
                match offset {
                    REG_QUEUE_NUM => q.size = value,
                    REG_QUEUE_DESC_LOW => set_low(&mut q.desc, value),
                    REG_QUEUE_DESC_HIGH => set_high(&mut q.desc, value),
                    REG_QUEUE_AVAIL_LOW => set_low(&mut q.avail, value),
                    REG_QUEUE_AVAIL_HIGH => set_high(&mut q.avail, value),
                    REG_QUEUE_USED_LOW => set_low(&mut q.used, value),
                    _ => set_high(&mut q.used, value),
                }
            }
            REG_QUEUE_READY => {
                if !self.queue_config_allowed() {
                    return;
                }
                if let Some(q) = self.selected_queue() {
                    q.ready = value == 1;
                }
            }
            REG_QUEUE_NOTIFY => {
                // Without VIRTIO_F_NOTIFICATION_DATA the value is the queue index. A
                // failed eventfd write means the counter is saturated, i.e. a
                // notification is already pending: nothing is lost.
                if let Some(evt) = self.queue_evts.get(value as usize) {
                    let _ = evt.write(1);
                }
            }
            REG_INTERRUPT_ACK => self.interrupt.ack(value),
            REG_STATUS => self.write_status(value),
            REG_SHM_SEL => {}
            _ => {}
        }
    }

    /// The device status state machine (virtio 1.2 §3.1.1). Each step must keep the bits
    /// already set and add the next one; anything else is ignored, except FAILED (always
    /// accepted) and 0 (reset).
    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        if value & VIRTIO_CONFIG_S_FAILED != 0 {
            self.status |= VIRTIO_CONFIG_S_FAILED;
            return;
        }
        let old = self.status & !VIRTIO_CONFIG_S_NEEDS_RESET;
        if value & old != old {
            return; // clearing bits other than by reset
        }
        let added = value & !old;
        match (old, added) {
            (0, VIRTIO_CONFIG_S_ACKNOWLEDGE) => self.status |= added,
            (VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER) => self.status |= added,
            (s, VIRTIO_CONFIG_S_FEATURES_OK)
                if s == VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER =>
            {
                self.accept_features();
            }
            (s, VIRTIO_CONFIG_S_DRIVER_OK)
                if s == VIRTIO_CONFIG_S_ACKNOWLEDGE
                    | VIRTIO_CONFIG_S_DRIVER
                    | VIRTIO_CONFIG_S_FEATURES_OK =>
            {
                self.activate();
            }
            _ => {}
        }
    }

    /// FEATURES_OK: keep only offered bits; refuse (leave FEATURES_OK clear, which the
    /// driver reads back as failure) unless VERSION_1 was accepted.
    fn accept_features(&mut self) {
        let mut dev = lock(&self.device);
        let acked = self.driver_features & dev.avail_features();
        if acked & VIRTIO_F_VERSION_1 == 0 {
            return;
        }
        dev.set_acked_features(acked);
        self.status |= VIRTIO_CONFIG_S_FEATURES_OK;
    }

    fn activate(&mut self) {
        match self.build_queues().and_then(|queues| {
            lock(&self.device)
                .activate(self.mem.clone(), self.interrupt.clone(), queues)
                .map_err(QueueSetupError::from)
        }) {
            Ok(()) => {
                self.status |= VIRTIO_CONFIG_S_DRIVER_OK;
                self.last_activation_error = None;
            }
            Err(e) => {
                self.last_activation_error = Some(e);
                self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
                // The spec asks for a config-change interrupt with NEEDS_RESET; a full
                // irqfd counter already means an interrupt is pending.
                let _ = self.interrupt.trigger(InterruptKind::Config);
            }
        }
    }

    /// Turn the register values into queues, validating every ready queue. Queues the
    /// driver did not enable are handed over not ready; devices never pop from those.
    fn build_queues(&self) -> Result<Vec<Queue>, QueueSetupError> {
        let event_idx = lock(&self.device).acked_features()
            & (1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX)
            != 0;
        let mut out = Vec::with_capacity(self.queues.len());
        for (index, (regs, &max)) in self.queues.iter().zip(&self.queue_max).enumerate() {
            let mut q = Queue::new(max).map_err(|_| QueueSetupError::Size {
                index,
                size: u32::from(max),
                max,
            })?;
            if regs.ready {
                let size = u16::try_from(regs.size).map_err(|_| QueueSetupError::Size {
                    index,
                    size: regs.size,
                    max,
                })?;
                q.try_set_size(size).map_err(|_| QueueSetupError::Size {
                    index,
                    size: regs.size,
                    max,
                })?;
                let align = |what, addr: u64| QueueSetupError::Align { index, what, addr };
                q.try_set_desc_table_address(GuestAddress(regs.desc))
                    .map_err(|_| align("descriptor table", regs.desc))?;
                q.try_set_avail_ring_address(GuestAddress(regs.avail))
                    .map_err(|_| align("available ring", regs.avail))?;
                q.try_set_used_ring_address(GuestAddress(regs.used))
                    .map_err(|_| align("used ring", regs.used))?;
                q.set_event_idx(event_idx);
                q.set_ready(true);
                if !q.is_valid(&self.mem) {
                    return Err(QueueSetupError::OutsideMemory { index });
                }
            }
            out.push(q);
        }
        Ok(out)
    }

    fn reset(&mut self) {
        {
            let mut dev = lock(&self.device);
            dev.reset();
            dev.set_acked_features(0);
        }
        self.queues = vec![QueueRegs::default(); self.queue_max.len()];
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.queue_sel = 0;
        self.status = 0;
        self.interrupt.clear();
        self.last_activation_error = None;
    }
}

fn set_low(addr: &mut u64, value: u32) {
    *addr = (*addr & !0xffff_ffff) | u64::from(value);
}

fn set_high(addr: &mut u64, value: u32) {
    *addr = (*addr & 0xffff_ffff) | (u64::from(value) << 32);
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            if offset < MMIO_WINDOW_SIZE {
                lock(&self.device).read_config(offset - CONFIG_SPACE_OFFSET, data);
            } else {
                data.fill(0);
            }
            return;
        }
        // Registers are 32-bit and must be accessed as such (§4.2.2.2).
        if data.len() != 4 || !offset.is_multiple_of(4) {
            data.fill(0);
            return;
        }
        data.copy_from_slice(&self.read_reg(offset).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            if offset < MMIO_WINDOW_SIZE {
                lock(&self.device).write_config(offset - CONFIG_SPACE_OFFSET, data);
            }
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return;
        };
        if !offset.is_multiple_of(4) {
            return;
        }
        self.write_reg(offset, u32::from_le_bytes(bytes));
    }
}
