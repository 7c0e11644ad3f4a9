//! The socket gate from inside real boxes: h5i-runc runs a bundle whose `linux.seccomp` sends
//! `socket`/`socketpair` to a listener, and the test itself serves that listener with
//! `h5i_broker::socket_gate::serve`. Each rule is checked against the kernel's answer in the
//! box, next to a control box without the gate where the same calls are not `EPERM` (the test
//! bundles hold CAP_NET_RAW so raw and packet sockets would otherwise work); the tally must
//! match the attempts exactly; a stopped gate leaves the box's socket calls failing (ENOSYS).
//! Also: an h5i `BundlePlan` bundle with the gate runs under libcontainer's libseccomp, exec'd
//! processes are gated too (h5i-runc hands them the gate itself), and Podman + h5i-runc gets the gate injected at `create`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use h5i_broker::socket_gate::{serve, GateHandle, GateRules, SocketGateTally};
use h5i_runtime::socket_gate::notify_section;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(30);

/// A gate listening in a private directory, served by this test.
struct TestGate {
    dir: tempfile::TempDir,
    handle: GateHandle,
}

impl TestGate {
    fn start(unix: bool) -> TestGate {
        let dir = tempfile::Builder::new()
            .prefix("h5i-gate")
            .tempdir()
            .unwrap();
        let listener = UnixListener::bind(dir.path().join("gate.sock")).unwrap();
        let handle = serve(listener, GateRules::for_policy(unix, &[])).unwrap();
        TestGate { dir, handle }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("gate.sock")
    }
}

/// A busybox bundle with h5i's deny list, CAP_NET_RAW (so only a filter says EPERM), and, when
/// `gate` is given, the gate's seccomp section and annotation.
fn bundle(args: &[&str], id: &str, unix: bool, gate: Option<&Path>) -> Bundle {
    let mut b = Bundle::new(args, Some(test_cgroup(id)));
    // Without HOME, libcontainer's init looks the user up through glibc's NSS after the filter
    // is in place, and glibc's nscd probe makes two socket(AF_UNIX) calls the tally would
    // count (h5i's own bundles and Podman set HOME).
    b.config["process"]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!("HOME=/"));
    b.add_caps(&["CAP_NET_RAW", "CAP_NET_ADMIN"]);
    b.annotate("h5i.seccomp", "h5i-v1");
    b.annotate("h5i.net.unix", if unix { "true" } else { "false" });
    if let Some(listener) = gate {
        b.config["linux"]["seccomp"] = notify_section(listener);
        b.annotate("h5i.net.gate", "on");
    }
    b.save();
    b
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

const GATE_PROBES: [&str; 14] = [
    "inet_stream",
    "inet_dgram",
    "inet6_stream",
    "inet6_dgram",
    "inet_raw",
    "inet6_raw",
    "inet_icmp_dgram",
    "packet",
    "netlink",
    "vsock",
    "family_45",
    "unix",
    "socketpair_unix",
    "socketpair_inet",
];

