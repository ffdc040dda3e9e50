//! Snapshot state of the net device: which TAP and which MAC. The queues are in the
//! transport's state; a frame pending at the save is not kept (the wire may lose a
//! frame; TCP resends it). A restore attaches to the TAP by name again, in the network
//! namespace of the restoring process: a clone in its own namespace gets its own TAP
//! of the same name. A VMM started ahead of its sandbox (`--wait-restore`) is given the
//! TAP instead, attached by the daemon in the sandbox's namespace.

use serde::{Deserialize, Serialize};

use super::device::Net;
use super::tap::{NetBackend, Tap};
use crate::snapshot::{DeviceStateError, Persist};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    pub tap_name: String,
    pub mac: [u8; 6],
}

/// What a restore attaches to: the saved TAP name unless overridden, a TAP passed in
/// attached, or (tests) a ready backend.
pub enum NetRestoreArgs {
    Tap { name_override: Option<String> },
    Passed(std::os::fd::OwnedFd),
    Backend(Box<dyn NetBackend>),
}

impl Persist for Net {
    type State = NetState;
    type Args = NetRestoreArgs;
    type Error = DeviceStateError;

    fn save(&self) -> NetState {
        NetState {
            tap_name: self.backend_name().to_owned(),
            mac: self.mac(),
        }
    }

    fn restore(args: NetRestoreArgs, s: &NetState) -> Result<Self, DeviceStateError> {
        let err = |reason: String| DeviceStateError::new("virtio-net", reason);
        let backend: Box<dyn NetBackend> = match args {
            NetRestoreArgs::Tap { name_override } => {
                let name = name_override.as_deref().unwrap_or(&s.tap_name);
                Box::new(Tap::open(name).map_err(|e| err(e.to_string()))?)
            }
            NetRestoreArgs::Passed(fd) => {
                Box::new(Tap::from_fd(fd).map_err(|e| err(e.to_string()))?)
            }
            NetRestoreArgs::Backend(b) => b,
        };
        Net::new(backend, s.mac).map_err(|e| err(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state files' format must not change: these bytes were written by the code
    /// before the devices shared `VirtioCommon`.
    #[test]
    fn a_state_saved_by_earlier_versions_still_loads() {
        let saved = crate::devices::virtio::test_utils::unhex("077461702d7363300600ac100002");
        let want = NetState {
            tap_name: "tap-sc0".into(),
            mac: [0x06, 0, 0xac, 0x10, 0, 2],
        };
        let state: NetState = postcard::from_bytes(&saved).expect("decodes");
        assert_eq!(state, want);
        assert_eq!(postcard::to_allocvec(&want).expect("encodes"), saved);
    }
}
