//! `h5i browser status|take|release`: the control lock of a box's browser.
//!
//! Owns `<box>/browser/control.json` (who holds the browser: the agent, by default, or a human
//! who took it; since when; by which host user; whether the agent's @refs went stale when a
//! human handed control back) and `<box>/browser/control.lock`, both outside every grant: the
//! box can neither write nor read them. Take and release are read-modify-write under that lock,
//! the file replaced atomically, so a killed verb leaves the old state whole; each lands in the
//! receipt log as a `viewer`-lane record. The relay (`super::relay`) reads the file on every
//! request the agent sends and enforces it.
//!
//! A lock a viewer took (`h5i box view`'s page, `--term`'s `i`) names that viewer process by
//! pid and start time; a viewer that leaves hands it back itself, and one that was killed
//! while it held the lock cannot, so [`current`] (run by `h5i browser status|take|release`,
//! and by the relay before it judges an agent's request that a human's lock would refuse)
//! hands a lock whose viewer is gone back to the agent and records that in the `viewer` lane.
//! A lock taken with `h5i browser take` names no process and is only ever released by its
//! taker.
//!
//! Must never: let a human take control that a human already holds (a second take is refused,
//! never silently re-stamped), let anyone but the host user who took it release it (but h5i
//! for a viewer that has ended), or mark the refs fresh on anything but a snapshot the daemon
//! answered.
//!
//! Guarded by the unit tests below and `tests/browser.rs`.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use h5i_policy::receipt::{ReceiptLane, RecordBody};
use serde::{Deserialize, Serialize};

pub(super) use crate::browser_box::append_record;
use crate::error::BoxError;
use crate::file_lock::{FileLock, LockKind};
use crate::service_state::ProcId;
use crate::store::{now_ms, write_atomic, BoxPaths, BoxStore, StoredBox};

/// Who drives a box's browser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Holder {
    /// The agent in the box (the default: a box exists to let an agent work).
    Agent,
    /// A human on the host, who took it.
    Human,
}

impl Holder {
    /// The holder's name as printed and recorded.
    pub fn as_str(self) -> &'static str {
        match self {
            Holder::Agent => "agent",
            Holder::Human => "human",
        }
    }
}

/// The control lock's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    /// Who holds control.
    pub holder: Holder,
    /// Since when, ms since the epoch (0: since the box was made).
    pub since_ms: u64,
    /// The host uid of the human who took it, while a human holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_by_uid: Option<u32>,
    /// The viewer process that took it, while a human holds it through a viewer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viewer: Option<ProcId>,
    /// Whether the agent's @refs predate a human's turn: acting on one is refused until the
    /// agent snapshots again.
    pub refs_stale: bool,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            holder: Holder::Agent,
            since_ms: 0,
            taken_by_uid: None,
            viewer: None,
            refs_stale: false,
        }
    }
}

/// Why a control verb refused.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A human already holds the browser.
    #[error("refusing: a human already holds the browser of box `{name}` (taken by {by} at {since}); to fix: `h5i browser release {name}` first")]
    AlreadyHeld {
        /// The box.
        name: String,
        /// Who took it.
        by: String,
        /// When.
        since: String,
    },
    /// Nobody but the agent holds it: nothing to release.
    #[error("refusing: the agent holds the browser of box `{name}`, so there is nothing to release; to fix: `h5i browser take {name}` takes it")]
    NotHeld {
        /// The box.
        name: String,
    },
    /// Another host user took it.
    #[error("refusing: the browser of box `{name}` was taken by {by}, not by you; to fix: ask {by} to run `h5i browser release {name}`")]
    NotTaker {
        /// The box.
        name: String,
        /// Who took it.
        by: String,
    },
    /// The box is not a browser box.
    #[error("refusing: box `{name}` has no browser (its policy does not grant `~/.agent-browser` and `net.unix`); to fix: create the box with `--profile browser`")]
    NoBrowser {
        /// The box.
        name: String,
    },
    /// A box-level refusal.
    #[error(transparent)]
    Box(#[from] BoxError),
}

