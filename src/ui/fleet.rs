//! What the console shows, as data: the fleet (every box with its tier, status and one signal),
//! one box's detail (its enforced policy, services, diffstat, flight recorder) and a receipt
//! rendered. Plain functions over the store, with no server in them: the routes call them on a
//! blocking thread and the unit tests below call them directly.
//!
//! Every figure comes from the code paths the CLI prints from: `status::status` and
//! `json_doc::Status` (the enforced policy), `service::status` and `json_doc::ServiceStatus`,
//! `diff::diff_text` (the diffstat, under export's hold), `inspect::capture(..).lines()` (a
//! receipt, the same text `h5i box inspect` prints). What this module adds is the colour rule
//! and the flight recorder's lanes.
//!
//! The colour rule (the manual's): red only for an egress destination the allowlist refused, as
//! a host-observed record counted it; amber for a run that exited non-zero, one the wall clock
//! killed, or a page the box's browser reported errors on; grey for weak evidence (the
//! workspace tier, or a box whose only records are its own claims). Nothing else is coloured.
//!
//! Must never: change a box (the only holds taken are the ones `status` and `diff` take to read
//! a still tree), colour a box-claimed record red, or pass a box-chosen string without the one
//! escaper ([`shown`]).

use std::hash::{Hash, Hasher};

use h5i_broker::receipt_log::ReceiptLog;
use h5i_policy::receipt::{rfc3339_utc, ReceiptRecord, RecordBody};
use serde::Serialize;
use serde_json::Value;

use crate::error::BoxError;
use crate::store::{BoxStore, StoredBox};

/// The flight recorder's lanes, in the order the page draws them.
pub const LANES: [&str; 5] = ["FS", "NET", "PROC", "RES", "PAGE"];

/// What a colour claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Colour {
    /// The egress allowlist refused a destination, host-observed.
    Red,
    /// Something to look at: a non-zero exit, a wall-clock kill, browser errors.
    Amber,
    /// Weak evidence: nothing confined, or only the box's own account.
    Grey,
    /// No claim.
    Plain,
}

/// A box's one signal in the fleet list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signal {
    /// Its colour.
    pub colour: Colour,
    /// What it says.
    pub text: String,
}

/// One box of the fleet list.
#[derive(Debug, Serialize)]
pub struct FleetRow {
    /// The box.
    pub name: String,
    /// active, applied, aborted.
    pub state: String,
    /// Its tier.
    pub tier: String,
    /// Its one signal.
    pub signal: Signal,
}

/// One receipt in the flight recorder: its cell in each lane it says something about.
#[derive(Debug, Serialize)]
pub struct FlightRow {
    /// The receipt's number (`h5i box inspect --capture` takes it).
    pub seq: u64,
    /// When, UTC.
    pub at: String,
    /// The receipt lane it was written in.
    pub lane: &'static str,
    /// `host-observed` or `box-claimed`.
    pub evidence: &'static str,
    /// The row's colour.
    pub colour: Colour,
    /// One cell per [`LANES`] entry; `None` where the receipt says nothing of that lane.
    pub cells: [Option<String>; 5],
}

/// The fleet document the page draws first: the store's [`version`] and every box with its
/// signal, from one listing of the store. The version is taken before any receipt log is read,
/// so a write that lands while the rows are read moves the version past the one sent, and the
/// page's next `changes` call fetches again.
pub fn fleet_doc(store: &BoxStore) -> Result<Value, BoxError> {
    let boxes = store.list()?;
    let version = version_of(&boxes);
    let rows: Vec<FleetRow> = boxes.into_iter().map(fleet_row).collect();
    Ok(serde_json::json!({ "version": version, "boxes": rows }))
}

fn fleet_row(sb: StoredBox) -> FleetRow {
    let signal = match ReceiptLog::at(sb.paths.receipts()).read() {
        Ok(readout) => signal_of(&sb.manifest.tier, &readout.records),
        Err(e) => Signal {
            colour: Colour::Grey,
            text: format!("receipt log unreadable: {e}"),
        },
    };
    let m = sb.manifest;
    FleetRow {
        name: m.name,
        state: m.state.as_str().to_string(),
        tier: m.tier,
        signal,
    }
}

