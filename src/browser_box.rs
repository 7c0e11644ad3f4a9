//! The browser in a box, the part below the tiers: what a browser box is and what its runs get
//! for Chromium and agent-browser, the one place the run path asks for it ([`grant`]), and what
//! the run path reads of the box-lifetime sidecar (whether the box has one, whether it runs,
//! how a container-tier run joins it). The tiers and the session take these from here and never
//! name `crate::browser`, the verbs above them (`tests/module_layers.rs`).
//!
//! The kernel tiers take them through [`grant`] (one call in `process::plan`), the container
//! tier through [`vars`] and [`shm_bytes`] (its Podman arguments).
//!
//! Owns: whether a box is a browser box (its policy grants agent-browser's state directory
//! `~/.agent-browser` read-write and `net.unix`, as the built-in `browser` profile does; a
//! custom profile opts in with the same two grants), the variables its runs get (Debian's
//! Chromium as agent-browser's executable, Chrome's own sandbox off, the outdated-Chrome check
//! off since it fetches a release page, `--allowed-domains` derived from the policy's egress plus
//! the box's own loopback), and the size of its `/dev/shm`.
//! Of the box-lifetime sidecar (`crate::browser::sidecar`, which starts it), the facts the run
//! path reads: its service name ([`SERVICE`]) and declaration ([`service_decl`], [`own_group`]), its group ([`SIDECAR_GID`], and the host gid an
//! unprivileged caller maps it to, [`extra_gid`]), whether a box's browser lives as long as the
//! box ([`lives_for_the_box`]), whether it runs ([`alive`]), how a container-tier run joins it
//! ([`container_join`]); and the append of the browser's own records to the receipt log
//! ([`append_record`]).
//!
//! Chrome's profile is agent-browser's own fresh temporary one in the box's private `/tmp`
//! (a per-box tmpfs, never the host's): upstream refuses `--user-data-dir` together with
//! `--allowed-domains`, and the domain list is worth more than the directory's name. The box's
//! HOME (where Chromium keeps the rest of its state) is the box's own, never the host's.
//!
//! Must never: inject the AI gateway's credential (`agent-browser chat` sends page content to an
//! external gateway; inside a box that is an exfiltration path, and the credential's absence is
//! what refuses it: a policy that would inject it is refused), point Chrome at a directory of
//! the host, or claim the domain list as the boundary: it is a second layer inside Chrome; the
//! boundary is the tier's egress (supervised: the pinned table; container: the egress proxy;
//! process: nothing but the box's own loopback).
//!
//! Guarded by `tests/browser.rs` and the unit tests below.

use h5i_policy::receipt::{ReceiptLane, ReceiptRecord, RecordBody};
use h5i_policy::resolved::{SecretInject, Service};
use h5i_policy::{ResolvedPolicy, Tier};
use h5i_runtime::bundle::BundlePlan;

use crate::error::BoxError;
use crate::store::{now_ms, BoxPaths, StoredBox};

/// Debian's Chromium, which agent-browser drives instead of downloading its own.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// The flags agent-browser adds to Chromium's (see [`box_env`]).
pub const CHROME_ARGS: &[&str] = &["--no-sandbox", "--no-startup-window"];

/// agent-browser's state directory in the box's HOME, as policies write it.
pub const STATE_GRANT: &str = "$HOME/.agent-browser";

/// `/dev/shm` of a browser box: Chromium's renderers share memory there, and a 64 MiB one
/// makes heavy pages crash their tab. A tmpfs costs only what is used, charged to `mem`.
pub const BROWSER_SHM_BYTES: u64 = 1 << 30;

/// The host variables of agent-browser's AI chat gateway: never given to a box.
pub const GATEWAY_VARS: &[&str] = &["AI_GATEWAY_API_KEY", "AI_GATEWAY_URL", "AI_GATEWAY_MODEL"];

/// Whether `policy` makes a browser box.
pub fn is_browser_box(policy: &ResolvedPolicy) -> bool {
    policy.net.unix && policy.fs.write.iter().any(|p| p == STATE_GRANT)
}

/// The domains agent-browser lets the page reach: the box's own loopback (its dev server) and
/// every egress host of the policy, deduplicated, in policy order.
pub fn allowed_domains(policy: &ResolvedPolicy) -> Vec<String> {
    let mut out: Vec<String> = vec!["localhost".into(), "127.0.0.1".into()];
    for hp in &policy.net.egress {
        if !out.contains(&hp.host) {
            out.push(hp.host.clone());
        }
    }
    out
}

