//! The process tier's backend, and the per-run container both kernel tiers share.
//!
//! Owns choosing between the box's warm sandbox (`crate::sandbox`: a run is a process started
//! in it) and a container of the run's own (`h5i-runc` through `crate::process::run_plan`),
//! and the wiring of a per-run container's standard descriptors: the caller's, a terminal of
//! the box's own (`h5i-runc` opens the pty inside the box and sends its master over a console
//! socket to the proxy), or a service's log pipe; and the run's egress tally: what the box's
//! own table refused and counted (`crate::denied_egress`), with the credential proxies'
//! counts. A run in the sandbox has its credential proxies wired into the sandbox's network for
//! that run alone, and a terminal (`box shell`, an interactive `box run`) opened inside the
//! sandbox by the run's child ([`box_pty`]). Must never: let a run that needs a network or a
//! container of its own (a service's, one joining a service's network) take the warm sandbox,
//! hand a box process the user's terminal when the run has a pty of its own, or leave this
//! process's stdout redirected after a run.

use std::io::{Read, Seek};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use h5i_policy::receipt::{EgressTally, UncountedEgress};
use h5i_policy::{ResolvedPolicy, Tier};
use h5i_runtime::bundle::BundlePlan;
use h5i_runtime::process_tier::{Console, ProcessRunReport};
use h5i_runtime::pty::{ConsoleSocket, PtyProxy};

use super::{Network, PidSource, Resolved, RunRequest, Starting, Stdio, TierBackend, TierRun};
use crate::error::BoxError;

/// The process tier.
pub(super) struct Process;

impl TierBackend for Process {
    fn run(&self, mut resolved: Resolved<'_>, req: RunRequest<'_>) -> Result<TierRun, BoxError> {
        let mut plan = plan_for(&resolved, &req)?;
        let joined = matches!(req.network, Network::JoinService(_));
        if let Network::JoinService(pid) = req.network {
            crate::process::join_network_of(&mut plan, pid);
        }
        if warm_path_fits(&req) {
            let env = crate::process::env_with_secrets(&plan, &resolved.secrets)?;
            let wiring = crate::sandbox::RunWiring {
                creds: &mut resolved.creds,
                pty: box_pty(&req.stdio),
            };
            if let Some(run) = crate::sandbox::run(
                resolved.sb,
                resolved.policy,
                &plan,
                req.wall,
                env,
                None,
                wiring,
            )? {
                let egress = match run.denied {
                    Some(counted) => crate::denied_egress::settle(counted, run.creds),
                    None => uncounted_egress(resolved.policy, joined).merged(run.creds),
                };
                return Ok(TierRun::supervised(
                    run.report.child,
                    run.report.cage.oom,
                    Some(egress),
                ));
            }
        }
        let policy = resolved.policy;
        let counter = crate::denied_egress::PerRunCounter::attach(&mut plan)?;
        let (run, cred_tally) = run_in_container(resolved, plan, req.wall, req.stdio)?;
        let counted = counter.map(crate::denied_egress::PerRunCounter::finish);
        let run = run?;
        let egress = match counted {
            Some(counted) => crate::denied_egress::settle(counted, cred_tally),
            None => uncounted_egress(policy, joined).merged(cred_tally),
        };
        Ok(TierRun::supervised(run.child, run.cage.oom, Some(egress)))
    }
}

/// The process tier's egress tally for a run whose own namespace has no counted refusal (the
/// host's network, or a service's): empty, and saying what no counter of this run sees, so the
/// receipt never reads as all of the run's egress.
fn uncounted_egress(policy: &ResolvedPolicy, joined_service: bool) -> EgressTally {
    let uncounted = if joined_service && policy.net.mode == h5i_policy::NetMode::Deny {
        Some(UncountedEgress::InServiceNetwork)
    } else {
        UncountedEgress::at(Tier::Process, policy.net.mode)
    };
    EgressTally {
        uncounted,
        ..EgressTally::default()
    }
}

/// The kernel tiers' bundle plan for `req`, with its edit applied.
pub(super) fn plan_for(
    resolved: &Resolved<'_>,
    req: &RunRequest<'_>,
) -> Result<BundlePlan, BoxError> {
    let mut plan =
        crate::process::plan(resolved.sb, resolved.policy, &req.argv, req.caches.clone())?;
    if let Some(edit) = req.edit_plan {
        edit(&mut plan);
    }
    Ok(plan)
}

/// Whether a kernel-tier run goes through the box's sandbox rather than a container of its
/// own: every run with its own network (not one joining a service's) whose descriptors are the
/// caller's or a box terminal (`box shell`; the run's child opens the pty inside the sandbox),
/// unless turned off (`H5I_SANDBOX=off`). A run with credential grants takes it too: its
/// proxies' listeners are made in the sandbox's network for that run alone
/// (`crate::sandbox::run`). A service's run never does: it outlives `box run`, and its
/// network is its own for its whole life. A Codex box's run takes it too: the sandbox's
/// `/etc/codex` is a folder h5i rewrites to name that run's credential proxy, one run at a
/// time (`crate::sandbox::run` hands a second one meanwhile back for a container of its own).
pub(super) fn warm_path_fits(req: &RunRequest<'_>) -> bool {
    req.network == Network::Own
        && matches!(req.stdio, Stdio::Caller | Stdio::Terminal)
        && crate::tier_host::enabled()
}