/// Denied egress attempts a record counted, when the host observed it.
fn host_denied(r: &ReceiptRecord) -> u64 {
    match &r.body {
        RecordBody::Run {
            egress: Some(t), ..
        } if r.lane.is_host_observed() => t.denied.values().sum(),
        RecordBody::Browser { egress, .. } => egress.denied.values().sum(),
        _ => 0,
    }
}

/// Errors a page record carries (console errors, exceptions, failed requests).
fn page_errors(body: &RecordBody) -> usize {
    match body {
        RecordBody::Page {
            console_errors,
            exceptions,
            failed_requests,
            ..
        } => console_errors.len() + exceptions.len() + failed_requests.len(),
        _ => 0,
    }
}

/// Whether a run record ended in something to look at.
fn run_failed(body: &RecordBody) -> bool {
    matches!(body, RecordBody::Run { exit, .. } if exit.passthrough_code() != 0)
}

/// A box's one signal, from its tier and its receipts: red before amber before grey.
pub fn signal_of(tier: &str, records: &[ReceiptRecord]) -> Signal {
    let signal = |colour, text| Signal { colour, text };
    let denied: u64 = records.iter().map(host_denied).sum();
    if let Some(last) = records.iter().rev().find(|r| host_denied(r) > 0) {
        return signal(
            Colour::Red,
            format!(
                "egress refused x{denied} (host-observed; last in receipt #{})",
                last.seq
            ),
        );
    }
    let last_run = records
        .iter()
        .rev()
        .find(|r| r.lane.is_host_observed() && matches!(r.body, RecordBody::Run { .. }));
    if let Some(
        r @ ReceiptRecord {
            body: RecordBody::Run { exit, .. },
            ..
        },
    ) = last_run
    {
        if exit.timed_out {
            return signal(
                Colour::Amber,
                format!("the wall clock killed the last run (receipt #{})", r.seq),
            );
        }
        if run_failed(&r.body) {
            return signal(
                Colour::Amber,
                format!(
                    "last run exited {} (receipt #{})",
                    exit.passthrough_code(),
                    r.seq
                ),
            );
        }
    }
    if let Some(p) = records
        .iter()
        .rev()
        .find(|r| matches!(r.body, RecordBody::Page { .. }))
    {
        let n = page_errors(&p.body);
        if n > 0 {
            return signal(
                Colour::Amber,
                format!("the browser reported {n} error(s) (receipt #{})", p.seq),
            );
        }
    }
    if tier == h5i_policy::Tier::Workspace.as_str() {
        return signal(
            Colour::Grey,
            "workspace tier: nothing was confined".to_string(),
        );
    }
    if !records.is_empty() && records.iter().all(|r| !r.lane.is_host_observed()) {
        return signal(
            Colour::Grey,
            "box-claimed records only: the box's own account".to_string(),
        );
    }
    match last_run {
        Some(r) => signal(
            Colour::Plain,
            format!("last run exit 0 (receipt #{})", r.seq),
        ),
        None => signal(Colour::Plain, "no runs yet".to_string()),
    }
}

/// The flight recorder: one row per receipt, oldest first.
pub fn flight_rows(records: &[ReceiptRecord]) -> Vec<FlightRow> {
    records.iter().map(flight_row).collect()
}

