//! `h5i box inspect NAME --capture ID` and `h5i box log NAME [filters]`: a box's receipts, read
//! back for a person (or, with `--json`, a program).
//!
//! Owns the rendered receipt: one record by its sequence number, every figure the record carries
//! (command, lane and whether that lane is host-observed, exit, `wait4` rusage or the cage's
//! figures, OOM, egress tally, socket gate, redaction rule ids) and its stored raw payload, read
//! bounded; and the filtered log (events and receipts, by lane, kind, exit and sequence).
//!
//! Must never: print a byte a box chose without the one escaper (a box-claimed record's fields
//! and a payload are the box's words), read a payload other than a regular file directly under
//! the box's `payloads/` within [`PAYLOAD_SHOW_CAP`], or present a box-claimed record as
//! host-observed. Guarded by the unit tests below and `tests/box_inspect.rs`.

use std::path::Path;

use h5i_broker::receipt_log::ReceiptLog;
use h5i_policy::receipt::{rfc3339_utc, ReceiptLane, ReceiptRecord, RecordBody};
use serde::Serialize;

use crate::error::BoxError;
use crate::escape;
use crate::store::{BoxStore, StoredBox};

/// Most bytes of a stored payload `inspect` shows; a longer payload is cut there, and says so.
pub const PAYLOAD_SHOW_CAP: u64 = 64 * 1024;

/// One receipt, rendered: the record as the log holds it, plus what a reader needs beside it.
#[derive(Debug, Serialize)]
pub struct CaptureView {
    /// [`crate::json_doc::INSPECT`].
    pub schema: &'static str,
    /// The box.
    pub name: String,
    /// Whether the record's lane is one the host observed itself.
    pub host_observed: bool,
    /// The record, as written (every string in it was redacted before it was written).
    pub record: ReceiptRecord,
    /// The stored raw payload, when the record names one.
    pub payload: Option<PayloadView>,
}

/// A record's stored raw payload, as much of it as [`PAYLOAD_SHOW_CAP`] allows.
#[derive(Debug, Serialize)]
pub struct PayloadView {
    /// Its file name under the box's `payloads/`.
    pub file: String,
    /// Its size on disk, bytes.
    pub bytes: u64,
    /// Its text (lossy UTF-8), at most [`PAYLOAD_SHOW_CAP`] bytes of it; `None` when it could
    /// not be read (see `problem`).
    pub text: Option<String>,
    /// Whether `text` stops short of the whole payload.
    pub truncated: bool,
    /// Why the payload was not read, when it was not.
    pub problem: Option<String>,
}

/// The receipt numbered `seq` of the box called `name`.
pub fn capture(store: &BoxStore, name: &str, seq: u64) -> Result<CaptureView, BoxError> {
    let sb = store.find(name)?;
    let readout = ReceiptLog::at(sb.paths.receipts()).read()?;
    let last = readout.records.last().map(|r| r.seq);
    let Some(record) = readout.records.into_iter().find(|r| r.seq == seq) else {
        return Err(BoxError::BadRequest {
            what: format!("box `{name}` has no receipt #{seq}"),
            mend: match last {
                Some(n) => format!("pick one of #1..#{n}: `h5i box log {name}` lists them"),
                None => format!("it has no receipts yet: `h5i box run {name} -- CMD` makes one"),
            },
        });
    };
    let payload = record
        .payload
        .as_deref()
        .map(|file| read_payload(&sb, file));
    Ok(CaptureView {
        schema: crate::json_doc::INSPECT,
        name: name.to_string(),
        host_observed: record.lane.is_host_observed(),
        record,
        payload,
    })
}

/// Read a payload named by a record: a plain name under `payloads/` (the host wrote the record,
/// but it describes a box's bytes), a regular file, at most [`PAYLOAD_SHOW_CAP`] bytes shown.
fn read_payload(sb: &StoredBox, file: &str) -> PayloadView {
    let mut view = PayloadView {
        file: file.to_string(),
        bytes: 0,
        text: None,
        truncated: false,
        problem: None,
    };
    let plain = !file.is_empty()
        && file != "."
        && file != ".."
        && !file.contains('/')
        && !file.contains('\0');
    if !plain {
        view.problem = Some("not a plain file name under payloads/ (never opened)".into());
        return view;
    }
    let dir = sb.paths.payloads();
    match crate::bounded::open_regular(&dir, Path::new(file), u64::MAX) {
        Ok((f, size)) => {
            use std::io::Read;
            view.bytes = size;
            let mut buf = Vec::new();
            match f.take(PAYLOAD_SHOW_CAP).read_to_end(&mut buf) {
                Ok(_) => {
                    view.truncated = size > buf.len() as u64;
                    view.text = Some(String::from_utf8_lossy(&buf).into_owned());
                }
                Err(e) => view.problem = Some(format!("unreadable: {e}")),
            }
        }
        Err(skip) => view.problem = Some(skip.to_string()),
    }
    view
}

