//! The host-observed record of a finished run: one `host-env-run` receipt and one event in the
//! box log, then the box-claimed records it staged in its spool, each redacted.
//!
//! Owns turning what a tier backend observed into the record, and the raw payloads stored
//! beside it (redacted, then capped at [`MAX_PAYLOAD_BYTES`] with a line that says it was cut;
//! a field the box's capture says it cut loses the start of a secret the cut went through).
//! Must never: write a figure the host did not observe, or a record (or spooled entry, or
//! payload) with a value the redactor knows.
//!
//! Guarded by the unit tests below and `tests/agent_claude.rs` (a real session's payloads).

use std::ffi::OsString;
use std::time::Duration;

use h5i_broker::redact::SecretValue;
use h5i_policy::receipt::{
    EgressTally, ExitOutcome, ReceiptLane, ReceiptRecord, RecordBody, STAGED_NS,
};
use h5i_policy::ResolvedPolicy;

use super::{Purpose, TierRun, Usage};
use crate::error::BoxError;
use crate::events::{self, Event};
use crate::store::{now_ms, StoredBox};

/// The result of a run, for the CLI to turn into an exit code.
#[derive(Debug)]
pub struct RunOutcome {
    /// How the command ended.
    pub exit: ExitOutcome,
    /// The receipt's sequence number.
    pub receipt_seq: u64,
    /// Wall time from start to reap.
    pub wall: Duration,
    /// The egress counts the receipt carries.
    pub egress: Option<EgressTally>,
}

/// Write the host-observed record of a finished run (its event named by `purpose`), with
/// `scrub` redacted beside the policy's secrets, then ingest what the box staged in its spool.
pub(crate) fn write(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    purpose: Purpose,
    argv: &[OsString],
    started_ms: u64,
    run: TierRun,
    scrub: Vec<SecretValue>,
) -> Result<RunOutcome, BoxError> {
    let TierRun {
        report,
        oom,
        egress,
        socket_gate,
        usage,
    } = run;
    let digest = sb.manifest.policy_digest.clone();
    let (rusage, cgroup_usage) = match usage {
        Usage::Supervisor => (Some(Box::new(report.rusage.clone())), None),
        Usage::Cgroup(usage) => (None, usage.map(Box::new)),
    };

    let mut exit = report.exit.clone();
    exit.oom_killed = oom.is_some()
        && (exit.signal == Some(libc::SIGKILL) || exit.code == Some(128 + libc::SIGKILL));
    let redactor = crate::secrets::redactor_with(policy, scrub);
    let mut redactions = Vec::new();
    let argv_text: Vec<String> = argv
        .iter()
        .map(|a| {
            let (clean, ids) = redactor.redact(&a.to_string_lossy());
            redactions.extend(ids);
            clean
        })
        .collect();
    redactions.sort();
    redactions.dedup();
    let record = ReceiptRecord {
        v: 0,
        seq: 0,
        lane: ReceiptLane::HostEnvRun,
        at_ms: started_ms,
        policy_digest: digest,
        redactions,
        payload: None,
        body: RecordBody::Run {
            argv: argv_text,
            tier: policy.tier.as_str().to_string(),
            exit: exit.clone(),
            rusage,
            cgroup_usage,
            wall_ms: report.wall.as_millis() as u64,
            oom,
            egress: egress.clone(),
            socket_gate,
        },
    };
    let log = h5i_broker::receipt_log::ReceiptLog::at(sb.paths.receipts());
    let written = log.append(record)?;
    ingest_spool(sb, &log, &redactor)?;
    events::append(
        &sb.paths,
        &Event::new(
            purpose.event(),
            format!(
                "receipt {} exit {}{}",
                written.seq,
                exit.passthrough_code(),
                if exit.timed_out {
                    " (wall-clock limit)"
                } else if exit.oom_killed {
                    " (OOM-killed)"
                } else {
                    ""
                }
            ),
        ),
    )?;
    Ok(RunOutcome {
        exit,
        receipt_seq: written.seq,
        wall: report.wall,
        egress,
    })
}

