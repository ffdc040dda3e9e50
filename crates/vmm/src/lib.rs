//! Sandcell's virtual machine monitor, built on the rust-vmm crates.
//!
//! One process per VM (`sandcell-vmm`), a VMM thread with one epoll loop, one thread per
//! vCPU. `builder.rs` is the only place that knows how the parts connect.
//!
//! - [`config`]: arguments and up-front validation of `sandcell_proto::vmm::VmConfig`.
//! - [`builder`]: from a configuration to running vCPUs.
//! - [`vmm`]: the VMM thread's event loop, pause/resume, teardown.
//! - [`kvm`]: the VM fd and the vCPU threads.
//! - [`arch`]: x86_64 layout and boot state; [`memory`]: guest RAM; [`loader`]: kernel.
//! - [`bus`], [`devices`]: port and MMIO dispatch and the emulated devices.
//! - [`control`]: the control socket; [`exit`]: how the VM ends.
//! - [`machine`]: what a running VM is made of; [`snapshot`]: save, restore, fork images.
//! - `fuzzing` (feature `fuzzing`, for fuzz/ only): entry points for guest-fed input.
//! - [`seccomp`]: the syscall filter of each thread kind.

#[macro_use]
pub mod logger;

pub mod arch;
pub mod builder;
pub mod bus;
pub mod config;
pub mod control;
pub mod devices;
pub mod exit;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod jail;
pub mod kvm;
pub mod loader;
pub mod machine;
pub mod memory;
pub mod pool;
pub mod seccomp;
pub mod snapshot;
pub mod vmm;
