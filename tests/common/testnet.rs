//! Test hosts in a network namespace of the test's own: h5i-testsupport's `testnet`.

// Each test binary uses a part of it.
#![allow(unused_imports)]

pub use h5i_testsupport::testnet::*;
