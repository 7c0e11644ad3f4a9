//! `report.md` and `receipt.json`: what a reviewer reads before applying a box's patch.
//!
//! Owns rendering the receipt log and the gate's result into the report's sections, in the
//! manual's order after a short header — denied egress attempts, what ran, what the browser saw,
//! viewer sessions, the agent's proposal — then what was excluded from the patch and the problems
//! with the evidence itself (among them each gap between what h5i observed and what the box
//! claims: a call half-claimed, the two box-side accounts disagreeing, a record the box says it
//! staged outside the run h5i saw); and the machine-readable `receipt.json`.
//!
//! Must never: claim what was not observed (no egress counter at a tier means "none could be
//! seen", not "none happened"; no browser record means "nothing recorded", not "no errors"); blur
//! a box-claimed record into a host-observed one; let box-supplied text forge a section or drive
//! a terminal (it is escaped, and multi-line text is an indented block); write a value the
//! redactor knows; or cut a safety section to fit the cap (only the proposal is ever cut).
//!
//! Guarded by the unit tests below and `tests/export_gate.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use h5i_broker::receipt_log::ReceiptReadout;
use h5i_broker::redact::Redactor;
use h5i_policy::receipt::{ExitOutcome, ReceiptLane, ReceiptRecord, RecordBody};
use h5i_policy::Tier;
use serde_json::{json, Value};

use super::gate::{escape_controls, GatedPatch};
use super::ExportError;

/// The report's section headings, in the order the manual gives them.
pub const SECTIONS: [&str; 7] = [
    "## Denied egress attempts",
    "## What ran",
    "## What the browser saw",
    "## Viewer sessions",
    "## The agent's proposal",
    "## Excluded from the patch",
    "## Evidence problems",
];

/// What the secret scan covers, stated plainly in every report.
const SECRET_SCAN_LIMITS: &str = "Secret scan: each granted secret h5i could resolve was looked \
     for literally and as base64 (all three alignments), base64url, hex (lower and upper case), \
     URL-encoding and reversed, in the patch, this report and the receipt. A secret transformed \
     any other way (split, compressed, encrypted, encoded twice, base64 wrapped across lines) is \
     not detected.\n\n";

/// Longest box-claimed record shown inline, in characters.
const CLAIM_SHOWN: usize = 400;

/// Everything the report and the receipt are made from.
#[derive(Debug)]
pub struct ReportInput<'a> {
    /// The box's name.
    pub box_name: &'a str,
    /// The tier its policy resolved to.
    pub tier: &'a str,
    /// The pinned base commit.
    pub base: &'a str,
    /// The policy digest in force.
    pub policy_digest: &'a str,
    /// When the export was made, ms since the epoch.
    pub exported_at_ms: u64,
    /// The box's receipt log, as read.
    pub receipts: &'a ReceiptReadout,
    /// The agent's proposal (box-claimed), when one was staged.
    pub proposal: Option<&'a str>,
    /// The gate's result.
    pub gated: &'a GatedPatch,
    /// SHA-256 of `patch.diff`.
    pub patch_sha256: &'a str,
    /// Lines the reader must see before anything else (a skipped secret scan, a policy
    /// change); rendered through the report's escaper.
    pub notices: &'a [String],
    /// Whether h5i bound the tee shim into the box (`crate::capture::tee_shim_wired`): each
    /// `Bash` call its hooks claim should have the shim's record of the command, and a
    /// `tee-shim` record in any other box is forged.
    pub tee_shim: bool,
    /// Why the shim is not the shell the agent runs its commands through, when it is not
    /// (`crate::container::check_shim_image`): only when it is, is a `Bash` call without the
    /// shim's record, or a shim record without a call, a finding; else the report says the
    /// cross-check does not apply, and why.
    pub shim_not_agent_shell: Option<&'a str>,
}

/// A rendered `report.md`.
#[derive(Debug)]
pub struct RenderedReport {
    /// The report.
    pub text: String,
    /// Whether the agent's proposal was cut to fit the cap.
    pub proposal_truncated: bool,
}

/// Render `report.md` within `cap` bytes, cutting only the proposal.
pub fn render_report(
    input: &ReportInput<'_>,
    redactor: &Redactor,
    cap: usize,
) -> Result<RenderedReport, ExportError> {
    let c = |s: &str| clean(redactor, s);
    let mut head = String::new();
    header(&mut head, input, &c);
    denied_egress(&mut head, input, &c);
    what_ran(&mut head, input, redactor, &c);
    browser_saw(&mut head, input, &c);
    viewer_sessions(&mut head, input, &c);

    let mut tail = String::new();
    excluded(&mut tail, input, &c);
    evidence_problems(&mut tail, input, &c);

    let proposal_head = format!(
        "{}\n\nBox-claimed: the agent's own account of its work, shown as it staged it and not \
         checked by h5i.\n\n",
        SECTIONS[4]
    );
    let (body, proposal_truncated) = match input.proposal {
        None => ("None staged.\n\n".to_string(), false),
        Some(p) => {
            let block = indented_block(redactor, p);
            let fixed = head.len() + proposal_head.len() + tail.len();
            if fixed + block.len() <= cap {
                (block, false)
            } else {
                let note = format!(
                    "\n[h5i: the proposal was cut to fit report.md's {cap}-byte cap; it was {} bytes]\n\n",
                    p.len()
                );
                let room = cap.saturating_sub(fixed + note.len());
                let mut end = room.min(block.len());
                while end > 0 && !block.is_char_boundary(end) {
                    end -= 1;
                }
                let cut = &block[..end];
                let cut = &cut[..cut.rfind('\n').map_or(0, |i| i + 1)];
                (format!("{cut}{note}"), true)
            }
        }
    };
    let mut text = head;
    text.push_str(&proposal_head);
    text.push_str(&body);
    text.push_str(&tail);
    if text.len() > cap {
        return Err(ExportError::ReportTooLarge {
            size: text.len(),
            cap,
        });
    }
    let rules = redactor.matches(text.as_bytes());
    if !rules.is_empty() {
        return Err(ExportError::SecretInBundle {
            file: "report.md",
            rules,
        });
    }
    Ok(RenderedReport {
        text,
        proposal_truncated,
    })
}

