//! Seeded dice for the crash-safety tests: h5i-testsupport's `dice`.

// Each test binary uses a part of it.
#![allow(unused_imports)]

pub use h5i_testsupport::dice::*;
