//! Spool ingestion: what a box staged in `<box>/spool/` becomes box-claimed receipt records,
//! after validation, or is quarantined with the reason.
//!
//! The spool is the box's only write window under its own directory, so everything in it is
//! hostile input: entries are opened without following links, size-capped before parsing,
//! parsed as a closed shape (a JSON object with a plain `kind`), refused when any string holds a
//! control character (terminal escape sequences among them), and refused when they claim a
//! host-observed lane. Must never: follow a symlink out of the spool, write anything as
//! host-observed, or keep a box-supplied string with control characters in it.
//!
//! Guarded by the unit tests below (one per hostile shape) and `tests/secrets.rs`.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use h5i_policy::receipt::{ReceiptLane, RecordBody};

/// The agent's proposal, read at export time rather than ingested.
pub const PROPOSAL_FILE: &str = "proposal.md";
/// Largest staged record, bytes.
pub const MAX_ENTRY_BYTES: u64 = 64 * 1024;
/// Most entries ingested after one run; the rest wait for the next.
pub const MAX_ENTRIES: usize = 256;

/// The spool itself could not be read.
#[derive(Debug, thiserror::Error)]
#[error("refusing: cannot read the box's spool {path}: {source}; to fix: check the box directory is intact (`h5i box doctor`)")]
pub struct SpoolError {
    /// The spool directory.
    pub path: PathBuf,
    /// The OS error.
    pub source: std::io::Error,
}

/// One entry's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestedEntry {
    /// The spool file (to remove once the record is written).
    pub path: PathBuf,
    /// The lane it is recorded under (never host-observed).
    pub lane: ReceiptLane,
    /// The record body: `BoxClaimed` or `Quarantined`.
    pub body: RecordBody,
    /// When the box says it staged the entry, nanoseconds since the Unix epoch, read from the
    /// name h5i's in-box writers give it ([`staged_ns`]); box-claimed, like the entry.
    pub staged_ns: Option<u64>,
}

/// The staging time in an entry name h5i's in-box writers give (`PREFIX<24 digits>-<pid>.json`,
/// `crate::capture::write_entry`), or `None` for any other name.
pub fn staged_ns(name: &str) -> Option<u64> {
    let (head, pid) = name.strip_suffix(".json")?.rsplit_once('-')?;
    let digits = head.get(head.len().checked_sub(24)?..)?;
    let well_formed = !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && head[..head.len() - 24].ends_with('-');
    well_formed.then(|| digits.parse().ok()).flatten()
}

/// Read and validate every staged entry (at most [`MAX_ENTRIES`]), in the order the box staged
/// them across its writers (the hooks' tool calls and the shim's commands interleaved by the
/// time in their names), then the entries whose names carry no time, by name.
pub fn ingest(spool: &Path) -> Result<Vec<IngestedEntry>, SpoolError> {
    let err = |source| SpoolError {
        path: spool.to_path_buf(),
        source,
    };
    let names: Vec<_> = fs::read_dir(spool)
        .map_err(err)?
        .filter_map(Result::ok)
        .filter(|e| e.file_name() != PROPOSAL_FILE)
        .collect();
    let mut names: Vec<_> = names
        .into_iter()
        .map(|e| {
            let at = staged_ns(&e.file_name().to_string_lossy());
            (at.is_none(), at, e.file_name(), e)
        })
        .collect();
    names.sort_by(|a, b| (a.0, a.1, &a.2).cmp(&(b.0, b.1, &b.2)));
    Ok(names
        .into_iter()
        .take(MAX_ENTRIES)
        .map(|(_, staged_ns, _, e)| {
            let path = e.path();
            let shown = printable(&e.file_name().to_string_lossy());
            let body = match validate(&path) {
                Ok((kind, claim)) => RecordBody::BoxClaimed {
                    claimed_kind: kind,
                    claim,
                },
                Err(reason) => RecordBody::Quarantined {
                    entry: shown,
                    reason,
                },
            };
            let lane = match &body {
                RecordBody::BoxClaimed { claim, .. }
                    if claim.get("lane").and_then(|l| l.as_str()) == Some("tee-shim") =>
                {
                    ReceiptLane::TeeShim
                }
                _ => ReceiptLane::InboxCapture,
            };
            IngestedEntry {
                path,
                lane,
                body,
                staged_ns,
            }
        })
        .collect())
}