/// Render `receipt.json`: every record, the damaged lines, and what the export did; every string
/// redacted; refused over `cap` bytes.
pub fn render_receipt(
    input: &ReportInput<'_>,
    redactor: &Redactor,
    cap: usize,
) -> Result<Vec<u8>, ExportError> {
    let records: Vec<Value> = input
        .receipts
        .records
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()
        .map_err(ExportError::Encode)?;
    let damaged: Vec<Value> = input
        .receipts
        .damaged
        .iter()
        .map(|d| json!({ "line": d.line, "problem": d.problem }))
        .collect();
    let excluded = serde_json::to_value(&input.gated.excluded).map_err(ExportError::Encode)?;
    let mut v = json!({
        "box": input.box_name,
        "tier": input.tier,
        "base": input.base,
        "policy_digest": input.policy_digest,
        "exported_at_ms": input.exported_at_ms,
        "records": records,
        "damaged_lines": damaged,
        "export": {
            "excluded": excluded,
            "patch_sha256": input.patch_sha256,
            "files_changed": input.gated.files_changed,
            "insertions": input.gated.insertions,
            "deletions": input.gated.deletions,
            "binary_files": input.gated.binary_files,
        },
    });
    redact_value(redactor, &mut v);
    let mut bytes = serde_json::to_vec_pretty(&v).map_err(ExportError::Encode)?;
    bytes.push(b'\n');
    if bytes.len() > cap {
        return Err(ExportError::ReceiptTooLarge {
            size: bytes.len(),
            cap,
        });
    }
    let rules = redactor.matches(&bytes);
    if !rules.is_empty() {
        return Err(ExportError::SecretInBundle {
            file: "receipt.json",
            rules,
        });
    }
    Ok(bytes)
}

fn redact_value(redactor: &Redactor, v: &mut Value) {
    match v {
        Value::String(s) => {
            let (r, ids) = redactor.redact(s);
            if !ids.is_empty() {
                *s = r;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| redact_value(redactor, x)),
        Value::Object(o) => {
            let old = std::mem::take(o);
            for (k, mut x) in old {
                redact_value(redactor, &mut x);
                o.insert(redactor.redact(&k).0, x);
            }
        }
        _ => {}
    }
}

/// Redact, then escape control characters: for any text that came from the box or its records.
fn clean(redactor: &Redactor, s: &str) -> String {
    escape_controls(&redactor.redact(s).0)
}

/// Multi-line box text as an indented code block: redacted whole, then each line escaped (tabs
/// kept) and indented, so no line of it can start a heading or drive a terminal.
fn indented_block(redactor: &Redactor, text: &str) -> String {
    let (redacted, _) = redactor.redact(text);
    let mut out = String::new();
    for line in redacted.split('\n') {
        out.push_str("    ");
        for part in line.split('\t') {
            out.push_str(&escape_controls(part));
            out.push('\t');
        }
        out.pop();
        out.push('\n');
    }
    out.push('\n');
    out
}

/// Inline code that no content can break out of.
fn code(s: &str) -> String {
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    if s.starts_with('`') || s.ends_with('`') || s.is_empty() {
        format!("{fence} {s} {fence}")
    } else {
        format!("{fence}{s}{fence}")
    }
}

/// One argument quoted as a POSIX shell would need it, for display.
fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./-_".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

fn header(out: &mut String, input: &ReportInput<'_>, c: &dyn Fn(&str) -> String) {
    let host = input
        .receipts
        .records
        .iter()
        .filter(|r| r.lane.is_host_observed())
        .count();
    let g = input.gated;
    let _ = writeln!(out, "# h5i export: box {}\n", code(&c(input.box_name)));
    for n in input.notices {
        let _ = writeln!(out, "**{}**\n", c(n));
    }
    let _ = writeln!(out, "- Box: {}", code(&c(input.box_name)));
    let _ = writeln!(out, "- Tier: {}", code(&c(input.tier)));
    let _ = writeln!(out, "- Base: {}", code(&c(input.base)));
    let _ = writeln!(out, "- Policy digest: {}", code(&c(input.policy_digest)));
    let _ = writeln!(
        out,
        "- Exported: {} ({} ms since the epoch)",
        h5i_policy::receipt::rfc3339_utc(input.exported_at_ms, true),
        input.exported_at_ms
    );
    let _ = writeln!(
        out,
        "- Patch: {} file(s) changed, {} insertion(s), {} deletion(s), {} binary; {} excluded; sha256 {}",
        g.files_changed,
        g.insertions,
        g.deletions,
        g.binary_files,
        g.excluded.len(),
        input.patch_sha256
    );
    let _ = writeln!(
        out,
        "- Evidence: {} record(s), {} host-observed, {} box-claimed; {} damaged line(s)\n",
        input.receipts.records.len(),
        host,
        input.receipts.records.len() - host,
        input.receipts.damaged.len()
    );
    out.push_str(
        "Read this before `git apply --3way patch.diff`. `host-observed` evidence is what h5i saw \
         itself; `box-claimed` evidence is the box's own account.\n\n",
    );
    out.push_str(SECRET_SCAN_LIMITS);
}

fn lane_label(r: &ReceiptRecord) -> String {
    format!(
        "{} ({})",
        code(r.lane.as_str()),
        if r.lane.is_host_observed() {
            "host-observed"
        } else {
            "box-claimed"
        }
    )
}

fn denied_egress(out: &mut String, input: &ReportInput<'_>, c: &dyn Fn(&str) -> String) {
    let _ = writeln!(out, "{}\n", SECTIONS[0]);
    // host:port -> (count, [(seq, host observed)])
    let mut denied: BTreeMap<String, (u64, Vec<(u64, bool)>)> = BTreeMap::new();
    let mut counted = 0usize;
    let mut uncounted = std::collections::BTreeSet::new();
    for r in &input.receipts.records {
        if let RecordBody::Run {
            egress: Some(tally),
            ..
        } = &r.body
        {
            counted += 1;
            if let Some(u) = tally.uncounted {
                uncounted.insert(u.describe());
            }
            for (dest, n) in &tally.denied {
                let e = denied.entry(dest.clone()).or_default();
                e.0 += n;
                e.1.push((r.seq, r.lane.is_host_observed()));
            }
        }
    }
    if !denied.is_empty() {
        for (dest, (n, runs)) in &denied {
            let runs: Vec<String> = runs
                .iter()
                .map(|(seq, host)| {
                    if *host {
                        format!("#{seq}")
                    } else {
                        format!("#{seq} (box-claimed)")
                    }
                })
                .collect();
            let _ = writeln!(
                out,
                "- {} refused {n} time(s), in run(s) {}",
                code(&c(dest)),
                runs.join(", ")
            );
        }
        out.push('\n');
        uncounted_egress(out, &uncounted);
        return;
    }
    let tier = c(input.tier);
    let text = if counted > 0 && !uncounted.is_empty() {
        format!(
            "None recorded: the credential proxy counted for {counted} run(s) at this box's tier \
             ({}) and refused none.",
            code(&tier)
        )
    } else if counted > 0 && matches!(input.tier.parse::<Tier>(), Ok(Tier::Process)) {
        format!(
            "None recorded: the box's deny-all table counted the connections it refused for \
             {counted} run(s) at this box's tier ({}) and refused none.",
            code(&tier)
        )
    } else if counted > 0 {
        format!(
            "None recorded: the egress allowlist counted connections for {counted} run(s) at this \
             box's tier ({}) and refused none.",
            code(&tier)
        )
    } else {
        match input.tier.parse::<Tier>() {
            Ok(Tier::Workspace) => "None recorded, and none could be: at the `workspace` tier \
                nothing confines or counts the box's network, so an attempt to reach any host was \
                neither refused nor seen."
                .to_string(),
            Ok(Tier::Process) => "None recorded: no run of this box carried an egress tally. \
                A `process` run on its own network has a deny-all table that refuses and counts \
                every connection the box makes; nothing counted here is not the same as nothing \
                attempted."
                .to_string(),
            Ok(Tier::Microvm) => "None recorded: no run of this box carried an egress tally. A \
                `microvm` run whose policy allows no egress has no network device and no forward, \
                so nothing could leave; a run through msb is not counted (its network stack drops \
                refused packets without reporting them)."
                .to_string(),
            Ok(t) => format!(
                "None recorded: no run of this box carried an egress tally, although the {} tier \
                 counts egress for runs it confines. Nothing counted here is not the same as \
                 nothing attempted.",
                code(t.as_str())
            ),
            Err(_) => format!(
                "None recorded: no run carried an egress tally, and {} is not a tier this build \
                 knows, so nothing says whether anything counted.",
                code(&tier)
            ),
        }
    };
    let _ = writeln!(out, "{text}\n");
    uncounted_egress(out, &uncounted);
}

/// What the runs' tallies say no counter saw, one line each: nothing counted there is not the
/// same as nothing attempted.
fn uncounted_egress(out: &mut String, uncounted: &std::collections::BTreeSet<&str>) {
    for what in uncounted {
        let _ = writeln!(out, "Not counted: {what}.\n");
    }
}

fn exit_text(e: &ExitOutcome) -> String {
    let mut s = if e.timed_out {
        "timed out (124)".to_string()
    } else if let Some(code) = e.code {
        format!("exit {code}")
    } else if let Some(sig) = e.signal {
        format!("killed by signal {sig} ({})", 128 + sig)
    } else {
        "ended without an exit status".to_string()
    };
    if e.oom_killed {
        s.push_str(", OOM-killed");
    }
    s
}

fn what_ran(
    out: &mut String,
    input: &ReportInput<'_>,
    redactor: &Redactor,
    c: &dyn Fn(&str) -> String,
) {
    let _ = writeln!(out, "{}\n", SECTIONS[1]);
    let mut runs = 0;
    let mut run_ms = None;
    let calls = tool_calls(&input.receipts.records);
    for r in &input.receipts.records {
        if let Some(call) = calls.iter().find(|k| k.records[0].record.seq == r.seq) {
            let _ = writeln!(out, "  - {}", call.line(c, run_ms));
        }
        if let Some(cmd) = as_shim_command(r) {
            let _ = writeln!(out, "  - {}", cmd.line(c, run_ms));
        }
        if let RecordBody::Run {
            argv,
            tier,
            exit,
            wall_ms,
            ..
        } = &r.body
        {
            runs += 1;
            run_ms = Some(r.at_ms);
            // Each argument is redacted before quoting, so quoting cannot split a value.
            let cmd: Vec<String> = argv.iter().map(|a| shell_quote(&c(a))).collect();
            let _ = writeln!(
                out,
                "- #{} {} at {}: {} — {} — {} ms",
                r.seq,
                lane_label(r),
                code(&c(tier)),
                code(&cmd.join(" ")),
                exit_text(exit),
                wall_ms
            );
        }
    }
    if runs == 0 {
        out.push_str("No run was recorded.\n");
    }
    out.push('\n');
    let claims: Vec<&ReceiptRecord> = input
        .receipts
        .records
        .iter()
        .filter(|r| {
            matches!(r.body, RecordBody::BoxClaimed { .. })
                && as_tool_call(r).is_none()
                && as_shim_command(r).is_none()
        })
        .collect();
    if !claims.is_empty() {
        out.push_str("Box-claimed records (the box's own account, not observed by h5i):\n\n");
        for r in claims {
            if let RecordBody::BoxClaimed {
                claimed_kind,
                claim,
            } = &r.body
            {
                // Redacted value by value before JSON escaping could split a secret.
                let mut claim = claim.clone();
                redact_value(redactor, &mut claim);
                let mut shown = c(&claim.to_string());
                if shown.chars().count() > CLAIM_SHOWN {
                    shown = shown.chars().take(CLAIM_SHOWN).collect::<String>() + " …";
                }
                let _ = writeln!(
                    out,
                    "- #{} {} {}: {}",
                    r.seq,
                    lane_label(r),
                    code(&c(claimed_kind)),
                    code(&shown)
                );
            }
        }
        out.push('\n');
    }
}

/// When the box says it staged `r` (the time in its spool entry's name,
/// `h5i_policy::receipt::STAGED_NS`), as ` at +S.mmm s` from the start of the run it
/// follows (`run_ms`); empty when either is unknown. The lines under a run are in this order
/// (the spool is ingested by it), so the hooks' and the shim's accounts read interleaved.
fn staged_at(r: &ReceiptRecord, run_ms: Option<u64>) -> String {
    let staged = match &r.body {
        RecordBody::BoxClaimed { claim, .. } => claim
            .get(h5i_policy::receipt::STAGED_NS)
            .and_then(Value::as_u64),
        _ => None,
    };
    match (staged, run_ms) {
        (Some(ns), Some(ms)) => {
            let from_start = i128::from(ns / 1_000_000) - i128::from(ms);
            let sign = if from_start < 0 { '-' } else { '+' };
            let abs = from_start.unsigned_abs();
            format!(" at {sign}{}.{:03} s", abs / 1000, abs % 1000)
        }
        _ => String::new(),
    }
}

/// A staged `tool-call` record's summary (see `crate::capture::read_staged`).
struct ToolRecord<'a> {
    record: &'a ReceiptRecord,
    event: Option<&'a str>,
    tool: Option<&'a str>,
    id: Option<&'a str>,
    what: Option<&'a str>,
    unparsed: bool,
    /// The box's hook says it cut the record's payload to fit the spool (`payload_cut`).
    cut: bool,
}

