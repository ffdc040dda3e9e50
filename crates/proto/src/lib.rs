//! Wire types shared by the Sandcell processes, and the few helpers every one of them
//! needs (the guest agent depends on this crate alone). No I/O lives here but getrandom.
//!
//! - [`vmm`]: the configuration `sandcell-vmm` boots from, its newline-delimited JSON control
//!   protocol and its documented exit statuses.
//! - [`agent`]: the guest agent's envd-shaped HTTP protocol (Connect JSON envelopes).
//! - [`image`]: the defaults an OCI-made image carries (`images/<name>/config.json`).
//! - [`time`]: RFC 3339 timestamps (envd's and E2B's wire format).
//! - [`auth`]: where a request's API key travels.
//! - [`sync`]: a poison-tolerant mutex lock; [`random`]: bytes from the kernel's RNG.

pub mod agent;
pub mod auth;
pub mod image;
pub mod random;
pub mod sync;
pub mod time;
pub mod vmm;
