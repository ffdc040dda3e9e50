//! virtio-fs (virtio 1.2 §5.11): a host directory shared with the guest, served by a
//! vhost-user backend process (virtiofsd), not by the VMM.
//!
//! The VMM only connects the guest's queues to the backend: it hands virtiofsd the guest
//! memory (the memfd's regions), each queue's ring addresses, the queue-notify eventfds
//! KVM signals (kicks go straight from the guest to virtiofsd) and one "call" eventfd per
//! queue, which the VMM turns into the transport's interrupt. FUSE requests never pass
//! through the VMM, so it parses none of them: the parser of guest file requests is
//! virtiofsd, in its own sandbox (namespaces, seccomp), on the directory it was given.
//!
//! - `device.rs`: the device model, its config space and its event handling;
//! - `backend.rs`: the vhost-user frontend session (feature negotiation, ring setup).
//!
//! Not snapshotted: the open files and FUSE state live in virtiofsd, so a VM with a
//! virtio-fs device refuses snapshots (see `snapshot::save`).

mod backend;
mod device;

pub use backend::BackendError;
pub use device::{Fs, FsError, NUM_QUEUES, QUEUE_SIZE, TAG_MAX_LEN, config_space};

#[cfg(test)]
mod tests;
