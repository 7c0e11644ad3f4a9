//! The box-lifetime browser: agent-browser's daemon (and the Chromium it launches) as the box's
//! built-in service `browser`, so the page one run opened is still there for the next.
//!
//! Owns the sidecar's declaration (the daemon in the foreground, its socket in the sidecar's
//! private `/tmp`), which boxes get one ([`lives_for_the_box`]: a browser box at the process
//! tier, where runs join a live service's network namespace, or at the supervised
//! tier, where the sidecar joins the network namespace of the box's sandbox that the runs go
//! through, so in both the browser reaches the dev server the runs start and, at supervised,
//! leaves only through the pinned table whose counts each run's receipt carries), starting it
//! before a run needs it ([`ensure`]: at supervised, after making the sandbox, and again when
//! the sandbox was made anew), and starting the relay when the supervisor has the sidecar's pid
//! ([`start_relay`]). Everything else is the service machinery's (`crate::service`): its
//! supervisor, its state file, its receipt, and `abort`/`rm` stopping it with the box's
//! other services.
//!
//! At supervised the sidecar is a container of its own (its own mount, pid namespaces and
//! cgroup) in the sandbox's user and network namespaces: it shares the box's network, not its
//! group (the fence, `super::fence`, tells the two apart). A supervised run that takes a
//! container of its own (a terminal) joins the sandbox's network too
//! (`crate::sandbox::share_network`), so the page sees the dev server it starts.
//!
//! An unprivileged caller's browser box maps one more group (the caller's first subordinate
//! gid, [`extra_gid`]) so the sidecar has a group the fence can tell apart, and its sidecar
//! and runs join the box's user namespace by path, which h5i-runc's libcontainer allows only
//! for a user namespace the caller owns (runtime/patches/README.md).
//!
//! At the container tier the sidecar is a Podman container of the box's image
//! (`crate::container::BrowserPart`) running as the box's group `SIDECAR_GID`, which keep-id
//! maps for any caller; each run joins its user and network namespaces by the container's name
//! (recorded in the service's state, [`container_join`]) and finds the relay's directory
//! ([`relay_home`]'s `.agent-browser`) read-only at its HOME's `.agent-browser`. The fence there
//! lets the box's processes (the engine user's group) and the listener each run's hook binds
//! for its egress proxy (group 0) answer the box, and Chrome's only way out is that proxy.
//!
//! Must never: start a sidecar for a box whose runs could not reach it (they would get a
//! browser that cannot see their dev server), join a sandbox other than the box's live one, or
//! serve the relay before the sidecar's pid is known and re-identified. Elsewhere (the microvm
//! tier, an unprivileged caller with no subordinate gid at a kernel tier, a supervised box
//! whose runs cannot use the sandbox) the browser lives as long as the run that started it, and
//! `h5i browser status` says so.
//!
//! Guarded by `tests/browser.rs`.

use h5i_policy::resolved::Service;
use h5i_policy::{ResolvedPolicy, Tier};

use h5i_runtime::bundle::BundlePlan;

use super::relay::{Relay, DAEMON_DIR, SESSION};
use crate::error::BoxError;
use crate::service::ServiceError;
use crate::session::Network;
use crate::store::{BoxPaths, BoxStore, StoredBox};

/// How long the daemon may take to answer after its sidecar started.
const DAEMON_START: std::time::Duration = std::time::Duration::from_secs(30);

/// The built-in service's name.
pub const SERVICE: &str = "browser";

/// The sidecar's declaration: agent-browser's daemon in the foreground, its socket directory
/// in the sidecar's own `/tmp`, started only once h5i has fenced the box's network off from it
/// (the command waits on the gate `super::fence::load` opens).
pub fn service_decl() -> Service {
    let gate = super::fence::GATE;
    Service {
        command: format!(
            "mkdir -p {DAEMON_DIR} && mkfifo -m 600 {gate} && read _ < {gate} && rm {gate} && AGENT_BROWSER_DAEMON=1 AGENT_BROWSER_SESSION={SESSION} AGENT_BROWSER_SOCKET_DIR={DAEMON_DIR} exec agent-browser"
        ),
        port: None,
    }
}

/// The sidecar's plan edit: it runs as the box's group [`super::fence::SIDECAR_GID`], which the
/// fence tells apart from the box's own processes.
pub fn own_group(plan: &mut BundlePlan) {
    plan.process_gid = super::fence::SIDECAR_GID;
}

