//! A box's box-lifetime sandbox seen from the host, for the sandbox suites: its container id
//! (from `box status`), its directory, its init, its cgroups, and for a supervised sandbox its
//! sentry and uplink; and [`Held`], everything one sandbox held, to check that a teardown (abort,
//! rm, the idle timeout) left none of it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{process_alive, Caller};

/// The box's sandbox container id, from `box status` (None when it is down).
pub fn id(c: &Caller, name: &str) -> Option<String> {
    super::sandbox_id_in(&c.ok(&["box", "status", name]))
}

/// The sandbox directory holding container `id`'s state, under the caller's runtime directory.
pub fn find_dir(c: &Caller, id: &str) -> Option<PathBuf> {
    let uid = c.uid();
    let parents = [
        PathBuf::from("/run/h5i"),
        PathBuf::from(format!("/run/user/{uid}/h5i")),
        std::env::temp_dir().join(format!("h5i-{uid}")),
    ];
    parents
        .iter()
        .filter_map(|p| std::fs::read_dir(p).ok())
        .flat_map(|d| d.flatten())
        .find(|e| {
            std::fs::read_to_string(e.path().join("state.json"))
                .is_ok_and(|s| s.contains(&format!("\"container\":\"{id}\"")))
        })
        .map(|e| e.path())
}

/// [`find_dir`], which must find it.
pub fn dir(c: &Caller, id: &str) -> PathBuf {
    find_dir(c, id).unwrap_or_else(|| panic!("{}: no sandbox directory holds {id}", c.who()))
}

/// The pid written in `path` (an `init.pid`, a `sentry.pid`).
pub fn pid_in(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

/// Every cgroup directory named `id` under `h5i/` in this process's own memory, pids (or
/// unified) group: where h5i makes a sandbox's cgroup, for root and (delegated) for the test
/// user alike.
pub fn cgroups_named(id: &str) -> Vec<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut found = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        let hierarchy = match ctrl {
            "" => "/sys/fs/cgroup/unified".to_string(),
            c if c.contains("memory") => "/sys/fs/cgroup/memory".to_string(),
            c if c.contains("pids") => "/sys/fs/cgroup/pids".to_string(),
            _ => continue,
        };
        let dir = Path::new(&hierarchy)
            .join(path.trim_start_matches('/'))
            .join("h5i")
            .join(id);
        if dir.exists() {
            found.push(dir);
        }
    }
    found
}

/// One process, named by its pid and its start time (so a reused pid is not taken for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    start: u64,
}

impl Proc {
    /// `pid` as it runs now, when it does.
    pub fn of(pid: i32) -> Option<Proc> {
        let start = start_time(pid)?;
        process_alive(pid).then_some(Proc { pid, start })
    }

    /// Whether this very process still runs (not a zombie, not another with its pid).
    pub fn alive(&self) -> bool {
        process_alive(self.pid) && start_time(self.pid) == Some(self.start)
    }
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks since boot.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Every process below `pid` (children, their children, ...), as they run now.
pub fn descendants(pid: i32) -> Vec<Proc> {
    let mut found = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if let Some(proc) = Proc::of(child) {
                    found.push(proc);
                    stack.push(child);
                }
            }
        }
    }
    found
}

/// The host side of a rootful uplink's veth pair: the peer of `h5i0` in `init`'s network
/// namespace, as (name, ifindex); None when the box has no veth device (a rootless uplink).
fn host_veth_of(init: i32) -> Option<(String, u32)> {
    let inside = Command::new("nsenter")
        .arg(format!("--net=/proc/{init}/ns/net"))
        .args(["ip", "-o", "link", "show", "h5i0"])
        .output()
        .unwrap();
    // "N: h5i0@if123: <...>"
    let text = String::from_utf8_lossy(&inside.stdout);
    let peer: u32 = text.split("@if").nth(1)?.split(':').next()?.parse().ok()?;
    host_link_named_by_index(peer).map(|name| (name, peer))
}

/// The name of the host's link with ifindex `index`, when there is one.
fn host_link_named_by_index(index: u32) -> Option<String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (n, rest) = l.split_once(": ")?;
        (n.trim().parse::<u32>().ok()? == index)
            .then(|| rest.split([':', '@']).next().unwrap_or("").to_string())
    })
}

/// A supervised sandbox's uplink, whichever kind: the processes the sentry started (a
/// user-space uplink: slirp4netns, pasta) and the host side of a veth pair.
#[derive(Debug)]
pub struct Uplink {
    pub processes: Vec<Proc>,
    pub host_veth: Option<(String, u32)>,
}

