//! The built-in profiles: one reviewed table of data, [`BUILTIN_PROFILES`].
//!
//! Owns what `default`, `agent`, `agent-claude`, `agent-codex` and `browser` grant, and how
//! `agent` is scoped by `H5I_AGENT`. Must never: read the environment itself (the caller passes
//! `H5I_AGENT`'s value), give one runtime's profile another runtime's egress or credential
//! (a prompt-injected Claude box must not reach the OpenAI credential), or grant anything not
//! written in the table.
//!
//! Guarded by `every_builtin_profile_resolves_and_round_trips` (walks the whole table) and
//! `runtime_scoping_*` in `resolve.rs`, and the tests below.

use crate::error::{Location, PolicyError};
use crate::profile::{Located, ProfilePolicy};
use crate::resolved::{AgentRuntime, AuthGrant, CredentialFallback, NetMode, Resources};

use crate::values::{normalize_fs_path, HostPort};

/// What a built-in profile starts from before adding its own grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extends {
    /// Nothing: the entry is complete on its own.
    Nothing,
    /// Another built-in profile's values (the entry's grants are added to them).
    Profile(&'static str),
    /// The runtime-pinned profile `agent-<H5I_AGENT>`.
    AgentRuntime,
}

/// An authenticated-egress grant in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltinAuth {
    /// Upstream host.
    pub host: &'static str,
    /// Host variable holding the real credential.
    pub credential_env: &'static str,
    /// Box variable given the proxy's base URL.
    pub base_url_var: &'static str,
    /// Box variable given the per-run dummy token.
    pub token_var: &'static str,
    /// Other `(credential_env, token_var)` pairs tried in order when `credential_env` is unset.
    pub fallbacks: &'static [(&'static str, &'static str)],
}

/// One built-in profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltinProfile {
    /// The name `--profile` takes.
    pub name: &'static str,
    /// What it grants, in one line (for help and `status`).
    pub summary: &'static str,
    /// What it starts from.
    pub extends: Extends,
    /// The runtime it pins, if it pins one itself.
    pub agent: Option<AgentRuntime>,
    /// Read-only paths added.
    pub read: &'static [&'static str],
    /// Read-write paths added.
    pub write: &'static [&'static str],
    /// Egress destinations added (`host` or `host:port`).
    pub egress: &'static [&'static str],
    /// Whether it turns on `net.unix`.
    pub unix: bool,
    /// Credential-proxy grants added.
    pub auth: &'static [BuiltinAuth],
}

/// System paths every confined box reads: binaries, libraries, configuration.
const SYSTEM_READ: &[&str] = &["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/opt"];

/// The built-in profiles. Every entry is reviewed; every grant has its reason beside it.
pub const BUILTIN_PROFILES: &[BuiltinProfile] = &[
    // Fail-closed build/test confinement: the system read-only, the workspace read-write, no
    // network, no AF_UNIX. Custom profiles start from these values too.
    BuiltinProfile {
        name: "default",
        summary: "system paths read-only, $WORK read-write, no network",
        extends: Extends::Nothing,
        agent: None,
        read: SYSTEM_READ,
        write: &["$WORK"],
        egress: &[],
        unix: false,
        auth: &[],
    },
    // The agent-in-box surface, scoped to H5I_AGENT's runtime: exactly agent-claude or
    // agent-codex, never both.
    BuiltinProfile {
        name: "agent",
        summary: "the agent-in-box surface, scoped to $H5I_AGENT's runtime",
        extends: Extends::AgentRuntime,
        agent: None,
        read: &[],
        write: &[],
        egress: &[],
        unix: false,
        auth: &[],
    },
    // Claude Code: its HOME state (a per-box copy, never written back), the Anthropic API, and
    // the credential-proxy grant that keeps the real key on the host.
    BuiltinProfile {
        name: "agent-claude",
        summary: "default plus Claude Code's HOME state and Anthropic API egress",
        extends: Extends::Profile("default"),
        agent: Some(AgentRuntime::Claude),
        read: &[],
        // ~/.claude is the state dir; ~/.claude.json is the settings file beside it.
        write: &["~/.claude", "~/.claude.json"],
        egress: &["api.anthropic.com:443"],
        unix: false,
        auth: &[BuiltinAuth {
            host: "api.anthropic.com",
            credential_env: "ANTHROPIC_API_KEY",
            base_url_var: "ANTHROPIC_BASE_URL",
            token_var: "ANTHROPIC_API_KEY",
            // A subscription login (`claude setup-token`): Claude Code sends it as
            // `Authorization: Bearer`, which the proxy swaps like the key.
            fallbacks: &[("CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")],
        }],
    },
    // Codex: its HOME state, the OpenAI API, and the proxy grant for the OpenAI key.
    BuiltinProfile {
        name: "agent-codex",
        summary: "default plus Codex's HOME state and OpenAI API egress",
        extends: Extends::Profile("default"),
        agent: Some(AgentRuntime::Codex),
        read: &[],
        write: &["~/.codex"],
        egress: &["api.openai.com:443"],
        unix: false,
        auth: &[BuiltinAuth {
            host: "api.openai.com",
            credential_env: "OPENAI_API_KEY",
            base_url_var: "OPENAI_BASE_URL",
            token_var: "OPENAI_API_KEY",
            fallbacks: &[],
        }],
    },
    // The agent profile plus headless Chromium and the agent-browser daemon. No egress beyond
    // the agent's: Chrome's egress is the box's egress.
    BuiltinProfile {
        name: "browser",
        summary: "the agent profile plus headless Chromium and the agent-browser daemon",
        extends: Extends::Profile("agent"),
        agent: None,
        // Chromium's install and its managed-policy dir; named even though the system paths
        // cover them today, so the browser keeps working if that set ever narrows.
        read: &["/usr/lib/chromium", "/etc/chromium"],
        // agent-browser's state: its daemon's control socket, pid files and sessions.
        write: &["~/.agent-browser"],
        egress: &[],
        // The agent-browser daemon's control socket is a filesystem-bound AF_UNIX listener.
        unix: true,
        auth: &[],
    },
];