/// Remove an ingested entry (a symlink is removed itself, never its target).
pub fn remove(entry: &IngestedEntry) {
    match fs::symlink_metadata(&entry.path) {
        Ok(m) if m.is_dir() => {
            let _ = fs::remove_dir_all(&entry.path);
        }
        Ok(_) => {
            let _ = fs::remove_file(&entry.path);
        }
        Err(_) => {}
    }
}

fn validate(path: &Path) -> Result<(String, serde_json::Value), String> {
    let meta = fs::symlink_metadata(path).map_err(|e| format!("unreadable: {e}"))?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        return Err("a symlink (the spool takes only regular files)".into());
    }
    if !ft.is_file() || ft.is_fifo() || ft.is_socket() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_ENTRY_BYTES {
        return Err(format!(
            "{} bytes, over the {MAX_ENTRY_BYTES}-byte cap",
            meta.len()
        ));
    }
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("unreadable: {e}"))?;
    let mut buf = Vec::new();
    f.by_ref()
        .take(MAX_ENTRY_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("unreadable: {e}"))?;
    if buf.len() as u64 > MAX_ENTRY_BYTES {
        return Err(format!("over the {MAX_ENTRY_BYTES}-byte cap"));
    }
    let value: serde_json::Value =
        serde_json::from_slice(&buf).map_err(|e| format!("not JSON: {e}"))?;
    let obj = value
        .as_object()
        .ok_or_else(|| "not a JSON object".to_string())?;
    let kind = obj
        .get("kind")
        .and_then(|k| k.as_str())
        .ok_or_else(|| "no string `kind`".to_string())?;
    if kind.is_empty()
        || kind.len() > 64
        || !kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err("`kind` is not a plain name ([a-z0-9_-], 1-64)".into());
    }
    match obj.get("lane").map(|l| l.as_str()) {
        None | Some(Some("inbox-capture")) | Some(Some("tee-shim")) => {}
        Some(Some(l @ ("host-env-run" | "viewer"))) => {
            return Err(format!(
                "claims the host-observed lane `{l}`, which a box cannot write"
            ))
        }
        Some(_) => return Err("`lane` is not a box lane (inbox-capture, tee-shim)".into()),
    }
    if has_control(&value) {
        return Err("a string holds control characters (terminal escapes are refused)".into());
    }
    Ok((kind.to_string(), value))
}

fn has_control(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.chars().any(|c| c.is_control() && c != '\n' && c != '\t'),
        serde_json::Value::Array(a) => a.iter().any(has_control),
        serde_json::Value::Object(o) => o
            .iter()
            .any(|(k, v)| k.chars().any(char::is_control) || has_control(v)),
        _ => false,
    }
}

