//! `h5i box run NAME -- CMD...`: one command in the box, its exit code passed through, and a
//! host-observed receipt of what the kernel said about it.
//!
//! Owns the run path: load the box, verify its policy against the stored digest (a mismatch is
//! refused, never repaired), hand the command to the tier's backend, and append the
//! `host-env-run` record. Must never: run at a tier other than the one the policy resolved to, or
//! write a receipt from anything but the supervisor's own observation.
//!
//! Guarded by `tests/box_run.rs`.

use std::ffi::OsString;
use std::process::Command;
use std::time::Duration;

use h5i_policy::receipt::{ExitOutcome, OomReport, ReceiptLane, ReceiptRecord, RecordBody};
use h5i_policy::{ResolvedPolicy, Tier};
use h5i_runtime::supervise::ChildReport;

use crate::error::BoxError;
use crate::events::{self, Event};
use crate::secrets;
use crate::store::{load_policy, now_ms, require_active, BoxStore, StoredBox};

/// The result of a run, for the CLI to turn into an exit code.
#[derive(Debug)]
pub struct RunOutcome {
    /// How the command ended.
    pub exit: ExitOutcome,
    /// The receipt's sequence number.
    pub receipt_seq: u64,
}

/// Run `argv` in the box called `name`.
pub fn run(store: &BoxStore, name: &str, argv: &[OsString]) -> Result<RunOutcome, BoxError> {
    let Some(program) = argv.first() else {
        return Err(BoxError::BadRequest {
            what: "no command given".into(),
            mend: format!("put the command after `--`: h5i box run {name} -- cargo test"),
        });
    };
    let sb = store.find(name)?;
    let _lock = crate::store::BoxLock::shared(&sb.paths, name)?;
    require_active(&sb, "run")?;
    let policy = load_policy(&sb)?;
    let wall = policy.resources.wall_secs.map(Duration::from_secs);
    let secrets = secrets::resolve_for_run(&policy)?;
    // Fail closed before anything starts: every auth grant must be servable.
    let creds = crate::credentials::ForRun::prepare(&policy)?;
    let pinned = match policy.tier {
        Tier::Supervised => Some(crate::supervised::pin_egress(&policy)?),
        _ => None,
    };
    let scrub = creds.redactions();
    let started_ms = now_ms();

    let mut oom = None;
    let mut egress = None;
    let mut socket_gate = None;
    let mut usage = Usage::Supervisor;
    let report = match policy.tier {
        Tier::Workspace => {
            let mut cmd = workspace_command(&sb, program, &argv[1..]);
            let _files = secrets::inject_workspace(&mut cmd, &secrets)?;
            h5i_runtime::stdio::close_in_child(&mut cmd);
            h5i_runtime::supervise::run_supervised(cmd, wall)?
        }
        Tier::Process => {
            let mut plan = crate::process::plan(&sb, &policy, argv)?;
            // A live service of this box: join its network namespace, so the run reaches it
            // on localhost (no other box ever gets this path).
            let service = crate::service::live_network_pid(&sb);
            if let Some(pid) = service {
                crate::process::join_network_of(&mut plan, pid);
            }
            let warm = match service.is_none() && warm_path_fits(&policy) {
                true => crate::sandbox::run(
                    &sb,
                    &policy,
                    &plan,
                    wall,
                    crate::process::env_with_secrets(&plan, &secrets)?,
                )?,
                false => None,
            };
            let run = match warm {
                Some(run) => run,
                None => {
                    let (run, tally) = creds.serve_during(plan, |plan| {
                        crate::process::run_plan(&policy, plan, wall, &secrets, None)
                    })?;
                    egress = tally;
                    run?
                }
            };
            oom = run.cage.oom;
            run.child
        }
        Tier::Container => {
            let run = crate::container::run(
                &sb,
                &policy,
                crate::container::RunInputs {
                    argv,
                    wall,
                    secrets: &secrets,
                    creds: creds.into_prepared(),
                    tty: false,
                },
            )?;
            oom = run.oom;
            egress = run.egress;
            usage = Usage::Cgroup(run.usage);
            run.child
        }
        Tier::Supervised => {
            let mut plan = crate::process::plan(&sb, &policy, argv)?;
            let net = crate::supervised::attach(&mut plan, pinned.unwrap_or_default())?;
            let (run, cred_tally) = creds.serve_during(plan, |plan| {
                crate::process::run_plan(&policy, plan, wall, &secrets, None)
            })?;
            (egress, socket_gate) = crate::supervised::settle(&sb, Some(net), cred_tally)?;
            let run = run?;
            oom = run.cage.oom;
            run.child
        }
        other => return Err(tier_not_built(name, other)),
    };
    record_with(
        &sb,
        &policy,
        argv,
        started_ms,
        &report,
        oom,
        "run",
        RunExtras {
            scrub,
            egress,
            socket_gate,
            usage,
        },
    )
}

