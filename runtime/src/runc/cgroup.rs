//! Where a container's cgroup goes when the spec does not say, and removing what we made.
//!
//! libcontainer puts a spec without `linux.cgroupsPath` at `:youki:<id>` at the top of every
//! hierarchy. h5i-runc instead places it under the caller's own cgroup: on cgroup v2 the
//! `0::` path of `/proc/self/cgroup`; on v1 (and hybrid) the memory controller's path, which is
//! the one a host's management delegates (libcontainer uses one path for all v1 controllers).
//! The result is `<anchor>/h5i-runc/<id>`; a relative `linux.cgroupsPath` goes under the anchor
//! too (runc's rule: libcontainer would put it at the top of each hierarchy, outside the
//! caller's memory limit). Directories that did not exist before the create are recorded (in
//! the sidecar) and removed again on delete, deepest first, only if empty; one still in use by a
//! later container (overlapping lifetimes share the `<anchor>` levels in hierarchies where the
//! caller sits at the root) goes to a ledger and is removed by the delete that empties it.
//!
//! Parsing is pure (`anchor_from`, `hierarchy_roots`), so unit tests cover both layouts on a
//! v1 machine. Must never: fall back to the top of a hierarchy, or remove a directory it did not
//! record (rmdir of a non-empty cgroup fails by itself, which is relied on for the shared
//! `h5i-runc` level).

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

/// Directory under the anchor that holds h5i-runc's containers.
pub const PARENT_NAME: &str = "h5i-runc";

/// The two layouts h5i cares about (hybrid is v1 for libcontainer's purposes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One hierarchy per controller (legacy or hybrid).
    V1,
    /// The unified hierarchy.
    V2,
}

/// Why a cgroup path could not be chosen or cleaned.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The cgroup layout could not be detected.
    #[error("refusing: cannot detect the cgroup layout under /sys/fs/cgroup: {0}")]
    Detect(String),
    /// `/proc/self/cgroup` has no line for the anchor controller.
    #[error("refusing: /proc/self/cgroup has no {want} entry, so there is no own cgroup to place the container under; to fix: set linux.cgroupsPath in config.json")]
    NoAnchor {
        /// Which entry was looked for.
        want: &'static str,
    },
    /// Reading /proc failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// `disableOOMKiller` could not be held on cgroup v1.
    #[error("refusing: the spec sets disableOOMKiller but {path} could not be written: {source}; to fix: drop disableOOMKiller or give the container a memory cgroup h5i-runc may write")]
    OomControl {
        /// The `memory.oom_control` file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The ledger of cgroup directories left for later removal could not be used.
    #[error("cannot update {path}: {source}")]
    Ledger {
        /// The ledger or its lock.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Detect the layout the way libcontainer will.
pub fn detect_layout() -> Result<Layout, CgroupError> {
    use libcgroups::common::CgroupSetup;
    match libcgroups::common::get_cgroup_setup() {
        Ok(CgroupSetup::Unified) => Ok(Layout::V2),
        Ok(CgroupSetup::Legacy | CgroupSetup::Hybrid) => Ok(Layout::V1),
        Err(e) => Err(CgroupError::Detect(e.to_string())),
    }
}

/// The caller's own cgroup path to anchor under, from `/proc/self/cgroup` text.
pub fn anchor_from(proc_self_cgroup: &str, layout: Layout) -> Result<PathBuf, CgroupError> {
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let hit = match layout {
            Layout::V2 => id == "0" && ctrls.is_empty(),
            Layout::V1 => ctrls.split(',').any(|c| c == "memory"),
        };
        if hit {
            return Ok(PathBuf::from(path));
        }
    }
    Err(CgroupError::NoAnchor {
        want: match layout {
            Layout::V1 => "memory controller",
            Layout::V2 => "cgroup v2 (0::)",
        },
    })
}

/// Where a spec's `cgroupsPath` puts the container: an absolute path as given; a relative one
/// under the caller's own cgroup (runc's rule), never at the top of a hierarchy, where
/// libcontainer would put it (outside the caller's memory cgroup and so its limit).
pub fn resolve_named(anchor: &Path, named: &Path) -> PathBuf {
    if named.is_absolute() {
        return named.to_path_buf();
    }
    let inner: PathBuf = named
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    Path::new("/").join(anchor).join(inner)
}

/// `<anchor>/h5i-runc/<id>`.
pub fn default_path(anchor: &Path, id: &str) -> PathBuf {
    Path::new("/").join(anchor).join(PARENT_NAME).join(id)
}

/// Mount points of the hierarchies libcontainer will create directories in.
pub fn hierarchy_roots(mountinfo: &str, layout: Layout) -> Vec<PathBuf> {
    let want = match layout {
        Layout::V1 => "cgroup",
        Layout::V2 => "cgroup2",
    };
    let mut roots = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = right.split_whitespace().next().unwrap_or_default();
        if fstype != want {
            continue;
        }
        if let Some(mount_point) = left.split_whitespace().nth(4) {
            roots.push(PathBuf::from(unescape_mountinfo(mount_point)));
        }
    }
    roots.sort();
    roots.dedup();
    roots
}

