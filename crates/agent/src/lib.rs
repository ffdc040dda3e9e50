//! The Sandcell guest agent: PID 1 of a sandbox (microVM or gVisor) and an envd-shaped HTTP
//! server ([`server`]), plus the host-side [`client`] the runtime and CLI use to talk to it.
//!
//! The same static binary runs everywhere: as `init=/sbin/sandcell-agent` in a microVM
//! (listening on vsock), as the OCI process of a gVisor sandbox (a Unix socket in a shared
//! directory), and as a plain host process in tests.

pub mod body;
pub mod checkpoint;
pub mod client;
pub mod connect;
pub mod entropy;
pub mod files;
pub mod fs_api;
pub mod hub;
pub mod init;
pub mod listen;
pub mod metadata;
pub mod netconfig;
pub mod power;
pub mod process;
pub mod process_api;
pub mod pty;
pub mod reaper;
pub mod repoll;
pub mod server;
pub mod state;
pub mod stream;
pub mod upload;
pub mod users;
pub mod vsock;
pub mod watch;

/// One line on the console (stderr), prefixed so it stands out in a VM's boot log.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("sandcell-agent: {}", format_args!($($arg)*))
    };
}
