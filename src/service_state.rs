//! A box's service state files, `<box>/services/<svc>.json`: what each supervisor knows (who
//! supervises, the service's pid, its network, its exit), read by the run path to find a live
//! service (a browser box's sidecar, a process-tier service whose network runs join) and by
//! `freeze` to hold services still, and written only by the supervisor (`crate::service`):
//! the one whose first write claimed it, never an earlier one still winding down
//! ([`update_state`]).
//!
//! A leaf below the tiers and the session: it names neither (`tests/module_layers.rs`), so the
//! run path reads a service's state without reaching up into the verb that starts services.
//!
//! Must never: take a pid for a service's without its start time ([`ProcId`]: a recycled pid is
//! not the same process).
//!
//! Guarded by `tests/box_services.rs`.

use std::fs;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use h5i_policy::receipt::ExitOutcome;
use serde::{Deserialize, Serialize};

use crate::error::BoxError;
use crate::file_lock::{FileLock, LockKind};
use crate::store::{write_atomic, BoxPaths, StoredBox};

/// `<box>/services/<svc>.json`: what the supervisor knows, written atomically.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServiceState {
    /// The service's name.
    pub service: String,
    /// The tier it runs at.
    pub tier: String,
    /// The supervisor's pid and start time (clock ticks since boot), for re-identification.
    pub supervisor: ProcId,
    /// The service's pid (the container init at the process tier), once it is known.
    pub pid: Option<ProcId>,
    /// Inode of the service's network namespace (process tier), so a joiner can check it.
    pub netns_ino: Option<u64>,
    /// The declared port, inside the box.
    pub port: Option<u16>,
    /// The host port that reaches it, when one does.
    pub host_port: Option<u16>,
    /// How the port is reached, or why it is not.
    pub port_note: Option<String>,
    /// When the supervisor started, ms since the epoch.
    pub started_ms: u64,
    /// How the service ended, once it has.
    pub exit: Option<ExitOutcome>,
    /// When it ended.
    pub ended_ms: Option<u64>,
    /// The receipt recording its run.
    pub receipt_seq: Option<u64>,
    /// The Podman container it runs as (the container tier's browser sidecar), which the
    /// box's runs join by name.
    #[serde(default)]
    pub container: Option<String>,
}

/// A process, named so it cannot be mistaken for a later one with the same pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcId {
    /// Its pid (in h5i's pid namespace).
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat`.
    pub start: u64,
}

impl ProcId {
    /// The live process with this pid, if it is the same one.
    pub fn of(pid: i32) -> Option<ProcId> {
        start_ticks(pid).map(|start| ProcId { pid, start })
    }

    /// Whether this process is still the one running under its pid.
    pub fn alive(&self) -> bool {
        start_ticks(self.pid) == Some(self.start)
    }

    /// A pidfd for this process, re-identified after opening (so it cannot be a recycled pid).
    pub(crate) fn pidfd(&self) -> Option<OwnedFd> {
        let fd = h5i_sys::pidfd::open(self.pid).ok()?;
        self.alive().then_some(fd)
    }
}

impl ServiceState {
    /// Whether the service is running now.
    pub fn alive(&self) -> bool {
        self.exit.is_none()
            && self.supervisor.alive()
            && self.pid.map(|p| p.alive()).unwrap_or(false)
    }
}

pub(crate) fn services_dir(paths: &BoxPaths) -> PathBuf {
    paths.dir.join("services")
}

pub(crate) fn state_path(paths: &BoxPaths, service: &str) -> PathBuf {
    services_dir(paths).join(format!("{service}.json"))
}

/// The last state written for `service`, if any.
pub fn read_state(paths: &BoxPaths, service: &str) -> Option<ServiceState> {
    let bytes = fs::read(state_path(paths, service)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Make `st` the service's state: its supervisor's first write, by which the service becomes
/// that supervisor's (a `start` removed the previous state first).
pub(crate) fn claim_state(paths: &BoxPaths, st: &ServiceState) -> Result<(), BoxError> {
    let _held = state_lock(paths, &st.service)?;
    write_state(paths, st)
}

/// Write `st` only while the service is still its supervisor's: false, and nothing written,
/// once a later `start` handed the service to another supervisor (the earlier one may still
/// be winding down, and its last words must not make the running service look ended).
pub(crate) fn update_state(paths: &BoxPaths, st: &ServiceState) -> Result<bool, BoxError> {
    let _held = state_lock(paths, &st.service)?;
    match read_state(paths, &st.service) {
        Some(now) if now.supervisor == st.supervisor => write_state(paths, st).map(|()| true),
        _ => Ok(false),
    }
}

/// The lock a supervisor holds across reading and writing its service's state.
fn state_lock(paths: &BoxPaths, service: &str) -> Result<FileLock, BoxError> {
    let path = services_dir(paths).join(format!("{service}.lock"));
    FileLock::wait(&path, LockKind::Exclusive).map_err(|e| BoxError::io(&path, e))
}

fn write_state(paths: &BoxPaths, st: &ServiceState) -> Result<(), BoxError> {
    let bytes = serde_json::to_vec_pretty(st).map_err(|e| BoxError::BadRequest {
        what: format!("cannot encode the state of service `{}`: {e}", st.service),
        mend: "report this as a bug".into(),
    })?;
    write_atomic(&state_path(paths, &st.service), &bytes)
}

/// Every state file of the box, by service name.
pub(crate) fn all_states(paths: &BoxPaths) -> Vec<ServiceState> {
    let Ok(entries) = fs::read_dir(services_dir(paths)) else {
        return Vec::new();
    };
    let mut out: Vec<ServiceState> = entries
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".json")
                .and_then(|svc| read_state(paths, svc))
        })
        .collect();
    out.sort_by(|a, b| a.service.cmp(&b.service));
    out
}

/// Every service of `sb` running now (what `freeze::hold` holds still).
pub fn live(sb: &StoredBox) -> Vec<ServiceState> {
    all_states(&sb.paths)
        .into_iter()
        .filter(ServiceState::alive)
        .collect()
}

// ---- one small safe wrapper per kernel call ----

/// Field 22 (starttime) of `/proc/<pid>/stat`, for a process that is not a zombie.
pub(crate) fn start_ticks(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}
