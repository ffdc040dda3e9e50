//! Emulated devices. Each gets an interrupt trigger and its queue eventfds, never the VM fd.

pub mod virtio;
