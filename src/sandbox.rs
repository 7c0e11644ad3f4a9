//! The box-lifetime sandbox from the box's side: made lazily by a process-tier or supervised run
//! from the same plan a per-run container would use, kept in h5i's private runtime directory,
//! rebuilt when the plan it was made from changes, torn down by `abort`, `rm` and its init's
//! idle timeout (`H5I_SANDBOX_IDLE_SECS`, default 600 s). When the init ends idle, its pid
//! namespace ends with it (every process of the box is killed by the kernel) and a supervised
//! sandbox's sentry, watching the init, stops the uplink and ends; what the init cannot remove
//! itself (the container's record, its empty cgroups, the directory) is swept by the next h5i
//! that looks: the box's `status`, its next run, or any box's sandbox being made.
//!
//! Every kernel-tier run goes through it (`crate::session`'s process backend decides) but a
//! declared service's and a run joining a service's network: a run with credential grants has
//! its proxies' listeners made in the sandbox's network namespace for that run alone (a dummy of
//! its own, its own tally, the listeners closed when it ends: `crate::credentials`), and a run
//! on a terminal (`box shell`, an interactive `box run`) gets a pty its child opens inside the
//! sandbox and leads ([`RunWiring::pty`]; `h5i_runtime::sandbox`'s protocol). A Codex box's
//! runs go through it one at a time: Codex reads its system folder, `/etc/codex`, whose
//! `config.toml` names the run's credential proxy; the sandbox binds a folder of h5i's there
//! (read-only) when it is made, and h5i rewrites its files for each run before it starts (each
//! file replaced by a rename, so no run reads a part) and again once it ended (naming no
//! proxy). A second run of the box meanwhile takes a container of its own, whose folder is its
//! own (`crate::capture::CodexSystemDir`).
//!
//! Owns the sandbox's directory (`<runtime dir>/sandbox-<hash of the box directory>`, 0700):
//! `state.json` (the digest of the sandbox's OCI config, its container id), `init.sock` (the
//! box init's listener; never mounted into the box), `bundle/` (kept while the container lives:
//! its rootfs is the box's root), `init.log` (the init's own stderr), `lock` (exclusive to
//! build or tear down, shared while a run is served, so a teardown waits for runs in flight),
//! for a Codex box `codex/` (bound at `/etc/codex`: `crate::capture::CodexSandboxFolder`) and
//! `codex.lock` (held by the one run the folder names), and for a supervised sandbox `net/`
//! (the sentry's net directory: its sockets, log, the box's hosts file) and `net.lock` (held by
//! the one supervised run the network serves at a time; in a process-tier sandbox, by the one
//! run whose refused dials its deny-all table counts, read before and after the run through the
//! init's network namespace: `crate::denied_egress`). A run finding a live sandbox made from its
//! plan takes `lock` shared at once, beside the runs in flight.
//!
//! A supervised sandbox's network namespace, nftables table, socket gate and uplink are made
//! with it by the same hooks a per-run container has, and live as long as it: the sentry
//! watches the box init. Before each run the sentry puts the run's pins in force (the table is
//! replaced in one nft transaction only when they differ from the table's) and reads the
//! counters, and the hosts file is rewritten; after it the sentry answers the counters since
//! that reading and the socket-gate decisions since then, so the receipt's tally is exactly
//! that run's. The digest covers the egress request (names and ports), not the
//! addresses one run pinned: a name that re-resolves is swapped, not rebuilt.
//!
//! The digest covers the whole `config.json` the sandbox was made from (every mount, namespace,
//! mapping, rlimit, capability set, hook and `h5i.*` annotation: everything derived from the
//! policy), the box's policy digest itself (a changed grant that alters no config, such as a
//! credential grant, still rebuilds it) and the identity of the init binary, so any change to
//! what a per-run container would have been rebuilds the sandbox before the next run.
//!
//! The sandbox's own cgroup holds the box's `mem` and `procs` over all its runs together and
//! what they leave behind ([`SandboxCeiling`]): the box's `/tmp`, `/dev/shm` and System V
//! shared memory are the box's scratch for its lifetime (the manual: "a per-box scratch"), and
//! their pages stay charged to the box after the run that wrote them ended. Each run's own
//! cgroup below holds the same limits for that run alone.
//!
//! Must never: let the box hold more than its `mem` (plus the init's allowance) across runs,
//! serve a run from a sandbox made from another plan, start a supervised run before the sentry
//! took its pins, serve two supervised runs at once through one network (their tallies would
//! mix), serve two runs of a Codex box at once (each would read the other's proxy in
//! `/etc/codex`), let the box write its `/etc/codex`, put a secret in the sandbox's bundle
//! (secrets travel per run, in the request), or leave the container, its cgroups, its sentry
//! or its directory behind after a teardown.
//! Guarded by `tests/sandbox.rs`, `tests/supervised_sandbox.rs`, `tests/credentials.rs` (a
//! changed grant rebuilds it) and `tests/agent_codex.rs` (a Codex box's folder).

