//! Holding a box still while a host verb reads (or rewrites) its tree.
//!
//! Owns [`hold`]: before `box export`, `apply`, `rebase` or `rm` looks at a workspace, every live
//! service of the box is stopped in place — its cgroup frozen (cgroup v1's `freezer` hierarchy,
//! v2's `cgroup.freeze`) at the process tier, its process group sent `SIGSTOP` at the workspace
//! tier — and [`Frozen`] thaws them when dropped, on every path out of the verb, error paths
//! included. Runs and shells need nothing here: they hold the box's lock shared, and those verbs
//! take it exclusively, so none is live while they read.
//!
//! Must never: freeze a cgroup that is not a box's own (a service's group must sit below an
//! `h5i` directory and must not hold h5i itself), report a service held that is still running,
//! or go ahead when one cannot be held (the verb is refused, naming the service and the mend).
//!
//! Guarded by `tests/export_race.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::BoxError;
use crate::service_state;
use crate::store::StoredBox;

/// How long a freezer may take to report every task frozen before the verb is refused.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// One thing held still, and how to let it go.
#[derive(Debug)]
enum Held {
    /// A cgroup's freezer: the control file and the value that thaws it.
    Cgroup {
        control: PathBuf,
        thaw: &'static str,
    },
    /// A workspace-tier service's process group, stopped with `SIGSTOP`.
    Group { pgid: i32 },
}

/// The box's services, held still until this is dropped.
#[derive(Debug, Default)]
pub struct Frozen {
    held: Vec<Held>,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for h in self.held.drain(..).rev() {
            match h {
                Held::Cgroup { control, thaw } => {
                    let _ = fs::write(&control, thaw);
                }
                Held::Group { pgid } => {
                    let _ = h5i_sys::proc::signal_group(pgid, libc::SIGCONT);
                }
            }
        }
    }
}

impl Frozen {
    /// How many services are held.
    pub fn count(&self) -> usize {
        self.held.len()
    }
}

/// Hold every live service of `sb` still. Call with the box's lock held exclusively.
pub fn hold(sb: &StoredBox) -> Result<Frozen, BoxError> {
    let mut frozen = Frozen::default();
    for st in service_state::live(sb) {
        let Some(pid) = st.pid else { continue };
        let refuse = |why: String| BoxError::ServiceNotHeld {
            name: sb.manifest.name.clone(),
            service: st.service.clone(),
            why,
        };
        if st.tier == h5i_policy::Tier::Workspace.as_str() {
            // The group the re-identified service leads.
            if let Err(e) = h5i_sys::proc::signal_group(pid.pid, libc::SIGSTOP) {
                return Err(refuse(e.to_string()));
            }
            frozen.held.push(Held::Group { pgid: pid.pid });
            wait_until(FREEZE_TIMEOUT, || process_stopped(pid.pid))
                .map_err(|()| refuse("its process did not stop".into()))?;
            continue;
        }
        let (control, freeze, thaw, done) = freezer_of(pid.pid).map_err(refuse)?;
        fs::write(&control, freeze)
            .map_err(|e| refuse(format!("writing {}: {e}", control.display())))?;
        frozen.held.push(Held::Cgroup {
            control: control.clone(),
            thaw,
        });
        wait_until(FREEZE_TIMEOUT, || done(&control))
            .map_err(|()| refuse(format!("{} never reported frozen", control.display())))?;
    }
    Ok(frozen)
}

/// Let a service go if a hold was left on it (h5i killed mid-verb leaves the group frozen, and a
/// frozen task cannot act on `SIGKILL`): `box service stop` calls this before it signals.
pub fn release(st: &service_state::ServiceState) {
    let Some(pid) = st.pid.filter(|p| p.alive()) else {
        return;
    };
    if st.tier == h5i_policy::Tier::Workspace.as_str() {
        // The group the re-identified service leads.
        let _ = h5i_sys::proc::signal_group(pid.pid, libc::SIGCONT);
    } else if let Ok((control, _, thaw, _)) = freezer_of(pid.pid) {
        let _ = fs::write(control, thaw);
    }
}

/// A freezer check: whether the group is frozen now.
type FrozenCheck = fn(&Path) -> bool;

