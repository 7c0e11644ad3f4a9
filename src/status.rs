//! `h5i box status NAME`: the policy actually enforced, the evidence, and the base's drift.
//!
//! Owns the claim a box makes about itself, so it is conservative: a limit is listed as enforced
//! only when this tier's backend holds it; everything else is marked `*` with the reason under
//! it. It also names what a bounded scan of the workspace finds there (set-id files, fifos,
//! devices): the box made them, and they sit on the host. That scan runs under the same hold as
//! export (the box's lock taken exclusively, its services frozen); while a run or shell holds
//! the lock the workspace is reported not scanned. Must never: call a limit enforced because the
//! policy asked for it, read a workspace file's bytes, or scan a tree a run, shell or live
//! service can change while it is scanned.

use h5i_broker::receipt_log::ReceiptLog;
use h5i_policy::families::FamilySet;
use h5i_policy::receipt::RecordBody;
use h5i_policy::{ContainerRuntime, ResolvedPolicy, Tier};

use crate::error::BoxError;
use crate::git::Git;
use crate::store::{load_policy, BoxLock, BoxSource, BoxStore, StoredBox};

/// One line of the enforcement table.
#[derive(Debug, Clone)]
pub struct Enforcement {
    /// What the policy asks (`mem`, `network`, ...).
    pub what: &'static str,
    /// The value asked for.
    pub asked: String,
    /// Whether this tier holds it.
    pub enforced: bool,
    /// Why a row is not enforced when its reason is its own (shown under it as `* what: note`;
    /// rows without one share the report's `unenforced_reason`), or, on an enforced row, what it
    /// does not cover (shown as `- what: note`).
    pub note: Option<String>,
}

/// Everything `status` prints.
#[derive(Debug)]
pub struct StatusReport {
    /// The box.
    pub sb: StoredBox,
    /// Its verified policy.
    pub policy: ResolvedPolicy,
    /// The enforcement table.
    pub enforcement: Vec<Enforcement>,
    /// Why the `*` lines are not enforced.
    pub unenforced_reason: Option<String>,
    /// Receipt counts: (host-observed, box-claimed, damaged lines).
    pub evidence: (usize, usize, usize),
    /// The last run: (seq, argv, exit code, whether the kernel OOM-killed it).
    pub last_run: Option<(u64, Vec<String>, i32, bool)>,
    /// Commits on the parent branch since the pinned base, for a worktree box with a branch.
    pub drift: Option<(String, u64)>,
    /// The egress table the last supervised run actually loaded (the sentry's own account).
    pub egress_table: Option<h5i_policy::receipt::LoadedEgressTable>,
    /// An interrupted rebase's old and new base: the workspace is between the two until
    /// `h5i box rebase` finishes it.
    pub rebase_interrupted: Option<(String, String)>,
    /// What a bounded scan of the workspace found (set-id files, fifos, devices), or why it
    /// could not look; `None` when the workspace was reclaimed.
    pub workspace: Option<Result<crate::bounded::TreeScan, String>>,
}

/// Gather a box's status.
pub fn status(store: &BoxStore, name: &str) -> Result<StatusReport, BoxError> {
    let sb = store.find(name)?;
    let policy = load_policy(&sb)?;
    let limits = if policy.tier == Tier::Workspace {
        Ok(())
    } else {
        crate::probe::kernel_facts().cgroups.1
    };
    let (enforcement, unenforced_reason) = enforcement_of(&policy, &limits);
    let readout = ReceiptLog::at(sb.paths.receipts()).read()?;
    let host = readout
        .records
        .iter()
        .filter(|r| r.lane.is_host_observed())
        .count();
    let last_run = readout.records.iter().rev().find_map(|r| match &r.body {
        RecordBody::Run { argv, exit, .. } if r.lane.is_host_observed() => Some((
            r.seq,
            argv.clone(),
            exit.passthrough_code(),
            exit.oom_killed,
        )),
        _ => None,
    });
    let drift = match &sb.manifest.source {
        BoxSource::Worktree {
            parent_branch: Some(b),
            ..
        } => Git::at(&store.common_dir)
            .args([
                "rev-list",
                "--count",
                &format!("{}..refs/heads/{b}", sb.manifest.base),
            ])
            .text()
            .ok()
            .and_then(|n| n.parse().ok())
            .map(|n| (b.clone(), n)),
        _ => None,
    };
    let ws = sb.paths.workspace();
    let workspace = ws.exists().then(|| scan_held(&sb, name, &ws));
    Ok(StatusReport {
        rebase_interrupted: crate::rebase::interrupted(&sb)?.map(|j| (j.from, j.to)),
        workspace,
        egress_table: crate::supervised::last_table(&sb),
        evidence: (host, readout.records.len() - host, readout.damaged.len()),
        sb,
        policy,
        enforcement,
        unenforced_reason,
        last_run,
        drift,
    })
}

