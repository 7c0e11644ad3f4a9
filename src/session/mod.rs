//! One way of running something in a box: [`RunSession`].
//!
//! Owns the run sequence, written once for every verb that runs a command in a box (`box run`,
//! `box shell`, a service's supervisor, `cache refresh`; see [`Purpose`]): take the box's lock
//! shared, refuse a box that is not active, load the stored policy and check it against its
//! digest (a mismatch is refused, never repaired), resolve the secrets, prepare every
//! credential grant (fail closed), pin `net.egress` when the tier enforces it, hand a
//! [`RunRequest`] to the tier's backend (one [`TierBackend`] per tier: [`workspace`],
//! [`process`] (a warm box sandbox or a container per run), [`supervised`], [`container`],
//! [`microvm`]), and
//! append exactly one host-observed `host-env-run` record and one event from what the backend
//! observed ([`record`]).
//!
//! The callers (`run`, `shell`, `service`, `cache::refresh`) say what to run, how its
//! standard descriptors are wired and what the box's caches grant it
//! ([`RunRequest::caches`]); the backends say how a tier starts it. Neither imports the
//! other's module: the dependencies point from the verbs to this module to the tier modules
//! (`process`, `supervised`, `sandbox`, `container`), never back.
//!
//! Must never: run at a tier other than the one the policy resolved to, start a command before
//! its secrets, credentials and egress pins are all in hand, or write a receipt from anything
//! but the backend's own observation.
//!
//! Guarded by `tests/box_stdio.rs`, `tests/box_shell.rs`,
//! `tests/box_services.rs`, `tests/box_cache.rs` and the tier suites (`process_tier`,
//! `supervised_tier`, `container_tier`, `sandbox`), and the unit tests below.

mod container;
mod microvm;
mod process;
pub mod record;
mod supervised;
mod workspace;

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use h5i_broker::secrets::ResolvedSecret;
use h5i_policy::receipt::{CgroupUsage, EgressTally, OomReport, PinnedRule, SocketGateTally};
use h5i_policy::{ResolvedPolicy, Tier};
use h5i_runtime::bundle::BundlePlan;
use h5i_runtime::supervise::ChildReport;

use crate::credentials::ForRun;
use crate::error::BoxError;
use crate::process::CacheGrant;
use crate::store::{load_policy, now_ms, require_active, BoxLock, BoxStore, StoredBox};

pub use record::RunOutcome;

/// Why a box runs a command: named in the box's event log and in its refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `h5i box run` (and `box shell` with no terminal to proxy).
    Run,
    /// `h5i box shell` on a terminal.
    Shell,
    /// A declared service, run by its supervisor.
    Service,
    /// A dependency cache's install step (`h5i box cache refresh`).
    CacheRefresh,
}

impl Purpose {
    /// The name of the event a finished run appends to the box log.
    pub fn event(self) -> &'static str {
        match self {
            Purpose::Run => "run",
            Purpose::Shell => "shell",
            Purpose::Service => "service",
            Purpose::CacheRefresh => "cache-refresh",
        }
    }

    /// The verb named when the box is not active, for a session that holds the box's lock
    /// (shared) while it runs and checks the box first. `None` for a service's supervisor: it
    /// lives as long as the service, and `service start` held the lock and checked the box
    /// while starting it (the exclusive verbs hold a live service still instead).
    fn locked_verb(self) -> Option<&'static str> {
        match self {
            Purpose::Run => Some("run"),
            Purpose::Shell => Some("shell"),
            Purpose::Service => None,
            Purpose::CacheRefresh => Some("cache refresh"),
        }
    }
}

/// How the box's standard descriptors are wired.
pub enum Stdio<'a> {
    /// The caller's own descriptors, passed through as they are (closed ones stay closed).
    Caller,
    /// A terminal of the box's own, proxied to the caller's (`box shell` on a terminal): no box
    /// process ever holds a descriptor of the caller's terminal.
    Terminal,
    /// A detached service: stdin empty, stdout into `stdout` (its log pipe), stderr the
    /// caller's (the service log). `starting` is told, before the command starts, where its pid
    /// can be learnt.
    Service {
        /// The write end of the service's output pipe.
        stdout: OwnedFd,
        /// Called once the tier knows where the pid will be, before the command starts.
        starting: &'a mut dyn FnMut(Starting),
    },
}

/// Where a detached command's pid can be learnt once its wrapper printed its first line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PidSource {
    /// The file the runtime writes the container init's pid to (before the command runs).
    InitPidFile(PathBuf),
    /// The wrapper shell's own pid, which it prints (it execs the command: workspace tier).
    Wrapper,
}

/// What a detached command's supervisor learns before it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Starting {
    /// Where its pid is.
    pub pid: PidSource,
    /// Whether it has a network namespace of its own (else it is on the host's network).
    pub own_network: bool,
    /// The Podman container it runs as (the container tier's browser sidecar, whose user and
    /// network namespaces the box's runs join by this name).
    pub container: Option<String>,
}

