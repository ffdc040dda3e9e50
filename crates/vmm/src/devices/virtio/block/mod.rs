//! virtio-blk: a raw base image, read-only, under optional copy-on-write layers.

mod device;
mod disk;
mod layer_index;
pub mod overlay;
mod persist;
mod request;

pub use device::{Block, BlockError, QUEUE_SIZE};
pub use disk::{BlockConfig, Disk, DiskError, SECTOR_SIZE};
pub use persist::{BlockOverrides, BlockState};

#[cfg(test)]
mod layer_tests;
#[cfg(test)]
mod tests;
