//! The microvm tier's backend: the run is a session with the box's VM (`crate::microvm` owns
//! the VM, its guest agent and the relay).
//!
//! Owns handing the session's secrets and wall clock to it. Must never: run a detached service
//! or a terminal session it cannot give a terminal of the guest's own.

use super::{Resolved, RunRequest, Stdio, TierBackend, TierRun, Usage};
use crate::error::BoxError;

/// The microvm tier.
pub(super) struct Microvm;

impl TierBackend for Microvm {
    fn run(&self, resolved: Resolved<'_>, req: RunRequest<'_>) -> Result<TierRun, BoxError> {
        if !matches!(req.stdio, Stdio::Caller) {
            return Err(BoxError::BadRequest {
                what: "the microvm tier runs commands with the caller's descriptors only in this build (no guest terminal, no detached service)".into(),
                mend: "use `h5i box run NAME -- CMD` (a shell reading its stdin works: h5i box run NAME -- sh)".into(),
            });
        }
        let run = crate::microvm::run(
            resolved.sb,
            resolved.policy,
            crate::microvm::RunInputs {
                argv: &req.argv,
                wall: req.wall,
                secrets: &resolved.secrets,
            },
        )?;
        Ok(TierRun {
            report: run.child,
            oom: run.oom,
            egress: run.egress,
            socket_gate: None,
            usage: match run.usage {
                Some(u) => Usage::Cgroup(Some(u)),
                None => Usage::Supervisor,
            },
        })
    }
}
