//! Snapshot state of the rng device: nothing of its own (its queue is in the
//! transport's state).

use serde::{Deserialize, Serialize};

use super::device::Rng;
use crate::snapshot::{DeviceStateError, Persist};

/// virtio-rng has no state of its own (its queue is in the transport's state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {}

impl Persist for Rng {
    type State = RngState;
    type Args = ();
    type Error = DeviceStateError;

    fn save(&self) -> RngState {
        RngState {}
    }

    fn restore(_: (), _: &RngState) -> Result<Self, DeviceStateError> {
        Rng::new().map_err(|e| DeviceStateError::new("virtio-rng", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state files' format must not change: these bytes were written by the code
    /// before the devices shared `VirtioCommon`.
    #[test]
    fn a_state_saved_by_earlier_versions_still_loads() {
        let saved: &[u8] = &[];
        let state: RngState = postcard::from_bytes(saved).expect("decodes");
        assert_eq!(state, RngState {});
        assert_eq!(postcard::to_allocvec(&state).expect("encodes"), saved);
    }
}
