//! The supervised tier's backend: the process tier's bundle in a network namespace of its own
//! whose only way out is the nftables table of the egress the session pinned
//! (`crate::supervised` wires it and reads the sentry's tally back). A run goes through the
//! box's supervised sandbox (`crate::sandbox`: namespace, table and uplink made once, each
//! run's pins put in force before it) when the warm path fits, else through a container of its own.
//!
//! The box's browser sidecar (`crate::browser::sidecar`) joins the sandbox's network instead
//! ([`Network::BoxSandbox`], [`join_sandbox`]), and so does a run of a box whose browser lives
//! there that takes a container of its own (the sandbox could not serve it: another run holds
//! its network): its dev server on loopback is then the page's, its egress goes through the
//! sandbox's table, and its tally is read from the sandbox's sentry
//! (`crate::sandbox::share_network`).
//!
//! Owns the order of a supervised run: attach the network to the plan (or swap the sandbox's
//! pins), run, settle the network (its tally kept for the receipt and `status`) before the
//! run's result is looked at.
//! Must never: start a run whose egress was not pinned, or report a tally the sentry did not
//! leave.

use h5i_runtime::bundle::BundlePlan;

use super::process::{box_pty, plan_for, run_in_container, warm_path_fits};
use super::{Network, Resolved, RunRequest, Stdio, TierBackend, TierRun, Usage};
use crate::error::BoxError;
use crate::store::StoredBox;

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
            join_sandbox(&mut plan, resolved.sb, pid)?;
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
        if warm_path_fits(&req) {
            let env = crate::process::env_with_secrets(&plan, &resolved.secrets)?;
            let pinned = std::mem::take(&mut resolved.pinned);
            let wiring = crate::sandbox::RunWiring {
                creds: &mut resolved.creds,
                pty: box_pty(&req.stdio),
            };
            let served = crate::sandbox::run(
                resolved.sb,
                resolved.policy,
                &plan,
                req.wall,
                env,
                Some(&pinned),
                wiring,
            )?;
            resolved.pinned = pinned;
            if let Some(run) = served {
                let tally = run
                    .net
                    .unwrap_or_else(|| Err("the sandbox read no tally".into()));
                let (egress, socket_gate) =
                    crate::supervised::settle_tally(resolved.sb, tally, run.creds)?;
                return Ok(TierRun {
                    report: run.report.child,
                    oom: run.report.cage.oom,
                    egress,
                    socket_gate,
                    usage: Usage::Supervisor,
                });
            }
        }
        if let Some(shared) = share_browsers_network(&resolved, &req)? {
            // A run of its own (a terminal) of a box whose browser lives in the sandbox's
            // network: in that network too, so the page sees what the run serves on loopback.
            shared.join(&mut plan);
            let (sb, policy) = (resolved.sb, resolved.policy);
            let (run, cred_tally) = run_in_container(resolved, plan, req.wall, req.stdio)?;
            let (egress, socket_gate) =
                crate::supervised::settle_tally(sb, shared.finish(policy), cred_tally)?;
            let run = run?;
            return Ok(TierRun {
                report: run.child,
                oom: run.cage.oom,
                egress,
                socket_gate,
                usage: Usage::Supervisor,
            });
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

/// The network of the box's sandbox, held for a run that takes a container of its own (one the
/// sandbox did not serve) when the box's browser lives there; `None` for every other run (a
/// service's, one whose sandbox network is busy or down: it takes a network of its own).
fn share_browsers_network(
    resolved: &Resolved<'_>,
    req: &RunRequest<'_>,
) -> Result<Option<crate::sandbox::SharedNetwork>, BoxError> {
    let fits = req.network == Network::Own
        && matches!(req.stdio, Stdio::Caller | Stdio::Terminal)
        && crate::browser_box::lives_for_the_box(resolved.policy)
        && crate::browser_box::alive(resolved.sb);
    if !fits {
        return Ok(None);
    }
    crate::sandbox::share_network(resolved.sb, resolved.pinned.clone())
}

/// Put the sidecar's `plan` in the network of `sb`'s supervised sandbox whose init is `pid`
/// (and the user namespace owning it), with the sandbox's name files: the pinned hosts and no
/// resolver. Refused when that sandbox is no longer the box's.
fn join_sandbox(plan: &mut BundlePlan, sb: &StoredBox, pid: i32) -> Result<(), BoxError> {
    let net = crate::sandbox::live_init(sb)
        .filter(|(live, _)| *live == pid)
        .map(|(_, net)| net)
        .ok_or_else(|| BoxError::BadRequest {
            what: format!(
                "box `{}`'s sandbox ended before its browser joined it",
                sb.manifest.name
            ),
            mend: format!("run in box `{}` again", sb.manifest.name),
        })?;
    crate::process::join_network_of(plan, pid);
    for name in ["hosts", "resolv.conf"] {
        plan.file_binds
            .push((net.join(name), std::path::Path::new("/etc").join(name)));
    }
    Ok(())
}