/// Scan the workspace under the same hold as export: the box's lock taken exclusively and its
/// services frozen for the length of the scan. A live run or shell holds the lock, so its tree
/// is not scanned (said, with when to look again) rather than read while it changes; a service
/// that cannot be frozen is named the same way.
fn scan_held(
    sb: &StoredBox,
    name: &str,
    ws: &std::path::Path,
) -> Result<crate::bounded::TreeScan, String> {
    let _lock = BoxLock::take_mid_rebase(&sb.paths, name).map_err(|e| match e {
        BoxError::Busy { .. } => "a run or shell of the box is live, so its tree is not held still; to see it: run `h5i box status` again when it ends".to_string(),
        other => other.to_string(),
    })?;
    let _frozen = crate::freeze::hold(sb).map_err(|e| e.to_string())?;
    crate::bounded::scan_tree(ws, crate::export::ExportCaps::default().per_file)
        .map_err(|skip| format!("it is {skip}"))
}

/// What this tier holds of the policy; `limits` is whether this host can hold cgroup limits.
pub fn enforcement_of(
    policy: &ResolvedPolicy,
    limits: &Result<(), String>,
) -> (Vec<Enforcement>, Option<String>) {
    let confined = policy.tier != Tier::Workspace;
    let held = confined && limits.is_ok();
    let fs = format!(
        "read {} write {}",
        policy.fs.read.join(","),
        policy.fs.write.join(",")
    );
    let mut net = policy.net.mode.as_str().to_string();
    if !policy.net.egress.is_empty() {
        let hosts: Vec<String> = policy
            .net
            .egress
            .iter()
            .map(|h| format!("{}:{}", h.host, h.port))
            .collect();
        net.push_str(&format!(" + egress {}", hosts.join(",")));
    }
    let mut rows = vec![
        Enforcement {
            what: "filesystem",
            asked: fs,
            enforced: confined,
            note: None,
        },
        Enforcement {
            what: "network",
            asked: net,
            enforced: confined,
            note: h5i_policy::receipt::UncountedEgress::at(policy.tier, policy.net.mode)
                .map(|u| format!("not counted: {}", u.describe())),
        },
        Enforcement {
            what: "unix sockets",
            asked: if policy.net.unix { "allowed" } else { "denied" }.into(),
            enforced: confined,
            note: None,
        },
    ];
    if let Some(m) = policy.resources.mem_bytes {
        rows.push(Enforcement {
            what: "mem",
            asked: format!("{} MiB", m / (1024 * 1024)),
            enforced: held,
            note: None,
        });
    }
    if let Some(p) = policy.resources.procs {
        rows.push(Enforcement {
            what: "procs",
            asked: p.to_string(),
            enforced: held,
            note: None,
        });
    }
    if let Some(w) = policy.resources.wall_secs {
        rows.push(Enforcement {
            what: "wall",
            asked: format!("{w}s (exit 124 when it fires)"),
            enforced: true,
            note: None,
        });
    }
    rows.extend(confinement_rows(policy, confined));
    let reason = if !confined {
        Some("not enforced at the workspace tier: it is a separate worktree with no confinement by design; create the box with --isolation process (or stronger) to hold these".to_string())
    } else if rows.iter().any(|r| !r.enforced && r.note.is_none()) {
        limits
            .as_ref()
            .err()
            .map(|e| format!("not held on this host: {e}"))
    } else {
        None
    };
    (rows, reason)
}

/// The set-id, address-family and disk rows: what h5i-runc's seccomp list holds at the kernel
/// tiers (and at the container tier, whose OCI runtime is h5i-runc unless the profile asks for
/// the host's default, which runs none of its layers), and the disk ceiling there is not.
fn confinement_rows(policy: &ResolvedPolicy, confined: bool) -> Vec<Enforcement> {
    let host_default = policy.container_runtime == Some(ContainerRuntime::HostDefault);
    let held = confined && !host_default;
    let not_held = (confined && host_default).then(|| {
        "runtime = \"host-default\" runs none of h5i-runc's seccomp layers; drop it from the profile's [container] to hold this".to_string()
    });
    let families = FamilySet::allowed(policy.net.unix, &policy.net.families);
    let allowed: Vec<&str> = families
        .numbers()
        .filter_map(|n| h5i_policy::families::by_number(n).map(|f| f.name))
        .collect();
    let refused = families.refused_names().len();
    let tmp = match policy.tier {
        Tier::Container => format!("{} tmpfs", crate::container::podman_args::TMP_SIZE),
        _ => format!(
            "{} MiB tmpfs, files up to {} MiB (RLIMIT_FSIZE)",
            crate::process::TMP_BYTES >> 20,
            crate::process::MAX_FILE_BYTES >> 20
        ),
    };
    vec![
        Enforcement {
            what: "set-id files",
            asked: "refused (chmod/open/creat/mkdir/mknod with S_ISUID|S_ISGID: EPERM; openat2: ENOSYS)".into(),
            enforced: held,
            note: not_held.clone(),
        },
        Enforcement {
            what: "families",
            asked: format!(
                "socket() allowed for {}; the other {refused} address families refused (EPERM)",
                allowed.join(",")
            ),
            enforced: held,
            note: not_held,
        },
        Enforcement {
            what: "disk",
            asked: format!("none for $WORK; /tmp {tmp}"),
            enforced: false,
            note: confined.then(|| {
                "no per-box disk ceiling for $WORK: it shares its host filesystem (h5i sets no project quota); /tmp is bounded by its size and by mem".to_string()
            }),
        },
    ]
}
