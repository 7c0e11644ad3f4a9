//! The host-observed record of a finished run: one `host-env-run` receipt and one event in the
//! box log, then the box-claimed records it staged in its spool, each redacted.
//!
//! Owns turning what a tier backend observed into the record. Must never: write a figure the
//! host did not observe, or a record (or spooled entry) with a value the redactor knows.

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
        let (body, raw) = match with_staged_time(entry.body.clone(), entry.staged_ns) {
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
        let payload = match raw {
            Some(raw) => Some(store_payload(
                sb,
                entry.lane,
                at_ms,
                i,
                &raw,
                redactor,
                &mut redactions,
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

/// Largest raw payload stored per record, bytes (a staged entry is smaller still).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// Store a box-staged raw payload under the box's `payloads/`, redacted and capped; its file
/// name (h5i's, never the box's), for the record to name.
fn store_payload(
    sb: &StoredBox,
    lane: h5i_policy::receipt::ReceiptLane,
    at_ms: u64,
    index: usize,
    raw: &str,
    redactor: &h5i_broker::redact::Redactor,
    redactions: &mut Vec<String>,
) -> Result<String, BoxError> {
    let (clean, ids) = redactor.redact(raw);
    redactions.extend(ids);
    let mut end = clean.len().min(MAX_PAYLOAD_BYTES);
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    let name = format!("{}-{at_ms}-{index}.txt", lane.as_str());
    let dir = sb.paths.payloads();
    std::fs::create_dir_all(&dir).map_err(|e| BoxError::io(&dir, e))?;
    crate::store::write_atomic(&dir.join(&name), &clean.as_bytes()[..end])?;
    Ok(name)
}

/// A box-supplied record with every secret value scrubbed (through its JSON text).
fn redact_body(
    body: RecordBody,
    redactor: &h5i_broker::redact::Redactor,
) -> (RecordBody, Vec<String>) {
    let Ok(text) = serde_json::to_string(&body) else {
        return (body, Vec::new());
    };
    let (clean, ids) = redactor.redact(&text);
    if ids.is_empty() {
        return (body, ids);
    }
    match serde_json::from_str(&clean) {
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
