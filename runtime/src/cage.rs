//! The resource cage: one cgroup per box run, made by h5i under its own cgroup, holding the
//! policy's `mem` and `procs` limits, with the container placed inside it.
//!
//! Owning the parent group (rather than letting the runtime make and delete the container's own)
//! is what lets h5i read the evidence after the run: the OOM kill count, the peak and the limit
//! (v1 `memory.oom_control` / `memory.max_usage_in_bytes`, v2 `memory.events` / `memory.peak`),
//! `pids.events`, and the box's own CPU time and memory peak for a tier whose supervised child
//! is not the box ([`CageReport::usage`]: v1 `cpuacct.usage*` at the cage's path in the cpuacct
//! hierarchy, v2 `cpu.stat`). A parent's counters include every descendant's, also after the
//! runtime removed the container's own group. Works on cgroup v2 and on v1 (hybrid included); on v1 every controller
//! gets the same relative path, since libcontainer places a container at one path in all of them.
//!
//! On v1 the `oom_kill` counter is local to the victim's own group (the container's, which the
//! runtime deletes with the container), so the cage registers an eventfd on its own
//! `memory.oom_control` instead: the kernel signals it for every OOM at the cage's limit, and
//! the count is read after the run.
//!
//! Must never: create a group outside the caller's own cgroup, leave a group behind after the
//! run, or report a limit as held when writing it failed.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use h5i_policy::receipt::{CgroupUsage, OomReport};

use crate::runc::cgroup::{anchor_from, detect_layout, v1_controller_root, Layout};

