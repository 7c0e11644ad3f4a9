//! The protective memory ceiling a box gets when its policy names no `mem` (issue 12): an
//! allocation past it is killed by the kernel's OOM killer inside the box's own cgroup, h5i
//! reports it as an OOM (exit 137, the receipt's `exit.oom_killed` and `oom`, the run's warning,
//! `status`'s last run), and the host and another box running beside it are untouched.
//!
//! The ceiling is half the host's memory, floored at 1 GiB
//! (`h5i_policy::builtin::protective_ceilings`, fed `MemTotal` from `/proc/meminfo`). A real
//! allocation past half of this machine would press every other process on it, so each h5i
//! here runs on a smaller host: in a private mount namespace whose `/proc/meminfo` says
//! [`SMALL_HOST_KIB`] (a bind mount, as lxcfs does for containers). That is the input h5i sizes
//! the ceiling from; nothing in h5i is told it is a test. A fresh procfs is mounted beside it in
//! that namespace, so the box's own `/proc` mount stays allowed (the kernel refuses a procfs
//! mount in a user namespace when every procfs it can see has something mounted over part of
//! it). The kernel's own word is the evidence: the `oom-kill:` record in `/dev/kmsg` for the
//! allocating task (named by `prctl(PR_SET_NAME)`) must say `CONSTRAINT_MEMCG` with the limit hit
//! at the box's cgroup under h5i's, never a host-wide OOM.
//!
//! Process and supervised tiers, as root and as `h5i-test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Command, Output, Stdio};

use common::{stderr, stdout, Caller};

/// The smaller host's `MemTotal`, KiB (2 GiB): its ceiling is the 1 GiB floor.
const SMALL_HOST_KIB: u64 = 2 << 20;
/// The ceiling h5i must give a box on that host, bytes.
const CEILING: u64 = 1 << 30;
/// What the box tries to allocate (and touch), MiB: half again the ceiling.
const ALLOC_MIB: u64 = 1536;

/// In the namespace: a fresh procfs beside /proc, the fake meminfo over /proc/meminfo, then the
/// command. `$1` is a scratch directory, `$2` the fake meminfo.
const ON_A_SMALL_HOST: &str = r#"set -e
mount -t proc -o nosuid,nodev,noexec proc "$1"
mount --bind "$2" /proc/meminfo
shift 2
exec "$@""#;

/// A host whose `/proc/meminfo` says [`SMALL_HOST_KIB`]: the fake file and the scratch mount
/// point, both reachable by the test user.
struct SmallHost {
    dir: tempfile::TempDir,
}

impl SmallHost {
    fn new() -> SmallHost {
        let real = std::fs::read_to_string("/proc/meminfo").unwrap();
        let fake: String = real
            .lines()
            .map(|l| {
                if l.starts_with("MemTotal:") {
                    format!("MemTotal:       {SMALL_HOST_KIB} kB\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        let dir = tempfile::Builder::new()
            .prefix("h5i-small-host")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::create_dir(dir.path().join("proc")).unwrap();
        std::fs::write(dir.path().join("meminfo"), fake).unwrap();
        for p in [dir.path().to_path_buf(), dir.path().join("meminfo")] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        SmallHost { dir }
    }

    /// `cmd` (program, arguments, environment and directory kept) run on this host.
    fn wrap(&self, cmd: &Command) -> Command {
        let mut w = Command::new("unshare");
        w.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(ON_A_SMALL_HOST)
            .arg("sh")
            .arg(self.dir.path().join("proc"))
            .arg(self.dir.path().join("meminfo"))
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => w.env(k, v),
                None => w.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            w.current_dir(d);
        }
        w
    }

    fn h5i(&self, c: &Caller, args: &[&str]) -> Output {
        self.wrap(&c.h5i_in(&c.repo(), args)).output().unwrap()
    }

    fn ok(&self, c: &Caller, args: &[&str]) -> String {
        common::caller::succeeded(&self.h5i(c, args), args, c.who())
    }
}

/// `/dev/kmsg` from now on: opened and moved to its end, read after the run.
struct Kmsg(std::fs::File);

impl Kmsg {
    fn from_now() -> Kmsg {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .unwrap();
        f.seek(SeekFrom::End(0)).unwrap();
        Kmsg(f)
    }

    /// Every record since [`Kmsg::from_now`] (one record per read; EAGAIN at the end; EPIPE
    /// when the ring overwrote records, which skips them).
    fn records(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 8192];
        for _ in 0..100_000 {
            match self.0.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("reading /dev/kmsg: {e}"),
            }
        }
        out
    }
}

/// The `key=value` fields of the kernel's `oom-kill:` record for task `comm`, if it logged one.
fn oom_kill_of(records: &[String], comm: &str) -> Option<Vec<(String, String)>> {
    records.iter().find_map(|r| {
        let (_, body) = r.split_once(';')?;
        let fields = body.trim().strip_prefix("oom-kill:")?;
        let kv: Vec<(String, String)> = fields
            .split(',')
            .filter_map(|f| f.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        kv.iter()
            .any(|(k, v)| k == "task" && v == comm)
            .then_some(kv)
    })
}

fn field<'a>(kv: &'a [(String, String)], key: &str) -> &'a str {
    kv.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key} in the oom-kill record: {kv:?}"))
}