impl Uplink {
    /// The uplink of the sandbox whose init is `init` and sentry `sentry`.
    pub fn of(init: i32, sentry: i32) -> Uplink {
        Uplink {
            processes: descendants(sentry),
            host_veth: host_veth_of(init),
        }
    }

    /// Whether there is one to watch at all.
    pub fn exists(&self) -> bool {
        !self.processes.is_empty() || self.host_veth.is_some()
    }

    /// What of it is still there.
    pub fn left(&self) -> Vec<String> {
        let mut left: Vec<String> = self
            .processes
            .iter()
            .filter(|p| p.alive())
            .map(|p| format!("uplink process {}", p.pid))
            .collect();
        if let Some((name, index)) = &self.host_veth {
            if host_link_named_by_index(*index).as_deref() == Some(name.as_str()) {
                left.push(format!("host veth {name}"));
            }
        }
        left
    }
}

/// Everything one box sandbox held, read while it is up.
#[derive(Debug)]
pub struct Held {
    pub id: String,
    pub dir: PathBuf,
    pub init: Proc,
    pub cgroups: Vec<PathBuf>,
    /// A supervised sandbox's sentry and uplink.
    pub net: Option<(Proc, Uplink)>,
}

impl Held {
    /// What box `name`'s sandbox holds now; it must be up.
    pub fn now(c: &Caller, name: &str) -> Held {
        let id = id(c, name).unwrap_or_else(|| panic!("{}: box {name}: no sandbox up", c.who()));
        let dir = dir(c, &id);
        let init_pid = pid_in(&dir.join("init.pid"));
        let init = Proc::of(init_pid).expect("the sandbox's init runs");
        let cgroups = cgroups_named(&id);
        assert!(!cgroups.is_empty(), "{}: no cgroup named {id}", c.who());
        let sentry_pid = dir.join("net/sentry.pid");
        let net = sentry_pid.exists().then(|| {
            let sentry = pid_in(&sentry_pid);
            let proc = Proc::of(sentry).expect("the sandbox's sentry runs");
            (proc, Uplink::of(init_pid, sentry))
        });
        Held {
            id,
            dir,
            init,
            cgroups,
            net,
        }
    }

    /// What of it is still there.
    pub fn left(&self) -> Vec<String> {
        let mut left = Vec::new();
        if self.init.alive() {
            left.push(format!("init {}", self.init.pid));
        }
        left.extend(
            self.cgroups
                .iter()
                .filter(|d| d.exists())
                .map(|d| format!("cgroup {}", d.display())),
        );
        if self.dir.exists() {
            left.push(format!("directory {}", self.dir.display()));
        }
        if let Some((sentry, uplink)) = &self.net {
            if sentry.alive() {
                left.push(format!("sentry {}", sentry.pid));
            }
            left.extend(uplink.left());
        }
        left
    }
}

/// Box `idle` at `tier`, its sandbox made with a 3 s idle time: once its init ends by itself,
/// its sentry and uplink are gone, `status` says the sandbox is down, and nothing it held is
/// left (status sweeps what the init could not remove); the next run makes a new one.
pub fn idle_teardown(c: &mut Caller, tier: &str) {
    const IDLE: &[(&str, &str)] = &[("H5I_SANDBOX_IDLE_SECS", "3")];
    c.create_at("idle", tier);
    let out = c.h5i_with(&["box", "run", "idle", "--", "true"], IDLE);
    assert!(out.status.success(), "{}: {}", c.who(), super::stderr(&out));
    let held = Held::now(c, "idle");
    if let Some((_, uplink)) = &held.net {
        assert!(uplink.exists(), "{}: no uplink found to watch", c.who());
    }
    let init = h5i_sys::pidfd::open(held.init.pid).expect("a pidfd on the sandbox's init");
    assert!(
        h5i_sys::pidfd::wait_exited(&init, Duration::from_secs(60)).unwrap(),
        "{}: the sandbox's init outlived 60 s idle (asked for 3 s)",
        c.who()
    );
    if let Some((sentry, _)) = &held.net {
        if let Ok(fd) = h5i_sys::pidfd::open(sentry.pid) {
            assert!(
                h5i_sys::pidfd::wait_exited(&fd, Duration::from_secs(30)).unwrap(),
                "{}: the sentry outlived its init by 30 s",
                c.who()
            );
        }
    }
    let status = c.ok(&["box", "status", "idle"]);
    assert!(status.contains("sandbox: down"), "{}: {status}", c.who());
    let left = held.left();
    assert!(
        left.is_empty(),
        "{}: the idle timeout left {left:?}",
        c.who()
    );
    let out = c.h5i_with(&["box", "run", "idle", "--", "echo", "again"], IDLE);
    assert!(
        super::stdout(&out).contains("again"),
        "{}: {}",
        c.who(),
        super::stderr(&out)
    );
    let again = Held::now(c, "idle");
    assert_ne!(
        again.init,
        held.init,
        "{}: the ended init answered again",
        c.who()
    );
    c.ok(&["box", "rm", "--force", "idle"]);
}

