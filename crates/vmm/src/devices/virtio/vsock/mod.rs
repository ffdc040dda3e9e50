//! virtio-vsock in Firecracker's "hybrid" model: guest vsock streams are carried to
//! and from host Unix sockets (protocol in `muxer.rs`).
//!
//! - `packet.rs`: the wire header and constants.
//! - `connection.rs`: one stream's state machine and credit flow control.
//! - `muxer.rs`: the Unix listener, connection table, RX scheduling and timeouts.
//! - `uds.rs`: socket plumbing (listener, non-blocking connect).
//! - `device.rs`: the virtio device (RX/TX/event queues) and its event-loop glue.
//! - `persist.rs`: [`VsockState`], what a snapshot keeps.

mod connection;
mod device;
mod muxer;
mod packet;
mod persist;
mod uds;

pub use connection::{CONN_BUF_ALLOC, CONNECT_TIMEOUT};
pub use device::{QUEUE_SIZE, Vsock, VsockError};
pub use muxer::{MAX_CONNECTIONS, MuxerError};
pub use packet::HOST_CID;
pub use persist::VsockState;

#[cfg(test)]
mod tests;