use std::fs;
use std::io::Write as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use h5i_hook::net_spec::NET_SOCK;
use h5i_policy::receipt::{EgressTally, NetTally, PinnedRule};
use h5i_policy::ResolvedPolicy;
use h5i_runtime::bundle::BundlePlan;
use h5i_runtime::process_tier::ProcessRunReport;
use h5i_runtime::sandbox::{self as rt, RunRequest, RunSlot};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::BoxError;
use crate::file_lock::{FileLock, LockKind};
use crate::store::{now_ms, StoredBox};

/// How long an idle sandbox's init waits for the next run before it ends, unless
/// [`IDLE_ENV`] says otherwise.
pub const IDLE_SECS: u64 = 600;
/// The variable that sets another idle time for the sandboxes this h5i makes (whole seconds).
pub const IDLE_ENV: &str = "H5I_SANDBOX_IDLE_SECS";
/// The longest idle time [`IDLE_ENV`] may ask for: a day.
const MAX_IDLE_SECS: u64 = 86_400;

/// The idle time a sandbox made now gets: [`IDLE_ENV`] when set (1 s to a day), else
/// [`IDLE_SECS`]. It is part of the sandbox's plan, so a different one rebuilds the sandbox.
fn idle_secs() -> Result<u64, BoxError> {
    let Some(raw) = std::env::var_os(IDLE_ENV) else {
        return Ok(IDLE_SECS);
    };
    raw.to_str()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|n| (1..=MAX_IDLE_SECS).contains(n))
        .ok_or_else(|| BoxError::BadRequest {
            what: format!(
                "{IDLE_ENV}={} is not a whole number of seconds from 1 to {MAX_IDLE_SECS}",
                raw.to_string_lossy().escape_debug()
            ),
            mend: format!("set it to a number of seconds, e.g. {IDLE_ENV}=600, or unset it"),
        })
}

/// What `state.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxState {
    /// Digest of the sandbox's config and init binary.
    pub digest: String,
    /// The container id (also its cgroup's name below `<own>/h5i/`).
    pub container: String,
    /// When it was made (ms since the epoch).
    pub created_ms: u64,
    /// The box directory it serves (a sandbox whose box is gone is swept).
    #[serde(default)]
    pub box_dir: PathBuf,
}

/// The sandbox directory of `sb` (not created).
pub fn dir_for(sb: &StoredBox) -> Result<PathBuf, BoxError> {
    let hash = Sha256::digest(sb.paths.dir.as_os_str().as_encoded_bytes());
    let short: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Ok(crate::tier_host::runtime_dir()?.join(format!("sandbox-{short}")))
}

/// The sandbox's state, when one was made and its init still answers.
pub fn status(sb: &StoredBox) -> Option<SandboxState> {
    let dir = dir_for(sb).ok()?;
    let state = read_state(&dir)?;
    rt::connect(&dir.join("init.sock")).ok().map(|_| state)
}

/// The pid of the sandbox's init and its net directory, when its init answers: where the box's
/// box-lifetime browser joins a supervised sandbox's network (`crate::browser::sidecar`).
pub fn live_init(sb: &StoredBox) -> Option<(i32, PathBuf)> {
    status(sb)?;
    let dir = dir_for(sb).ok()?;
    let pid = fs::read_to_string(dir.join("init.pid")).ok()?;
    Some((pid.trim().parse().ok()?, net_dir(&dir)))
}

/// Which runs the sandbox serves, as `status` says it.
const SERVES: &str = "it serves every run, terminal and credential-grant runs included, but a service's and one in a service's network; a Codex box's runs one at a time (its /etc/codex names that run's proxy; a run meanwhile takes a container of its own)";

/// `status`'s line for the sandbox. A sandbox whose init ended on its own (the idle timeout)
/// is swept first: the container's record, cgroups and directory its init could not remove.
pub fn status_line(sb: &StoredBox) -> String {
    let up = status(sb);
    if up.is_none() {
        if let Ok(dir) = dir_for(sb) {
            if dir.exists() {
                sweep_if_orphaned(&dir);
            }
        }
    }
    match up {
        Some(s) => format!(
            "sandbox: up ({}, config digest {}; {SERVES})",
            s.container,
            &s.digest[..12.min(s.digest.len())]
        ),
        None if !crate::tier_host::enabled() => {
            "sandbox: off (H5I_SANDBOX=off: a container per run)".into()
        }
        None => format!("sandbox: down (the next run makes it; {SERVES})"),
    }
}