/// Which network a kernel-tier run is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// Its own (or the host's, with `net.mode = "host"`), as the policy says.
    Own,
    /// The network namespace of this box's live process-tier service whose container init has
    /// this pid, so the run reaches the service on localhost (no other box ever gets this).
    JoinService(i32),
    /// The network namespace of this box's supervised sandbox whose init has this pid: the
    /// box's browser sidecar's, so its page reaches what the sandbox's runs serve and leaves
    /// only through the sandbox's pinned table.
    BoxSandbox(i32),
}

/// One command for a [`RunSession`] to run.
pub struct RunRequest<'a> {
    /// The command and its arguments.
    pub argv: Vec<OsString>,
    /// What the receipt names as the command when it is not `argv` (a service's wrapper).
    pub recorded_argv: Option<Vec<OsString>>,
    /// How its standard descriptors are wired.
    pub stdio: Stdio<'a>,
    /// The wall clock (`None`: no limit). [`RunSession::request`] sets the policy's.
    pub wall: Option<Duration>,
    /// Which network it is in (kernel tiers).
    pub network: Network,
    /// A change to the run's bundle plan (kernel tiers only; another tier refuses a request
    /// that carries one): the cache refresh's own writable cache in place of the read-only
    /// grants.
    pub edit_plan: Option<&'a dyn Fn(&mut BundlePlan)>,
    /// What the box's warm caches grant the run (process, supervised, container), worked out
    /// by the verb (`crate::cache::run_grant`: the caches' module opens sessions of its own, so
    /// this one never names it); none unless the verb sets it.
    pub caches: CacheGrant,
}

/// Where a run record's resource figures come from.
#[derive(Debug, Default)]
pub(crate) enum Usage {
    /// The supervisor reaped the box itself: its `wait4` rusage.
    #[default]
    Supervisor,
    /// The supervisor's child was not the box (the container tier: Podman's client, whose
    /// rusage is its own): no rusage, and the box's cgroup figures when a cage held it.
    Cgroup(Option<CgroupUsage>),
}

/// What a tier backend observed of one run, for its record.
#[derive(Debug)]
pub(crate) struct TierRun {
    /// The supervisor's report.
    pub report: ChildReport,
    /// OOM evidence from the run's cage.
    pub oom: Option<OomReport>,
    /// Egress counts (the supervised sentry's table and the credential proxy's, merged).
    pub egress: Option<EgressTally>,
    /// The socket() gate's decisions (supervised tier).
    pub socket_gate: Option<Box<SocketGateTally>>,
    /// Where the resource figures come from.
    pub usage: Usage,
}

impl TierRun {
    /// A run whose report and cage the supervisor observed itself, with the proxies' counts.
    fn supervised(
        report: ChildReport,
        oom: Option<OomReport>,
        egress: Option<EgressTally>,
    ) -> TierRun {
        TierRun {
            report,
            oom,
            egress,
            socket_gate: None,
            usage: Usage::Supervisor,
        }
    }
}

/// What the session resolved before a backend starts anything.
pub(crate) struct Resolved<'s> {
    /// The box.
    pub sb: &'s StoredBox,
    /// Its verified policy.
    pub policy: &'s ResolvedPolicy,
    /// The secrets the policy grants, resolved on the host.
    pub secrets: Vec<ResolvedSecret>,
    /// The credential grants, prepared (their proxies serve for exactly as long as the run).
    pub creds: ForRun,
    /// `net.egress` pinned to addresses for this run (tiers that enforce it; else empty).
    pub pinned: Vec<PinnedRule>,
}

/// How one tier starts a command in a box and observes it to its end.
pub(crate) trait TierBackend {
    /// Whether the tier enforces `net.egress` by address, so the session pins it first.
    fn pins_egress(&self) -> bool {
        false
    }

    /// Run `req` in the box with what the session resolved, and report what was observed.
    fn run(&self, resolved: Resolved<'_>, req: RunRequest<'_>) -> Result<TierRun, BoxError>;
}

/// The backend of `tier`, when this build has one.
fn backend_for(tier: Tier) -> Option<&'static dyn TierBackend> {
    match tier {
        Tier::Workspace => Some(&workspace::Workspace),
        Tier::Process => Some(&process::Process),
        Tier::Supervised => Some(&supervised::Supervised),
        Tier::Container => Some(&container::Container),
        Tier::Microvm => Some(&microvm::Microvm),
    }
}

/// The refusal for a tier this build cannot run.
fn tier_not_built(name: &str, tier: Tier) -> BoxError {
    BoxError::BadRequest {
        what: format!(
            "box `{name}` is pinned to the {} tier, which this build of h5i cannot run",
            tier.as_str()
        ),
        mend: "create the box with --isolation workspace or process, or use an h5i build with that tier".into(),
    }
}

