//! Architecture-specific boot setup. Only x86_64 exists.

pub mod x86_64;
