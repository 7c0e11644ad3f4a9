//! Receipt record types: one line of a box's append-only `receipts.jsonl`.
//!
//! Owns the shape of evidence, not its storage (the broker's receipt log writes it) nor its
//! gathering (the runtime observes, the hooks ingest the spool). Every record names the lane that
//! observed it, so host-observed and box-claimed evidence never blur: [`ReceiptLane::is_host_observed`]
//! is the single place that decides which is which.

use serde::{Deserialize, Serialize};

/// Version of the record schema written by this build.
pub const RECEIPT_SCHEMA_VERSION: u32 = 1;

/// Who observed a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReceiptLane {
    /// h5i, host-side: exits and rusage from the supervisor's `wait4`.
    HostEnvRun,
    /// h5i's own viewer forward.
    Viewer,
    /// The box's shell shim. Box-claimed.
    TeeShim,
    /// Staged by the box in its spool. Box-claimed.
    InboxCapture,
}

impl ReceiptLane {
    /// Whether the host saw this itself (as opposed to the box saying so).
    pub fn is_host_observed(self) -> bool {
        matches!(self, ReceiptLane::HostEnvRun | ReceiptLane::Viewer)
    }

    /// The lane's name as written in receipts and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptLane::HostEnvRun => "host-env-run",
            ReceiptLane::Viewer => "viewer",
            ReceiptLane::TeeShim => "tee-shim",
            ReceiptLane::InboxCapture => "inbox-capture",
        }
    }
}

/// How a supervised process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitOutcome {
    /// Exit code, when the process exited normally.
    pub code: Option<i32>,
    /// Terminating signal number, when a signal ended it.
    pub signal: Option<i32>,
    /// The wall-clock limit killed it (the CLI then exits 124).
    pub timed_out: bool,
    /// The kernel's OOM killer ended it.
    pub oom_killed: bool,
}

impl ExitOutcome {
    /// The exit code `h5i box run` passes through: the child's code, 128+signal for a signal,
    /// 124 when the wall-clock limit fired.
    pub fn passthrough_code(&self) -> i32 {
        if self.timed_out {
            124
        } else if let Some(code) = self.code {
            code
        } else if let Some(sig) = self.signal {
            128 + sig
        } else {
            1
        }
    }
}

/// Resource usage as `wait4` reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rusage {
    /// User CPU time, microseconds.
    pub user_us: u64,
    /// System CPU time, microseconds.
    pub sys_us: u64,
    /// Peak resident set size, KiB.
    pub maxrss_kb: u64,
    /// Minor page faults.
    pub minflt: u64,
    /// Major page faults.
    pub majflt: u64,
    /// Blocks read.
    pub inblock: u64,
    /// Blocks written.
    pub oublock: u64,
    /// Voluntary context switches.
    pub nvcsw: u64,
    /// Involuntary context switches.
    pub nivcsw: u64,
}

/// What the box's own cgroup counted over a run whose supervised child is not the box (the
/// container tier: that child is Podman's client, and its `wait4` figures are the client's).
/// Read from h5i's cage, the container's cgroup parent, after the run. A figure the host's
/// cgroups cannot give, or that nothing in the cage ever charged (the box was not placed there
/// in that hierarchy), is absent, never zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupUsage {
    /// CPU time of everything in the cage, microseconds (v1 `cpuacct.usage`, v2 `cpu.stat`
    /// `usage_usec`).
    pub cpu_us: Option<u64>,
    /// Of which user time (v1 `cpuacct.usage_user`, v2 `user_usec`).
    pub user_us: Option<u64>,
    /// Of which system time (v1 `cpuacct.usage_sys`, v2 `system_usec`).
    pub sys_us: Option<u64>,
    /// Peak memory charged to the cage, bytes: resident memory and page cache together (v1
    /// `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub mem_peak_bytes: Option<u64>,
}

