//! virtio-rng (entropy device): fills the guest's buffers from the host's getrandom.

mod device;
mod persist;

pub use device::{MAX_BYTES_PER_REQUEST, QUEUE_SIZE, Rng, RngError};
pub use persist::RngState;

#[cfg(test)]
mod tests;
