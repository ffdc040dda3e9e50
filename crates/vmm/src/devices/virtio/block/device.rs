//! The virtio-blk device model: one request queue, served on the VMM thread.

use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_ID_BYTES,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::Queue;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::disk::{BlockConfig, Disk, DiskError};
use super::overlay::OverlayError;
use super::request::{RequestContext, handle_chain};
use crate::devices::virtio::device::{
    ActivateError, Interrupt, VIRTIO_F_VERSION_1, VirtioDevice, read_config_bytes,
};
use crate::devices::virtio::ring::drain_queue;
use crate::memory::GuestMemory;
use crate::snapshot::{DeviceStateError, Persist};

/// Queue size offered to the driver.
pub const QUEUE_SIZE: u16 = 256;
/// Segments per request we tell the driver it may use (VIRTIO_BLK_F_SEG_MAX). Without
/// it Linux sends one segment per request.
const SEG_MAX: u32 = 128;
/// Event-manager token for the activate eventfd (queue eventfds use their index).
const ACTIVATE_TOKEN: u32 = u32::MAX;

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("creating an eventfd for the block device: {0}")]
    EventFd(#[source] std::io::Error),
}

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queue: Queue,
    /// Set when the queue could not be accessed; the device ignores it until reset.
    broken: bool,
}

/// A virtio-blk device.
pub struct Block {
    base: std::path::PathBuf,
    disk: Disk,
    read_only: bool,
    disk_id: [u8; VIRTIO_BLK_ID_BYTES as usize],
    avail_features: u64,
    acked_features: u64,
    /// `struct virtio_blk_config` up to seg_max: capacity (sectors, u64), size_max
    /// (u32, unused), seg_max (u32).
    config: [u8; 16],
    queue_evts: Vec<EventFd>,
    activate_evt: EventFd,
    active: Option<Active>,
    bounce: Vec<u8>,
}

impl Block {
    pub fn new(cfg: BlockConfig) -> Result<Block, BlockError> {
        let disk = Disk::open(&cfg)?;
        let read_only = cfg.read_only || cfg.overlay.is_none();
        let mut avail_features = VIRTIO_F_VERSION_1
            | (1 << VIRTIO_BLK_F_FLUSH)
            | (1 << VIRTIO_BLK_F_SEG_MAX)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX);
        if read_only {
            avail_features |= 1 << VIRTIO_BLK_F_RO;
        }
        let mut config = [0u8; 16];
        config[0..8].copy_from_slice(&(disk.capacity() / super::SECTOR_SIZE).to_le_bytes());
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        let new_evt = || EventFd::new(EFD_NONBLOCK).map_err(BlockError::EventFd);
        Ok(Block {
            base: cfg.base.clone(),
            disk_id: disk_id(&cfg),
            disk,
            read_only,
            avail_features,
            acked_features: 0,
            config,
            queue_evts: vec![new_evt()?],
            activate_evt: new_evt()?,
            active: None,
            bounce: Vec::new(),
        })
    }

    /// Capacity in bytes as the guest sees it.
    pub fn capacity(&self) -> u64 {
        self.disk.capacity()
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Serve every pending request. Runs on the VMM thread.
    pub fn process_queue(&mut self) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        if active.broken {
            return;
        }
        let mut ctx = RequestContext {
            disk: &mut self.disk,
            read_only: self.read_only,
            disk_id: &self.disk_id,
            bounce: &mut self.bounce,
        };
        let mem = &active.mem;
        let result = drain_queue(&mut active.queue, mem, &active.interrupt, |chain| {
            handle_chain(&mut ctx, mem, chain)
        });
        if let Err(e) = result {
            crate::log_error!("virtio-blk: disabling the request queue: {e}");
            active.broken = true;
        }
    }
}

/// A block device in a snapshot: its files, not their content (layers are immutable and
/// the top is flushed at the save).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockState {
    pub base: std::path::PathBuf,
    /// Immutable layers, oldest first.
    pub layers: Vec<std::path::PathBuf>,
    /// The writable top at the save; `None` for a read-only disk, or when the save froze
    /// the top into `layers` (a restore then brings its own top).
    pub top: Option<std::path::PathBuf>,
    /// Whether the guest sees a writable disk.
    pub writable: bool,
    /// Capacity in bytes as the guest knows it.
    pub capacity: u64,
}