impl CaptureView {
    /// The rendered receipt, one escaped line each: what `inspect` prints (and what a console
    /// row opens to).
    pub fn lines(&self) -> Vec<String> {
        let r = &self.record;
        let mut out = vec![
            format!(
                "receipt #{} of box {}  {}",
                r.seq,
                self.name,
                rfc3339_utc(r.at_ms, true)
            ),
            format!(
                "lane        {} ({})",
                r.lane.as_str(),
                if self.host_observed {
                    "host-observed: h5i saw this itself"
                } else {
                    "box-claimed: the box's own account, not verified by the host"
                }
            ),
            format!("policy      {}", r.policy_digest),
        ];
        out.extend(body_lines(&r.body));
        out.push(match r.redactions.is_empty() {
            true => "redactions  none".into(),
            false => format!(
                "redactions  {} (rule ids; never values)",
                r.redactions.join(", ")
            ),
        });
        match &self.payload {
            None => out.push("payload     none stored".into()),
            Some(p) => {
                out.push(format!("payload     {} ({} bytes)", p.file, p.bytes));
                if let Some(why) = &p.problem {
                    out.push(format!("  not shown: {why}"));
                }
                if let Some(text) = &p.text {
                    out.extend(text.lines().map(|l| format!("  | {l}")));
                    if p.truncated {
                        out.push(format!(
                            "  (cut at {PAYLOAD_SHOW_CAP} of {} bytes)",
                            p.bytes
                        ));
                    }
                }
            }
        }
        out.into_iter()
            .map(|l| escape::escape_controls(&l))
            .collect()
    }
}

fn body_lines(body: &RecordBody) -> Vec<String> {
    match body {
        RecordBody::Run {
            argv,
            tier,
            exit,
            rusage,
            cgroup_usage,
            wall_ms,
            oom,
            egress,
            socket_gate,
        } => {
            let mut out = vec![
                format!("command     {}", shown_argv(argv)),
                format!("tier        {tier}"),
                format!("exit        {}", exit_text(exit)),
                format!("wall        {wall_ms} ms"),
            ];
            out.push(match (rusage, cgroup_usage) {
                (Some(u), _) => format!(
                    "rusage      user {} sys {} max-rss {} KiB, faults {} minor {} major, io {} in {} out, switches {} voluntary {} involuntary (wait4)",
                    micros(u.user_us), micros(u.sys_us), u.maxrss_kb, u.minflt, u.majflt,
                    u.inblock, u.oublock, u.nvcsw, u.nivcsw
                ),
                (None, Some(c)) => format!(
                    "cgroup      cpu {} (user {}, sys {}), memory peak {} (the box's cage)",
                    opt(c.cpu_us.map(micros)),
                    opt(c.user_us.map(micros)),
                    opt(c.sys_us.map(micros)),
                    opt(c.mem_peak_bytes.map(|b| format!("{b} bytes")))
                ),
                (None, None) => "usage       not recorded".into(),
            });
            out.push(match oom {
                Some(o) => format!(
                    "oom         {} kill(s) at the {} byte ceiling{}",
                    o.kill_count,
                    o.limit_bytes,
                    o.peak_bytes
                        .map(|p| format!(", peak {p} bytes"))
                        .unwrap_or_default()
                ),
                None => "oom         none".into(),
            });
            out.push(match egress {
                Some(t) => format!(
                    "egress      allowed {}; denied {}{}",
                    h5i_policy::receipt::tally_text(&t.allowed),
                    h5i_policy::receipt::tally_text(&t.denied),
                    t.uncounted
                        .map(|u| format!("; uncounted: {}", u.describe()))
                        .unwrap_or_default()
                ),
                None => "egress      no tally (nothing at this tier counted connections)".into(),
            });
            if let Some(g) = socket_gate {
                out.push(format!(
                    "socket gate allowed {}; refused {}",
                    h5i_policy::receipt::tally_text(&g.allowed),
                    h5i_policy::receipt::tally_text(&g.denied)
                ));
            }
            out
        }
        RecordBody::BoxClaimed {
            claimed_kind,
            claim,
        } => {
            let mut out = vec![format!("claimed     {claimed_kind}")];
            let pretty = serde_json::to_string_pretty(claim).unwrap_or_else(|_| claim.to_string());
            out.extend(pretty.lines().map(|l| format!("  | {l}")));
            out
        }
        RecordBody::Quarantined { entry, reason } => vec![
            format!("quarantined spool entry {entry}"),
            format!("reason      {reason}"),
        ],
        RecordBody::Control { action, holder, by } => vec![format!(
            "browser     {action} by {by}: {holder} holds control"
        )],
        RecordBody::ViewerSession { .. } => {
            vec![format!("viewer      {}", body.viewer_session_line())]
        }
        RecordBody::Page {
            after_seq, state, ..
        } => {
            let mut out = vec![format!("page        {state} after record #{after_seq}")];
            for (what, items) in body.page_findings().into_iter().flatten() {
                out.extend(items.iter().map(|i| format!("  {what}: {i}")));
            }
            out
        }
        RecordBody::Browser { .. } => vec![format!("browser     {}", body.between_runs_line())],
    }
}

