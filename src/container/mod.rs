//! The container tier: a box run as a rootless Podman container of the box's pinned image.
//!
//! Owns the order of one run:
//! 1. the engine (rootless Podman as the caller, or as the configured user when h5i is root:
//!    [`engine`]) and the pinned image ([`image`]);
//! 2. the run directory under the engine's runtime directory: the per-run hooks directory
//!    ([`hooks_dir`]), the listener sockets, and — for root — the box's paths attached in the
//!    engine's mount namespace ([`engine_ns`]);
//! 3. the resource cage (mem/procs, under h5i's own cgroup, handed to the engine when root made
//!    it) given to Podman as the container's cgroup parent; a host that cannot make one runs
//!    without and `status` marks the limits `*`;
//! 4. the broker: the egress proxy ([`egress`]) and the credential proxies, each on a listener
//!    a createContainer hook binds on the box's own loopback and hands over;
//! 5. `podman run` ([`podman_args`]: the article's flags) supervised on a pidfd, its exit code
//!    passed through; the wall clock kills every process in the cage (or the container by
//!    name when there is none);
//! 6. the evidence: the OCI spec Podman handed the runtime, captured by h5i-runc
//!    ([`evidence`]), the cage's OOM count (Podman's own OOMKilled flag misses a v1 OOM) and
//!    the box's CPU time and memory peak (the supervisor reaps Podman's client, never the box,
//!    so the receipt's figures come from the cage), the proxies' tallies; then everything of
//!    the run is removed.
//!
//! A browser box's box-lifetime browser ([`BrowserPart`], `crate::browser::sidecar`) is a run
//! of its own: a container of the box's image, running as the box's group
//! `crate::browser_box::SIDECAR_GID`, with no proxy of its own (Chrome is told the address
//! each run's proxy listens on, so between runs it reaches nothing but its loopback). Every
//! other run of that box joins the sidecar's user and network namespaces (`--userns` and
//! `--network container:NAME`: mounting `/sys` needs the user namespace owning the network
//! namespace), finds the relay's socket read-only at `/tmp/.agent-browser`, and holds the
//! box's browser-run lock for its life: one run at a time, since each run's proxy listens on
//! the one address Chrome was given.
//!
//! Must never: run rootful Podman, mount a host path the plan does not name, give the box a
//! network device (`--network none`: the proxy listener is its only way out), run a policy with
//! `net.unix` off on a runtime that cannot refuse `socket(AF_UNIX)` (`host-default`), or leave
//! a mount, socket, cgroup or container behind.
//!
//! Guarded by `tests/container_tier.rs`.

pub mod egress;
pub mod engine;
pub mod engine_ns;
pub mod evidence;
pub mod hooks_dir;
pub mod image;
mod image_shell;
pub mod orphans;
pub mod podman_args;
pub mod probe;

use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use h5i_policy::receipt::{CgroupUsage, EgressTally, OomReport};
use h5i_policy::spec_names::annotation;
use h5i_policy::{ContainerRuntime, NetMode, ResolvedPolicy};
use h5i_runtime::cage::ResourceCage;
use h5i_runtime::confine::seccomp::PROFILE_H5I_V2;
use h5i_runtime::supervise::ChildReport;

use crate::credentials::HandoffPlace;
use crate::error::BoxError;
use crate::store::{now_ms, StoredBox};
use engine::Engine;
use podman_args::{Bind, PodmanRun, BOX_OBJECTS, BOX_SPOOL, BOX_WORK};

/// The box's `HOME`: its private `/tmp`.
pub const BOX_HOME: &str = "/tmp";

/// What one container-tier run observed.
#[derive(Debug)]
pub struct ContainerRun {
    /// Podman's exit, as the supervisor saw it (the container's code passes through).
    pub child: ChildReport,
    /// OOM evidence from the cage.
    pub oom: Option<OomReport>,
    /// The box's own CPU time and memory peak, read from the cage (the supervised child is
    /// Podman's client, whose `wait4` figures are its own); `None` without a cage.
    pub usage: Option<CgroupUsage>,
    /// The proxies' counts (egress and credential), when any proxy ran.
    pub egress: Option<EgressTally>,
    /// Why mem/procs were not held for this run, when they were not.
    pub limits_unheld: Option<String>,
}

/// Everything a run needs beyond the box and its policy.
pub struct RunInputs<'a> {
    /// Command and arguments.
    pub argv: &'a [OsString],
    /// The wall clock.
    pub wall: Option<Duration>,
    /// Resolved secrets (env injection only at this tier).
    pub secrets: &'a [h5i_broker::secrets::ResolvedSecret],
    /// The credential grants, prepared (fail-closed) before anything started.
    pub creds: Option<crate::credentials::Prepared>,
    /// A pty of the container's own (`box shell` on a terminal).
    pub tty: bool,
    /// Whether this run is, or joins, the box's browser sidecar.
    pub browser: BrowserPart<'a>,
    /// What the box's warm caches grant the run (worked out by the verb:
    /// `crate::cache::run_grant`).
    pub caches: crate::process::CacheGrant,
}

/// How a run meets the box-lifetime browser of a browser box at this tier.
pub enum BrowserPart<'a> {
    /// Neither: a box without one (or whose sidecar is not running).
    None,
    /// This run is the sidecar: detached, its stdout the supervisor's pipe.
    Sidecar(SidecarIo<'a>),
    /// This run joins the running sidecar.
    Join(crate::browser_box::ContainerJoin),
}

/// The sidecar's wiring to its supervisor.
pub struct SidecarIo<'a> {
    /// Its stdout (the supervisor's pipe; stdin is empty, stderr the service log).
    pub stdout: std::os::fd::OwnedFd,
    /// Told, before Podman starts, the file the runtime writes the container init's pid to
    /// and the container's name.
    pub announce: &'a mut dyn FnMut(PathBuf, String),
}

/// Where a run finds the relay's socket: agent-browser's state directory in the box's HOME.
pub const RELAY_IN_BOX: &str = "/tmp/.agent-browser";

/// `<box>/browser/run.lock`: held exclusively by each run that joins the sidecar.
fn browser_run_lock(sb: &StoredBox) -> PathBuf {
    sb.paths.dir.join("browser").join("run.lock")
}

