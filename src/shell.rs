//! `h5i box shell NAME [-- CMD...]`: an interactive confined session in which every process is
//! inside the box, on a terminal of the box's own.
//!
//! Owns the verb: pick the shell (`bash -l` when the box can see bash, else `sh`) and ask a
//! [`RunSession`] for a terminal of the box's own, proxied to the user's (`h5i_runtime::pty`);
//! the session verifies the policy and appends the same host-observed `host-env-run` record
//! `box run` writes. Like a run, a session joins the network namespace of the box's live
//! services and starts a box-lifetime browser first, and h5i drains what that browser saw
//! after it. At the workspace tier h5i opens the pty pair itself; at the kernel tiers the
//! session's process, forked by the box sandbox's init, opens it inside the box, leads it and
//! sends the master back over the sandbox's socket (in a container of its own, when the sandbox
//! cannot serve it, `h5i-runc` opens it and sends the master over the console socket); at the
//! microvm tier h5i's guest agent opens it in the guest and h5i relays it over the session
//! (`crate::microvm::client`). With stdin not a
//! terminal there is nothing to proxy: the session is `box run` of the shell, stdio passed
//! through, so `echo 'make test' | h5i box shell NAME` works.
//!
//! Must never: let a box process hold a descriptor of the user's terminal (so no TIOCSTI into
//! the user's shell after the session, no reading what the user types next, no terminal modes
//! left behind), hand the box the user's terminal's foreground, or leave the user's terminal in
//! raw mode on any exit path.
//!
//! Guarded by `tests/box_shell.rs`.

use std::ffi::OsString;
use std::path::Path;

use h5i_policy::{ResolvedPolicy, Tier};
use h5i_runtime::pty::{self, PtyError};

use crate::error::BoxError;
use crate::session::{Network, Purpose, RunOutcome, RunSession, Stdio};
use crate::store::BoxStore;

/// Why a session could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    /// The box refused (as `box run` would).
    #[error(transparent)]
    Box(BoxError),
    /// The box's terminal could not be made.
    #[error(transparent)]
    Pty(#[from] PtyError),
}

impl From<BoxError> for ShellError {
    fn from(e: BoxError) -> ShellError {
        match e {
            BoxError::Terminal(e) => ShellError::Pty(e),
            e => ShellError::Box(e),
        }
    }
}

/// The shell a session runs when no command is given: `bash -l` when the box can see bash,
/// else `sh`. A microvm guest's root is its image, not the host's, so there it is `/bin/sh`.
pub fn default_shell(policy: &ResolvedPolicy) -> Vec<OsString> {
    if policy.tier == Tier::Microvm {
        return vec!["/bin/sh".into()];
    }
    let visible = |p: &str| {
        Path::new(p).is_file()
            && (policy.tier == Tier::Workspace
                || policy
                    .fs
                    .read
                    .iter()
                    .any(|r| h5i_policy::values::path_within(p, r)))
    };
    match ["/usr/bin/bash", "/bin/bash"]
        .into_iter()
        .find(|p| visible(p))
    {
        Some(bash) => vec![bash.into(), "-l".into()],
        None => vec!["/bin/sh".into()],
    }
}

/// Run an interactive session of `argv` (the default shell when empty) in the box `name`.
pub fn shell(store: &BoxStore, name: &str, argv: &[OsString]) -> Result<RunOutcome, ShellError> {
    // As for `box run`: a box-lifetime browser is up before the session.
    crate::browser::sidecar::ensure(store, name)?;
    let session = RunSession::open(store, name, Purpose::Shell)?;
    let argv = if argv.is_empty() {
        default_shell(session.policy())
    } else {
        argv.to_vec()
    };
    if !pty::is_terminal(0) {
        // Nothing to proxy: the session is `box run` of the shell.
        drop(session);
        return Ok(crate::run::run(store, name, &argv)?);
    }
    let sb = session.stored_box().clone();
    let policy = session.policy().clone();
    let mut req = session.request(argv);
    req.caches = crate::cache::run_grant::for_run(&sb, policy.tier)?;
    req.stdio = Stdio::Terminal;
    // As for `box run`: a live service's network, so the session reaches it (and the box's
    // browser reaches what the session serves) on localhost.
    if let Some(pid) = crate::service::live_network_pid(&sb) {
        req.network = Network::JoinService(pid);
    }
    let outcome = session.run(req)?;
    // What the browser saw while the session drove it, collected by h5i as after a run.
    crate::browser::drain::after_run(&sb, &policy, outcome.receipt_seq)?;
    Ok(outcome)
}
