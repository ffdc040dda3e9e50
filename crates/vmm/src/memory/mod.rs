//! Guest memory: a memfd mapped shared, wrapped as a vm-memory `GuestMemoryMmap`, plus the
//! x86_64 guest physical layout (MMIO gap below 4 GiB, E820 map).

/// Guest memory as every part of the VMM sees it (devices read and write through this).
pub type GuestMemory = vm_memory::GuestMemoryMmap<()>;