/// How the caller's standard descriptors reach the box. None of them a terminal: they pass
/// through as they are (Podman's `passthrough` log driver), those the caller had closed named
/// for h5i-runc to close again. Stdin and stdout on a terminal: a pty of the box's own (`-t`),
/// never the caller's terminal. Some but not all a terminal: conmon's pipes (Podman refuses
/// passthrough there, and the caller's terminal never enters the box).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StdioWiring {
    Passthrough(h5i_runtime::stdio::ClosedStdio),
    OwnPty,
    Relayed,
}

impl StdioWiring {
    fn for_caller(tty: bool) -> StdioWiring {
        use h5i_runtime::pty::is_terminal;
        if tty || (is_terminal(0) && is_terminal(1)) {
            StdioWiring::OwnPty
        } else if (0..3).any(is_terminal) {
            StdioWiring::Relayed
        } else {
            StdioWiring::Passthrough(h5i_runtime::stdio::closed_at_start())
        }
    }
}

fn refuse(what: impl Into<String>, mend: impl Into<String>) -> BoxError {
    BoxError::BadRequest {
        what: what.into(),
        mend: mend.into(),
    }
}

/// The refusal of `net.mode = "host"` for `sb` at a tier whose box has no network of its own
/// (`why`, which names its only way out).
pub(crate) fn host_network_refused(sb: &StoredBox, why: &str) -> BoxError {
    refuse(
        format!(
            "box `{}` asks for net.mode = \"host\", and {why}",
            sb.manifest.name
        ),
        "use net.mode = \"deny\" with net.egress for the hosts it needs, or isolation process for the host's network",
    )
}

/// Where root keeps its container runs: root's own directory, traversable by the engine user
/// but not writable by it, so nothing of a run can be renamed or replaced under h5i.
pub const ROOT_RUNS: &str = "/run/h5i-engine";

/// The run directory, removed by [`RunDir::drop`]. As root: `/run/h5i-engine/run-<id>`, root's
/// (0711), with one directory `out/` the engine may write (h5i-runc's spec copy). Otherwise:
/// `<XDG_RUNTIME_DIR>/h5i/run-<id>`, the caller's own (0700).
struct RunDir {
    path: PathBuf,
    /// Where the engine's runtime may write.
    out: PathBuf,
    /// Entries to remove in order (files, then directories), by their exact paths, never
    /// recursively.
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    /// Held for the run's life; dropped after the directory (fields drop after `drop`).
    _lock: orphans::RunLock,
}

/// The directory the caller's container runs (and their locks) are made in: root's
/// [`ROOT_RUNS`] when the engine is another user, else `<XDG_RUNTIME_DIR>/h5i`.
fn runs_dir(engine: &Engine) -> Result<PathBuf, BoxError> {
    if engine.switches_user {
        let parent = Path::new(ROOT_RUNS);
        private_dir(parent, 0o711, 0)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| BoxError::io(parent, e))?;
        Ok(parent.to_path_buf())
    } else {
        let parent = engine.runtime_dir.join("h5i");
        private_dir(&parent, 0o700, engine.uid)?;
        Ok(parent)
    }
}

/// Make `dir` with `mode`, or accept an existing one only when it is a real directory owned by
/// `uid` that no one else can write.
fn private_dir(dir: &Path, mode: u32, uid: u32) -> Result<(), BoxError> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(BoxError::io(dir, e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| BoxError::io(dir, e))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(refuse(
            format!(
                "{} is not a directory only its owner can write",
                dir.display()
            ),
            format!("remove it (h5i makes it again): rm -rf {}", dir.display()),
        ));
    }
    Ok(())
}

impl RunDir {
    fn create(engine: &Engine, id: &str) -> Result<RunDir, BoxError> {
        let parent = runs_dir(engine)?;
        let lock = orphans::RunLock::take(&parent, id).map_err(|e| BoxError::io(&parent, e))?;
        let path = parent.join(format!("run-{id}"));
        let out = path.join("out");
        let mode = if engine.switches_user { 0o711 } else { 0o700 };
        std::fs::DirBuilder::new()
            .mode(mode)
            .create(&path)
            .map_err(|e| BoxError::io(&path, e))?;
        if engine.switches_user {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o711))
                .map_err(|e| BoxError::io(&path, e))?;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&out)
                .and_then(|()| std::os::unix::fs::chown(&out, Some(engine.uid), Some(engine.gid)))
                .map_err(|e| BoxError::io(&out, e))?;
        } else {
            std::fs::create_dir(&out).map_err(|e| BoxError::io(&out, e))?;
        }
        Ok(RunDir {
            dirs: vec![path.clone(), out.clone()],
            path,
            out,
            files: Vec::new(),
            _lock: lock,
        })
    }

    /// The run's h5i-log relay directory, `out/log` (the engine user's, 0700), with the filter
    /// text, when `H5I_LOG` (else `RUST_LOG`) sets a filter that parses; else `None`. Podman's
    /// conmon starts h5i-runc, and h5i-runc the hooks, with environments of their own and
    /// stderr that is not the caller's: the filter and this directory reach them in the spec
    /// ([`annotations`], the hooks' own variables), they write their events here, and
    /// [`relay_events`] shows them after the run.
    fn relay_dir(&mut self, engine: &Engine) -> Result<Option<(String, PathBuf)>, BoxError> {
        let (Some((_, text)), Ok(Some(_))) = (h5i_log::directives(), h5i_log::filter()) else {
            return Ok(None);
        };
        let dir = self.out.join("log");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| BoxError::io(&dir, e))?;
        self.dirs.push(dir.clone());
        if engine.switches_user {
            std::os::unix::fs::chown(&dir, Some(engine.uid), Some(engine.gid))
                .map_err(|e| BoxError::io(&dir, e))?;
        }
        Ok(Some((text.trim().to_string(), dir)))
    }

    fn dir(&mut self, name: &str) -> Result<PathBuf, BoxError> {
        let d = self.path.join(name);
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&d)
            .map_err(|e| BoxError::io(&d, e))?;
        self.dirs.push(d.clone());
        Ok(d)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        // Plain removals of the entries h5i made, by path (unlink never follows a symlink),
        // deepest last: a directory that still held something (a mount that failed to detach
        // shows only in the engine's namespace, never here) is left rather than descended into.
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Root's attachments in the engine namespace, detached on drop.
struct Attached {
    ns: engine_ns::EngineNamespace,
    targets: Vec<PathBuf>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        engine_ns::detach_all(&self.ns, &self.targets);
    }
}