/// What the memory controller said about an OOM kill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomReport {
    /// The limit in force, bytes.
    pub limit_bytes: u64,
    /// Peak usage, bytes, where the kernel reports it.
    pub peak_bytes: Option<u64>,
    /// How many OOM kills the box's group saw.
    pub kill_count: u64,
}

/// Per-destination egress counts, as the enforcing component saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressTally {
    /// `host:port` -> allowed connection count.
    pub allowed: std::collections::BTreeMap<String, u64>,
    /// `host:port` -> denied attempt count.
    pub denied: std::collections::BTreeMap<String, u64>,
    /// The connections no counter of this run could see, when the tier has such (the process
    /// tier: only its credential proxy counts), so the counts are never read as all of the
    /// run's egress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncounted: Option<UncountedEgress>,
}

/// Connections a run makes that no counter of its tier sees: what an [`EgressTally`] cannot
/// hold. Set by the tier, from its network mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UncountedEgress {
    /// The box's network namespace had loopback only (the process tier, `net = "deny"`, before
    /// its table counted refusals): the kernel refused every connection the box made itself
    /// (`ENETUNREACH`: no route) before a packet existed, so nothing counted the attempt. Kept
    /// so receipts written then still read true.
    RefusedWithoutCount,
    /// The process tier's table refused and counted the run's own connections, but h5i could
    /// not read the counts back.
    CountsUnread,
    /// The run shared a service's network namespace (the process tier): its own connections
    /// were refused and counted by that namespace's table, in the service's run record.
    InServiceNetwork,
    /// The box shares the host's network (the process tier, `net = "host"`): its own
    /// connections go out, and nothing counts them.
    HostNetwork,
}

impl UncountedEgress {
    /// What no counter sees at `tier` with network `mode`: the process tier's own connections
    /// on the host's network; `None` elsewhere (the process tier's deny-all table, the
    /// supervised table and the container proxy count what they refuse; the workspace tier
    /// confines nothing and says so itself).
    pub fn at(tier: crate::tier::Tier, mode: crate::resolved::NetMode) -> Option<Self> {
        use crate::resolved::NetMode;
        match (tier, mode) {
            (crate::tier::Tier::Process, NetMode::Host) => Some(Self::HostNetwork),
            _ => None,
        }
    }

    /// One sentence for a reader (report, inspect, status).
    pub fn describe(self) -> &'static str {
        match self {
            UncountedEgress::RefusedWithoutCount => {
                "connections the box makes itself are refused by the kernel (no route out of \
                 its loopback-only network) and counted by nothing at this tier; only the \
                 credential proxy counts what it refuses"
            }
            UncountedEgress::CountsUnread => {
                "the box's table refused this run's own connections and counted them, but h5i \
                 could not read the counts back (it said why when the run ended)"
            }
            UncountedEgress::InServiceNetwork => {
                "the run shared a service's network: its own connections were refused and \
                 counted by that network's table, in the service's run record, not this one's"
            }
            UncountedEgress::HostNetwork => {
                "the box shares the host's network, so its own connections go out and nothing \
                 at this tier counts them; only the credential proxy counts what it refuses"
            }
        }
    }
}

impl EgressTally {
    /// One run's counts from two counters (the supervised sentry's table and the credential
    /// proxy): `other`'s counts added to these, per destination.
    pub fn merged(mut self, other: Option<EgressTally>) -> EgressTally {
        if let Some(other) = other {
            for (k, n) in other.allowed {
                *self.allowed.entry(k).or_default() += n;
            }
            for (k, n) in other.denied {
                *self.denied.entry(k).or_default() += n;
            }
            self.uncounted = self.uncounted.or(other.uncounted);
        }
        self
    }
}

/// One destination in the egress table a supervised run actually loaded: a name from
/// `net.egress` and the addresses it was pinned to when the run started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedRule {
    /// The name as the policy wrote it.
    pub host: String,
    /// The port.
    pub port: u16,
    /// The addresses it resolved to on the host at run start, as text (`198.18.0.2`, `2001:db8::1`).
    pub addrs: Vec<String>,
}

