//! The microvm tier's backend: the run is a session with the box's VM (`crate::microvm` owns
//! the VM, its guest agent and the relay).
//!
//! Owns handing the session's secrets, wall clock and standard descriptors to it: the caller's
//! (`box run`), or the caller's terminal proxied to a pty of the guest's own (`box shell`).
//! Must never: run a detached service (the VM's guest agent has no supervisor for one).

use super::{Resolved, RunRequest, Stdio, TierBackend, TierRun, Usage};
use crate::error::BoxError;

/// The microvm tier.
pub(super) struct Microvm;

impl TierBackend for Microvm {
    fn run(&self, resolved: Resolved<'_>, req: RunRequest<'_>) -> Result<TierRun, BoxError> {
        let stdio = match req.stdio {
            Stdio::Caller => crate::microvm::client::CallerStdio::Piped,
            Stdio::Terminal => crate::microvm::client::CallerStdio::Terminal,
            Stdio::Service { .. } => {
                return Err(BoxError::BadRequest {
                    what: "a service cannot run at the microvm tier in this build (its guest agent has no supervisor for a detached command)".into(),
                    mend: "create the box with --isolation process (or workspace) for services".into(),
                })
            }
        };
        let run = crate::microvm::run(
            resolved.sb,
            resolved.policy,
            crate::microvm::RunInputs {
                argv: &req.argv,
                wall: req.wall,
                secrets: &resolved.secrets,
                stdio,
                caches: &req.caches,
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
