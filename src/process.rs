//! The process tier from the box's side: turn a box and its verified policy into a
//! [`BundlePlan`] and run it through `h5i-runc`.
//!
//! Owns the mapping of policy words to host paths and box paths (`h5i_policy::inbox`): `$WORK`
//! is the box's workspace, seen at `/work`, where every run starts; `$HOME` is the box's own
//! HOME `<box>/home` (seeded at create, never the user's), seen at `/.h5i/home`; the object
//! store the workspace borrows from is granted read-only at `/.h5i/objects`, and the box's git
//! reads an `alternates` file naming that path (a read-only file bind over the workspace's own,
//! which keeps the host path for h5i's host-side git); the spool is `/.h5i/spool`. So the box
//! never sees the host path of its workspace or of the parent repository in `pwd`, its
//! environment or its `.git` (mount sources in `/proc/self/mountinfo` aside).
//!
//! Must never: grant the parent repository's refs, config or hooks, or the user's home
//! directory; mount an absolute policy grant over (or around) the in-box workspace or h5i's own
//! places.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use h5i_policy::{inbox, NetMode, ResolvedPolicy};
use h5i_runtime::bundle::{Bind, BundlePlan, Overlay};
use h5i_runtime::process_tier::{ProcessRunReport, RuncInvocation};

use crate::error::BoxError;
use crate::store::{now_ms, StoredBox};
use crate::tier_host::{hook_binary, runc_binary, runc_root, runtime_dir};

/// The largest file a box may write (`RLIMIT_FSIZE`); a runaway writer meets `EFBIG`.
pub const MAX_FILE_BYTES: u64 = 8 << 30;
/// Size of the box's private `/tmp`.
pub const TMP_BYTES: u64 = 1 << 30;

/// The `h5i.net.families` annotation for a policy that grants families (none otherwise, so a
/// policy without grants gives exactly the bundle it gave before the key existed).
pub fn family_grants(policy: &ResolvedPolicy) -> std::collections::BTreeMap<String, String> {
    let mut ann = std::collections::BTreeMap::new();
    if !policy.net.families.is_empty() {
        ann.insert(
            h5i_runtime::confine::ANNOTATION_NET_FAMILIES.to_owned(),
            policy.net.families.join(","),
        );
    }
    ann
}

/// The bind a policy grant `p` becomes (`writable` or not): `$WORK/..` beneath the workspace
/// at `/work/..`, an absolute path at itself. `$HOME/..` is none: the box's own HOME is granted
/// whole.
fn expand(p: &str, workspace: &Path, writable: bool) -> Result<Option<Bind>, BoxError> {
    let place = |source: PathBuf, dest: PathBuf| Bind {
        source,
        dest,
        writable,
    };
    if let Some(dest) = inbox::work_path(p) {
        let rest = p.trim_start_matches(h5i_policy::values::WORK);
        let source = workspace.join(rest.trim_start_matches('/'));
        return Ok(Some(place(source, PathBuf::from(dest))));
    }
    if p.starts_with(h5i_policy::values::HOME) {
        return Ok(None);
    }
    if let Some(reserved) = inbox::reserved_overlap(p) {
        return Err(BoxError::BadRequest {
            what: format!(
                "the policy grants `{p}`, which would cover or sit inside {reserved}, where the box sees its workspace and h5i's own mounts"
            ),
            mend: "grant paths inside the workspace as $WORK/<path>, and other host paths outside /work and /.h5i".into(),
        });
    }
    Ok(Some(place(PathBuf::from(p), PathBuf::from(p))))
}

/// The host file the box's git reads as `.git/objects/info/alternates`: it names the object
/// store where the box sees it. Rewritten only when its text differs (each run plans it).
fn box_alternates(sb: &StoredBox) -> Result<PathBuf, BoxError> {
    let path = sb.paths.box_alternates();
    let want = format!("{}\n", inbox::OBJECTS);
    if std::fs::read_to_string(&path).ok().as_deref() == Some(want.as_str()) {
        return Ok(path);
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, &want).map_err(|e| BoxError::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| BoxError::io(&path, e))?;
    Ok(path)
}

/// Where the workspace's git keeps its `alternates`, relative to the workspace.
const ALTERNATES: [&str; 4] = [".git", "objects", "info", "alternates"];

