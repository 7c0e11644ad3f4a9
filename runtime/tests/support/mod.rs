//! Shared helpers for the h5i-runc integration tests: busybox bundles, the probe helper, running
//! the binary, waiting on pids through pidfds (never sleep loops).

// Each test binary uses a part of this module and of what it re-exports.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};

pub use h5i_testsupport::cgroup::{own_cgroup, Delegated};
pub use h5i_testsupport::dice;
pub use h5i_testsupport::process::run_to_files;

pub mod rootless;

/// The binary under test: `h5i-runc`, a binary of the root package (so `cargo install --path .`
/// installs it), found in the profile directory above this test's `deps/`. Build every binary
/// first: `cargo build --release --workspace --bins` (`make test` does).
pub fn bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        h5i_testsupport::process::sibling_binary("h5i-runc")
            .to_string_lossy()
            .into_owned()
    })
}

/// True when the test can run; prints a loud skip line otherwise.
pub fn require_root(test: &str) -> bool {
    h5i_testsupport::require_root(test, "runs real containers")
}

/// A unique container id for this test process.
pub fn id(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// Mount points of every cgroup hierarchy (v1 and the hybrid's cgroup2).
pub fn cgroup_hierarchies() -> Vec<String> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mi.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            matches!(fstype, "cgroup" | "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(str::to_string))
                .flatten()
        })
        .collect()
}

/// Where tests put explicit cgroups: under our own cgroup.
pub fn test_cgroup(id: &str) -> String {
    format!("{}/h5i-runc-test/{id}", own_cgroup().trim_end_matches('/'))
}

/// Path of the static probe helper (compiled once per test binary).
pub fn probe() -> &'static Path {
    h5i_testsupport::process::probe(env!("CARGO_TARGET_TMPDIR"))
}

/// A busybox-static bundle in a temp dir.
pub struct Bundle {
    pub dir: tempfile::TempDir,
    pub config: Value,
}

const APPLETS: &[&str] = &[
    "sh", "cat", "echo", "ls", "sleep", "true", "false", "id", "unshare", "touch", "mkdir", "kill",
    "ps", "env", "readlink", "test", "[", "printf", "wc", "stat", "rm",
];

impl Bundle {
    /// Bundle running `args`; cgroupsPath under the test's own cgroup when `cgroup` is Some.
    pub fn new(args: &[&str], cgroup: Option<String>) -> Bundle {
        let dir = tempfile::Builder::new()
            .prefix("h5i-runc-bundle")
            .tempdir()
            .unwrap();
        let rootfs = dir.path().join("rootfs");
        for d in [
            "bin", "proc", "dev", "sys", "tmp", "etc", "mnt", "work", "run",
        ] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for a in APPLETS {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(a)).unwrap();
        }
        std::fs::copy(probe(), rootfs.join("bin/probe")).unwrap();
        std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
        let mut config = template(args);
        if let Some(cg) = cgroup {
            config["linux"]["cgroupsPath"] = json!(cg);
        }
        let b = Bundle { dir, config };
        b.save();
        b
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn rootfs(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }

    pub fn save(&self) {
        let text = serde_json::to_string_pretty(&self.config).unwrap();
        std::fs::write(self.dir.path().join("config.json"), text).unwrap();
    }

    pub fn annotate(&mut self, key: &str, value: &str) -> &mut Self {
        if self.config.get("annotations").is_none() {
            self.config["annotations"] = json!({});
        }
        self.config["annotations"][key] = json!(value);
        self.save();
        self
    }

    pub fn terminal(&mut self, on: bool) -> &mut Self {
        self.config["process"]["terminal"] = json!(on);
        self.save();
        self
    }

    /// Drop one namespace type from the spec.
    pub fn without_namespace(&mut self, ty: &str) -> &mut Self {
        let list = self.config["linux"]["namespaces"].as_array_mut().unwrap();
        list.retain(|n| n["type"] != ty);
        self.save();
        self
    }

