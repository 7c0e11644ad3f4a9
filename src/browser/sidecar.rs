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
//! What the run path reads of the sidecar (which boxes get one, whether it runs, how a run
//! joins it) is `crate::browser_box`'s, re-exported here: the session and the tiers stand below
//! this module and never name it.
//!
//! Guarded by `tests/browser.rs`.

use h5i_policy::{ResolvedPolicy, Tier};

use super::relay::Relay;
use crate::browser_box::is_root;
pub use crate::browser_box::{
    alive, caller_subgid, container_join, extra_gid, lives_for_the_box, own_group, relay_home,
    service_decl, ContainerJoin, SERVICE,
};
use crate::error::BoxError;
use crate::service::ServiceError;
use crate::store::{BoxPaths, BoxStore, StoredBox};

/// How long the daemon may take to answer after its sidecar started.
const DAEMON_START: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a browser box's browser ends with each run, in a line for `h5i browser status`.
pub fn why_per_run(policy: &ResolvedPolicy) -> &'static str {
    match policy.tier {
        Tier::Process | Tier::Supervised if !is_root() && caller_subgid().is_none() => "an unprivileged caller with no range in /etc/subgid has no group to give the box's browser apart from the box (the fence needs one): each run's browser ends with the run, and the control lock is recorded but not enforced",
        Tier::Supervised => "this box's supervised runs take a container of their own (H5I_SANDBOX=off, or a credential grant served per run), so no browser can share their network: each run's browser ends with the run, and the control lock is recorded but not enforced",
        _ => "the box-lifetime browser is built at the process, supervised and container tiers only: at this tier each run's browser ends with the run, and the control lock is recorded but not enforced",
    }
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
    let caches = crate::cache::run_grant::for_run(sb, policy.tier)?;
    let plan = crate::process::plan(sb, policy, &["true".into()], caches)?;
    let pins = crate::supervised::pin_egress(policy)?;
    let made = crate::sandbox::run(
        sb,
        policy,
        &plan,
        Some(DAEMON_START),
        plan.env.clone(),
        Some(&pins),
        crate::sandbox::RunWiring {
            creds: &mut crate::credentials::ForRun::none(),
            pty: [false; 3],
        },
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
    let sidecar = crate::service_state::read_state(&sb.paths, SERVICE)
        .filter(crate::service_state::ServiceState::alive)
        .and_then(|st| st.pid);
    sidecar.is_some_and(|p| ino(p.pid).is_some() && ino(p.pid) == ino(pid))
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
    let st = crate::service_state::read_state(&sb.paths, SERVICE)
        .filter(crate::service_state::ServiceState::alive)
        .ok_or("the box's browser is not running")?;
    let pid = st.pid.ok_or("the box's browser has no process yet")?.pid;
    super::relay::ask(
        pid,
        &serde_json::json!({"action": action, "id": "h5i-view"}),
    )
    .map_err(|e| format!("the box's browser does not answer ({e})"))
}
