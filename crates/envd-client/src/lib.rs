//! The host side of the envd protocol (the guest agent's API, `sandcell_proto::agent`): one
//! client, [`EnvdClient`], generic over how it reaches the sandbox ([`Connector`]):
//!
//! - straight to a sandbox's agent: a Unix socket ([`UnixConnector`], gVisor), a hybrid-vsock
//!   socket after its `CONNECT` handshake (a closure; the microvm runtime has one), TCP;
//! - through the daemon's envd proxy ([`EnvdClient::via_proxy`]): TCP to the daemon, with
//!   the headers that route to the sandbox, its access token and the user of the calls.
//!
//! The runtime, the daemon and the CLI use it to drive sandboxes; `sandcell-client` wraps
//! the proxied one for its users. The agent itself links none of it.

mod client;
mod connect;
mod error;
mod files;
mod process;

pub use client::{ENVD_PORT, EnvdClient, MAX_ENVELOPE, MAX_PROXIED_REPLY, MAX_SMALL_REPLY};
pub use connect::{Connector, TCP_CONNECT_TIMEOUT, TcpConnector, UnixConnector, exchange};
pub use error::ClientError;
pub use files::FileStream;
pub use process::{InputStream, OutputKind, ProcessOutput, ProcessStream, decode_data};
