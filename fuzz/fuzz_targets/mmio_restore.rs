#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| sandcell_vmm::fuzzing::mmio_restore(data));