/// Whether a process-tier run goes through the box's sandbox rather than a container of its
/// own: not when turned off (`H5I_SANDBOX=off`), not when the policy grants credentials (their
/// proxy is wired per run into the run's network namespace), and not from a terminal (the run
/// could not be the terminal's foreground job from inside the sandbox's session).
fn warm_path_fits(policy: &ResolvedPolicy) -> bool {
    // SAFETY: isatty only inspects descriptor 0.
    let tty = unsafe { libc::isatty(0) } == 1;
    crate::sandbox::enabled() && policy.auth_grants().is_empty() && !tty
}

/// One run's egress counts from two counters (the sentry's table and the credential proxy).
pub(crate) fn merge_tallies(
    mut a: h5i_policy::receipt::EgressTally,
    b: Option<h5i_policy::receipt::EgressTally>,
) -> h5i_policy::receipt::EgressTally {
    if let Some(b) = b {
        for (k, n) in b.allowed {
            *a.allowed.entry(k).or_default() += n;
        }
        for (k, n) in b.denied {
            *a.denied.entry(k).or_default() += n;
        }
    }
    a
}

/// What a run adds to its record beyond the supervisor's report.
#[derive(Debug, Default)]
pub(crate) struct RunExtras {
    /// More values to scrub (the credential proxy's real credentials and dummies).
    pub scrub: Vec<h5i_broker::redact::SecretValue>,
    /// Egress counts (the credential proxy's, per upstream).
    pub egress: Option<h5i_policy::receipt::EgressTally>,
    /// The socket() gate's decisions (supervised tier).
    pub socket_gate: Option<Box<h5i_policy::receipt::SocketGateTally>>,
    /// Where the resource figures come from.
    pub usage: Usage,
}

/// Where a run record's resource figures come from.
#[derive(Debug, Default)]
pub(crate) enum Usage {
    /// The supervisor reaped the box itself: its `wait4` rusage.
    #[default]
    Supervisor,
    /// The supervisor's child was not the box (the container tier: Podman's client, whose
    /// rusage is its own): no rusage, and the box's cgroup figures when a cage held it.
    Cgroup(Option<h5i_policy::receipt::CgroupUsage>),
}

/// The command for a workspace-tier run: in the workspace, with the box's variables. The
/// workspace tier has no mount namespace, so it cannot place the workspace at `/work`: its
/// runs see host paths (the workspace's, under the parent's `.git/.h5i`, and the spool's);
/// only the process, supervised and container tiers hide them (`h5i_policy::inbox`).
pub(crate) fn workspace_command(sb: &StoredBox, program: &OsString, args: &[OsString]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(sb.paths.workspace())
        .env("H5I_ENV_ID", &sb.manifest.name)
        .env("H5I_ENV_POLICY_DIGEST", &sb.manifest.policy_digest)
        .env("H5I_ENV_CAPTURE_SPOOL", sb.paths.spool());
    cmd
}

/// The refusal for a tier this build cannot run.
pub(crate) fn tier_not_built(name: &str, tier: Tier) -> BoxError {
    BoxError::BadRequest {
        what: format!(
            "box `{name}` is pinned to the {} tier, which this build of h5i cannot run",
            tier.as_str()
        ),
        mend: "create the box with --isolation workspace or process, or use an h5i build with that tier".into(),
    }
}

/// Write the host-observed record of a finished run (`event` names the verb in the box log),
/// with the run's extra scrub values and egress counts, then ingest what the box staged in its
/// spool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_with(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    argv: &[OsString],
    started_ms: u64,
    report: &ChildReport,
    oom: Option<OomReport>,
    event: &str,
    extras: RunExtras,
) -> Result<RunOutcome, BoxError> {
    let digest = sb.manifest.policy_digest.clone();
    let (rusage, cgroup_usage) = match extras.usage {
        Usage::Supervisor => (Some(Box::new(report.rusage.clone())), None),
        Usage::Cgroup(usage) => (None, usage.map(Box::new)),
    };

    let mut exit = report.exit.clone();
    exit.oom_killed = oom.is_some()
        && (exit.signal == Some(libc::SIGKILL) || exit.code == Some(128 + libc::SIGKILL));
    let redactor = secrets::redactor_with(policy, extras.scrub);
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
            oom: oom.clone(),
            egress: extras.egress,
            socket_gate: extras.socket_gate,
        },
    };
    let log = h5i_broker::receipt_log::ReceiptLog::at(sb.paths.receipts());
    let written = log.append(record)?;
    ingest_spool(sb, &log, &redactor)?;
    events::append(
        &sb.paths,
        &Event::new(
            event,
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
        let (body, raw) = match entry.body.clone() {
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
            body => (body, None),
        };
        let (body, mut redactions) = redact_body(body, redactor);
        let payload = match raw {
            Some(raw) => Some(store_payload(
                sb,
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

/// Largest raw payload stored per record, bytes (a staged entry is smaller still).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// Store a box-staged raw payload under the box's `payloads/`, redacted and capped; its file
/// name (h5i's, never the box's), for the record to name.
fn store_payload(
    sb: &StoredBox,
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
    let name = format!("inbox-{at_ms}-{index}.txt");
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
