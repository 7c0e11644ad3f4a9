//! `--json` for the inspecting verbs: one typed document per verb, each opening with a
//! `schema` field (`h5i.<verb>/<version>`) whose shape is written down in `docs/json.md`.
//!
//! Owns the documents and their conversion from the library's own report types. A field is
//! added by bumping nothing (readers ignore what they do not know); a field is renamed,
//! removed or retyped only with a new version. Must never: carry a secret value (secrets are
//! fingerprints, as everywhere), or print anything itself (the binary escapes and prints).
//!
//! Guarded by `tests/json_docs.rs`, which runs each verb with `--json` on boxes of every tier
//! (after a run at each) and checks the output against the shapes in `docs/json.md`, down to
//! every field of every nested object.

use serde::Serialize;

/// `h5i box ls --json`.
pub const LS: &str = "h5i.box.ls/1";
/// `h5i box status NAME --json`.
pub const STATUS: &str = "h5i.box.status/1";
/// `h5i box capabilities NAME --json`.
pub const CAPABILITIES: &str = "h5i.box.capabilities/1";
/// `h5i box doctor NAME --json`.
pub const DOCTOR: &str = "h5i.box.doctor/1";
/// `h5i box probe --json`.
pub const PROBE: &str = "h5i.box.probe/1";
/// `h5i box secrets NAME --json`.
pub const SECRETS: &str = "h5i.box.secrets/1";
/// `h5i box ports NAME --json`.
pub const PORTS: &str = "h5i.box.ports/1";
/// `h5i box service status NAME --json`.
pub const SERVICE_STATUS: &str = "h5i.box.service-status/1";
/// `h5i box cache ls --json`.
pub const CACHE_LS: &str = "h5i.box.cache-ls/1";
/// `h5i box cache mounts [NAME] --json`.
pub const CACHE_MOUNTS: &str = "h5i.box.cache-mounts/1";

/// `h5i browser status NAME --json`.
pub const BROWSER_STATUS: &str = "h5i.browser.status/1";

/// `h5i box inspect NAME --capture ID --json`.
pub const INSPECT: &str = "h5i.box.inspect/1";
/// `h5i box log NAME --json`.
pub const LOG: &str = "h5i.box.log/1";
/// `h5i box compare A B --json`.
pub const COMPARE: &str = "h5i.box.compare/1";

/// Every schema this build writes, for the documentation test.
pub const ALL: &[&str] = &[
    LS,
    STATUS,
    CAPABILITIES,
    DOCTOR,
    PROBE,
    SECRETS,
    PORTS,
    SERVICE_STATUS,
    CACHE_LS,
    CACHE_MOUNTS,
    INSPECT,
    LOG,
    COMPARE,
    BROWSER_STATUS,
];

/// `h5i box ls --json`.
#[derive(Debug, Serialize)]
pub struct BoxList {
    /// [`LS`].
    pub schema: &'static str,
    /// Every box, by name.
    pub boxes: Vec<BoxRow>,
}

/// One box of `ls`.
#[derive(Debug, Serialize)]
pub struct BoxRow {
    /// Its name.
    pub name: String,
    /// active, applied, aborted, ...
    pub state: String,
    /// The tier its policy resolved to.
    pub tier: String,
    /// The agent directory (`claude`, `codex`, `none`).
    pub agent: String,
    /// The pinned base commit.
    pub base: String,
    /// Where the code came from.
    pub source: String,
}

impl BoxList {
    /// From the store's boxes.
    pub fn of(boxes: &[crate::store::StoredBox]) -> BoxList {
        BoxList {
            schema: LS,
            boxes: boxes
                .iter()
                .map(|sb| {
                    let m = &sb.manifest;
                    BoxRow {
                        name: m.name.clone(),
                        state: m.state.as_str().to_string(),
                        tier: m.tier.clone(),
                        agent: m.agent.clone(),
                        base: m.base.clone(),
                        source: m.source.label(),
                    }
                })
                .collect(),
        }
    }
}

/// One row of the enforcement table (`status`).
#[derive(Debug, Serialize)]
pub struct EnforcedRow {
    /// What the policy asks (`mem`, `network`, ...).
    pub what: &'static str,
    /// The value asked for.
    pub asked: String,
    /// Whether this tier holds it.
    pub enforced: bool,
    /// Why not, when the reason is this row's own.
    pub note: Option<String>,
}

