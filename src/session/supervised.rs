//! The supervised tier's backend: the process tier's bundle in a network namespace of its own
//! whose only way out is the nftables table of the egress the session pinned
//! (`crate::supervised` wires it and reads the sentry's tally back). A run goes through the
//! box's supervised sandbox (`crate::sandbox`: namespace, table and uplink made once, each
//! run's pins put in force before it) when the warm path fits, else through a container of its own.
//!
//! The box's browser sidecar (`crate::browser::sidecar`) is the one request that joins the
//! sandbox's network instead ([`Network::BoxSandbox`]).
//!
//! Owns the order of a supervised run: attach the network to the plan (or swap the sandbox's
//! pins), run, settle the network (its tally kept for the receipt and `status`) before the
//! run's result is looked at.
//! Must never: start a run whose egress was not pinned, or report a tally the sentry did not
//! leave.

use super::process::{plan_for, run_in_container, warm_path_fits};
use super::{Network, Resolved, RunRequest, TierBackend, TierRun, Usage};
use crate::error::BoxError;

/// The supervised tier.
pub(super) struct Supervised;

impl TierBackend for Supervised {
    fn pins_egress(&self) -> bool {
        true
    }

    fn run(&self, mut resolved: Resolved<'_>, req: RunRequest<'_>) -> Result<TierRun, BoxError> {
        let mut plan = plan_for(&resolved, &req)?;
        if let Network::BoxSandbox(pid) = req.network {
            // The browser sidecar: in the sandbox's network, whose table (and tally) the
            // sandbox's runs own; its own receipt carries no egress count.
            crate::browser::sidecar::join_sandbox(&mut plan, resolved.sb, pid)?;
            let (run, _) = run_in_container(resolved, plan, req.wall, req.stdio)?;
            let run = run?;
            return Ok(TierRun {
                report: run.child,
                oom: run.cage.oom,
                egress: None,
                socket_gate: None,
                usage: Usage::Supervisor,
            });
        }
        if warm_path_fits(resolved.policy, &req) {
            let env = crate::process::env_with_secrets(&plan, &resolved.secrets)?;
            if let Some(run) = crate::sandbox::run(
                resolved.sb,
                resolved.policy,
                &plan,
                req.wall,
                env,
                Some(&resolved.pinned),
            )? {
                let tally = run
                    .net
                    .unwrap_or_else(|| Err("the sandbox read no tally".into()));
                let (egress, socket_gate) =
                    crate::supervised::settle_tally(resolved.sb, tally, None)?;
                return Ok(TierRun {
                    report: run.report.child,
                    oom: run.report.cage.oom,
                    egress,
                    socket_gate,
                    usage: Usage::Supervisor,
                });
            }
        }
        let net = crate::supervised::attach(&mut plan, std::mem::take(&mut resolved.pinned))?;
        let sb = resolved.sb;
        let (run, cred_tally) = run_in_container(resolved, plan, req.wall, req.stdio)?;
        // After the terminal (if any) is restored: settling may warn on stderr.
        let (egress, socket_gate) = crate::supervised::settle(sb, Some(net), cred_tally)?;
        let run = run?;
        Ok(TierRun {
            report: run.child,
            oom: run.cage.oom,
            egress,
            socket_gate,
            usage: Usage::Supervisor,
        })
    }
}