/// The variables a browser box's runs get, in order.
pub fn box_env(policy: &ResolvedPolicy) -> Vec<(&'static str, String)> {
    vec![
        ("AGENT_BROWSER_EXECUTABLE_PATH", CHROMIUM.to_string()),
        // Chrome's sandbox needs namespaces h5i's seccomp list refuses: the box is the boundary.
        // No startup tab: Chrome otherwise opens one of its own, and agent-browser (which
        // adopts the page targets it finds at launch, or makes one when it finds none) can, on a
        // slow start (a loaded host, the supervised tier's socket gate), end up driving the tab
        // behind the other one in the same headless window. That tab is hidden, gets no frames,
        // and every screenshot of it waits out agent-browser's 30 s CDP timeout ("CDP command
        // timed out: Page.captureScreenshot"). With none, the only tab is agent-browser's own.
        ("AGENT_BROWSER_ARGS", CHROME_ARGS.join(",")),
        (
            "AGENT_BROWSER_ALLOWED_DOMAINS",
            allowed_domains(policy).join(","),
        ),
        // Otherwise the CLI fetches chromereleases.googleblog.com to warn about an old Chrome.
        ("AGENT_BROWSER_NO_VERSION_CHECK", "1".to_string()),
    ]
}

/// The `/dev/shm` size for a run of `policy`.
pub fn shm_bytes(policy: &ResolvedPolicy) -> u64 {
    if is_browser_box(policy) {
        BROWSER_SHM_BYTES
    } else {
        h5i_runtime::bundle::DEFAULT_SHM_BYTES
    }
}

/// A browser box's variables for a run of `policy` (none for any other box). Refuses a browser
/// box whose policy would inject the chat gateway's credential.
pub fn vars(policy: &ResolvedPolicy) -> Result<Vec<(&'static str, String)>, BoxError> {
    if !is_browser_box(policy) {
        return Ok(Vec::new());
    }
    if let Some(s) = policy
        .secrets
        .iter()
        .find(|s| s.inject == SecretInject::Env && GATEWAY_VARS.contains(&s.name.as_str()))
    {
        return Err(BoxError::BadRequest {
            what: format!(
                "secret `{}` would give the browser box agent-browser's chat gateway credential, and `chat` sends page content out of the box",
                s.name
            ),
            mend: format!("drop the `{}` secret from the profile", s.name),
        });
    }
    Ok(box_env(policy))
}

/// Add [`vars`] to a run's `env` (`KEY=value` entries): the kernel tiers' hook.
pub fn grant(policy: &ResolvedPolicy, env: &mut Vec<String>) -> Result<(), BoxError> {
    env.extend(vars(policy)?.into_iter().map(|(k, v)| format!("{k}={v}")));
    Ok(())
}

/// The box's group the sidecar (agent-browser's daemon and its Chromium) runs as.
pub const SIDECAR_GID: u32 = 1;

/// agent-browser's state directory in the box's HOME, where its client looks for the daemon.
pub const CLIENT_DIR: &str = ".agent-browser";

/// The built-in service's name.
pub const SERVICE: &str = "browser";

/// Where the daemon keeps its socket in the sidecar (its private `/tmp`).
pub const DAEMON_DIR: &str = "/tmp/h5i-browser";
/// agent-browser's session name: the default one every client uses.
pub const SESSION: &str = "default";
/// The FIFO in the sidecar's private `/tmp` its command reads before it starts the daemon.
pub const GATE: &str = "/tmp/h5i-browser/fenced";

/// The sidecar's declaration: agent-browser's daemon in the foreground, its socket directory
/// in the sidecar's own `/tmp`, started only once h5i has fenced the box's network off from it
/// (the command waits on the gate `crate::browser::fence::load` opens).
pub fn service_decl() -> Service {
    let gate = GATE;
    Service {
        command: format!(
            "mkdir -p {DAEMON_DIR} && mkfifo -m 600 {gate} && read _ < {gate} && rm {gate} && AGENT_BROWSER_DAEMON=1 AGENT_BROWSER_SESSION={SESSION} AGENT_BROWSER_SOCKET_DIR={DAEMON_DIR} exec agent-browser"
        ),
        port: None,
    }
}

/// The sidecar's plan edit: it runs as the box's group [`SIDECAR_GID`], which the
/// fence tells apart from the box's own processes.
pub fn own_group(plan: &mut BundlePlan) {
    plan.process_gid = SIDECAR_GID;
}

/// Whether `policy`'s browser outlives each run: a browser box at the process tier (whose runs
/// join a live service's network namespace), or at the supervised tier when its runs go
/// through the box's sandbox (sandboxes on, no credential grant), whose network the sidecar
/// joins, run by root or by a caller with a subordinate gid for the sidecar's group
/// ([`caller_subgid`]); or at the container tier, for any caller (keep-id maps the group).
pub fn lives_for_the_box(policy: &ResolvedPolicy) -> bool {
    let kernel_tier = match policy.tier {
        Tier::Process => true,
        Tier::Supervised => crate::tier_host::enabled() && policy.auth_grants().is_empty(),
        Tier::Container => return is_browser_box(policy),
        _ => false,
    };
    is_browser_box(policy) && kernel_tier && (is_root() || caller_subgid().is_some())
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
    let st = crate::service_state::read_state(&sb.paths, SERVICE)
        .filter(crate::service_state::ServiceState::alive)?;
    Some(ContainerJoin {
        container: st.container?,
        relay: relay_home(&sb.paths, Tier::Container).join(CLIENT_DIR),
    })
}

