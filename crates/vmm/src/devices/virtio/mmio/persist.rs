//! Snapshot state of a virtio-mmio transport: the register file the driver programmed
//! and, for an activated device, the position of each queue (the rings themselves live
//! in guest memory and come back with it).
//!
//! Restore rebuilds the queues from the saved registers with the same validation as a
//! live DRIVER_OK, sets their positions, and activates the device again: the device's
//! activate event then processes whatever the driver queued around the snapshot, which
//! re-delivers notifications lost at the save.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_DRIVER_OK;
use virtio_queue::QueueT;
use vmm_sys_util::eventfd::EventFd;

use super::{MmioTransport, QueueRegs};
use crate::devices::virtio::device::{VirtioDevice, lock};
use crate::memory::GuestMemory;
use crate::snapshot::{DeviceStateError, Persist};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRegsState {
    pub size: u32,
    pub ready: bool,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// Where the device is in one ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueProgress {
    pub next_avail: u16,
    pub next_used: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioState {
    pub device_type: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub driver_features: u64,
    pub acked_features: u64,
    pub queue_sel: u32,
    pub status: u32,
    pub config_generation: u32,
    pub interrupt_status: u32,
    pub queues: Vec<QueueRegsState>,
    /// The activated device's queue positions; `None` if it was not activated.
    pub activated: Option<Vec<QueueProgress>>,
}

impl Persist for MmioTransport {
    type State = MmioState;
    type Args = (GuestMemory, Arc<Mutex<dyn VirtioDevice>>, EventFd);
    type Error = DeviceStateError;

    fn save(&self) -> MmioState {
        let dev = lock(&self.device);
        MmioState {
            device_type: dev.device_type(),
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            acked_features: dev.acked_features(),
            queue_sel: self.queue_sel,
            status: self.status,
            config_generation: self.config_generation,
            interrupt_status: self.interrupt.status(),
            queues: self
                .queues
                .iter()
                .map(|q| QueueRegsState {
                    size: q.size,
                    ready: q.ready,
                    desc: q.desc,
                    avail: q.avail,
                    used: q.used,
                })
                .collect(),
            activated: dev.queues().map(|qs| {
                qs.iter()
                    .map(|q| QueueProgress {
                        next_avail: q.next_avail(),
                        next_used: q.next_used(),
                    })
                    .collect()
            }),
        }
    }

    fn restore(
        (mem, device, irq_evt): Self::Args,
        s: &MmioState,
    ) -> Result<Self, DeviceStateError> {
        let err = |reason: String| DeviceStateError::new("virtio-mmio", reason);
        let mut t = MmioTransport::new(mem, device, irq_evt).map_err(|e| err(e.to_string()))?;
        {
            let dev = lock(&t.device);
            if dev.device_type() != s.device_type {
                return Err(err(format!(
                    "saved for device type {}, restored onto type {}",
                    s.device_type,
                    dev.device_type()
                )));
            }
            if s.acked_features & !dev.avail_features() != 0 {
                return Err(err(format!(
                    "acked features {:#x} were never offered",
                    s.acked_features
                )));
            }
        }
        if s.queues.len() != t.queue_max.len() {
            return Err(err(format!(
                "{} queues saved, the device has {}",
                s.queues.len(),
                t.queue_max.len()
            )));
        }
        let driver_ok = s.status & VIRTIO_CONFIG_S_DRIVER_OK != 0;
        if driver_ok != s.activated.is_some() {
            return Err(err("DRIVER_OK and the activation state disagree".into()));
        }
        lock(&t.device).set_acked_features(s.acked_features);
        t.device_features_sel = s.device_features_sel;
        t.driver_features_sel = s.driver_features_sel;
        t.driver_features = s.driver_features;
        t.queue_sel = s.queue_sel;
        t.status = s.status;
        t.config_generation = s.config_generation;
        t.queues = s
            .queues
            .iter()
            .map(|q| QueueRegs {
                size: q.size,
                ready: q.ready,
                desc: q.desc,
                avail: q.avail,
                used: q.used,
            })
            .collect();
        if let Some(progress) = &s.activated {
            if progress.len() != t.queues.len() {
                return Err(err(format!(
                    "{} queue positions for {} queues",
                    progress.len(),
                    t.queues.len()
                )));
            }
            let mut queues = t.build_queues().map_err(|e| err(e.to_string()))?;
            for (q, p) in queues.iter_mut().zip(progress) {
                q.set_next_avail(p.next_avail);
                q.set_next_used(p.next_used);
            }
            lock(&t.device)
                .activate(t.mem.clone(), t.interrupt.clone(), queues)
                .map_err(|e| err(e.to_string()))?;
        }
        t.interrupt.restore_status(s.interrupt_status);
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state files' format must not change: these bytes were written by the code
    /// before the devices shared `VirtioCommon`.
    #[test]
    fn a_state_saved_by_earlier_versions_still_loads() {
        let saved = crate::devices::virtio::test_utils::unhex(
            "02010180808080138080808013000f00010180020180208040806001011110",
        );
        let want = MmioState {
            device_type: 2,
            device_features_sel: 1,
            driver_features_sel: 1,
            driver_features: 0x1_3000_0000,
            acked_features: 0x1_3000_0000,
            queue_sel: 0,
            status: 15,
            config_generation: 0,
            interrupt_status: 1,
            queues: vec![QueueRegsState {
                size: 256,
                ready: true,
                desc: 0x1000,
                avail: 0x2000,
                used: 0x3000,
            }],
            activated: Some(vec![QueueProgress {
                next_avail: 17,
                next_used: 16,
            }]),
        };
        let state: MmioState = postcard::from_bytes(&saved).expect("decodes");
        assert_eq!(state, want);
        assert_eq!(postcard::to_allocvec(&want).expect("encodes"), saved);
    }
}