/// Whether `policy`'s browser outlives each run: a browser box at the process tier (whose runs
/// join a live service's network namespace), or at the supervised tier when its runs go
/// through the box's sandbox (sandboxes on, no credential grant), whose network the sidecar
/// joins, run by root or by a caller with a subordinate gid for the sidecar's group
/// ([`caller_subgid`]); or at the container tier, for any caller (keep-id maps the group).
pub fn lives_for_the_box(policy: &ResolvedPolicy) -> bool {
    let kernel_tier = match policy.tier {
        Tier::Process => true,
        Tier::Supervised => crate::sandbox::enabled() && policy.auth_grants().is_empty(),
        Tier::Container => return super::is_browser_box(policy),
        _ => false,
    };
    super::is_browser_box(policy) && kernel_tier && (is_root() || caller_subgid().is_some())
}

/// The directory whose `.agent-browser` holds the relay's socket for the box at `paths` of
/// `tier`: the box's HOME at the kernel tiers; at the container tier (whose HOME is each run's
/// private `/tmp`) `<box>/browser/home`, host-only, whose `.agent-browser` each run gets
/// read-only at `crate::container::RELAY_IN_BOX`.
pub fn relay_home(paths: &BoxPaths, tier: Tier) -> std::path::PathBuf {
    match tier {
        Tier::Container => paths.dir.join("browser").join("home"),
        _ => paths.home(),
    }
}

/// What a container-tier run needs to join its box's running sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerJoin {
    /// The sidecar's container name.
    pub container: String,
    /// The relay's directory on the host (bound read-only in the run).
    pub relay: std::path::PathBuf,
}

