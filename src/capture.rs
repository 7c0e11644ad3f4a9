//! What an agent ran, command by command, as the box tells it: the in-box capture h5i wires
//! into an agent box, and the host's reading of what it staged.
//!
//! Owns, for an agent box at every kernel tier, the tool hooks h5i writes ([`tool_hooks`]: a
//! PreToolUse and a PostToolUse hook on every tool, whose command is h5i's own `h5i-hook capture
//! SOURCE` at [`HOOK_IN_BOX`]), and where they go:
//! - Claude Code 2.1.328 reads its managed settings from the folder `/etc/claude-code`
//!   (`AgentRuntime::system_dir`; `managed-settings.json` and `managed-settings.d/` in it;
//!   measured with strace: this build ignores `CLAUDE_CODE_MANAGED_SETTINGS_PATH`);
//! - Codex 0.171 reads its system layer from `/etc/codex`: `config.toml` (the switches
//!   and the provider of `crate::agent::codex_config`, which names the run's credential proxy,
//!   so the folder is written per run: [`CodexSystemDir`] for a container of the run's own,
//!   [`CodexSandboxFolder`] in the box's sandbox) and `hooks.json`, whose hooks run
//!   without Codex's trust review (measured: the same hooks in `$CODEX_HOME/hooks.json` do not
//!   run in `codex exec` until trusted), and `skills/`.
//!
//! Each box gets h5i's folder bound read-only over that path, which needs the path to exist on
//! the host when the box reads the host's `/etc` (`h5i host setup` makes both, empty). On the
//! host side, [`read_staged`] turns a staged `tool-call` record (box-claimed, hostile) into its
//! summary (event, tool, call id, command or file) and the raw payload the host stores,
//! redacted, under the box's `payloads/`.
//!
//! Must never: let the box write its managed settings, its Codex system folder or the hook
//! program (all read-only binds of host files outside every grant), let a run read another
//! run's proxy in its Codex folder, trust a staged record beyond its validated shape,
//! or present what the box staged as host-observed.
//!
//! Guarded by the unit tests below, `tests/agent_claude.rs` and `tests/agent_codex.rs` (a Codex
//! box's folder in its sandbox: the box cannot write it, each run's names its own proxy).

use std::path::{Path, PathBuf};

use h5i_policy::{AgentRuntime, ResolvedPolicy};
use serde_json::{json, Value};

use crate::error::BoxError;
use crate::store::StoredBox;

/// Where the box runs h5i's capture hook from (the hook crate's, which `agent` names too).
pub use h5i_hook::capture::HOOK_IN_BOX;

/// The agent's tool hooks for a box, in the shape both Claude Code's managed settings and
/// Codex's `hooks.json` take: every tool call is staged before it runs and after it returns,
/// named by the runtime's `h5i-hook capture` source.
pub fn tool_hooks(runtime: AgentRuntime) -> String {
    let source = h5i_hook::capture::source_of(runtime);
    let hook = json!([{
        "matcher": "*",
        "hooks": [{"type": "command", "command": format!("{HOOK_IN_BOX} capture {source}")}],
    }]);
    let settings = json!({
        "hooks": {"PreToolUse": hook, "PostToolUse": hook},
    });
    serde_json::to_string_pretty(&settings).unwrap_or_default() + "\n"
}

/// The read-only binds that wire the capture into a box, each `(host path, box path)`.
#[derive(Debug, Default)]
pub struct CaptureBinds {
    /// Directories (the managed settings).
    pub dirs: Vec<(PathBuf, PathBuf)>,
    /// Programs (the hook).
    pub programs: Vec<(PathBuf, PathBuf)>,
}