/// A run of box `svc`'s that asks the box's web service on 127.0.0.1:8765 for `/`, with a
/// bounded number of tries: prints `web=<status line>` or `web=down`.
const ASK_WEB: &str = r#"
import socket, time
for _ in range(100):
    try:
        s = socket.create_connection(("127.0.0.1", 8765), timeout=2)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        print("web=" + s.recv(100).decode().splitlines()[0]); break
    except OSError:
        time.sleep(0.1)
else:
    print("web=down")
"#;

fn ask_web(c: &Caller) -> String {
    let out = c.h5i(&["box", "run", "svc", "--", "python3", "-c", ASK_WEB]);
    super::labelled_results(&out)
        .remove("web")
        .unwrap_or_else(|| panic!("{}: {}", c.who(), super::stderr(&out)))
}

/// Box `svc` at `tier` under a 64 MiB memory cap, its sandbox up and a declared web service
/// running: a run that allocates past the cap is OOM-killed (137, its receipt says so) and
/// neither the service (it still answers, `box service status` says alive) nor the sandbox
/// goes down with it. At supervised, where the manual supports no service, the start is
/// refused with the mend and nothing is left running.
/// The argv of a run that asks for 512 MiB at once: past every memory cap the OOM rows set.
pub const MEMORY_HOG: [&str; 3] = [
    "python3",
    "-c",
    "x = bytearray(512 * 1024 * 1024); print(len(x))",
];

/// Run [`MEMORY_HOG`] in box `name` and assert the kernel's OOM killer ended it (exit 137:
/// `SIGKILL`); the caller then asks what else survived.
pub fn memory_hog_is_killed(c: &Caller, name: &str) {
    let mut args = vec!["box", "run", name, "--"];
    args.extend_from_slice(&MEMORY_HOG);
    let hog = c.h5i(&args);
    assert_eq!(
        hog.status.code(),
        Some(137),
        "{}: the memory hog was not OOM-killed: {}",
        c.who(),
        super::stderr(&hog)
    );
}

pub fn oom_spares_a_service(c: &mut Caller, tier: &str) {
    c.write(
        ".h5i/env.toml",
        format!(
            "[profile.small]\nisolation = \"{tier}\"\n[profile.small.resources]\nmem = \"64M\"\n\
             [service.web]\ncommand = \"exec python3 -m http.server 8765 --bind 127.0.0.1\"\nport = 8765\n"
        ),
    );
    c.commit_all("small");
    c.ok(&["box", "create", "svc", "--profile", "small"]);
    c.in_box("svc", "true");
    let sandbox = id(c, "svc").expect("the first run made the sandbox");
    let started = c.h5i(&["box", "service", "start", "svc", "web"]);
    let said = super::stderr(&started);
    if tier == "supervised" {
        // The manual: services are supported at the workspace and process tiers in v1; at
        // supervised the network namespace belongs to one session, and h5i says so.
        assert!(!started.status.success(), "{}: {said}", c.who());
        assert!(
            said.contains("services are not supported") && said.contains("h5i box shell svc"),
            "{}: {said}",
            c.who()
        );
        let status = c.ok(&["box", "service", "status", "svc"]);
        assert!(!status.contains(" alive "), "{}: {status}", c.who());
        c.ok(&["box", "rm", "--force", "svc"]);
        return;
    }
    assert!(started.status.success(), "{}: {said}", c.who());
    assert!(
        ask_web(c).starts_with("HTTP/1.0 200"),
        "{}: the service never answered",
        c.who()
    );
    memory_hog_is_killed(c, "svc");
    let rec = c.receipts("svc").pop().unwrap();
    assert_eq!(rec["exit"]["oom_killed"], true, "{}: {rec}", c.who());
    let status = c.ok(&["box", "service", "status", "svc"]);
    assert!(
        status
            .lines()
            .any(|l| l.split_whitespace().next() == Some("web") && l.contains(" alive ")),
        "{}: the service went down with the run: {status}",
        c.who()
    );
    assert!(
        ask_web(c).starts_with("HTTP/1.0 200"),
        "{}: the service stopped answering after the run's OOM",
        c.who()
    );
    assert_eq!(
        id(c, "svc").as_deref(),
        Some(sandbox.as_str()),
        "{}: the sandbox went down with the run",
        c.who()
    );
    c.ok(&["box", "service", "stop", "svc", "web"]);
    c.ok(&["box", "rm", "--force", "svc"]);
}