/// Where the run's binaries and host paths are, as Podman will see them.
struct Sources {
    runc: PathBuf,
    hook: PathBuf,
    work: PathBuf,
    spool: PathBuf,
    objects: PathBuf,
    /// The in-box `alternates` file (naming `/.h5i/objects`), when the workspace's own is plain.
    alternates: Option<PathBuf>,
    /// The warm dependency caches granted to this run: (the directory as Podman sees it, where
    /// the box sees it), each read-only.
    caches: Vec<(PathBuf, String)>,
    /// The relay's directory (agent-browser's state directory, holding the relay's socket),
    /// for a run that joins the box's browser sidecar.
    relay: Option<PathBuf>,
}

/// At `box create`: the image a container box will run, looked up in the engine's storage
/// (refused when missing: runs never pull). `None` at every other tier.
pub fn image_for_create(policy: &ResolvedPolicy) -> Result<Option<image::PinnedImage>, BoxError> {
    if policy.tier != h5i_policy::Tier::Container {
        return Ok(None);
    }
    check_runtime_holds(policy, &format!("profile `{}`", policy.profile))?;
    let Some(name) = &policy.image else {
        return Ok(None);
    };
    let engine = engine_for_run()?;
    image::inspect(&engine, name)?
        .map(Some)
        .ok_or_else(|| image::missing(&engine, name))
}

/// Refuse a policy the box's OCI runtime would not keep. `runtime = "host-default"` runs none
/// of h5i-runc's layers, so nothing refuses `socket(AF_UNIX)` there: with `net.unix` off (the
/// default) the box would hold what its policy denies. Checked at create (before any state)
/// and again at every run (a box made before this check).
fn check_runtime_holds(policy: &ResolvedPolicy, who: &str) -> Result<(), BoxError> {
    if policy.container_runtime == Some(ContainerRuntime::HostDefault) && !policy.net.unix {
        return Err(refuse(
            format!(
                "{who} asks for runtime = \"host-default\", which has no socket(AF_UNIX) gate (none of h5i-runc's layers), and its net.unix is off"
            ),
            "set unix = true in the profile's [net] to let the box make AF_UNIX sockets, or drop runtime = \"host-default\" (h5i-runc refuses them)",
        ));
    }
    Ok(())
}

fn engine_for_run() -> Result<Engine, BoxError> {
    Engine::for_caller().map_err(|e| {
        let text = e.to_string();
        let text = text.strip_prefix("refusing: ").unwrap_or(&text).to_owned();
        let (what, mend) = text
            .split_once("; to fix: ")
            .unwrap_or((&text, "see h5i box probe"));
        refuse(what, mend)
    })
}

