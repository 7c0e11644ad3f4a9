//! Shared helpers for the supervised-network tests: test hosts in a network namespace of their
//! own (HOST.md: veth pairs, 198.18.0.0/15 addresses, listeners the test made), busybox
//! bundles with the three network hooks, the static `netprobe`, running h5i-runc.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};

/// The hook binary under test: `h5i-hook`, a binary of the root package (so `cargo install
/// --path .` installs it), found in the profile directory above this test's `deps/`.
pub fn hook_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("h5i-hook");
    assert!(
        p.is_file(),
        "{} is missing: build every binary first (cargo build --release --workspace --bins)",
        p.display()
    );
    p
}

/// h5i-runc, built beside it (`cargo build --release --workspace --bins` first).
pub fn runc_bin() -> PathBuf {
    let p = hook_bin().with_file_name("h5i-runc");
    assert!(
        p.exists(),
        "{} is missing: build every binary first (cargo build --release --workspace --bins)",
        p.display()
    );
    p
}

/// The unprivileged test user's uid; `make setup` (scripts/setup-host.sh) makes the user.
pub fn test_user_uid() -> u32 {
    let out = Command::new("id")
        .args(["-u", "h5i-test"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the h5i-test user is missing: run `make setup` (scripts/setup-host.sh)")
}

/// True when the test can run; prints a loud skip line otherwise.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: {test}: needs root (makes network namespaces and real boxes)");
        return false;
    }
    true
}

/// The static network probe (compiled once per test binary).
pub fn netprobe() -> &'static Path {
    static PROBE: OnceLock<PathBuf> = OnceLock::new();
    PROBE.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/netprobe.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("h5i-netprobe-{}", std::process::id()));
        let st = Command::new("cc")
            .args(["-static", "-O1", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("cc must be installed to build the netprobe helper");
        assert!(st.success(), "building netprobe failed");
        out
    })
}

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

/// Every cgroup hierarchy root a container is placed in.
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

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run `cmd` with stdin closed and stdout/stderr captured through temp files (a box's init
/// inherits them and would hold a pipe open).
pub fn run_to_files(cmd: &mut Command) -> Output {
    let mut out = tempfile::tempfile().unwrap();
    let mut err = tempfile::tempfile().unwrap();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .status()
        .unwrap();
    let read = |f: &mut std::fs::File| {
        use std::io::Seek;
        f.rewind().unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    };
    Output {
        status,
        stdout: read(&mut out),
        stderr: read(&mut err),
    }
}

/// Probe output lines `NAME=RESULT`, in order.
pub fn results(stdout: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A port the allowed test host streams [`TestHosts::BULK_BYTES`] on.
pub const BULK_PORT: u16 = 7000;

/// Test hosts in a network namespace of their own, reached from the host over a veth pair:
/// host side `198.18.N.1`, test hosts `198.18.N.2` (the allowed one) and `198.18.N.3` (a
/// second host), each with TCP listeners on 8080 and 9090 that greet with
/// `host <addr>:<port>`, a UDP echo on 5353, and (on .2) [`BULK_PORT`] streaming
/// [`TestHosts::BULK_BYTES`]. Plus a listener on the host's own loopback. Everything is removed
/// on drop.
pub struct TestHosts {
    /// The third octet.
    pub net: u8,
    veth: String,
    stop: UnixStream,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// A listener on the host's 127.0.0.1 (the box must not reach it).
    pub host_loopback_port: u16,
}

static NEXT_NET: AtomicU32 = AtomicU32::new(0);

impl TestHosts {
    /// Bytes the bulk port streams.
    pub const BULK_BYTES: u64 = 100 << 20;

    /// Make them. The /24 is picked from the pid and a counter so parallel tests never share one.
    /// The namespace is unnamed (no `ip netns`: `/run/netns` is shared with Podman, which
    /// remounts it): a thread unshares it, configures it with `ip` children (which inherit the
    /// thread's namespace), binds the sockets and ends; the sockets keep the namespace alive.
    pub fn new() -> TestHosts {
        let n = NEXT_NET.fetch_add(1, Ordering::SeqCst);
        // Skip a /24 something on the host already routes (another test process's hosts).
        let start = std::process::id() * 7 + n * 11;
        let net = (0..150)
            .map(|i| (100 + (start + i) % 150) as u8)
            .find(|net| {
                let out = Command::new("ip")
                    .args(["-4", "route", "show", &format!("198.18.{net}.0/24")])
                    .output()
                    .unwrap();
                out.stdout.is_empty()
            })
            .expect("a free 198.18.N.0/24 for the test hosts");
        let tag = format!("{}x{n}", std::process::id() % 100_000);
        let veth = format!("h5v{tag}");
        let peer = format!("h5p{tag}");
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (moved_tx, moved_rx) = std::sync::mpsc::channel::<()>();
        let inside = peer.clone();
        let sockets = std::thread::spawn(move || {
            // SAFETY: unshare of the network namespace changes this thread only.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            moved_rx.recv().unwrap();
            for cmd in [
                format!("addr add 198.18.{net}.2/24 dev {inside}"),
                format!("addr add 198.18.{net}.3/24 dev {inside}"),
                format!("link set {inside} up"),
                "link set lo up".to_string(),
            ] {
                let mut args = vec!["ip"];
                args.extend(cmd.split(' '));
                sh(&args);
            }
            let mut tcp = Vec::new();
            let mut udp = Vec::new();
            for host in [2u8, 3] {
                let ip = Ipv4Addr::new(198, 18, net, host);
                for port in [8080u16, 9090] {
                    tcp.push((
                        TcpListener::bind(SocketAddrV4::new(ip, port)).unwrap(),
                        port,
                    ));
                }
                udp.push(UdpSocket::bind(SocketAddrV4::new(ip, 5353)).unwrap());
            }
            let bulk =
                TcpListener::bind(SocketAddrV4::new(Ipv4Addr::new(198, 18, net, 2), BULK_PORT))
                    .unwrap();
            (tcp, udp, bulk)
        });
        let tid = tid_rx.recv().unwrap().to_string();
        sh(&[
            "ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer,
        ]);
        sh(&["ip", "link", "set", &peer, "netns", &tid]);
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("198.18.{net}.1/24"),
            "dev",
            &veth,
        ]);
        sh(&["ip", "link", "set", &veth, "up"]);
        moved_tx.send(()).unwrap();
        let (tcp, udp, bulk) = sockets.join().unwrap();
        let (stop, stop_rx) = UnixStream::pair().unwrap();
        let stop_rx = std::sync::Arc::new(stop_rx);
        let host_lo = TcpListener::bind("127.0.0.1:0").unwrap();
        let host_loopback_port = host_lo.local_addr().unwrap().port();
        let mut threads = Vec::new();
        let mut listeners: Vec<(TcpListener, u16)> = tcp;
        listeners.push((host_lo, 0));
        for (l, _) in listeners {
            let stop = std::sync::Arc::clone(&stop_rx);
            threads.push(std::thread::spawn(move || {
                serve_tcp(&l, &stop, |c| {
                    let me = c.local_addr().unwrap();
                    let _ = writeln!(c, "host {me}");
                })
            }));
        }
        {
            let stop = std::sync::Arc::clone(&stop_rx);
            threads.push(std::thread::spawn(move || {
                serve_tcp(&bulk, &stop, |c| {
                    let chunk = vec![0x5au8; 1 << 16];
                    let mut left = TestHosts::BULK_BYTES;
                    while left > 0 {
                        let n = left.min(chunk.len() as u64) as usize;
                        if c.write_all(&chunk[..n]).is_err() {
                            return;
                        }
                        left -= n as u64;
                    }
                })
            }));
        }
        for u in udp {
            let stop = std::sync::Arc::clone(&stop_rx);
            threads.push(std::thread::spawn(move || serve_udp(&u, &stop)));
        }
        TestHosts {
            net,
            veth,
            stop,
            threads,
            host_loopback_port,
        }
    }

    /// `198.18.N.<host>`.
    pub fn addr(&self, host: u8) -> String {
        format!("198.18.{}.{host}", self.net)
    }
}