/// The mount point of the v1 hierarchy that holds `controller` (its super options name it, as
/// in `cpu,cpuacct`), from `/proc/self/mountinfo` text.
pub fn v1_controller_root(mountinfo: &str, controller: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut fields = right.split_whitespace();
        let (fstype, _source, options) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup" && options.split(',').any(|o| o == controller))
            .then(|| left.split_whitespace().nth(4).map(unescape_mountinfo))
            .flatten()
            .map(PathBuf::from)
    })
}

fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Directories to remove on delete for a container at `cgroup_path` (absolute, relative to each
/// hierarchy root): the ones missing now, plus the shared `h5i-runc` level (removed only once
/// the last container under it is gone, because rmdir refuses non-empty cgroups).
pub fn dirs_to_clean(
    roots: &[PathBuf],
    cgroup_path: &Path,
    exists: impl Fn(&Path) -> bool,
) -> Vec<PathBuf> {
    let rel: PathBuf = cgroup_path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    let mut out = Vec::new();
    for root in roots {
        let mut cur = root.clone();
        for comp in rel.components() {
            cur.push(comp);
            let is_parent_level = cur.file_name().is_some_and(|n| n == PARENT_NAME);
            if is_parent_level || !exists(&cur) {
                out.push(cur.clone());
            }
        }
    }
    out
}

/// Remove recorded directories, deepest first; a directory that is gone is done with, one that
/// is busy or not empty (another container lives beneath it) is returned, to be retried once
/// that container is gone (`settle`).
pub fn remove_dirs(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = dirs.to_vec();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    dirs.dedup();
    let mut busy = Vec::new();
    for dir in dirs {
        match std::fs::remove_dir(&dir) {
            Ok(()) => tracing::debug!(?dir, "removed cgroup directory"),
            Err(e) => match e.raw_os_error() {
                Some(libc::ENOENT) => {}
                Some(libc::ENOTEMPTY | libc::EBUSY) => busy.push(dir),
                _ => tracing::warn!(?dir, error = %e, "could not remove cgroup directory"),
            },
        }
    }
    busy
}

/// File under the sidecar directory listing cgroup directories h5i-runc made that were still in
/// use when their container was deleted (a later container of the same state root lived under
/// them: the shared `<anchor>` levels in hierarchies where the caller sits at the root).
pub const LEDGER_NAME: &str = "cgroup-pending.json";

/// Remove `dirs` (one container's), then retry every directory left pending by earlier
/// deletes, keeping in the ledger only what is still in use. Serialized by an exclusive lock
/// on the ledger's directory, so two deletes cannot drop each other's entries.
pub fn settle(sidecars: &Path, dirs: &[PathBuf]) -> Result<(), CgroupError> {
    let ledger_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CgroupError::Ledger { path, source }
    };
    std::fs::create_dir_all(sidecars).map_err(ledger_err(sidecars))?;
    let lock = std::fs::File::open(sidecars).map_err(ledger_err(sidecars))?;
    // Released when `lock` is dropped.
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| ledger_err(sidecars)(e.into()))?;
    let ledger = sidecars.join(LEDGER_NAME);
    let mut all: Vec<PathBuf> = match std::fs::read(&ledger) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(ledger_err(&ledger)(e)),
    };
    all.extend_from_slice(dirs);
    let pending = remove_dirs(&all);
    if pending.is_empty() {
        return match std::fs::remove_file(&ledger) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(ledger_err(&ledger)(e)),
            _ => Ok(()),
        };
    }
    let text = serde_json::to_vec(&pending)
        .map_err(|e| ledger_err(&ledger)(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    let tmp = sidecars.join(format!("{LEDGER_NAME}.tmp"));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &ledger))
        .map_err(ledger_err(&ledger))
}

