//! The one copy of the fixtures h5i's four test trees share (tests/, hooks/tests/,
//! runtime/tests/, broker/tests/): each tree's `common`/`support` module re-exports from here.
//!
//! What it owns:
//! - [`netns`]: network namespaces of the test's own joined to the host by a veth pair on a
//!   claimed `/24` of 198.18.0.0/15, and `ip(8)` runs inside or outside them;
//! - the test hosts on them: [`testnet::TestHosts`] (a named namespace whose greeters log every
//!   connection and datagram, for h5i's CLI tests) and [`echo_hosts::EchoHosts`] (an unnamed one
//!   with greeters, a UDP echo and a bulk stream, for the supervised-network hook tests);
//! - [`upstream`]: a test CA made per run, TLS stand-in model APIs, plain echo and HTTP origins on
//!   127.0.0.1, and a raw HTTP client;
//! - [`cgroup`]: the caller's cgroup, each hierarchy's root, and cgroups delegated to the
//!   unprivileged test user under the caller's own cgroup;
//! - [`process`]: the root check with its loud `skipped:` line, the test user's ids, the
//!   binaries under test beside the test binary, capturing output through files, and the static
//!   C probes built once per test binary;
//! - [`rootfs`]: busybox image trees and their tars for `podman import`;
//! - [`podman`]: undoing what a rootful Podman of a test's own leaves (mounts, conmon cgroups);
//! - [`dice`]: kill points for the crash tests, reproducible from a printed seed;
//! - [`skip`]: the loud `skipped:` line, also kept in `$H5I_TEST_SKIPS` for `make test`'s list.
//!
//! What it must never do: touch the host's own network namespace beyond creating and removing
//! its own veth pairs (`h5i*` names) and its own named namespaces (`h5i-s*`); send traffic
//! anywhere but loopback and the test hosts it made; resolve a name through the system resolver
//! (every address here is a literal); make a cgroup outside the caller's own cgroup path; or loop,
//! wait or serve without a bound (every server takes a bounded number of connections, every
//! socket has a timeout or a stop signal, every search has a count). It is never a dependency of
//! anything that ships.

// A fixture fails the test that called it: a panic with the step that failed is the report.
// A fixture's `new` makes something (keys, a namespace, servers): no `Default` hides that.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::new_without_default)]

pub mod cgroup;
pub mod dice;
pub mod echo_hosts;
pub mod netns;
pub mod podman;
pub mod process;
pub mod rootfs;
pub mod skip;
pub mod testnet;
pub mod upstream;

pub use process::require_root;