/// Why a cage could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CageError {
    /// The layout or own group could not be found.
    #[error(transparent)]
    Cgroup(#[from] crate::runc::cgroup::CgroupError),
    /// A group directory or limit file could not be written.
    #[error("refusing: cannot hold the box's {what} limit: {path}: {source}; to fix: run as root, or have root delegate a cgroup to you (make setup does it for the test user)")]
    Write {
        /// Which limit.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// What the cage saw, read after the run.
#[derive(Debug, Clone, Default)]
pub struct CageReport {
    /// OOM evidence, when the memory controller killed something.
    pub oom: Option<OomReport>,
    /// How many forks the pids limit refused.
    pub pids_refused: u64,
    /// The CPU time and memory peak charged to the cage (each absent when unreadable, or when
    /// nothing was ever charged there: a box that ran always used some).
    pub usage: CgroupUsage,
}

/// One run's cgroup.
#[derive(Debug)]
pub struct ResourceCage {
    layout: Layout,
    /// Path relative to each hierarchy root.
    relative: PathBuf,
    /// Hierarchy roots this cage made directories in (v1: memory, pids; v2: the unified root).
    roots: Vec<PathBuf>,
    /// Directories created, outermost first, per root.
    created: Vec<PathBuf>,
    mem_limit: Option<u64>,
    /// v1: eventfd the kernel signals on each OOM at this cage's limit, and the
    /// `memory.oom_control` file it is registered against (kept open for the registration's life).
    oom_events: Option<(OwnedFd, fs::File)>,
    /// [`ResourceCage::keep`] was called: dropping removes nothing.
    kept: bool,
}

const V1_CONTROLLERS: [&str; 2] = ["memory", "pids"];

impl ResourceCage {
    /// Make `<own cgroup>/h5i/<run_id>` and write the limits. `run_id` must be a plain name.
    pub fn create(run_id: &str, mem: Option<u64>, procs: Option<u64>) -> Result<Self, CageError> {
        let (layout, relative, roots) = locate(run_id)?;
        let mut cage = ResourceCage {
            layout,
            relative,
            roots,
            created: Vec::new(),
            mem_limit: mem,
            oom_events: None,
            kept: false,
        };
        for root in cage.roots.clone() {
            cage.make_dirs(&root)?;
        }
        if let Some(m) = mem {
            let (file, dir) = match layout {
                Layout::V2 => ("memory.max", cage.dir_for(0)),
                Layout::V1 => ("memory.limit_in_bytes", cage.dir_for(0)),
            };
            write_limit(&dir.join(file), &m.to_string(), "mem")?;
            if layout == Layout::V2 {
                // No swap: the ceiling is the ceiling.
                let _ = fs::write(dir.join("memory.swap.max"), "0");
            } else {
                cage.oom_events =
                    Some(
                        register_oom_eventfd(&dir).map_err(|source| CageError::Write {
                            what: "mem",
                            path: dir.join("cgroup.event_control"),
                            source,
                        })?,
                    );
            }
        }
        if let Some(p) = procs {
            let dir = match layout {
                Layout::V2 => cage.dir_for(0),
                Layout::V1 => cage.dir_for(1),
            };
            write_limit(&dir.join("pids.max"), &p.to_string(), "procs")?;
        }
        Ok(cage)
    }

    fn dir_for(&self, root: usize) -> PathBuf {
        self.roots[root].join(&self.relative)
    }

    fn make_dirs(&mut self, root: &Path) -> Result<(), CageError> {
        let mut cur = root.to_path_buf();
        for comp in self.relative.components() {
            cur.push(comp);
            match fs::create_dir(&cur) {
                Ok(()) => self.created.push(cur.clone()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(source) => {
                    return Err(CageError::Write {
                        what: "cgroup",
                        path: cur,
                        source,
                    })
                }
            }
        }
        Ok(())
    }

    /// Hand the cage to `uid`/`gid`, a rootless engine root starts (the container tier): the
    /// engine's runtime then makes the container's group inside it. On v1 the cage's path is
    /// made in every mounted hierarchy (a runtime places a container at one path in all of
    /// them), with cpuset's `cpus`/`mems` filled down the path from the nearest non-empty
    /// ancestor (a new cpuset group is empty, and the engine could not fill its parents); in
    /// each, the cage directory, `cgroup.procs` and `tasks` become the engine's. On v2 the
    /// directory, `cgroup.procs`, `cgroup.subtree_control` and `cgroup.threads`. The limit files
    /// stay root's: the engine can place its container inside, never raise a limit.
    pub fn delegate_to(&mut self, uid: u32, gid: u32) -> Result<(), CageError> {
        let roots: Vec<PathBuf> = match self.layout {
            Layout::V2 => self.roots.clone(),
            Layout::V1 => {
                let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
                crate::runc::cgroup::hierarchy_roots(&mountinfo, Layout::V1)
            }
        };
        let files: &[&str] = match self.layout {
            Layout::V2 => &["cgroup.procs", "cgroup.subtree_control", "cgroup.threads"],
            Layout::V1 => &["cgroup.procs", "tasks"],
        };
        for root in roots {
            self.make_dirs(&root)?;
            let dir = root.join(&self.relative);
            if dir.join("cpuset.cpus").exists() {
                fill_cpuset(&root, &self.relative)?;
            }
            for path in std::iter::once(dir.clone()).chain(files.iter().map(|f| dir.join(f))) {
                if path.exists() {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(|source| {
                        CageError::Write {
                            what: "cgroup",
                            path,
                            source,
                        }
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Every process in the cage's groups (its own and every group below), read from the
    /// first hierarchy: what a wall-clock kill of a container placed here must reach.
    pub fn member_pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut stack = vec![self.dir_for(0)];
        while let Some(dir) = stack.pop() {
            if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            if let Ok(entries) = fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        pids
    }

    /// Place process `pid` (a host pid) in the cage, in every hierarchy it holds.
    pub fn admit(&self, pid: i32) -> Result<(), (PathBuf, io::Error)> {
        for root in &self.roots {
            let path = root.join(&self.relative).join("cgroup.procs");
            fs::write(&path, pid.to_string()).map_err(|e| (path, e))?;
        }
        Ok(())
    }

    /// The cage's `cgroup.procs` files, opened now (close-on-exec) for a child to enter the
    /// cage itself between fork and exec ([`Entry::enter_in_child`]), so the program it execs
    /// is charged to the cage from its first allocation. Opened by this process, so the
    /// kernel checks the move against this process's credentials, not the child's.
    pub fn entry(&self) -> Result<Entry, (PathBuf, io::Error)> {
        let procs = self
            .roots
            .iter()
            .map(|root| {
                let path = root.join(&self.relative).join("cgroup.procs");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map(OwnedFd::from)
                    .map_err(|e| (path, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Entry { procs })
    }

    /// SIGKILL every process in the cage's groups and wait (on pidfds, bounded) until they
    /// are gone; repeated until a read of the group finds it empty, so a child forked while
    /// the kill was under way is killed too.
    pub fn kill_members(&self) {
        for _ in 0..64 {
            let pids = self.member_pids();
            if pids.is_empty() {
                return;
            }
            let fds = signal_each(pids, libc::SIGKILL);
            for fd in &fds {
                let _ = h5i_sys::pidfd::wait_exited(fd, std::time::Duration::from_secs(1));
            }
        }
    }

    /// Send `signal` once to every process in the cage's groups, as a terminal sends an
    /// interrupt to its foreground group (the processes decide what it means; nothing waits).
    pub fn signal_members(&self, signal: libc::c_int) {
        signal_each(self.member_pids(), signal);
    }

    /// Keep the cage's groups after this value is gone (the box sandbox's group outlives the
    /// run that made it); [`remove_tree`] removes them.
    pub fn keep(mut self) {
        self.created.clear();
        self.roots.clear();
        self.kept = true;
    }

    /// The `linux.cgroupsPath` that places the container inside this cage.
    pub fn container_path(&self) -> String {
        format!("/{}/c", self.relative.display())
    }

    /// The cage's own path (relative to each hierarchy root), for a runtime that makes the
    /// container's group inside it itself (Podman's `--cgroup-parent`).
    pub fn path(&self) -> String {
        format!("/{}", self.relative.display())
    }

    /// Read the evidence. Call after the container has exited.
    pub fn report(&self) -> CageReport {
        let read = |p: PathBuf| fs::read_to_string(p).unwrap_or_default();
        let field = |text: &str, key: &str| {
            text.lines().find_map(|l| {
                l.strip_prefix(key)
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
        };
        let (kills, peak) = match self.layout {
            Layout::V2 => {
                let d = self.dir_for(0);
                (
                    field(&read(d.join("memory.events")), "oom_kill ").unwrap_or(0),
                    read(d.join("memory.peak")).trim().parse().ok(),
                )
            }
            Layout::V1 => {
                let d = self.dir_for(0);
                (
                    self.oom_events
                        .as_ref()
                        .map_or(0, |(efd, _)| read_eventfd(efd)),
                    read(d.join("memory.max_usage_in_bytes"))
                        .trim()
                        .parse()
                        .ok(),
                )
            }
        };
        let pids_dir = match self.layout {
            Layout::V2 => self.dir_for(0),
            Layout::V1 => self.dir_for(1),
        };
        let pids_refused = field(&read(pids_dir.join("pids.events")), "max ").unwrap_or(0);
        let cpu_dir = match self.layout {
            Layout::V2 => Some(self.dir_for(0)),
            Layout::V1 => v1_controller_root(
                &fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
                "cpuacct",
            )
            .map(|root| root.join(&self.relative)),
        };
        let mut usage = cpu_dir
            .map(|d| cpu_usage(self.layout, &d))
            .unwrap_or_default();
        usage.mem_peak_bytes = peak.filter(|p| *p > 0);
        CageReport {
            oom: (kills > 0).then(|| OomReport {
                limit_bytes: self.mem_limit.unwrap_or(0),
                peak_bytes: peak,
                kill_count: kills,
            }),
            pids_refused,
            usage,
        }
    }
}

/// The CPU figures of the cgroup at `dir`, microseconds; each absent when its file is
/// missing or unparsable, all absent when the total is zero (nothing ever ran there, so the
/// box was not placed in this hierarchy and the numbers are not its own).
fn cpu_usage(layout: Layout, dir: &Path) -> CgroupUsage {
    let read = |name: &str| fs::read_to_string(dir.join(name)).ok();
    let (cpu, user, sys) = match layout {
        Layout::V1 => {
            let us = |name: &str| {
                read(name)
                    .and_then(|t| t.trim().parse::<u64>().ok())
                    .map(|ns| ns / 1000)
            };
            (
                us("cpuacct.usage"),
                us("cpuacct.usage_user"),
                us("cpuacct.usage_sys"),
            )
        }
        Layout::V2 => {
            let stat = read("cpu.stat").unwrap_or_default();
            let key = |k: &str| {
                stat.lines().find_map(|l| {
                    let (name, value) = l.split_once(' ')?;
                    (name == k)
                        .then(|| value.trim().parse::<u64>().ok())
                        .flatten()
                })
            };
            (key("usage_usec"), key("user_usec"), key("system_usec"))
        }
    };
    if cpu.unwrap_or(0) == 0 {
        return CgroupUsage::default();
    }
    CgroupUsage {
        cpu_us: cpu,
        user_us: user,
        sys_us: sys,
        mem_peak_bytes: None,
    }
}

/// v1 OOM notification: `<eventfd> <fd of memory.oom_control>` into `cgroup.event_control`.
fn register_oom_eventfd(dir: &Path) -> io::Result<(OwnedFd, fs::File)> {
    let control = fs::File::open(dir.join("memory.oom_control"))?;
    let efd = rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
    )?;
    let line = format!("{} {}", efd.as_raw_fd(), control.as_raw_fd());
    fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.event_control"))?
        .write_all(line.as_bytes())?;
    Ok((efd, control))
}

/// The eventfd's counter (0 when it never fired).
/// Send `signal` to each of `pids` through a pidfd (so a pid reused since the group was read is
/// never signalled); the pidfds are returned for the caller to wait on.
fn signal_each(pids: Vec<i32>, signal: libc::c_int) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    for pid in pids {
        let Ok(fd) = h5i_sys::pidfd::open(pid) else {
            continue;
        };
        // The pidfd names the process read from the group, never a reused pid; one that ended
        // since is waited on all the same (its pidfd is readable at once).
        let _ = h5i_sys::pidfd::send_signal(&fd, signal);
        fds.push(fd);
    }
    fds
}

fn read_eventfd(fd: &OwnedFd) -> u64 {
    let mut v = [0u8; 8];
    match rustix::io::read(fd, &mut v) {
        Ok(8) => u64::from_ne_bytes(v),
        _ => 0,
    }
}

/// Fill empty `cpuset.cpus`/`cpuset.mems` down `relative` under the cpuset hierarchy `root`,
/// each from its parent.
fn fill_cpuset(root: &Path, relative: &Path) -> Result<(), CageError> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let mut cur = root.to_path_buf();
        let mut value = fs::read_to_string(cur.join(file)).unwrap_or_default();
        for comp in relative.components() {
            cur.push(comp);
            let here = fs::read_to_string(cur.join(file)).unwrap_or_default();
            if here.trim().is_empty() {
                write_limit(&cur.join(file), value.trim(), "cgroup")?;
            } else {
                value = here;
            }
        }
    }
    Ok(())
}

fn write_limit(path: &Path, value: &str, what: &'static str) -> Result<(), CageError> {
    fs::write(path, value).map_err(|source| CageError::Write {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The names of the groups directly below cage `id`'s group in the first hierarchy (empty
/// when it does not exist).
pub fn children(id: &str) -> Vec<String> {
    subgroups(Path::new(id))
}

/// The names of every cage under the caller's own group (`<own cgroup>/h5i/*`), in the first
/// hierarchy.
pub fn cages() -> Vec<String> {
    subgroups(Path::new(""))
}

/// The groups directly below `<own cgroup>/h5i/<below>` in the first hierarchy.
fn subgroups(below: &Path) -> Vec<String> {
    let Ok(layout) = detect_layout() else {
        return Vec::new();
    };
    let Some(anchor) = fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|own| anchor_from(&own, layout).ok())
    else {
        return Vec::new();
    };
    let root = match layout {
        Layout::V2 => PathBuf::from("/sys/fs/cgroup"),
        Layout::V1 => Path::new("/sys/fs/cgroup").join(V1_CONTROLLERS[0]),
    };
    let mut rel = anchor.join("h5i");
    if !below.as_os_str().is_empty() {
        rel.push(below);
    }
    let dir = root.join(rel.strip_prefix("/").unwrap_or(&rel));
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Where cage `run_id`'s groups are: the layout, the path below each hierarchy root, and the
/// roots of the hierarchies a cage makes groups in.
fn locate(run_id: &str) -> Result<(Layout, PathBuf, Vec<PathBuf>), CageError> {
    let layout = detect_layout()?;
    let own = fs::read_to_string("/proc/self/cgroup").map_err(|source| {
        crate::runc::cgroup::CgroupError::Read {
            path: "/proc/self/cgroup",
            source,
        }
    })?;
    let anchor = anchor_from(&own, layout)?;
    let relative = anchor
        .join("h5i")
        .join(run_id)
        .strip_prefix("/")
        .map(Path::to_path_buf)
        .unwrap_or_else(|_| anchor.join("h5i").join(run_id));
    let roots: Vec<PathBuf> = match layout {
        Layout::V2 => vec![PathBuf::from("/sys/fs/cgroup")],
        Layout::V1 => V1_CONTROLLERS
            .iter()
            .map(|c| Path::new("/sys/fs/cgroup").join(c))
            .collect(),
    };
    Ok((layout, relative, roots))
}

/// Remove cage `id`'s groups in its hierarchies, deepest first, only where they are empty:
/// nothing is signalled and nothing made, so a group that still holds a process (or is in use
/// by its owner) stays. For sweeping what a process that is gone left behind, where a name's
/// owner can only be guessed.
pub fn remove_empty_tree(id: &str) {
    let Ok((layout, relative, roots)) = locate(id) else {
        return;
    };
    for root in every_hierarchy(layout, roots) {
        rmdir_deepest_first(&root.join(&relative));
    }
}

/// Remove the groups of a kept cage `id` (as given to [`ResourceCage::create`]) in every
/// hierarchy, deepest first, killing what is still inside. rmdir only succeeds on an empty
/// group, so a group something still lives in is left, never forced.
pub fn remove_tree(id: &str) -> Result<(), CageError> {
    let cage = ResourceCage::create(id, None, None)?;
    cage.kill_members();
    for root in every_hierarchy(cage.layout, cage.roots.clone()) {
        rmdir_deepest_first(&root.join(&cage.relative));
    }
    Ok(())
}

/// `roots` and, on v1, every other mounted hierarchy (a group another tool made for the cage
/// in a controller h5i does not use goes too).
fn every_hierarchy(layout: Layout, mut roots: Vec<PathBuf>) -> Vec<PathBuf> {
    if layout == Layout::V1 {
        if let Ok(entries) = fs::read_dir("/sys/fs/cgroup") {
            for e in entries.flatten() {
                let p = e.path();
                if p.join("cgroup.procs").exists() && !roots.contains(&p) {
                    roots.push(p);
                }
            }
        }
    }
    roots
}

/// rmdir `top` and every group below it, deepest first; a group that is not empty stays.
fn rmdir_deepest_first(top: &Path) {
    let mut dirs = Vec::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = fs::read_dir(&d) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        dirs.push(d);
    }
    for d in dirs.iter().rev() {
        let _ = fs::remove_dir(d);
    }
}

/// A cage's `cgroup.procs` files, open for a forked child to move itself in before `exec`
/// ([`ResourceCage::entry`]).
#[derive(Debug)]
pub struct Entry {
    procs: Vec<OwnedFd>,
}

impl Entry {
    /// Move the calling process into the cage (write `0` to each `cgroup.procs`).
    ///
    /// # Safety
    /// Call only in a forked child before `exec`: it makes only `write(2)` calls, which are
    /// async-signal-safe, on descriptors opened before the fork.
    pub unsafe fn enter_in_child(&self) -> io::Result<()> {
        for fd in &self.procs {
            // One system call on a static buffer: async-signal-safe.
            if rustix::io::write(fd, b"0\n")? != 2 {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        Ok(())
    }
}

impl Drop for ResourceCage {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        // On v1 the runtime places the container at `<relative>/c` in every hierarchy, making
        // `<relative>` itself in the controllers the cage does not hold (cpuset, devices, ...);
        // its delete removes only `c`. Both levels go here, in every hierarchy, deepest first
        // (rmdir of a cgroup succeeds only when it is empty, so nothing live is touched).
        let mut roots = self.roots.clone();
        if self.layout == Layout::V1 {
            if let Ok(entries) = fs::read_dir("/sys/fs/cgroup") {
                for e in entries.flatten() {
                    let p = e.path();
                    if p.join("cgroup.procs").exists() && !roots.contains(&p) {
                        roots.push(p);
                    }
                }
            }
        }
        for root in &roots {
            let _ = fs::remove_dir(root.join(&self.relative).join("c"));
            if !self.roots.contains(root) {
                let _ = fs::remove_dir(root.join(&self.relative));
            }
        }
        for d in self.created.iter().rev() {
            let _ = fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_cpu_figures_are_read_in_microseconds_from_cpuacct() {
        let d = tempfile::tempdir().unwrap();
        for (f, v) in [
            ("cpuacct.usage", "1500000123\n"),
            ("cpuacct.usage_user", "1200000000\n"),
            ("cpuacct.usage_sys", "300000123\n"),
        ] {
            fs::write(d.path().join(f), v).unwrap();
        }
        let u = cpu_usage(Layout::V1, d.path());
        assert_eq!(
            (u.cpu_us, u.user_us, u.sys_us),
            (Some(1_500_000), Some(1_200_000), Some(300_000))
        );
    }

    #[test]
    fn v2_cpu_figures_are_read_from_cpu_stat() {
        let d = tempfile::tempdir().unwrap();
        fs::write(
            d.path().join("cpu.stat"),
            "usage_usec 2000\nuser_usec 1500\nsystem_usec 500\nnr_periods 0\n",
        )
        .unwrap();
        let u = cpu_usage(Layout::V2, d.path());
        assert_eq!(
            (u.cpu_us, u.user_us, u.sys_us),
            (Some(2000), Some(1500), Some(500))
        );
    }

    #[test]
    fn a_cgroup_nothing_ran_in_or_that_cannot_be_read_gives_no_figures() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(cpu_usage(Layout::V1, d.path()), CgroupUsage::default());
        assert_eq!(cpu_usage(Layout::V2, d.path()), CgroupUsage::default());
        fs::write(d.path().join("cpuacct.usage"), "0\n").unwrap();
        fs::write(d.path().join("cpuacct.usage_user"), "0\n").unwrap();
        assert_eq!(cpu_usage(Layout::V1, d.path()), CgroupUsage::default());
        fs::write(d.path().join("cpu.stat"), "usage_usec 0\nuser_usec 0\n").unwrap();
        assert_eq!(cpu_usage(Layout::V2, d.path()), CgroupUsage::default());
        // A partial read keeps what it has and leaves the rest absent.
        fs::write(d.path().join("cpuacct.usage"), "5000\n").unwrap();
        let u = cpu_usage(Layout::V1, d.path());
        assert_eq!((u.cpu_us, u.user_us, u.sys_us), (Some(5), Some(0), None));
    }
}