/// The nftables table a supervised run's network namespace held: what `status` and
/// `capabilities --json` show as "actually loaded".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadedEgressTable {
    /// `sha256:<hex>` of the nft script as loaded (so two runs can be compared).
    pub digest: String,
    /// The accepted destinations, sorted by host then port.
    pub rules: Vec<PinnedRule>,
}

/// The socket() gate's decisions in one run, by address family name (`inet`, `inet6`, `unix`,
/// `netlink`, `packet`, `vsock`, `family-<n>` for others below 64, `family-invalid` above;
/// `inet-raw`/`inet6-raw` for raw IP, `inet-other`/`inet6-other` for any other inet type or
/// protocol; `socketpair` calls as `unix-pair` or `<family>-pair`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketGateTally {
    /// family -> calls let through.
    pub allowed: std::collections::BTreeMap<String, u64>,
    /// family -> calls refused (`EPERM` in the box).
    pub denied: std::collections::BTreeMap<String, u64>,
}

/// What the supervised tier's network sentry hands the receipt when a run ends
/// (`<net dir>/tally.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetTally {
    /// The table that was loaded.
    pub table: LoadedEgressTable,
    /// Allowed connections per `host:port` (from the table's per-rule counters) and denied
    /// attempts per `address:port/proto` (the box dialled an address, not a name).
    pub egress: EgressTally,
    /// The socket() gate's decisions.
    pub socket_gate: SocketGateTally,
}

/// What a record is about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RecordBody {
    /// One supervised command (`box run`, `box shell`, a service).
    Run {
        /// The exact argv, one element per argument (quoting preserved), redacted.
        argv: Vec<String>,
        /// Isolation tier it ran at.
        tier: String,
        /// How it ended.
        exit: ExitOutcome,
        /// `wait4` resource usage, when the supervisor reaped the box itself (absent at the
        /// container tier, whose supervised child is Podman's client: see `cgroup_usage`).
        rusage: Option<Box<Rusage>>,
        /// The box's own cgroup figures, when the supervisor did not reap the box itself.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cgroup_usage: Option<Box<CgroupUsage>>,
        /// Wall time, milliseconds.
        wall_ms: u64,
        /// OOM evidence from the memory controller, when it killed.
        oom: Option<OomReport>,
        /// Egress counts for this run, when an enforcing component counted.
        egress: Option<EgressTally>,
        /// The socket() gate's decisions, at the supervised tier.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        socket_gate: Option<Box<SocketGateTally>>,
    },
    /// A record the box staged in its spool, validated and ingested by the host.
    BoxClaimed {
        /// The staged record's own kind, as the box wrote it.
        claimed_kind: String,
        /// The staged record, as validated JSON.
        claim: serde_json::Value,
    },
    /// Who holds a box's browser changed (`h5i browser take|release`), lane `viewer`.
    Control {
        /// What was done: `take` or `release`.
        action: String,
        /// Who holds control after it: `human` or `agent`.
        holder: String,
        /// The host user who did it.
        by: String,
    },
    /// A human's viewer of a box's browser (`h5i box view`) opened or closed, lane `viewer`.
    ViewerSession {
        /// `opened`, `closed`, or `killed`: the viewer ended without closing the session, and
        /// a later h5i verb closed it (the counts are the last the viewer saved).
        event: String,
        /// The session's id, the same in its opening and its closing record.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        session: String,
        /// The viewer: `browser viewer` (the page `h5i box view` serves).
        via: String,
        /// The host user who ran it.
        by: String,
        /// Whether a human took control from this viewer (so far, at `opened`: false).
        took_control: bool,
        /// Input events the viewer passed to the browser while a human held control.
        input_sent: u64,
        /// Input events dropped because the agent held control.
        input_dropped: u64,
    },
    /// What the box's browser saw since the previous drain, collected by h5i itself right
    /// after a run that could drive it (host-observed: h5i asked the browser, the box did not
    /// report it).
    Page {
        /// The run record this drain follows.
        after_seq: u64,
        /// `observed`, or `unavailable` when no browser answered: never read as a clean page.
        state: String,
        /// Console messages at level error.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        console_errors: Vec<String>,
        /// Uncaught exceptions.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        exceptions: Vec<String>,
        /// Requests that failed (no response, or a status of 400 and up).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        failed_requests: Vec<String>,
        /// Documents the page navigated to.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        visited: Vec<String>,
    },
    /// What the box's browser sent while no run held the network it shares (the supervised
    /// tier's box-lifetime browser, in the network of the box's sandbox): the sandbox's table
    /// counted from the end of the run `after_seq` until the next run began (or the sandbox
    /// ended), host-observed. Each run's own tally is exactly that run's, so without this the
    /// browser's traffic between runs would be in no record.
    Browser {
        /// The last record before the window closed (the window opened after the run before it).
        after_seq: u64,
        /// When the window opened (ms since the Unix epoch).
        since_ms: u64,
        /// The table's counts over the window.
        egress: EgressTally,
    },
    /// A staged spool entry that failed validation; kept out of every other lane.
    Quarantined {
        /// Spool file name (sanitized).
        entry: String,
        /// Why it was refused.
        reason: String,
    },
}