/// The running sidecar of container-tier box `sb` for a run to join, when it has one.
pub fn container_join(sb: &StoredBox, policy: &ResolvedPolicy) -> Option<ContainerJoin> {
    if policy.tier != Tier::Container || !lives_for_the_box(policy) {
        return None;
    }
    let st = crate::service::read_state(&sb.paths, SERVICE)
        .filter(crate::service::ServiceState::alive)?;
    Some(ContainerJoin {
        container: st.container?,
        relay: relay_home(&sb.paths, Tier::Container).join(super::relay::CLIENT_DIR),
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    euid == 0
}

/// For an unprivileged caller, the host gid the sidecar's group maps to in its browser box's
/// user namespace: the first id of the caller's range in `/etc/subgid` (named by user name or
/// uid), which `newgidmap` lets the caller map. `None` for root (its box range holds the group)
/// and for a caller with no range.
pub fn caller_subgid() -> Option<u32> {
    if is_root() {
        return None;
    }
    let path = std::path::Path::new("/etc/subgid");
    let text = std::fs::read_to_string(path).ok()?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    crate::host::subids::parse(path, &text)
        .ok()?
        .into_iter()
        .find(|r| {
            r.count > 0
                && (r.owner == uid.to_string()
                    || crate::host::users::passwd_entry(&r.owner)
                        .ok()
                        .flatten()
                        .is_some_and(|u| u.uid == uid))
        })
        .and_then(|r| u32::try_from(r.start).ok())
}

/// The gid line a browser box's plan adds for an unprivileged caller (see
/// [`caller_subgid`]), so its sidecar has a group of its own.
pub fn extra_gid(policy: &ResolvedPolicy) -> Option<(u32, u32)> {
    if !super::is_browser_box(policy) {
        return None;
    }
    caller_subgid().map(|host| (super::fence::SIDECAR_GID, host))
}

/// Why a browser box's browser ends with each run, in a line for `h5i browser status`.
pub fn why_per_run(policy: &ResolvedPolicy) -> &'static str {
    match policy.tier {
        Tier::Process | Tier::Supervised if !is_root() && caller_subgid().is_none() => "an unprivileged caller with no range in /etc/subgid has no group to give the box's browser apart from the box (the fence needs one): each run's browser ends with the run, and the control lock is recorded but not enforced",
        Tier::Supervised => "this box's supervised runs take a container of their own (H5I_SANDBOX=off, or a credential grant served per run), so no browser can share their network: each run's browser ends with the run, and the control lock is recorded but not enforced",
        _ => "the box-lifetime browser is built at the process, supervised and container tiers only: at this tier each run's browser ends with the run, and the control lock is recorded but not enforced",
    }
}

/// Whether the sidecar of `sb` is running.
pub fn alive(sb: &StoredBox) -> bool {
    crate::service::read_state(&sb.paths, SERVICE)
        .filter(crate::service::ServiceState::alive)
        .is_some()
}

/// Before a run of box `name`: start its browser sidecar when it should have one and has none
/// (at the supervised tier, in the network of the box's sandbox, made first when it is down).
pub fn ensure(store: &BoxStore, name: &str) -> Result<(), BoxError> {
    let sb = store.find(name)?;
    let policy = crate::store::load_policy(&sb)?;
    if !lives_for_the_box(&policy) {
        return Ok(());
    }
    let sandbox = match policy.tier {
        Tier::Supervised => Some(sandbox_up(&sb, &policy)?),
        _ => None,
    };
    if alive(&sb) {
        let why = if !super::relay::still_bound(&sb.paths, &relay_home(&sb.paths, policy.tier)) {
            // The browser behind a replaced socket is unreachable for the box's runs.
            "the browser relay's socket in the box's HOME was replaced"
        } else if sandbox.is_some_and(|pid| !in_network_of(&sb, pid)) {
            // The page would no longer see what the runs serve, nor leave by their table.
            "the box's sandbox was made anew (idle timeout, abort or a new h5i)"
        } else {
            return Ok(());
        };
        // Restarted with a fresh profile, as after any restart.
        eprintln!("h5i: box {name}: {why}; restarting the box's browser");
        if let Err(e) = crate::service::stop(store, name, SERVICE) {
            if !matches!(e, ServiceError::NotRunning { .. }) {
                return Err(BoxError::BadRequest {
                    what: format!(
                        "box `{name}`'s browser could not be restarted ({})",
                        e.to_string().trim_start_matches("refusing: ")
                    ),
                    mend: format!("`h5i box service stop {name} browser`"),
                });
            }
        }
    }
    match crate::service::start(store, name, SERVICE) {
        Ok(_) => Ok(()),
        // Started by a run in parallel: that one is the box's.
        Err(ServiceError::AlreadyRunning { .. }) => Ok(()),
        Err(ServiceError::Box(e)) => Err(e),
        Err(other) => Err(BoxError::BadRequest {
            what: format!(
                "box `{name}`'s browser did not start ({})",
                other.to_string().trim_start_matches("refusing: ")
            ),
            mend: format!("read `h5i box service logs {name} browser`"),
        }),
    }
}

/// The pid of the init of `sb`'s supervised sandbox, made first (by a run of `true` through it,
/// which no receipt records: it is h5i's, not the box's) when none answers.
fn sandbox_up(sb: &StoredBox, policy: &ResolvedPolicy) -> Result<i32, BoxError> {
    if let Some((pid, _)) = crate::sandbox::live_init(sb) {
        return Ok(pid);
    }
    let plan = crate::process::plan(sb, policy, &["true".into()])?;
    let pins = crate::supervised::pin_egress(policy)?;
    let made = crate::sandbox::run(
        sb,
        policy,
        &plan,
        Some(DAEMON_START),
        plan.env.clone(),
        Some(&pins),
    )?;
    match (made, crate::sandbox::live_init(sb)) {
        (Some(_), Some((pid, _))) => Ok(pid),
        _ => Err(BoxError::BadRequest {
            what: format!(
                "box `{}`'s browser needs the box's sandbox, which could not be made here",
                sb.manifest.name
            ),
            mend: "run with H5I_SANDBOX=off (each run then has a browser of its own)".into(),
        }),
    }
}

/// Whether the running sidecar of `sb` is in the network namespace of the process `pid`.
fn in_network_of(sb: &StoredBox, pid: i32) -> bool {
    let ino = |p: i32| {
        std::fs::metadata(format!("/proc/{p}/ns/net"))
            .ok()
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.ino()
            })
    };
    let sidecar = crate::service::read_state(&sb.paths, SERVICE)
        .filter(crate::service::ServiceState::alive)
        .and_then(|st| st.pid);
    sidecar.is_some_and(|p| ino(p.pid).is_some() && ino(p.pid) == ino(pid))
}