/// Whether the workspace's own `.git/objects/info/alternates` is a plain file beneath plain
/// directories, so the in-box one can be bound over it. A box that removed or replaced it
/// gets no bind (its git then finds no borrowed objects, which `box doctor` reports) rather
/// than a mount point made in its tree. A box that swaps it between this check and the mount
/// only moves a read-only file bind within its own view: the runtime resolves the
/// destination inside the box's root.
fn alternates_is_plain(ws: &Path) -> bool {
    let mut at = ws.to_path_buf();
    ALTERNATES.iter().enumerate().all(|(i, part)| {
        at.push(part);
        std::fs::symlink_metadata(&at).is_ok_and(|m| {
            if i + 1 == ALTERNATES.len() {
                m.is_file()
            } else {
                m.is_dir()
            }
        })
    })
}

/// The in-box `alternates` as a read-only file bind: the host file naming [`inbox::OBJECTS`]
/// and where the box sees it (`/work/.git/objects/info/alternates`); `None` when the
/// workspace's own file is not plain. Every tier with a mount namespace binds this, so the
/// box's git finds its borrowed objects without learning the store's host path.
pub(crate) fn alternates_bind(sb: &StoredBox) -> Result<Option<(PathBuf, PathBuf)>, BoxError> {
    if !alternates_is_plain(&sb.paths.workspace()) {
        return Ok(None);
    }
    Ok(Some((box_alternates(sb)?, in_box_alternates())))
}

/// Where the box's git reads its `alternates`: `/work/.git/objects/info/alternates`.
pub(crate) fn in_box_alternates() -> PathBuf {
    std::iter::once(inbox::WORK).chain(ALTERNATES).collect()
}

fn no_hook_binary() -> BoxError {
    BoxError::BadRequest {
        what: "h5i-hook (which brings up the box's own loopback and stages an agent's tool calls) is not beside h5i or on PATH".into(),
        mend: "install h5i with `cargo install --path .`, which puts h5i-hook beside h5i (or put it on PATH)".into(),
    }
}

/// What the box's warm dependency caches grant one run, worked out above the session and
/// handed down in its request (`crate::cache::run_grant`: the caches' module runs boxes of its
/// own, so no tier names it): read-only binds, the variables naming them, and a built tree
/// overlaid as the workspace's `node_modules` (the kernel tiers; the container tier takes the
/// binds and variables).
#[derive(Debug, Clone, Default)]
pub struct CacheGrant {
    /// Each granted cache (and built tree), read-only where the box sees it.
    pub binds: Vec<Bind>,
    /// `NAME=VALUE` entries pointing the package managers at them.
    pub env: Vec<String>,
    /// Built trees overlaid in the box (kernel tiers only).
    pub overlays: Vec<Overlay>,
}