impl RecordBody {
    /// A `page` record's lists, each with the label reports give it, in the order they show
    /// them (visited, console errors, uncaught exceptions, failed requests); `None` for any
    /// other record.
    pub fn page_findings(&self) -> Option<[(&'static str, &[String]); 4]> {
        match self {
            RecordBody::Page {
                visited,
                console_errors,
                exceptions,
                failed_requests,
                ..
            } => Some([
                ("visited", visited),
                ("console error", console_errors),
                ("uncaught exception", exceptions),
                ("failed request", failed_requests),
            ]),
            _ => None,
        }
    }

    /// A `browser` record (what the box's browser sent while no run held its network) as one
    /// line (`box inspect`, the fleet view, report.md); empty for any other record.
    pub fn between_runs_line(&self) -> String {
        let RecordBody::Browser {
            after_seq, egress, ..
        } = self
        else {
            return String::new();
        };
        format!(
            "between runs after record #{after_seq}, the box's browser made: allowed {}; denied {}",
            tally_text(&egress.allowed),
            tally_text(&egress.denied)
        )
    }

    /// A viewer-session record as one line (`box inspect`, report.md's "Viewer sessions"); empty
    /// for any other record.
    pub fn viewer_session_line(&self) -> String {
        let RecordBody::ViewerSession {
            event,
            via,
            by,
            took_control,
            input_sent,
            input_dropped,
            ..
        } = self
        else {
            return String::new();
        };
        let line = format!("{via} {event} by {by}");
        if event == "opened" {
            return line;
        }
        let control = if *took_control {
            "a human took control"
        } else {
            "watched only"
        };
        let ending = if event == "killed" {
            " (the viewer was killed; a later h5i verb closed its session with the counts it last saved)"
        } else {
            ""
        };
        format!("{line}: {control}; {input_sent} input events sent, {input_dropped} dropped while the agent held control{ending}")
    }
}

/// Per-destination counts as reports show them (`example.test:443 x2, ...`, or `none`).
pub fn tally_text(t: &std::collections::BTreeMap<String, u64>) -> String {
    if t.is_empty() {
        return "none".into();
    }
    t.iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The claim key of a box-claimed record's staging time, nanoseconds since the Unix epoch: put
/// there by h5i from the spool entry's name when it ingests the record (a value the box wrote
/// under that key itself is dropped), read by report.md to order and place the record.
pub const STAGED_NS: &str = "staged_ns";

/// One line of `receipts.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReceiptRecord {
    /// Schema version ([`RECEIPT_SCHEMA_VERSION`]).
    pub v: u32,
    /// Position in the log, from 1, with no gaps.
    pub seq: u64,
    /// Who observed it.
    pub lane: ReceiptLane,
    /// When the observation started, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The policy digest in force.
    pub policy_digest: String,
    /// Redaction rule ids applied before this record was written (never the values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redactions: Vec<String>,
    /// File name of the stored raw payload, beside the log, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// What it records.
    #[serde(flatten)]
    pub body: RecordBody,
}

/// A time in ms since the Unix epoch as RFC 3339 UTC: `YYYY-MM-DDTHH:MM:SS.mmmZ`, or without the
/// milliseconds when `millis` is false (runc's log format). The one formatter every crate uses.
pub fn rfc3339_utc(ms: u64, millis: bool) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, min, sec) = (rem / 3600, rem % 3600 / 60, rem % 60);
    if millis {
        format!(
            "{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{sec:02}.{:03}Z",
            ms % 1000
        )
    } else {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{sec:02}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_tallies_add_per_destination() {
        let mut a = EgressTally::default();
        a.allowed.insert("a.test:443".into(), 2);
        a.denied.insert("b.test:80".into(), 1);
        let mut b = EgressTally::default();
        b.allowed.insert("a.test:443".into(), 3);
        b.allowed.insert("c.test:443".into(), 1);
        b.denied.insert("b.test:80".into(), 4);
        let m = a.clone().merged(Some(b));
        assert_eq!(m.allowed["a.test:443"], 5);
        assert_eq!(m.allowed["c.test:443"], 1);
        assert_eq!(m.denied["b.test:80"], 5);
        assert_eq!(a.clone().merged(None), a);
    }

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(rfc3339_utc(0, true), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_utc(1_700_000_000_123, true),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(
            rfc3339_utc(951_782_400_000, true),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(rfc3339_utc(951_782_400_999, false), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn passthrough_code_prefers_timeout_then_code_then_signal() {
        let mut e = ExitOutcome {
            code: Some(3),
            signal: None,
            timed_out: false,
            oom_killed: false,
        };
        assert_eq!(e.passthrough_code(), 3);
        e.timed_out = true;
        assert_eq!(e.passthrough_code(), 124);
        let s = ExitOutcome {
            code: None,
            signal: Some(9),
            timed_out: false,
            oom_killed: true,
        };
        assert_eq!(s.passthrough_code(), 137);
    }

    #[test]
    fn lanes_serialize_as_the_manual_names_them() {
        for lane in [
            ReceiptLane::HostEnvRun,
            ReceiptLane::Viewer,
            ReceiptLane::TeeShim,
            ReceiptLane::InboxCapture,
        ] {
            let json = serde_json::to_string(&lane).unwrap();
            assert_eq!(json, format!("\"{}\"", lane.as_str()));
        }
        assert!(ReceiptLane::HostEnvRun.is_host_observed());
        assert!(!ReceiptLane::InboxCapture.is_host_observed());
        assert!(!ReceiptLane::TeeShim.is_host_observed());
    }

    #[test]
    fn a_run_record_round_trips_through_json() {
        let r = ReceiptRecord {
            v: RECEIPT_SCHEMA_VERSION,
            seq: 1,
            lane: ReceiptLane::HostEnvRun,
            at_ms: 5,
            policy_digest: "sha256:00".into(),
            redactions: vec![],
            payload: None,
            body: RecordBody::Run {
                argv: vec!["sh".into(), "-c".into(), "echo 'a b'".into()],
                tier: "workspace".into(),
                exit: ExitOutcome {
                    code: Some(0),
                    signal: None,
                    timed_out: false,
                    oom_killed: false,
                },
                rusage: Some(Box::default()),
                cgroup_usage: None,
                wall_ms: 2,
                oom: None,
                egress: None,
                socket_gate: None,
            },
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.contains("\"kind\":\"run\""));
        let back: ReceiptRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back, r);
    }
}