/// Run `inputs.argv` in `sb` at the container tier.
pub fn run(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    inputs: RunInputs<'_>,
) -> Result<ContainerRun, BoxError> {
    if policy.net.mode == NetMode::Host {
        return Err(host_network_refused(
            sb,
            "the container tier gives a box no network of its own: its only way out is the egress proxy",
        ));
    }
    check_runtime_holds(policy, &format!("box `{}`", sb.manifest.name))?;
    let image_name = policy.image.clone().ok_or_else(|| {
        refuse(
            format!(
                "box `{}` is a container box without an image",
                sb.manifest.name
            ),
            "recreate it with --image",
        )
    })?;
    let engine = engine_for_run()?;
    reap_orphans(&engine);
    let image = image::pinned(&engine, sb, &image_name)?;
    let runc = crate::tier_host::runc_binary().ok_or_else(|| {
        refuse(
            "h5i-runc (the container tier's OCI runtime) is not beside h5i or on PATH",
            "install h5i with `cargo install --path .`, which puts h5i-runc beside h5i (or put it on PATH)",
        )
    })?;
    let hook = crate::tier_host::hook_binary().ok_or_else(|| {
        refuse(
            "h5i-hook (which brings up the box's loopback and hands in the proxy listeners) is not beside h5i or on PATH",
            "install h5i with `cargo install --path .`, which puts h5i-hook beside h5i (or put it on PATH)",
        )
    })?;
    for s in inputs.secrets {
        if s.inject != h5i_policy::SecretInject::Env {
            return Err(refuse(
                format!(
                    "secret `{}` asks for inject = \"{}\", which only the workspace tier supports",
                    s.name,
                    s.inject.as_str()
                ),
                "use inject = \"env\" at the container tier",
            ));
        }
    }
    let init = crate::tier_host::init_program()
        .ok_or_else(|| refuse(crate::tier_host::NO_INIT.0, crate::tier_host::NO_INIT.1))?;
    let mut inputs = inputs;
    let mut sidecar_io = None;
    let mut joins = None;
    match std::mem::replace(&mut inputs.browser, BrowserPart::None) {
        BrowserPart::None => {}
        BrowserPart::Sidecar(io) => sidecar_io = Some(io),
        BrowserPart::Join(j) => joins = Some(j),
    }
    let egress_plan = egress::plan_for(policy)?;
    // The sidecar has no proxy of its own: Chrome is pointed at the address each run's proxy
    // listens on in the network the runs share, and between runs nothing answers there.
    let chrome_proxy = sidecar_io.is_some() && egress_plan.is_some();
    let (egress_plan, creds) = match sidecar_io {
        Some(_) => (None, None),
        None => (egress_plan, inputs.creds.take()),
    };
    let _one_run = match &joins {
        Some(j) => Some(take_browser_run_lock(sb, j)?),
        None => None,
    };

    let id = format!(
        "{}-{}-{}",
        sb.manifest.name,
        std::process::id(),
        now_ms() % 100_000
    );
    let mut run_dir = RunDir::create(&engine, &id)?;
    let hooks_path = run_dir.dir("hooks")?;
    let log_relay = run_dir.relay_dir(&engine)?;

    // Read once (by the verb): what is mounted and the variables naming it come from the same
    // answer.
    let granted = std::mem::take(&mut inputs.caches);
    let relay = joins.as_ref().map(|j| j.relay.clone());
    let (sources, attached) = attach_sources(
        &engine,
        sb,
        policy,
        &granted.binds,
        &mut run_dir,
        (&runc, &hook),
        relay.as_deref(),
    )?;
    let (cage, limits_unheld) = cage_for(&id, policy, &engine);
    // The box's environment: plain values in argv, anything secret by name only.
    let mut env = box_env(sb, policy);
    env.extend(granted.env.into_iter().filter_map(|kv| {
        kv.split_once('=')
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
    }));
    // A browser box's Chromium and agent-browser (nothing for any other box).
    env.extend(
        crate::browser_box::vars(policy)?
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v)),
    );
    if chrome_proxy {
        env.extend(egress::proxy_env());
    }
    let mut by_name: Vec<(String, String)> = inputs
        .secrets
        .iter()
        .map(|s| (s.name.clone(), s.value().to_owned()))
        .collect();
    let place = HandoffPlace {
        dir: run_dir.path.clone(),
        owner: engine.switches_user.then_some((engine.uid, engine.gid)),
        hook: sources.hook.clone(),
    };
    let broker = Broker::start(egress_plan, creds, &place, &id, &mut run_dir)?;
    env.extend(broker.env.iter().cloned());
    // The credential proxy's base URL is among the variables Podman passes by name.
    let box_vars: Vec<String> = env
        .iter()
        .chain(&broker.by_name)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let agent = agent_binds(
        policy,
        (&engine, &image.id),
        &mut run_dir,
        &sources.hook,
        &box_vars,
    )?;
    // What the export says of the shim's cross-check follows what this run's box user got
    // (a pin from before the create-time check, or an engine user of another uid).
    if agent.shim_not_agent_shell != image.shim_not_agent_shell {
        let mut pin = image.clone();
        pin.shim_not_agent_shell = agent.shim_not_agent_shell.clone();
        image::write_pin(&sb.paths.dir, &pin)?;
    }
    by_name.extend(broker.by_name.iter().cloned());
    let hooks: Vec<Vec<String>> = std::iter::once(vec![
        sources.hook.display().to_string(),
        "loopback".to_string(),
        "--inside".to_string(),
    ])
    .chain(broker.hooks.iter().cloned())
    .collect();
    let hook_env: Vec<String> = log_relay
        .iter()
        .flat_map(|(filter, dir)| {
            [
                format!("{}={filter}", h5i_log::VAR),
                format!("{}={}", h5i_log::DIR_VAR, dir.display()),
            ]
        })
        .collect();
    let hook_files = hooks_dir::write(&hooks_path, &id, &hooks, &hook_env)
        .map_err(|e| BoxError::io(&hooks_path, e))?;
    run_dir.files.extend(hook_files);

    let agent_planned: Vec<(String, String)> = agent
        .binds
        .iter()
        .map(|b| (b.dest.display().to_string(), b.source.display().to_string()))
        .collect();
    let agent_tmpfs = agent.config_tmpfs.as_ref().map(|d| d.display().to_string());
    let container_name = format!("h5i-{id}");
    let wiring = match sidecar_io {
        // Detached: stdin empty, stdout the supervisor's pipe, passed through as they are.
        Some(_) => StdioWiring::Passthrough(h5i_runtime::stdio::ClosedStdio::default()),
        None => StdioWiring::for_caller(inputs.tty),
    };
    let pid_file = sidecar_io.as_ref().map(|_| run_dir.out.join("sidecar.pid"));
    if let Some(f) = &pid_file {
        run_dir.files.push(f.clone());
    }
    let host_default = policy.container_runtime == Some(ContainerRuntime::HostDefault);
    let podman_run = PodmanRun {
        runtime: (!host_default).then(|| sources.runc.clone()),
        hooks_dir: Some(hooks_path.clone()),
        name: container_name.clone(),
        user: (
            engine.uid,
            match sidecar_io {
                Some(_) => crate::browser_box::SIDECAR_GID,
                None => engine.gid,
            },
        ),
        joins: joins.as_ref().map(|j| j.container.clone()),
        pid_file: pid_file.clone(),
        keep_id_maps: match sidecar_io {
            Some(_) => Some(engine.keep_id_maps().map_err(|e| {
                refuse(
                    format!("cannot spell out keep-id's mapping for the box's browser: {e}"),
                    "give the engine user ranges in /etc/subuid and /etc/subgid (`make setup` does)",
                )
            })?),
            None => None,
        },
        run_id: id.clone(),
        image: image.id.clone(),
        argv: inputs.argv.to_vec(),
        work: Bind {
            source: sources.work.clone(),
            dest: BOX_WORK.into(),
            readonly: false,
        },
        binds: box_binds(&sources).into_iter().chain(agent.binds).collect(),
        config_tmpfs: agent.config_tmpfs,
        login_shell: agent.login_shell,
        env,
        env_by_name: by_name.iter().map(|(k, _)| k.clone()).collect(),
        cgroup_parent: cage.as_ref().map(ResourceCage::path),
        annotations: annotations(policy, &run_dir.out, &id, wiring, log_relay.as_ref()),
        shm_bytes: crate::browser_box::is_browser_box(policy)
            .then(|| crate::browser_box::shm_bytes(policy)),
        tty: wiring == StdioWiring::OwnPty,
        passthrough: matches!(wiring, StdioWiring::Passthrough(_)),
        init: init.clone(),
        wall: inputs.wall,
    };
    let evidence_file = evidence::file_for(&run_dir.out, &id);
    run_dir.files.push(evidence_file.clone());
    let mut cmd = engine.podman();
    cmd.args(podman_run.args());
    for (k, v) in &by_name {
        cmd.env(k, v);
    }
    if let (Some(io), Some(f)) = (sidecar_io, &pid_file) {
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::from(io.stdout));
        (io.announce)(f.clone(), container_name.clone());
    }
    let mut forwarded = None;
    let child = {
        let mut on_wall =
            || deliver(cage.as_ref(), &engine, &container_name, libc::SIGKILL) || cage.is_some();
        let mut on_signal = |sig| {
            forwarded = Some(sig);
            deliver(cage.as_ref(), &engine, &container_name, sig)
        };
        h5i_runtime::supervise::run_supervised_forwarding(
            cmd,
            inputs.wall,
            &mut on_wall,
            &mut on_signal,
        )
    };
    // Podman can exit with its container still running (a signal in the window between the
    // container's start and Podman's attach made it exit 0, seen in CI): nothing of a run
    // outlives it, and such a run did not succeed.
    let outlived = cage.as_ref().filter(|c| !c.member_pids().is_empty());
    let child = match outlived {
        None => child,
        Some(c) => {
            c.kill_members();
            engine.podman_quiet(&["rm", "--force", "--time", "0", &container_name]);
            child.map(|mut report| {
                report.exit.code = None;
                report.exit.signal = Some(forwarded.unwrap_or(libc::SIGKILL));
                report
            })
        }
    };

    if let Some((_, dir)) = &log_relay {
        relay_events(dir, engine.uid);
    }
    let tally = broker.finish();
    let cage_report = cage.as_ref().map(ResourceCage::report);
    let oom = cage_report.as_ref().and_then(|r| r.oom.clone());
    let usage = cage_report.map(|r| r.usage);
    let captured = evidence::read_capture(&evidence_file, engine.uid);
    drop(cage);
    let stale_namespace = attached
        .as_ref()
        .is_some_and(|a| !a.ns.still_current(&engine));
    drop(attached);
    let child = child?;
    if stale_namespace {
        return Err(refuse(
            "the engine's rootless Podman pause process was replaced during the run, so the box ran without its workspace attached (nothing it wrote landed)",
            "run it again; if it repeats, stop whatever restarts Podman's pause process (podman system migrate)",
        ));
    }
    evidence::record(
        sb,
        &evidence::RunEvidence {
            runtime: if host_default {
                evidence::RuntimeUsed::HostDefault(
                    probe::podman_facts(&engine)
                        .map(|f| f.runtime)
                        .unwrap_or_else(|_| "Podman's default".into()),
                )
            } else {
                evidence::RuntimeUsed::H5iRunc(runc.display().to_string())
            },
            engine_user: engine.user.clone(),
            image: image.clone(),
            cgroup_parent: podman_run.cgroup_parent.clone(),
            limits_unheld: limits_unheld.clone(),
            argv_flags: podman_args::confinement_flags_for(
                podman_run.user,
                podman_run.joins.as_deref(),
            ),
            joined_browser: podman_run.joins.clone(),
            init: Some(init),
            agent_binds: agent_planned,
            agent_tmpfs,
            spec: captured,
        },
    )?;
    drop(run_dir);
    Ok(ContainerRun {
        child,
        oom,
        usage,
        egress: tally,
        limits_unheld,
    })
}

