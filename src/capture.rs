//! What an agent ran, command by command, as the box tells it: the in-box capture h5i wires
//! into an agent box, and the host's reading of what it staged.
//!
//! Owns, for a Claude Code box at the process and supervised tiers: the managed settings h5i
//! writes ([`claude_managed_settings`]: a PreToolUse and a PostToolUse hook on every tool, whose
//! command is h5i's own `h5i-hook capture` at [`HOOK_IN_BOX`]), and where they go. Claude Code
//! 2.1.328 reads its managed settings from the folder [`CLAUDE_MANAGED_DIR`]
//! (`managed-settings.json` and `managed-settings.d/` in it; measured with strace: this build
//! ignores `CLAUDE_CODE_MANAGED_SETTINGS_PATH`), so the box gets h5i's folder bound read-only
//! over that path, which needs the path to exist on the host when the box reads the host's
//! `/etc` (`h5i host setup` makes it, empty). On the host side, [`read_staged`] turns a staged
//! `tool-call` record (box-claimed, hostile) into its summary (event, tool, call id, command or
//! file) and the raw payload the host stores, redacted, under the box's `payloads/`.
//!
//! Must never: let the box write its managed settings or the hook program (both are read-only
//! binds of host files outside every grant), trust a staged record beyond its validated shape,
//! or present what the box staged as host-observed.
//!
//! Guarded by the unit tests below and `tests/agent_claude.rs`.

use std::path::{Path, PathBuf};

use h5i_policy::{AgentRuntime, ResolvedPolicy};
use serde_json::{json, Value};

use crate::error::BoxError;
use crate::store::StoredBox;

/// Where Claude Code reads its managed settings on Linux (a folder).
pub const CLAUDE_MANAGED_DIR: &str = "/etc/claude-code";
/// Where the box runs h5i's capture hook from.
pub const HOOK_IN_BOX: &str = "/.h5i/bin/h5i-hook";
/// The staged record's `source` for Claude Code's hooks.
pub const CLAUDE_SOURCE: &str = "claude-code";

/// Claude Code's managed settings for a box: every tool call is staged before it runs and
/// after it returns.
pub fn claude_managed_settings() -> String {
    let hook = json!([{
        "matcher": "*",
        "hooks": [{"type": "command", "command": format!("{HOOK_IN_BOX} capture")}],
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

/// The capture binds for a box of `policy`'s runtime. None for a box of no runtime or of a
/// runtime without a hook h5i wires yet (Codex).
pub fn binds_for(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    hook: &Path,
) -> Result<CaptureBinds, BoxError> {
    if policy.agent != Some(AgentRuntime::Claude) {
        return Ok(CaptureBinds::default());
    }
    let reads_host_etc = policy
        .fs
        .read
        .iter()
        .chain(&policy.fs.write)
        .any(|g| Path::new(CLAUDE_MANAGED_DIR).starts_with(g));
    if reads_host_etc && !Path::new(CLAUDE_MANAGED_DIR).is_dir() {
        return Err(BoxError::BadRequest {
            what: format!(
                "a Claude Code box reads its managed settings (h5i's capture hook) at {CLAUDE_MANAGED_DIR}, which this host lacks, so there is nowhere to bind them in the box's read-only /etc"
            ),
            mend: "run `h5i host setup` as root once (it makes the empty directory)".into(),
        });
    }
    let settings = claude_managed_settings();
    let dir = sb.paths.dir.join("capture").join(digest(&settings));
    let file = dir.join("managed-settings.json");
    if !file.is_file() {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|e| BoxError::io(&dir, e))?;
        crate::store::write_atomic(&file, settings.as_bytes())?;
        // Readable by the box's user, whoever it maps to; written by the host only.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| BoxError::io(&file, e))?;
    }
    Ok(CaptureBinds {
        dirs: vec![(dir, PathBuf::from(CLAUDE_MANAGED_DIR))],
        programs: vec![(hook.to_path_buf(), PathBuf::from(HOOK_IN_BOX))],
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_managed_settings_run_h5is_hook_before_and_after_every_tool() {
        let v: Value = serde_json::from_str(&claude_managed_settings()).unwrap();
        for event in ["PreToolUse", "PostToolUse"] {
            let m = &v["hooks"][event][0];
            assert_eq!(m["matcher"], "*");
            assert_eq!(m["hooks"][0]["type"], "command");
            assert_eq!(m["hooks"][0]["command"], "/.h5i/bin/h5i-hook capture");
        }
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
