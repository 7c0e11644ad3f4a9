//! h5i-guest: the wire protocol between h5i (the host) and its microVM guest agent, and the
//! agent itself (`src/main.rs`, the guest's `/init`).
//!
//! Owns the frame format and the closed set of messages each side may send ([`proto`]), the
//! names of the box's read-only cache shares ([`caches`]), and bringing a network namespace's loopback up ([`loopback`]: the guest's, and the private
//! namespace the host's end of the egress forward lives in). Every
//! field is length-bounded and parsed strictly: the host treats every byte from the guest as
//! hostile (the guest is the box), and the guest treats the host's frames as the only
//! authority it has.
//!
//! Must never: grow a message the other side cannot parse without a version bump, read a
//! frame without a bound on its size, or depend on anything but `libc` (the agent is static
//! and small).
//!
//! Guarded by the unit tests in [`proto`] and by `tests/microvm.rs` (a real guest under QEMU).

pub mod caches;
pub mod loopback;
pub mod proto;