/// A box-claimed record's claim, when the record claims `kind`.
fn claim_of<'a>(r: &'a ReceiptRecord, kind: &str) -> Option<&'a Value> {
    match &r.body {
        RecordBody::BoxClaimed {
            claimed_kind,
            claim,
        } if claimed_kind == kind => Some(claim),
        _ => None,
    }
}

fn as_tool_call(r: &ReceiptRecord) -> Option<ToolRecord<'_>> {
    let claim = claim_of(r, h5i_hook::capture::KIND)?;
    let s = |k: &str| claim.get(k).and_then(Value::as_str);
    Some(ToolRecord {
        record: r,
        event: s("event"),
        tool: s("tool"),
        id: s("tool_use_id"),
        what: s("command").or(s("file_path")),
        unparsed: claim.get("unparsed").is_some_and(|u| u == true),
        cut: claim.get("payload_cut").is_some_and(|u| u == true),
    })
}

/// One tool call as the box claims it: its staged records (a PreToolUse and, once it
/// returned, a PostToolUse with the same call id), in log order.
struct ToolCall<'a> {
    records: Vec<ToolRecord<'a>>,
}

impl ToolCall<'_> {
    fn line(&self, c: &dyn Fn(&str) -> String, run_ms: Option<u64>) -> String {
        let first = &self.records[0];
        let seqs: Vec<String> = self
            .records
            .iter()
            .map(|r| format!("#{}", r.record.seq))
            .collect();
        let events: Vec<&str> = self
            .records
            .iter()
            .map(|r| r.event.unwrap_or("(no event)"))
            .collect();
        let what = match (first.tool, first.what) {
            _ if first.unparsed && first.cut => {
                "(a staged record the box's hook cut short, which h5i could not read)".to_string()
            }
            _ if first.unparsed => "(a staged record h5i could not read)".to_string(),
            (Some(tool), Some(what)) => {
                let mut what = c(what);
                if what.chars().count() > CLAIM_SHOWN {
                    what = what.chars().take(CLAIM_SHOWN).collect::<String>() + " …";
                }
                format!("{}: {}", code(&c(tool)), code(&what))
            }
            (Some(tool), None) => code(&c(tool)),
            (None, _) => "(no tool named)".to_string(),
        };
        format!(
            "{}{} {} {what} — {}",
            seqs.join(", "),
            staged_at(first.record, run_ms),
            lane_label(first.record),
            c(&events.join(", "))
        )
    }

    /// What the box's own account leaves out: a call it says started and never says ended,
    /// or ended without starting, or a record h5i could not read.
    fn gap(&self, c: &dyn Fn(&str) -> String) -> Option<String> {
        let first = &self.records[0];
        let tool = code(&c(first.tool.unwrap_or("?")));
        let has = |e: &str| self.records.iter().any(|r| r.event == Some(e));
        if first.unparsed && first.cut {
            return Some(format!(
                "- record #{}: a staged tool call the box's hook cut short to fit its spool, so h5i could not read which call it was",
                first.record.seq
            ));
        }
        if first.unparsed {
            return Some(format!(
                "- record #{}: a staged tool call h5i could not read (not the hook's JSON)",
                first.record.seq
            ));
        }
        match (has("PreToolUse"), has("PostToolUse")) {
            (true, false) => Some(format!(
                "- record #{}: the box claims the {tool} call started and never claims it ended (no PostToolUse): what the box says ran and what ran may differ",
                first.record.seq
            )),
            (false, true) => Some(format!(
                "- record #{}: the box claims the {tool} call ended and never claims it started (no PreToolUse): what the box says ran and what ran may differ",
                first.record.seq
            )),
            _ => None,
        }
    }
}

