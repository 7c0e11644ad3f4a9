//! The browser in a box: what a browser box's runs get for Chromium and agent-browser, and the
//! one place the run path asks for it ([`grant`]).
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

pub mod control;
pub mod drain;
pub mod fence;
pub mod idle;
pub mod relay;
pub mod sidecar;
#[cfg(feature = "ui")]
pub mod term;
#[cfg(feature = "ui")]
pub mod view;
pub mod view_sessions;
pub mod viewer;
#[cfg(feature = "ui")]
pub mod watch;

use h5i_policy::resolved::SecretInject;
use h5i_policy::ResolvedPolicy;

use crate::error::BoxError;

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