/// Hold `disableOOMKiller` on cgroup v1, which libcontainer 0.7 never writes: set
/// `memory.oom_control` of the container's memory cgroup. A no-op on cgroup v2 (the kernel
/// has no such switch there; runc ignores it too).
pub fn disable_oom_killer(cgroup_path: &Path) -> Result<(), CgroupError> {
    if detect_layout()? != Layout::V1 {
        return Ok(());
    }
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| CgroupError::Read {
            path: "/proc/self/mountinfo",
            source,
        })?;
    let root = v1_controller_root(&mountinfo, "memory").ok_or(CgroupError::Detect(
        "no cgroup v1 memory hierarchy is mounted".into(),
    ))?;
    let inner: PathBuf = cgroup_path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    let path = root.join(inner).join("memory.oom_control");
    std::fs::write(&path, "1").map_err(|source| CgroupError::OomControl { path, source })
}

/// The placement for a spec without a cgroups path (`named` None: `<anchor>/h5i-runc/<id>`) or
/// with a relative one (under the anchor), the directories to clean later, and the layout it
/// was made for.
pub fn place(
    id: &str,
    named: Option<&Path>,
) -> Result<(PathBuf, Vec<PathBuf>, Layout), CgroupError> {
    let layout = detect_layout()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|source| CgroupError::Read {
        path: "/proc/self/cgroup",
        source,
    })?;
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| CgroupError::Read {
            path: "/proc/self/mountinfo",
            source,
        })?;
    let anchor = anchor_from(&own, layout)?;
    let path = match named {
        Some(named) => resolve_named(&anchor, named),
        None => default_path(&anchor, id),
    };
    let roots = hierarchy_roots(&mountinfo, layout);
    let clean = dirs_to_clean(&roots, &path, |p| p.exists());
    Ok((path, clean, layout))
}