/// Wait for `fd` or the stop socket; true when `fd` is readable, false on stop.
fn wait_or_stop(fd: &impl AsFd, stop: &UnixStream) -> bool {
    let mut p = [
        libc::pollfd {
            fd: fd.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds for the call's duration; no timeout (the stop socket ends it).
    let n = unsafe { libc::poll(p.as_mut_ptr(), 2, -1) };
    n > 0 && p[1].revents == 0
}

fn serve_tcp(l: &TcpListener, stop: &UnixStream, greet: impl Fn(&mut TcpStream)) {
    while wait_or_stop(l, stop) {
        if let Ok((mut c, _)) = l.accept() {
            let _ = c.set_write_timeout(Some(Duration::from_secs(30)));
            greet(&mut c);
        }
    }
}

fn serve_udp(u: &UdpSocket, stop: &UnixStream) {
    let mut buf = [0u8; 512];
    while wait_or_stop(u, stop) {
        if let Ok((_, from)) = u.recv_from(&mut buf) {
            let _ = u.send_to(b"udp-echo\n", from);
        }
    }
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        // Closing our end wakes every serving thread (POLLHUP on theirs).
        let _ = self.stop.shutdown(std::net::Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Deleting our end deletes the pair; the namespace ends with its last socket.
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
    }
}

/// A busybox rootfs with netprobe, and `/usr` of the host bind-mounted read-only in the spec
/// (so the box can run the host's `nft`): `lib`/`lib64` point into it.
pub fn make_rootfs(rootfs: &Path) {
    for d in ["bin", "proc", "dev", "tmp", "etc", "usr", "run"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for a in ["sh", "cat", "echo", "true", "id", "sleep", "grep"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(a)).unwrap();
    }
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

/// Remove cgroup directories at `rel` (relative to each hierarchy root), deepest first.
pub fn remove_cgroup(rel: &str) {
    for h in hierarchies() {
        let _ = std::fs::remove_dir(format!("{}{rel}", h.display()));
    }
}