/// The freezer control file of the cgroup `pid` is in, the values that freeze and thaw it, and
/// how to tell it is frozen.
fn freezer_of(pid: i32) -> Result<(PathBuf, &'static str, &'static str, FrozenCheck), String> {
    let theirs = fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("reading /proc/{pid}/cgroup: {e}"))?;
    let ours = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    if let (Some(path), Some(own)) = (v1_path(&theirs, "freezer"), v1_path(&ours, "freezer")) {
        check_boxed(&path, &own)?;
        let root = h5i_runtime::runc::cgroup::v1_controller_root(&mountinfo, "freezer")
            .ok_or("the freezer hierarchy is not mounted")?;
        let control = root
            .join(path.trim_start_matches('/'))
            .join("freezer.state");
        return Ok((control, "FROZEN", "THAWED", |p| {
            fs::read_to_string(p).is_ok_and(|s| s.trim() == "FROZEN")
        }));
    }
    let (Some(path), Some(own)) = (v2_path(&theirs), v2_path(&ours)) else {
        return Err("no freezer: neither a v1 freezer hierarchy nor cgroup v2 holds it".into());
    };
    check_boxed(&path, &own)?;
    let root = h5i_runtime::runc::cgroup::hierarchy_roots(
        &mountinfo,
        h5i_runtime::runc::cgroup::Layout::V2,
    )
    .into_iter()
    .next()
    .ok_or("cgroup2 is not mounted")?;
    let control = root
        .join(path.trim_start_matches('/'))
        .join("cgroup.freeze");
    Ok((control, "1", "0", |p| {
        let events = p.with_file_name("cgroup.events");
        fs::read_to_string(events).is_ok_and(|s| s.lines().any(|l| l.trim() == "frozen 1"))
    }))
}

/// Refuse a group that is not a box run's own: it must sit below an `h5i` directory, and must
/// not be h5i's own group or one of its ancestors (freezing that would freeze h5i).
fn check_boxed(path: &str, own: &str) -> Result<(), String> {
    let below_h5i = Path::new(path)
        .components()
        .rev()
        .skip(1)
        .any(|c| c.as_os_str() == "h5i");
    if !below_h5i {
        return Err(format!("its cgroup {path} is not one h5i made for a run"));
    }
    let own = Path::new(own);
    if own.starts_with(path) {
        return Err(format!("its cgroup {path} holds h5i itself"));
    }
    Ok(())
}

/// The path of the v1 hierarchy naming `controller` in `/proc/<pid>/cgroup` text.
fn v1_path(text: &str, controller: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

/// The unified hierarchy's path in `/proc/<pid>/cgroup` text.
fn v2_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
}

/// Whether `pid` is stopped (`T` in `/proc/<pid>/stat`).
fn process_stopped(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|c| c == 'T' || c == 't')
    })
}

/// Re-check `done` until it holds or `timeout` passes. The v1 freezer and a signalled stop have
/// no notification to wait on: a frozen state is only ever learnt by reading it again.
fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> Result<(), ()> {
    let start = Instant::now();
    loop {
        if done() {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_group_below_h5i_that_does_not_hold_h5i_is_frozen() {
        assert!(check_boxed("/s/h5i/p1-1-2/c", "/s").is_ok());
        assert!(check_boxed("/s/h5i/p1-1-2", "/s").is_ok());
        assert!(check_boxed("/s", "/s").is_err());
        assert!(check_boxed("/", "/s").is_err());
        assert!(check_boxed("/s/h5i", "/s/h5i/me").is_err());
        assert!(check_boxed("/s/h5i/x", "/s/h5i/x/y").is_err());
        assert!(check_boxed("/s/other/c", "/s").is_err());
    }

    #[test]
    fn proc_cgroup_lines_parse_for_both_layouts() {
        let v1 = "12:freezer:/a/h5i/r/c\n11:memory:/a\n0::/\n";
        assert_eq!(v1_path(v1, "freezer").as_deref(), Some("/a/h5i/r/c"));
        assert_eq!(v1_path(v1, "pids"), None);
        assert_eq!(v2_path("0::/x/h5i/r\n").as_deref(), Some("/x/h5i/r"));
    }
}