/// A `tee-shim` `command` record's summary (see `crate::capture::read_command`).
struct ShimCommand<'a> {
    record: &'a ReceiptRecord,
    command: Option<&'a str>,
    cwd: Option<&'a str>,
    exit: Option<i64>,
    signal: Option<i64>,
}

fn as_shim_command(r: &ReceiptRecord) -> Option<ShimCommand<'_>> {
    let claim = claim_of(r, h5i_hook::tee_shim::KIND).filter(|_| r.lane == ReceiptLane::TeeShim)?;
    let unparsed = claim.get("unparsed").is_some_and(|u| u == true);
    let s = |k: &str| claim.get(k).and_then(Value::as_str).filter(|_| !unparsed);
    Some(ShimCommand {
        record: r,
        command: s("command"),
        cwd: s("cwd"),
        exit: claim.get("exit").and_then(Value::as_i64),
        signal: claim.get("signal").and_then(Value::as_i64),
    })
}

impl ShimCommand<'_> {
    fn line(&self, c: &dyn Fn(&str) -> String, run_ms: Option<u64>) -> String {
        let at = staged_at(self.record, run_ms);
        let Some(command) = self.command else {
            return format!(
                "#{}{at} {} (a staged command h5i could not read)",
                self.record.seq,
                lane_label(self.record)
            );
        };
        let what = shown(c, command);
        let ended = match (self.exit, self.signal) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => "no exit claimed".to_string(),
        };
        format!(
            "#{}{at} {} {} — {ended} in {}",
            self.record.seq,
            lane_label(self.record),
            code(&what),
            code(&c(self.cwd.unwrap_or("?")))
        )
    }
}

/// Box-supplied text as the report shows it inline: escaped, cut to [`CLAIM_SHOWN`].
fn shown(c: &dyn Fn(&str) -> String, text: &str) -> String {
    let what = c(text);
    if what.chars().count() > CLAIM_SHOWN {
        what.chars().take(CLAIM_SHOWN).collect::<String>() + " …"
    } else {
        what
    }
}

/// Where the box's two accounts of what ran disagree, per run (the records between one
/// host-observed run and the next): each `Bash` call its hooks claim should have the shim's
/// record of the same command, and each shim record a `Bash` call; with no shim in the box,
/// every `tee-shim` record is forged. A shim record h5i could not read is a finding too.
fn shim_gaps(input: &ReportInput<'_>, c: &dyn Fn(&str) -> String) -> Vec<String> {
    let records = &input.receipts.records;
    let mut problems = Vec::new();
    if let (true, Some(why)) = (input.tee_shim, input.shim_not_agent_shell) {
        problems.push(format!(
            "- the cross-check of the hooks' `Bash` calls against the shell shim's commands does not apply to this box: {}",
            c(why)
        ));
    }
    let mut segments: Vec<&[ReceiptRecord]> = Vec::new();
    let mut from = 0;
    for (i, r) in records.iter().enumerate() {
        if matches!(r.body, RecordBody::Run { .. }) {
            segments.push(&records[from..i]);
            from = i;
        }
    }
    segments.push(&records[from..]);
    for seg in segments {
        let shim: Vec<ShimCommand<'_>> = seg.iter().filter_map(as_shim_command).collect();
        if !input.tee_shim {
            problems.extend(shim.iter().map(|s| {
                format!(
                    "- record #{}: a `tee-shim` record, but h5i binds no shell shim into this box: the box forged it",
                    s.record.seq
                )
            }));
            continue;
        }
        // A run of the agent, or one whose box claims tool calls: each command should be in
        // both accounts. (A person's `box run -- bash -c ...` has a shim record and no call.)
        let agent_run = seg.first().is_some_and(|r| {
            matches!(&r.body, RecordBody::Run { argv, .. }
                if argv.first().is_some_and(|a| a.rsplit('/').next() == Some("codex")))
        });
        let calls = tool_calls(seg);
        let cross_check = input.shim_not_agent_shell.is_none() && (agent_run || !calls.is_empty());
        let mut unmatched: Vec<&ShimCommand<'_>> = Vec::new();
        for s in &shim {
            if s.command.is_none() {
                problems.push(format!(
                    "- record #{}: a staged command h5i could not read (not the shell shim's shape)",
                    s.record.seq
                ));
            } else {
                unmatched.push(s);
            }
        }
        if !cross_check {
            continue;
        }
        for call in &calls {
            let first = &call.records[0];
            if first.tool != Some("Bash") || first.unparsed {
                continue;
            }
            let Some(cmd) = first.what else { continue };
            match unmatched.iter().position(|s| s.command == Some(cmd)) {
                Some(at) => {
                    unmatched.remove(at);
                }
                None => problems.push(format!(
                    "- record #{}: the box's hooks claim the `Bash` call {} ran, and its shell shim recorded no such command: what the box says ran and what ran may differ",
                    first.record.seq,
                    code(&shown(c, cmd))
                )),
            }
        }
        problems.extend(unmatched.iter().map(|s| {
            format!(
                "- record #{}: the shell shim recorded {}, which no tool call the box claims ran: what the box says ran and what ran may differ",
                s.record.seq,
                code(&shown(c, s.command.unwrap_or("")))
            )
        }));
    }
    problems
}