/// The pid of the sandbox's init, as `h5i-runc run --pid-file` wrote it.
fn init_pid(dir: &Path) -> Result<i32, String> {
    let path = dir.join("init.pid");
    let pid = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    pid.trim()
        .parse::<i32>()
        .map_err(|_| format!("init.pid holds {:?}", pid.trim()))
}

fn read_state(dir: &Path) -> Option<SandboxState> {
    serde_json::from_slice(&fs::read(dir.join("state.json")).ok()?).ok()
}

/// The plan of the sandbox's own container: `plan` with the box init as its process, no
/// environment (each run brings its own), and a name of the box's.
fn sandbox_plan(sb: &StoredBox, plan: &BundlePlan, runc: &Path, idle_secs: u64) -> BundlePlan {
    let mut base = plan.clone();
    base.id = format!("{}-sb", sb.manifest.name);
    base.argv = vec![
        rt::INIT_PATH_IN_BOX.to_string(),
        rt::INIT_VERB.to_string(),
        "--idle-secs".to_string(),
        idle_secs.to_string(),
    ];
    // libcontainer's executor looks the init up on PATH; runs bring their own environment.
    base.env = vec!["PATH=/usr/bin:/bin".to_string()];
    base.init_program = Some((runc.to_path_buf(), PathBuf::from(rt::INIT_PATH_IN_BOX)));
    base.cgroups_path = None;
    base
}

/// Memory the sandbox's cgroup holds beyond the box's `mem` for h5i's own init (a few MiB of
/// a static binary and its kernel objects), so that a run alone meets its own cgroup's limit
/// first: its OOM is then its own, and no other run is told of it.
const INIT_MEM_ALLOWANCE: u64 = 16 << 20;

/// What the sandbox's own cgroup holds, over every run of the box together and everything the
/// runs leave behind. The box's `/tmp` and `/dev/shm` (tmpfs) and its System V shared memory
/// last as long as the sandbox, and their pages stay charged to it after the run that wrote
/// them has ended: without a ceiling here, each run could leave up to `mem` behind and the box
/// would hold `mem` many times over. Runs keep their own `mem` and `procs` in their cgroups
/// below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SandboxCeiling {
    /// The box's `mem`, plus [`INIT_MEM_ALLOWANCE`].
    mem: Option<u64>,
    /// The box's `procs`, plus one for the init.
    procs: Option<u64>,
}

impl SandboxCeiling {
    fn of(policy: &ResolvedPolicy) -> SandboxCeiling {
        SandboxCeiling {
            mem: policy
                .resources
                .mem_bytes
                .map(|m| m.saturating_add(INIT_MEM_ALLOWANCE)),
            procs: policy.resources.procs.map(|p| p.saturating_add(1)),
        }
    }
}

/// What a sandbox's digest covers besides its config.
struct DigestKey<'a> {
    /// Its cgroup's ceiling.
    ceiling: SandboxCeiling,
    /// The box's policy digest: a changed policy is a new sandbox even where the config it
    /// derives is the same (a changed credential grant, which each run wires itself).
    policy_digest: &'a str,
    /// `h5i-runc`, the init binary.
    runc: &'a Path,
    /// A bind source the sandbox makes itself when it is made (a Codex box's folder), counted
    /// as there: the config the sandbox is made from has its bind whether or not a sandbox
    /// made it yet.
    made_with: Option<&'a Path>,
}

