//! Wire types shared by the Sandcell processes. Serde only: no I/O lives here.
//!
//! - [`vmm`]: the configuration `sandcell-vmm` boots from, its newline-delimited JSON control
//!   protocol and its documented exit statuses.
//! - [`agent`]: the guest agent's envd-shaped HTTP protocol (Connect JSON envelopes).
//! - [`image`]: the defaults an OCI-made image carries (`images/<name>/config.json`).
//! - [`rfc3339`]: the timestamps of those protocols.

pub mod agent;
pub mod image;
pub mod rfc3339;
pub mod vmm;