pub(crate) fn is_root() -> bool {
    let euid = h5i_sys::ids::euid();
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
    let uid = h5i_sys::ids::uid();
    crate::host::subids::parse(path, &text)
        .ok()?
        .into_iter()
        .find(|r| {
            r.count > 0
                && (r.owner == uid.to_string()
                    || h5i_sys::users::by_name(&r.owner)
                        .ok()
                        .flatten()
                        .is_some_and(|u| u.uid == uid))
        })
        .and_then(|r| u32::try_from(r.start).ok())
}

/// The gid line a browser box's plan adds for an unprivileged caller (see
/// [`caller_subgid`]), so its sidecar has a group of its own.
pub fn extra_gid(policy: &ResolvedPolicy) -> Option<(u32, u32)> {
    if !is_browser_box(policy) {
        return None;
    }
    caller_subgid().map(|host| (SIDECAR_GID, host))
}

/// Whether the sidecar of `sb` is running.
pub fn alive(sb: &StoredBox) -> bool {
    crate::service_state::read_state(&sb.paths, SERVICE)
        .filter(crate::service_state::ServiceState::alive)
        .is_some()
}

/// Append `body`, observed by h5i now in `lane` (with the redaction ids applied to it), to box
/// `sb`'s receipt log: every record of the browser's (control, viewer, drain, between runs).
pub fn append_record(
    sb: &StoredBox,
    lane: ReceiptLane,
    redactions: Vec<String>,
    body: RecordBody,
) -> Result<(), BoxError> {
    let log = h5i_broker::receipt_log::ReceiptLog::at(sb.paths.receipts());
    log.append(ReceiptRecord {
        v: 0,
        seq: 0,
        lane,
        at_ms: now_ms(),
        policy_digest: sb.manifest.policy_digest.clone(),
        redactions,
        payload: None,
        body,
    })
    .map_err(|e| BoxError::BadRequest {
        what: format!("cannot append the browser's record to the receipt log: {e}"),
        mend: format!("check {}", sb.paths.receipts().display()),
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use h5i_policy::resolved::{SecretGrant, SecretSource};
    use h5i_policy::HostPort;

    /// The built-in `browser` profile for a Claude box at the supervised tier.
    fn browser_policy() -> ResolvedPolicy {
        let req = h5i_policy::ResolveRequest {
            profile: Some("browser".into()),
            isolation: Some("supervised".into()),
            h5i_agent: Some("claude".into()),
            ..Default::default()
        };
        h5i_policy::resolve(None, &req, &h5i_policy::HostTiers::all_available()).unwrap()
    }

    #[test]
    fn only_a_policy_granting_the_state_dir_and_unix_sockets_is_a_browser_box() {
        let mut p = browser_policy();
        assert!(is_browser_box(&p));
        assert_eq!(shm_bytes(&p), BROWSER_SHM_BYTES);
        p.net.unix = false;
        assert!(!is_browser_box(&p));
        assert_eq!(shm_bytes(&p), h5i_runtime::bundle::DEFAULT_SHM_BYTES);
        let mut env = Vec::new();
        grant(&p, &mut env).unwrap();
        assert!(env.is_empty());
    }

    #[test]
    fn the_domain_list_is_loopback_plus_the_policys_egress_hosts() {
        let mut p = browser_policy();
        p.net.egress.clear();
        for (host, port) in [
            ("allowed.test", 8080),
            ("allowed.test", 9090),
            ("b.test", 443),
        ] {
            p.net.egress.push(HostPort {
                host: host.into(),
                port,
            });
        }
        assert_eq!(
            allowed_domains(&p),
            ["localhost", "127.0.0.1", "allowed.test", "b.test"]
        );
        let mut env = Vec::new();
        grant(&p, &mut env).unwrap();
        assert!(env.contains(
            &"AGENT_BROWSER_ALLOWED_DOMAINS=localhost,127.0.0.1,allowed.test,b.test".to_string()
        ));
        assert!(env.contains(&format!("AGENT_BROWSER_EXECUTABLE_PATH={CHROMIUM}")));
        assert!(!env.iter().any(|e| e.starts_with("AI_GATEWAY")), "{env:?}");
    }

    #[test]
    fn a_policy_injecting_the_chat_gateway_credential_is_refused() {
        let mut p = browser_policy();
        p.secrets.push(SecretGrant {
            name: "AI_GATEWAY_API_KEY".into(),
            source: SecretSource::Env("AI_GATEWAY_API_KEY".into()),
            inject: SecretInject::Env,
        });
        let err = grant(&p, &mut Vec::new()).unwrap_err().to_string();
        assert!(
            err.starts_with("refusing: secret `AI_GATEWAY_API_KEY`"),
            "{err}"
        );
        assert!(err.contains("to fix: drop the"), "{err}");
    }
}