/// Digest of the sandbox's config, its ceiling, the box's policy digest, the init binary it
/// would run and the hook binary its hooks run (device, inode, size, mtime: a rebuilt
/// `h5i-runc` is a new sandbox, and so is a rebuilt `h5i-hook`, whose sentry serves a
/// supervised sandbox for its whole life).
fn digest_of(base: &BundlePlan, key: &DigestKey<'_>) -> Result<String, BoxError> {
    let (config, _) = base.to_config(|p| p.exists() || key.made_with == Some(p));
    let mut h = Sha256::new();
    h.update(config.to_string().as_bytes());
    let ceiling = key.ceiling;
    h.update(format!("\nceiling:{:?}:{:?}", ceiling.mem, ceiling.procs).as_bytes());
    h.update(format!("\npolicy:{}", key.policy_digest).as_bytes());
    for binary in std::iter::once(key.runc.to_path_buf()).chain(crate::tier_host::hook_binary()) {
        let meta = fs::metadata(&binary).map_err(|e| BoxError::io(&binary, e))?;
        h.update(
            format!(
                "\n{}:{}:{}:{}",
                meta.dev(),
                meta.ino(),
                meta.size(),
                meta.mtime()
            )
            .as_bytes(),
        );
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn refused(what: String) -> BoxError {
    BoxError::BadRequest {
        what,
        mend: "run again with H5I_SANDBOX=off to use a container per run, and report the init log named above".into(),
    }
}

/// What a sandbox run brings besides its command: its credential grants and which of its
/// standard descriptors are a terminal of the box's own.
pub struct RunWiring<'a> {
    /// The run's credential grants, prepared. Their proxies are wired into the sandbox's
    /// network for exactly this run (taken from here only once the sandbox serves the run: a
    /// run the sandbox cannot serve leaves them for a container of its own).
    pub creds: &'a mut crate::credentials::ForRun,
    /// Which of fds 0, 1, 2 are a pty the run's child opens inside the box (the rest are the
    /// caller's, passed as they are).
    pub pty: [bool; 3],
}

/// A run served by the sandbox.
#[derive(Debug)]
pub struct SandboxRun {
    /// The command's end and its cage's figures.
    pub report: ProcessRunReport,
    /// A supervised sandbox's tally of exactly this run (or why there is none).
    pub net: Option<Result<NetTally, String>>,
    /// A process-tier sandbox's count of the dials its table refused during exactly this run
    /// (or why there is none); `None` when its network counts nothing (the host's).
    pub denied: Option<Result<EgressTally, String>>,
    /// The credential proxies' counts for this run; `None` when the policy grants none.
    pub creds: Option<EgressTally>,
}

/// The supervised sandbox's net directory (inside the sandbox's own, so it goes with it).
fn net_dir(dir: &Path) -> PathBuf {
    dir.join("net")
}

/// A Codex box's system folder, bound at `/etc/codex` (inside the sandbox's own directory).
fn codex_dir(dir: &Path) -> PathBuf {
    dir.join("codex")
}

/// Run `plan`'s command in the box's sandbox, making or rebuilding it first when needed. With
/// `egress` (the supervised tier: this run's pins), the sandbox is a supervised one: its network
/// namespace, nftables table, socket gate and uplink live as long as it does, the table is
/// swapped for this run's pins before the command starts, and the tally read back after it
/// ended is exactly this run's (one supervised run at a time per sandbox).
/// The run's credential grants are served for exactly this run: a listener per grant made in
/// the sandbox's network namespace (the host's loopback for a box on the host's network), a
/// dummy of this run's own in its environment, and the proxies stopped (their listeners
/// closed) when it ends, their counts this run's alone. With `wiring.pty`, the run's child
/// opens a terminal inside the box and leads it; h5i proxies it to the user's.
/// `Ok(None)`: this host cannot give the sandbox a cgroup (without one nothing ends a run's
/// background processes with it), or another supervised run holds the sandbox's network: the
/// caller runs a container per run instead (the credential grants untouched).
pub fn run(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    plan: &BundlePlan,
    wall: Option<Duration>,
    mut env: Vec<String>,
    egress: Option<&[PinnedRule]>,
    wiring: RunWiring<'_>,
) -> Result<Option<SandboxRun>, BoxError> {
    let runc = crate::tier_host::runc_binary().ok_or_else(|| BoxError::BadRequest {
        what: "h5i-runc (the process tier's OCI runtime) is not installed beside h5i or on PATH"
            .into(),
        mend: "build it (`make build`) or put h5i-runc on PATH".into(),
    })?;
    let dir = dir_for(sb)?;
    let mut base = sandbox_plan(sb, plan, &runc, idle_secs()?);
    // A Codex box reads its system folder, which names each run's credential proxy: one folder
    // of h5i's, bound over /etc/codex when the sandbox is made and rewritten for each run.
    let codex_source = codex_dir(&dir);
    let codex = (policy.agent == Some(h5i_policy::AgentRuntime::Codex))
        .then(|| crate::capture::CodexSandboxFolder::at(codex_source.clone()));
    if let Some(folder) = &codex {
        base.binds.push(folder.bind());
    }
    let net = net_dir(&dir);
    let hostname = format!("h5i-{}", base.id);
    let ceiling = SandboxCeiling::of(policy);
    let key = DigestKey {
        ceiling,
        policy_digest: &sb.manifest.policy_digest,
        runc: &runc,
        made_with: codex.as_ref().map(|_| codex_source.as_path()),
    };
    let digest = match egress {
        None => digest_of(&base, &key)?,
        Some(rules) => {
            crate::supervised::wire(&mut base, &net, rules)?;
            let mut keyed = base.clone();
            keyed.extra_annotations.insert(
                crate::supervised::NET_EGRESS_ANNOTATION.into(),
                crate::supervised::requested_annotation(rules),
            );
            digest_of(&keyed, &key)?
        }
    };
    let socket = dir.join("init.sock");
    let lock_path = dir.join("lock");
    // Another h5i's sweep may remove a sandbox being made (it has no state yet) under this one.
    let in_place = |kind| {
        FileLock::take_in_place_as(&dir, "lock", kind).map_err(|e| BoxError::io(&lock_path, e))
    };
    // The sandbox made from this plan, when its init answers. A supervised sandbox whose sentry
    // is gone has no network to serve a run with.
    let live = || {
        read_state(&dir)
            .filter(|s| s.digest == digest)
            .filter(|_| egress.is_none() || net.join(NET_SOCK).exists())
            .filter(|_| codex.as_ref().is_none_or(|f| f.exists()))
            .and_then(|s| rt::connect(&socket).ok().map(|c| (s, c)))
    };
    // A live sandbox serves the run under the shared lock, beside the runs in flight; making
    // one takes the lock exclusively (after the runs in flight), then shares it.
    let shared = in_place(LockKind::Shared)?;
    let (lock, state, conn) = match live() {
        Some((state, conn)) => (shared, state, conn),
        None => {
            drop(shared);
            let lock = in_place(LockKind::Exclusive)?;
            // Another h5i may have made it meanwhile.
            let (state, conn) = match live() {
                Some(found) => found,
                None => {
                    teardown_locked(&dir)?;
                    if let Some(folder) = &codex {
                        folder.make()?;
                    }
                    if let Some(rules) = egress {
                        crate::supervised::make_dir(&net, &hostname, rules)?;
                    }
                    let Some(state) = build(sb, &dir, base, ceiling, &digest, &runc)? else {
                        return Ok(None);
                    };
                    let conn = rt::connect(&socket)?;
                    (state, conn)
                }
            };
            lock.downgrade().map_err(|e| BoxError::io(&lock_path, e))?;
            (lock, state, conn)
        }
    };
    // A Codex box's sandbox serves one run at a time: its /etc/codex names that run's proxy,
    // and a second run meanwhile would read the first's (or the first the second's). That
    // second run takes a container of its own, with a system folder of its own.
    let codex_held = match &codex {
        None => None,
        Some(_) => {
            let path = dir.join("codex.lock");
            match FileLock::try_take(&path, LockKind::Exclusive) {
                Ok(Some(held)) => Some(held),
                Ok(None) => return Ok(None),
                Err(e) => return Err(BoxError::io(&path, e)),
            }
        }
    };
    // One supervised run at a time holds the sandbox's network, so its tally is its own; a
    // second one meanwhile takes a container of its own. The sentry's `begin` runs while the
    // run's cgroup is made; the run starts only on its `ok`.
    let counts_denials = egress.is_none() && crate::denied_egress::counts_denials(plan);
    let (net_lock, begun) = match egress {
        None if counts_denials => {
            // A process-tier sandbox's table counts every run's refusals: one run at a time
            // reads them, so its tally is its own.
            let path = dir.join("net.lock");
            match FileLock::try_take(&path, LockKind::Exclusive) {
                Ok(Some(held)) => (Some(held), None),
                Ok(None) => return Ok(None),
                Err(e) => return Err(BoxError::io(&path, e)),
            }
        }
        None => (None, None),
        Some(rules) => {
            let path = dir.join("net.lock");
            match FileLock::try_take(&path, LockKind::Exclusive) {
                Ok(Some(held)) => {
                    crate::browser_idle::close(sb, &net)?;
                    crate::supervised::refresh_hosts(&net, &hostname, rules)?;
                    (Some(held), Some(crate::supervised::begin(&net, rules)?))
                }
                Ok(None) => return Ok(None),
                Err(e) => return Err(BoxError::io(&path, e)),
            }
        }
    };
    let denial_counter = counts_denials
        .then(|| init_pid(&dir).and_then(crate::denied_egress::SandboxCounter::begin));
    sweep_stale_runs(&state.container);
    // The grants' listeners, in the sandbox's network for this run only (on the host's
    // loopback when the box is on the host's network).
    let netns = if plan.host_network || !wiring.creds.has_proxies() {
        None
    } else {
        Some(init_pid(&dir).map_err(|why| {
            refused(format!(
                "the box's sandbox has no init to serve its credential grants in: {why}"
            ))
        })?)
    };
    let serving = wiring.creds.serve_in_sandbox(netns, &mut env)?;
    // The folder names this run's proxy (its base URL is in `env` now) before the run starts.
    let named = codex.as_ref().map_or(Ok(()), |f| f.name_run(&env));
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let (fds, open) = caller_stdio([stdin.as_fd(), stdout.as_fd(), stderr.as_fd()], wiring.pty);
    let req = RunRequest {
        argv: plan.argv.clone(),
        env,
        cwd: plan.cwd.clone(),
        stdio: open,
        pty: wiring.pty,
    };
    let cage_id = format!(
        "{}/c/run-{}-{}",
        state.container,
        std::process::id(),
        now_ms() % 1_000_000
    );
    let mut begin_refused = None;
    let report = named.and_then(|()| {
        rt::run(
            &RunSlot {
                socket: &socket,
                cage_id: &cage_id,
                mem: policy.resources.mem_bytes,
                procs: policy.resources.procs,
                wall,
            },
            conn,
            &req,
            &fds,
            || match begun.map(crate::supervised::BeginRequest::answer) {
                Some(Err(e)) => {
                    let refusal = e.to_string();
                    begin_refused = Some(e);
                    Err(refusal)
                }
                None | Some(Ok(())) => Ok(()),
            },
        )
        .map_err(BoxError::from)
    });
    // The proxies stop with the run (their listeners closed), whether or not it started.
    let creds = serving.and_then(crate::credentials::Serving::tally);
    // The folder names no proxy once the run's is gone.
    let forgotten = codex
        .as_ref()
        .map_or(Ok(()), crate::capture::CodexSandboxFolder::forget_run);
    drop(codex_held);
    // The tally is read even when the run failed to start (the next run's begin reads its own
    // baseline either way).
    let denied = denial_counter.map(|c| c.and_then(crate::denied_egress::SandboxCounter::end));
    let tally = net_lock.filter(|_| egress.is_some()).map(|held| {
        let t = crate::supervised::end(&net);
        crate::browser_idle::open(policy, &net);
        drop(held);
        t
    });
    if let Some(e) = begin_refused {
        return Err(e);
    }
    let report = report?;
    forgotten?;
    drop(lock);
    Ok(Some(SandboxRun {
        report: ProcessRunReport {
            child: report.child,
            cage: report.cage,
            notes: base_notes(plan),
        },
        net: tally,
        denied,
        creds,
    }))
}

/// The network of the box's live supervised sandbox, held for one run in a container of its
/// own that joins it (a terminal session of a box whose browser lives there, so the page sees
/// what the session serves): the sandbox cannot be torn down and no other run takes its
/// network until [`SharedNetwork::finish`], and the table holds this run's pins.
pub struct SharedNetwork {
    pid: i32,
    net: PathBuf,
    net_lock: FileLock,
    _lock: FileLock,
}

/// Hold the network of `sb`'s live supervised sandbox for a run pinned to `rules`. `Ok(None)`:
/// no sandbox answers, its sentry is gone, or another run holds its network.
pub fn share_network(
    sb: &StoredBox,
    rules: Vec<PinnedRule>,
) -> Result<Option<SharedNetwork>, BoxError> {
    let dir = dir_for(sb)?;
    let path = dir.join("lock");
    let Some(lock) =
        FileLock::try_take(&path, LockKind::Shared).map_err(|e| BoxError::io(&path, e))?
    else {
        return Ok(None);
    };
    let Some((pid, net)) = live_init(sb).filter(|(_, net)| net.join(NET_SOCK).exists()) else {
        return Ok(None);
    };
    let path = dir.join("net.lock");
    let Some(net_lock) =
        FileLock::try_take(&path, LockKind::Exclusive).map_err(|e| BoxError::io(&path, e))?
    else {
        return Ok(None);
    };
    crate::browser_idle::close(sb, &net)?;
    let hostname = format!("h5i-{}-sb", sb.manifest.name);
    crate::supervised::refresh_hosts(&net, &hostname, &rules)?;
    crate::supervised::begin(&net, &rules)?.answer()?;
    Ok(Some(SharedNetwork {
        pid,
        net,
        net_lock,
        _lock: lock,
    }))
}

impl SharedNetwork {
    /// Put `plan` in the held network: the sandbox's network and user namespaces, its name
    /// files, and its socket gate (the same socket() rules a run inside the sandbox gets).
    pub fn join(&self, plan: &mut BundlePlan) {
        crate::process::join_network_of(plan, self.pid);
        for name in ["hosts", "resolv.conf"] {
            plan.file_binds
                .push((self.net.join(name), Path::new("/etc").join(name)));
        }
        plan.socket_gate = Some(self.net.join(h5i_policy::spec_names::net_dir::GATE_SOCK));
    }

    /// The run ended: the table's counts and socket-gate decisions since it began, and the
    /// browser's idle window opened for `policy`; the network is let go.
    pub fn finish(self, policy: &ResolvedPolicy) -> Result<NetTally, String> {
        let tally = crate::supervised::end(&self.net);
        crate::browser_idle::open(policy, &self.net);
        drop(self.net_lock);
        tally
    }
}

fn base_notes(plan: &BundlePlan) -> h5i_runtime::bundle::BundleNotes {
    plan.to_config(|p| p.exists()).1
}

/// Which standard descriptors the caller has (closed at start stays closed; one the box's own
/// pty takes, `pty`, is not sent), and the list to send.
fn caller_stdio<'a>(
    standard: [BorrowedFd<'a>; 3],
    pty: [bool; 3],
) -> (Vec<BorrowedFd<'a>>, [bool; 3]) {
    let closed: Vec<RawFd> = h5i_runtime::stdio::closed_at_start().fds().collect();
    let mut open = [false; 3];
    let mut fds = Vec::new();
    for (n, fd) in standard.into_iter().enumerate() {
        let valid = !pty[n] && rustix::io::fcntl_getfd(fd).is_ok();
        if valid && !closed.contains(&fd.as_raw_fd()) {
            open[n] = true;
            fds.push(fd);
        }
    }
    (fds, open)
}

/// Make the sandbox: its cgroup (kept), bundle, listener and container. `Ok(None)` when the
/// cgroup cannot be made here.
fn build(
    sb: &StoredBox,
    dir: &Path,
    mut base: BundlePlan,
    ceiling: SandboxCeiling,
    digest: &str,
    runc: &Path,
) -> Result<Option<SandboxState>, BoxError> {
    let container = format!("{}-sb-{}", sb.manifest.name, &digest[..12]);
    sweep_orphaned_sandboxes(dir);
    let Ok(cage) = h5i_runtime::cage::ResourceCage::create(&container, ceiling.mem, ceiling.procs)
    else {
        return Ok(None);
    };
    base.cgroups_path = Some(cage.container_path());
    cage.keep();
    let bundle = dir.join("bundle");
    h5i_runtime::bundle::write_bundle(&base, &bundle).map_err(|e| BoxError::io(&bundle, e))?;
    let socket = dir.join("init.sock");
    let _ = fs::remove_file(&socket);
    let listener = rt::listen_at(&socket)?;
    let log_path = dir.join("init.log");
    let log = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| BoxError::io(&log_path, e))?;
    let mut cmd = Command::new(runc);
    if let Some(root) = crate::tier_host::runc_root() {
        cmd.arg("--root").arg(root);
    }
    cmd.arg("run")
        .arg("--detach")
        .arg("--preserve-fds")
        .arg("1")
        .arg("--pid-file")
        .arg(dir.join("init.pid"))
        .arg("--bundle")
        .arg(&bundle)
        .arg(&container)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| BoxError::io(&log_path, e))?)
        .stderr(log);
    let lfd = listener.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls place_for_exec
    // (fcntl and dup2 on a stack array, async-signal-safe); `lfd` stays open in the parent
    // until the child has exec'd.
    unsafe { cmd.pre_exec(move || h5i_sys::fds::place_for_exec(&[(lfd, rt::init::LISTEN_FD)])) };
    let mut status = cmd.status().map_err(|e| BoxError::io(runc, e))?;
    if !status.success() {
        // A container of this id left by an interrupted teardown (its state was lost, so
        // nothing named it): delete it and try once more.
        delete_container(&container);
        status = cmd.status().map_err(|e| BoxError::io(runc, e))?;
    }
    drop::<OwnedFd>(listener);
    if !status.success() {
        let text = fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        let _ = h5i_runtime::cage::remove_tree(&container);
        return Err(refused(format!(
            "the box's sandbox could not be started ({status}; {}: {})",
            log_path.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        )));
    }
    let state = SandboxState {
        digest: digest.to_string(),
        container,
        created_ms: now_ms(),
        box_dir: sb.paths.dir.clone(),
    };
    let path = dir.join("state.json");
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| BoxError::io(&path, e))?;
    f.write_all(&serde_json::to_vec(&state).unwrap_or_default())
        .map_err(|e| BoxError::io(&path, e))?;
    crate::events::append(
        &sb.paths,
        &crate::events::Event::new(
            "sandbox",
            format!(
                "made the box sandbox {} (digest {})",
                state.container,
                &digest[..12]
            ),
        ),
    )?;
    Ok(Some(state))
}

