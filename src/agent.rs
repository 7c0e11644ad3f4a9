//! What an agent runtime's box needs besides its credential proxy: the runtime's own switches,
//! set by h5i so the agent runs headless and quiet inside a box.
//!
//! Owns [`check_installed`] (an agent box at a kernel tier is refused at create when its
//! agent's binary is not where the box can run it), [`runtime_env`], one reviewed table per
//! runtime (every entry with its reason), which the process, supervised and container tiers add
//! to an agent box's environment, and [`codex_config`], Codex's system `config.toml` for a run
//! (Codex has no variables for its switches, and its provider's base URL is read from
//! configuration only; `crate::capture` binds it read-only at `/etc/codex`). The credential
//! variables (the base URL and the per-run dummy) are the credential proxy's, in
//! `credentials.rs`; these tables never hold a credential, and the only host they name is the
//! run's credential proxy on the box's own loopback.
//!
//! Must never: turn on anything that reaches a network destination (every switch here turns
//! traffic or a feature off), or differ between tiers.
//!
//! Guarded by the unit test below and `tests/agent_claude.rs` (the variables reach the agent).

use std::path::{Path, PathBuf};

use h5i_policy::{AgentRuntime, ResolvedPolicy, Tier};

use crate::error::BoxError;

/// The directories a kernel-tier box's `PATH` names, in order (the same list `process.rs`
/// hands the box).
pub const BOX_PATH_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// The command a runtime is started with in its box.
pub fn command(runtime: AgentRuntime) -> &'static str {
    match runtime {
        AgentRuntime::Claude => "claude",
        AgentRuntime::Codex => "codex",
    }
}

/// Where the box would find `runtime`'s command: the first executable on the box's `PATH`
/// that lies under one of `policy`'s read grants.
fn installed(policy: &ResolvedPolicy, runtime: AgentRuntime) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let readable = |p: &Path| {
        policy
            .fs
            .read
            .iter()
            .chain(&policy.fs.write)
            .any(|g| p.starts_with(g))
    };
    BOX_PATH_DIRS
        .iter()
        .map(|d| Path::new(d).join(command(runtime)))
        .find(|p| {
            // The grant has to cover where the link leads, not only the link.
            let real = std::fs::canonicalize(p).ok();
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                && readable(p)
                && real.as_deref().is_some_and(readable)
        })
}

/// Refuse, before any state exists, a kernel-tier agent box whose agent is not installed where
/// the box can run it. (A container box's agent comes from its image, which the image check
/// covers; a workspace box runs on the host as the caller.)
pub fn check_installed(policy: &ResolvedPolicy) -> Result<(), BoxError> {
    let Some(runtime) = policy.agent else {
        return Ok(());
    };
    if !matches!(policy.tier, Tier::Process | Tier::Supervised) {
        return Ok(());
    }
    if installed(policy, runtime).is_some() {
        return Ok(());
    }
    Err(BoxError::BadRequest {
        what: format!(
            "profile `{}` runs {runtime}, but `{}` is not installed on this host where a {} box can run it (an executable in {} under the box's read grants)",
            policy.profile,
            command(runtime),
            policy.tier,
            BOX_PATH_DIRS.join(":")
        ),
        mend: "run `make setup` (it installs the pinned Claude Code and Codex under /usr/local), or pick --isolation container with an agent image".into(),
    })
}

/// The argv a run of `policy`'s box starts `argv` with: for a Claude Code box at a tier that
/// binds h5i's hook program into it (process, supervised, container), `h5i-hook claude-state
/// -- ARGV`, which makes Claude Code's state in the box's HOME ready for the run as the box's
/// user and then becomes `argv` (`h5i_hook::claude_state`: onboarding done, this run's dummy
/// approved); `None` for any other box, which runs `argv` as it is.
pub fn claude_state_argv(
    policy: &ResolvedPolicy,
    argv: &[std::ffi::OsString],
) -> Option<Vec<std::ffi::OsString>> {
    let wired = policy.agent == Some(AgentRuntime::Claude)
        && matches!(
            policy.tier,
            Tier::Process | Tier::Supervised | Tier::Container
        );
    wired.then(|| {
        [h5i_hook::capture::HOOK_IN_BOX, "claude-state", "--"]
            .into_iter()
            .map(std::ffi::OsString::from)
            .chain(argv.iter().cloned())
            .collect()
    })
}

