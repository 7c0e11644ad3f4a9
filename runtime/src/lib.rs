//! h5i-runtime: running a box's command at its tier.
//!
//! Owns turning a resolved policy into something that runs (the workspace tier's supervised
//! child today; OCI bundles and the `h5i-runc` runtime for the kernel tiers), waiting for it on a
//! pidfd, enforcing the wall clock, and reporting what the kernel said (`wait4` rusage, signal,
//! OOM). Must never: decide policy (that is `h5i-policy`), write receipts (the broker does), or
//! sleep-poll a child.
//!
//! Also owns `h5i-runc` (`runc`), the OCI runtime over youki's `libcontainer`, and `confine`,
//! the confinement its executor applies from `h5i.*` annotations (Landlock, h5i's seccomp
//! deny list). See each module's doc for what it must never do.
pub mod bundle;
pub mod cage;
pub mod confine;
pub mod process_tier;
pub mod pty;
pub mod runc;
pub mod sandbox;
pub mod socket_gate;
pub mod stdio;
pub mod supervise;