/// `h5i box status NAME --json`.
#[derive(Debug, Serialize)]
pub struct Status {
    /// [`STATUS`].
    pub schema: &'static str,
    /// The box.
    pub name: String,
    /// Its lifecycle state.
    pub state: String,
    /// Where the code came from.
    pub source: String,
    /// The pinned base commit.
    pub base: String,
    /// The tier.
    pub tier: String,
    /// `auto`, or what chose the tier (`--isolation`, the profile, `H5I_DEFAULT_ISOLATION`).
    pub tier_chosen_by: String,
    /// The policy digest (verified against `policy.digest`).
    pub policy_digest: String,
    /// The profile.
    pub profile: String,
    /// What is enforced.
    pub enforced: Vec<EnforcedRow>,
    /// Why the rows marked not enforced are not, when they share a reason.
    pub unenforced_reason: Option<String>,
    /// Host-observed records.
    pub host_records: usize,
    /// Box-claimed records.
    pub claimed_records: usize,
    /// Receipt-log lines that could not be read.
    pub damaged_lines: usize,
    /// The last run: receipt number, argv, exit code.
    pub last_run: Option<LastRun>,
    /// Commits the parent branch is ahead of the pinned base (None: no parent branch).
    pub drift: Option<Drift>,
}

/// The last run of `status`.
#[derive(Debug, Serialize)]
pub struct LastRun {
    /// Receipt number.
    pub seq: u64,
    /// The command (redacted as recorded).
    pub argv: Vec<String>,
    /// Its exit code.
    pub exit: i32,
}

/// Base drift of `status`.
#[derive(Debug, Serialize)]
pub struct Drift {
    /// The parent branch.
    pub branch: String,
    /// Commits it is ahead of the pinned base.
    pub ahead: u64,
}

fn enforced_rows(r: &crate::status::StatusReport) -> Vec<EnforcedRow> {
    r.enforcement
        .iter()
        .map(|e| EnforcedRow {
            what: e.what,
            asked: e.asked.clone(),
            enforced: e.enforced,
            note: e.note.clone(),
        })
        .collect()
}

fn chosen_by(r: &crate::status::StatusReport) -> String {
    if r.policy.tier_choice.auto {
        "auto".into()
    } else {
        r.policy.tier_choice.source.as_str().into()
    }
}

impl Status {
    /// From a status report.
    pub fn of(r: &crate::status::StatusReport) -> Status {
        let m = &r.sb.manifest;
        let (host, claimed, damaged) = r.evidence;
        Status {
            schema: STATUS,
            name: m.name.clone(),
            state: m.state.as_str().into(),
            source: m.source.label(),
            base: m.base.clone(),
            tier: m.tier.clone(),
            tier_chosen_by: chosen_by(r),
            policy_digest: m.policy_digest.clone(),
            profile: r.policy.profile.clone(),
            enforced: enforced_rows(r),
            unenforced_reason: r.unenforced_reason.clone(),
            host_records: host,
            claimed_records: claimed,
            damaged_lines: damaged,
            last_run: r.last_run.as_ref().map(|(seq, argv, exit, _)| LastRun {
                seq: *seq,
                argv: argv.clone(),
                exit: *exit,
            }),
            drift: r.drift.as_ref().map(|(branch, ahead)| Drift {
                branch: branch.clone(),
                ahead: *ahead,
            }),
        }
    }
}

/// `h5i box capabilities NAME --json`: what this box actually got: the tier and how it was
/// chosen, each enforcement row, the egress table the last supervised run loaded (hosts,
/// addresses, ports, the digest of the nft script), the network grant with its address-family
/// decision, and the policy digest the box runs under.
#[derive(Debug, Serialize)]
pub struct Capabilities {
    /// [`CAPABILITIES`].
    pub schema: &'static str,
    /// The box.
    #[serde(rename = "box")]
    pub name: String,
    /// The tier.
    pub tier: String,
    /// `auto`, or what chose the tier.
    pub tier_chosen_by: String,
    /// The policy digest (verified against `policy.digest`).
    pub policy_digest: String,
    /// What is enforced.
    pub enforced: Vec<EnforcedRow>,
    /// Why the rows marked not enforced are not, when they share a reason.
    pub unenforced_reason: Option<String>,
    /// The table the last supervised run loaded (the sentry's own account); None before one.
    pub egress_table: Option<h5i_policy::receipt::LoadedEgressTable>,
    /// The network the policy grants.
    pub net: NetGrant,
}

/// The network grant of `capabilities`.
#[derive(Debug, Serialize)]
pub struct NetGrant {
    /// `deny` (egress only to `egress`, through the tier's enforcer) or `host`.
    pub mode: &'static str,
    /// The allowed destinations, `host:port`.
    pub egress: Vec<String>,
    /// Whether unix sockets are allowed.
    pub unix: bool,
    /// The address-family decision.
    pub families: Families,
}

/// Each address family allowed or refused by `socket()`, with the table's reason.
#[derive(Debug, Serialize)]
pub struct Families {
    /// The families the policy's `net.families` grants by name.
    pub granted: Vec<String>,
    /// The families `socket()` lets through.
    pub allowed: Vec<FamilyRow>,
    /// The families `socket()` refuses (EPERM).
    pub refused: Vec<FamilyRow>,
}