/// The ceilings every box gets unless its profile sets its own (`[profile.X.resources]` in
/// env.toml overrides each one): they protect the host, not the box's work.
///
/// - `mem`: half the host's memory (at least 1 GiB; 4 GiB when the caller did not say how much
///   the host has). A runaway allocation in one box is OOM-killed inside its cage while the
///   host and its other work keep the other half; a build that needs more says so in env.toml.
/// - `procs`: 4096 tasks (threads count: the pids controller counts tasks). A parallel build on
///   a large machine stays far below it; a fork bomb stops there instead of at the host's
///   pid_max, where it would starve every other process.
/// - `wall`: 24 hours per run. Long agent sessions and full test suites fit; a forgotten run
///   that never ends is stopped (exit 124) within a day.
pub fn protective_ceilings(host_memory_bytes: Option<u64>) -> Resources {
    const MIB: u64 = 1 << 20;
    const FLOOR: u64 = 1 << 30;
    const UNKNOWN_HOST: u64 = 4 << 30;
    let mem = host_memory_bytes.map_or(UNKNOWN_HOST, |total| (total / 2).max(FLOOR));
    Resources {
        mem_bytes: Some(mem / MIB * MIB),
        procs: Some(PROTECTIVE_PROCS),
        wall_secs: Some(PROTECTIVE_WALL_SECS),
    }
}

/// The protective process ceiling (see [`protective_ceilings`]).
pub const PROTECTIVE_PROCS: u64 = 4096;
/// The protective wall clock per run, seconds (see [`protective_ceilings`]).
pub const PROTECTIVE_WALL_SECS: u64 = 24 * 60 * 60;

/// The built-in profile named `name`, if there is one.
pub fn builtin(name: &str) -> Option<&'static BuiltinProfile> {
    BUILTIN_PROFILES.iter().find(|p| p.name == name)
}

/// Whether `name` is a built-in profile (custom profiles may not shadow one).
pub fn is_builtin(name: &str) -> bool {
    builtin(name).is_some()
}

/// The policy of built-in profile `name`, scoping runtime-dependent entries by `h5i_agent`
/// (the value of `H5I_AGENT`, passed in). `Ok(None)` when `name` is not built in.
pub(crate) fn builtin_policy(
    name: &str,
    h5i_agent: Option<&str>,
) -> Result<Option<ProfilePolicy>, PolicyError> {
    let Some(entry) = builtin(name) else {
        return Ok(None);
    };
    let mut policy = match entry.extends {
        Extends::Nothing => empty(entry.name),
        Extends::Profile(base) => base_policy(base, h5i_agent).map_err(|e| match e {
            // Name the profile the caller asked for, not the base that needed H5I_AGENT.
            PolicyError::AgentRuntime { value, .. } => PolicyError::AgentRuntime {
                profile: name.to_owned(),
                value,
            },
            other => other,
        })?,
        Extends::AgentRuntime => {
            let runtime = match h5i_agent.filter(|v| !v.is_empty()) {
                None => {
                    return Err(PolicyError::AgentRuntime {
                        profile: name.to_owned(),
                        value: "unset".to_owned(),
                    })
                }
                Some(v) => v
                    .parse::<AgentRuntime>()
                    .map_err(|()| PolicyError::AgentRuntime {
                        profile: name.to_owned(),
                        value: format!("`{v}`"),
                    })?,
            };
            base_policy(&format!("agent-{runtime}"), h5i_agent)?
        }
    };
    add_entry(&mut policy, entry)?;
    policy.name = name.to_owned();
    policy.check()?;
    Ok(Some(policy))
}

fn base_policy(base: &str, h5i_agent: Option<&str>) -> Result<ProfilePolicy, PolicyError> {
    // A table entry naming a base that is not in the table is a defect the table test catches;
    // refuse rather than resolve a profile missing its base.
    builtin_policy(base, h5i_agent)?.ok_or_else(|| PolicyError::InvalidValue {
        at: Location::builtin(base, "extends"),
        what: format!("built-in profile `{base}` does not exist"),
        mend: "report this: the built-in profile table is inconsistent".to_owned(),
    })
}