/// What an agent box gets beside its workspace at this tier.
struct AgentBinds {
    binds: Vec<Bind>,
    /// A writable tmpfs for the agent's config directory in HOME (see [`agent_binds`]).
    config_tmpfs: Option<PathBuf>,
    /// The box user's login shell, when it must not be Podman's `/bin/sh` (a Codex box's
    /// bash, where the tee shim is: [`PodmanRun::login_shell`](podman_args::PodmanRun)).
    login_shell: Option<String>,
    /// Why the tee shim is not the shell a Codex box's agent runs its commands through, when
    /// it is not ([`shim_not_agent_shell`]).
    shim_not_agent_shell: Option<String>,
}

/// Why the tee shim cannot be the agent's shell in a box of `shell`'s image run by `engine`
/// (the box user's uid is the engine user's: `--userns=keep-id`): the image has no bash, or
/// its own passwd entry for that uid names another shell.
fn shim_not_agent_shell(shell: &image_shell::ImageShell, engine: &Engine) -> Option<String> {
    match &shell.bash {
        None => Some("the box's image has no bash, over which h5i binds its shell shim".into()),
        Some(_) => shell.not_agent_shell(engine.uid),
    }
}

/// At create, for a Codex box at this tier (`pin` is its image): refuse an image with no bash
/// (the tee shim, which records each command the agent runs, is bound over the image's bash),
/// and keep in the pin why the shim cannot be the agent's shell when the image's own passwd
/// entry for the box user names another shell (the report then says the cross-check of the
/// hooks' `Bash` calls against the shim's commands does not apply, rather than finding gaps).
pub fn check_shim_image(
    policy: &ResolvedPolicy,
    pin: &mut image::PinnedImage,
) -> Result<(), BoxError> {
    if policy.tier != h5i_policy::Tier::Container
        || policy.agent != Some(h5i_policy::AgentRuntime::Codex)
    {
        return Ok(());
    }
    let engine = engine_for_run()?;
    let shell = image_shell::of_image(&engine, &pin.id)?;
    if shell.bash.is_none() {
        return Err(refuse(
            format!(
                "the image {} has no bash (/usr/bin/bash or /bin/bash): a Codex box's shell shim, which records each command the agent runs, is bound over it",
                pin.name
            ),
            "use an image with bash (`make images` builds localhost/h5i-agent-codex:latest), or a profile without the Codex agent",
        ));
    }
    pin.shim_not_agent_shell = shim_not_agent_shell(&shell, &engine);
    Ok(())
}