fn allocation_past_the_default_ceiling(c: &mut Caller, tier: &str) {
    let host = SmallHost::new();
    let policy = c.repo().join(".h5i/env.toml");
    assert!(
        !policy.exists(),
        "the default profile must be what the box gets"
    );
    for name in ["ceil", "bystander"] {
        host.ok(c, &["box", "create", name, "--isolation", tier]);
    }
    // h5i sized the ceiling from the small host and holds it.
    let status = host.ok(c, &["box", "status", "ceil"]);
    let mem = status
        .lines()
        .find(|l| l.trim_start().starts_with("mem"))
        .unwrap_or_else(|| panic!("no mem line: {status}"));
    assert_eq!(
        mem.split_whitespace().nth(1),
        Some((CEILING >> 20).to_string().as_str()),
        "{status}"
    );
    assert!(!mem.ends_with('*'), "the ceiling is not held: {status}");

    // Another box, alive across the OOM: it answers only after the kill.
    let mut bystander = host
        .wrap(&c.h5i_in(
            &c.repo(),
            &[
                "box",
                "run",
                "bystander",
                "--",
                "sh",
                "-c",
                "read line && echo survived:$line",
            ],
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let comm = format!("ceil{}", std::process::id() % 100_000_000);
    let script = format!(
        "import ctypes\n\
         assert ctypes.CDLL(None).prctl(15, b'{comm}', 0, 0, 0) == 0\n\
         x = b'a' * ({ALLOC_MIB} << 20)\n\
         print('allocated', len(x))\n"
    );
    let mut kmsg = Kmsg::from_now();
    let out = host.h5i(c, &["box", "run", "ceil", "--", "python3", "-c", &script]);
    let records = kmsg.records();
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(137), "{said}");
    assert!(!stdout(&out).contains("allocated"), "{said}");
    assert!(
        stderr(&out).contains("OOM-killed the command at the box's memory ceiling"),
        "{said}"
    );

    // The kernel: a memory-cgroup OOM, the limit hit at the box's group under h5i's, the
    // victim the allocating task inside it. A host-wide OOM would say CONSTRAINT_NONE.
    let kill = oom_kill_of(&records, &comm)
        .unwrap_or_else(|| panic!("no oom-kill record for {comm} in /dev/kmsg: {records:#?}"));
    assert_eq!(field(&kill, "constraint"), "CONSTRAINT_MEMCG", "{kill:?}");
    let limited = field(&kill, "oom_memcg");
    let victim = field(&kill, "task_memcg");
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own_memcg = own
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
            (ctrl.split(',').any(|c| c == "memory") || ctrl.is_empty()).then_some(path)
        })
        .unwrap();
    // Root's h5i runs in this test's own group; the test user's in the group delegated to it.
    let under = if c.uid() == 0 {
        format!("{}/h5i/", own_memcg.trim_end_matches('/'))
    } else {
        "/h5i/".to_string()
    };
    assert!(
        limited.contains(&under),
        "the limit hit is not a box's group under h5i's ({under}): {kill:?}"
    );
    assert!(
        victim.starts_with(limited),
        "the victim is not inside the limited group: {kill:?}"
    );
    // Root's boxes run as the h5i-box range; the test user's as itself.
    let uid: u32 = field(&kill, "uid").parse().unwrap();
    if c.uid() == 0 {
        assert_ne!(uid, 0, "the OOM'd task ran as host root: {kill:?}");
    } else {
        assert_eq!(uid, c.uid(), "{kill:?}");
    }

    // h5i's record of it.
    let rec = c.last_run("ceil");
    assert_eq!(rec["exit"]["oom_killed"], true, "{rec}");
    assert_eq!(rec["oom"]["limit_bytes"], CEILING, "{rec}");
    assert!(rec["oom"]["kill_count"].as_u64().unwrap() >= 1, "{rec}");
    let status = host.ok(c, &["box", "status", "ceil"]);
    assert!(
        status.contains("exit 137 (OOM-killed at the memory ceiling)"),
        "{status}"
    );

    // The box itself goes on: the next run works.
    assert_eq!(
        host.ok(c, &["box", "run", "ceil", "--", "echo", "after"])
            .trim(),
        "after"
    );
    // The other box was never touched.
    let mut stdin = bystander.stdin.take().unwrap();
    stdin.write_all(b"yes\n").unwrap();
    drop(stdin);
    let done = bystander.wait_with_output().unwrap();
    assert_eq!(done.status.code(), Some(0), "bystander: {}", stderr(&done));
    assert_eq!(stdout(&done).trim(), "survived:yes");
}

fn case(test: &str, as_user: bool, tier: &str) {
    if !common::require_root(
        test,
        "a private mount namespace with a smaller host's /proc/meminfo, and /dev/kmsg",
    ) {
        return;
    }
    allocation_past_the_default_ceiling(&mut Caller::either(as_user), tier);
}

#[test]
fn an_allocation_past_the_default_ceiling_is_oom_killed_by_the_kernel_at_the_process_tier() {
    case("default_ceiling_process_root", false, "process");
}

#[test]
fn an_allocation_past_the_default_ceiling_is_oom_killed_by_the_kernel_at_the_supervised_tier() {
    case("default_ceiling_supervised_root", false, "supervised");
}

#[test]
fn an_allocation_past_the_default_ceiling_is_oom_killed_at_the_process_tier_as_the_test_user() {
    case("default_ceiling_process_user", true, "process");
}

#[test]
fn an_allocation_past_the_default_ceiling_is_oom_killed_at_the_supervised_tier_as_the_test_user() {
    case("default_ceiling_supervised_user", true, "supervised");
}