/// Turn what the box staged in its spool into box-claimed records (or quarantine records), each
/// redacted, then clear the ingested entries.
fn ingest_spool(
    sb: &StoredBox,
    log: &h5i_broker::receipt_log::ReceiptLog,
    redactor: &h5i_broker::redact::Redactor,
) -> Result<(), BoxError> {
    let entries = h5i_hook::spool::ingest(&sb.paths.spool()).map_err(|e| BoxError::Io {
        path: e.path.clone(),
        source: e.source,
    })?;
    for (i, entry) in entries.into_iter().enumerate() {
        let at_ms = now_ms();
        let (staged, cut_ids) = scrub_cut_fields(entry.body.clone(), redactor);
        // The raw payload the hook staged (not the shim's, whose stored payload is h5i's JSON of
        // its output heads; its cuts are in the record's claim) ends with the box's cut marker.
        let box_cut = says_cut(&staged, "payload");
        let (body, raw) = match with_staged_time(staged, entry.staged_ns) {
            RecordBody::BoxClaimed {
                claimed_kind,
                claim,
            } if claimed_kind == h5i_hook::capture::KIND => {
                let (claim, raw) = crate::capture::read_staged(claim);
                let body = RecordBody::BoxClaimed {
                    claimed_kind,
                    claim,
                };
                (body, raw)
            }
            RecordBody::BoxClaimed {
                claimed_kind,
                claim,
            } if claimed_kind == h5i_hook::tee_shim::KIND
                && entry.lane == h5i_policy::receipt::ReceiptLane::TeeShim =>
            {
                let (claim, raw) = crate::capture::read_command(claim);
                let body = RecordBody::BoxClaimed {
                    claimed_kind,
                    claim,
                };
                (body, raw)
            }
            body => (body, None),
        };
        let (body, mut redactions) = redact_body(body, redactor);
        redactions.extend(cut_ids);
        let payload = match raw {
            Some(raw) => Some(store_payload(
                sb,
                entry.lane,
                at_ms,
                i,
                &stored_payload(&raw, box_cut, redactor, &mut redactions),
            )?),
            None => None,
        };
        redactions.sort();
        redactions.dedup();
        log.append(ReceiptRecord {
            v: 0,
            seq: 0,
            lane: entry.lane,
            at_ms,
            policy_digest: sb.manifest.policy_digest.clone(),
            redactions,
            payload,
            body,
        })?;
        h5i_hook::spool::remove(&entry);
    }
    Ok(())
}

/// A box-claimed body with the time its entry's name says it was staged put in its claim as
/// [`STAGED_NS`] (h5i's reading of the box's name, so box-claimed like the rest; a value the
/// box wrote under that key itself is dropped), for report.md to order and place it by.
fn with_staged_time(body: RecordBody, staged_ns: Option<u64>) -> RecordBody {
    match body {
        RecordBody::BoxClaimed {
            claimed_kind,
            mut claim,
        } => {
            if let Some(obj) = claim.as_object_mut() {
                obj.remove(STAGED_NS);
                if let Some(ns) = staged_ns {
                    obj.insert(STAGED_NS.into(), ns.into());
                }
            }
            RecordBody::BoxClaimed {
                claimed_kind,
                claim,
            }
        }
        other => other,
    }
}

/// Largest raw payload stored per record, bytes, with its cut marker (a staged entry is
/// smaller still, but redaction can grow a payload, and the tee shim's JSON escapes do).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// The line a stored payload ends with when the box's capture hook says it cut the payload
/// short before staging it (`payload_cut`): box-claimed, like the payload. (The shim's cuts,
/// `stdout_cut`/`stderr_cut`/`command_cut`, are in its record's claim: its stored payload is
/// h5i's JSON of the output heads.)
pub const BOX_CUT_MARKER: &str =
    "\n[h5i: the box's capture says it cut this payload short before staging it; the rest never reached h5i]\n";

/// The start of the line a stored payload ends with when h5i cut it to [`MAX_PAYLOAD_BYTES`].
pub const HOST_CUT_MARKER: &str = "\n[h5i: cut to fit the stored payload's cap of";

/// The claim's fields the box's capture says it cut short (`<field>_cut: true`), each with
/// every secret value scrubbed, including the start of one the cut went through
/// (`Redactor::redact_cut`); the body and the rule ids that fired. (After this the whole
/// record is redacted again, which finds nothing more in these fields.)
fn scrub_cut_fields(
    body: RecordBody,
    redactor: &h5i_broker::redact::Redactor,
) -> (RecordBody, Vec<String>) {
    let RecordBody::BoxClaimed {
        claimed_kind,
        mut claim,
    } = body
    else {
        return (body, Vec::new());
    };
    let mut ids = Vec::new();
    if let Some(obj) = claim.as_object_mut() {
        for field in CUT_FIELDS {
            let cut = obj.get(&format!("{field}_cut")) == Some(&serde_json::Value::Bool(true));
            if let (true, Some(serde_json::Value::String(text))) = (cut, obj.get_mut(*field)) {
                let (clean, fired) = redactor.redact_cut(text);
                *text = clean;
                ids.extend(fired);
            }
        }
    }
    (
        RecordBody::BoxClaimed {
            claimed_kind,
            claim,
        },
        ids,
    )
}

