//! Sandcell's virtual machine monitor, built on the rust-vmm crates.
//!
//! One process per VM (`sandcell-vmm`), a VMM thread with one epoll loop, one thread per
//! vCPU. `builder.rs` is the only place that knows how the parts connect.

pub mod bus;
pub mod devices;
pub mod memory;