/// Where a box-claimed record's staging time (the time in its spool entry's name, the box's
/// claim) disagrees with what h5i observed: before the start of the run it was ingested after,
/// or after h5i ingested it (the record's own time). Both clocks are the host kernel's at every
/// tier but the microVM's (its guest keeps its own), so there the times are not compared.
fn staged_outside_runs(records: &[ReceiptRecord]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut run: Option<&ReceiptRecord> = None;
    for r in records {
        if let RecordBody::Run { tier, .. } = &r.body {
            run = (r.lane.is_host_observed() && tier != Tier::Microvm.as_str()).then_some(r);
            continue;
        }
        let (Some(run), RecordBody::BoxClaimed { claim, .. }) = (run, &r.body) else {
            continue;
        };
        let Some(ns) = claim
            .get(h5i_policy::receipt::STAGED_NS)
            .and_then(Value::as_u64)
        else {
            continue;
        };
        let staged_ms = ns / 1_000_000;
        let when = h5i_policy::receipt::rfc3339_utc(staged_ms, true);
        if staged_ms < run.at_ms {
            problems.push(format!(
                "- record #{}: the box claims it staged this record at {when}, before run #{} started ({}, observed by h5i): what the box says ran and what ran may differ",
                r.seq,
                run.seq,
                h5i_policy::receipt::rfc3339_utc(run.at_ms, true)
            ));
        } else if staged_ms > r.at_ms {
            problems.push(format!(
                "- record #{}: the box claims it staged this record at {when}, after h5i ingested it ({}): what the box says ran and what ran may differ",
                r.seq,
                h5i_policy::receipt::rfc3339_utc(r.at_ms, true)
            ));
        }
    }
    problems
}

/// Every staged tool call in log order, each with its records (grouped by call id within
/// the records between two host-observed runs).
fn tool_calls(records: &[ReceiptRecord]) -> Vec<ToolCall<'_>> {
    let mut calls: Vec<ToolCall<'_>> = Vec::new();
    let mut open_from = 0;
    for r in records {
        if matches!(r.body, RecordBody::Run { .. }) {
            open_from = calls.len();
            continue;
        }
        let Some(t) = as_tool_call(r) else {
            continue;
        };
        let same = t.id.and_then(|id| {
            calls[open_from..]
                .iter_mut()
                .find(|k| k.records[0].id == Some(id))
        });
        match same {
            Some(call) => call.records.push(t),
            None => calls.push(ToolCall { records: vec![t] }),
        }
    }
    calls
}

/// Each drain of the box's browser, after the run it follows: what it visited and what went
/// wrong there, every URL and message escaped and in code spans; an `unavailable` drain says so
/// (no browser answered), never reads as a clean page.
fn browser_saw(out: &mut String, input: &ReportInput<'_>, c: &dyn Fn(&str) -> String) {
    let _ = writeln!(out, "{}\n", SECTIONS[2]);
    let mut any = false;
    for r in &input.receipts.records {
        if let RecordBody::Browser { .. } = r.body {
            any = true;
            let line = r.body.between_runs_line();
            let _ = writeln!(out, "- {}: {}", lane_label(r), code(&c(&line)));
            continue;
        }
        let (
            RecordBody::Page {
                after_seq, state, ..
            },
            Some(lists),
        ) = (&r.body, r.body.page_findings())
        else {
            continue;
        };
        any = true;
        let head = format!("- after run #{after_seq}, {}", lane_label(r));
        if state != "observed" {
            let _ = writeln!(
                out,
                "{head}: **unavailable** — the run could drive the browser and no browser \
                 answered, so nothing was observed (this is not a clean page)"
            );
            continue;
        }
        let counts: Vec<String> = lists
            .iter()
            .map(|(what, items)| format!("{what}: {}", items.len()))
            .collect();
        let _ = writeln!(out, "{head}: {}", counts.join(", "));
        for (what, items) in lists {
            for i in items {
                let _ = writeln!(out, "  - {what}: {}", code(&c(i)));
            }
        }
        let found: usize = lists[1..].iter().map(|(_, items)| items.len()).sum();
        if found == 0 {
            let _ = writeln!(out, "  - nothing new went wrong on the page");
        }
    }
    if any {
        out.push('\n');
    } else {
        out.push_str(
            "No browser observation recorded. h5i records console errors, uncaught exceptions and \
             failed requests itself after a run that drives the box's browser; this log holds \
             none, so nothing here says the page was clean.\n\n",
        );
    }
}

fn viewer_sessions(out: &mut String, input: &ReportInput<'_>, c: &dyn Fn(&str) -> String) {
    let _ = writeln!(out, "{}\n", SECTIONS[3]);
    let viewer: Vec<&ReceiptRecord> = input
        .receipts
        .records
        .iter()
        .filter(|r| r.lane == h5i_policy::receipt::ReceiptLane::Viewer)
        .collect();
    if viewer.is_empty() {
        out.push_str("None recorded.\n\n");
        return;
    }
    for r in viewer {
        let what = match &r.body {
            RecordBody::Run { .. } => "run".to_string(),
            RecordBody::BoxClaimed { .. } => "record".to_string(),
            RecordBody::Quarantined { .. } => "quarantined entry".to_string(),
            RecordBody::Page { .. } => "page record".to_string(),
            RecordBody::Browser { .. } => "browser record".to_string(),
            RecordBody::Control { action, holder, by } => format!(
                "browser {} by {}: {} holds control",
                c(action),
                code(&c(by)),
                c(holder)
            ),
            RecordBody::ViewerSession { .. } => c(&r.body.viewer_session_line()),
        };
        let _ = writeln!(out, "- #{} {} {what}", r.seq, lane_label(r));
    }
    out.push('\n');
}

fn excluded(out: &mut String, input: &ReportInput<'_>, c: &dyn Fn(&str) -> String) {
    let _ = writeln!(out, "{}\n", SECTIONS[5]);
    if input.gated.excluded.is_empty() {
        out.push_str("Nothing was excluded.\n\n");
        return;
    }
    for e in &input.gated.excluded {
        let _ = writeln!(
            out,
            "- {} — {}",
            code(&c(&e.path)),
            c(&e.reason.to_string())
        );
    }
    out.push('\n');
}