/// The fields a box's capture cuts to fit the spool (`h5i_hook::capture`, `h5i_hook::tee_shim`).
const CUT_FIELDS: &[&str] = &["payload", "stdout", "stderr", "command"];

/// Whether a staged record's claim says its `field` was cut short.
fn says_cut(body: &RecordBody, field: &str) -> bool {
    match body {
        RecordBody::BoxClaimed { claim, .. } => {
            claim.get(format!("{field}_cut")) == Some(&serde_json::Value::Bool(true))
        }
        _ => false,
    }
}

/// A box-staged raw payload as h5i stores it: redacted (a value's start or end standing alone,
/// where the agent or its tools cut it, too: `Redactor::redact_parts`; and the start of a value
/// the box's own cut went through, when `box_cut`), then cut to [`MAX_PAYLOAD_BYTES`] on a character
/// boundary; a payload the box cut ends with [`BOX_CUT_MARKER`], one h5i cut with a line
/// starting [`HOST_CUT_MARKER`] that says how much it kept. Cutting after redaction keeps
/// every value whole for the redactor.
fn stored_payload(
    raw: &str,
    box_cut: bool,
    redactor: &h5i_broker::redact::Redactor,
    redactions: &mut Vec<String>,
) -> String {
    let (mut clean, ids) = match box_cut {
        true => redactor.redact_cut(raw),
        false => redactor.redact_parts(raw),
    };
    redactions.extend(ids);
    let box_marker = if box_cut { BOX_CUT_MARKER } else { "" };
    let whole = clean.len();
    if whole + box_marker.len() <= MAX_PAYLOAD_BYTES {
        clean.push_str(box_marker);
        return clean;
    }
    // The host's marker with the widest figures it can hold, so the cut leaves room for it.
    let host_marker = |kept: usize| {
        format!("{HOST_CUT_MARKER} {MAX_PAYLOAD_BYTES} bytes: {kept} of {whole} bytes kept]\n")
    };
    let room = MAX_PAYLOAD_BYTES - box_marker.len() - host_marker(whole).len();
    let mut end = room.min(whole);
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    clean.truncate(end);
    clean.push_str(box_marker);
    clean.push_str(&host_marker(end));
    clean
}

/// Store a payload ([`stored_payload`]) under the box's `payloads/`; its file name (h5i's,
/// never the box's), for the record to name.
fn store_payload(
    sb: &StoredBox,
    lane: h5i_policy::receipt::ReceiptLane,
    at_ms: u64,
    index: usize,
    payload: &str,
) -> Result<String, BoxError> {
    let name = format!("{}-{at_ms}-{index}.txt", lane.as_str());
    let dir = sb.paths.payloads();
    std::fs::create_dir_all(&dir).map_err(|e| BoxError::io(&dir, e))?;
    crate::store::write_atomic(&dir.join(&name), payload.as_bytes())?;
    Ok(name)
}

/// A box-supplied record with every secret value scrubbed, and every value's start or end
/// standing alone (`Redactor::redact_parts`), in each string of the record (keys too) as
/// parsed: in the record's JSON text a value holding `"` or `\` is escaped and no longer
/// matches itself.
fn redact_body(
    body: RecordBody,
    redactor: &h5i_broker::redact::Redactor,
) -> (RecordBody, Vec<String>) {
    let Ok(mut value) = serde_json::to_value(&body) else {
        return (body, Vec::new());
    };
    let mut ids = Vec::new();
    redact_strings(redactor, &mut value, &mut ids);
    if ids.is_empty() {
        return (body, ids);
    }
    match serde_json::from_value(value) {
        Ok(b) => (b, ids),
        Err(_) => (
            RecordBody::Quarantined {
                entry: "(redacted record)".into(),
                reason: "held a secret value and could not be re-read after redaction".into(),
            },
            ids,
        ),
    }
}

