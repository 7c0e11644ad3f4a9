//! The proxies' far ends for the broker tests (and, included by path, the root crate's
//! credential and agent tests): the test CA, TLS stand-in upstreams, echo and HTTP origins and
//! the raw HTTP client, all from h5i-testsupport's `upstream`.

// Each test binary uses a part of it.
#![allow(unused_imports)]

pub use h5i_testsupport::upstream::*;
