//! `h5i_broker::fuzz::http1_messages` on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| h5i_broker::fuzz::http1_messages(data));