/// One address family of `capabilities`.
#[derive(Debug, Serialize)]
pub struct FamilyRow {
    /// Its name (`inet`, `unix`, `vsock`, ...).
    pub family: &'static str,
    /// Its `AF_*` number.
    pub number: u32,
    /// Why it is allowed or refused.
    pub why: &'static str,
}

impl Capabilities {
    /// From a status report.
    pub fn of(r: &crate::status::StatusReport) -> Capabilities {
        let m = &r.sb.manifest;
        let net = &r.policy.net;
        let set = h5i_policy::families::FamilySet::allowed(net.unix, &net.families);
        let row = |f: &h5i_policy::families::AddressFamily| FamilyRow {
            family: f.name,
            number: f.number,
            why: f.why,
        };
        let (allowed, refused): (Vec<_>, Vec<_>) = h5i_policy::families::ADDRESS_FAMILIES
            .iter()
            .partition(|f| set.contains(f.number));
        Capabilities {
            schema: CAPABILITIES,
            name: m.name.clone(),
            tier: m.tier.clone(),
            tier_chosen_by: chosen_by(r),
            policy_digest: m.policy_digest.clone(),
            enforced: enforced_rows(r),
            unenforced_reason: r.unenforced_reason.clone(),
            egress_table: r.egress_table.clone(),
            net: NetGrant {
                mode: net.mode.as_str(),
                egress: net.egress.iter().map(|h| h.to_string()).collect(),
                unix: net.unix,
                families: Families {
                    granted: net.families.clone(),
                    allowed: allowed.into_iter().map(row).collect(),
                    refused: refused.into_iter().map(row).collect(),
                },
            },
        }
    }
}

/// `h5i box doctor NAME --json`.
#[derive(Debug, Serialize)]
pub struct Doctor {
    /// [`DOCTOR`].
    pub schema: &'static str,
    /// The box.
    #[serde(rename = "box")]
    pub name: String,
    /// Whether every check holds.
    pub ok: bool,
    /// Each check.
    pub checks: Vec<DoctorCheck>,
}

/// One check of `doctor`.
#[derive(Debug, Serialize)]
pub struct DoctorCheck {
    /// What was checked.
    pub what: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// What was found, and the mend when it does not hold.
    pub detail: String,
}

impl Doctor {
    /// From doctor's checks.
    pub fn of(name: &str, checks: &[crate::doctor::Check]) -> Doctor {
        Doctor {
            schema: DOCTOR,
            name: name.into(),
            ok: checks.iter().all(|c| c.ok),
            checks: checks
                .iter()
                .map(|c| DoctorCheck {
                    what: c.what,
                    ok: c.ok,
                    detail: c.detail.clone(),
                })
                .collect(),
        }
    }
}

/// `h5i box probe --json`.
#[derive(Debug, Serialize)]
pub struct Probe {
    /// [`PROBE`].
    pub schema: &'static str,
    /// Each probed fact.
    pub facts: Vec<ProbeFact>,
}

/// One fact of `probe`.
#[derive(Debug, Serialize)]
pub struct ProbeFact {
    /// What was checked.
    pub what: String,
    /// What the host answered.
    pub answer: String,
}

impl Probe {
    /// From probe's lines.
    pub fn of(lines: &[crate::probe::ProbeLine]) -> Probe {
        Probe {
            schema: PROBE,
            facts: lines
                .iter()
                .map(|l| ProbeFact {
                    what: l.what.trim().to_string(),
                    answer: l.answer.clone(),
                })
                .collect(),
        }
    }
}

/// `h5i box secrets NAME --json`: grants and fingerprints, never values.
#[derive(Debug, Serialize)]
pub struct Secrets {
    /// [`SECRETS`].
    pub schema: &'static str,
    /// The box.
    #[serde(rename = "box")]
    pub name: String,
    /// Each declared grant.
    pub secrets: Vec<SecretRow>,
}

/// One grant of `secrets`.
#[derive(Debug, Serialize)]
pub struct SecretRow {
    /// The grant's name.
    pub name: String,
    /// `env:VAR`.
    pub source: String,
    /// `env` or `file`.
    pub inject: &'static str,
    /// Whether it resolves in this shell (a run would be refused otherwise).
    pub resolves: bool,
    /// Its fingerprint when it resolves.
    pub fingerprint: Option<String>,
}

impl Secrets {
    /// From the dry run.
    pub fn of(name: &str, checks: &[h5i_broker::secrets::SecretCheck]) -> Secrets {
        Secrets {
            schema: SECRETS,
            name: name.into(),
            secrets: checks
                .iter()
                .map(|c| SecretRow {
                    name: c.name.clone(),
                    source: c.source.clone(),
                    inject: c.inject,
                    resolves: c.fingerprint.is_some(),
                    fingerprint: c.fingerprint.clone(),
                })
                .collect(),
        }
    }
}