/// Longest [`end_processes`] waits for the processes it killed.
pub const END_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// SIGKILL every process in the cgroup at `cgroup_path` (relative to each hierarchy root, as
/// the spec names it) in every hierarchy, and wait for each to be gone: on a pidfd opened
/// before the signal (so a reused pid is never signalled or waited for), bounded by
/// [`END_WAIT`] in all. libcontainer's delete gives killed processes about 100 ms before its
/// `rmdir` gives up, too short on a loaded host for the ones a killed `create` leaves (its
/// intermediate process, never named in the state): `delete --force` then failed.
pub fn end_processes(cgroup_path: &Path) {
    let Ok(layout) = detect_layout() else {
        return;
    };
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let rel: PathBuf = cgroup_path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    if rel.as_os_str().is_empty() {
        return;
    }
    let mut pids: Vec<i32> = hierarchy_roots(&mountinfo, layout)
        .iter()
        .filter_map(|root| std::fs::read_to_string(root.join(&rel).join("cgroup.procs")).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .filter(|pid| *pid > 0)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    let deadline = std::time::Instant::now() + END_WAIT;
    // A pid already gone has no pidfd and needs no kill.
    let pidfds: Vec<OwnedFd> = pids
        .into_iter()
        .filter_map(|pid| h5i_sys::pidfd::open(pid).ok())
        .collect();
    for fd in &pidfds {
        let _ = h5i_sys::pidfd::kill(fd);
    }
    for fd in &pidfds {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let _ = h5i_sys::pidfd::wait_exited(fd, left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "9:name=systemd:/\n8:pids:/\n6:freezer:/\n4:memory:/process_api/df3f\n3:cpuset:/\n1:cpu,cpuacct:/\n0::/\n";
    const UNIFIED: &str = "0::/user.slice/user-1000.slice/session-3.scope\n";

    #[test]
    fn v1_anchors_on_the_memory_controller() {
        let a = anchor_from(HYBRID, Layout::V1).unwrap();
        assert_eq!(a, PathBuf::from("/process_api/df3f"));
        assert_eq!(
            default_path(&a, "c1"),
            PathBuf::from("/process_api/df3f/h5i-runc/c1")
        );
    }

    #[test]
    fn v2_anchors_on_the_unified_path() {
        let a = anchor_from(UNIFIED, Layout::V2).unwrap();
        assert_eq!(
            default_path(&a, "c1"),
            PathBuf::from("/user.slice/user-1000.slice/session-3.scope/h5i-runc/c1")
        );
    }

    #[test]
    fn root_anchor_still_gets_the_h5i_level() {
        assert_eq!(
            default_path(Path::new("/"), "c1"),
            PathBuf::from("/h5i-runc/c1")
        );
    }

    #[test]
    fn a_relative_cgroups_path_nests_under_the_anchor_and_an_absolute_one_is_kept() {
        let a = Path::new("/process_api/df3f");
        assert_eq!(
            resolve_named(a, Path::new("box/c1")),
            PathBuf::from("/process_api/df3f/box/c1")
        );
        // `..` cannot climb out of the anchor.
        assert_eq!(
            resolve_named(a, Path::new("../../c1")),
            PathBuf::from("/process_api/df3f/c1")
        );
        assert_eq!(
            resolve_named(a, Path::new("/elsewhere/c1")),
            PathBuf::from("/elsewhere/c1")
        );
    }

    #[test]
    fn missing_anchor_is_refused_not_defaulted_to_top() {
        assert!(anchor_from("1:cpu:/\n", Layout::V1).is_err());
        assert!(anchor_from("4:memory:/x\n", Layout::V2).is_err());
    }

    #[test]
    fn hierarchy_roots_from_mountinfo() {
        let mi = "\
35 25 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
36 25 0:31 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
37 25 0:32 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
38 25 0:33 / /sys/fs/cgroup rw - tmpfs tmpfs rw
";
        assert_eq!(
            hierarchy_roots(mi, Layout::V1),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory"),
                PathBuf::from("/sys/fs/cgroup/pids")
            ]
        );
        assert_eq!(
            hierarchy_roots(mi, Layout::V2),
            vec![PathBuf::from("/sys/fs/cgroup/unified")]
        );
    }

    #[test]
    fn a_v1_controller_is_found_by_its_mount_options() {
        let mi = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(
            v1_controller_root(mi, "cpuacct"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(
            v1_controller_root(mi, "memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory"))
        );
        assert_eq!(v1_controller_root(mi, "pids"), None);
        assert_eq!(v1_controller_root(mi, "cpu,"), None);
    }

    #[test]
    fn a_level_still_in_use_waits_in_the_ledger_for_the_delete_that_empties_it() {
        let tmp = tempfile::tempdir().unwrap();
        let sidecars = tmp.path().join(".h5i");
        let shared = tmp.path().join("shared");
        let (a, b) = (shared.join("a"), shared.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        // The first container made `shared` and `a`; `b` (the second) still lives there.
        settle(&sidecars, &[shared.clone(), a.clone()]).unwrap();
        assert!(!a.exists() && shared.exists());
        let ledger: Vec<PathBuf> =
            serde_json::from_slice(&std::fs::read(sidecars.join(LEDGER_NAME)).unwrap()).unwrap();
        assert_eq!(ledger, vec![shared.clone()]);
        // The second records only its own leaf; its delete empties and removes `shared` too.
        settle(&sidecars, std::slice::from_ref(&b)).unwrap();
        assert!(!shared.exists());
        assert!(!sidecars.join(LEDGER_NAME).exists());
    }

    #[test]
    fn clean_list_has_only_new_dirs_and_the_shared_level() {
        let roots = vec![PathBuf::from("/m"), PathBuf::from("/p")];
        let existing = ["/m/a", "/m/a/b", "/m/a/b/h5i-runc"];
        let dirs = dirs_to_clean(&roots, Path::new("/a/b/h5i-runc/c1"), |p| {
            existing.iter().any(|e| Path::new(e) == p)
        });
        let want: Vec<PathBuf> = [
            "/m/a/b/h5i-runc",
            "/m/a/b/h5i-runc/c1",
            "/p/a",
            "/p/a/b",
            "/p/a/b/h5i-runc",
            "/p/a/b/h5i-runc/c1",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(dirs, want);
    }
}