/// A command as receipts show it: each argument in backquotes, so where one ends is plain.
pub(crate) fn shown_argv(argv: &[String]) -> String {
    argv.iter()
        .map(|a| format!("`{a}`"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn exit_text(exit: &h5i_policy::receipt::ExitOutcome) -> String {
    let mut s = exit.passthrough_code().to_string();
    if let Some(sig) = exit.signal {
        s.push_str(&format!(" (signal {sig})"));
    }
    if exit.timed_out {
        s.push_str(" (the wall-clock limit killed it)");
    }
    if exit.oom_killed {
        s.push_str(" (OOM-killed at the memory ceiling)");
    }
    s
}

fn micros(us: u64) -> String {
    format!("{}.{:03} s", us / 1_000_000, (us % 1_000_000) / 1000)
}

fn opt(v: Option<String>) -> String {
    v.unwrap_or_else(|| "n/a".into())
}

/// Which records `box log` shows. Every filter narrows; none set shows everything.
#[derive(Debug, Clone, Default)]
pub struct LogQuery {
    /// Only records of this lane.
    pub lane: Option<ReceiptLane>,
    /// Only host-observed (true) or only box-claimed (false) records.
    pub host_observed: Option<bool>,
    /// Only records of this kind (`run`, `box-claimed`, `quarantined`).
    pub kind: Option<RecordKind>,
    /// Only runs whose passthrough exit code was not 0.
    pub failed: bool,
    /// Only records numbered at least this.
    pub since: Option<u64>,
    /// At most this many of the newest matching records (and events).
    pub last: Option<usize>,
    /// Leave the lifecycle events out.
    pub no_events: bool,
}

/// A record's kind, for [`LogQuery::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordKind {
    /// A supervised command.
    Run,
    /// A record the box staged.
    BoxClaimed,
    /// A staged entry refused at ingestion.
    Quarantined,
    /// A change of who holds the browser.
    Control,
    /// A human's viewer opened or closed.
    ViewerSession,
    /// What the browser saw.
    Page,
    /// What the browser sent between runs.
    Browser,
}

impl RecordKind {
    fn of(body: &RecordBody) -> Self {
        match body {
            RecordBody::Run { .. } => RecordKind::Run,
            RecordBody::BoxClaimed { .. } => RecordKind::BoxClaimed,
            RecordBody::Quarantined { .. } => RecordKind::Quarantined,
            RecordBody::Control { .. } => RecordKind::Control,
            RecordBody::ViewerSession { .. } => RecordKind::ViewerSession,
            RecordBody::Page { .. } => RecordKind::Page,
            RecordBody::Browser { .. } => RecordKind::Browser,
        }
    }
}

impl LogQuery {
    fn keeps(&self, r: &ReceiptRecord) -> bool {
        self.lane.is_none_or(|l| l == r.lane)
            && self
                .host_observed
                .is_none_or(|h| h == r.lane.is_host_observed())
            && self.kind.is_none_or(|k| k == RecordKind::of(&r.body))
            && self.since.is_none_or(|s| r.seq >= s)
            && (!self.failed
                || matches!(&r.body, RecordBody::Run { exit, .. } if exit.passthrough_code() != 0))
    }

    /// Whether any receipt filter is set (events carry no lane, kind or exit, so a receipt
    /// filter leaves them out).
    fn filters_receipts(&self) -> bool {
        self.lane.is_some()
            || self.host_observed.is_some()
            || self.kind.is_some()
            || self.failed
            || self.since.is_some()
    }
}

/// `h5i box log NAME`, filtered.
#[derive(Debug, Serialize)]
pub struct LogView {
    /// [`crate::json_doc::LOG`].
    pub schema: &'static str,
    /// The box.
    pub name: String,
    /// Lifecycle events, oldest first.
    pub events: Vec<LogEvent>,
    /// Receipts, oldest first.
    pub receipts: Vec<LogReceipt>,
    /// Lines of the receipt log that did not parse, with why: never silently dropped.
    pub damaged: Vec<String>,
}

/// One lifecycle event of [`LogView`].
#[derive(Debug, Serialize)]
pub struct LogEvent {
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// The event's name (`created`, `run`, ...); `None` for a line that did not parse.
    pub event: Option<String>,
    /// Its detail, or the unreadable line.
    pub detail: String,
}

/// One receipt's summary line of [`LogView`].
#[derive(Debug, Serialize)]
pub struct LogReceipt {
    /// Its sequence number (`inspect --capture` takes it).
    pub seq: u64,
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// Its lane.
    pub lane: ReceiptLane,
    /// Whether the host observed it.
    pub host_observed: bool,
    /// Its kind.
    pub kind: RecordKind,
    /// The command (runs), the claimed kind (box-claimed), or the spool entry (quarantined).
    pub what: String,
    /// The passthrough exit code, for a run.
    pub exit: Option<i32>,
    /// Wall time, for a run.
    pub wall_ms: Option<u64>,
    /// Denied egress attempts the run's tally counted.
    pub egress_denied: u64,
}

/// The box's log, as `query` narrows it.
pub fn log(store: &BoxStore, name: &str, query: &LogQuery) -> Result<LogView, BoxError> {
    let sb = store.find(name)?;
    let mut events: Vec<LogEvent> = match query.no_events || query.filters_receipts() {
        true => Vec::new(),
        false => crate::events::read(&sb.paths)?
            .into_iter()
            .map(|ev| match ev {
                Ok(e) => LogEvent {
                    at_ms: e.at_ms,
                    event: Some(e.event),
                    detail: e.detail,
                },
                Err(line) => LogEvent {
                    at_ms: 0,
                    event: None,
                    detail: line,
                },
            })
            .collect(),
    };
    let readout = ReceiptLog::at(sb.paths.receipts()).read()?;
    let mut receipts: Vec<LogReceipt> = readout
        .records
        .iter()
        .filter(|r| query.keeps(r))
        .map(summary)
        .collect();
    if let Some(n) = query.last {
        events.drain(..events.len().saturating_sub(n));
        receipts.drain(..receipts.len().saturating_sub(n));
    }
    Ok(LogView {
        schema: crate::json_doc::LOG,
        name: name.to_string(),
        events,
        receipts,
        damaged: readout
            .damaged
            .iter()
            .map(|d| format!("line {}: {}", d.line, d.problem))
            .collect(),
    })
}

fn summary(r: &ReceiptRecord) -> LogReceipt {
    let (what, exit, wall_ms, egress_denied) = match &r.body {
        RecordBody::Run {
            argv,
            exit,
            wall_ms,
            egress,
            ..
        } => (
            shown_argv(argv),
            Some(exit.passthrough_code()),
            Some(*wall_ms),
            egress.as_ref().map_or(0, |t| t.denied.values().sum()),
        ),
        RecordBody::BoxClaimed { claimed_kind, .. } => (claimed_kind.clone(), None, None, 0),
        RecordBody::Quarantined { entry, .. } => (entry.clone(), None, None, 0),
        RecordBody::Control { action, .. } => (format!("browser {action}"), None, None, 0),
        RecordBody::ViewerSession { event, via, .. } => (format!("{via} {event}"), None, None, 0),
        RecordBody::Page { state, .. } => (format!("page {state}"), None, None, 0),
        RecordBody::Browser { egress, .. } => (
            "browser between runs".to_string(),
            None,
            None,
            egress.denied.values().sum(),
        ),
    };
    LogReceipt {
        seq: r.seq,
        at_ms: r.at_ms,
        lane: r.lane,
        host_observed: r.lane.is_host_observed(),
        kind: RecordKind::of(&r.body),
        what,
        exit,
        wall_ms,
        egress_denied,
    }
}

impl LogView {
    /// One escaped line per event and receipt, then the damaged lines.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.events {
            out.push(match &e.event {
                Some(ev) => format!("{} {ev:<9} {}", rfc3339_utc(e.at_ms, false), e.detail),
                None => format!("(unreadable event line: {})", e.detail),
            });
        }
        for r in &self.receipts {
            let mut line = format!(
                "receipt #{} {} [{}{}] {}",
                r.seq,
                rfc3339_utc(r.at_ms, false),
                r.lane.as_str(),
                if r.host_observed { "" } else { ", box-claimed" },
                r.what
            );
            if let Some(code) = r.exit {
                line.push_str(&format!(" exit {code}"));
            }
            if let Some(ms) = r.wall_ms {
                line.push_str(&format!(" ({ms} ms)"));
            }
            if r.egress_denied > 0 {
                line.push_str(&format!(" egress denied x{}", r.egress_denied));
            }
            out.push(line);
        }
        for d in &self.damaged {
            out.push(format!("receipt log {d}"));
        }
        out.into_iter()
            .map(|l| escape::escape_controls(&l))
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use h5i_policy::receipt::{EgressTally, ExitOutcome};

    /// A host-observed-shaped run record whose argv carries an escape sequence and whose tally
    /// refused one destination twice (also the console's test record).
    pub(crate) fn run_record(seq: u64, lane: ReceiptLane, code: i32) -> ReceiptRecord {
        ReceiptRecord {
            v: 1,
            seq,
            lane,
            at_ms: 1_764_000_000_000,
            policy_digest: "sha256:00".into(),
            redactions: vec![],
            payload: None,
            body: RecordBody::Run {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "printf '\x1b]52;c;aGk=\x07'".into(),
                ],
                tier: "process".into(),
                exit: ExitOutcome {
                    code: Some(code),
                    signal: None,
                    timed_out: false,
                    oom_killed: false,
                },
                rusage: None,
                cgroup_usage: None,
                wall_ms: 5,
                oom: None,
                egress: Some(EgressTally {
                    allowed: Default::default(),
                    denied: [("198.19.0.2:443".to_string(), 2)].into(),
                    uncounted: None,
                }),
                socket_gate: None,
            },
        }
    }

    #[test]
    fn a_rendered_receipt_never_carries_a_raw_escape() {
        let view = CaptureView {
            schema: crate::json_doc::INSPECT,
            name: "b".into(),
            host_observed: true,
            record: run_record(3, ReceiptLane::HostEnvRun, 0),
            payload: Some(PayloadView {
                file: "p1".into(),
                bytes: 9,
                text: Some("\x1b[2Jhi\u{202e}".into()),
                truncated: false,
                problem: None,
            }),
        };
        let lines = view.lines();
        assert!(lines.iter().all(|l| !l.chars().any(escape::is_control)));
        assert!(lines
            .iter()
            .any(|l| l.contains("egress      allowed none; denied 198.19.0.2:443 x2")));
        assert!(lines
            .iter()
            .any(|l| l.starts_with("lane        host-env-run (host-observed")));
    }

    #[test]
    fn a_box_claimed_record_says_so() {
        let mut r = run_record(4, ReceiptLane::InboxCapture, 0);
        r.body = RecordBody::BoxClaimed {
            claimed_kind: "tool-call".into(),
            claim: serde_json::json!({"tool": "Bash", "command": "ls\u{1b}[2J"}),
        };
        let view = CaptureView {
            schema: crate::json_doc::INSPECT,
            name: "b".into(),
            host_observed: false,
            record: r,
            payload: None,
        };
        let lines = view.lines();
        assert!(lines
            .iter()
            .any(|l| l.contains("box-claimed: the box's own account")));
        assert!(lines.iter().all(|l| !l.contains('\u{1b}')));
    }

    #[test]
    fn each_filter_narrows_to_its_records() {
        let recs = [
            run_record(1, ReceiptLane::HostEnvRun, 0),
            run_record(2, ReceiptLane::HostEnvRun, 3),
            run_record(3, ReceiptLane::TeeShim, 0),
        ];
        let kept = |q: LogQuery| -> Vec<u64> {
            recs.iter().filter(|r| q.keeps(r)).map(|r| r.seq).collect()
        };
        assert_eq!(kept(LogQuery::default()), vec![1, 2, 3]);
        assert_eq!(
            kept(LogQuery {
                failed: true,
                ..Default::default()
            }),
            vec![2]
        );
        assert_eq!(
            kept(LogQuery {
                host_observed: Some(false),
                ..Default::default()
            }),
            vec![3]
        );
        assert_eq!(
            kept(LogQuery {
                lane: Some(ReceiptLane::HostEnvRun),
                since: Some(2),
                ..Default::default()
            }),
            vec![2]
        );
        assert_eq!(
            kept(LogQuery {
                kind: Some(RecordKind::Quarantined),
                ..Default::default()
            }),
            Vec::<u64>::new()
        );
    }
}