/// Refuse a request its tier cannot serve: a plan edit where the tier has no bundle plan. (A
/// detached command at the container tier is a browser box's sidecar: `crate::service` refuses
/// every other service there before a session starts.)
fn refuse_unservable(tier: Tier, req: &RunRequest<'_>) -> Result<(), BoxError> {
    let has_plan = matches!(tier, Tier::Process | Tier::Supervised);
    if req.edit_plan.is_some() && !has_plan {
        return Err(BoxError::BadRequest {
            what: format!(
                "this run changes the box's bundle plan, which the {} tier does not have",
                tier.as_str()
            ),
            mend: "run it at the process or supervised tier".into(),
        });
    }
    Ok(())
}

/// A box opened to run something in it: locked (unless a service's supervisor), checked
/// active, its policy verified against the stored digest.
pub struct RunSession {
    purpose: Purpose,
    sb: StoredBox,
    policy: ResolvedPolicy,
    _lock: Option<BoxLock>,
}

impl RunSession {
    /// Open box `name` of `store` for `purpose`.
    pub fn open(store: &BoxStore, name: &str, purpose: Purpose) -> Result<RunSession, BoxError> {
        let sb = store.find(name)?;
        let lock = match purpose.locked_verb() {
            Some(verb) => {
                let lock = BoxLock::shared(&sb.paths, name)?;
                require_active(&sb, verb)?;
                Some(lock)
            }
            None => None,
        };
        let policy = load_policy(&sb)?;
        Ok(RunSession {
            purpose,
            sb,
            policy,
            _lock: lock,
        })
    }

    /// The box.
    pub fn stored_box(&self) -> &StoredBox {
        &self.sb
    }

    /// Its verified policy.
    pub fn policy(&self) -> &ResolvedPolicy {
        &self.policy
    }

    /// A request to run `argv` with the caller's descriptors, in the box's own network, under
    /// the policy's wall clock.
    pub fn request<'a>(&self, argv: Vec<OsString>) -> RunRequest<'a> {
        RunRequest {
            argv,
            recorded_argv: None,
            stdio: Stdio::Caller,
            wall: self.policy.resources.wall_secs.map(Duration::from_secs),
            network: Network::Own,
            edit_plan: None,
            caches: CacheGrant::default(),
        }
    }

    /// Resolve the run's secrets, credentials and egress pins, run `req` at the policy's tier,
    /// and record what the backend observed.
    pub fn run(self, req: RunRequest<'_>) -> Result<RunOutcome, BoxError> {
        let backend = backend_for(self.policy.tier)
            .ok_or_else(|| tier_not_built(&self.sb.manifest.name, self.policy.tier))?;
        refuse_unservable(self.policy.tier, &req)?;
        let secrets = crate::secrets::resolve_for_run(&self.policy)?;
        // Fail closed before anything starts: every auth grant must be servable.
        let creds = ForRun::prepare(&self.policy)?;
        let pinned = match backend.pins_egress() {
            true => crate::supervised::pin_egress(&self.policy)?,
            false => Vec::new(),
        };
        let scrub = creds.redactions();
        let recorded_argv = req
            .recorded_argv
            .clone()
            .unwrap_or_else(|| req.argv.clone());
        let mut req = req;
        if self.purpose != Purpose::CacheRefresh {
            if let Some(argv) = crate::agent::claude_state_argv(&self.policy, &req.argv) {
                req.argv = argv;
            }
        }
        let started_ms = now_ms();
        let run = backend.run(
            Resolved {
                sb: &self.sb,
                policy: &self.policy,
                secrets,
                creds,
                pinned,
            },
            req,
        )?;
        record::write(
            &self.sb,
            &self.policy,
            self.purpose,
            &recorded_argv,
            started_ms,
            run,
            scrub,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>() -> RunRequest<'a> {
        RunRequest {
            argv: vec!["true".into()],
            recorded_argv: None,
            stdio: Stdio::Caller,
            wall: None,
            network: Network::Own,
            edit_plan: None,
            caches: CacheGrant::default(),
        }
    }

    #[test]
    fn a_plan_edit_is_refused_at_a_tier_without_a_bundle_plan() {
        let edit = |plan: &mut BundlePlan| plan.env.push("X=1".into());
        for tier in [Tier::Workspace, Tier::Container] {
            let mut req = request();
            req.edit_plan = Some(&edit);
            let e = refuse_unservable(tier, &req).unwrap_err().to_string();
            assert!(e.contains("bundle plan") && e.contains("to fix:"), "{e}");
        }
        for tier in [Tier::Process, Tier::Supervised] {
            let mut req = request();
            req.edit_plan = Some(&edit);
            assert!(refuse_unservable(tier, &req).is_ok());
        }
    }

    #[test]
    fn every_purpose_names_its_event_and_only_a_service_runs_unlocked() {
        let all = [
            Purpose::Run,
            Purpose::Shell,
            Purpose::Service,
            Purpose::CacheRefresh,
        ];
        let events: Vec<&str> = all.iter().map(|p| p.event()).collect();
        assert_eq!(events, ["run", "shell", "service", "cache-refresh"]);
        let unlocked: Vec<Purpose> = all
            .into_iter()
            .filter(|p| p.locked_verb().is_none())
            .collect();
        assert_eq!(unlocked, [Purpose::Service]);
    }
}
