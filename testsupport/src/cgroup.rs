//! Cgroups for tests, only ever under the caller's own cgroup path (HOST.md): that path, each
//! hierarchy's root, and directories delegated to the unprivileged test user.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The caller's memory cgroup (the v1 anchor here; `0::` path on v2).
pub fn own_cgroup() -> String {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let v1 = text.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, ctrls, path) = (p.next()?, p.next()?, p.next()?);
        ctrls
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    });
    v1.or_else(|| {
        text.lines()
            .find_map(|l| l.strip_prefix("0::").map(str::to_string))
    })
    .unwrap()
}

/// The root of every hierarchy a box's cgroup is made in: the unified one on cgroup v2, each
/// v1 controller's otherwise (not the hybrid's cgroup2, which has none a box uses).
pub fn hierarchies() -> Vec<PathBuf> {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        return vec![PathBuf::from("/sys/fs/cgroup")];
    }
    std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists() && !p.ends_with("unified"))
        .collect()
}

/// `rel` (a path under [`own_cgroup`]) made in every hierarchy and handed to `uid` (and `gid`,
/// when given): the directory, `cgroup.procs`, and `tasks`/`cgroup.subtree_control` where they
/// exist, as root delegates to a user (on cgroup v1 a user can make cgroups only in a directory
/// delegated so). Returns the directories.
pub fn delegate(rel: &str, uid: u32, gid: Option<u32>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for h in hierarchies() {
        // Level by level from the hierarchy's root: a cpuset level made here (the caller's
        // memory cgroup path need not exist in the cpuset hierarchy) starts with no cpus and
        // mems, and no process can join below it until it has its parent's.
        let mut level = h.clone();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            let parent = level.clone();
            level.push(part);
            if !level.exists() {
                std::fs::create_dir(&level).unwrap();
            }
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let own = level.join(f);
                if own.exists() && std::fs::read(&own).unwrap().trim_ascii().is_empty() {
                    std::fs::write(&own, std::fs::read(parent.join(f)).unwrap()).unwrap();
                }
            }
        }
        for f in ["", "cgroup.procs", "tasks", "cgroup.subtree_control"] {
            let p = level.join(f);
            if p.exists() {
                std::os::unix::fs::chown(&p, Some(uid), gid).unwrap();
            }
        }
        dirs.push(level);
    }
    dirs
}

/// Remove the directory `rel` (relative to each hierarchy's root) where it is empty, in every
/// mount under /sys/fs/cgroup and in /sys/fs/cgroup itself (what a runtime may have made there).
pub fn remove(rel: &str) {
    if let Ok(mounts) = std::fs::read_dir("/sys/fs/cgroup") {
        for h in mounts.flatten() {
            let _ = std::fs::remove_dir(format!("{}{rel}", h.path().display()));
        }
    }
    let _ = std::fs::remove_dir(format!("/sys/fs/cgroup{rel}"));
}

/// Cgroups root delegates to a user: `<own>/<name>-<pid>` in every hierarchy (on cgroup v1 an
/// unprivileged user can only make cgroups in a directory root delegated), removed on drop.
pub struct Delegated {
    /// The path relative to each hierarchy's root.
    pub rel: String,
    /// The delegated directory in each hierarchy.
    pub dirs: Vec<PathBuf>,
}

impl Delegated {
    /// `<own>/<name>-<pid>`, delegated to `uid`:`gid`.
    pub fn new(name: &str, uid: u32, gid: u32) -> Delegated {
        let rel = format!(
            "{}/{name}-{}",
            own_cgroup().trim_end_matches('/'),
            std::process::id()
        );
        let dirs = delegate(&rel, uid, Some(gid));
        Delegated { rel, dirs }
    }

    /// `runuser -u USER -- env ...` started by a root shell that first moves itself into the
    /// delegated cgroups; append the environment and the command.
    pub fn command_as(&self, user: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            &self.enter_script(),
            "sh",
            "runuser",
            "-u",
            user,
            "--",
            "env",
        ]);
        cmd
    }

    /// As [`Delegated::command_as`], but every step execs the next (`setpriv`, where `runuser`
    /// stays as the command's parent): the spawned pid becomes the command itself, so a SIGKILL
    /// sent to it ends the command, not a wrapper that would leave the command running.
    pub fn exec_as(&self, user: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &self.enter_script(), "sh", "setpriv"])
            .arg(format!("--reuid={user}"))
            .arg(format!("--regid={user}"))
            .args(["--init-groups", "--reset-env", "--", "env"]);
        cmd
    }

    /// A root shell script that moves itself into the delegated cgroups, then execs its
    /// arguments.
    fn enter_script(&self) -> String {
        let procs: Vec<String> = self
            .dirs
            .iter()
            .map(|d| d.join("cgroup.procs").display().to_string())
            .collect();
        format!(
            "for f in {}; do echo $$ > \"$f\"; done; exec \"$@\"",
            procs.join(" ")
        )
    }
}

impl Drop for Delegated {
    fn drop(&mut self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d.join("h5i-runc"));
            let _ = std::fs::remove_dir(d);
        }
    }
}