/// The network the supervised tier's sidecar of `sb` runs in: its live sandbox's.
pub fn sandbox_network(sb: &StoredBox) -> Result<Network, BoxError> {
    match crate::sandbox::live_init(sb) {
        Some((pid, _)) => Ok(Network::BoxSandbox(pid)),
        None => Err(BoxError::BadRequest {
            what: format!(
                "box `{}`'s browser joins the box's sandbox, and none is up",
                sb.manifest.name
            ),
            mend: format!("`h5i box run {} -- true` makes it", sb.manifest.name),
        }),
    }
}

/// Put the sidecar's `plan` in the network of `sb`'s supervised sandbox whose init is `pid`
/// (and the user namespace owning it), with the sandbox's name files: the pinned hosts and no
/// resolver. Refused when that sandbox is no longer the box's.
pub fn join_sandbox(plan: &mut BundlePlan, sb: &StoredBox, pid: i32) -> Result<(), BoxError> {
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

/// In the sidecar's supervisor, once the daemon's container init `pid` is known: bind the
/// relay in [`relay_home`] and serve it on a thread for as long as this process lives.
pub fn start_relay(paths: &BoxPaths, pid: i32, tier: Tier) -> Result<(), String> {
    let name = paths
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let home = relay_home(paths, tier);
    let (owner, groups, from_parent) = match tier {
        Tier::Container => {
            let engine =
                crate::container::engine::Engine::for_caller().map_err(|e| e.to_string())?;
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o700,
            )
            .create(&home)
            .map_err(|e| format!("cannot make {}: {e}", home.display()))?;
            // The box's user is the engine user (keep-id): root's relay socket is handed to it.
            let owner = engine.switches_user.then_some((engine.uid, engine.gid));
            (
                owner,
                super::fence::BoxGroups::container_tier(engine.gid),
                !is_root(),
            )
        }
        _ => {
            let ids = crate::identity::Mapping::for_caller().map_err(|e| e.to_string())?;
            (
                ids.range.then_some((ids.uid, ids.gid)),
                super::fence::BoxGroups::kernel_tier(),
                false,
            )
        }
    };
    super::fence::load(pid, DAEMON_START, &groups, from_parent)
        .map_err(|e| format!("the box's network could not be fenced off its browser: {e}"))?;
    super::relay::wait_for_daemon(pid, DAEMON_START).map_err(|e| {
        format!(
            "agent-browser's daemon did not answer within {} s: {e}",
            DAEMON_START.as_secs()
        )
    })?;
    let relay = Relay::bind(paths, &name, &home, pid, owner)
        .map_err(|e| format!("cannot bind the browser relay in {}: {e}", home.display()))?;
    std::thread::spawn(move || relay.serve());
    Ok(())
}

/// The loopback port, inside the sidecar's network namespace, of the screencast stream
/// agent-browser's daemon serves (read from its `stream_status` answer); why not when the
/// sidecar is not running or not streaming. The port is the daemon's word, never a host port:
/// h5i connects to it only from inside the box's network namespace.
pub fn stream_port(sb: &StoredBox) -> Result<u16, String> {
    let answer = ask_daemon(sb, "stream_status")?;
    let data = &answer["data"];
    if answer["success"] != true || data["enabled"] != true {
        return Err("the box's browser is not streaming".into());
    }
    data["port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| "the box's browser named no stream port".into())
}

/// The URL of the page the box's browser shows, as its daemon says (`None` when it cannot).
pub fn page_url(sb: &StoredBox) -> Option<String> {
    let answer = ask_daemon(sb, "url").ok()?;
    answer["data"]["url"].as_str().map(str::to_string)
}

/// How many console errors the page logged since the last drain, as the daemon says (`None`
/// when it does not answer); the viewers' count.
pub fn console_errors(sb: &StoredBox) -> Option<usize> {
    let answer = ask_daemon(sb, "console").ok()?;
    (answer["success"] == true).then(|| super::drain::console_error_count(&answer))
}

/// Ask the daemon of `sb`'s running sidecar the read-only `action` (h5i's own request, never
/// through the relay): its whole answer.
fn ask_daemon(sb: &StoredBox, action: &str) -> Result<serde_json::Value, String> {
    let st = crate::service::read_state(&sb.paths, SERVICE)
        .filter(crate::service::ServiceState::alive)
        .ok_or("the box's browser is not running")?;
    let pid = st.pid.ok_or("the box's browser has no process yet")?.pid;
    super::relay::ask(
        pid,
        &serde_json::json!({"action": action, "id": "h5i-view"}),
    )
    .map_err(|e| format!("the box's browser does not answer ({e})"))
}