/// An agent box's skill, its settings from h5i and the capture hook, all read-only, written
/// into the run directory (which the engine reaches; removed with it): Claude Code gets its
/// managed settings at `/etc/claude-code` and the skill at `~/.claude/skills/h5i`; Codex gets
/// its system folder at `/etc/codex` (config naming this run's credential proxy, the hooks, and
/// the skill under `skills/h5i`, where Codex reads system skills) and the tee shim
/// (`h5i_hook::tee_shim`): the hook over the image's `bash`, and the image's own bash
/// ([`image_bash`]; its libraries are the box's) at the shim's private path. The box's HOME is its
/// private `/tmp`, where the runtime would make `~/.claude` (the skill's mount point's parent)
/// root's and unwritable by the box, so a Claude box gets a tmpfs of its own there, writable
/// by every user of the box (1777, like `/tmp`) and `nosuid,nodev`, for Claude Code's state.
fn agent_binds(
    policy: &ResolvedPolicy,
    (engine, image_id): (&Engine, &str),
    run_dir: &mut RunDir,
    hook: &Path,
    box_vars: &[String],
) -> Result<AgentBinds, BoxError> {
    use h5i_policy::AgentRuntime;
    let Some(runtime) = policy.agent else {
        return Ok(AgentBinds {
            binds: Vec::new(),
            config_tmpfs: None,
            login_shell: None,
            shim_not_agent_shell: None,
        });
    };
    let ro = |source: PathBuf, dest: &str| Bind {
        source,
        dest: dest.into(),
        readonly: true,
    };
    let system = run_dir.dir("agent-settings")?;
    let config_dir = Path::new(BOX_HOME).join(crate::box_home::config_dir_name(runtime));
    let mut binds = vec![ro(hook.to_path_buf(), crate::capture::HOOK_IN_BOX)];
    let skill_parent = match runtime {
        AgentRuntime::Claude => {
            let settings = crate::capture::tool_hooks(runtime);
            let files = [(crate::capture::CLAUDE_SETTINGS_FILE, settings.as_str())];
            run_dir
                .files
                .extend(crate::capture::write_folder(&system, &files)?);
            run_dir.dir("skill")?
        }
        AgentRuntime::Codex => {
            let files = crate::capture::codex_files(box_vars);
            let files = files.each_ref().map(|(n, t)| (*n, t.as_str()));
            run_dir
                .files
                .extend(crate::capture::write_folder(&system, &files)?);
            run_dir.dir("agent-settings/skills")?
        }
    };
    let skill = skill_parent.join("h5i");
    let written = crate::skill::install(&skill)?;
    // Removed deepest last by RunDir: each directory the install made, parents first.
    let mut dirs: Vec<PathBuf> = written
        .iter()
        .flat_map(|f| f.ancestors().skip(1))
        .filter(|d| d.starts_with(&skill))
        .map(Path::to_path_buf)
        .collect();
    dirs.sort_by_key(|d| d.components().count());
    dirs.dedup();
    run_dir.dirs.extend(dirs);
    run_dir.files.extend(written);
    binds.push(ro(system, runtime.system_dir()));
    Ok(match runtime {
        AgentRuntime::Claude => {
            let at = config_dir.join("skills/h5i");
            binds.push(Bind {
                source: skill,
                dest: at,
                readonly: true,
            });
            AgentBinds {
                binds,
                config_tmpfs: Some(config_dir),
                login_shell: None,
                shim_not_agent_shell: None,
            }
        }
        AgentRuntime::Codex => {
            // The tee shim: h5i-hook over each of the image's bash paths, the image's own bash
            // (copied out of it) at the shim's private path.
            // Codex runs every command through the user's login shell (its passwd entry),
            // which Podman's keep-id entry makes `/bin/sh`: the entry names the shim instead.
            use h5i_hook::tee_shim::{REAL_BASH, SHIM_AT};
            let mut login_shell = None;
            let shell = image_shell::of_image(engine, image_id)?;
            if let Some(bash) = &shell.bash {
                binds.push(ro(bash.clone(), REAL_BASH));
                binds.extend(SHIM_AT.iter().map(|at| ro(hook.to_path_buf(), at)));
                login_shell = SHIM_AT.first().map(|s| (*s).to_owned());
            }
            AgentBinds {
                binds,
                config_tmpfs: None,
                login_shell,
                shim_not_agent_shell: shim_not_agent_shell(&shell, engine),
            }
        }
    })
}

/// Remove what container runs whose h5i was killed left running (`orphans`); best effort, and
/// said on stderr so a user sees why a container went away.
fn reap_orphans(engine: &Engine) {
    let Ok(runs) = runs_dir(engine) else {
        return;
    };
    for id in orphans::reap(engine, &runs) {
        eprintln!("h5i: removed container h5i-{id}, left running by an h5i that was killed");
    }
}

/// At `abort` and `rm`: the same reaping, when this host has a container engine for the caller.
pub fn reap_orphaned_runs() {
    if let Ok(engine) = engine_for_run() {
        reap_orphans(&engine);
    }
}

/// The binds beside the workspace: the borrowed objects read-only at `/.h5i/objects`, the in-box
/// `alternates` naming them (read-only, over the workspace's own, which names the store's host
/// path), the granted warm caches read-only under `/.h5i/cache`, and the spool. No host path of
/// the store or the parent is a box path.
fn box_binds(sources: &Sources) -> Vec<Bind> {
    let mut binds = vec![Bind {
        source: sources.objects.clone(),
        dest: BOX_OBJECTS.into(),
        readonly: true,
    }];
    if let Some(alternates) = &sources.alternates {
        binds.push(Bind {
            source: alternates.clone(),
            dest: crate::process::in_box_alternates(),
            readonly: true,
        });
    }
    binds.extend(sources.caches.iter().map(|(source, inside)| Bind {
        source: source.clone(),
        dest: PathBuf::from(inside),
        readonly: true,
    }));
    binds.push(Bind {
        source: sources.spool.clone(),
        dest: BOX_SPOOL.into(),
        readonly: false,
    });
    if let Some(relay) = &sources.relay {
        binds.push(Bind {
            source: relay.clone(),
            dest: RELAY_IN_BOX.into(),
            readonly: true,
        });
    }
    binds
}

/// Take `sb`'s browser-run lock for a run joining its sidecar `join`, or refuse: another run
/// holds it, and its proxy listens on the one address the box's Chrome was given.
fn take_browser_run_lock(
    sb: &StoredBox,
    join: &crate::browser_box::ContainerJoin,
) -> Result<crate::file_lock::FileLock, BoxError> {
    let path = browser_run_lock(sb);
    match crate::file_lock::FileLock::try_take(&path, crate::file_lock::LockKind::Exclusive) {
        Ok(Some(lock)) => Ok(lock),
        Ok(None) => Err(refuse(
            format!(
                "another run of box `{}` is using the box's browser (container {}): at the container tier a browser box's runs share its browser's network, where Chrome's one proxy address is the running run's egress proxy, so they run one at a time",
                sb.manifest.name, join.container
            ),
            "wait for that run (or shell session) to end, then run again",
        )),
        Err(e) => Err(BoxError::io(&path, e)),
    }
}

/// Deliver `sig` to the run's payload, as a terminal delivers it to its foreground group: to
/// every process in the run's cage, else through Podman. Podman itself is not signalled: it
/// exits when its container does, and a signal that reaches it before it has attached makes it
/// exit with the container still running. False when there was nothing to deliver it to yet.
fn deliver(cage: Option<&ResourceCage>, engine: &Engine, name: &str, sig: libc::c_int) -> bool {
    match cage {
        Some(c) => {
            let members = c.member_pids();
            for pid in &members {
                // Through a pidfd: a pid read from the cage that has ended since is never
                // signalled in its new life once the pidfd is open.
                if let Ok(fd) = h5i_sys::pidfd::open(*pid) {
                    let _ = h5i_sys::pidfd::send_signal(&fd, sig);
                }
            }
            !members.is_empty()
        }
        None => engine.podman_quiet(&["kill", "--signal", &sig.to_string(), name]),
    }
}