/// Scrub every string in `v` (keys and values) with `Redactor::redact_parts`, the rules that
/// fired added to `ids`.
fn redact_strings(
    redactor: &h5i_broker::redact::Redactor,
    v: &mut serde_json::Value,
    ids: &mut Vec<String>,
) {
    use serde_json::Value;
    let scrub = |s: &str, ids: &mut Vec<String>| {
        let (clean, fired) = redactor.redact_parts(s);
        let changed = !fired.is_empty();
        ids.extend(fired);
        changed.then_some(clean)
    };
    match v {
        Value::String(s) => {
            if let Some(clean) = scrub(s, ids) {
                *s = clean;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| redact_strings(redactor, x, ids)),
        Value::Object(o) => {
            for (k, mut x) in std::mem::take(o) {
                redact_strings(redactor, &mut x, ids);
                let k = scrub(&k, ids).unwrap_or(k);
                o.insert(k, x);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use h5i_broker::redact::{Redactor, SecretValue};

    const DUMMY: &str = "h5i-dummy-00112233445566778899aabbccddeeff";

    fn redactor() -> Redactor {
        Redactor::new(vec![SecretValue::new("credential-dummy:K", DUMMY)])
    }

    #[test]
    fn a_payload_over_the_cap_is_cut_and_says_so() {
        let mut ids = Vec::new();
        let raw = format!("{DUMMY} {}", "x".repeat(3 * MAX_PAYLOAD_BYTES));
        let got = stored_payload(&raw, false, &redactor(), &mut ids);
        assert!(got.len() <= MAX_PAYLOAD_BYTES, "{}", got.len());
        assert!(got.starts_with("[REDACTED:credential-dummy:K] xxx"));
        let whole = raw.len() - DUMMY.len() + "[REDACTED:credential-dummy:K]".len();
        let at = got.rfind(HOST_CUT_MARKER).unwrap();
        assert_eq!(
            &got[at..],
            format!("{HOST_CUT_MARKER} {MAX_PAYLOAD_BYTES} bytes: {at} of {whole} bytes kept]\n")
        );
        assert_eq!(ids, ["credential-dummy:K"]);
        // A multi-byte character is never split.
        let got = stored_payload(&"é".repeat(MAX_PAYLOAD_BYTES), false, &redactor(), &mut ids);
        assert!(got.len() <= MAX_PAYLOAD_BYTES);
        // One under the cap is stored as it is.
        let small = "y".repeat(100);
        assert_eq!(stored_payload(&small, false, &redactor(), &mut ids), small);
    }

    #[test]
    fn a_payload_the_box_cut_through_a_secret_keeps_none_of_it_and_says_it_was_cut() {
        let mut ids = Vec::new();
        let raw = format!("{{\"tool_response\":\"{DUMMY}{}", &DUMMY[..12]);
        let got = stored_payload(&raw, true, &redactor(), &mut ids);
        assert_eq!(
            got,
            format!(
                "{{\"tool_response\":\"[REDACTED:credential-dummy:K][REDACTED:credential-dummy:K/cut]{BOX_CUT_MARKER}"
            )
        );
        assert!(!got.contains(&DUMMY[10..20]));
        ids.sort();
        assert_eq!(ids, ["credential-dummy:K", "credential-dummy:K/cut"]);
    }

    #[test]
    fn the_claims_fields_the_box_cut_lose_a_cut_secrets_start() {
        let claim = serde_json::json!({
            "command": format!("echo {}", &DUMMY[..12]),
            "command_cut": true,
            "stdout": format!("ok {}", &DUMMY[..25]),
        });
        let body = RecordBody::BoxClaimed {
            claimed_kind: "command".into(),
            claim,
        };
        assert!(says_cut(&body, "command") && !says_cut(&body, "stdout"));
        let (body, ids) = scrub_cut_fields(body, &redactor());
        let RecordBody::BoxClaimed { claim, .. } = body else {
            panic!()
        };
        assert_eq!(claim["command"], "echo [REDACTED:credential-dummy:K/cut]");
        // A field the box does not say it cut is not scrubbed as cut.
        assert_eq!(claim["stdout"], format!("ok {}", &DUMMY[..25]));
        assert_eq!(ids, ["credential-dummy:K/cut"]);
    }

    #[test]
    fn a_secret_holding_quotes_and_backslashes_is_scrubbed_from_a_claim() {
        let odd = r#"K7wq2Zr9"Xm4Lp8Vt\Hn3Bc6Jd"#;
        let r = Redactor::new(vec![SecretValue::new("secret:DEPLOY_KEY", odd)]);
        let body = RecordBody::BoxClaimed {
            claimed_kind: "note".into(),
            claim: serde_json::json!({"text": format!("my key is {odd}"), odd: [odd]}),
        };
        let (body, ids) = redact_body(body, &r);
        let text = serde_json::to_string(&body).unwrap();
        assert!(!text.contains("Xm4Lp8Vt"), "{text}");
        assert!(!ids.is_empty());
        let RecordBody::BoxClaimed { claim, .. } = body else {
            panic!("{text}")
        };
        assert_eq!(claim["text"], "my key is [REDACTED:secret:DEPLOY_KEY]");
    }
}
