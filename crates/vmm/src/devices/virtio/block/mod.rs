//! virtio-blk: a raw base image, read-only, under an optional copy-on-write overlay.

mod device;
mod disk;
pub mod overlay;
mod request;

pub use device::{Block, BlockError, QUEUE_SIZE};
pub use disk::{BlockConfig, Disk, DiskError, SECTOR_SIZE};

#[cfg(test)]
mod tests;