/// The run's share of the broker: the egress proxy and the credential proxies, each waiting
/// for the listener its createContainer hook hands over from the box's loopback.
struct Broker {
    /// Hook argvs to declare after `loopback`.
    hooks: Vec<Vec<String>>,
    /// Plain variables (the proxy addresses).
    env: Vec<(String, String)>,
    /// Variables passed by name only (base URLs and per-run dummies).
    by_name: Vec<(String, String)>,
    egress: Option<egress::EgressServing>,
    creds: Option<crate::credentials::Serving>,
}

impl Broker {
    fn start(
        egress_plan: Option<h5i_broker::egress::EgressPlan>,
        creds: Option<crate::credentials::Prepared>,
        place: &HandoffPlace,
        id: &str,
        run_dir: &mut RunDir,
    ) -> Result<Broker, BoxError> {
        let mut b = Broker {
            hooks: Vec::new(),
            env: Vec::new(),
            by_name: Vec::new(),
            egress: None,
            creds: None,
        };
        if let Some(plan) = egress_plan {
            let (hook_argv, serving) = egress::attach(plan, place, id)?;
            run_dir
                .files
                .push(place.dir.join(format!("egress-{id}.sock")));
            b.hooks.push(hook_argv);
            b.env.extend(egress::proxy_env());
            b.egress = Some(serving);
        }
        if let Some(creds) = creds {
            let mut cred_env = Vec::new();
            b.creds = Some(creds.attach_parts(&mut cred_env, &mut b.hooks, false, place)?);
            b.by_name.extend(cred_env.into_iter().filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            }));
        }
        Ok(b)
    }

    /// Stop every proxy; their counts as one tally (`None` when no proxy ran).
    fn finish(self) -> Option<EgressTally> {
        let egress = self.egress.and_then(egress::EgressServing::finish);
        let creds = self
            .creds
            .map(crate::credentials::Serving::finish)
            .and_then(|r| crate::credentials::tally(&r));
        match egress {
            Some(r) => Some(r.tally.merged(creds)),
            None => creds,
        }
    }
}

/// Where Podman finds h5i's binaries and the box's paths. Unprivileged: where they are. As
/// root: attached under the run directory in the engine's mount namespace (`engine_ns`), the
/// workspace and spool idmapped so the engine user (the box's user) can write them.
fn attach_sources(
    engine: &Engine,
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    granted: &[h5i_runtime::bundle::Bind],
    run_dir: &mut RunDir,
    (runc, hook): (&Path, &Path),
    relay: Option<&Path>,
) -> Result<(Sources, Option<Attached>), BoxError> {
    let alternates = crate::process::alternates_bind(sb)?.map(|(host, _)| host);
    if !engine.switches_user {
        let sources = Sources {
            runc: runc.to_path_buf(),
            hook: hook.to_path_buf(),
            work: sb.paths.workspace(),
            spool: sb.paths.spool(),
            objects: sb.manifest.store.join("objects"),
            alternates,
            caches: granted
                .iter()
                .map(|g| (g.source.clone(), g.dest.to_string_lossy().into_owned()))
                .collect(),
            relay: relay.map(Path::to_path_buf),
        };
        return Ok((sources, None));
    }
    let mut ns = engine_ns::engine_namespace(engine).map_err(|e| refuse_from(&e))?;
    // The box's trees are the box range's on disk (h5i-box: `identity`); the engine user sees
    // them as its own and writes them as the range.
    let ids = crate::identity::Mapping::for_caller()?;
    ids.hold(&sb.paths.dir, &[sb.paths.workspace(), sb.paths.spool()])?;
    // A browser box's sidecar writes as the box's group SIDECAR_GID (a screenshot in the
    // workspace): on disk that is the range's group of that number, as at the kernel tiers.
    let sidecar_group = if crate::browser_box::is_browser_box(policy) {
        let gid = crate::browser_box::SIDECAR_GID;
        let host = engine.keep_id_host_gid(gid).map_err(|e| {
            refuse(
                format!("cannot map the browser's group {gid} for the engine user: {e}"),
                "give the engine user a range in /etc/subgid (`make setup` does)",
            )
        })?;
        Some((ids.gid + gid, host))
    } else {
        None
    };
    ns.map_disk_owner((ids.uid, ids.gid), (engine.uid, engine.gid), sidecar_group)
        .map_err(|e| refuse_from(&e))?;
    let mut sources = Sources {
        runc: run_dir.path.join("bin/h5i-runc"),
        hook: run_dir.path.join("bin/h5i-hook"),
        work: run_dir.path.join("work"),
        spool: run_dir.path.join("spool"),
        objects: run_dir.path.join("objects"),
        alternates: alternates.as_ref().map(|_| run_dir.path.join("alternates")),
        caches: Vec::new(),
        relay: relay.map(|_| run_dir.path.join("relay")),
    };
    // (host path, mount point, a file, idmapped and writable)
    let mut plan = vec![
        (sb.paths.workspace(), sources.work.clone(), false, true),
        (sb.paths.spool(), sources.spool.clone(), false, true),
        (
            sb.manifest.store.join("objects"),
            sources.objects.clone(),
            false,
            false,
        ),
    ];
    if let (Some(host), Some(at)) = (&alternates, &sources.alternates) {
        plan.push((host.clone(), at.clone(), true, false));
    }
    if let (Some(host), Some(at)) = (relay, &sources.relay) {
        plan.push((host.to_path_buf(), at.clone(), false, false));
    }
    // The caches: read-only and not idmapped (refresh left them readable by every identity).
    for (i, g) in granted.iter().enumerate() {
        let at = run_dir.path.join(format!("cache-{i}"));
        plan.push((g.source.clone(), at.clone(), false, false));
        sources
            .caches
            .push((at, g.dest.to_string_lossy().into_owned()));
    }
    // h5i's binaries: used where they are when the engine user can reach and run them there
    // (an install under /usr/local), else attached too (a build tree under /root).
    let mut binaries = Vec::new();
    for (binary, at) in [(runc, &mut sources.runc), (hook, &mut sources.hook)] {
        if executable_by(binary, engine.uid, engine.gid) {
            *at = binary.to_path_buf();
        } else {
            binaries.push((binary.to_path_buf(), at.clone(), true, false));
        }
    }
    if !binaries.is_empty() {
        run_dir.dir("bin")?;
        plan.extend(binaries);
    }
    let mut attach = Vec::new();
    for (source, target, file, idmapped) in plan {
        engine_ns::mount_point(&target, file).map_err(|e| refuse_from(&e))?;
        if file {
            run_dir.files.push(target.clone());
        } else {
            run_dir.dirs.push(target.clone());
        }
        attach.push(engine_ns::Attach {
            readonly: !idmapped,
            source,
            target,
            idmapped,
        });
    }
    engine_ns::attach_all(&ns, &attach).map_err(|e| refuse_from(&e))?;
    let attached = Attached {
        ns,
        targets: attach.into_iter().map(|a| a.target).collect(),
    };
    Ok((sources, Some(attached)))
}