#[test]
fn gate_allows_inet_stream_and_dgram_and_denies_every_other_family() {
    if !require_root("gate_allows_inet_stream_and_dgram_and_denies_every_other_family") {
        return;
    }
    let rt = Runtime::new();

    // Control: the same bundle without the gate (h5i-v1 still denies raw/packet/unix itself).
    let control_id = id("gate-control");
    let b = bundle(&["probe", "gate"], &control_id, true, None);
    let control =
        probe_results(&rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &control_id]));
    for name in ["netlink", "inet_icmp_dgram"] {
        assert_ne!(result_of(&control, name), "EPERM", "control {name}");
    }
    // Without the gate, h5i-v1's family allowlist refuses these itself (AF_MCTP is outside
    // it; socketpair is AF_UNIX only); with it, the gate refuses and counts them (below).
    for name in ["family_45", "socketpair_inet", "vsock"] {
        assert_eq!(result_of(&control, name), "EPERM", "control {name}");
    }

    let gate = TestGate::start(false);
    let id = id("gate-rules");
    let b = bundle(&["probe", "gate"], &id, false, Some(&gate.path()));
    let out = rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    let got = probe_results(&out);
    let want_ok = [
        "inet_stream",
        "inet_dgram",
        "inet6_stream",
        "inet6_dgram",
        "socketpair_unix",
    ];
    for name in GATE_PROBES {
        let want = if want_ok.contains(&name) {
            "OK"
        } else {
            "EPERM"
        };
        assert_eq!(result_of(&got, name), want, "{name}\n{out}");
    }
    assert_eq!(
        result_of(&got, "notify_fd"),
        "NONE",
        "the box must not hold its own filter's listener"
    );
    let tally = gate.handle.tally();
    assert_eq!(
        tally.allowed,
        counts(&[("inet", 2), ("inet6", 2), ("unix-pair", 1)])
    );
    assert_eq!(
        tally.denied,
        counts(&[
            ("inet-raw", 1),
            ("inet6-raw", 1),
            ("inet-other", 1),
            ("packet", 1),
            ("netlink", 1),
            ("vsock", 1),
            ("family-45", 1),
            ("unix", 1),
            ("inet-pair", 1),
        ])
    );
    // The box is gone: its filter reports POLLHUP and the gate ends by itself.
    assert!(
        gate.handle.wait_ended(WAIT),
        "gate still running after the box exited"
    );
}

#[test]
fn gate_allows_unix_sockets_only_when_the_rules_say_so() {
    if !require_root("gate_allows_unix_sockets_only_when_the_rules_say_so") {
        return;
    }
    let rt = Runtime::new();
    let gate = TestGate::start(true);
    let id = id("gate-unix");
    let mut b = bundle(&["probe", "unix"], &id, true, Some(&gate.path()));
    b.config["process"]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!("HOME=/"));
    b.save();
    let out = rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    eprintln!("DEBUG tally {:?}", gate.handle.tally());
    assert_eq!(out, "socket_unix=OK\nsocketpair_unix=OK\n");
    let tally = gate.handle.tally();
    assert_eq!(tally.allowed, counts(&[("unix", 1), ("unix-pair", 1)]));
    assert!(tally.denied.is_empty(), "{tally:?}");
}

/// A FIFO pair the box and the test use to take turns (no sleeps on either side).
struct Turns {
    dir: tempfile::TempDir,
    ready: std::fs::File,
    go: std::fs::File,
}

impl Turns {
    fn new() -> Turns {
        let dir = tempfile::Builder::new()
            .prefix("h5i-turns")
            .tempdir()
            .unwrap();
        for f in ["ready", "go"] {
            let c = std::ffi::CString::new(dir.path().join(f).to_str().unwrap()).unwrap();
            // SAFETY: mkfifo with a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        // O_RDWR on a FIFO never blocks and keeps both ends open, so neither side's open
        // waits for the other.
        let open = |f: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(dir.path().join(f))
                .unwrap()
        };
        let (ready, go) = (open("ready"), open("go"));
        Turns { dir, ready, go }
    }

    /// Wait (bounded, in poll) for the box to write its line.
    fn wait_ready(&mut self) -> bool {
        let mut p = libc::pollfd {
            fd: self.ready.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, WAIT.as_millis() as i32) } != 1 {
            return false;
        }
        let mut b = [0u8; 16];
        self.ready.read(&mut b).unwrap() > 0
    }

    fn go(&mut self) {
        self.go.write_all(b"go\n").unwrap();
    }
}

/// Spawn `h5i-runc run` in the background; stdout to a file.
fn spawn_run(rt: &Runtime, b: &Bundle, id: &str) -> (std::process::Child, tempfile::NamedTempFile) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let child = rt
        .cmd()
        .args(["run", "--bundle", b.path().to_str().unwrap(), id])
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    (child, out)
}

fn finish(mut child: std::process::Child, out: tempfile::NamedTempFile) -> String {
    if !wait_exit(child.id() as i32, WAIT) {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "h5i-runc run: {status:?}");
    std::fs::read_to_string(out.path()).unwrap()
}