/// Remove the cgroups of runs whose h5i process is gone (killed mid-run), with what they left.
fn sweep_stale_runs(container: &str) {
    for name in h5i_runtime::cage::children(&format!("{container}/c")) {
        let Some(pid) = name
            .strip_prefix("run-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let gone = !h5i_sys::proc::exists(pid);
        if gone {
            let _ = h5i_runtime::cage::remove_tree(&format!("{container}/c/{name}"));
        }
    }
}

/// Tear down every other sandbox whose box directory is gone or whose init ended (idle
/// timeout), and that no run holds: their containers, cgroups and directories.
fn sweep_orphaned_sandboxes(ours: &Path) {
    let Some(parent) = ours.parent() else {
        return;
    };
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let dir = e.path();
        if dir != ours && e.file_name().to_string_lossy().starts_with("sandbox-") {
            sweep_if_orphaned(&dir);
        }
    }
}

/// Tear down the sandbox in `dir` when nothing is served from it any more (its box is gone,
/// its init ended, or it has no state: a making that was cut off) and no one holds it.
fn sweep_if_orphaned(dir: &Path) {
    let Ok(Some(lock)) = FileLock::try_take(&dir.join("lock"), LockKind::Exclusive) else {
        return;
    };
    let orphaned = match read_state(dir) {
        Some(s) => !s.box_dir.is_dir() || rt::connect(&dir.join("init.sock")).is_err(),
        None => true,
    };
    if orphaned && teardown_locked(dir).is_ok() {
        let _ = fs::remove_dir_all(dir);
    }
    drop(lock);
}

