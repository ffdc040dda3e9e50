//! The virtio-blk device model: one request queue, served on the VMM thread.

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_ID_BYTES,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

use super::disk::{BlockConfig, Disk, DiskError};
use super::request::{RequestContext, handle_chain};
use crate::devices::virtio::common::{VirtioCommon, serve_on_every_event, virtio_common_accessors};
use crate::devices::virtio::device::{VIRTIO_F_VERSION_1, VirtioDevice};

/// Queue size offered to the driver.
pub const QUEUE_SIZE: u16 = 256;
/// Segments per request we tell the driver it may use (VIRTIO_BLK_F_SEG_MAX). Without
/// it Linux sends one segment per request.
const SEG_MAX: u32 = 128;
/// The request queue, the only one.
const REQUEST_QUEUE: usize = 0;

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("creating an eventfd for the block device: {0}")]
    EventFd(#[source] std::io::Error),
}

/// A virtio-blk device.
pub struct Block {
    common: VirtioCommon,
    /// The base image's path, for the snapshot (persist.rs).
    pub(super) base: std::path::PathBuf,
    pub(super) disk: Disk,
    pub(super) read_only: bool,
    disk_id: [u8; VIRTIO_BLK_ID_BYTES as usize],
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
        // `struct virtio_blk_config` up to seg_max: capacity (sectors, u64), size_max
        // (u32, unused), seg_max (u32).
        let mut config = vec![0u8; 16];
        config[0..8].copy_from_slice(&(disk.capacity() / super::SECTOR_SIZE).to_le_bytes());
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        Ok(Block {
            common: VirtioCommon::new(
                "virtio-blk",
                VIRTIO_ID_BLOCK,
                avail_features,
                config,
                &[QUEUE_SIZE],
            )
            .map_err(BlockError::EventFd)?,
            base: cfg.base.clone(),
            disk_id: disk_id(&cfg),
            disk,
            read_only,
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
        let Some(active) = self.common.running() else {
            return;
        };
        let mut ctx = RequestContext {
            disk: &mut self.disk,
            read_only: self.read_only,
            disk_id: &self.disk_id,
            bounce: &mut self.bounce,
        };
        let result = active.drain(REQUEST_QUEUE, |mem, chain| {
            handle_chain(&mut ctx, mem, chain)
        });
        if let Err(e) = result {
            self.common.fail("request queue", &e);
        }
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
    virtio_common_accessors!();
}

serve_on_every_event!(Block, process_queue);
