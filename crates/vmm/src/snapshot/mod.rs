//! Snapshots: saving a VM into a state file plus a memory image, and what a restore
//! reads back.
//!
//! - [`file`]: the state file container (magic, version, postcard body, CRC-64, size cap).
//! - [`state`]: [`MicrovmState`], everything in the body.
//! - [`memory`]: memory images (write out, map copy-on-write, freeze in place for forks).
//! - [`save`]: the save sequence on a running `Vmm` (the restore sequence is in
//!   builder::restore, the one place that wires a VM).
//!
//! Every stateful part implements [`Persist`] next to its type: a plain serde state
//! struct, and a restore that takes the live resources (fds, guest memory, paths) as
//! arguments and re-validates the state, since a state file is input from outside the
//! process.

pub mod file;
pub mod memory;
pub mod save;
pub mod state;

pub use state::MicrovmState;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Save/restore of one stateful part.
pub trait Persist: Sized {
    /// The saved state: plain data, no fds.
    type State: Serialize + DeserializeOwned;
    /// What a restore needs besides the state (live resources).
    type Args;
    type Error;

    fn save(&self) -> Self::State;
    fn restore(args: Self::Args, state: &Self::State) -> Result<Self, Self::Error>;
}

/// A device state that cannot be restored.
#[derive(Debug, thiserror::Error)]
#[error("restoring the {device} device: {reason}")]
pub struct DeviceStateError {
    pub device: &'static str,
    pub reason: String,
}

impl DeviceStateError {
    pub fn new(device: &'static str, reason: impl Into<String>) -> DeviceStateError {
        DeviceStateError {
            device,
            reason: reason.into(),
        }
    }
}
