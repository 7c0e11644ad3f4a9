//! `h5i-hook claude-state -- COMMAND [ARGS]`: inside a Claude Code box, as the box's user, make
//! Claude Code's own state ready for the run, then become `COMMAND` (exec, same pid).
//!
//! Claude Code 2.1.328 keeps its state in `~/.claude.json` (`$CLAUDE_CONFIG_DIR/.claude.json`
//! when that is set), and two of its first-run screens stop a person's `h5i box shell NAME --
//! claude` in a box (measured on the installed binary, in a pty):
//! - without `hasCompletedOnboarding`, its onboarding checks connectivity by dialling
//!   `api.anthropic.com` directly (not the base URL), which no box reaches, and stops at
//!   "Unable to connect to Anthropic services";
//! - an `ANTHROPIC_API_KEY` whose last 20 characters are not in
//!   `customApiKeyResponses.approved` makes it ask "Do you want to use this API key?" (with
//!   "No" preselected), and h5i's per-run dummy changes every run.
//!
//! So this sets `hasCompletedOnboarding`, and when the box's key is h5i's per-run dummy (it
//! starts with `h5i_broker::credential::DUMMY_PREFIX`; a real key, with the credential proxy
//! off, stays the person's question) approves its suffix, dropping the suffixes of earlier
//! dummies (20 lowercase hex digits) so the list does not grow by one per run. Everything else
//! in the file, and every screen that asks about the work (whether to trust the folder), is
//! left to Claude Code and the person.
//!
//! Owns the merge ([`merged`]) and the write ([`seed`]). Must never: follow a symlink at the
//! file or open it blocking (a box may plant a link or a fifo there: it is left as it is, and
//! said), write it but whole (a new file beside it, renamed over it), read more than
//! [`MAX_CONFIG_BYTES`], or keep the command from running (whatever happens to the file, the
//! command is exec'd).
//!
//! Guarded by the unit tests below and `tests/agent_claude.rs` (the real binary in a pty, and
//! the planted link and fifo).

use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use serde_json::{Map, Value};

/// Claude Code's state file in its config directory.
pub const CONFIG_FILE: &str = ".claude.json";
/// The most of an existing state file read (a larger one is left as it is).
pub const MAX_CONFIG_BYTES: u64 = 8 << 20;
/// How many trailing characters of a key Claude Code stores as its approval.
pub const KEY_SUFFIX_CHARS: usize = 20;

/// What [`seed`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Seeded {
    /// The file was written (made, or merged into).
    Written,
    /// The file already said everything needed.
    Unchanged,
    /// The file was left as it is, for this reason.
    LeftAlone(String),
}

/// The suffix Claude Code would store for `key` when it is h5i's per-run dummy.
fn dummy_suffix(key: &str) -> Option<&str> {
    let key = key.trim();
    if !key.starts_with(h5i_broker::credential::DUMMY_PREFIX) {
        return None;
    }
    let at = key.char_indices().rev().nth(KEY_SUFFIX_CHARS - 1)?.0;
    Some(&key[at..])
}

/// Whether an approved entry is an earlier dummy's suffix.
fn is_dummy_suffix(v: &Value) -> bool {
    v.as_str().is_some_and(|s| {
        s.len() == KEY_SUFFIX_CHARS && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// `state` with onboarding done and, when `key` is h5i's dummy, its suffix approved (and no
/// earlier dummy's); `None` when `state` already says so.
pub fn merged(mut state: Map<String, Value>, key: Option<&str>) -> Option<Map<String, Value>> {
    let before = state.clone();
    state.insert("hasCompletedOnboarding".into(), Value::Bool(true));
    if let Some(suffix) = key.and_then(dummy_suffix) {
        let responses = state
            .entry("customApiKeyResponses")
            .or_insert_with(|| Value::Object(Map::new()));
        if !responses.is_object() {
            *responses = Value::Object(Map::new());
        }
        if let Some(r) = responses.as_object_mut() {
            let list = |v: Option<&Value>| v.and_then(Value::as_array).cloned().unwrap_or_default();
            let mut approved: Vec<Value> = list(r.get("approved"))
                .into_iter()
                .filter(|v| !is_dummy_suffix(v))
                .collect();
            approved.push(Value::String(suffix.to_owned()));
            let rejected: Vec<Value> = list(r.get("rejected"))
                .into_iter()
                .filter(|v| v.as_str() != Some(suffix))
                .collect();
            r.insert("approved".into(), Value::Array(approved));
            r.insert("rejected".into(), Value::Array(rejected));
        }
    }
    (state != before).then_some(state)
}

/// Read `dir/.claude.json` without following a link or blocking on a fifo: `Ok(None)` when
/// there is none, `Err(reason)` when it is left as it is.
fn read_state(file: &Path) -> Result<Option<Map<String, Value>>, String> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(file);
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err("it is a symlink, which h5i does not follow".into())
        }
        Err(e) => return Err(format!("it could not be opened: {e}")),
    };
    let meta = f.metadata().map_err(|e| e.to_string())?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a fifo"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(format!("it is {what}"));
    }
    let mut bytes = Vec::new();
    f.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!("it is over {MAX_CONFIG_BYTES} bytes"));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => Ok(Some(m)),
        _ => Err("it is not a JSON object".into()),
    }
}

