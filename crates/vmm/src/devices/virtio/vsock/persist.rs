//! Snapshot state of the vsock device: its identity and the muxer's port counter, not
//! its connections (see [`VsockState`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::device::Vsock;
use crate::snapshot::{DeviceStateError, Persist};

/// A vsock device in a snapshot. Connections are not saved: their host sockets belong
/// to the process that saved them. The save sends TRANSPORT_RESET first
/// ([`Vsock::prepare_save`]) so the restored guest drops its connected sockets (its
/// listening ones survive); if the guest had no event buffer posted, the event is still
/// pending and the restored device delivers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    pub guest_cid: u64,
    pub uds_path: PathBuf,
    pub reset_pending: bool,
    /// The next host port for a host-initiated connection: a restore continues from here,
    /// never reusing a port the guest may still hold a stale socket for (muxer.rs).
    pub next_host_port: u32,
}

impl Vsock {
    /// Before a save: reset the transport (see [`VsockState`]).
    pub fn prepare_save(&mut self) {
        self.send_transport_reset();
    }
}

impl Persist for Vsock {
    type State = VsockState;
    /// A new host-side socket path (`overrides.vsock_uds_path`).
    type Args = Option<PathBuf>;
    type Error = DeviceStateError;

    fn save(&self) -> VsockState {
        VsockState {
            guest_cid: self.guest_cid,
            uds_path: self.uds_path.clone(),
            reset_pending: self.reset_pending,
            next_host_port: self.muxer.next_local_port(),
        }
    }

    /// Without a new path, the saved one must not belong to a live VMM (a fork's parent):
    /// binding it would take the parent's socket path away.
    fn restore(uds_path: Option<PathBuf>, s: &VsockState) -> Result<Self, DeviceStateError> {
        if uds_path.is_none() && std::os::unix::net::UnixStream::connect(&s.uds_path).is_ok() {
            return Err(DeviceStateError::new(
                "virtio-vsock",
                format!(
                    "{} is the socket of a running VM: give the restore its own \
                     (overrides.vsock_uds_path / --vsock-uds)",
                    s.uds_path.display()
                ),
            ));
        }
        let path = uds_path.unwrap_or_else(|| s.uds_path.clone());
        let mut v = Vsock::new(s.guest_cid, path)
            .map_err(|e| DeviceStateError::new("virtio-vsock", e.to_string()))?;
        v.reset_pending = s.reset_pending;
        v.muxer.set_next_local_port(s.next_host_port);
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state files' format must not change: these bytes were written by the code
    /// before the devices shared `VirtioCommon`.
    #[test]
    fn a_state_saved_by_earlier_versions_still_loads() {
        let saved =
            crate::devices::virtio::test_utils::unhex("030b2f72756e2f762e736f636b018780808004");
        let want = VsockState {
            guest_cid: 3,
            uds_path: "/run/v.sock".into(),
            reset_pending: true,
            next_host_port: (1 << 30) | 7,
        };
        let state: VsockState = postcard::from_bytes(&saved).expect("decodes");
        assert_eq!(state, want);
        assert_eq!(postcard::to_allocvec(&want).expect("encodes"), saved);
    }
}