/// Claude Code's switches.
const CLAUDE: &[(&str, &str)] = &[
    // The box's installation is pinned by `make setup` / the image; an agent updating itself
    // would write outside its grants and run a binary nobody reviewed.
    ("DISABLE_AUTOUPDATER", "1"),
    // Usage telemetry and error reports go to hosts outside the box's egress; they would be
    // refused anyway, and each refusal would be a finding that says nothing about the work.
    ("DISABLE_TELEMETRY", "1"),
    ("DISABLE_ERROR_REPORTING", "1"),
    // Everything else not needed for the model call (release notes, feature flags).
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
];

/// The variables an agent box of `runtime` gets (none for a box not scoped to an agent, and
/// none for Codex, whose switches are in [`codex_config`]).
pub fn runtime_env(runtime: Option<AgentRuntime>) -> &'static [(&'static str, &'static str)] {
    match runtime {
        Some(AgentRuntime::Claude) => CLAUDE,
        Some(AgentRuntime::Codex) | None => &[],
    }
}

/// The box variable holding the credential proxy's base URL for Codex (agent-codex's grant).
pub const CODEX_BASE_URL_VAR: &str = "OPENAI_BASE_URL";
/// The box variable holding the per-run dummy Codex sends as its key.
pub const CODEX_KEY_VAR: &str = "OPENAI_API_KEY";

/// Codex's switches, as `config.toml` lines (Codex 0.171's keys; an unknown key would be
/// ignored, so the unit test below and `tests/agent_codex.rs` check the real binary reads them).
const CODEX_SWITCHES: &str = r#"# h5i's system configuration for Codex in a box, written for this run and read-only in it.
# The box is the sandbox: Codex's own (namespaces and seccomp) cannot start under h5i's seccomp,
# and h5i's box already confines every command it runs.
sandbox_mode = "danger-full-access"
# The installation is pinned by `make setup` / the image; the check reaches a host outside the
# box's egress (refused anyway; each refusal would be a finding that says nothing of the work).
check_for_update_on_startup = false
"#;

/// Codex's tables of switches, after every top-level key.
const CODEX_TABLES: &str = r#"
# Usage analytics and OpenTelemetry export reach hosts outside the box's egress.
[analytics]
enabled = false

[otel]
exporter = "none"

# Codex's shell snapshot wraps every command in a preamble of its own (and runs a shell at
# start to take it): h5i's tee shim would record the wrapper, not the command the model asked
# for, and the box's two accounts of what ran could not be compared.
[features]
shell_snapshot = false
# The interactive CLI would start a background app-server listening on a unix socket under
# ~/.codex (and reuse one already running): the box makes no AF_UNIX socket (`net.unix` off:
# a socket() there could reach a host listener), so the TUI runs its server in-process, as
# `codex --no-daemon` does.
daemon_auto_start = false
"#;