/// Whether the user `uid`/`gid` (no supplementary groups) can reach and execute `path`: every
/// ancestor searchable by it and the file executable by it, from the permission bits alone.
fn executable_by(path: &Path, uid: u32, gid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let allows = |m: &std::fs::Metadata| {
        let mode = m.mode();
        if m.uid() == uid {
            mode & 0o100 != 0
        } else if m.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        }
    };
    let Ok(real) = std::fs::canonicalize(path) else {
        return false;
    };
    std::fs::metadata(&real).is_ok_and(|m| m.is_file() && allows(&m))
        && real
            .ancestors()
            .skip(1)
            .all(|d| std::fs::metadata(d).is_ok_and(|m| allows(&m)))
}

/// The cage holding mem/procs under h5i's own cgroup, handed to the engine when root made it;
/// or, when none can be made here, the reason (the run goes ahead; `status` marks the limits).
fn cage_for(
    id: &str,
    policy: &ResolvedPolicy,
    engine: &Engine,
) -> (Option<ResourceCage>, Option<String>) {
    let made = ResourceCage::create(id, policy.resources.mem_bytes, policy.resources.procs)
        .and_then(|mut c| {
            if engine.switches_user {
                c.delegate_to(engine.uid, engine.gid)?;
            }
            Ok(c)
        });
    match made {
        Ok(c) => (Some(c), None),
        Err(e) => (None, Some(e.to_string())),
    }
}

/// The box's plain variables (none secret: these go on Podman's command line).
fn box_env(sb: &StoredBox, policy: &ResolvedPolicy) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("HOME".into(), BOX_HOME.into()),
        ("TMPDIR".into(), "/tmp".into()),
        ("H5I_ENV_ID".into(), sb.manifest.name.clone()),
        (
            "H5I_ENV_POLICY_DIGEST".into(),
            sb.manifest.policy_digest.clone(),
        ),
        ("H5I_ENV_CAPTURE_SPOOL".into(), BOX_SPOOL.into()),
    ];
    for k in ["TERM", "LANG", "LC_ALL", "COLORTERM", "NO_COLOR"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.into(), v));
        }
    }
    env.extend(
        crate::agent::runtime_env(policy.agent)
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

/// Show on this process's stderr what h5i-runc and the hooks relayed into `dir` (h5i-log's
/// relay, the engine user `owner`'s), in time order, each line led by who wrote it and escaped
/// (a spawn event carries the box's argv), then leave `dir` empty for the run directory's
/// removal. `drain` bounds what is read and refuses what is not the engine user's own.
fn relay_events(dir: &Path, owner: u32) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for r in h5i_log::drain(dir, owner) {
        let _ = writeln!(
            err,
            "{}: {}",
            crate::escape::escape_controls(&r.from),
            crate::escape::escape_controls(&r.line)
        );
    }
}

/// h5i-runc's confinement annotations for the box, the evidence capture (into `out`), the
/// standard descriptors the caller had closed (passed through as `/dev/null`), and,
/// with a `relay` (filter text, directory), h5i-log's relay.
fn annotations(
    policy: &ResolvedPolicy,
    out: &Path,
    id: &str,
    wiring: StdioWiring,
    relay: Option<&(String, PathBuf)>,
) -> Vec<(String, String)> {
    let landlock = serde_json::json!({
        "read": ["/"],
        "write": [BOX_WORK, "/tmp", BOX_SPOOL, "/dev"],
    });
    let mut annotations = vec![
        (annotation::LANDLOCK.into(), landlock.to_string()),
        (annotation::SECCOMP.into(), PROFILE_H5I_V2.into()),
        (
            annotation::NET_UNIX.into(),
            if policy.net.unix { "true" } else { "false" }.into(),
        ),
        (
            evidence::CAPTURE_ANNOTATION.into(),
            evidence::file_for(out, id).display().to_string(),
        ),
    ];
    // Always named, empty when the policy grants none: a key h5i leaves out could be filled
    // from elsewhere in the spec Podman builds (an image's annotations are refused at pin
    // time; this keeps the grant h5i's either way).
    let families = crate::process::family_grants(policy);
    if families.is_empty() {
        annotations.push((annotation::NET_FAMILIES.into(), String::new()));
    }
    annotations.extend(families);
    if let StdioWiring::Passthrough(closed) = wiring {
        if let Some(v) = closed.annotation() {
            annotations.push((h5i_runtime::stdio::ANNOTATION_CLOSED.into(), v));
        }
    }
    if let Some((filter, dir)) = relay {
        annotations.push((annotation::LOG.into(), filter.clone()));
        annotations.push((annotation::LOG_DIR.into(), dir.display().to_string()));
    }
    annotations
}

fn refuse_from(e: &engine_ns::EngineNsError) -> BoxError {
    let text = e.to_string();
    let text = text.strip_prefix("refusing: ").unwrap_or(&text).to_owned();
    let (what, mend) = text
        .split_once("; to fix: ")
        .unwrap_or((&text, "see h5i box probe"));
    refuse(what, mend)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_binary_is_used_in_place_only_when_the_engine_user_can_reach_and_run_it() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("bin");
        std::fs::create_dir(&sub).unwrap();
        let bin = sub.join("h5i-runc");
        std::fs::write(&bin, b"#!/bin/sh\n").unwrap();
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        set(dir.path(), 0o755);
        set(&sub, 0o755);
        set(&bin, 0o755);
        // A uid and gid that own nothing here: only the "other" bits count for it.
        let (uid, gid) = (4_000_123, 4_000_123);
        // Every ancestor up to / must be searchable too; /tmp and / are.
        assert!(executable_by(&bin, uid, gid));
        set(&bin, 0o750);
        assert!(!executable_by(&bin, uid, gid), "not executable by others");
        set(&bin, 0o755);
        set(&sub, 0o700);
        assert!(
            !executable_by(&bin, uid, gid),
            "an ancestor it cannot search"
        );
        assert!(!executable_by(&dir.path().join("missing"), uid, gid));
    }
}
