//! Snapshot state of the block device: which files make up the disk, never their
//! content. Saving flushes the top layer (and may freeze it into an immutable layer, O(1));
//! a restore opens the same files again, or moved copies of the layers under a new top.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::device::Block;
use super::disk::{BlockConfig, Disk};
use super::overlay::OverlayError;
use crate::snapshot::{DeviceStateError, Persist};

/// A block device in a snapshot: its files, not their content (layers are immutable and
/// the top is flushed at the save).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    pub base: PathBuf,
    /// Immutable layers, oldest first.
    pub layers: Vec<PathBuf>,
    /// The writable top at the save; `None` for a read-only disk, or when the save froze
    /// the top into `layers` (a restore then brings its own top).
    pub top: Option<PathBuf>,
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
    pub fn freeze_top(&mut self, new_top: &Path) -> Result<PathBuf, OverlayError> {
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
    pub top: Option<PathBuf>,
    /// The saved layers' new paths (`overrides.disk_layers`), one for each.
    pub layers: Option<Vec<PathBuf>>,
    /// The base image's new path (`overrides.disk_base`); its size must be the saved one.
    pub base: Option<PathBuf>,
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
            base: o.base.unwrap_or_else(|| s.base.clone()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The state files' format must not change: these bytes were written by the code
    /// before the devices shared `VirtioCommon`.
    #[test]
    fn a_state_saved_by_earlier_versions_still_loads() {
        let saved = "112f696d616765732f626173652e65787434020e2f736e61702f6c302e73636f766c0e2f736e\
                     61702f6c312e73636f766c010e2f72756e2f746f702e73636f766c018080808004";
        let saved = crate::devices::virtio::test_utils::unhex(saved);
        let want = BlockState {
            base: "/images/base.ext4".into(),
            layers: vec!["/snap/l0.scovl".into(), "/snap/l1.scovl".into()],
            top: Some("/run/top.scovl".into()),
            writable: true,
            capacity: 1 << 30,
        };
        let state: BlockState = postcard::from_bytes(&saved).expect("decodes");
        assert_eq!(state, want);
        assert_eq!(postcard::to_allocvec(&want).expect("encodes"), saved);
    }
}