/// `h5i box ports NAME --json`.
#[derive(Debug, Serialize)]
pub struct Ports {
    /// [`PORTS`].
    pub schema: &'static str,
    /// The box.
    #[serde(rename = "box")]
    pub name: String,
    /// Each live service port.
    pub ports: Vec<PortRow>,
}

/// One port of `ports`.
#[derive(Debug, Serialize)]
pub struct PortRow {
    /// The service.
    pub service: String,
    /// The port inside the box.
    pub box_port: u16,
    /// The host port on 127.0.0.1, when there is one.
    pub host_port: Option<u16>,
    /// How it is reached, or why it is not.
    pub note: String,
}

impl Ports {
    /// From the port lines.
    pub fn of(name: &str, lines: &[crate::service::PortLine]) -> Ports {
        Ports {
            schema: PORTS,
            name: name.into(),
            ports: lines
                .iter()
                .map(|l| PortRow {
                    service: l.service.clone(),
                    box_port: l.box_port,
                    host_port: l.host_port,
                    note: l.note.clone(),
                })
                .collect(),
        }
    }
}

/// `h5i box service status NAME --json`.
#[derive(Debug, Serialize)]
pub struct ServiceStatus {
    /// [`SERVICE_STATUS`].
    pub schema: &'static str,
    /// The box.
    #[serde(rename = "box")]
    pub name: String,
    /// Each declared service.
    pub services: Vec<ServiceRow>,
}

/// One service of `service status`.
#[derive(Debug, Serialize)]
pub struct ServiceRow {
    /// Its name.
    pub service: String,
    /// Its declared command.
    pub command: String,
    /// Its declared port.
    pub port: Option<u16>,
    /// Whether it runs now.
    pub alive: bool,
    /// Its pid (host), when it ever started.
    pub pid: Option<i32>,
    /// Its host port on 127.0.0.1.
    pub host_port: Option<u16>,
    /// Its last exit code, when it ended.
    pub last_exit: Option<i32>,
    /// The receipt of its last exit.
    pub receipt_seq: Option<u64>,
}

impl ServiceStatus {
    /// From the service statuses.
    pub fn of(name: &str, all: &[crate::service::ServiceStatus]) -> ServiceStatus {
        ServiceStatus {
            schema: SERVICE_STATUS,
            name: name.into(),
            services: all
                .iter()
                .map(|s| {
                    let st = s.state.as_ref();
                    ServiceRow {
                        service: s.service.clone(),
                        command: s.command.clone(),
                        port: s.port,
                        alive: s.alive,
                        pid: st.and_then(|st| st.pid).map(|p| p.pid),
                        host_port: st.and_then(|st| st.host_port),
                        last_exit: st
                            .and_then(|st| st.exit.as_ref())
                            .map(|e| e.passthrough_code()),
                        receipt_seq: st.and_then(|st| st.receipt_seq),
                    }
                })
                .collect(),
        }
    }
}

/// `h5i box cache ls --json`.
#[derive(Debug, Serialize)]
pub struct CacheLs {
    /// [`CACHE_LS`].
    pub schema: &'static str,
    /// Each stored cache.
    pub caches: Vec<crate::cache::ls::Listed>,
}

/// `h5i box cache mounts [NAME] --json`.
#[derive(Debug, Serialize)]
pub struct CacheMounts {
    /// [`CACHE_MOUNTS`].
    pub schema: &'static str,
    /// The box asked about, or None for a box made from the working tree now.
    #[serde(rename = "box")]
    pub name: Option<String>,
    /// Whether the box's tier gets caches at all.
    pub tier_mounts_caches: bool,
    /// One answer per ecosystem the project uses.
    pub offers: Vec<crate::cache::mounts::Offer>,
    /// A named box's own `node_modules`, once it has had npm's tree overlaid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_modules: Option<crate::cache::mounts::BoxTree>,
}

/// `h5i browser status NAME --json`.
#[derive(Debug, Serialize)]
pub struct BrowserStatus {
    /// [`BROWSER_STATUS`].
    pub schema: &'static str,
    /// The box.
    #[serde(rename = "box")]
    pub name: String,
    /// Who holds control: `agent` or `human`.
    pub holder: &'static str,
    /// Since when, ms since the epoch (0: since the box was made).
    pub since_ms: u64,
    /// Whether the agent's @refs are stale (refused until it snapshots again).
    pub refs_stale: bool,
    /// Whether the browser lives as long as the box (its sidecar), and so the lock is enforced.
    pub box_lifetime: bool,
    /// Whether that sidecar is running now.
    pub running: bool,
    /// What the two fields above mean here, in one line.
    pub note: String,
}
