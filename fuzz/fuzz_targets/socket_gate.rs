//! `h5i_broker::fuzz::socket_gate` on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| h5i_broker::fuzz::socket_gate(data));
