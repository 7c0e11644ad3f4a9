//! `h5i-hook capture SOURCE`: the in-box half of "what the agent ran". Claude Code and Codex run
//! it as a PreToolUse/PostToolUse hook (from the settings h5i binds read-only into the box:
//! Claude Code's managed settings, Codex's system `hooks.json`); it stages the hook's input, as
//! it came, in the box's spool as one `tool-call` record of the `inbox-capture` lane, which the
//! host ingests after the run as box-claimed evidence.
//!
//! Owns the staged record's shape: `{"kind": "tool-call", "lane": "inbox-capture", "source":
//! SOURCE, "payload": "<the hook's stdin, as text>"}` (the payload cut to fit the spool's cap,
//! `payload_cut: true` when cut), in a file named so the spool's name order is the order of
//! staging. Must never: interpret its input (the host parses it, as hostile, at ingest), write
//! anywhere but the spool, follow a symlink there, replace an entry, or fail the agent's tool
//! call (the hook always exits 0; a record it could not stage is a gap the host reports).
//!
//! Guarded by the unit tests below and `tests/agent_claude.rs`.

use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::spool::MAX_ENTRY_BYTES;

/// Where a box runs h5i's hook binary from (bound read-only there by every kernel tier): the
/// command of the agent's capture hooks and of `claude-state`, named by h5i's `capture` and
/// `agent` modules alike.
pub const HOOK_IN_BOX: &str = "/.h5i/bin/h5i-hook";

/// The staged record's `kind`.
pub const KIND: &str = "tool-call";
/// The spool file name prefix of a staged tool call.
pub const PREFIX: &str = "tool-call-";

/// The `source` each runtime's hooks name (the argument after `capture`).
pub fn source_of(runtime: h5i_policy::AgentRuntime) -> &'static str {
    match runtime {
        h5i_policy::AgentRuntime::Claude => "claude-code",
        h5i_policy::AgentRuntime::Codex => "codex",
    }
}

/// The runtime whose hooks name `source`, if any.
pub fn runtime_named(source: &str) -> Option<h5i_policy::AgentRuntime> {
    [
        h5i_policy::AgentRuntime::Claude,
        h5i_policy::AgentRuntime::Codex,
    ]
    .into_iter()
    .find(|r| source_of(*r) == source)
}

/// Room left for the payload in a staged entry (the JSON around it and its escapes).
const PAYLOAD_BYTES: usize = (MAX_ENTRY_BYTES as usize) / 2;

/// Stage `input` (at most [`PAYLOAD_BYTES`] of it are kept) from `source` in `spool`; the
/// entry's path.
pub fn stage(spool: &Path, source: &str, input: impl Read) -> io::Result<PathBuf> {
    let mut buf = Vec::new();
    input.take(PAYLOAD_BYTES as u64 + 1).read_to_end(&mut buf)?;
    let cut = buf.len() > PAYLOAD_BYTES;
    let mut text = String::from_utf8_lossy(&buf[..buf.len().min(PAYLOAD_BYTES)]).into_owned();
    // Raw control characters would have the host quarantine the record; JSON has none
    // outside strings, where they are escaped, so this only drops a stray terminator.
    text.retain(|c| !c.is_control() || c == '\n' || c == '\t');
    let mut record = serde_json::json!({
        "kind": KIND,
        "lane": "inbox-capture",
        "source": source,
        "payload": text,
    });
    if cut {
        record["payload_cut"] = serde_json::Value::Bool(true);
    }
    write_entry(spool, PREFIX, &record)
}

/// Write `record` as a new spool entry named `PREFIX<nanoseconds>-<pid>.json`, so the spool's
/// name order is the order of staging for each prefix; never replacing an entry or following
/// a link. The entry's path.
pub fn write_entry(spool: &Path, prefix: &str, record: &serde_json::Value) -> io::Result<PathBuf> {
    let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let path = spool.join(format!("{prefix}{now:024}-{}.json", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)?;
    f.write_all(&bytes)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use h5i_policy::receipt::{ReceiptLane, RecordBody};

    #[test]
    fn a_staged_call_is_ingested_as_one_box_claimed_record_in_staging_order() {
        let d = tempfile::tempdir().unwrap();
        let first =
            r#"{"hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"ls"}}"#;
        stage(d.path(), "claude-code", first.as_bytes()).unwrap();
        stage(d.path(), "claude-code", &b"not json \x1b[2J at all"[..]).unwrap();
        let got = crate::spool::ingest(d.path()).unwrap();
        assert_eq!(got.len(), 2);
        for e in &got {
            assert_eq!(e.lane, ReceiptLane::InboxCapture);
        }
        match &got[0].body {
            RecordBody::BoxClaimed {
                claimed_kind,
                claim,
            } => {
                assert_eq!(claimed_kind, KIND);
                assert_eq!(claim["payload"], first);
                assert_eq!(claim["source"], "claude-code");
            }
            other => panic!("{other:?}"),
        }
        // The hook does not judge its input: the host does, at ingest.
        assert!(matches!(&got[1].body, RecordBody::BoxClaimed { claim, .. }
            if claim["payload"] == "not json [2J at all"));
    }

    #[test]
    fn a_huge_input_is_cut_to_fit_the_spool_and_says_so() {
        let d = tempfile::tempdir().unwrap();
        let big = "x".repeat(10 * MAX_ENTRY_BYTES as usize);
        let p = stage(d.path(), "claude-code", big.as_bytes()).unwrap();
        assert!(std::fs::metadata(&p).unwrap().len() <= MAX_ENTRY_BYTES);
        let got = crate::spool::ingest(d.path()).unwrap();
        assert!(matches!(&got[0].body, RecordBody::BoxClaimed { claim, .. }
            if claim["payload_cut"] == true));
    }
}