fn flight_row(r: &ReceiptRecord) -> FlightRow {
    let host = r.lane.is_host_observed();
    let mut cells: [Option<String>; 5] = Default::default();
    let [fs, net, proc, res, page] = &mut cells;
    let mut colour = if host { Colour::Plain } else { Colour::Grey };
    match &r.body {
        RecordBody::Run {
            argv,
            exit,
            rusage,
            cgroup_usage,
            wall_ms,
            oom,
            egress,
            socket_gate,
            ..
        } => {
            let mut p = format!(
                "{} exit {}",
                crate::inspect::shown_argv(argv),
                exit.passthrough_code()
            );
            if exit.timed_out {
                p.push_str(" (wall clock killed it)");
            } else if let Some(sig) = exit.signal {
                p.push_str(&format!(" (signal {sig})"));
            }
            *proc = Some(p);
            let mut u = format!("wall {wall_ms} ms");
            if let Some(ru) = rusage {
                u.push_str(&format!(", max-rss {} KiB", ru.maxrss_kb));
            } else if let Some(peak) = cgroup_usage.as_ref().and_then(|c| c.mem_peak_bytes) {
                u.push_str(&format!(", memory peak {peak} bytes"));
            }
            if exit.oom_killed || oom.is_some() {
                u.push_str(", OOM-killed");
            }
            *res = Some(u);
            if let Some(t) = egress {
                let allowed: u64 = t.allowed.values().sum();
                let denied: u64 = t.denied.values().sum();
                let mut n = format!("allowed {allowed}, refused {denied}");
                if denied > 0 {
                    let dests: Vec<&str> = t.denied.keys().map(String::as_str).collect();
                    n.push_str(&format!(" ({})", dests.join(", ")));
                }
                if t.uncounted.is_some() {
                    n.push_str("; not all counted at this tier");
                }
                *net = Some(n);
            }
            if let Some(g) = socket_gate {
                let refused: u64 = g.denied.values().sum();
                if refused > 0 {
                    let n = net.get_or_insert_with(String::new);
                    if !n.is_empty() {
                        n.push_str("; ");
                    }
                    n.push_str(&format!("socket() refused {refused}"));
                }
            }
            if host_denied(r) > 0 {
                colour = Colour::Red;
            } else if run_failed(&r.body) {
                colour = Colour::Amber;
            }
        }
        RecordBody::BoxClaimed {
            claimed_kind,
            claim,
        } => {
            let s = |k: &str| claim.get(k).and_then(Value::as_str);
            let what = [s("tool"), s("command").or(s("file_path"))]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ");
            let text = format!("claimed {claimed_kind}: {what}");
            match s("file_path") {
                Some(_) => *fs = Some(text),
                None => *proc = Some(text),
            }
        }
        RecordBody::Quarantined { entry, reason } => {
            *fs = Some(format!("spool entry {entry} refused: {reason}"));
        }
        RecordBody::Control { action, holder, by } => {
            *page = Some(format!("browser {action} by {by}: {holder} holds control"));
        }
        RecordBody::ViewerSession { .. } => {
            *page = Some(r.body.viewer_session_line());
        }
        RecordBody::Browser { .. } => {
            *page = Some(r.body.between_runs_line());
            if host_denied(r) > 0 {
                colour = Colour::Red;
            }
        }
        RecordBody::Page { state, visited, .. } => {
            let errors = page_errors(&r.body);
            *page = Some(format!(
                "page {state}: {} visited, {errors} error(s)",
                visited.len()
            ));
            if errors > 0 {
                colour = Colour::Amber;
            } else if state != "observed" {
                colour = Colour::Grey;
            }
        }
    }
    for cell in cells.iter_mut().flatten() {
        *cell = crate::escape::escape_controls(cell);
    }
    FlightRow {
        seq: r.seq,
        at: rfc3339_utc(r.at_ms, false),
        lane: r.lane.as_str(),
        evidence: if host { "host-observed" } else { "box-claimed" },
        colour,
        cells,
    }
}

/// One part of a box's detail: its document, or why it could not be read.
fn part<T: Serialize, E: std::fmt::Display>(r: Result<T, E>) -> Value {
    match r.map(|doc| serde_json::to_value(doc)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => serde_json::json!({ "error": e.to_string() }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

/// The picked box: its enforced policy (`status`), services, diffstat against the pinned base,
/// flight recorder and the receipt log's damaged lines. A part that cannot be read carries its
/// `error` instead; the rest is still shown.
pub fn detail(store: &BoxStore, name: &str) -> Result<Value, BoxError> {
    let sb = store.find(name)?;
    let status = part(crate::status::status(store, name).map(|r| crate::json_doc::Status::of(&r)));
    let services = part(
        crate::service::status(store, name)
            .map(|all| crate::json_doc::ServiceStatus::of(name, &all)),
    );
    let diffstat = part(
        crate::diff::diff_text(store, name, true)
            .map(|d| serde_json::json!({ "lines": d.lines, "unread": d.unread })),
    );
    let (flight, damaged) = match ReceiptLog::at(sb.paths.receipts()).read() {
        Ok(readout) => (
            flight_rows(&readout.records),
            readout
                .damaged
                .iter()
                .map(|d| format!("line {}: {}", d.line, d.problem))
                .collect(),
        ),
        Err(e) => (Vec::new(), vec![e.to_string()]),
    };
    Ok(shown(serde_json::json!({
        "name": name,
        "lanes": LANES,
        "status": status,
        "services": services,
        "diffstat": diffstat,
        "flight": flight,
        "damaged": damaged,
    })))
}

/// Receipt `seq` of box `name`, rendered: the lines `h5i box inspect --capture` prints.
pub fn receipt(store: &BoxStore, name: &str, seq: u64) -> Result<Value, BoxError> {
    let view = crate::inspect::capture(store, name, seq)?;
    Ok(serde_json::json!({ "name": name, "seq": seq, "lines": view.lines() }))
}

/// A document for the page with every string passed through the one escaper: a box-chosen
/// control character or reordering mark is shown, never obeyed.
pub fn shown(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(crate::escape::escape_controls(&s)),
        Value::Array(items) => Value::Array(items.into_iter().map(shown).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, shown(v))).collect()),
        other => other,
    }
}