/// Make Claude Code's state in `dir` (its config directory) ready, given the box's
/// `ANTHROPIC_API_KEY` (`key`): written through a new file beside it renamed over it.
pub fn seed(dir: &Path, key: Option<&str>) -> io::Result<Seeded> {
    let file = dir.join(CONFIG_FILE);
    let state = match read_state(&file) {
        Ok(s) => s.unwrap_or_default(),
        Err(why) => return Ok(Seeded::LeftAlone(why)),
    };
    let Some(next) = merged(state, key) else {
        return Ok(Seeded::Unchanged);
    };
    let text = serde_json::to_vec_pretty(&Value::Object(next)).map_err(io::Error::other)?;
    let tmp = dir.join(format!("{CONFIG_FILE}.h5i-{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&text))
        .and_then(|()| std::fs::rename(&tmp, &file));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(Seeded::Written)
}

/// The directory Claude Code keeps `.claude.json` in, from its environment: an absolute
/// `CLAUDE_CONFIG_DIR`, else an absolute `HOME`.
pub fn config_dir<'a>(config_dir: Option<&'a str>, home: Option<&'a str>) -> Option<&'a Path> {
    config_dir
        .filter(|d| !d.is_empty())
        .or(home)
        .map(Path::new)
        .filter(|p| p.is_absolute())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DUMMY: &str =
        "h5i-dummy-00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn onboarding_is_done_and_only_the_runs_dummy_is_approved() {
        let m = merged(Map::new(), Some(DUMMY)).unwrap();
        assert_eq!(m["hasCompletedOnboarding"], true);
        let suffix = &DUMMY[DUMMY.len() - 20..];
        assert_eq!(m["customApiKeyResponses"]["approved"], json!([suffix]));
        // The next run: the earlier dummy's approval goes, a person's own stays, and whatever
        // else Claude Code keeps is untouched.
        let prior = json!({
            "numStartups": 3,
            "hasCompletedOnboarding": true,
            "projects": {"/work": {"hasTrustDialogAccepted": false}},
            "customApiKeyResponses": {"approved": ["0123456789abcdef0123", "sk-ant-own-key-AB_cd"],
                                      "rejected": [suffix]},
        });
        let next = merged(obj(prior), Some(DUMMY)).unwrap();
        assert_eq!(
            next["customApiKeyResponses"],
            json!({"approved": ["sk-ant-own-key-AB_cd", suffix], "rejected": []})
        );
        assert_eq!(next["numStartups"], 3);
        assert_eq!(next["projects"]["/work"]["hasTrustDialogAccepted"], false);
        // Nothing to do the second time.
        assert!(merged(next, Some(DUMMY)).is_none());
    }

    #[test]
    fn a_real_key_stays_the_persons_question() {
        let m = merged(Map::new(), Some("sk-ant-api03-real-0123456789abcdef")).unwrap();
        assert!(m.get("customApiKeyResponses").is_none());
        let m = merged(Map::new(), None).unwrap();
        assert_eq!(Value::Object(m), json!({"hasCompletedOnboarding": true}));
        // A hostile shape is replaced by the shape Claude Code reads.
        let m = merged(obj(json!({"customApiKeyResponses": 7})), Some(DUMMY)).unwrap();
        assert_eq!(
            m["customApiKeyResponses"]["approved"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn a_planted_link_fifo_or_oversized_file_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("host-file");
        std::fs::write(&target, "keep").unwrap();
        let file = dir.path().join(CONFIG_FILE);
        std::os::unix::fs::symlink(&target, &file).unwrap();
        assert!(
            matches!(seed(dir.path(), Some(DUMMY)).unwrap(), Seeded::LeftAlone(w) if w.contains("symlink"))
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        std::fs::remove_file(&file).unwrap();
        let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: c is a valid NUL-terminated path for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(
            matches!(seed(dir.path(), Some(DUMMY)).unwrap(), Seeded::LeftAlone(w) if w.contains("fifo"))
        );
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, vec![b' '; MAX_CONFIG_BYTES as usize + 1]).unwrap();
        assert!(
            matches!(seed(dir.path(), None).unwrap(), Seeded::LeftAlone(w) if w.contains("over"))
        );
        std::fs::write(&file, "[1]").unwrap();
        assert!(
            matches!(seed(dir.path(), None).unwrap(), Seeded::LeftAlone(w) if w.contains("JSON object"))
        );
        // A file of its own is merged into, whole, and nothing is left beside it.
        std::fs::write(&file, r#"{"numStartups": 2}"#).unwrap();
        assert_eq!(seed(dir.path(), Some(DUMMY)).unwrap(), Seeded::Written);
        let v: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(
            (
                v["numStartups"].clone(),
                v["hasCompletedOnboarding"].clone()
            ),
            (json!(2), json!(true))
        );
        assert_eq!(seed(dir.path(), Some(DUMMY)).unwrap(), Seeded::Unchanged);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn the_config_dir_follows_claude_codes_variables() {
        assert_eq!(config_dir(Some("/c"), Some("/h")), Some(Path::new("/c")));
        assert_eq!(config_dir(Some(""), Some("/h")), Some(Path::new("/h")));
        assert_eq!(config_dir(None, Some("rel")), None);
        assert_eq!(config_dir(None, None), None);
    }
}