/// The box's browser directory on the host (the control and viewer state).
pub(super) fn dir(paths: &BoxPaths) -> PathBuf {
    paths.dir.join("browser")
}

fn state_path(paths: &BoxPaths) -> PathBuf {
    dir(paths).join("control.json")
}

/// The control state of the box at `paths` (the default when none was ever written or the
/// file does not parse: the agent holds it).
pub fn read(paths: &BoxPaths) -> Control {
    fs::read(state_path(paths))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The host user `uid` as printed: `name (uid N)`.
pub fn user_label(uid: u32) -> String {
    let name = fs::read_to_string("/etc/passwd").ok().and_then(|t| {
        t.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2] == uid.to_string()).then(|| f[0].to_string())
        })
    });
    match name {
        Some(n) => format!("{n} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// `ms` (since the epoch) as printed: how long ago.
pub fn ago(ms: u64) -> String {
    format!("{} s ago", now_ms().saturating_sub(ms) / 1000)
}

pub(super) fn caller_uid() -> u32 {
    h5i_sys::ids::uid()
}

/// Held for a read-modify-write of the control state.
struct ControlLock {
    _held: FileLock,
}

impl ControlLock {
    fn take(paths: &BoxPaths) -> Result<ControlLock, BoxError> {
        let d = dir(paths);
        match fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(BoxError::io(&d, e)),
        }
        let p = d.join("control.lock");
        let held = FileLock::wait(&p, LockKind::Exclusive).map_err(|e| BoxError::io(&p, e))?;
        Ok(ControlLock { _held: held })
    }
}

/// Change the control state under the lock; `change` decides, refusing or returning the new
/// state, which is written atomically.
fn update(
    paths: &BoxPaths,
    change: impl FnOnce(Control) -> Result<Control, ControlError>,
) -> Result<Control, ControlError> {
    let _lock = ControlLock::take(paths)?;
    let next = change(read(paths))?;
    let bytes = serde_json::to_vec_pretty(&next).map_err(|e| BoxError::BadRequest {
        what: format!("cannot encode the control state: {e}"),
        mend: "report this as a bug".into(),
    })?;
    write_atomic(&state_path(paths), &bytes)?;
    Ok(next)
}

/// Box `name`, refused unless it is a browser box.
pub(super) fn browser_box(store: &BoxStore, name: &str) -> Result<StoredBox, ControlError> {
    let sb = store.find(name)?;
    let policy = crate::store::load_policy(&sb)?;
    if !super::is_browser_box(&policy) {
        return Err(ControlError::NoBrowser {
            name: name.to_string(),
        });
    }
    Ok(sb)
}

fn record(sb: &StoredBox, action: &str, holder: Holder) -> Result<(), BoxError> {
    record_viewer(
        sb,
        RecordBody::Control {
            action: action.to_string(),
            holder: holder.as_str().to_string(),
            by: user_label(caller_uid()),
        },
    )
}

/// Append `body` to box `sb`'s receipt log in the `viewer` lane.
pub(super) fn record_viewer(sb: &StoredBox, body: RecordBody) -> Result<(), BoxError> {
    append_record(sb, ReceiptLane::Viewer, Vec::new(), body)
}

/// Whether `c` is a human's lock taken through a viewer process that has ended.
fn held_by_a_gone_viewer(c: &Control) -> Option<ProcId> {
    c.viewer.filter(|v| c.holder == Holder::Human && !v.alive())
}

/// The control state of box `sb`, after handing a lock whose viewer has ended back to the
/// agent (recorded in the `viewer` lane as a release by h5i for that viewer).
pub fn current(sb: &StoredBox) -> Result<Control, ControlError> {
    let c = read(&sb.paths);
    if held_by_a_gone_viewer(&c).is_none() {
        return Ok(c);
    }
    let mut gone = None;
    let next = update(&sb.paths, |c| {
        gone = held_by_a_gone_viewer(&c).zip(c.taken_by_uid);
        Ok(match gone {
            Some(_) => Control {
                holder: Holder::Agent,
                since_ms: now_ms(),
                taken_by_uid: None,
                viewer: None,
                refs_stale: true,
            },
            None => c,
        })
    })?;
    if let Some((viewer, uid)) = gone {
        record_viewer(
            sb,
            RecordBody::Control {
                action: "release".to_string(),
                holder: Holder::Agent.as_str().to_string(),
                by: format!(
                    "h5i: the viewer of {} (pid {}) ended while it held control",
                    user_label(uid),
                    viewer.pid
                ),
            },
        )?;
    }
    Ok(next)
}

/// The control state at `paths` as the relay judges an agent's request by: [`current`], when a
/// human's lock names a viewer that has ended (the box's manifest read for the record); the
/// state as read otherwise, or when that fails (a human's lock then still refuses the agent).
pub fn read_for_agent(paths: &BoxPaths) -> Control {
    let c = read(paths);
    if held_by_a_gone_viewer(&c).is_none() {
        return c;
    }
    let sb = match crate::store::read_manifest(paths) {
        Ok(manifest) => StoredBox {
            paths: paths.clone(),
            manifest,
        },
        Err(_) => return c,
    };
    current(&sb).unwrap_or(c)
}

/// `h5i browser status NAME`.
pub fn status(store: &BoxStore, name: &str) -> Result<Control, ControlError> {
    let sb = browser_box(store, name)?;
    current(&sb)
}

/// `h5i browser take NAME`: a human takes control (never asks). Refused while a human holds it.
pub fn take(store: &BoxStore, name: &str) -> Result<Control, ControlError> {
    change(store, name, "take", None, decide_take)
}

/// A viewer process (this one) takes control for its human: [`take`], naming the viewer, so a
/// viewer killed while it holds the lock does not hold it for ever ([`current`]).
pub fn take_for_viewer(store: &BoxStore, name: &str) -> Result<Control, ControlError> {
    let me = ProcId::of(std::process::id() as i32).ok_or_else(|| {
        ControlError::Box(BoxError::BadRequest {
            what: "cannot read this viewer's own start time in /proc/self/stat".into(),
            mend: "mount /proc, or take control with `h5i browser take`".into(),
        })
    })?;
    change(store, name, "take", Some(me), decide_take)
}

/// Apply `decide` for the calling host user (through `viewer`, when a viewer process acts)
/// under the lock, and record it as `action`.
fn change(
    store: &BoxStore,
    name: &str,
    action: &str,
    viewer: Option<ProcId>,
    decide: fn(Control, u32, Option<ProcId>, &str) -> Result<Control, ControlError>,
) -> Result<Control, ControlError> {
    let sb = browser_box(store, name)?;
    current(&sb)?;
    let me = caller_uid();
    let next = update(&sb.paths, |c| decide(c, me, viewer, name))?;
    record(&sb, action, next.holder)?;
    Ok(next)
}

/// The state after host user `me` (through `viewer`) takes control from `c`, or why not.
fn decide_take(
    c: Control,
    me: u32,
    viewer: Option<ProcId>,
    name: &str,
) -> Result<Control, ControlError> {
    match c.holder {
        Holder::Human => Err(ControlError::AlreadyHeld {
            name: name.to_string(),
            by: user_label(c.taken_by_uid.unwrap_or(u32::MAX)),
            since: ago(c.since_ms),
        }),
        Holder::Agent => Ok(Control {
            holder: Holder::Human,
            since_ms: now_ms(),
            taken_by_uid: Some(me),
            viewer,
            refs_stale: c.refs_stale,
        }),
    }
}

/// The state after host user `me` releases control held as `c`, or why not.
fn decide_release(
    c: Control,
    me: u32,
    _viewer: Option<ProcId>,
    name: &str,
) -> Result<Control, ControlError> {
    match (c.holder, c.taken_by_uid) {
        (Holder::Agent, _) => Err(ControlError::NotHeld {
            name: name.to_string(),
        }),
        (Holder::Human, Some(uid)) if uid != me => Err(ControlError::NotTaker {
            name: name.to_string(),
            by: user_label(uid),
        }),
        (Holder::Human, _) => Ok(Control {
            holder: Holder::Agent,
            since_ms: now_ms(),
            taken_by_uid: None,
            viewer: None,
            refs_stale: true,
        }),
    }
}

/// `h5i browser release NAME`: the human who took control hands it back; every @ref the agent
/// holds is stale from here until it snapshots again.
pub fn release(store: &BoxStore, name: &str) -> Result<Control, ControlError> {
    change(store, name, "release", None, decide_release)
}

/// The agent snapshotted (the daemon answered a snapshot): its refs are fresh again. A no-op
/// unless they were stale.
pub fn refs_refreshed(paths: &BoxPaths) -> Result<(), ControlError> {
    if !read(paths).refs_stale {
        return Ok(());
    }
    update(paths, |c| {
        Ok(Control {
            refs_stale: false,
            ..c
        })
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_garbled_state_means_the_agent_holds_control() {
        let t = tempfile::tempdir().unwrap();
        let paths = BoxPaths {
            dir: t.path().to_path_buf(),
        };
        assert_eq!(read(&paths), Control::default());
        fs::create_dir(dir(&paths)).unwrap();
        fs::write(state_path(&paths), b"{\"holder\":\"root\"").unwrap();
        assert_eq!(read(&paths).holder, Holder::Agent);
    }

    #[test]
    fn a_second_take_and_a_release_by_anyone_but_the_taker_are_refused() {
        let held = decide_take(Control::default(), 1000, None, "web").unwrap();
        assert_eq!(held.holder, Holder::Human);
        assert_eq!(held.taken_by_uid, Some(1000));
        let again = decide_take(held.clone(), 1000, None, "web").unwrap_err();
        assert!(matches!(again, ControlError::AlreadyHeld { .. }), "{again}");
        let other = decide_release(held.clone(), 1001, None, "web").unwrap_err();
        assert!(matches!(other, ControlError::NotTaker { .. }), "{other}");
        assert!(other.to_string().contains("to fix: ask"), "{other}");
        let back = decide_release(held, 1000, None, "web").unwrap();
        assert_eq!(back.holder, Holder::Agent);
        assert!(back.refs_stale);
        let none = decide_release(back, 1000, None, "web").unwrap_err();
        assert!(matches!(none, ControlError::NotHeld { .. }), "{none}");
    }

    #[test]
    fn only_a_lock_naming_a_viewer_that_ended_is_a_gone_viewers() {
        let me = ProcId::of(std::process::id() as i32).unwrap();
        let gone = ProcId {
            pid: me.pid,
            start: me.start + 1,
        };
        let by = |viewer| decide_take(Control::default(), 1000, viewer, "web").unwrap();
        assert_eq!(held_by_a_gone_viewer(&by(Some(me))), None);
        assert_eq!(held_by_a_gone_viewer(&by(None)), None);
        assert_eq!(held_by_a_gone_viewer(&by(Some(gone))), Some(gone));
        let back = decide_release(by(Some(gone)), 1000, None, "web").unwrap();
        assert_eq!(back.viewer, None);
        assert_eq!(held_by_a_gone_viewer(&back), None);
    }

    #[test]
    fn a_snapshot_clears_stale_refs_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let paths = BoxPaths {
            dir: t.path().to_path_buf(),
        };
        let c = update(&paths, |c| {
            Ok(Control {
                refs_stale: true,
                since_ms: 7,
                ..c
            })
        })
        .unwrap();
        assert!(c.refs_stale);
        refs_refreshed(&paths).unwrap();
        let after = read(&paths);
        assert!(!after.refs_stale);
        assert_eq!(after.since_ms, 7);
        assert_eq!(after.holder, Holder::Agent);
    }
}