fn evidence_problems(out: &mut String, input: &ReportInput<'_>, c: &dyn Fn(&str) -> String) {
    let _ = writeln!(out, "{}\n", SECTIONS[6]);
    let mut problems = Vec::new();
    for d in &input.receipts.damaged {
        problems.push(format!(
            "- receipts.jsonl line {}: {}",
            d.line,
            c(&d.problem)
        ));
    }
    let mut prev: Option<u64> = None;
    for r in &input.receipts.records {
        let expected = prev.map_or(1, |p| p + 1);
        if r.seq > expected {
            problems.push(format!(
                "- a gap in the log: record(s) #{expected}..#{} are missing",
                r.seq - 1
            ));
        } else if r.seq < expected {
            problems.push(format!(
                "- record #{} follows #{}: repeated or out of order",
                r.seq,
                expected - 1
            ));
        }
        prev = Some(r.seq.max(prev.unwrap_or(0)));
        if r.policy_digest != input.policy_digest {
            problems.push(format!(
                "- record #{} was written under policy digest {}, not this box's",
                r.seq,
                code(&c(&r.policy_digest))
            ));
        }
        if let RecordBody::Quarantined { entry, reason } = &r.body {
            problems.push(format!(
                "- record #{}: spool entry {} was refused ({})",
                r.seq,
                code(&c(entry)),
                c(reason)
            ));
        }
    }
    problems.extend(
        tool_calls(&input.receipts.records)
            .iter()
            .filter_map(|k| k.gap(c)),
    );
    problems.extend(shim_gaps(input, c));
    problems.extend(staged_outside_runs(&input.receipts.records));
    let host_runs = input
        .receipts
        .records
        .iter()
        .filter(|r| r.lane.is_host_observed() && matches!(r.body, RecordBody::Run { .. }))
        .count();
    let claimed = input
        .receipts
        .records
        .iter()
        .filter(|r| !r.lane.is_host_observed())
        .count();
    if claimed > 0 && host_runs == 0 {
        problems.push(format!(
            "- {claimed} box-claimed record(s) and no host-observed run: nothing here was seen by h5i itself"
        ));
    }
    if problems.is_empty() {
        let _ = writeln!(
            out,
            "None found: {} record(s) read, no damaged line, no gap in the sequence.\n",
            input.receipts.records.len()
        );
    } else {
        for p in problems {
            let _ = writeln!(out, "{p}");
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use h5i_broker::receipt_log::DamagedLine;
    use h5i_broker::redact::SecretValue;
    use h5i_policy::receipt::EgressTally;

    fn run(
        seq: u64,
        lane: ReceiptLane,
        argv: &[&str],
        egress: Option<EgressTally>,
    ) -> ReceiptRecord {
        ReceiptRecord {
            v: 1,
            seq,
            lane,
            at_ms: 0,
            policy_digest: "sha256:d".into(),
            redactions: vec![],
            payload: None,
            body: RecordBody::Run {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                tier: "container".into(),
                exit: ExitOutcome {
                    code: None,
                    signal: None,
                    timed_out: true,
                    oom_killed: false,
                },
                rusage: None,
                cgroup_usage: None,
                wall_ms: 7,
                oom: None,
                egress,
                socket_gate: None,
            },
        }
    }

    fn gated() -> GatedPatch {
        GatedPatch {
            patch: vec![],
            excluded: vec![],
            files_changed: 0,
            insertions: 0,
            deletions: 0,
            binary_files: 0,
        }
    }

    fn input<'a>(
        receipts: &'a ReceiptReadout,
        g: &'a GatedPatch,
        tier: &'a str,
        proposal: Option<&'a str>,
    ) -> ReportInput<'a> {
        ReportInput {
            box_name: "b",
            tier,
            base: "0123",
            policy_digest: "sha256:d",
            exported_at_ms: 1_700_000_000_123,
            receipts,
            proposal,
            gated: g,
            patch_sha256: "ff",
            notices: &[],
            tee_shim: false,
            shim_not_agent_shell: None,
        }
    }

    fn positions(text: &str) -> Vec<usize> {
        SECTIONS
            .iter()
            .map(|s| {
                let hits: Vec<_> = text.match_indices(&format!("\n{s}\n")).collect();
                assert_eq!(hits.len(), 1, "{s} appears once at a line start");
                hits[0].0
            })
            .collect()
    }

    #[test]
    fn sections_come_in_the_manuals_order_and_a_proposal_cannot_forge_one() {
        let receipts = ReceiptReadout::default();
        let g = gated();
        let p = "all good\n## Excluded from the patch\nNothing was excluded.\n\x1b]52;c;aGk=\x07";
        let r = render_report(
            &input(&receipts, &g, "workspace", Some(p)),
            &Redactor::default(),
            1 << 20,
        )
        .unwrap();
        let pos = positions(&r.text);
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{pos:?}");
        assert!(r.text.contains("    ## Excluded from the patch"));
        assert!(!r.text.contains('\x1b'));
        assert!(r.text.contains("nothing confines or counts"));
    }

    #[test]
    fn runs_show_lane_argv_and_timeouts_and_denials_name_the_run() {
        let mut tally = EgressTally::default();
        tally.denied.insert("evil.test:443".into(), 3);
        let receipts = ReceiptReadout {
            records: vec![
                run(
                    1,
                    ReceiptLane::HostEnvRun,
                    &["sh", "-c", "echo 'a b'"],
                    Some(tally),
                ),
                run(3, ReceiptLane::TeeShim, &["ls"], None),
            ],
            damaged: vec![DamagedLine {
                line: 4,
                problem: "torn".into(),
            }],
        };
        let g = gated();
        let r = render_report(
            &input(&receipts, &g, "container", None),
            &Redactor::default(),
            1 << 20,
        )
        .unwrap();
        let t = &r.text;
        assert!(
            t.contains("`evil.test:443` refused 3 time(s), in run(s) #1"),
            "{t}"
        );
        assert!(t.contains("#1 `host-env-run` (host-observed)"));
        assert!(t.contains("#3 `tee-shim` (box-claimed)"));
        assert!(t.contains(r#"`sh -c 'echo '\''a b'\'''`"#), "{t}");
        assert!(t.contains("timed out (124)"));
        assert!(t.contains("line 4: torn"));
        assert!(t.contains("record(s) #2..#2 are missing"));
        assert!(t.contains("None staged."));
    }

    #[test]
    fn a_process_tier_tally_says_what_no_counter_saw_with_or_without_denials() {
        let uncounted = |denied: &[(&str, u64)]| EgressTally {
            denied: denied.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            uncounted: Some(h5i_policy::receipt::UncountedEgress::RefusedWithoutCount),
            ..EgressTally::default()
        };
        let g = gated();
        for (tally, listed) in [
            (uncounted(&[("`api.openai.com:443` refused", 1)]), true),
            (uncounted(&[]), false),
        ] {
            let receipts = ReceiptReadout {
                records: vec![run(1, ReceiptLane::HostEnvRun, &["claude"], Some(tally))],
                damaged: vec![],
            };
            let r = render_report(
                &input(&receipts, &g, "process", None),
                &Redactor::default(),
                1 << 20,
            )
            .unwrap();
            let section = r.text.split(SECTIONS[1]).next().unwrap();
            assert_eq!(section.contains("api.openai.com:443"), listed, "{section}");
            assert!(!section.contains("egress allowlist"), "{section}");
            assert!(
                section.contains(
                    "Not counted: connections the box makes itself are refused by the kernel"
                ),
                "{section}"
            );
        }
    }

    fn staged(seq: u64, event: &str, tool: &str, id: &str, what: &str) -> ReceiptRecord {
        let mut r = run(seq, ReceiptLane::InboxCapture, &[], None);
        r.body = RecordBody::BoxClaimed {
            claimed_kind: "tool-call".into(),
            claim: serde_json::json!({"kind": "tool-call", "event": event, "tool": tool,
                                      "tool_use_id": id, "command": what}),
        };
        r
    }

    #[test]
    fn tool_calls_are_listed_under_their_run_in_order_and_a_half_claimed_call_is_a_finding() {
        let mut unread = run(7, ReceiptLane::InboxCapture, &[], None);
        unread.body = RecordBody::BoxClaimed {
            claimed_kind: "tool-call".into(),
            claim: serde_json::json!({"kind": "tool-call", "unparsed": true}),
        };
        let receipts = ReceiptReadout {
            records: vec![
                run(1, ReceiptLane::HostEnvRun, &["claude", "-p", "x"], None),
                staged(2, "PreToolUse", "Bash", "t1", "make test"),
                staged(3, "PostToolUse", "Bash", "t1", "make test"),
                staged(4, "PreToolUse", "Edit", "t2", "/work/a.txt"),
                staged(5, "PostToolUse", "Edit", "t2", "/work/a.txt"),
                staged(6, "PreToolUse", "Bash", "t3", "curl \x1b[2J"),
                unread,
            ],
            damaged: vec![],
        };
        let g = gated();
        let r = render_report(
            &input(&receipts, &g, "process", None),
            &Redactor::default(),
            1 << 20,
        )
        .unwrap();
        let t = &r.text;
        let ran = t
            .split(SECTIONS[1])
            .nth(1)
            .unwrap()
            .split("\n## ")
            .next()
            .unwrap();
        let lines: Vec<&str> = ran.lines().filter(|l| l.contains('#')).collect();
        assert!(
            lines[0].starts_with("- #1 `host-env-run` (host-observed)"),
            "{ran}"
        );
        assert_eq!(
            lines[1],
            "  - #2, #3 `inbox-capture` (box-claimed) `Bash`: `make test` — PreToolUse, PostToolUse"
        );
        assert_eq!(
            lines[2],
            "  - #4, #5 `inbox-capture` (box-claimed) `Edit`: `/work/a.txt` — PreToolUse, PostToolUse"
        );
        assert!(
            lines[3].starts_with("  - #6 `inbox-capture` (box-claimed) `Bash`"),
            "{ran}"
        );
        assert!(!t.contains('\x1b'));
        assert!(
            lines[4].contains("(a staged record h5i could not read)"),
            "{ran}"
        );
        assert!(!ran.contains("Box-claimed records"), "{ran}");
        let problems = t.split(SECTIONS[6]).nth(1).unwrap();
        assert!(
            problems.contains(
                "record #6: the box claims the `Bash` call started and never claims it ended"
            ),
            "{problems}"
        );
        assert!(
            problems.contains("record #7: a staged tool call h5i could not read"),
            "{problems}"
        );
        assert!(!problems.contains("record #2"), "{problems}");
    }

    #[test]
    fn the_lanes_of_a_run_read_interleaved_each_line_with_its_lane_and_staging_time() {
        let at = |mut r: ReceiptRecord, ns: u64| {
            if let RecordBody::BoxClaimed { claim, .. } = &mut r.body {
                claim[h5i_policy::receipt::STAGED_NS] = ns.into();
            }
            r
        };
        let mut shim = run(3, ReceiptLane::TeeShim, &[], None);
        shim.body = RecordBody::BoxClaimed {
            claimed_kind: "command".into(),
            claim: serde_json::json!({"kind": "command", "lane": "tee-shim",
                "command": "make test", "cwd": "/work", "exit": 0, "signal": null}),
        };
        let mut start = run(1, ReceiptLane::HostEnvRun, &["codex", "exec", "x"], None);
        start.at_ms = 1_000_000;
        let receipts = ReceiptReadout {
            // In the order the spool was ingested: by the time in each entry's name.
            records: vec![
                start,
                at(
                    staged(2, "PreToolUse", "Bash", "t1", "make test"),
                    1_000_500_000_000,
                ),
                at(shim, 1_001_250_000_000),
                at(
                    staged(4, "PostToolUse", "Bash", "t1", "make test"),
                    1_001_300_000_000,
                ),
                // A time before the run's start (the box chose it) reads as such.
                at(
                    staged(5, "PreToolUse", "Edit", "t2", "/work/a"),
                    999_750_000_000,
                ),
                at(
                    staged(6, "PostToolUse", "Edit", "t2", "/work/a"),
                    1_002_000_000_000,
                ),
                // No time in its name: no time shown.
                staged(7, "PreToolUse", "Read", "t3", "/work/b"),
            ],
            damaged: vec![],
        };
        let g = gated();
        let mut i = input(&receipts, &g, "process", None);
        i.tee_shim = true;
        let r = render_report(&i, &Redactor::default(), 1 << 20).unwrap();
        let ran = r.text.split(SECTIONS[1]).nth(1).unwrap();
        let lines: Vec<&str> = ran.lines().filter(|l| l.contains(" #")).collect();
        assert_eq!(
            lines[1..5],
            [
                "  - #2, #4 at +0.500 s `inbox-capture` (box-claimed) `Bash`: `make test` — PreToolUse, PostToolUse",
                "  - #3 at +1.250 s `tee-shim` (box-claimed) `make test` — exit 0 in `/work`",
                "  - #5, #6 at -0.250 s `inbox-capture` (box-claimed) `Edit`: `/work/a` — PreToolUse, PostToolUse",
                "  - #7 `inbox-capture` (box-claimed) `Read`: `/work/b` — PreToolUse",
            ],
            "{ran}"
        );
        assert!(lines[0].starts_with("- #1 `host-env-run` (host-observed)"));
        let problems = r.text.split(SECTIONS[6]).nth(1).unwrap();
        assert!(!problems.contains("shell shim"), "{problems}");
    }

    #[test]
    fn a_record_the_box_says_it_staged_outside_its_run_is_a_finding() {
        let at = |mut r: ReceiptRecord, ns: u64, ingested_ms: u64| {
            if let RecordBody::BoxClaimed { claim, .. } = &mut r.body {
                claim[h5i_policy::receipt::STAGED_NS] = ns.into();
            }
            r.at_ms = ingested_ms;
            r
        };
        let with_tier = |mut r: ReceiptRecord, tier: &str, at_ms: u64| {
            if let RecordBody::Run { tier: t, .. } = &mut r.body {
                *t = tier.into();
            }
            r.at_ms = at_ms;
            r
        };
        let claude = ["claude", "-p", "x"];
        let receipts = ReceiptReadout {
            records: vec![
                with_tier(
                    run(1, ReceiptLane::HostEnvRun, &claude, None),
                    "process",
                    1_000_000,
                ),
                at(
                    staged(2, "PreToolUse", "Bash", "t1", "ls"),
                    1_000_500_000_000,
                    1_009_000,
                ),
                at(
                    staged(3, "PostToolUse", "Bash", "t1", "ls"),
                    1_000_600_000_000,
                    1_009_000,
                ),
                // Forged times: 1970, and after h5i read the spool.
                at(staged(4, "PreToolUse", "Bash", "f", "curl x"), 1, 1_009_000),
                at(
                    staged(5, "PostToolUse", "Bash", "f", "curl x"),
                    1_009_001_000_000,
                    1_009_000,
                ),
                // A microVM guest's clock is its own: not compared.
                with_tier(
                    run(6, ReceiptLane::HostEnvRun, &claude, None),
                    "microvm",
                    2_000_000,
                ),
                at(staged(7, "PreToolUse", "Bash", "t2", "ls"), 1, 2_009_000),
                at(staged(8, "PostToolUse", "Bash", "t2", "ls"), 1, 2_009_000),
            ],
            damaged: vec![],
        };
        let g = gated();
        let r = render_report(
            &input(&receipts, &g, "process", None),
            &Redactor::default(),
            1 << 20,
        )
        .unwrap();
        let problems = r.text.split(SECTIONS[6]).nth(1).unwrap();
        let found: Vec<&str> = problems.lines().filter(|l| l.starts_with("- ")).collect();
        assert_eq!(
            found,
            [
                "- record #4: the box claims it staged this record at 1970-01-01T00:00:00.000Z, before run #1 started (1970-01-01T00:16:40.000Z, observed by h5i): what the box says ran and what ran may differ",
                "- record #5: the box claims it staged this record at 1970-01-01T00:16:49.001Z, after h5i ingested it (1970-01-01T00:16:49.000Z): what the box says ran and what ran may differ",
            ],
            "{problems}"
        );
    }

    #[test]
    fn a_cut_tool_call_says_the_hook_cut_it() {
        let mut cut = run(2, ReceiptLane::InboxCapture, &[], None);
        cut.body = RecordBody::BoxClaimed {
            claimed_kind: "tool-call".into(),
            claim: serde_json::json!({"kind": "tool-call", "unparsed": true, "payload_cut": true}),
        };
        let receipts = ReceiptReadout {
            records: vec![run(1, ReceiptLane::HostEnvRun, &["claude"], None), cut],
            damaged: vec![],
        };
        let g = gated();
        let r = render_report(
            &input(&receipts, &g, "process", None),
            &Redactor::default(),
            1 << 20,
        )
        .unwrap();
        assert!(r.text.contains("  - #2 `inbox-capture` (box-claimed) (a staged record the box's hook cut short, which h5i could not read) — (no event)"), "{}", r.text);
        assert!(r.text.contains("- record #2: a staged tool call the box's hook cut short to fit its spool, so h5i could not read which call it was"), "{}", r.text);
    }

    #[test]
    fn a_box_whose_shim_is_not_the_agents_shell_says_so_and_finds_no_gap() {
        let receipts = ReceiptReadout {
            records: vec![
                run(1, ReceiptLane::HostEnvRun, &["codex", "exec", "x"], None),
                staged(2, "PreToolUse", "Bash", "t1", "make test"),
                staged(3, "PostToolUse", "Bash", "t1", "make test"),
            ],
            damaged: vec![],
        };
        let g = gated();
        let mut i = input(&receipts, &g, "container", None);
        i.tee_shim = true;
        let problems = |i: &ReportInput<'_>| {
            let r = render_report(i, &Redactor::default(), 1 << 20).unwrap();
            r.text.split(SECTIONS[6]).nth(1).unwrap().to_owned()
        };
        // The shim is the agent's shell: the call without the shim's record is a finding.
        assert!(
            problems(&i).contains("shell shim recorded no such command"),
            "{}",
            problems(&i)
        );
        i.shim_not_agent_shell = Some("the image's own /etc/passwd gives uid 7 `/bin/sh`\x1b");
        let said = problems(&i);
        assert!(
            said.contains("- the cross-check of the hooks' `Bash` calls against the shell shim's commands does not apply to this box: the image's own /etc/passwd gives uid 7 `/bin/sh`"),
            "{said}"
        );
        assert!(!said.contains("recorded no such command"), "{said}");
        assert!(!said.contains('\x1b'), "{said:?}");
    }

    #[test]
    fn only_the_proposal_is_cut_to_fit_the_cap() {
        let receipts = ReceiptReadout::default();
        let g = gated();
        let big = "word ".repeat(20_000);
        let full = render_report(
            &input(&receipts, &g, "process", Some(&big)),
            &Redactor::default(),
            1 << 20,
        )
        .unwrap();
        assert!(!full.proposal_truncated);
        let cap = full.text.len() / 4;
        let cut = render_report(
            &input(&receipts, &g, "process", Some(&big)),
            &Redactor::default(),
            cap,
        )
        .unwrap();
        assert!(cut.proposal_truncated);
        assert!(cut.text.len() <= cap);
        positions(&cut.text);
        assert!(cut.text.contains("the proposal was cut"));
        let err = render_report(
            &input(&receipts, &g, "process", Some(&big)),
            &Redactor::default(),
            200,
        )
        .unwrap_err();
        assert!(matches!(err, ExportError::ReportTooLarge { .. }));
    }

    #[test]
    fn secrets_are_redacted_everywhere_including_json_keys() {
        // Values with a quote and an apostrophe: JSON escaping and shell quoting must not split
        // them before the redactor sees them.
        let r = Redactor::new(vec![
            SecretValue::new("secret:T", "tok\"en"),
            SecretValue::new("secret:Q", "it's-s3cret"),
        ]);
        let mut claim = run(2, ReceiptLane::InboxCapture, &[], None);
        claim.body = RecordBody::BoxClaimed {
            claimed_kind: "note".into(),
            claim: serde_json::json!({ "said": "tok\"en", "it's-s3cret": 1 }),
        };
        let receipts = ReceiptReadout {
            records: vec![
                run(
                    1,
                    ReceiptLane::HostEnvRun,
                    &["curl", "-H", "x: tok\"en", "it's-s3cret"],
                    None,
                ),
                claim,
            ],
            damaged: vec![],
        };
        let g = gated();
        let i = input(&receipts, &g, "workspace", Some("my token is tok\"en"));
        let rep = render_report(&i, &r, 1 << 20).unwrap();
        assert!(
            !rep.text.contains("tok\"en") && !rep.text.contains("s3cret"),
            "{}",
            rep.text
        );
        assert!(rep.text.contains("[REDACTED:secret:Q]"));
        let json = render_receipt(&i, &r, 1 << 20).unwrap();
        let text = String::from_utf8(json).unwrap();
        assert!(
            !text.contains("tok\\\"en") && !text.contains("tok\"en") && !text.contains("s3cret")
        );
        assert!(text.contains("[REDACTED:secret:T]"));
        assert!(matches!(
            render_receipt(&i, &r, 10),
            Err(ExportError::ReceiptTooLarge { .. })
        ));
    }
}