/// Codex's system `config.toml` for one run: the switches, and when the run's credential proxy
/// serves Codex (`base_url`, the value of [`CODEX_BASE_URL_VAR`]) a provider that reaches it
/// over HTTP streaming with the per-run dummy as its key. (Codex 0.171's built-in `openai`
/// provider ignores `OPENAI_BASE_URL` and opens a WebSocket, which the proxy does not serve.)
pub fn codex_config(base_url: Option<&str>) -> String {
    let mut toml = CODEX_SWITCHES.to_owned();
    let Some(url) = base_url else {
        return toml + CODEX_TABLES;
    };
    // A JSON string is a TOML basic string.
    let quoted = serde_json::Value::String(url.to_owned()).to_string();
    toml.push_str(&format!(
        "# The model is reached only through h5i's credential proxy on the box's loopback.\n\
         model_provider = \"h5i\"\n{CODEX_TABLES}\n\
         [model_providers.h5i]\n\
         name = \"h5i credential proxy\"\n\
         base_url = {quoted}\n\
         env_key = \"{CODEX_KEY_VAR}\"\n\
         supports_websockets = false\n"
    ));
    toml
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claude_at(tier: &str) -> ResolvedPolicy {
        let req = h5i_policy::ResolveRequest {
            profile: Some("agent-claude".into()),
            isolation: Some(tier.into()),
            ..Default::default()
        };
        h5i_policy::resolve(None, &req, &h5i_policy::HostTiers::all_available()).unwrap()
    }

    #[test]
    fn an_agent_the_box_cannot_read_is_refused_with_the_mend() {
        for tier in ["process", "supervised"] {
            let mut p = claude_at(tier);
            // As if nothing were installed under the box's grants.
            p.fs.read = vec!["/nonexistent-h5i".into()];
            p.fs.write = vec!["$WORK".into()];
            let err = check_installed(&p).unwrap_err().to_string();
            assert!(
                err.contains("`claude` is not installed") && err.contains("make setup"),
                "{err}"
            );
        }
        // A box with no agent, and a container box (its agent is in its image), are not
        // checked here.
        let mut p = claude_at("process");
        p.fs.read.clear();
        p.agent = None;
        check_installed(&p).unwrap();
    }

    #[test]
    fn a_claude_box_starts_through_the_state_step_and_no_other_does() {
        let argv = vec!["claude".into(), "-p".into(), "hi".into()];
        for tier in [Tier::Process, Tier::Supervised, Tier::Container] {
            let mut p = claude_at("process");
            p.tier = tier;
            let got = claude_state_argv(&p, &argv).unwrap();
            assert_eq!(
                got,
                [
                    "/.h5i/bin/h5i-hook",
                    "claude-state",
                    "--",
                    "claude",
                    "-p",
                    "hi"
                ]
                .map(std::ffi::OsString::from)
            );
        }
        let mut p = claude_at("process");
        p.agent = Some(AgentRuntime::Codex);
        assert!(claude_state_argv(&p, &argv).is_none());
        p.agent = None;
        assert!(claude_state_argv(&p, &argv).is_none());
        p.agent = Some(AgentRuntime::Claude);
        p.tier = Tier::Workspace;
        assert!(claude_state_argv(&p, &argv).is_none());
    }

    #[test]
    fn every_switch_turns_something_off_and_names_no_host() {
        let env = runtime_env(Some(AgentRuntime::Claude));
        assert!(!env.is_empty());
        for (k, v) in env {
            assert_eq!(*v, "1", "{k}");
            assert!(
                k.starts_with("DISABLE_") || k.contains("_DISABLE_"),
                "{k} does not turn something off"
            );
        }
        assert!(runtime_env(Some(AgentRuntime::Codex)).is_empty());
        assert!(runtime_env(None).is_empty());
        let off = codex_config(None);
        for line in [
            "sandbox_mode = \"danger-full-access\"",
            "check_for_update_on_startup = false",
            "[analytics]\nenabled = false",
            "[otel]\nexporter = \"none\"",
            "[features]\nshell_snapshot = false",
        ] {
            assert!(off.contains(line), "{line}: {off}");
        }
        assert!(!off.contains("http"), "{off}");
    }

    #[test]
    fn codexs_provider_is_the_runs_proxy_with_the_dummy_key_and_no_websocket() {
        let c = codex_config(Some("http://127.0.0.1:41234/v1"));
        let provider = c.split("[model_providers.h5i]").nth(1).unwrap();
        assert!(
            provider.contains("base_url = \"http://127.0.0.1:41234/v1\""),
            "{c}"
        );
        assert!(provider.contains("env_key = \"OPENAI_API_KEY\""), "{c}");
        assert!(provider.contains("supports_websockets = false"), "{c}");
        // Top-level keys come before the first table, or TOML would put them in it.
        let top = c.split("\n[").next().unwrap();
        assert!(top.contains("model_provider = \"h5i\""), "{c}");
        assert!(top.contains("sandbox_mode"), "{c}");
        // A quote in the value cannot end the string.
        let hostile = codex_config(Some("http://x\"\nsandbox_mode = \"read-only"));
        assert_eq!(hostile.matches("\nsandbox_mode").count(), 1, "{hostile}");
    }
}