    /// Give the process extra capabilities (so seccomp denials are not masked by missing caps).
    pub fn add_caps(&mut self, caps: &[&str]) -> &mut Self {
        for set in ["bounding", "effective", "permitted"] {
            let list = self.config["process"]["capabilities"][set]
                .as_array_mut()
                .unwrap();
            for c in caps {
                list.push(json!(c));
            }
        }
        self.save();
        self
    }
}

/// runc's default spec, minus the cgroup mount (libcontainer mounts it read-write on v1).
fn template(args: &[&str]) -> Value {
    let caps = json!(["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]);
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin", "TERM=xterm"],
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": false},
        "hostname": "h5i-test",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]}
        ],
        "linux": {
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": [
                {"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"},
                {"type": "mount"}, {"type": "cgroup"}
            ],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

/// A state root for one test.
pub struct Runtime {
    pub root: tempfile::TempDir,
}

impl Runtime {
    pub fn new() -> Runtime {
        Runtime {
            root: tempfile::Builder::new()
                .prefix("h5i-runc-state")
                .tempdir()
                .unwrap(),
        }
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.arg("--root").arg(self.root.path());
        c
    }

    /// Run a verb with stdin closed; returns the output. stdout/stderr go through files, not
    /// pipes: a created container's init inherits them and would hold a pipe open.
    pub fn run(&self, args: &[&str]) -> Output {
        run_to_files(self.cmd().args(args))
    }

    /// Run a verb that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "h5i-runc {args:?} failed ({:?}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn state(&self, id: &str) -> Value {
        serde_json::from_str(&self.ok(&["state", id])).unwrap()
    }

    pub fn status(&self, id: &str) -> String {
        self.state(id)["status"].as_str().unwrap().to_string()
    }

    pub fn pid(&self, id: &str) -> i32 {
        self.state(id)["pid"].as_i64().unwrap() as i32
    }

    /// Best-effort cleanup (tests assert their own deletes).
    pub fn force_delete(&self, id: &str) {
        let _ = self.run(&["delete", "--force", id]);
    }
}

impl Drop for Runtime {
    /// Force-delete whatever a (possibly failed) test left in its state root, so a panicking
    /// test does not leak running containers or cgroups; then drop the shared test cgroup
    /// level where it is empty.
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(self.root.path()) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.starts_with('.') && e.path().is_dir() {
                    let _ = run_to_files(self.cmd().args(["delete", "--force", &name]));
                }
            }
        }
        h5i_testsupport::cgroup::remove(&format!(
            "{}/h5i-runc-test",
            own_cgroup().trim_end_matches('/')
        ));
    }
}

/// Wait until `pid` has exited, via pidfd + poll (bounded).
pub fn wait_exit(pid: i32, timeout: Duration) -> bool {
    match h5i_sys::pidfd::open(pid) {
        Ok(fd) => h5i_sys::pidfd::wait_exited(&fd, timeout).unwrap_or(false),
        Err(e) => e.raw_os_error() == Some(libc::ESRCH),
    }
}

/// Parse probe output lines `name=RESULT` into pairs.
pub fn probe_results(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(a, b)| (a.to_string(), b.to_string()))
        })
        .collect()
}

pub fn result_of<'a>(results: &'a [(String, String)], name: &str) -> &'a str {
    results
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, r)| r.as_str())
        .unwrap_or_else(|| panic!("probe printed no {name}: {results:?}"))
}

/// The unprivileged test user (`H5I_TEST_USER`, default `h5i-test`) as (name, uid, gid), or
/// None after a loud skip line when it does not exist.
pub fn test_user(test: &str) -> Option<(String, u32, u32)> {
    let user = std::env::var("H5I_TEST_USER").unwrap_or_else(|_| "h5i-test".into());
    match h5i_testsupport::process::user_ids(&user) {
        Some((uid, gid)) => Some((user, uid, gid)),
        None => {
            h5i_testsupport::skipped!("{test}: no user {user} (scripts/setup-host.sh creates it)");
            None
        }
    }
}

/// stdout of a command that must have succeeded; `what` names it in the failure.
pub fn success_stdout(what: &str, args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} {args:?} failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `tool --version` runs and succeeds (the tool is installed and on PATH).
pub fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