/// A figure that changes whenever a box is made or removed, or a box's manifest, receipt log or
/// event log is written: the page refreshes when it moves.
pub fn version(store: &BoxStore) -> String {
    match store.list() {
        Ok(boxes) => version_of(&boxes),
        Err(e) => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            e.to_string().hash(&mut h);
            format!("{:016x}", h.finish())
        }
    }
}

fn version_of(boxes: &[StoredBox]) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for sb in boxes {
        sb.paths.manifest().hash(&mut h);
        for file in [sb.paths.manifest(), sb.paths.receipts(), sb.paths.events()] {
            if let Ok(meta) = std::fs::symlink_metadata(file) {
                meta.len().hash(&mut h);
                meta.modified().ok().hash(&mut h);
            }
        }
    }
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use h5i_policy::receipt::ReceiptLane;

    fn run(seq: u64, lane: ReceiptLane, code: i32, denied: u64) -> ReceiptRecord {
        let mut r = crate::inspect::tests::run_record(seq, lane, code);
        if let RecordBody::Run {
            egress: Some(t), ..
        } = &mut r.body
        {
            t.denied.retain(|_, n| {
                *n = denied;
                denied > 0
            });
        }
        r
    }

    #[test]
    fn red_is_only_for_a_host_observed_refusal() {
        let red = signal_of("supervised", &[run(1, ReceiptLane::HostEnvRun, 0, 2)]);
        assert_eq!(red.colour, Colour::Red, "{red:?}");
        // The same tally in the box's own account is not a boundary claim.
        let claimed = [run(1, ReceiptLane::TeeShim, 0, 2)];
        assert_eq!(signal_of("supervised", &claimed).colour, Colour::Grey);
        assert_eq!(flight_rows(&claimed)[0].colour, Colour::Grey);
        assert_eq!(
            flight_rows(&[run(1, ReceiptLane::HostEnvRun, 0, 2)])[0].colour,
            Colour::Red
        );
    }

    #[test]
    fn a_failed_last_run_is_amber_and_a_later_pass_clears_it() {
        let failed = [run(1, ReceiptLane::HostEnvRun, 3, 0)];
        let s = signal_of("process", &failed);
        assert_eq!(s.colour, Colour::Amber);
        assert!(s.text.contains("exited 3"), "{s:?}");
        let passed = [
            run(1, ReceiptLane::HostEnvRun, 3, 0),
            run(2, ReceiptLane::HostEnvRun, 0, 0),
        ];
        assert_eq!(signal_of("process", &passed).colour, Colour::Plain);
        assert_eq!(flight_rows(&passed)[0].colour, Colour::Amber);
        assert_eq!(signal_of("workspace", &passed).colour, Colour::Grey);
    }

    #[test]
    fn a_row_puts_each_figure_in_its_lane_and_escapes_it() {
        let row = &flight_rows(&[run(7, ReceiptLane::HostEnvRun, 0, 1)])[0];
        let [fs, net, proc, res, page] = &row.cells;
        assert!(fs.is_none() && page.is_none());
        assert!(net.as_deref().is_some_and(|n| n.contains("refused 1")));
        assert!(res.as_deref().is_some_and(|r| r.starts_with("wall 5 ms")));
        let proc = proc.as_deref().unwrap_or_default();
        assert!(
            proc.contains("\\x1b]52") && !proc.contains('\u{1b}'),
            "{proc}"
        );
        let doc = shown(serde_json::json!({"a": ["\u{1b}[2J"]}));
        assert_eq!(doc["a"][0], "\\x1b[2J");
    }
}
