//! What the browser saw: after a run that could drive the box's browser, h5i itself asks the
//! browser what the page said back since the previous drain and records it, host-observed.
//!
//! Owns `<box>/browser/touched` (made by the relay when a client in the box sent it anything;
//! outside every grant) and the drain: when that mark is there after a run, h5i asks the daemon
//! of the box's `browser` sidecar directly (not through the relay, and never at the agent's
//! choice of time) for its console messages, uncaught exceptions and request log, clears them
//! so the next drain holds only what is new, and appends one `page` record after the run's: the
//! documents visited, console errors, exceptions and failed requests (status 400 and up, or no
//! response within a few seconds of the run's end), each redacted and cut to a bounded length.
//! When no browser answered (the sidecar is gone, its daemon does not answer, or the browser the
//! box had was gone and a new one had to be launched to answer the run or the drain) the record
//! says `unavailable`, which the report never reads as a clean page.
//!
//! Must never: take the agent's word for any of it (the relay refuses the agent's own clears),
//! write an unbounded record, or record a drain for a run that never touched the browser.
//!
//! Guarded by `tests/browser.rs` and the unit tests below.

use std::fs;
use std::time::{Duration, Instant};

use h5i_policy::receipt::{ReceiptLane, RecordBody};
use h5i_policy::ResolvedPolicy;
use serde_json::{json, Value};

use crate::error::BoxError;
use crate::store::{BoxPaths, StoredBox};

/// Longest single entry kept (a URL or a message), in characters.
const ENTRY_CHARS: usize = 400;
/// Most entries kept per kind and drain.
const ENTRIES: usize = 50;

fn mark(paths: &BoxPaths) -> std::path::PathBuf {
    paths.dir.join("browser").join("touched")
}

/// What the mark says when the browser had to be started afresh during the run.
const RELAUNCHED: &[u8] = b"relaunched\n";

/// The relay saw a request from the box: the next run's end drains the browser. `relaunched`:
/// answering it started a new browser because the one the box had was gone (what that one saw
/// is lost, so the drain records the run as `unavailable`).
pub fn touched(paths: &BoxPaths, relaunched: bool) {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = paths.dir.join("browser");
    let _ = fs::DirBuilder::new().mode(0o700).create(&dir);
    if let Ok(mut f) = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(mark(paths))
    {
        if relaunched {
            let _ = f.write_all(RELAUNCHED);
        }
    }
}

/// What one drain found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Documents visited.
    pub visited: Vec<String>,
    /// Console errors.
    pub console_errors: Vec<String>,
    /// Uncaught exceptions.
    pub exceptions: Vec<String>,
    /// Failed requests.
    pub failed_requests: Vec<String>,
}

fn bounded(s: &str) -> String {
    let mut out: String = s.chars().take(ENTRY_CHARS).collect();
    if s.chars().count() > ENTRY_CHARS {
        out.push('…');
    }
    out
}

fn push(list: &mut Vec<String>, s: String) {
    if list.len() < ENTRIES {
        list.push(s);
    }
}

fn items<'a>(answer: &'a Value, key: &str) -> &'a [Value] {
    answer
        .get("data")
        .and_then(|d| d.get(key))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Whether answering made the daemon start a browser (none was running): it says it launched
/// one, or relaunched one, and did not reuse the one it had.
pub fn launched_afresh(answer: &Value) -> bool {
    let life = answer.get("data").and_then(|d| d.get("lifecycle"));
    let flag = |k: &str| life.and_then(|l| l.get(k)).and_then(Value::as_bool);
    flag("relaunchedBrowser") == Some(true)
        || (flag("launched") == Some(true) && flag("reused") != Some(true))
}

/// The console errors in the daemon's answer to `console`.
fn console_error_items(console: &Value) -> impl Iterator<Item = &Value> {
    items(console, "messages")
        .iter()
        .filter(|m| m.get("type").and_then(Value::as_str) == Some("error"))
}

/// How many console errors the daemon's answer to `console` holds (what the viewers count).
pub fn console_error_count(console: &Value) -> usize {
    console_error_items(console).count()
}

