//! h5i-runc run directly by the unprivileged test user, with a user namespace in the spec,
//! inside cgroups root delegated to the user (`Delegated`, as tests/podman.rs does for rootless
//! Podman).

use super::*;

/// Whether this host's cgroups are v1 (no unified hierarchy at /sys/fs/cgroup).
pub fn cgroup_v1() -> bool {
    !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A state root, a runtime copy and delegated cgroups for the test user; on drop, whatever it
/// left is force-deleted.
pub struct RootlessRunc {
    pub dir: tempfile::TempDir,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub cgroups: Delegated,
    pub bin: std::path::PathBuf,
}

impl RootlessRunc {
    pub fn new(test: &str) -> Option<RootlessRunc> {
        use std::os::unix::fs::PermissionsExt;
        if !require_root(test) {
            return None;
        }
        let (user, uid, gid) = test_user(test)?;
        let dir = tempfile::Builder::new()
            .prefix("h5i-runc-rootless")
            .tempdir_in("/var/tmp")
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.path().join("state")).unwrap();
        std::os::unix::fs::chown(dir.path().join("state"), Some(uid), Some(gid)).unwrap();
        // The build tree may sit where the user cannot reach: the user runs a copy.
        let bin_copy = dir.path().join("h5i-runc");
        std::fs::copy(bin(), &bin_copy).unwrap();
        std::fs::set_permissions(&bin_copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cgroups = Delegated::new(test, uid, gid);
        Some(RootlessRunc {
            dir,
            user,
            uid,
            gid,
            cgroups,
            bin: bin_copy,
        })
    }

    /// A bundle the user can run: a user namespace mapping container root to the user, no
    /// resources (v1 device rules need real root), the bundle and its /tmp the user's.
    pub fn bundle(&self, args: &[&str], cgroup: Option<String>) -> Bundle {
        use std::os::unix::fs::PermissionsExt;
        let mut b = Bundle::new(args, cgroup);
        let linux = b.config["linux"].as_object_mut().unwrap();
        linux.remove("resources");
        linux["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"type": "user"}));
        linux.insert(
            "uidMappings".into(),
            serde_json::json!([{"containerID": 0, "hostID": self.uid, "size": 1}]),
        );
        linux.insert(
            "gidMappings".into(),
            serde_json::json!([{"containerID": 0, "hostID": self.gid, "size": 1}]),
        );
        b.save();
        std::fs::set_permissions(b.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for p in [b.path().to_path_buf(), b.rootfs().join("tmp")] {
            std::os::unix::fs::chown(&p, Some(self.uid), Some(self.gid)).unwrap();
        }
        b
    }

    /// `h5i-runc ARGS` as the user, inside the delegated cgroups.
    pub fn run(&self, args: &[&str]) -> std::process::Output {
        run_to_files(self.cmd().args(args))
    }

    /// `h5i-runc` with this state root, as the user inside the delegated cgroups; append the
    /// verb and its arguments.
    pub fn cmd(&self) -> Command {
        self.runtime(self.cgroups.command_as(&self.user))
    }

    /// As [`RootlessRunc::cmd`], every step exec'ing the next: the pid spawned is h5i-runc's
    /// (for tests that kill it).
    pub fn exec_cmd(&self) -> Command {
        self.runtime(self.cgroups.exec_as(&self.user))
    }

    fn runtime(&self, mut as_user: Command) -> Command {
        as_user
            .arg(format!("XDG_RUNTIME_DIR={}", self.dir.path().display()))
            .arg(&self.bin)
            .arg("--root")
            .arg(self.dir.path().join("state"));
        as_user
    }

    pub fn ok(&self, args: &[&str]) -> String {
        success_stdout("rootless h5i-runc", args, self.run(args))
    }

    /// `sh -c SCRIPT` as the user inside the delegated cgroups, in a private mount namespace
    /// made for it (so a runtime that remounted its caller's mounts changes that copy, never
    /// the machine's); `$H5I_RUNC` is the runtime with this state root.
    pub fn script_in_private_mounts(&self, script: &str) -> std::process::Output {
        let inner = self.cgroups.command_as(&self.user);
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["-m", "--propagation", "private"])
            .arg(inner.get_program())
            .args(inner.get_args())
            .arg(format!("XDG_RUNTIME_DIR={}", self.dir.path().display()))
            .arg(format!(
                "H5I_RUNC={} --root {}",
                self.bin.display(),
                self.dir.path().join("state").display()
            ))
            .args(["sh", "-c", script]);
        run_to_files(&mut cmd)
    }

    /// `new`, on cgroup v1 only (a loud skip line otherwise, saying `why`).
    pub fn new_on_v1(test: &str, why: &str) -> Option<RootlessRunc> {
        let r = RootlessRunc::new(test)?;
        if !cgroup_v1() {
            h5i_testsupport::skipped!("{test}: {why}");
            return None;
        }
        Some(r)
    }

    /// Asserts that nothing of container `id` is left: no state, no cgroup in any hierarchy.
    pub fn assert_gone(&self, id: &str) {
        assert!(
            !self.dir.path().join("state").join(id).exists(),
            "state of {id} left"
        );
        for d in &self.cgroups.dirs {
            let leaf = d.join("h5i-runc").join(id);
            assert!(!leaf.exists(), "{} left behind", leaf.display());
        }
    }

    /// The delegated directory in the memory hierarchy (the only one on cgroup v2).
    pub fn memory_dir(&self) -> &std::path::Path {
        self.cgroups
            .dirs
            .iter()
            .find(|d| d.starts_with("/sys/fs/cgroup/memory") || !cgroup_v1())
            .unwrap()
    }
}

impl Drop for RootlessRunc {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(self.dir.path().join("state")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.starts_with('.') {
                    let _ = self.run(&["delete", "--force", &name]);
                }
            }
        }
    }
}
