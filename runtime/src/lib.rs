//! h5i-runtime: running a box's command at its tier.
//!
//! Owns turning a resolved policy into something that runs (the workspace tier's supervised
//! child today; OCI bundles and the `h5i-runc` runtime for the kernel tiers), waiting for it on a
//! pidfd, enforcing the wall clock, and reporting what the kernel said (`wait4` rusage, signal,
//! OOM). Must never: decide policy (that is `h5i-policy`), write receipts (the broker does), or
//! sleep-poll a child.
