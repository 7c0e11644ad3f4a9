//! `h5i box run NAME -- CMD...`: one command in the box, its exit code passed through, and a
//! host-observed receipt of what the kernel said about it.
//!
//! Owns the verb: the command line, starting a browser box's browser sidecar first, joining a
//! live service's network so the run reaches it on localhost, and draining what the browser
//! saw after it. The run itself (lock, policy check, secrets, credentials, egress, the
//! tier's backend, the `host-env-run` record) is a [`RunSession`]. Must never: run at a tier
//! other than the one the policy resolved to, or write a receipt from anything but the
//! supervisor's own observation.
//!
//! Guarded by `tests/box_stdio.rs` and the tier suites (`process_tier`, `supervised_tier`,
//! `container_tier`).

use std::ffi::OsString;

use crate::error::BoxError;
use crate::session::{Network, Purpose, RunOutcome, RunSession};
use crate::store::BoxStore;

/// Run `argv` in the box called `name`.
pub fn run(store: &BoxStore, name: &str, argv: &[OsString]) -> Result<RunOutcome, BoxError> {
    if argv.is_empty() {
        return Err(BoxError::BadRequest {
            what: "no command given".into(),
            mend: format!("put the command after `--`: h5i box run {name} -- cargo test"),
        });
    }
    // A browser box whose browser lives as long as the box: its sidecar is up before the run.
    crate::browser::sidecar::ensure(store, name)?;
    let session = RunSession::open(store, name, Purpose::Run)?;
    let sb = session.stored_box().clone();
    let policy = session.policy().clone();
    let mut req = session.request(argv.to_vec());
    req.caches = crate::cache::run_grant::for_run(&sb, policy.tier)?;
    // A live service of this box: join its network namespace, so the run reaches it on
    // localhost (no other box ever gets this path).
    if let Some(pid) = crate::service::live_network_pid(session.stored_box()) {
        req.network = Network::JoinService(pid);
    }
    let outcome = session.run(req)?;
    // What the browser saw, when the run drove it: collected by h5i, not reported by the box.
    crate::browser::drain::after_run(&sb, &policy, outcome.receipt_seq)?;
    Ok(outcome)
}