/// Refuse a box that reads the host's `/etc` when the host lacks `runtime`'s folder: a bind
/// needs its mount point, and the box's `/etc` is read-only.
fn check_mount_point(policy: &ResolvedPolicy, runtime: AgentRuntime) -> Result<(), BoxError> {
    let at = runtime.system_dir();
    let reads_host_etc = policy
        .fs
        .read
        .iter()
        .chain(&policy.fs.write)
        .any(|g| Path::new(at).starts_with(g));
    if reads_host_etc && !Path::new(at).is_dir() {
        return Err(BoxError::BadRequest {
            what: format!(
                "a {runtime} box reads h5i's settings for it (the capture hook) at {at}, which this host lacks, so there is nowhere to bind them in the box's read-only /etc"
            ),
            mend: "run `h5i host setup` as root once (it makes the empty directory)".into(),
        });
    }
    Ok(())
}

/// The capture binds for a box of `policy`'s runtime at the process and supervised tiers (none
/// for a box of no runtime). A Codex box's folder names the run's credential proxy, so it is
/// bound per run ([`CodexSystemDir`]); here it gets only the hook program.
pub fn binds_for(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    hook: &Path,
) -> Result<CaptureBinds, BoxError> {
    let Some(runtime) = policy.agent else {
        return Ok(CaptureBinds::default());
    };
    check_mount_point(policy, runtime)?;
    let mut programs = vec![(hook.to_path_buf(), PathBuf::from(HOOK_IN_BOX))];
    if runtime == AgentRuntime::Codex {
        programs.extend(tee_shim_binds(policy, hook));
        return Ok(CaptureBinds {
            dirs: Vec::new(),
            programs,
        });
    }
    let settings = tool_hooks(runtime);
    let dir = sb.paths.dir.join("capture").join(digest(&settings));
    if !dir.join(CLAUDE_SETTINGS_FILE).is_file() {
        write_folder(&dir, &[(CLAUDE_SETTINGS_FILE, &settings)])?;
    }
    Ok(CaptureBinds {
        dirs: vec![(dir, PathBuf::from(AgentRuntime::Claude.system_dir()))],
        programs,
    })
}

/// The tee shim's binds for a Codex box at a kernel tier (`h5i_hook::tee_shim`): the host's
/// bash at the shim's [`REAL_BASH`](h5i_hook::tee_shim::REAL_BASH), and `hook` over each
/// `bash` of the box that its read grants bring in. None when the host has no bash (the box
/// then has none to run either).
fn tee_shim_binds(policy: &ResolvedPolicy, hook: &Path) -> Vec<(PathBuf, PathBuf)> {
    use h5i_hook::tee_shim::{REAL_BASH, SHIM_AT};
    let Some(bash) = SHIM_AT.iter().find_map(|p| std::fs::canonicalize(p).ok()) else {
        return Vec::new();
    };
    let granted = |p: &Path| policy.fs.read.iter().any(|g| p.starts_with(g));
    let mut binds = vec![(bash, PathBuf::from(REAL_BASH))];
    binds.extend(
        SHIM_AT
            .iter()
            .map(Path::new)
            .filter(|p| granted(p))
            .map(|p| (hook.to_path_buf(), p.to_path_buf())),
    );
    binds
}

/// The file Claude Code reads in its managed folder.
pub const CLAUDE_SETTINGS_FILE: &str = "managed-settings.json";

/// Make `dir` (0755) holding `files` (0644: readable by the box's user, whoever it maps to;
/// written by the host only). Returns the files' paths.
pub fn write_folder(dir: &Path, files: &[(&str, &str)]) -> Result<Vec<PathBuf>, BoxError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| BoxError::io(dir, e))?;
    let mut written = Vec::new();
    for (name, text) in files {
        let file = dir.join(name);
        crate::store::write_atomic(&file, text.as_bytes())?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| BoxError::io(&file, e))?;
        written.push(file);
    }
    Ok(written)
}

