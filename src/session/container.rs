//! The container tier's backend: the run is a Podman container of the box's image
//! (`crate::container` owns the engine, the evidence check and the egress proxy).
//!
//! Owns handing the session's secrets, credentials and terminal choice to it. Must never: take
//! Podman's client's resource figures for the box's (the box's come from its cgroup).

use super::{Resolved, RunRequest, Stdio, TierBackend, TierRun, Usage};
use crate::error::BoxError;

/// The container tier.
pub(super) struct Container;

impl TierBackend for Container {
    fn run(&self, resolved: Resolved<'_>, req: RunRequest<'_>) -> Result<TierRun, BoxError> {
        // Podman gives a terminal session a pty of the container's own (conmon holds the
        // master) and proxies it to this terminal: the box never holds the user's terminal.
        // (A detached service was refused before the backend: `refuse_unservable`.)
        let tty = matches!(req.stdio, Stdio::Terminal);
        let run = crate::container::run(
            resolved.sb,
            resolved.policy,
            crate::container::RunInputs {
                argv: &req.argv,
                wall: req.wall,
                secrets: &resolved.secrets,
                creds: resolved.creds.into_prepared(),
                tty,
            },
        )?;
        Ok(TierRun {
            report: run.child,
            oom: run.oom,
            egress: run.egress,
            socket_gate: None,
            usage: Usage::Cgroup(run.usage),
        })
    }
}