/// What a run writes into the box's scratch outlives the run (the box's `/tmp` and `/dev/shm`,
/// its System V shared memory), and its pages stay charged to the box: a `mem = "64M"` box whose
/// first run left 48 MiB in `/tmp` cannot take another 48 MiB in `/dev/shm`, nor one 48 MiB
/// System V segment left behind a second, and the run that tries is OOM-killed and told so by
/// its receipt. Freeing the leftovers gives the room back; the sandbox serves on throughout. A
/// run reads its OOM score as 500 and cannot write it lower.
pub fn leftovers_count_against_the_box(c: &mut Caller, tier: &str) {
    c.write(
        ".h5i/env.toml",
        format!(
            "[profile.small]\nisolation = \"{tier}\"\n[profile.small.resources]\nmem = \"64M\"\n"
        ),
    );
    c.commit_all("small");
    c.ok(&["box", "create", "left", "--profile", "small"]);
    let fill = |path: &str| format!("dd if=/dev/zero of={path} bs=1M count=48 2>&1 && echo filled");
    // A System V segment of 48 MiB, touched and left (no IPC_RMID) when the run ends.
    let sysv = "python3 -c \"import ctypes; l = ctypes.CDLL(None, use_errno=True); \
        l.shmget.restype = ctypes.c_int; l.shmat.restype = ctypes.c_void_p; \
        i = l.shmget(0, 48 << 20, 0o1600); assert i >= 0, ctypes.get_errno(); \
        p = l.shmat(i, None, 0); ctypes.memset(p, 1, 48 << 20); print('filled')\"";
    let once = |script: &str| {
        let out = c.h5i(&["box", "run", "left", "--", "sh", "-c", script]);
        (out.status.code(), super::stdout(&out), super::stderr(&out))
    };
    // Each run's OOM score is the one h5i wrote, and the run cannot lower it (Landlock grants
    // no write under /proc): at the box's ceiling the kernel picks a run, never the init.
    let (code, out, err) = once(
        "cat /proc/self/oom_score_adj; (echo 0 > /proc/self/oom_score_adj) 2>&1 && echo lowered; cat /proc/self/oom_score_adj",
    );
    assert_eq!(code, Some(0), "{}: {out}{err}", c.who());
    assert!(
        out.starts_with("500\n") && out.ends_with("\n500\n") && !out.contains("lowered"),
        "{}: {out}{err}",
        c.who()
    );
    let (code, out, err) = once(&fill("/tmp/left"));
    assert_eq!(code, Some(0), "{}: the first 48 MiB: {out}{err}", c.who());
    let sandbox = id(c, "left").expect("the first run made the sandbox");
    let (code, out, err) = once(&fill("/dev/shm/more"));
    assert_ne!(
        code,
        Some(0),
        "{}: a second 48 MiB fitted beside the first run's leftover: {out}{err}",
        c.who()
    );
    let rec = c.receipts("left").pop().unwrap();
    assert_eq!(rec["exit"]["oom_killed"], true, "{}: {rec}", c.who());
    c.in_box("left", "rm -f /tmp/left /dev/shm/more");
    let (code, out, err) = once(sysv);
    assert_eq!(
        code,
        Some(0),
        "{}: a 48 MiB segment once freed: {out}{err}",
        c.who()
    );
    let (code, out, err) = once(sysv);
    assert_ne!(
        code,
        Some(0),
        "{}: a second 48 MiB segment fitted beside the first: {out}{err}",
        c.who()
    );
    let rec = c.receipts("left").pop().unwrap();
    assert_eq!(rec["exit"]["oom_killed"], true, "{}: {rec}", c.who());
    assert_eq!(
        id(c, "left").as_deref(),
        Some(sandbox.as_str()),
        "{}: the sandbox went down",
        c.who()
    );
    c.ok(&["box", "rm", "--force", "left"]);
}
