//! h5i-hook: what happens at a box's edges in time, as OCI hooks.
//!
//! Owns the hooks a box's bundle declares, so they run the same under `h5i-runc` and under
//! Podman: each reads the OCI state on stdin (validated against a closed set of fields), acts
//! on the container's namespaces by pid, and exits. Today: `loopback` (createRuntime) brings up
//! `lo` in the box's private network namespace, so a dev server in the box is reachable from the
//! box and from nothing else. After a run, `spool` ingests what the box staged in its spool as
//! box-claimed records, or quarantines it. `listen --inside` (createContainer) binds the
//! credential proxy's listener on the box's loopback and hands its fd to h5i. The egress uplink and nftables table of the
//! supervised tier arrive here too.
//!
//! Must never: act on a pid the state did not name, trust a field outside the closed set, or
//! touch the host's own network namespace.
//!
//! Guarded by `tests/process_tier.rs` (`a_host_loopback_listener_is_unreachable_from_inside`,
//! `the_boxs_own_loopback_works`).

pub mod listen;
pub mod loopback;
pub mod spool;
pub mod state;