fn empty(name: &str) -> ProfilePolicy {
    ProfilePolicy {
        name: name.to_owned(),
        agent: None,
        isolation: None,
        fs_read: Vec::new(),
        fs_write: Vec::new(),
        fs_deny: Vec::new(),
        net_mode: Located::new(NetMode::Deny, Location::builtin(name, "net.mode")),
        egress: Located::new(Vec::new(), Location::builtin(name, "net.egress")),
        unix: false,
        loopback: Vec::new(),
        families: Vec::new(),
        resources: Resources::default(),
        secrets: Vec::new(),
        auth: Located::new(Vec::new(), Location::builtin(name, "auth")),
        image: None,
        container_runtime: None,
    }
}

fn add_entry(policy: &mut ProfilePolicy, entry: &BuiltinProfile) -> Result<(), PolicyError> {
    let n = entry.name;
    if entry.agent.is_some() {
        policy.agent = entry.agent;
    }
    for (paths, key, into) in [
        (entry.read, "fs.read", &mut policy.fs_read),
        (entry.write, "fs.write", &mut policy.fs_write),
    ] {
        for p in paths {
            let at = Location::builtin(n, key);
            let path = normalize_fs_path(p).map_err(|e| PolicyError::InvalidValue {
                at: at.clone(),
                what: e.what,
                mend: e.mend,
            })?;
            into.push(Located::new(path, at));
        }
    }
    if !entry.egress.is_empty() {
        let at = Location::builtin(n, "net.egress");
        for e in entry.egress {
            let hp: HostPort =
                e.parse()
                    .map_err(|p: crate::values::ValueProblem| PolicyError::InvalidValue {
                        at: at.clone(),
                        what: p.what,
                        mend: p.mend,
                    })?;
            policy.egress.value.push(hp);
        }
        policy.egress.at = at;
    }
    policy.unix |= entry.unix;
    if !entry.auth.is_empty() {
        policy.auth.at = Location::builtin(n, "auth");
        policy.auth.value.extend(entry.auth.iter().map(|a| {
            AuthGrant {
                host: a.host.to_owned(),
                credential_env: a.credential_env.to_owned(),
                base_url_var: a.base_url_var.to_owned(),
                token_var: a.token_var.to_owned(),
                fallbacks: a
                    .fallbacks
                    .iter()
                    .map(|(env, var)| CredentialFallback {
                        credential_env: (*env).to_owned(),
                        token_var: (*var).to_owned(),
                    })
                    .collect(),
            }
        }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::is_profile_name;

    #[test]
    fn the_table_has_unique_valid_names_and_known_bases() {
        let mut names: Vec<_> = BUILTIN_PROFILES.iter().map(|p| p.name).collect();
        for n in &names {
            assert!(is_profile_name(n), "{n}");
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names.len(),
            BUILTIN_PROFILES.len(),
            "duplicate built-in name"
        );
        for p in BUILTIN_PROFILES {
            if let Extends::Profile(base) = p.extends {
                assert!(is_builtin(base), "{} extends unknown {base}", p.name);
            }
        }
        for expected in ["default", "agent", "agent-claude", "agent-codex", "browser"] {
            assert!(is_builtin(expected), "{expected} missing");
        }
    }

    #[test]
    fn default_is_fail_closed() {
        let d = builtin_policy("default", None).unwrap().unwrap();
        assert_eq!(d.net_mode.value, NetMode::Deny);
        assert!(d.egress.value.is_empty());
        assert!(!d.unix);
        assert!(d.auth.value.is_empty());
        let writes: Vec<_> = d.fs_write.iter().map(|l| l.value.as_str()).collect();
        assert_eq!(writes, ["$WORK"]);
    }

    #[test]
    fn agent_needs_a_known_h5i_agent() {
        for (value, shown) in [(None, "unset"), (Some(""), "unset"), (Some("gpt"), "`gpt`")] {
            for name in ["agent", "browser"] {
                let err = builtin_policy(name, value).unwrap_err();
                assert!(matches!(err, PolicyError::AgentRuntime { .. }), "{err:?}");
                let m = err.to_string();
                assert!(
                    m.contains(shown) && m.contains("to fix: set H5I_AGENT=claude"),
                    "{m}"
                );
            }
        }
    }

    #[test]
    fn browser_is_the_agent_profile_plus_unix_and_its_daemon_state() {
        let a = builtin_policy("agent", Some("claude")).unwrap().unwrap();
        let b = builtin_policy("browser", Some("claude")).unwrap().unwrap();
        assert!(b.unix && !a.unix);
        assert_eq!(b.egress.value, a.egress.value);
        assert_eq!(b.auth.value, a.auth.value);
        assert_eq!(b.agent, Some(AgentRuntime::Claude));
        assert!(b.fs_write.iter().any(|l| l.value == "$HOME/.agent-browser"));
    }
}
