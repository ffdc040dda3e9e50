#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| sandcell_vmm::fuzzing::virtio_block(data));