/// A box-supplied name made safe to print: control characters escaped, length capped.
fn printable(s: &str) -> String {
    s.chars().take(128).flat_map(char::escape_default).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spool() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn one(dir: &Path) -> IngestedEntry {
        let mut all = ingest(dir).unwrap();
        assert_eq!(all.len(), 1);
        all.remove(0)
    }

    #[test]
    fn only_an_in_box_writers_name_carries_a_staging_time() {
        let at = "000001765000000123456789";
        assert_eq!(
            staged_ns(&format!("command-{at}-42.json")),
            Some(1_765_000_000_123_456_789)
        );
        assert_eq!(
            staged_ns(&format!("tool-call-{at}-7.json")),
            Some(1_765_000_000_123_456_789)
        );
        for bad in [
            "command-1.json",
            &format!("command-{at}.json"),
            &format!("command-{at}-.json"),
            &format!("command-{at}-4x.json"),
            &format!("command{at}-4.json"),
            &format!("command-{at}-4.json.tmp"),
            "command-00000000000000000000000x-1.json",
            "-1.json",
            "",
        ] {
            assert_eq!(staged_ns(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_writers_entries_are_ingested_interleaved_by_their_staging_time() {
        let d = spool();
        let put = |name: &str, kind: &str| {
            fs::write(
                d.path().join(name),
                format!(r#"{{"kind":"{kind}","n":"{name}"}}"#),
            )
            .unwrap();
        };
        // Staged in this order: a tool call, the command it ran, the call's end, a second
        // call; the name order (all `command-` before all `tool-call-`) is not the order.
        put("tool-call-000000000000000000000300-9.json", "tool-call");
        put("command-000000000000000000000200-8.json", "command");
        put("tool-call-000000000000000000000100-9.json", "tool-call");
        put("tool-call-000000000000000000000400-9.json", "tool-call");
        // A name with no time (not h5i's writers): after every timed entry.
        put("command-1.json", "command");
        let got = ingest(d.path()).unwrap();
        let order: Vec<(Option<u64>, String)> = got
            .iter()
            .map(|e| {
                let RecordBody::BoxClaimed { claim, .. } = &e.body else {
                    panic!("{:?}", e.body)
                };
                (e.staged_ns, claim["n"].as_str().unwrap().to_owned())
            })
            .collect();
        let names: Vec<&str> = order.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "tool-call-000000000000000000000100-9.json",
                "command-000000000000000000000200-8.json",
                "tool-call-000000000000000000000300-9.json",
                "tool-call-000000000000000000000400-9.json",
                "command-1.json",
            ]
        );
        assert_eq!(order[1].0, Some(200));
        assert_eq!(order[4].0, None);
    }

    fn reason(e: &IngestedEntry) -> String {
        match &e.body {
            RecordBody::Quarantined { reason, .. } => reason.clone(),
            other => panic!("not quarantined: {other:?}"),
        }
    }

    #[test]
    fn a_valid_record_is_box_claimed() {
        let d = spool();
        fs::write(
            d.path().join("a.json"),
            br#"{"kind":"command","argv":["make","test"]}"#,
        )
        .unwrap();
        let e = one(d.path());
        assert_eq!(e.lane, ReceiptLane::InboxCapture);
        assert!(!e.lane.is_host_observed());
        assert!(
            matches!(e.body, RecordBody::BoxClaimed { ref claimed_kind, .. } if claimed_kind == "command")
        );
    }

    #[test]
    fn a_forged_host_lane_is_quarantined() {
        let d = spool();
        fs::write(
            d.path().join("f.json"),
            br#"{"kind":"run","lane":"host-env-run"}"#,
        )
        .unwrap();
        let e = one(d.path());
        assert!(reason(&e).contains("host-observed"));
        assert!(!e.lane.is_host_observed());
    }

    #[test]
    fn a_huge_record_is_quarantined_unread() {
        let d = spool();
        let f = fs::File::create(d.path().join("big.json")).unwrap();
        f.set_len(10 * 1024 * 1024).unwrap();
        assert!(reason(&one(d.path())).contains("cap"));
    }

    #[test]
    fn invalid_json_is_quarantined() {
        let d = spool();
        fs::write(d.path().join("x.json"), b"{not json").unwrap();
        assert!(reason(&one(d.path())).contains("not JSON"));
    }

    #[test]
    fn escape_sequences_are_quarantined() {
        let d = spool();
        fs::write(
            d.path().join("e.json"),
            "{\"kind\":\"note\",\"text\":\"\\u001b]52;c;aGk=\\u0007\"}",
        )
        .unwrap();
        assert!(reason(&one(d.path())).contains("control"));
    }

    #[test]
    fn a_planted_symlink_is_quarantined_and_its_target_untouched() {
        let d = spool();
        let outside = tempfile::NamedTempFile::new().unwrap();
        fs::write(outside.path(), br#"{"kind":"secret"}"#).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("link.json")).unwrap();
        let e = one(d.path());
        assert!(reason(&e).contains("symlink"));
        remove(&e);
        assert!(outside.path().exists());
        assert!(!d.path().join("link.json").exists());
    }

    #[test]
    fn a_name_with_escapes_is_shown_escaped() {
        let d = spool();
        fs::write(d.path().join("\u{1b}[2J.json"), b"[]").unwrap();
        match one(d.path()).body {
            RecordBody::Quarantined { entry, .. } => assert!(!entry.contains('\u{1b}'), "{entry}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_proposal_is_left_for_export() {
        let d = spool();
        fs::write(d.path().join(PROPOSAL_FILE), b"# my proposal").unwrap();
        assert!(ingest(d.path()).unwrap().is_empty());
    }
}