/// End the box's sandbox, if it has one: its container, cgroups and directory. Waits for runs
/// in flight.
pub fn teardown(sb: &StoredBox) -> Result<(), BoxError> {
    let dir = dir_for(sb)?;
    if !dir.exists() {
        return Ok(());
    }
    let path = dir.join("lock");
    let _lock = FileLock::wait(&path, LockKind::Exclusive).map_err(|e| BoxError::io(&path, e))?;
    // What the box's browser sent since the last run, while the sentry can still answer.
    if let Err(e) = crate::browser_idle::close(sb, &net_dir(&dir)) {
        eprintln!("h5i: warning: {e}");
    }
    teardown_locked(&dir)?;
    fs::remove_dir_all(&dir).map_err(|e| BoxError::io(&dir, e))
}

/// `h5i-runc delete --force` the container `id` (its init is killed).
fn delete_container(id: &str) {
    if let Some(runc) = crate::tier_host::runc_binary() {
        let mut cmd = Command::new(runc);
        if let Some(root) = crate::tier_host::runc_root() {
            cmd.arg("--root").arg(root);
        }
        // A container that is already gone answers "does not exist": nothing to delete.
        let _ = cmd
            .args(["delete", "--force", id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Delete the container and its cgroups and forget the state; the lock is held by the caller.
fn teardown_locked(dir: &Path) -> Result<(), BoxError> {
    let Some(state) = read_state(dir) else {
        return Ok(());
    };
    delete_container(&state.container);
    // A sentry killed before its box leaves the host's uplink records and table behind.
    if let Err(e) = h5i_hook::veth::sweep() {
        eprintln!("h5i: warning: {e}");
    }
    h5i_runtime::cage::remove_tree(&state.container).map_err(|e| BoxError::BadRequest {
        what: format!("cannot remove the sandbox's cgroup: {e}"),
        mend: "remove it by hand under your own cgroup's h5i/ directory".into(),
    })?;
    for f in ["state.json", "init.sock", "init.pid"] {
        let _ = fs::remove_file(dir.join(f));
    }
    for owned in [net_dir(dir), codex_dir(dir)] {
        if owned.exists() {
            fs::remove_dir_all(&owned).map_err(|e| BoxError::io(&owned, e))?;
        }
    }
    let bundle = dir.join("bundle");
    if bundle.exists() {
        fs::remove_dir_all(&bundle).map_err(|e| BoxError::io(&bundle, e))?;
    }
    Ok(())
}