/// Read the daemon's three answers (console, errors, requests) into what the page said.
pub fn seen_from(console: &Value, errors: &Value, requests: &Value) -> Seen {
    let mut seen = Seen::default();
    for m in console_error_items(console) {
        let text = m.get("text").and_then(Value::as_str).unwrap_or("");
        push(&mut seen.console_errors, bounded(text));
    }
    for e in items(errors, "errors") {
        let text = e.get("text").and_then(Value::as_str).unwrap_or("");
        push(&mut seen.exceptions, bounded(text));
    }
    for r in items(requests, "requests") {
        let url = r.get("url").and_then(Value::as_str).unwrap_or("");
        if r.get("resourceType").and_then(Value::as_str) == Some("Document") {
            push(&mut seen.visited, bounded(url));
        }
        let method = r.get("method").and_then(Value::as_str).unwrap_or("GET");
        match r.get("status").and_then(Value::as_u64) {
            Some(s) if s < 400 => {}
            Some(s) => push(
                &mut seen.failed_requests,
                bounded(&format!("{s} {method} {url}")),
            ),
            None => push(
                &mut seen.failed_requests,
                bounded(&format!("no response: {method} {url}")),
            ),
        }
    }
    seen
}

/// How long the drain waits for the requests still in flight at a run's end to be answered.
/// agent-browser's log fills a request's status in when its response arrives and marks no
/// failure, so an entry without a status is either still in flight or never answered (a
/// refused connect): only time tells them apart, and a page's own fetch answered a moment after
/// the run that loaded it returned is not a failed request.
const SETTLE: Duration = Duration::from_secs(3);

/// How many logged requests have no response yet.
fn unanswered(requests: &Value) -> usize {
    items(requests, "requests")
        .iter()
        .filter(|r| r.get("status").and_then(Value::as_u64).is_none())
        .count()
}

/// One of the daemon's answers, `None` when it failed or had to launch a browser to give it.
fn ask_log(pid: i32, action: &str) -> Option<Value> {
    let a = super::relay::ask(
        pid,
        &json!({"action": action, "clear": false, "id": "h5i-drain"}),
    )
    .ok()?;
    (a.get("success").and_then(Value::as_bool) == Some(true) && !launched_afresh(&a)).then_some(a)
}

/// Ask the daemon of the sidecar whose container init is `pid`; `None` when no browser
/// answered.
fn ask_browser(pid: i32) -> Option<Seen> {
    let console = ask_log(pid, "console")?;
    let errors = ask_log(pid, "errors")?;
    let mut requests = ask_log(pid, "requests")?;
    let deadline = Instant::now() + SETTLE;
    let mut pause = Duration::from_millis(25);
    while unanswered(&requests) > 0 && Instant::now() + pause < deadline {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(400));
        requests = ask_log(pid, "requests")?;
    }
    let answers = [console, errors, requests];
    for action in ["console", "errors", "requests"] {
        let _ = super::relay::ask(
            pid,
            &json!({"action": action, "clear": true, "id": "h5i-drain"}),
        );
    }
    Some(seen_from(&answers[0], &answers[1], &answers[2]))
}