impl Block {
    /// Before a save: make every completed write durable and the top's bitmap current.
    pub fn prepare_save(&mut self) -> std::io::Result<()> {
        self.disk.flush()
    }

    /// Freezes the writable top into an immutable layer and continues on a new empty top
    /// at `new_top` (O(1), overlay.rs). Returns the frozen layer's path.
    pub fn freeze_top(
        &mut self,
        new_top: &std::path::Path,
    ) -> Result<std::path::PathBuf, OverlayError> {
        match self.disk.overlay_mut() {
            Some(o) if !self.read_only => o.freeze_top(new_top),
            _ => Err(OverlayError::NoTop),
        }
    }
}

/// What a restore changes in the saved disk.
#[derive(Debug, Clone, Default)]
pub struct BlockOverrides {
    /// A new writable top (`overrides.disk_overlay`).
    pub top: Option<std::path::PathBuf>,
    /// The saved layers' new paths (`overrides.disk_layers`), one for each.
    pub layers: Option<Vec<std::path::PathBuf>>,
}

impl Persist for Block {
    type State = BlockState;
    type Args = BlockOverrides;
    type Error = DeviceStateError;

    fn save(&self) -> BlockState {
        let (layers, top) = match &self.disk {
            Disk::Base { .. } => (Vec::new(), None),
            Disk::Overlay(o) => (
                o.layer_paths(),
                o.top_path()
                    .filter(|_| !self.read_only)
                    .map(|p| p.to_path_buf()),
            ),
        };
        BlockState {
            base: self.base.clone(),
            layers,
            top,
            writable: !self.read_only,
            capacity: self.capacity(),
        }
    }

    /// With a new top, a saved top that was not frozen becomes a read-only layer under
    /// it (its flock keeps it from being written while this VM reads it).
    /// Moved layers must be as many as saved: a layer dropped or added would change what
    /// the guest reads under its own filesystem.
    fn restore(o: BlockOverrides, s: &BlockState) -> Result<Self, DeviceStateError> {
        let err = |reason: String| DeviceStateError::new("virtio-blk", reason);
        let new_top = o.top;
        let mut layers = match o.layers {
            Some(moved) if moved.len() != s.layers.len() => {
                return Err(err(format!(
                    "the snapshot's disk has {} layer(s), the restore names {}",
                    s.layers.len(),
                    moved.len()
                )));
            }
            Some(moved) => moved,
            None => s.layers.clone(),
        };
        let top = match (s.writable, new_top, &s.top) {
            (false, _, _) => None,
            (true, Some(new), old) => {
                layers.extend(old.iter().cloned());
                Some(new)
            }
            (true, None, Some(old)) => Some(old.clone()),
            (true, None, None) => {
                return Err(err(
                    "the snapshot froze the disk's top layer: a restore needs its own writable \
                     top layer (overrides.disk_overlay / --disk-overlay)"
                        .into(),
                ));
            }
        };
        let block = Block::new(BlockConfig {
            base: s.base.clone(),
            overlay: top,
            layers,
            read_only: !s.writable,
        })
        .map_err(|e| err(e.to_string()))?;
        if block.capacity() != s.capacity {
            return Err(err(format!(
                "the disk has {} bytes now, {} at the save",
                block.capacity(),
                s.capacity
            )));
        }
        Ok(block)
    }
}

/// GET_ID answer: the base image's file name, truncated or zero-padded to 20 bytes.
fn disk_id(cfg: &BlockConfig) -> [u8; VIRTIO_BLK_ID_BYTES as usize] {
    let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
    let name = cfg
        .base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bytes = name.as_bytes();
    let n = bytes.len().min(id.len());
    id[..n].copy_from_slice(&bytes[..n]);
    id
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn acked_features(&self) -> u64 {
        self.acked_features
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
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
        let queue = queues.remove(0);
        self.activate_evt
            .write(1)
            .map_err(ActivateError::ActivateEvent)?;
        self.active = Some(Active {
            mem,
            interrupt,
            queue,
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

impl MutEventSubscriber for Block {
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
                crate::log_error!("virtio-blk: registering eventfd {} failed: {e}", ev.fd());
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        // Reading resets the eventfd counter; EAGAIN (already reset) is harmless.
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
