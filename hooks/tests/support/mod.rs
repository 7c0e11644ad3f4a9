//! Shared helpers for the supervised-network tests: busybox bundles with the three network
//! hooks, the static `netprobe`, running h5i-runc. The test hosts (HOST.md: veth pairs,
//! 198.18.0.0/15 addresses, listeners the test made), cgroups and output capture are
//! h5i-testsupport's, re-exported here.

// Each test binary uses a part of this module and of what it re-exports.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

pub use h5i_testsupport::cgroup::{hierarchies, own_cgroup, remove as remove_cgroup};
pub use h5i_testsupport::echo_hosts::{EchoHosts as TestHosts, BULK_PORT};
pub use h5i_testsupport::process::run_to_files;

/// The hook binary under test: `h5i-hook`, a binary of the root package (so `cargo install
/// --path .` installs it), found in the profile directory above this test's `deps/`.
pub fn hook_bin() -> PathBuf {
    h5i_testsupport::process::sibling_binary("h5i-hook")
}

/// h5i-runc, built beside it (`cargo build --release --workspace --bins` first).
pub fn runc_bin() -> PathBuf {
    h5i_testsupport::process::sibling_binary("h5i-runc")
}

/// The unprivileged test user's uid; `make setup` (scripts/setup-host.sh) makes the user.
pub fn test_user_uid() -> u32 {
    h5i_testsupport::process::test_user_uid("h5i-test")
}

/// True when the test can run; prints a loud skip line otherwise.
pub fn require_root(test: &str) -> bool {
    h5i_testsupport::require_root(test, "makes network namespaces and real boxes")
}

/// The static network probe (compiled once per test binary).
pub fn netprobe() -> &'static Path {
    h5i_testsupport::process::netprobe(env!("CARGO_TARGET_TMPDIR"))
}

/// Probe output lines `NAME=RESULT`, in order.
pub fn results(stdout: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A busybox rootfs with netprobe, and `/usr` of the host bind-mounted read-only in the spec
/// (so the box can run the host's `nft`): `lib`/`lib64` point into it.
pub fn make_rootfs(rootfs: &Path) {
    h5i_testsupport::rootfs::busybox(
        rootfs,
        &["proc", "dev", "tmp", "etc", "usr", "run"],
        &["sh", "cat", "echo", "true", "id", "sleep", "grep"],
    );
    std::fs::copy(netprobe(), rootfs.join("bin/netprobe")).unwrap();
    for l in ["lib", "lib64"] {
        std::os::unix::fs::symlink(format!("usr/{l}"), rootfs.join(l)).unwrap();
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
}

/// What a test box's spec says about its network.
pub struct NetBox {
    /// `h5i.net.dir`; None lets h5i-runc choose.
    pub dir: Option<PathBuf>,
    /// `h5i.net.egress`.
    pub egress: String,
    /// Route socket()/socketpair() to the gate at `<dir>/gate.sock`.
    pub gate: bool,
    /// The box's uid 0 maps to this host uid in a user namespace of its own.
    pub uid: u32,
    /// `linux.cgroupsPath`.
    pub cgroup: String,
}

/// The spec of a supervised test box running `args`, its hooks running `hook`.
pub fn spec(args: &[&str], hook: &Path, net: &NetBox) -> Value {
    let hook = hook.display().to_string();
    let h = |verb: &str| json!({"path": hook, "args": ["h5i-hook", verb], "timeout": 40});
    // No h5i.net.unix: absent is false for the gate, and h5i-runc would ask for its static
    // seccomp list with it (a box of h5i's own carries both).
    let mut annotations = json!({
        "h5i.net": "supervised",
        "h5i.net.egress": net.egress,
    });
    if let Some(d) = &net.dir {
        annotations["h5i.net.dir"] = json!(d);
    }
    let mut config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin:/usr/sbin:/usr/bin"],
            "cwd": "/",
            "capabilities": {"bounding": [], "effective": [], "permitted": [],
                             "inheritable": [], "ambient": []},
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "h5i-net-test",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]},
            {"destination": "/usr", "type": "bind", "source": "/usr",
             "options": ["rbind", "ro", "nosuid", "nodev"]}
        ],
        "hooks": {
            "createRuntime": [h("net-up")],
            "createContainer": [h("net-inside")],
            "poststop": [h("net-down")]
        },
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                           {"type": "uts"}, {"type": "mount"}, {"type": "user"}],
            "uidMappings": [{"containerID": 0, "hostID": net.uid, "size": 1}],
            "gidMappings": [{"containerID": 0, "hostID": net.uid, "size": 1}],
            "cgroupsPath": net.cgroup,
            "maskedPaths": ["/proc/kcore", "/proc/keys"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"]
        },
        "annotations": annotations
    });
    if net.gate {
        let dir = net
            .dir
            .as_ref()
            .expect("a gated test box names its net dir");
        config["annotations"]["h5i.net.gate"] = json!("on");
        config["linux"]["seccomp"] = json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64"],
            "listenerPath": dir.join("gate.sock"),
            "syscalls": [{"names": ["socket", "socketpair"], "action": "SCMP_ACT_NOTIFY"}]
        });
    }
    config
}

/// A private (0700) directory owned by `uid`.
pub fn private_dir(path: &Path, uid: u32) {
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

/// The tally a finished run left.
pub fn tally(dir: &Path) -> h5i_policy::receipt::NetTally {
    let text = std::fs::read_to_string(dir.join("tally.json"))
        .unwrap_or_else(|e| panic!("{}/tally.json: {e}", dir.display()));
    serde_json::from_str(&text).unwrap()
}

/// The sentry log, for failure messages.
pub fn sentry_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("sentry.log")).unwrap_or_default()
}