/// The files of a Codex box's `/etc/codex` for one run whose box environment is
/// `env` (`KEY=VALUE`): `config.toml` and `hooks.json`.
pub fn codex_files(env: &[String]) -> [(&'static str, String); 2] {
    let base_url = env
        .iter()
        .find_map(|e| e.strip_prefix(&format!("{}=", crate::agent::CODEX_BASE_URL_VAR)));
    [
        ("config.toml", crate::agent::codex_config(base_url)),
        ("hooks.json", tool_hooks(AgentRuntime::Codex)),
    ]
}

/// A Codex box's `/etc/codex` for one process- or supervised-tier run, written beside
/// the run's bundle and removed (its two files, then the folder) when dropped.
#[derive(Debug)]
pub struct CodexSystemDir {
    dir: PathBuf,
    files: Vec<PathBuf>,
}

impl CodexSystemDir {
    /// For a Codex box: write the folder for `run_id` under `parent` from the run's
    /// environment and add its read-only bind to `binds`. `None` for any other box.
    pub fn for_run(
        policy: &ResolvedPolicy,
        parent: &Path,
        run_id: &str,
        env: &[String],
        binds: &mut Vec<h5i_runtime::bundle::Bind>,
    ) -> Result<Option<CodexSystemDir>, BoxError> {
        if policy.agent != Some(AgentRuntime::Codex) {
            return Ok(None);
        }
        let dir = parent.join(format!("codex-{run_id}"));
        let files = codex_files(env);
        let written = write_folder(&dir, &files.each_ref().map(|(n, t)| (*n, t.as_str())))?;
        binds.push(h5i_runtime::bundle::Bind::ro(
            &dir,
            AgentRuntime::Codex.system_dir(),
        ));
        Ok(Some(CodexSystemDir {
            dir,
            files: written,
        }))
    }
}

impl Drop for CodexSystemDir {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A Codex box's `/etc/codex` in its box-lifetime sandbox (`crate::sandbox`): one folder of
/// h5i's, in the sandbox's private directory, bound read-only over `/etc/codex` once, when the
/// sandbox is made. Its files are replaced before each run ([`CodexSandboxFolder::name_run`]),
/// so that its `config.toml` names that run's credential proxy, and after it
/// ([`CodexSandboxFolder::forget_run`]), so that it names no proxy while no run is served. The
/// bind is of the folder, not of its files: a file replaced by a rename in the folder is what
/// the box reads next, where a bind of the file would go on showing the file it was made over.
/// One run at a time is served from it (the sandbox holds `codex.lock` for the run).
#[derive(Debug)]
pub struct CodexSandboxFolder {
    dir: PathBuf,
}

impl CodexSandboxFolder {
    /// The folder at `dir` (not touched).
    pub fn at(dir: PathBuf) -> CodexSandboxFolder {
        CodexSandboxFolder { dir }
    }

    /// Make the folder afresh (0755, h5i's own) holding the files of no run.
    pub fn make(&self) -> Result<(), BoxError> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(BoxError::io(&self.dir, e)),
        }
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&self.dir)
            .map_err(|e| BoxError::io(&self.dir, e))?;
        self.forget_run()
    }

    /// Whether the folder is there to be bound and written.
    pub fn exists(&self) -> bool {
        self.dir.is_dir()
    }

    /// The read-only bind of the folder over Codex's system folder.
    pub fn bind(&self) -> h5i_runtime::bundle::Bind {
        h5i_runtime::bundle::Bind::ro(&self.dir, AgentRuntime::Codex.system_dir())
    }

    /// Before a run whose box environment is `env`: its files, naming the run's credential
    /// proxy, each replaced whole.
    pub fn name_run(&self, env: &[String]) -> Result<(), BoxError> {
        for (name, text) in codex_files(env) {
            replace_file(&self.dir, name, &text)?;
        }
        Ok(())
    }

    /// After a run (or before the first): the files of no run, naming no proxy.
    pub fn forget_run(&self) -> Result<(), BoxError> {
        self.name_run(&[])
    }
}

/// Replace `dir/name` with `text` (0644) in one rename, so that a reader in the box sees the
/// old file or the new one, never a part: the new file is written whole under a name of its
/// own in `dir` (created exclusively, never followed through a link) and renamed over the old.
fn replace_file(dir: &Path, name: &str, text: &str) -> Result<(), BoxError> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = dir.join(name);
    let tmp = dir.join(format!(
        ".{name}.{}",
        crate::random::hex(8).map_err(|e| BoxError::io(&path, e))?
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        // The caller's umask may have taken bits the box's user needs to read it.
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(text.as_bytes())?;
        std::fs::rename(&tmp, &path)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        BoxError::io(&path, e)
    })
}