/// Build the plan for one run of `argv` in `sb`, with what its caches grant.
pub fn plan(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    argv: &[OsString],
    caches: CacheGrant,
) -> Result<BundlePlan, BoxError> {
    let ws = sb.paths.workspace();
    let mut binds = Vec::new();
    for p in &policy.fs.read {
        binds.extend(expand(p, &ws, false)?);
    }
    binds.push(Bind::ro(sb.manifest.store.join("objects"), inbox::OBJECTS));
    let (home, home_env) = crate::box_home::for_run(sb)?;
    let ids = crate::identity::Mapping::for_caller()?;
    if ids.hold(&sb.paths.dir, &[ws.clone(), home.clone(), sb.paths.spool()])? {
        crate::events::append(
            &sb.paths,
            &crate::events::Event::new(
                "identity",
                format!(
                    "re-owned the workspace, HOME and spool to {}'s range ({}:{}): made before box identity",
                    crate::identity::BOX_USER,
                    ids.uid,
                    ids.gid
                ),
            ),
        )?;
    }
    binds.push(Bind::rw(&ws, inbox::WORK));
    binds.push(Bind::rw(home, inbox::HOME));
    // An agent's box gets h5i's skill in its HOME, read-only, from this binary's own bytes.
    if let Some(runtime) = policy.agent {
        let (skill, at) = crate::skill::for_box(&sb.paths.skill(), runtime)?;
        binds.push(Bind::ro(skill, at));
    }
    // What the agent runs, call by call, staged by h5i's own hook from read-only settings.
    let mut programs = Vec::new();
    if policy.agent.is_some() {
        let hook = hook_binary().ok_or_else(no_hook_binary)?;
        let capture = crate::capture::binds_for(sb, policy, &hook)?;
        binds.extend(capture.dirs.into_iter().map(|(s, d)| Bind::ro(s, d)));
        programs = capture.programs;
    }
    binds.push(Bind::rw(sb.paths.spool(), inbox::SPOOL));
    for p in &policy.fs.write {
        binds.extend(expand(p, &ws, true)?);
    }
    let file_binds: Vec<(PathBuf, PathBuf)> = alternates_bind(sb)?.into_iter().collect();
    let mut env = vec![
        format!("PATH={}", crate::agent::BOX_PATH_DIRS.join(":")),
        home_env,
        "TMPDIR=/tmp".to_string(),
        format!("H5I_ENV_ID={}", sb.manifest.name),
        format!("H5I_ENV_POLICY_DIGEST={}", sb.manifest.policy_digest),
        format!("H5I_ENV_CAPTURE_SPOOL={}", inbox::SPOOL),
    ];
    // Warm dependency caches whose key matches this workspace's lockfiles, read-only.
    binds.extend(caches.binds);
    env.extend(caches.env);
    let overlays = caches.overlays;
    // A browser box's Chromium and agent-browser (nothing for any other box).
    crate::browser_box::grant(policy, &mut env)?;
    for k in ["TERM", "LANG", "LC_ALL", "COLORTERM", "NO_COLOR"] {
        if let Ok(v) = std::env::var(k) {
            env.push(format!("{k}={v}"));
        }
    }
    env.extend(
        crate::agent::runtime_env(policy.agent)
            .iter()
            .map(|(k, v)| format!("{k}={v}")),
    );
    let host_network = policy.net.mode == NetMode::Host;
    let mut create_container_hooks = Vec::new();
    if !host_network {
        let hook = hook_binary().ok_or_else(no_hook_binary)?;
        // Loopback up, and every other dial refused by the box's own kernel and counted.
        create_container_hooks.push(crate::denied_egress::loopback_hook(&hook));
    }
    Ok(BundlePlan {
        id: format!(
            "{}-{}-{}",
            sb.manifest.name,
            std::process::id(),
            now_ms() % 100_000
        ),
        argv: argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        env,
        cwd: PathBuf::from(inbox::WORK),
        binds,
        overlays,
        host_network,
        unix_sockets: policy.net.unix,
        uid: ids.uid,
        gid: ids.gid,
        id_count: ids.count,
        process_gid: 0,
        extra_gid: crate::browser_box::extra_gid(policy),
        cgroups_path: None,
        max_file_bytes: Some(MAX_FILE_BYTES),
        tmp_bytes: TMP_BYTES,
        shm_bytes: crate::browser_box::shm_bytes(policy),
        create_container_hooks,
        create_runtime_hooks: Vec::new(),
        poststop_hooks: Vec::new(),
        extra_annotations: family_grants(policy),
        file_binds,
        init_program: None,
        programs,
        terminal: false,
        netns_path: None,
        userns_path: None,
        socket_gate: None,
    })
}

/// Make `plan` join the network namespace of a live service's container init `init_pid` (and
/// the user namespace that owns it), so the run reaches the service on its loopback. The
/// namespace's loopback is already up, so the loopback hook is dropped. A host-network plan is
/// left alone.
pub fn join_network_of(plan: &mut BundlePlan, init_pid: i32) {
    if plan.host_network {
        return;
    }
    plan.netns_path = Some(PathBuf::from(format!("/proc/{init_pid}/ns/net")));
    plan.userns_path = Some(PathBuf::from(format!("/proc/{init_pid}/ns/user")));
    plan.create_container_hooks
        .retain(|argv| argv.get(1).map(String::as_str) != Some("loopback"));
}

/// Where the bundle of the run with id `id` is written (the private runtime directory).
pub fn bundle_dir_for(id: &str) -> Result<PathBuf, BoxError> {
    Ok(runtime_dir()?.join(format!("run-{id}")))
}

