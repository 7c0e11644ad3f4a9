//! h5i-policy: what a box is allowed to do, as data.
//!
//! Owns the `.h5i/env.toml` schema, the built-in profiles, resolution of a request into a
//! [`ResolvedPolicy`], its canonical serialization (`policy.resolved.toml`) and SHA-256 digest,
//! and the receipt record types every other crate writes and reads.
//!
//! Must never: spawn a process, touch the network, read the process environment or any file it
//! was not handed, or hold global state. Callers pass in what the host looks like; this crate
//! only decides.

pub mod receipt;
