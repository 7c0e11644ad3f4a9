//! Cgroups for unprivileged boxes, and cheap cgroup joins.
//!
//! Owns: delegating `<own>/h5i` to a user (h5i puts each run's cgroup under the caller's own
//! cgroup, and an unprivileged user may do that only in a directory root handed over: on v2
//! the unified hierarchy, on v1 every controller hierarchy at the same relative path, with an
//! empty cpuset level filled from its parent); and remounting cgroup2 with `favordynmods`,
//! which stops each run's cgroup join from waiting out an RCU grace period (performance only).
//! Must never: create a cgroup outside this process's own cgroup, hand a directory delegated to
//! one user to another (that user's boxes would lose their limits silently), or fail setup
//! because the remount was refused.

use h5i_log::Traced as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Change, HostError};

/// The directory name made under the own cgroup.
pub const DELEGATED: &str = "h5i";

/// This process's own cgroup path in `hierarchy` ("" for v2's unified one), from
/// `/proc/self/cgroup` text.
pub fn own_path(proc_cgroup: &str, v2: bool) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        if v2 {
            l.strip_prefix("0::").map(str::to_string)
        } else {
            let (_, rest) = l.split_once(':')?;
            let (ctrls, path) = rest.split_once(':')?;
            ctrls
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        }
    })
}

/// The directories to hand to a user, under `fs_root` (`/sys/fs/cgroup`).
pub fn delegated_dirs(fs_root: &Path, proc_cgroup: &str) -> Vec<PathBuf> {
    let v2 = fs_root.join("cgroup.controllers").exists();
    let Some(own) = own_path(proc_cgroup, v2) else {
        return Vec::new();
    };
    let own = own.trim_start_matches('/').to_string();
    if v2 {
        return vec![fs_root.join(&own).join(DELEGATED)];
    }
    let Ok(entries) = std::fs::read_dir(fs_root) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists() && !p.ends_with("unified"))
        .map(|p| p.join(&own).join(DELEGATED))
        .collect();
    dirs.sort();
    dirs
}

/// Delegate `<own>/h5i` in every hierarchy to `uid:gid`.
pub fn delegate(uid: u32, gid: u32, changes: &mut Vec<Change>) -> Result<(), HostError> {
    let fs_root = Path::new("/sys/fs/cgroup");
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(HostError::io("read", Path::new("/proc/self/cgroup")))?;
    let dirs = delegated_dirs(fs_root, &own);
    if dirs.is_empty() {
        changes.push(Change(
            "no cgroup of this process to delegate under; box limits for the user stay unheld"
                .into(),
        ));
    }
    for dir in dirs {
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(HostError::io("create cgroup", &dir))?;
            changes.push(Change(format!("created cgroup {}", dir.display())));
        }
        fill_empty_cpusets(&dir, changes)?;
        let meta = std::fs::metadata(&dir).map_err(HostError::io("stat", &dir))?;
        if meta.uid() != uid && meta.uid() != 0 {
            return Err(HostError::CgroupDelegatedElsewhere {
                path: dir,
                owner: meta.uid(),
            });
        }
        if meta.uid() != uid {
            for f in ["", "cgroup.procs", "tasks", "cgroup.subtree_control"] {
                let p = if f.is_empty() {
                    dir.clone()
                } else {
                    dir.join(f)
                };
                if p.exists() {
                    std::os::unix::fs::chown(&p, Some(uid), Some(gid))
                        .map_err(HostError::io("chown", &p))?;
                }
            }
            changes.push(Change(format!(
                "delegated cgroup {} to uid {uid}",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// A v1 cpuset level starts empty, and no task can be placed below an empty one: fill each
/// empty level from its parent, from the top down (the user cannot write the levels above).
fn fill_empty_cpusets(dir: &Path, changes: &mut Vec<Change>) -> Result<(), HostError> {
    if !dir.join("cpuset.cpus").exists() {
        return Ok(());
    }
    let mut levels: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| p.join("cpuset.cpus").exists())
        .collect();
    levels.reverse();
    for level in levels.iter().skip(1) {
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let here = level.join(f);
            let now = std::fs::read_to_string(&here).map_err(HostError::io("read", &here))?;
            if now.trim().is_empty() {
                let Some(parent) = level.parent() else {
                    continue;
                };
                let from = parent.join(f);
                let v = std::fs::read_to_string(&from).map_err(HostError::io("read", &from))?;
                std::fs::write(&here, v.trim()).map_err(HostError::io("write", &here))?;
                changes.push(Change(format!("populated {}", here.display())));
            }
        }
    }
    Ok(())
}

/// Remount the cgroup2 mount with `favordynmods` where the kernel has it (keeping its other
/// super options); a refusal is a note, not a failure.
pub fn favor_dynmods(changes: &mut Vec<Change>) {
    let has = std::fs::read_to_string("/sys/kernel/cgroup/features")
        .is_ok_and(|f| f.lines().any(|l| l.trim() == "favordynmods"));
    if !has {
        return;
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let Some((point, opts)) = cgroup2_mount(&info) else {
        return;
    };
    if opts.split(',').any(|o| o == "favordynmods") {
        return;
    }
    let keep: Vec<&str> = opts
        .split(',')
        .filter(|o| *o != "rw" && *o != "ro" && !o.is_empty())
        .collect();
    let mut o = String::from("remount");
    for k in keep {
        o.push(',');
        o.push_str(k);
    }
    o.push_str(",favordynmods");
    let ok = Command::new("mount")
        .args(["-o", &o, &point])
        .traced()
        .output()
        .is_ok_and(|out| out.status.success());
    changes.push(Change(if ok {
        format!("cgroup2 at {point} remounted with favordynmods (fast cgroup joins)")
    } else {
        format!("note: could not remount {point} with favordynmods; box runs start slower here")
    }));
}

/// The cgroup2 mount point and its super options, from mountinfo text.
pub fn cgroup2_mount(mountinfo: &str) -> Option<(String, String)> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mut post = post.split(' ');
        if post.next()? != "cgroup2" {
            return None;
        }
        let super_opts = post.nth(1)?.to_string();
        Some((pre.split(' ').nth(4)?.to_string(), super_opts))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_path_is_the_memory_controllers_on_v1_and_the_unified_one_on_v2() {
        let v1 = "12:pids:/s\n5:cpu,cpuacct:/s\n4:memory:/session/a\n0::/u\n";
        assert_eq!(own_path(v1, false).as_deref(), Some("/session/a"));
        assert_eq!(own_path(v1, true).as_deref(), Some("/u"));
    }

    #[test]
    fn v1_delegates_every_hierarchy_but_unified_at_one_path() {
        let d = tempfile::tempdir().unwrap();
        for c in ["memory", "pids", "unified"] {
            std::fs::create_dir(d.path().join(c)).unwrap();
            std::fs::write(d.path().join(c).join("cgroup.procs"), "").unwrap();
        }
        let dirs = delegated_dirs(d.path(), "4:memory:/s/a\n");
        assert_eq!(
            dirs,
            vec![
                d.path().join("memory/s/a/h5i"),
                d.path().join("pids/s/a/h5i")
            ]
        );
    }

    #[test]
    fn the_cgroup2_mount_and_its_options_are_found() {
        let mi = "30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            cgroup2_mount(mi),
            Some(("/sys/fs/cgroup/unified".into(), "rw,nsdelegate".into()))
        );
    }
}
