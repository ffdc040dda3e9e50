//! The Runtime interface and its microvm and gvisor implementations