#[test]
fn a_stopped_gate_fails_the_boxs_socket_calls_closed() {
    if !require_root("a_stopped_gate_fails_the_boxs_socket_calls_closed") {
        return;
    }
    let rt = Runtime::new();
    let mut gate = TestGate::start(true);
    let mut turns = Turns::new();
    let id = id("gate-killed");
    let script = "probe inet; echo r > /work/ready; read x < /work/go; probe inet; probe unix";
    let mut b = bundle(&["sh", "-c", script], &id, true, Some(&gate.path()));
    b.config["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/work", "type": "bind", "source": turns.dir.path(),
        "options": ["rbind", "rw"]
    }));
    b.save();
    let (child, out) = spawn_run(&rt, &b, &id);
    assert!(turns.wait_ready(), "the box never reached its first turn");
    gate.handle.stop();
    turns.go();
    let out = finish(child, out);
    assert_eq!(
        out, "inet_stream=OK\ninet_stream=ENOSYS\nsocket_unix=ENOSYS\nsocketpair_unix=ENOSYS\n",
        "with the gate gone nothing may get through"
    );
    assert_eq!(
        gate.handle.tally(),
        SocketGateTally {
            allowed: counts(&[("inet", 1)]),
            denied: BTreeMap::new(),
        }
    );
}

#[test]
fn exec_processes_are_gated_too_and_refused_when_the_gate_is_gone() {
    if !require_root("exec_processes_are_gated_too_and_refused_when_the_gate_is_gone") {
        return;
    }
    let rt = Runtime::new();
    let mut gate = TestGate::start(false);
    let id = id("gate-exec");
    let b = bundle(&["sleep", "600"], &id, false, Some(&gate.path()));
    rt.ok(&["run", "-d", "--bundle", b.path().to_str().unwrap(), &id]);
    // libcontainer 0.7 gives an exec'd process no linux.seccomp: h5i-runc connects it to the
    // gate and the executor installs the rule itself.
    let out = rt.ok(&["exec", &id, "probe", "gate"]);
    let got = probe_results(&out);
    let want_ok = [
        "inet_stream",
        "inet_dgram",
        "inet6_stream",
        "inet6_dgram",
        "socketpair_unix",
    ];
    for name in GATE_PROBES {
        let want = if want_ok.contains(&name) {
            "OK"
        } else {
            "EPERM"
        };
        assert_eq!(result_of(&got, name), want, "{name}\n{out}");
    }
    assert_eq!(result_of(&got, "notify_fd"), "NONE", "{out}");
    let tally = gate.handle.tally();
    let total: u64 = tally.allowed.values().chain(tally.denied.values()).sum();
    assert_eq!(total, GATE_PROBES.len() as u64, "{tally:?}");
    assert_eq!(tally.denied.get("packet"), Some(&1));

    // With the gate gone, an exec is refused before anything runs.
    gate.handle.stop();
    let out = rt.run(&["exec", &id, "probe", "gate"]);
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("socket gate"), "{err}");
    rt.ok(&["delete", "--force", &id]);
}

