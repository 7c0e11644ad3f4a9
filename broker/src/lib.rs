//! h5i-broker: the host side of every box.
//!
//! Owns the append-only receipt log, secret resolution and redaction, the egress allowlist
//! proxy, the credential proxy, and per-box HOME seeding. Must never: hand a secret value to a
//! box other than through the one run that declared it, let a model API key or other real
//! credential into a box (the box holds a per-run dummy; the credential proxy swaps it on the
//! host), dial a destination that was not pinned when the run's plan was built, write a secret
//! value to disk, or rewrite a record already in the log.
//!
//! The proxies are libraries over listeners the caller hands in (`std::net::TcpListener`, so the
//! caller can make them inside a box's network namespace); each connection runs on its own
//! thread with blocking IO (a CONNECT tunnel pumps both directions on that thread, under
//! `poll`), and each proxy stops with its `shutdown`, returning what it saw. No async runtime,
//! and nothing here forks.
//!
//! - [`receipt_log`], [`redact`], [`secrets`]: evidence and secret values.
//! - [`pin`]: the resolver seam and the address rules behind every pinned destination.
//! - [`egress`]: [`egress::EgressPlan`], [`egress::EgressProxy`], the tally for the receipt,
//!   and the user allowlist (`h5i box allow`).
//! - [`credential`]: [`credential::CredentialRoute`] per grant and [`credential::CredentialProxy`].
//! - [`socket_gate`]: the seccomp user-notification gate on `socket`/`socketpair` (supervised
//!   tier): rules, listener hand-off, tally.
//! - [`home`]: seeding a box-private copy of the agent's config directory, credentials stripped.

pub mod credential;
pub mod egress;
mod forward;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod home;
mod http1;
pub mod pin;
pub mod receipt_log;
pub mod redact;
pub mod secrets;
mod serve;
pub mod socket_gate;
mod tunnel;