/// Which of fds 0, 1, 2 a run in the sandbox gets as a pty of the box's own, opened inside the
/// box by the run's child, which leads it (its foreground job, its window size, `^C` from its
/// line discipline): all three for a box terminal (`box shell`); for the caller's descriptors,
/// each one that is a terminal when stdin and stdout both are (an interactive `box run`, as
/// the container tier gives it Podman's `-t`), so the box never holds the user's terminal;
/// none otherwise (piped or redirected: the caller's descriptors, passed as they are).
pub(super) fn box_pty(stdio: &Stdio<'_>) -> [bool; 3] {
    use std::io::IsTerminal;
    match stdio {
        Stdio::Terminal => [true; 3],
        Stdio::Caller => {
            let terminal = [
                std::io::stdin().is_terminal(),
                std::io::stdout().is_terminal(),
                std::io::stderr().is_terminal(),
            ];
            if terminal[0] && terminal[1] {
                terminal
            } else {
                [false; 3]
            }
        }
        Stdio::Service { .. } => [false; 3],
    }
}

/// Run `plan` in a container of its own, the credential proxies serving for exactly as long,
/// its standard descriptors wired as `stdio` says. Returns the run's result and the proxies'
/// tally (the caller settles its network, if any, before it looks at the result).
pub(super) fn run_in_container(
    resolved: Resolved<'_>,
    plan: BundlePlan,
    wall: Option<Duration>,
    stdio: Stdio<'_>,
) -> Result<(Result<ProcessRunReport, BoxError>, Option<EgressTally>), BoxError> {
    let Resolved {
        sb,
        policy,
        secrets,
        creds,
        ..
    } = resolved;
    match stdio {
        Stdio::Caller => creds.serve_during(plan, |plan| {
            crate::process::run_plan(policy, plan, wall, &secrets, None)
        }),
        Stdio::Terminal => {
            let socket = ConsoleSocket::bind()?;
            let socket_path = socket.path().to_path_buf();
            let tmp = std::env::temp_dir();
            let mut runtime_stderr =
                tempfile::tempfile_in(&tmp).map_err(|e| BoxError::io(&tmp, e))?;
            let for_runtime = runtime_stderr
                .try_clone()
                .map_err(|e| BoxError::io(&tmp, e))?;
            let mut proxy = PtyProxy::with_console_socket(socket)?;
            let out = creds.serve_during(plan, |plan| {
                crate::process::run_plan(
                    policy,
                    plan,
                    wall,
                    &secrets,
                    Some(Console {
                        socket: &socket_path,
                        companion: &mut proxy,
                        runtime_stderr: for_runtime,
                    }),
                )
            });
            let refused = proxy.refused().map(str::to_string);
            // The terminal is restored before anything is printed.
            drop(proxy);
            let mut said = String::new();
            let _ = runtime_stderr
                .rewind()
                .and_then(|()| runtime_stderr.read_to_string(&mut said));
            if !said.is_empty() {
                eprint!("{said}");
            } else if let Some(why) = refused {
                // Only when the runtime said nothing itself: its own error is the cause.
                eprintln!(
                    "h5i: box {}: no terminal for the session: {why}",
                    sb.manifest.name
                );
            }
            out
        }
        Stdio::Service { stdout, starting } => {
            starting(Starting {
                pid: PidSource::InitPidFile(
                    crate::process::bundle_dir_for(&plan.id)?.join("init.pid"),
                ),
                own_network: !plan.host_network,
                container: None,
            });
            // h5i-runc and the container inherit this process's stdout: the pipe, for the run.
            let _pipe = StdoutTo::fd(stdout)?;
            creds.serve_during(plan, |plan| {
                crate::process::run_plan(policy, plan, wall, &secrets, None)
            })
        }
    }
}

/// This process's stdout pointed at another descriptor until dropped, then put back (which
/// closes this process's end of that descriptor).
struct StdoutTo {
    saved: OwnedFd,
}

impl StdoutTo {
    fn fd(to: OwnedFd) -> Result<StdoutTo, BoxError> {
        let stdout = std::path::Path::new("stdout");
        let saved = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| BoxError::io(stdout, e))?;
        dup2(&to, libc::STDOUT_FILENO).map_err(|e| BoxError::io(stdout, e))?;
        Ok(StdoutTo { saved })
    }
}

impl Drop for StdoutTo {
    fn drop(&mut self) {
        let _ = dup2(&self.saved, libc::STDOUT_FILENO);
    }
}

fn dup2(from: &OwnedFd, to: libc::c_int) -> std::io::Result<()> {
    h5i_sys::fds::point_std(to, from.as_fd())
}
