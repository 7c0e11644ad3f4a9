//! `h5i_broker::fuzz::egress_target` on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| h5i_broker::fuzz::egress_target(data));