/// After the run recorded as `after_seq` of `sb`: drain the browser when a client touched it.
pub fn after_run(sb: &StoredBox, policy: &ResolvedPolicy, after_seq: u64) -> Result<(), BoxError> {
    let Ok(said) = fs::read(mark(&sb.paths)) else {
        return Ok(());
    };
    fs::remove_file(mark(&sb.paths)).map_err(|e| BoxError::io(&mark(&sb.paths), e))?;
    let pid = crate::service_state::read_state(&sb.paths, super::sidecar::SERVICE)
        .filter(crate::service_state::ServiceState::alive)
        .and_then(|st| st.pid)
        .map(|p| p.pid);
    let relaunched = said.windows(RELAUNCHED.len()).any(|w| w == RELAUNCHED);
    let seen = pid.filter(|_| !relaunched).and_then(ask_browser);
    let redactor = crate::secrets::redactor_for(policy);
    let mut redactions = Vec::new();
    let mut clean = |list: Vec<String>| -> Vec<String> {
        list.into_iter()
            .map(|s| {
                let (c, ids) = redactor.redact(&s);
                redactions.extend(ids);
                c
            })
            .collect()
    };
    let body = match seen {
        None => RecordBody::Page {
            after_seq,
            state: "unavailable".into(),
            console_errors: Vec::new(),
            exceptions: Vec::new(),
            failed_requests: Vec::new(),
            visited: Vec::new(),
        },
        Some(s) => RecordBody::Page {
            after_seq,
            state: "observed".into(),
            console_errors: clean(s.console_errors),
            exceptions: clean(s.exceptions),
            failed_requests: clean(s.failed_requests),
            visited: clean(s.visited),
        },
    };
    redactions.sort();
    redactions.dedup();
    super::control::append_record(sb, ReceiptLane::HostEnvRun, redactions, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_failures_and_documents_are_picked_and_the_rest_left() {
        let console = json!({"success": true, "data": {"messages": [
            {"type": "log", "text": "fine"},
            {"type": "error", "text": "boom \u{1b}]0;pwn\u{7}"},
        ]}});
        let errors = json!({"success": true, "data": {"errors": [{"text": "Error: uncaught"}]}});
        let requests = json!({"success": true, "data": {"requests": [
            {"url": "http://127.0.0.1:3000/", "resourceType": "Document", "status": 200, "method": "GET"},
            {"url": "http://127.0.0.1:3000/missing.json", "resourceType": "Fetch", "status": 404, "method": "GET"},
            {"url": "http://denied.test/", "resourceType": "Document", "method": "GET"},
        ]}});
        let seen = seen_from(&console, &errors, &requests);
        assert_eq!(seen.console_errors, ["boom \u{1b}]0;pwn\u{7}"]);
        assert_eq!(seen.exceptions, ["Error: uncaught"]);
        assert_eq!(
            seen.visited,
            ["http://127.0.0.1:3000/", "http://denied.test/"]
        );
        assert_eq!(
            seen.failed_requests,
            [
                "404 GET http://127.0.0.1:3000/missing.json",
                "no response: GET http://denied.test/"
            ]
        );
    }

    #[test]
    fn only_a_request_without_a_status_is_waited_for() {
        let requests = json!({"data": {"requests": [
            {"url": "http://127.0.0.1:3000/", "status": 200},
            {"url": "http://127.0.0.1:3000/missing.json", "status": 404},
            {"url": "http://127.0.0.1:3000/slow"},
        ]}});
        assert_eq!(unanswered(&requests), 1);
        assert_eq!(unanswered(&json!({"data": {}})), 0);
    }

    #[test]
    fn a_drain_is_bounded_per_entry_and_per_kind() {
        let long = "x".repeat(10 * ENTRY_CHARS);
        let msgs: Vec<Value> = (0..3 * ENTRIES)
            .map(|_| json!({"type": "error", "text": long}))
            .collect();
        let console = json!({"data": {"messages": msgs}});
        let seen = seen_from(&console, &json!({}), &json!({}));
        assert_eq!(seen.console_errors.len(), ENTRIES);
        assert!(seen.console_errors[0].chars().count() <= ENTRY_CHARS + 1);
    }

    #[test]
    fn an_answer_that_had_to_launch_a_browser_is_not_an_observation() {
        let a =
            json!({"success": true, "data": {"lifecycle": {"launched": true, "reused": false}}});
        assert!(launched_afresh(&a));
        let b =
            json!({"success": true, "data": {"lifecycle": {"launched": false}, "messages": []}});
        assert!(!launched_afresh(&b));
        let reused = json!({"data": {"lifecycle": {"launched": true, "reused": true}}});
        assert!(!launched_afresh(&reused));
        let relaunched = json!({"data": {"lifecycle": {"relaunchedBrowser": true}}});
        assert!(launched_afresh(&relaunched));
    }
}
