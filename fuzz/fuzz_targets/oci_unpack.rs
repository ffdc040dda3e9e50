#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| sandcell_fuzz::oci_unpack(data));
