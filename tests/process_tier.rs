//! The process tier, asserted from inside real boxes: every confinement claim is a command run
//! in a box through `h5i-runc`, checked against the kernel's answer (an errno, an exit code, a
//! receipt field), never against "command not found".
//!
//! Runs as root (CI) and, for the core claims, as the unprivileged `h5i-test` user that
//! `make setup` creates.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::{git, probe, stderr, stdout, Repo};

const PROC: &str = "--isolation=process";

/// A repository with a process-tier box called `name` that holds the probe.
fn boxed(r: &Repo, name: &str, extra: &[&str]) {
    let mut args = vec!["box", "create", name, PROC];
    args.extend_from_slice(extra);
    r.ok(&args);
    common::copy_program(probe(), &r.workspace(name).join("probe"));
}

fn run(r: &Repo, name: &str, argv: &[&str]) -> std::process::Output {
    let mut args = vec!["box", "run", name, "--"];
    args.extend_from_slice(argv);
    r.h5i(&args)
}

fn probe_results(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn writes_to_etc_and_to_the_users_home_are_denied_from_inside() {
    let r = Repo::new();
    boxed(&r, "w", &[]);
    let out = run(&r, "w", &["./probe", "write", "/etc/h5i-written-from-box"]);
    let res = probe_results(&stdout(&out));
    assert!(
        matches!(res["write"].as_str(), "EROFS" | "EACCES"),
        "write to /etc: {res:?} {}",
        stderr(&out)
    );
    assert!(!Path::new("/etc/h5i-written-from-box").exists());

    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let target = format!("{home}/h5i-written-from-box");
    let out = run(&r, "w", &["./probe", "write", &target]);
    let res = probe_results(&stdout(&out));
    assert!(
        matches!(res["write"].as_str(), "EROFS" | "EACCES" | "ENOENT"),
        "write to $HOME: {res:?}"
    );
    assert!(!Path::new(&target).exists());

    // The workspace itself is writable, and the write lands on the host's workspace.
    let out = run(&r, "w", &["./probe", "write", "made-in-box"]);
    assert_eq!(probe_results(&stdout(&out))["write"], "OK");
    assert!(r.workspace("w").join("made-in-box").exists());
}

#[test]
fn files_outside_the_read_grants_are_unreadable_from_inside() {
    let r = Repo::new();
    boxed(&r, "rd", &[]);
    let secret = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
    std::fs::write(secret.path(), "host secret").unwrap();
    let out = run(
        &r,
        "rd",
        &["./probe", "read", secret.path().to_str().unwrap()],
    );
    let res = probe_results(&stdout(&out));
    assert!(
        matches!(res["read"].as_str(), "ENOENT" | "EACCES"),
        "{res:?}"
    );
    // The parent repository's config and refs are not in the box at all.
    let cfg = r.path().join(".git/config");
    let out = run(&r, "rd", &["./probe", "read", cfg.to_str().unwrap()]);
    let res = probe_results(&stdout(&out));
    assert!(
        matches!(res["read"].as_str(), "ENOENT" | "EACCES"),
        "{res:?}"
    );
    // A granted path reads.
    let out = run(&r, "rd", &["./probe", "read", "/etc/hostname"]);
    assert_eq!(probe_results(&stdout(&out))["read"], "OK");
}

#[test]
fn every_seccomp_deny_list_entry_is_refused_from_inside() {
    let r = Repo::new();
    boxed(&r, "sc", &[]);
    let out = run(&r, "sc", &["./probe", "syscalls"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let res = probe_results(&stdout(&out));
    let eperm = [
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "unshare",
        "setns",
        "clone_newuser",
        "clone_newns",
        "clone_newnet",
        "clone_newpid_highbits",
        "mount",
        "umount2",
        "pivot_root",
        "open_tree",
        "fsopen",
        "fspick",
        "mount_setattr",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "kexec_load",
        "init_module",
        "delete_module",
        "personality_addr_no_randomize",
        "ioctl_tiocsti",
        "ioctl_tiocsti_highbits",
        "ioctl_tioclinux",
        "socket_packet",
        "socket_inet_raw",
        "socket_inet6_raw_cloexec",
    ];
    for name in eperm {
        assert_eq!(
            res.get(name).map(String::as_str),
            Some("EPERM"),
            "{name}: {res:?}"
        );
    }
    // What must keep working does.
    for name in [
        "clone_plain",
        "personality_query",
        "personality_linux",
        "socket_inet_stream",
    ] {
        assert_eq!(
            res.get(name).map(String::as_str),
            Some("OK"),
            "{name}: {res:?}"
        );
    }
    assert_eq!(res["clone3"], "ENOSYS", "clone3 must fall back to clone");
}

#[test]
fn af_unix_sockets_are_denied_and_socketpair_allowed() {
    let r = Repo::new();
    boxed(&r, "ux", &[]);
    let out = run(&r, "ux", &["./probe", "unix"]);
    let res = probe_results(&stdout(&out));
    assert_eq!(res["socket_unix"], "EPERM");
    assert_eq!(res["socketpair_unix"], "OK");
}

#[test]
fn a_host_loopback_listener_is_unreachable_from_inside() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = Repo::new();
    boxed(&r, "lo", &[]);
    let script = format!("echo hi > /dev/tcp/127.0.0.1/{port}");
    let out = run(&r, "lo", &["bash", "-c", &script]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("Connection refused"),
        "{}",
        stderr(&out)
    );
    assert!(listener.accept().is_err(), "the host listener was reached");
}

#[test]
fn the_box_holds_no_capability_and_sees_no_host_pid() {
    let r = Repo::new();
    boxed(&r, "caps", &[]);
    let out = run(
        &r,
        "caps",
        &[
            "grep",
            "-E",
            "^Cap(Eff|Prm|Bnd|Amb|Inh):",
            "/proc/self/status",
        ],
    );
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 5, "{text}{}", stderr(&out));
    for line in text.lines() {
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
    let out = run(&r, "caps", &["sh", "-c", "ls /proc | grep -c '^[0-9]'"]);
    let n: u32 = stdout(&out).trim().parse().unwrap();
    assert!(n <= 4, "the box sees {n} pids");
    let me = std::process::id();
    let out = run(
        &r,
        "caps",
        &["./probe", "read", &format!("/proc/{me}/status")],
    );
    assert_ne!(probe_results(&stdout(&out))["read"], "OK");
}

#[test]
fn the_parent_and_a_sibling_box_are_unchanged_whatever_the_box_does_to_git() {
    let r = Repo::new();
    let main = r.git(&["rev-parse", "refs/heads/main"]);
    boxed(&r, "sib", &[]);
    boxed(&r, "attacker", &[]);
    let sib_ws = r.workspace("sib");
    // As root the workspace is the box range's: the host's git needs it named as safe.
    let safe = |ws: &Path| format!("safe.directory={}", ws.display());
    let sib_head = git(&sib_ws, &["-c", &safe(&sib_ws), "rev-parse", "HEAD"]);
    let parent_git = r.path().join(".git");
    let parent_config = std::fs::read(parent_git.join("config")).unwrap();
    let script = format!(
        r#"
        set +e
        git -c user.name=a -c user.email=a@b commit -q --allow-empty -m box-commit; echo commit=$?
        git update-ref refs/heads/main HEAD; echo update_ref=$?
        git push -q {parent} HEAD:refs/heads/main 2>/dev/null; echo push=$?
        echo forged > {parent}/refs/heads/main 2>/dev/null; echo write_ref=$?
        echo x > {parent}/objects/forged 2>/dev/null; echo write_objects=$?
        echo x > {parent}/hooks/post-checkout 2>/dev/null; echo write_hook=$?
        echo x >> {parent}/config 2>/dev/null; echo write_config=$?
        echo forged > {sib}/.git/refs/heads/h5i/sib 2>/dev/null; echo write_sibling=$?
        "#,
        parent = parent_git.display(),
        sib = sib_ws.display()
    );
    let out = run(&r, "attacker", &["bash", "-c", &script]);
    let res = probe_results(&stdout(&out));
    assert_eq!(
        res["commit"],
        "0",
        "the box can commit on its own branch: {res:?} {}",
        stderr(&out)
    );
    // `config` is not checked by exit code: with the repository under /tmp, the parent's `.git`
    // exists in the box only as a mount point inside its private /tmp, where writing a file
    // named `config` makes a box-private file. The host's file is checked below.
    for k in [
        "push",
        "write_ref",
        "write_objects",
        "write_hook",
        "write_sibling",
    ] {
        assert_ne!(res[k], "0", "{k} succeeded from inside the box");
    }
    assert_eq!(r.git(&["rev-parse", "refs/heads/main"]), main);
    assert_eq!(
        git(&sib_ws, &["-c", &safe(&sib_ws), "rev-parse", "HEAD"]),
        sib_head
    );
    assert!(!parent_git.join("objects/forged").exists());
    assert!(!parent_git.join("hooks/post-checkout").exists());
    assert_eq!(
        std::fs::read(parent_git.join("config")).unwrap(),
        parent_config
    );
    // The box's own commit is in its own repository, on its own branch.
    let aws = r.workspace("attacker");
    assert_eq!(
        git(
            &aws,
            &[
                "-c",
                &safe(&aws),
                "log",
                "-1",
                "--format=%s",
                "h5i/attacker"
            ]
        ),
        "box-commit"
    );
}

#[test]
fn the_memory_cap_oom_kills_and_the_receipt_says_so() {
    let r = Repo::new();
    r.write_policy(
        "[profile.small]\nisolation = \"process\"\n[profile.small.resources]\nmem = \"64M\"\n",
    );
    r.ok(&["box", "create", "oom", "--profile", "small"]);
    let out = run(
        &r,
        "oom",
        &[
            "python3",
            "-c",
            "x = bytearray(512 * 1024 * 1024); print(len(x))",
        ],
    );
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    let rec = &r.receipts("oom")[0];
    assert_eq!(rec["exit"]["oom_killed"], true, "{rec}");
    assert_eq!(rec["oom"]["limit_bytes"], 64 * 1024 * 1024);
    assert!(rec["oom"]["kill_count"].as_u64().unwrap() >= 1);
    assert!(
        rec["oom"]["peak_bytes"].as_u64().unwrap() > 32 * 1024 * 1024,
        "{rec}"
    );
    let status = r.ok(&["box", "status", "oom"]);
    assert!(
        status.contains("mem          64 MiB\n"),
        "mem must be listed as enforced: {status}"
    );
}

#[test]
fn the_process_cap_holds() {
    let r = Repo::new();
    r.write_policy("[profile.few]\nisolation = \"process\"\n[profile.few.resources]\nprocs = 8\n");
    r.ok(&["box", "create", "forks", "--profile", "few"]);
    let out = run(
        &r,
        "forks",
        &[
            "bash",
            "-c",
            "for i in $(seq 30); do sleep 3 & done 2>&1; wait",
        ],
    );
    let e = stdout(&out) + &stderr(&out);
    assert!(e.contains("Resource temporarily unavailable"), "{e}");
}

#[test]
fn the_wall_clock_kills_a_process_tier_box_with_124() {
    let r = Repo::new();
    r.write_policy(
        "[profile.quick]\nisolation = \"process\"\n[profile.quick.resources]\nwall = \"2s\"\n",
    );
    r.ok(&["box", "create", "slow", "--profile", "quick"]);
    let started = std::time::Instant::now();
    let out = run(&r, "slow", &["sh", "-c", "sleep 73.17 & sleep 73.17"]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let ps = Command::new("pgrep")
        .args(["-f", "sleep 73.17"])
        .output()
        .unwrap();
    assert!(
        stdout(&ps).trim().is_empty(),
        "box processes outlived the wall clock"
    );
}

#[test]
fn a_repository_under_tmp_is_visible_in_the_box_despite_the_private_tmp() {
    let r = Repo::new();
    assert!(r.path().starts_with("/tmp"));
    boxed(&r, "tmpws", &[]);
    let out = run(&r, "tmpws", &["cat", "README.md"]);
    assert_eq!(stdout(&out), "hello\n", "{}", stderr(&out));
    let out = run(&r, "tmpws", &["git", "status", "--porcelain"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "?? probe\n");
}

#[test]
fn auto_picks_the_process_tier_when_supervised_cannot_run() {
    // No pasta on PATH: the supervised tier's uplink cannot be made, so `auto` takes the
    // next strongest tier this host runs.
    let bin = common::path_with_only(&["git", "nft"]);
    let path = bin.path().display().to_string();
    let r = Repo::new();
    let out = r.h5i_env(&["box", "create", "auto"], &[("PATH", &path)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(r.manifest("auto")["tier"], "process");
    let status = r.ok(&["box", "status", "auto"]);
    assert!(status.contains("auto"), "{status}");
}

/// The same core claims, as an unprivileged user.
#[test]
fn an_unprivileged_user_gets_the_same_confinement() {
    if !common::require_root(
        "an_unprivileged_user_gets_the_same_confinement",
        "switching to h5i-test",
    ) {
        return;
    }
    // The build tree may sit where h5i-test cannot reach (CI clones under /root): the user runs
    // its own copies of h5i and its sibling binaries.
    let (dir, uid) = common::unprivileged_tree(common::TEST_USER, &[(probe(), "probe")]);
    let uid = uid.to_string();
    let repo = dir.path().join("repo");
    let h5i = dir.path().join("bin/h5i").display().to_string();
    let script = format!(
        r#"set -e
        cd {repo}
        git init -q -b main .
        echo hi > f
        git add f
        git -c user.name=u -c user.email=u@x commit -qm i
        {h5i} box create u --isolation process >/dev/null
        cp ../probe .git/.h5i/env/none/u/workspace/probe
        {h5i} box run u -- ./probe write /etc/h5i-user-write
        {h5i} box run u -- ./probe syscalls | grep -E '^(unshare|ptrace|ioctl_tiocsti|socket_packet)='
        {h5i} box run u -- grep CapEff /proc/self/status
        {h5i} box run u -- sh -c 'id -u; echo made > by-box'
        stat -c owner=%u .git/.h5i/env/none/u/workspace/by-box
        "#,
        repo = repo.display(),
    );
    let out = common::as_user(common::TEST_USER, Some("/tmp"))
        .args(["bash", "-c", &script])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let res = probe_results(&text);
    assert!(
        matches!(res["write"].as_str(), "EROFS" | "EACCES"),
        "{res:?}"
    );
    for k in ["unshare", "ptrace", "ioctl_tiocsti", "socket_packet"] {
        assert_eq!(res[k], "EPERM", "{k}");
    }
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    // The box's uid 0 is the caller: what it writes is the caller's, and it holds nothing.
    assert!(text.lines().any(|l| l == "0"), "{text}");
    assert!(text.contains(&format!("owner={uid}")), "{text}");
    assert!(!Path::new("/etc/h5i-user-write").exists());
}

#[test]
fn the_boxs_own_loopback_works() {
    let r = Repo::new();
    boxed(&r, "own-lo", &[]);
    let script = "python3 -m http.server 18765 --bind 127.0.0.1 >/dev/null 2>&1 & \
                  for i in $(seq 50); do \
                    python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:18765/\").status)' 2>/dev/null && exit 0; \
                    sleep 0.1; \
                  done; exit 1";
    let out = run(&r, "own-lo", &["bash", "-c", script]);
    assert_eq!(stdout(&out).trim(), "200", "{}", stderr(&out));
    // The host never saw that listener: the box's loopback is its own.
    assert!(std::net::TcpStream::connect("127.0.0.1:18765").is_err());
}

#[test]
fn the_file_size_cap_refuses_a_runaway_writer_with_efbig() {
    let r = Repo::new();
    boxed(&r, "fsize", &[]);
    let script = "import errno, os, signal\n\
                  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n\
                  fd = os.open('huge', os.O_WRONLY | os.O_CREAT)\n\
                  try:\n    os.ftruncate(fd, 9 << 30)\n    print('grew')\n\
                  except OSError as e:\n    print(errno.errorcode[e.errno])\n";
    let out = run(&r, "fsize", &["python3", "-c", script]);
    assert_eq!(stdout(&out).trim(), "EFBIG", "{}", stderr(&out));
}

#[test]
fn probe_reports_what_this_host_can_enforce() {
    let r = Repo::new();
    let text = r.ok(&["box", "probe"]);
    for want in [
        "tier process= available",
        "landlock= ABI ",
        "seccomp= filters + user notification",
        "user namespaces= available",
        "cgroups= v",
        "tty-injection= ",
    ] {
        assert!(text.contains(want), "missing `{want}` in:\n{text}");
    }
}

/// A probe killed before it removed its trial cage leaves the group behind. The next probe
/// removes the groups of probes that are gone (named `_probe-<pid>-<start>`) and still
/// answers: a leftover never blocks a later h5i given the same pid. A group named like a box's
/// run cage (`probe-<pid>-<ms>`, a box named `probe`) is not a probe's and stays.
#[test]
fn a_dead_probes_trial_cage_is_swept_and_the_probe_still_answers() {
    let r = Repo::new();
    // pid 999999 is above this host's pid_max: no process can hold it.
    let stale = "_probe-999999-1";
    let boxs = "probe-999999-2";
    for name in [stale, boxs] {
        h5i_runtime::cage::ResourceCage::create(name, Some(64 << 20), Some(64))
            .unwrap()
            .keep();
        assert!(h5i_runtime::cage::cages().iter().any(|c| c == name));
    }
    let text = r.ok(&["box", "probe"]);
    assert!(text.contains("tier process= available"), "{text}");
    let left = h5i_runtime::cage::cages();
    assert!(!left.iter().any(|c| c == stale), "{stale} left in {left:?}");
    assert!(left.iter().any(|c| c == boxs), "{boxs} swept: {left:?}");
    h5i_runtime::cage::remove_tree(boxs).unwrap();
}

/// A box named `probe` holds a run in a cage of its own (`probe-<pid>-<ms>`, the container
/// path a terminal or credential-grant run takes) while the same caller's `box status` and
/// `doctor` probe the host and sweep dead probes' cages: the run is neither killed nor told it
/// was OOM-killed, and finishes with its own exit and a receipt without an OOM.
fn a_box_named_probe_keeps_its_run_through_other_probes(as_user: bool) {
    let mut c = common::Caller::either(as_user);
    let who = c.who();
    c.create_at("probe", "process");
    let ws = c.workspace("probe");
    let held = c
        .h5i_cmd_with(
            &[
                "box",
                "run",
                "probe",
                "--",
                "sh",
                "-c",
                "echo started > started; sleep 6; echo survived > survived",
            ],
            &[("H5I_SANDBOX", "off")],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        common::until(std::time::Duration::from_secs(60), || ws
            .join("started")
            .exists()),
        "as {who}: the run never started"
    );
    c.ok(&["box", "status", "probe"]);
    let _ = c.h5i(&["doctor"]);
    let status = common::wait_bounded(held, std::time::Duration::from_secs(120), "the held run");
    assert!(
        status.success() && ws.join("survived").exists(),
        "as {who}: the run ended {status:?} before it finished"
    );
    let last = c.last_run("probe");
    assert!(
        last["oom"].is_null() && last["exit"]["oom_killed"] != true,
        "as {who}: {last}"
    );
}

#[test]
fn a_box_named_probe_keeps_its_run_through_other_probes_as_root() {
    a_box_named_probe_keeps_its_run_through_other_probes(false);
}

#[test]
fn a_box_named_probe_keeps_its_run_through_other_probes_as_h5i_test() {
    a_box_named_probe_keeps_its_run_through_other_probes(true);
}

/// A process box's own dials are refused at once by its own kernel and counted by destination:
/// a TCP connect to a test host fails with `EHOSTUNREACH` (not a timeout), a UDP send with
/// `EPERM`, an ICMP echo is refused too; the box cannot give itself a route or wake the void end
/// of its pair (no capability); nothing leaves (the host saw nothing, and neither device sent a
/// packet); its own loopback still serves. The run's receipt counts the refused TCP and UDP
/// destinations, `box status` no longer says "not counted", and the export's "Denied egress
/// attempts" lists the dial. Each run's tally is its own, through the box's warm sandbox and
/// through a container of the run's own (`H5I_SANDBOX=off`). As root and as h5i-test.
fn a_direct_connection_is_refused_and_counted(as_user: bool) {
    let test = "a_direct_connection_is_refused_and_counted";
    let Some(mut hosts) = common::testnet::TestHosts::up(test, &[8080], &[]) else {
        return;
    };
    let mut c = common::Caller::either(as_user);
    let who = c.who();
    c.create_at("nc", "process");
    let script = r#"
import errno, socket, subprocess, sys, threading, time
def err(e):
    return errno.errorcode.get(e.errno, e.errno)
s = socket.socket()
s.settimeout(20)
t0 = time.monotonic()
try:
    s.connect((sys.argv[1], 8080))
    print("connect=OK")
except OSError as e:
    print("connect=%s" % err(e))
print("connect_secs=%d" % int(time.monotonic() - t0))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", (sys.argv[1], 53))
    print("udp=OK")
except OSError as e:
    print("udp=%s" % err(e))
try:
    p = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    p.sendto(b"\x08\x00\x00\x00\x00\x01\x00\x01", (sys.argv[1], 0))
    print("icmp=OK")
except OSError as e:
    print("icmp=%s" % err(e))
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(1)
threading.Thread(target=lambda: l.accept()[0].sendall(b"hi"), daemon=True).start()
c = socket.create_connection(l.getsockname(), timeout=10)
print("loopback=%s" % c.recv(2).decode())
for name, argv in [("route", ["route", "add", sys.argv[1], "dev", "lo"]),
                   ("wake", ["link", "set", "h5i-void", "up"])]:
    r = subprocess.run(["/usr/bin/ip"] + argv, capture_output=True, text=True)
    print("%s=%d %s" % (name, r.returncode, r.stderr.strip()))
for line in open("/proc/net/dev"):
    name, _, rest = line.partition(":")
    if name.strip().startswith("h5i-"):
        f = rest.split()
        print("tx_%s=%s packets %s dropped" % (name.strip(), f[9], f[11]))
"#;
    let first = hosts.first.to_string();
    let tcp_key = format!("{first}:8080/tcp");
    let udp_key = format!("{first}:53/udp");
    for (round, sandbox) in [(1, "on"), (2, "off")] {
        let out = c.h5i_with(
            &["box", "run", "nc", "--", "python3", "-c", script, &first],
            &[("H5I_SANDBOX", sandbox)],
        );
        let res = probe_results(&stdout(&out));
        let said = format!("{who} round {round}: {}{}", stdout(&out), stderr(&out));
        assert_eq!(
            res.get("connect").map(String::as_str),
            Some("EHOSTUNREACH"),
            "{said}"
        );
        assert_eq!(
            res.get("connect_secs").map(String::as_str),
            Some("0"),
            "a refusal, not a timeout: {said}"
        );
        assert_eq!(res.get("udp").map(String::as_str), Some("EPERM"), "{said}");
        assert!(
            matches!(
                res.get("icmp").map(String::as_str),
                Some("EPERM" | "EACCES")
            ),
            "{said}"
        );
        assert_eq!(
            res.get("loopback").map(String::as_str),
            Some("hi"),
            "{said}"
        );
        for step in ["route", "wake"] {
            assert!(
                res[step].starts_with('2') && res[step].contains("Operation not permitted"),
                "{said}: the box changed its own network ({step})"
            );
        }
        for dev in ["h5i-deny", "h5i-void"] {
            assert_eq!(
                res.get(&format!("tx_{dev}")).map(String::as_str),
                Some("0 packets 0 dropped"),
                "{said}: {dev} sent something"
            );
        }
        assert_eq!(
            hosts.log(),
            Vec::<String>::new(),
            "{who}: the host was reached"
        );

        let rec = c.last_run("nc");
        assert!(rec["egress"].get("uncounted").is_none(), "{said}\n{rec}");
        let denied = &rec["egress"]["denied"];
        assert!(
            denied[&tcp_key].as_u64() >= Some(1),
            "{who} round {round}: {rec}"
        );
        assert!(
            denied[&udp_key].as_u64() >= Some(1),
            "{who} round {round}: {rec}"
        );

        // The next run's tally is its own: it dialled nothing.
        c.ok(&["box", "run", "nc", "--", "true"]);
        let quiet = c.last_run("nc");
        assert_eq!(
            quiet["egress"]["denied"],
            serde_json::json!({}),
            "{who}: {quiet}"
        );
    }

    let status = c.ok(&["box", "status", "nc"]);
    assert!(!status.contains("not counted"), "{who}: {status}");
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(c.uid()), Some(c.uid())).unwrap();
    let review = dir.path().join("review");
    c.ok(&["box", "export", "nc", "--out", review.to_str().unwrap()]);
    let report = std::fs::read_to_string(review.join("report.md")).unwrap();
    let denied = report
        .split("## Denied egress attempts")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .unwrap();
    assert!(
        denied.contains(&format!("`{tcp_key}` refused")),
        "{who}: {denied}"
    );
    assert!(!denied.contains("Not counted"), "{who}: {denied}");
}

#[test]
fn a_direct_connection_is_refused_by_the_kernel_and_counted() {
    a_direct_connection_is_refused_and_counted(false);
}

#[test]
fn a_direct_connection_is_refused_by_the_kernel_and_counted_as_h5i_test() {
    a_direct_connection_is_refused_and_counted(true);
}