/// Write the bundle a process-tier run of `argv` would use into `out` (for inspection, and so
/// the same box can be run by another OCI runtime: the conformance and bench baselines).
/// Its cgroup sits under the caller's own, at `<own>/h5i/<id>`.
/// `caches` works out what the box's caches grant (`crate::cache::run_grant`), asked once the
/// box is found active at the process tier.
pub fn write_bundle_for(
    store: &crate::store::BoxStore,
    name: &str,
    argv: &[OsString],
    out: &Path,
    caches: &dyn Fn(&StoredBox) -> Result<CacheGrant, BoxError>,
) -> Result<h5i_runtime::bundle::BundleNotes, BoxError> {
    let sb = store.find(name)?;
    crate::store::require_active(&sb, "bundle")?;
    let policy = crate::store::load_policy(&sb)?;
    if policy.tier != h5i_policy::Tier::Process {
        return Err(BoxError::BadRequest {
            what: format!(
                "box `{name}` runs at the {} tier, which has no OCI bundle",
                policy.tier
            ),
            mend: "create a box with --isolation process".into(),
        });
    }
    let mut plan = plan(&sb, &policy, argv, caches(&sb)?)?;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let anchor = h5i_runtime::runc::cgroup::detect_layout()
        .ok()
        .and_then(|l| h5i_runtime::runc::cgroup::anchor_from(&own, l).ok());
    plan.cgroups_path = anchor.map(|a| a.join("h5i").join(&plan.id).display().to_string());
    h5i_runtime::bundle::write_bundle(&plan, out).map_err(|e| BoxError::io(out, e))
}

/// `plan`'s environment with the run's secrets added (each must be `inject = "env"`: a box at
/// a kernel tier gets nothing else from the host).
pub fn env_with_secrets(
    plan: &BundlePlan,
    secrets: &[h5i_broker::secrets::ResolvedSecret],
) -> Result<Vec<String>, BoxError> {
    let mut env = plan.env.clone();
    for s in secrets {
        if s.inject != h5i_policy::SecretInject::Env {
            return Err(BoxError::BadRequest {
                what: format!(
                    "secret `{}` asks for inject = \"{}\", which only the workspace tier supports",
                    s.name,
                    s.inject.as_str()
                ),
                mend: "use inject = \"env\" at the process tier".into(),
            });
        }
        env.push(format!("{}={}", s.name, s.value()));
    }
    Ok(env)
}

/// Where the init a run's command starts under is bound (read-only) in the box.
pub const INIT_IN_BOX: &str = "/.h5i-init";

/// Start `plan`'s command under catatonit, bound read-only at [`INIT_IN_BOX`], as at the
/// container tier: a command that is its pid namespace's pid 1 never gets a signal it has no
/// handler for, so Ctrl-C, `kill`, or a `timeout` inside the box would not end `sh -c '...'`.
/// (A box shell keeps its shell as the session leader of its own terminal, and a run in the
/// box-lifetime sandbox is already a child of the sandbox's init.)
fn under_init(plan: &mut BundlePlan) -> Result<(), BoxError> {
    let (what, mend) = crate::tier_host::NO_INIT;
    let init = crate::tier_host::init_program().ok_or_else(|| BoxError::BadRequest {
        what: what.into(),
        mend: mend.into(),
    })?;
    plan.init_program = Some((init, PathBuf::from(INIT_IN_BOX)));
    let mut argv = vec![INIT_IN_BOX.to_string(), "--".to_string()];
    argv.append(&mut plan.argv);
    plan.argv = argv;
    Ok(())
}

/// Run a prepared `plan` (from [`plan`], perhaps adjusted by [`join_network_of`]) at the
/// process tier, in the bundle directory [`bundle_dir_for`] names.
pub fn run_plan(
    policy: &ResolvedPolicy,
    mut plan: BundlePlan,
    wall: Option<Duration>,
    secrets: &[h5i_broker::secrets::ResolvedSecret],
    console: Option<h5i_runtime::process_tier::Console<'_>>,
) -> Result<ProcessRunReport, BoxError> {
    let binary = runc_binary().ok_or_else(|| BoxError::BadRequest {
        what: "h5i-runc (the process tier's OCI runtime) is not installed beside h5i or on PATH"
            .into(),
        mend: "install h5i with `cargo install --path .`, which puts h5i-runc beside h5i (or put it on PATH)".into(),
    })?;
    plan.env = env_with_secrets(&plan, secrets)?;
    // A Codex box's system folder names this run's credential proxy (in the env by now).
    let _codex = crate::capture::CodexSystemDir::for_run(
        policy,
        &runtime_dir()?,
        &plan.id,
        &plan.env,
        &mut plan.binds,
    )?;
    if console.is_none() {
        under_init(&mut plan)?;
    }
    // The bundle holds the run's environment, secrets included: it is written outside the box
    // directory, in a private runtime directory, and removed when the run ends.
    let dir = bundle_dir_for(&plan.id)?;
    let report = h5i_runtime::process_tier::run_with_console(
        &RuncInvocation {
            binary,
            root: runc_root(),
        },
        plan,
        &dir,
        policy.resources.mem_bytes,
        policy.resources.procs,
        wall,
        console,
    )?;
    Ok(report)
}