#[test]
fn a_gate_annotation_without_the_rule_in_the_spec_is_refused_at_create() {
    if !require_root("a_gate_annotation_without_the_rule_in_the_spec_is_refused_at_create") {
        return;
    }
    let rt = Runtime::new();
    let id = id("gate-unbacked");
    let mut b = bundle(&["probe", "gate"], &id, false, None);
    b.annotate("h5i.net.gate", "on");
    let out = rt.run(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("h5i.net.gate"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "nothing ran: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn an_h5i_bundle_plan_with_the_gate_runs_under_libseccomp() {
    if !require_root("an_h5i_bundle_plan_with_the_gate_runs_under_libseccomp") {
        return;
    }
    let rt = Runtime::new();
    let gate = TestGate::start(false);
    let id = id("gate-plan");
    let work = tempfile::tempdir().unwrap();
    let spool = tempfile::tempdir().unwrap();
    let probe_dir = probe().parent().unwrap().to_path_buf();
    use h5i_runtime::bundle::Bind;
    let plan = h5i_runtime::bundle::BundlePlan {
        id: id.clone(),
        argv: vec![probe().display().to_string(), "gate".into()],
        env: vec!["PATH=/usr/bin:/bin".into(), "HOME=/tmp".into()],
        cwd: "/work".into(),
        overlays: Vec::new(),
        binds: vec![
            Bind::ro("/usr", "/usr"),
            Bind::ro("/bin", "/bin"),
            Bind::ro("/lib", "/lib"),
            Bind::ro("/lib64", "/lib64"),
            Bind::ro(&probe_dir, &probe_dir),
            Bind::rw(work.path(), "/work"),
            Bind::rw(spool.path(), "/.h5i/spool"),
        ],
        host_network: false,
        unix_sockets: false,
        uid: 0,
        gid: 0,
        id_count: 1,
        process_gid: 0,
        extra_gid: None,
        cgroups_path: Some(test_cgroup(&id)),
        max_file_bytes: None,
        tmp_bytes: 16 << 20,
        shm_bytes: h5i_runtime::bundle::DEFAULT_SHM_BYTES,
        create_container_hooks: Vec::new(),
        create_runtime_hooks: Vec::new(),
        poststop_hooks: Vec::new(),
        extra_annotations: Default::default(),
        file_binds: Vec::new(),
        init_program: None,
        programs: Vec::new(),
        terminal: false,
        netns_path: None,
        userns_path: None,
        socket_gate: Some(gate.path()),
    };
    let dir = tempfile::tempdir().unwrap();
    h5i_runtime::bundle::write_bundle(&plan, dir.path()).unwrap();
    let out = rt.ok(&["run", "--bundle", dir.path().to_str().unwrap(), &id]);
    let got = probe_results(&out);
    for (name, want) in [
        ("inet_stream", "OK"),
        ("inet6_dgram", "OK"),
        ("packet", "EPERM"),
        ("netlink", "EPERM"),
        ("unix", "EPERM"),
        ("socketpair_unix", "OK"),
        ("notify_fd", "NONE"),
    ] {
        assert_eq!(result_of(&got, name), want, "{name}\n{out}");
    }
    let tally = gate.handle.tally();
    let total: u64 = tally.allowed.values().chain(tally.denied.values()).sum();
    assert_eq!(total, GATE_PROBES.len() as u64, "{tally:?}");
}

// ---------------------------------------------------------------------------------------------
// Podman: `--annotation h5i.net=supervised` makes h5i-runc merge the gate into Podman's own
// seccomp profile at `create`. Podman's hooks.d is pointed at an empty directory so only this
// test serves the listener.

fn have_podman() -> bool {
    Command::new("podman")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn podman_supervised_annotation_gets_the_gate_injected() {
    let test = "podman_supervised_annotation_gets_the_gate_injected";
    if !require_root(test) {
        return;
    }
    if !have_podman() {
        h5i_testsupport::skipped!("{test}: podman is not installed");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("h5i-podman-gate")
        .tempdir_in("/var/tmp")
        .unwrap();
    let hooks = dir.path().join("hooks.d");
    std::fs::create_dir(&hooks).unwrap();
    let conf = format!(
        "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
         [engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\ntmp_dir = \"{}\"\n\
         hooks_dir = [\"{}\"]\n[engine.runtimes]\nh5i-runc = [\"{}\"]\n",
        dir.path().join("tmp").display(),
        hooks.display(),
        bin()
    );
    std::fs::write(dir.path().join("containers.conf"), conf).unwrap();
    let cgroup_parent = format!(
        "{}/h5i-podman-gate-{}",
        own_cgroup().trim_end_matches('/'),
        std::process::id()
    );
    let podman = |args: &[&str]| {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", dir.path().join("containers.conf"))
            .arg("--root")
            .arg(dir.path().join("storage"))
            .arg("--runroot")
            .arg(dir.path().join("run"))
            .args(["--storage-driver", "overlay", "--runtime", "h5i-runc"])
            .args(args);
        run_to_files(&mut c)
    };
    let _cleanup = PodmanCleanup {
        dir: dir.path().to_path_buf(),
        cgroup_parent: cgroup_parent.clone(),
        podman: &podman,
    };
    let rootfs = dir.path().join("image-rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    // Podman sets HOME from the image's passwd (see `bundle` for why it matters).
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/:/bin/probe\n").unwrap();
    std::fs::copy(probe(), rootfs.join("bin/probe")).unwrap();
    let tar = dir.path().join("image.tar");
    h5i_testsupport::rootfs::tar(&rootfs, &tar);
    let image = "localhost/h5i-gate-probe";
    let out = podman(&["import", tar.to_str().unwrap(), image]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let gate = TestGate::start(false);
    let net_dir = format!("h5i.net.dir={}", gate.dir.path().display());
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--rm",
            "--network",
            "none",
            "--cgroup-parent",
            &cgroup_parent,
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[image, "/bin/probe", "gate"]);
        podman(&args)
    };
    // Control: Podman's own profile, no gate: netlink is allowed, nothing was counted.
    let out = run(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let control = probe_results(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(result_of(&control, "netlink"), "OK");
    assert_eq!(gate.handle.tally(), SocketGateTally::default());

    let out = run(&[
        "--annotation",
        "h5i.net=supervised",
        "--annotation",
        &net_dir,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = probe_results(&stdout);
    for (name, want) in [
        ("inet_stream", "OK"),
        ("inet6_dgram", "OK"),
        ("inet_raw", "EPERM"),
        ("packet", "EPERM"),
        ("netlink", "EPERM"),
        ("vsock", "EPERM"),
        ("unix", "EPERM"),
        ("socketpair_unix", "OK"),
        ("notify_fd", "NONE"),
    ] {
        assert_eq!(result_of(&got, name), want, "{name}\n{stdout}");
    }
    let tally = gate.handle.tally();
    let total: u64 = tally.allowed.values().chain(tally.denied.values()).sum();
    assert_eq!(total, GATE_PROBES.len() as u64, "{tally:?}");
    assert_eq!(tally.denied.get("netlink"), Some(&1));

    // podman exec (conmon -> h5i-runc exec --process F): the exec'd process is gated too.
    let gate = TestGate::start(false);
    let net_dir = format!("h5i.net.dir={}", gate.dir.path().display());
    let out = podman(&[
        "run",
        "-d",
        "--network",
        "none",
        "--cgroup-parent",
        &cgroup_parent,
        "--annotation",
        "h5i.net=supervised",
        "--annotation",
        &net_dir,
        image,
        "/bin/probe",
        "wait",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = podman(&["exec", &cid, "/bin/probe", "gate"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = probe_results(&stdout);
    assert_eq!(result_of(&got, "inet_stream"), "OK", "{stdout}");
    assert_eq!(result_of(&got, "netlink"), "EPERM", "{stdout}");
    assert_eq!(result_of(&got, "notify_fd"), "NONE", "{stdout}");
    let tally = gate.handle.tally();
    let total: u64 = tally.allowed.values().chain(tally.denied.values()).sum();
    assert_eq!(total, GATE_PROBES.len() as u64, "{tally:?}");
    let out = podman(&["rm", "--force", "--time", "0", &cid]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // No listener at the named directory: the container does not start.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = run(&[
        "--annotation",
        "h5i.net=supervised",
        "--annotation",
        &format!("h5i.net.dir={}", elsewhere.path().display()),
    ]);
    assert!(!out.status.success(), "ran without its gate");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

struct PodmanCleanup<'a> {
    dir: PathBuf,
    cgroup_parent: String,
    podman: &'a dyn Fn(&[&str]) -> std::process::Output,
}

impl Drop for PodmanCleanup<'_> {
    fn drop(&mut self) {
        let _ = (self.podman)(&["rm", "--all", "--force", "--time", "0"]);
        let _ = (self.podman)(&["rmi", "--all", "--force"]);
        h5i_testsupport::podman::unmount_under(&self.dir);
        h5i_testsupport::podman::remove_cgroup_parent(&self.cgroup_parent);
    }
}