fn digest(text: &str) -> String {
    let mut hex = crate::snapshot::digest::sha256_hex(text.as_bytes());
    hex.truncate(16);
    hex
}

/// A staged `tool-call` claim, read: the claim with its raw `payload` taken out and its
/// summary put in (`event`, `tool`, `tool_use_id`, and `command` or `file_path` when the
/// payload names one, each a string), and the payload text for the host to store. A payload
/// that is not a JSON object leaves the summary out (`unparsed: true`).
pub fn read_staged(mut claim: Value) -> (Value, Option<String>) {
    let Some(obj) = claim.as_object_mut() else {
        return (claim, None);
    };
    let payload = match obj.remove("payload") {
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => return (claim, None),
    };
    let parsed: Option<serde_json::Map<String, Value>> = serde_json::from_str(&payload).ok();
    let Some(p) = parsed else {
        obj.insert("unparsed".into(), Value::Bool(true));
        return (claim, Some(payload));
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(|s| Value::String(s.into()));
    for (to, from) in [
        ("event", "hook_event_name"),
        ("tool", "tool_name"),
        ("tool_use_id", "tool_use_id"),
    ] {
        if let Some(v) = text(p.get(from)) {
            obj.insert(to.into(), v);
        }
    }
    let input = p.get("tool_input");
    for key in ["command", "file_path"] {
        if let Some(v) = text(input.and_then(|i| i.get(key))) {
            obj.insert(key.into(), v);
        }
    }
    (claim, Some(payload))
}

/// Whether h5i binds the tee shim into `policy`'s boxes (a Codex box at the process,
/// supervised or container tier), so each command its agent runs should have a `tee-shim`
/// record beside the hooks' tool call. Codex runs commands through the user's login shell
/// (its passwd entry): at the process and supervised tiers that is the host's bash, where the
/// shim is bound; at the container tier the box user's entry is Podman's keep-id one, whose
/// shell h5i sets to the image's bash, where the shim is bound (`crate::container`'s
/// `login_shell`), unless the image has no bash or its own entry for the box user
/// (`crate::container::check_shim_image`).
pub fn tee_shim_wired(policy: &ResolvedPolicy) -> bool {
    policy.agent == Some(AgentRuntime::Codex)
        && matches!(
            policy.tier,
            h5i_policy::Tier::Process | h5i_policy::Tier::Supervised | h5i_policy::Tier::Container
        )
}

/// A staged `command` claim (the tee shim's), read: the claim with its output heads taken out
/// (the payload the host stores, as JSON `{"stdout": ..., "stderr": ...}`), and `unparsed:
/// true` in it when its summary is not the shim's shape (`command` and `cwd` strings, `exit`
/// and `signal` integers or null), so the report never shows a forged shape as a command.
pub fn read_command(mut claim: Value) -> (Value, Option<String>) {
    let Some(obj) = claim.as_object_mut() else {
        return (claim, None);
    };
    let mut out = serde_json::Map::new();
    for key in ["stdout", "stderr"] {
        if let Some(v) = obj.remove(key) {
            out.insert(key.into(), v);
        }
    }
    let int_or_null = |v: Option<&Value>| v.is_some_and(|v| v.is_null() || v.is_i64());
    let shaped = obj.get("command").is_some_and(Value::is_string)
        && obj.get("cwd").is_some_and(Value::is_string)
        && int_or_null(obj.get("exit"))
        && int_or_null(obj.get("signal"));
    if !shaped {
        obj.insert("unparsed".into(), Value::Bool(true));
    }
    let payload = (!out.is_empty()).then(|| Value::Object(out).to_string());
    (claim, payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_hooks_run_h5is_hook_before_and_after_every_tool() {
        for (rt, source) in [
            (AgentRuntime::Claude, "claude-code"),
            (AgentRuntime::Codex, "codex"),
        ] {
            let v: Value = serde_json::from_str(&tool_hooks(rt)).unwrap();
            for event in ["PreToolUse", "PostToolUse"] {
                let m = &v["hooks"][event][0];
                assert_eq!(m["matcher"], "*");
                assert_eq!(m["hooks"][0]["type"], "command");
                assert_eq!(
                    m["hooks"][0]["command"],
                    format!("/.h5i/bin/h5i-hook capture {source}")
                );
            }
        }
    }

    #[test]
    fn codexs_folder_names_the_runs_proxy_and_holds_the_hooks() {
        let env = vec![
            "PATH=/usr/bin".to_string(),
            "OPENAI_BASE_URL=http://127.0.0.1:41234/v1".to_string(),
        ];
        let [(config_name, config), (hooks_name, hooks)] = codex_files(&env);
        assert_eq!((config_name, hooks_name), ("config.toml", "hooks.json"));
        assert!(
            config.contains("base_url = \"http://127.0.0.1:41234/v1\""),
            "{config}"
        );
        assert_eq!(hooks, tool_hooks(AgentRuntime::Codex));
        // Without the proxy's variable there is no provider to name.
        let [(_, config), _] = codex_files(&env[..1]);
        assert!(!config.contains("base_url"), "{config}");
    }

    #[test]
    fn a_staged_call_is_summarized_and_its_payload_taken_out() {
        let payload = json!({
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_use_id": "toolu_1",
            "tool_input": {"command": "cat /work/a", "description": "d"},
        })
        .to_string();
        let (claim, raw) =
            read_staged(json!({"kind": "tool-call", "payload": payload, "source": "claude-code"}));
        assert_eq!(raw.as_deref(), Some(payload.as_str()));
        assert_eq!(claim["event"], "PreToolUse");
        assert_eq!(claim["tool"], "Bash");
        assert_eq!(claim["tool_use_id"], "toolu_1");
        assert_eq!(claim["command"], "cat /work/a");
        assert!(claim.get("payload").is_none());
    }

    #[test]
    fn a_shim_command_keeps_its_summary_and_its_output_goes_to_the_payload() {
        let (c, raw) = read_command(json!({"kind": "command", "lane": "tee-shim",
            "command": "cat a", "cwd": "/work", "exit": 0, "signal": null,
            "stdout": "hi\n", "stderr": ""}));
        assert_eq!(c["command"], "cat a");
        assert!(c.get("stdout").is_none() && c.get("unparsed").is_none());
        let raw: Value = serde_json::from_str(&raw.unwrap()).unwrap();
        assert_eq!(raw["stdout"], "hi\n");
        // A forged shape: no command, an exit that is not a number.
        for forged in [
            json!({"kind": "command", "cwd": "/", "exit": 0}),
            json!({"kind": "command", "command": "x", "cwd": "/", "exit": "0"}),
            json!({"kind": "command", "command": ["x"], "cwd": "/", "exit": 0}),
        ] {
            assert_eq!(read_command(forged).0["unparsed"], true);
        }
    }

    #[test]
    fn hostile_payloads_give_no_summary_and_no_panic() {
        // Not JSON; JSON but not an object; fields of the wrong type.
        let (c, raw) = read_staged(json!({"kind": "tool-call", "payload": "{{{"}));
        assert_eq!(c["unparsed"], true);
        assert_eq!(raw.as_deref(), Some("{{{"));
        let (c, _) = read_staged(json!({"kind": "tool-call", "payload": "[1,2]"}));
        assert_eq!(c["unparsed"], true);
        let (c, _) = read_staged(json!({"kind": "tool-call",
            "payload": r#"{"tool_name": 7, "tool_input": "x", "hook_event_name": {"a": 1}}"#}));
        assert!(c.get("tool").is_none() && c.get("event").is_none() && c.get("command").is_none());
        let (c, raw) = read_staged(json!({"kind": "tool-call"}));
        assert!(raw.is_none() && c.get("unparsed").is_none());
    }
}
