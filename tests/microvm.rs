//! The microvm tier's QEMU backend, asserted from inside real guests booted under QEMU
//! `-M microvm` (software-emulated on a host whose KVM cannot run a stock kernel): exit codes,
//! stdout, stderr and stdin pass through; a write under `/work` lands in `box diff`; the guest
//! runs a kernel of its own, as a user that is not root, on a read-only image root, with no
//! network device; nothing of the host outside `/work` is visible, and a symlink planted in
//! `/work` resolves inside the guest, never on the host; the VM boots once and serves the next
//! run warm; the wall clock kills with 124 and an OOM at the memory ceiling is reported; `rm`
//! stops the VM; a run whose `h5i` is killed ends in the guest; egress reaches an allowed test
//! host only through the forward to the host's proxy, tallied, while a direct socket to any
//! address has no route; a policy asking for the host's network is refused before anything
//! boots; `probe` and `status` say "software-emulated"; `box shell` gets a pty of the guest's
//! own that follows the user's terminal, and only the guest's bytes reach that terminal; what
//! the guest stages in its spool is ingested and `box export` carries what ran; QEMU is in its
//! cgroup from its first instruction.
//!
//! Run as root (CI): the image is the registry-free `localhost/h5i-busybox` in the container
//! engine user's storage (scripts/make-test-image.sh), as at the container tier. The guest
//! agent is the musl build of `h5i-guest`, built here when missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::testnet::TestHosts;
use common::{stderr, stdout, Repo};

const IMAGE: &str = "localhost/h5i-busybox:latest";
const USER: &str = "h5i-test";

/// One VM test at a time: emulated guests booting side by side on a shared host only make
/// each other slow.
static ONE_VM_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Root, the engine user's image and a built guest agent (held one test at a time), or a loud
/// skip.
fn ready(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    if !common::require_root(test, &format!("the image is in {USER}'s rootless storage")) {
        return None;
    }
    let guard = ONE_VM_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    common::caller::container_image();
    if !common::guest_agent_ready(test) {
        return None;
    }
    Some(guard)
}

fn h5i(r: &Repo, args: &[&str]) -> Output {
    h5i_with(r, args, &[])
}

fn h5i_with(r: &Repo, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec![("H5I_CONTAINER_USER", USER), ("H5I_NO_PROBE_CACHE", "1")];
    all.extend_from_slice(env);
    r.h5i_env(args, &all)
}

/// A microvm box that is removed (and its VM stopped) when the test ends, pass or fail.
struct VmBox<'r> {
    repo: &'r Repo,
    name: &'static str,
}

impl<'r> VmBox<'r> {
    fn create(repo: &'r Repo, name: &'static str, extra: &[&str]) -> VmBox<'r> {
        let mut args = vec!["box", "create", name, "--image", IMAGE];
        args.extend_from_slice(extra);
        let out = h5i(repo, &args);
        assert!(out.status.success(), "create: {}", stderr(&out));
        VmBox { repo, name }
    }

    fn run(&self, argv: &[&str]) -> Output {
        let mut args = vec!["box", "run", self.name, "--"];
        args.extend_from_slice(argv);
        h5i(self.repo, &args)
    }

    fn sh(&self, script: &str) -> Output {
        self.run(&["sh", "-c", script])
    }

    /// The QEMU pid `status` names, when the VM is up.
    fn qemu_pid(&self) -> Option<i32> {
        let out = h5i(self.repo, &["box", "status", self.name]);
        let text = stdout(&out);
        let line = text.lines().find(|l| l.starts_with("microvm: VM up"))?;
        line.split("QEMU pid ")
            .nth(1)?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    }
}

impl Drop for VmBox<'_> {
    fn drop(&mut self) {
        let _ = h5i(self.repo, &["box", "rm", "--force", self.name]);
    }
}

#[test]
fn a_microvm_box_runs_commands_in_a_guest_kernel_of_its_own() {
    let Some(_one) = ready("a_microvm_box_runs_commands_in_a_guest_kernel_of_its_own") else {
        return;
    };
    let r = Repo::new();
    // Host files the guest must not see: one beside the workspace in the repository, one in
    // the box's own directory (receipts live there).
    std::fs::write(r.path().join("host-only-marker-7f3a"), "host secret\n").unwrap();
    let b = VmBox::create(&r, "vm", &["--isolation", "microvm"]);
    std::fs::write(b.repo.box_dir("vm").join("box-dir-marker-7f3a"), "x").unwrap();

    // Exit code, stdout and stderr pass through, each on its own stream.
    let out = b.sh("echo to-out; echo to-err >&2; exit 7");
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(stdout(&out), "to-out\n");
    assert!(stderr(&out).contains("to-err"), "{}", stderr(&out));
    let first_pid = b.qemu_pid().expect("the VM is up after the first run");

    // A write under /work lands in the box's workspace and in `box diff`.
    let out = b.sh("echo from-the-guest > /work/guest.txt");
    assert!(out.status.success(), "{}", stderr(&out));
    let diff = stdout(&h5i(&r, &["box", "diff", "vm"]));
    assert!(
        diff.contains("guest.txt") && diff.contains("+from-the-guest"),
        "{diff}"
    );

    // Stdin reaches the command.
    let mut child = Command::new(common::H5I)
        .args(["box", "run", "vm", "--", "cat"])
        .current_dir(r.path())
        .env("H5I_CONTAINER_USER", USER)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"through stdin\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through stdin\n");

    // Its own kernel, not the host's; not root; a read-only image root; no network device.
    let host_release =
        String::from_utf8(Command::new("uname").arg("-r").output().unwrap().stdout).unwrap();
    let out = b.sh(
        "uname -r; id -u; touch /etc/h5i-probe 2>&1 || echo root-write-refused; \
         ls /sys/class/net; nc -w 2 198.18.0.1 80 </dev/null 2>&1 || echo connect-failed; \
         echo \"proxy=[$HTTPS_PROXY]\"",
    );
    let text = stdout(&out);
    let mut lines = text.lines();
    let guest_release = lines.next().unwrap();
    assert_ne!(
        guest_release,
        host_release.trim(),
        "the guest runs its own kernel"
    );
    assert_ne!(
        lines.next().unwrap(),
        "0",
        "the command is not root in the guest"
    );
    assert!(
        text.contains("Permission denied") && text.contains("root-write-refused"),
        "{text}"
    );
    assert!(text.lines().any(|l| l == "lo"), "{text}");
    assert!(!text.contains("eth0"), "no network device: {text}");
    assert!(text.contains("connect-failed"), "{text}");
    assert!(
        text.contains("proxy=[]"),
        "network off by default: no forward named: {text}"
    );

    // Nothing of the host outside /work: not the repository beside the workspace, not the box
    // directory, not the host's root.
    let out = b.sh(
        "find / -xdev -name '*marker-7f3a*' 2>/dev/null; find /work -name '*marker*'; echo done",
    );
    assert_eq!(stdout(&out), "done\n", "host files seen from the guest");
    // A symlink planted in /work resolves in the guest: writing through it leaves the host's
    // directory outside the workspace untouched.
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().display().to_string();
    let out = b.sh(&format!(
        "ln -s {target} /work/escape && echo pwned > /work/escape/planted 2>&1; echo rc=$?"
    ));
    assert!(stdout(&out).contains("rc="), "{}", stderr(&out));
    assert!(
        !outside.path().join("planted").exists(),
        "a write through a symlink in /work reached the host"
    );

    // Warm: the same VM served every run, and status says how it runs.
    assert_eq!(b.qemu_pid(), Some(first_pid), "the VM was booted again");
    let status = stdout(&h5i(&r, &["box", "status", "vm"]));
    assert!(
        status.contains("software-emulated") || status.contains("KVM"),
        "{status}"
    );
    let receipt = r.last_run("vm");
    assert_eq!(receipt["lane"], "host-env-run");

    // rm stops the VM.
    drop(b);
    assert!(
        common::until(std::time::Duration::from_secs(20), || {
            !common::process_alive(first_pid)
        }),
        "QEMU {first_pid} outlived the box"
    );
}

#[test]
fn the_wall_clock_kills_a_microvm_run_with_124_and_an_oom_is_reported() {
    let Some(_one) = ready("the_wall_clock_kills_a_microvm_run_with_124_and_an_oom_is_reported")
    else {
        return;
    };
    let r = Repo::new();
    r.write_policy(
        "[profile.vm]\nisolation = \"microvm\"\n\n[profile.vm.resources]\nmem = \"64M\"\nprocs = 64\nwall = \"10s\"\n",
    );
    let b = VmBox::create(&r, "lim", &["--profile", "vm"]);
    let out = b.run(&["true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = b.run(&["sleep", "600"]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(stderr(&out).contains("wall-clock"), "{}", stderr(&out));
    // The kill took the run's whole cgroup: the VM still serves the next run.
    let out = b.sh("x=0123456789abcdef; while :; do x=$x$x; done");
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    assert!(stderr(&out).contains("OOM"), "{}", stderr(&out));
    let rec = r.last_run("lim");
    assert_eq!(rec["exit"]["oom_killed"], true, "{rec}");
    // procs holds: more processes than the ceiling cannot be made.
    let out =
        b.sh("i=0; while [ $i -lt 80 ]; do sleep 5 & i=$((i+1)); done 2>&1 | head -n 1; echo made");
    assert!(stdout(&out).contains("made"), "{}", stderr(&out));
    assert!(
        stdout(&out)
            .to_lowercase()
            .contains("resource temporarily unavailable")
            || stdout(&out).to_lowercase().contains("can't fork"),
        "{}",
        stdout(&out)
    );
}

/// A run whose `h5i` is killed (its host end of the port gone, no Kill sent) is ended in the
/// guest with its whole cgroup, without another run on that port to reset it; the VM then
/// serves the next run.
#[test]
fn a_run_whose_host_end_goes_away_is_killed_in_the_guest() {
    let Some(_one) = ready("a_run_whose_host_end_goes_away_is_killed_in_the_guest") else {
        return;
    };
    let r = Repo::new();
    let b = VmBox::create(&r, "vm", &["--isolation", "microvm"]);
    assert!(b.sh("true").status.success(), "the first run boots the VM");
    let beat = r.workspace("vm").join("beat");
    let mut orphan = Command::new(common::H5I)
        .args(["box", "run", "vm", "--", "sh", "-c"])
        .arg("i=0; while :; do i=$((i+1)); echo $i > /work/beat.new && mv /work/beat.new /work/beat; sleep 0.2; done")
        .current_dir(r.path())
        .env("H5I_CONTAINER_USER", USER)
        .spawn()
        .unwrap();
    assert!(
        common::until(std::time::Duration::from_secs(120), || beat.exists()),
        "the run never started"
    );
    orphan.kill().unwrap();
    orphan.wait().unwrap();
    // The beat stops: unchanged over 2 s (ten of its periods), and still unchanged 3 s later.
    let still = |quiet: u64| {
        let before = std::fs::read(&beat).unwrap_or_default();
        std::thread::sleep(std::time::Duration::from_secs(quiet));
        std::fs::read(&beat).unwrap_or_default() == before
    };
    assert!(
        common::until(std::time::Duration::from_secs(90), || still(2)) && still(3),
        "the run of a killed h5i kept running in the guest"
    );
    let out = b.sh("echo served");
    assert_eq!(stdout(&out), "served\n", "{}", stderr(&out));
}

/// Egress through the forward: a command in the guest reaches an allowed test host only
/// through its port's forward to the host's egress proxy, which counts it in the receipt; a
/// listed name it may not reach is refused with 403 and counted; a socket straight to any
/// address (the allowed host's too, TCP or UDP) has no route out of the guest; another port's
/// forward, with no run of its own, forwards nothing.
#[test]
fn egress_reaches_an_allowed_test_host_only_through_the_forward_and_is_tallied() {
    const TEST: &str =
        "egress_reaches_an_allowed_test_host_only_through_the_forward_and_is_tallied";
    let Some(_one) = ready(TEST) else {
        return;
    };
    let mut hosts = TestHosts::up(TEST, &[8443], &[5353]).unwrap();
    let r = Repo::new();
    r.write_policy(
        "[profile.out]\nisolation = \"microvm\"\n\n[profile.out.net]\nmode = \"deny\"\negress = [\"allowed.test:8443\"]\n",
    );
    let pin = hosts.pin(&[("allowed.test", hosts.first), ("denied.test", hosts.second)]);
    let env = [("H5I_TEST_HOSTS", pin.as_str())];
    let out = h5i_with(
        &r,
        &["box", "create", "out", "--image", IMAGE, "--profile", "out"],
        &env,
    );
    assert!(out.status.success(), "create: {}", stderr(&out));
    let _removed_at_the_end = VmBox {
        repo: &r,
        name: "out",
    };
    let connect = |host: &str, port: &str| {
        format!(
            "printf 'CONNECT {host}:8443 HTTP/1.1\\r\\nHost: {host}:8443\\r\\n\\r\\n' | nc -w 5 127.0.0.1 {port} | head -c 300; echo"
        )
    };
    let script = format!(
        "echo proxy=$HTTPS_PROXY; port=${{HTTPS_PROXY##*:}}; {}; echo ---; {}; echo ---; {}; echo ---; \
         nc -w 3 {first} 8443 </dev/null 2>&1 || echo raw-to-allowed-failed; \
         nc -w 3 {second} 8443 </dev/null 2>&1 || echo raw-to-unlisted-failed; \
         echo udp | nc -u -w 1 {second} 5353 2>&1 || echo udp-failed",
        connect("allowed.test", "$port"),
        connect("denied.test", "$port"),
        connect("allowed.test", "$((port + 1))"),
        first = hosts.first,
        second = hosts.second,
    );
    let out = h5i_with(&r, &["box", "run", "out", "--", "sh", "-c", &script], &env);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("proxy=http://127.0.0.1:3128"), "{text}");
    let parts: Vec<&str> = text.split("---").collect();
    let (allowed, denied, other_port, raw) = (parts[0], parts[1], parts[2], parts[3]);
    assert!(allowed.contains(" 200"), "{allowed}");
    assert!(
        allowed.contains(&format!("hello {}:8443", hosts.first)),
        "{allowed}"
    );
    assert!(denied.contains("403"), "{denied}");
    assert!(!denied.contains("hello"), "{denied}");
    assert!(
        !other_port.contains("200") && !other_port.contains("hello"),
        "another port's forward carried a connection: {other_port}"
    );
    for refused in ["raw-to-allowed-failed", "raw-to-unlisted-failed"] {
        assert!(raw.contains(refused), "{raw}");
    }
    assert!(!raw.contains("hello"), "a direct socket got out: {raw}");
    // The allowed host was reached once, through the proxy; nothing else reached any host.
    assert_eq!(hosts.log(), [format!("tcp {}:8443", hosts.first)]);
    let rec = r.last_run("out");
    assert_eq!(rec["egress"]["allowed"]["allowed.test:8443"], 1, "{rec}");
    assert_eq!(rec["egress"]["denied"]["denied.test:8443"], 1, "{rec}");
    let status = stdout(&h5i(&r, &["box", "status", "out"]));
    assert!(
        status.contains("microvm egress: through a forward"),
        "{status}"
    );
}

#[test]
fn a_policy_asking_for_the_host_network_is_refused_before_a_vm_boots() {
    let Some(_one) = ready("a_policy_asking_for_the_host_network_is_refused_before_a_vm_boots")
    else {
        return;
    };
    let r = Repo::new();
    r.write_policy(
        "[profile.out]\nisolation = \"microvm\"\n\n[profile.out.net]\nmode = \"host\"\n",
    );
    let b = VmBox::create(&r, "out", &["--profile", "out"]);
    let out = b.run(&["true"]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("net.mode = \"host\"") && err.contains("to fix:"),
        "{err}"
    );
    assert_eq!(b.qemu_pid(), None, "a VM was booted for a refused run");
}

/// Services are promised at the workspace and process tiers only (the manual's "Services and
/// ports"): at microvm `service start` is refused with the mend, before any VM boots.
#[test]
fn a_service_at_the_microvm_tier_is_refused_with_the_mend_before_a_vm_boots() {
    let Some(_one) =
        ready("a_service_at_the_microvm_tier_is_refused_with_the_mend_before_a_vm_boots")
    else {
        return;
    };
    let r = Repo::new();
    r.write_policy(
        "[profile.vm]\nisolation = \"microvm\"\n\n[service.web]\ncommand = \"sleep 600\"\nport = 8000\n",
    );
    let b = VmBox::create(&r, "svc", &["--profile", "vm"]);
    let out = h5i(&r, &["box", "service", "start", "svc", "web"]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("refusing:") && err.contains("microvm tier") && err.contains("to fix:"),
        "{err}"
    );
    assert_eq!(b.qemu_pid(), None, "a VM was booted for a refused service");
}

/// QEMU, seen from outside: it runs in a cgroup of its own with its memory and task ceilings,
/// and a world-readable host file outside its grants cannot be opened by it (EACCES from
/// Landlock, asked inside QEMU's own process through gdb), while a file it is granted can.
/// Whether gdb can make a process call a function here (the test below has QEMU call `open`):
/// asked of a throwaway `sleep`, which must answer its own pid. On some virtual CPUs ptrace
/// cannot write the extended register state a call needs, and gdb fails (and the inferior dies).
fn gdb_can_call_into_a_process() -> bool {
    let Ok(mut sleeper) = Command::new("sleep").arg("60").spawn() else {
        return false;
    };
    let pid = sleeper.id();
    let answer = Command::new("timeout")
        .args(["60", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "call (int)getpid()"])
        .output();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    answer.is_ok_and(|a| {
        String::from_utf8_lossy(&a.stdout)
            .lines()
            .any(|l| l.starts_with('$') && l.ends_with(&format!(" = {pid}")))
    })
}

#[test]
fn qemu_is_confined_on_the_host_and_cannot_open_a_host_file_outside_its_grants() {
    const TEST: &str =
        "qemu_is_confined_on_the_host_and_cannot_open_a_host_file_outside_its_grants";
    let Some(_one) = ready(TEST) else {
        return;
    };
    if Command::new("gdb").arg("--version").output().is_err() {
        h5i_testsupport::skipped!("{TEST}: gdb is not installed (apt-get install gdb)");
        return;
    }
    if !gdb_can_call_into_a_process() {
        h5i_testsupport::skipped!(
            "{TEST}: gdb cannot call a function in another process on this host (ptrace cannot write this CPU's extended register state: \"Couldn't write extended state status\")"
        );
        return;
    }
    let r = Repo::new();
    r.write_policy(
        "[profile.vm]\nisolation = \"microvm\"\n\n[profile.vm.resources]\nmem = \"256M\"\n",
    );
    let b = VmBox::create(&r, "qc", &["--profile", "vm"]);
    let out = b.sh("true");
    assert!(out.status.success(), "{}", stderr(&out));
    let pid = b.qemu_pid().expect("the VM is up");

    // Its own group, with its ceilings: cgroup v2's `0::` line, or v1's memory and pids lines.
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path_of = |controller: &str| {
        cgroup.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, names, path) = (f.next()?, f.next()?, f.next()?);
            names
                .split(',')
                .any(|n| n == controller)
                .then(|| path.trim_start_matches('/').to_string())
        })
    };
    let read = |dir: std::path::PathBuf, f: &str| {
        assert!(
            dir.to_string_lossy().contains("/h5i/microvm-"),
            "QEMU's cgroup: {cgroup}"
        );
        std::fs::read_to_string(dir.join(f))
            .unwrap()
            .trim()
            .to_string()
    };
    let root = Path::new("/sys/fs/cgroup");
    let (mem, tasks) = match path_of("memory") {
        Some(m) => (
            read(root.join("memory").join(m), "memory.limit_in_bytes"),
            read(root.join("pids").join(path_of("pids").unwrap()), "pids.max"),
        ),
        None => {
            let v2 = path_of("").unwrap();
            (
                read(root.join(&v2), "memory.max"),
                read(root.join(&v2), "pids.max"),
            )
        }
    };
    assert_eq!(tasks, "512");
    // QEMU entered its group itself, before it exec'd: every anonymous page it holds is
    // charged to the group (one moved in after it started would leave what it allocated until
    // then charged where it came from). Read QEMU's own figure first: the group's can only have
    // grown by the time it is read; the slack is the kernel's per-CPU batching of the group's
    // figures (64 pages a CPU).
    if path_of("memory").is_none() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let rss_anon: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .map(|kb: u64| kb << 10)
            .unwrap();
        let stat = read(root.join(path_of("").unwrap()), "memory.stat");
        let charged: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("anon "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        assert!(
            charged + cpus * 64 * 4096 >= rss_anon,
            "QEMU holds {rss_anon} anonymous bytes, its group is charged {charged}"
        );
    }
    // The guest's RAM (mem + 192 MiB for its kernel and agent) plus 512 MiB for QEMU itself.
    assert_eq!(mem, ((256u64 + 192 + 512) << 20).to_string());

    // A file any user may read (so only Landlock can refuse it), and one of its grants.
    use std::os::unix::fs::PermissionsExt;
    let outside = "/etc/hostname";
    assert_ne!(
        std::fs::metadata(outside).unwrap().permissions().mode() & 0o004,
        0
    );
    let granted = "/usr/bin/qemu-system-x86_64";
    let gdb = Command::new("timeout")
        .args(["120", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", &format!("call (int)open(\"{outside}\", 0)")])
        .args(["-ex", "print *((int*(*)(void))__errno_location)()"])
        .args(["-ex", &format!("call (int)open(\"{granted}\", 0)")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&gdb.stdout);
    let values: Vec<i64> = text
        .lines()
        .filter_map(|l| {
            l.strip_prefix('$')?
                .split(" = ")
                .nth(1)?
                .trim()
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(
        values.len(),
        3,
        "gdb: {text}{}",
        String::from_utf8_lossy(&gdb.stderr)
    );
    assert_eq!(values[0], -1, "QEMU opened {outside}: {text}");
    assert_eq!(values[1], i64::from(libc::EACCES), "{text}");
    assert!(
        values[2] >= 0,
        "QEMU could not open {granted}, which it is granted: {text}"
    );
    // The VM still serves after the look inside.
    assert_eq!(stdout(&b.sh("echo served")), "served\n");
}

/// The spool and the export at this tier: what a command in the guest stages in its spool
/// (`/.h5i/spool`, a 9p share of the box's own) is ingested after the run, box-claimed, never
/// host-observed, and a hostile entry (a forged host-observed lane, an escape sequence, a
/// symlink to a host file) is quarantined with its reason; `box export` of the microvm box
/// writes the patch (the guest's write under `/work`), report.md naming what ran at `microvm`
/// with its exit, and receipt.json holding every record of the box's log, none damaged.
#[test]
fn a_microvm_box_stages_into_its_spool_and_exports_what_ran() {
    const TEST: &str = "a_microvm_box_stages_into_its_spool_and_exports_what_ran";
    let Some(_one) = ready(TEST) else {
        return;
    };
    let r = Repo::new();
    let b = VmBox::create(&r, "ex", &["--isolation", "microvm"]);
    let script = r#"set -e
        s="$H5I_ENV_CAPTURE_SPOOL"
        echo from-the-guest > /work/exported.txt
        printf '{"kind":"command","argv":["make","test"]}' > $s/01-good.json
        printf '{"kind":"run","lane":"host-env-run","exit":{"code":0}}' > $s/02-forged.json
        printf '{"kind":"note","text":"]52;c;aGk="}' > $s/03-escape.json
        ln -s /etc/passwd $s/04-link.json
        exit 4"#;
    let out = b.run(&["sh", "-c", script]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let recs = r.receipts("ex");
    assert_eq!(recs[0]["lane"], "host-env-run", "{recs:?}");
    assert_eq!(recs[0]["tier"], "microvm", "{}", recs[0]);
    let rest = &recs[1..];
    assert_eq!(rest.len(), 4, "{rest:?}");
    assert_eq!(rest[0]["kind"], "box-claimed", "{}", rest[0]);
    assert_ne!(rest[0]["lane"], "host-env-run", "{}", rest[0]);
    for (rec, why) in rest[1..]
        .iter()
        .zip(["host-observed", "control", "symlink"])
    {
        assert_eq!(rec["kind"], "quarantined", "{rec}");
        assert!(rec["reason"].as_str().unwrap().contains(why), "{rec}");
    }
    assert!(
        std::fs::read_dir(r.box_dir("ex").join("spool"))
            .unwrap()
            .next()
            .is_none(),
        "ingested entries are cleared"
    );

    let review = tempfile::tempdir().unwrap();
    let dest = review.path().join("review");
    let out = h5i(
        &r,
        &["box", "export", "ex", "--out", dest.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let patch = std::fs::read_to_string(dest.join("patch.diff")).unwrap();
    assert!(
        patch.contains("exported.txt") && patch.contains("+from-the-guest"),
        "{patch}"
    );
    let report = std::fs::read_to_string(dest.join("report.md")).unwrap();
    let ran = report
        .split("## What ran")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .unwrap_or_default();
    assert!(
        ran.contains("`microvm`") && ran.contains("sh -c") && ran.contains('4'),
        "{report}"
    );
    assert!(!report.contains('\x1b'), "{report}");
    let receipt: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dest.join("receipt.json")).unwrap()).unwrap();
    let text = receipt.to_string();
    assert_eq!(receipt["tier"], "microvm", "{text}");
    // Every record of the log, in its order, and no damaged line.
    let seqs = |v: &[serde_json::Value]| -> Vec<u64> {
        v.iter().filter_map(|r| r["seq"].as_u64()).collect()
    };
    let exported = receipt["records"].as_array().unwrap();
    assert_eq!(seqs(exported), seqs(&recs), "{text}");
    assert_eq!(seqs(exported).len(), recs.len(), "{text}");
    assert_eq!(receipt["damaged_lines"], serde_json::json!([]), "{text}");
    drop(b);
}

/// The way QEMU enters its cgroup, seen from the program it execs: a group is made and its
/// `cgroup.procs` opened before the fork, the child writes itself in before `exec` (after which
/// it drops root), and the program's own first look at `/proc/self/cgroup` already names the
/// group, so nothing it allocates is charged anywhere else.
#[test]
fn a_program_started_the_way_qemu_is_is_in_its_cgroup_from_its_first_instruction() {
    use std::os::unix::process::CommandExt;
    const TEST: &str =
        "a_program_started_the_way_qemu_is_is_in_its_cgroup_from_its_first_instruction";
    if !common::require_root(TEST, "making a cgroup under h5i's own needs root here") {
        return;
    }
    let id = format!("microvm-entry-test-{}", std::process::id());
    let cage = h5i_runtime::cage::ResourceCage::create(&id, Some(64 << 20), Some(16)).unwrap();
    let entry = cage.entry().unwrap();
    let mut cmd = Command::new("/bin/cat");
    cmd.arg("/proc/self/cgroup");
    // SAFETY: the closure only writes to descriptors opened before the fork, then setuid.
    unsafe {
        cmd.pre_exec(move || {
            entry.enter_in_child()?;
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    drop(cage);
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{seen}{}", stderr(&out));
    let memory_line = seen
        .lines()
        .find(|l| l.starts_with("0::") || l.contains(":memory:"))
        .unwrap_or_default();
    assert!(
        memory_line.ends_with(&format!("/h5i/{id}")),
        "the program started outside its group: {seen}"
    );
}

/// `h5i ARGS` in `r` on a terminal the test holds both ends of (24x80), as the engine user's
/// image's caller.
fn on_a_terminal(r: &Repo, args: &[&str]) -> common::pty::Session {
    let mut cmd = Command::new(common::H5I);
    cmd.args(args)
        .current_dir(r.path())
        .env("TERM", "xterm")
        .env("H5I_CONTAINER_USER", USER)
        .env("H5I_NO_PROBE_CACHE", "1");
    // A boot under emulation on a busy host takes seconds, and more.
    common::pty::Session::spawn(cmd, std::time::Duration::from_secs(240))
}

/// `box shell` at the microvm tier on a real terminal: the guest agent gives the session a pty
/// of the guest's own (not the user's terminal: `tty` names the guest's devpts), an
/// interactive shell runs commands typed into it, Ctrl-C is a byte that interrupts the guest's
/// foreground job (not h5i), `stty size` follows a resize of the user's terminal, the exit
/// code comes back, and the user's terminal is left as it was. The receipt is the session's.
#[test]
fn a_microvm_shell_gets_a_pty_of_the_guests_own_that_follows_the_terminal() {
    const TEST: &str = "a_microvm_shell_gets_a_pty_of_the_guests_own_that_follows_the_terminal";
    let Some(_one) = ready(TEST) else {
        return;
    };
    use std::os::fd::AsRawFd;
    let r = Repo::new();
    let b = VmBox::create(&r, "sh", &["--isolation", "microvm"]);
    let mut s = on_a_terminal(&r, &["box", "shell", "sh"]);
    s.send("echo $((6*7))X; tty; stty size\r");
    s.expect("42X");
    s.expect("/dev/pts/");
    s.expect("24 80");
    // Ctrl-C reaches the guest's foreground job through the guest's own line discipline. The
    // marker comes from the job itself, so it holds the terminal when Ctrl-C is typed.
    s.send("sh -c 'echo $((2+2))GO; exec sleep 300'\r");
    s.expect("4GO");
    s.send("\x03");
    s.send("echo BACK$((2+2))\r");
    s.expect("BACK4");
    // Resizing the user's terminal signals h5i, which tells the guest.
    common::pty::set_size(s.master.as_raw_fd(), 37, 111);
    s.send("echo SIZE $(stty size)\r");
    s.expect("SIZE 37 111");
    s.send("exit 7\r");
    assert_eq!(s.finish(), 7, "{}", s.transcript());
    let after = common::pty::termios(s.slave.as_raw_fd());
    assert_eq!(
        (after.c_lflag, after.c_iflag, after.c_oflag),
        (s.before.c_lflag, s.before.c_iflag, s.before.c_oflag),
        "the user's terminal was left changed"
    );
    let last = r.last_run("sh");
    assert_eq!(last["lane"], "host-env-run", "{last}");
    assert_eq!(last["argv"][0], "/bin/sh", "{last}");
    assert_eq!(last["exit"]["code"], 7, "{last}");
    // Piped, the session is `box run` of the guest's shell.
    let mut piped = Command::new(common::H5I)
        .args(["box", "shell", "sh"])
        .current_dir(r.path())
        .env("H5I_CONTAINER_USER", USER)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = piped.stdin.take().unwrap();
        stdin.write_all(b"echo via-the-shell; exit 3\n").unwrap();
    }
    let out = piped.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(stdout(&out), "via-the-shell\n");
    drop(b);
}

/// What reaches the user's terminal from a microvm session is the guest's bytes and nothing
/// else: escape sequences the guest writes pass through as it wrote them (its terminal is its
/// own to drive), h5i adds nothing of its own to a session that ends normally, and a line h5i
/// prints itself (a command the guest could not start) carries the guest's words with their
/// control characters escaped.
#[test]
fn a_microvm_session_writes_only_the_guests_bytes_and_escapes_the_guests_words() {
    const TEST: &str =
        "a_microvm_session_writes_only_the_guests_bytes_and_escapes_the_guests_words";
    let Some(_one) = ready(TEST) else {
        return;
    };
    let r = Repo::new();
    let b = VmBox::create(&r, "host", &["--isolation", "microvm"]);
    assert!(b.sh("true").status.success(), "the first run boots the VM");
    let guest = "printf '\\033]0;title\\007\\033[2JGUEST-%s\\n' ok; exit 5";
    let mut s = on_a_terminal(&r, &["box", "shell", "host", "--", "sh", "-c", guest]);
    assert_eq!(s.finish(), 5, "{}", s.transcript());
    assert_eq!(
        s.seen,
        b"\x1b]0;title\x07\x1b[2JGUEST-ok\r\n".to_vec(),
        "{}",
        s.transcript()
    );
    // The guest's refusal to start a command comes back in h5i's own line: escaped.
    let hostile = "/no/such\x1b]52;c;cHduZWQ=\x07\x1b[2J";
    let mut s = on_a_terminal(&r, &["box", "shell", "host", "--", hostile]);
    assert_eq!(s.finish(), 127, "{}", s.transcript());
    let shown = String::from_utf8_lossy(&s.seen).into_owned();
    assert!(
        shown.contains("/no/such\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J"),
        "{shown:?}"
    );
    assert!(
        !s.seen.contains(&0x1b),
        "a raw escape from h5i's own line: {shown:?}"
    );
}

#[test]
fn probe_says_how_the_guest_runs() {
    let Some(_one) = ready("probe_says_how_the_guest_runs") else {
        return;
    };
    let r = Repo::new();
    let out = h5i(&r, &["box", "probe"]);
    let text = stdout(&out);
    // The QEMU backend runs when asked for, but auto passes over it (emulated here): a box
    // made with an image and no tier lands at container.
    assert!(
        text.contains("tier microvm= available with --isolation microvm; auto passes over it"),
        "{text}"
    );
    let out = h5i(&r, &["box", "create", "auto", "--image", IMAGE]);
    assert!(out.status.success(), "create: {}", stderr(&out));
    let status = stdout(&h5i(&r, &["box", "status", "auto"]));
    assert!(
        status
            .lines()
            .any(|l| l.contains("tier") && l.contains("container")),
        "{status}"
    );
    h5i(&r, &["box", "rm", "--force", "auto"]);
    let accel = text
        .lines()
        .find(|l| l.contains("microvm acceleration="))
        .unwrap();
    // This kind of host's /dev/kvm is PVM's: the guest is emulated, and probe says so.
    if Path::new("/sys/module/kvm_pvm").exists() {
        assert!(
            accel.contains("software-emulated") && accel.contains("kvm_pvm"),
            "{accel}"
        );
    }
}

/// The box's warm npm cache at the microvm tier (an image with node and npm,
/// `localhost/h5i-base`): the guest has the current key's cache at `/.h5i/cache/npm`, on a 9p
/// mount its kernel holds read-only, with `npm_config_cache` naming it; a write into it fails
/// in the guest (EROFS, or EACCES where the permission check comes first); a warm offline
/// install from it works and makes no request though the registry is in the box's egress (none
/// in the receipt's tally, none at the stand-in), and the cache is byte for byte as refresh
/// stored it; after the box changes its lockfile, the next run gets a VM booted again without
/// the stale key (no cache mount, the variable unset, the key's files nowhere in the guest).
/// Root only, as every row here (the image is in the engine user's storage).
#[test]
fn a_microvm_box_gets_the_current_cache_read_only_and_never_a_stale_one() {
    use crate::box_cache::{self, Registry, NPM, PORT};
    const TEST: &str = "a_microvm_box_gets_the_current_cache_read_only_and_never_a_stale_one";
    const NODE_IMAGE: &str = "localhost/h5i-base:latest";
    let Some(_one) = ready(TEST) else {
        return;
    };
    let Some(reg) = Registry::up(TEST) else {
        return;
    };
    let c = box_cache::caller(false, &reg, &NPM)
        .with_env("H5I_NO_PROBE_CACHE", "1")
        .with_env("H5I_CONTAINER_USER", USER);
    box_cache::project(&c, &reg, &NPM);
    c.write(
        ".h5i/env.toml",
        format!(
            "{}\n[profile.vm]\nisolation = \"microvm\"\n[profile.vm.net]\negress = [\"registry.test:{PORT}\"]\n",
            box_cache::profiles(&NPM)
        ),
    );
    c.commit_all("a microvm profile");
    box_cache::refresh(&c, NPM.name);
    let after_refresh = reg.requests().len();
    let ls: serde_json::Value =
        serde_json::from_str(&c.ok(&["box", "cache", "ls", "--json"])).unwrap();
    let key = ls["caches"][0]["key"].as_str().unwrap().to_string();
    let entry = c.repo().join(".git/.h5i/cache/npm").join(&key);
    let stored = box_cache::tree_digest(&entry);

    c.ok(&[
        "box",
        "create",
        "vm",
        "--image",
        NODE_IMAGE,
        "--profile",
        "vm",
    ]);
    let run = |script: &str| c.h5i(&["box", "run", "vm", "--", "sh", "-c", script]);
    let mounts = c.ok(&["box", "cache", "mounts", "vm"]);
    assert!(
        mounts.starts_with(&format!("npm: {key} ("))
            && mounts.contains("mounted read-only at /.h5i/cache/npm")
            && mounts.contains("this tier brings its own"),
        "{mounts}"
    );

    // There, read-only in the guest's kernel, named by the variable.
    let out = run(
        "echo cache=$npm_config_cache; ls /.h5i/cache/npm; grep ' /.h5i/cache/npm ' /proc/mounts",
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("cache=/.h5i/cache/npm"), "{text}");
    assert!(text.contains("_cacache"), "the cache is not there: {text}");
    let mount = text
        .lines()
        .find(|l| l.starts_with("cache-npm /.h5i/cache/npm 9p "))
        .unwrap_or_else(|| panic!("no 9p mount of the cache: {text}"));
    assert!(
        mount
            .split(' ')
            .nth(3)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "{mount}"
    );

    // A write into it fails in the guest.
    let out = run(
        "echo x > \"$npm_config_cache/planted\"; echo rc=$?; \
         f=$(find \"$npm_config_cache\" -type f | head -n 1); [ -n \"$f\" ] && echo x >> \"$f\"; echo rc=$?",
    );
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(
        text.lines()
            .filter(|l| *l == "rc=1" || *l == "rc=2")
            .count(),
        2,
        "the guest wrote the cache: {text}{err}"
    );
    assert_eq!(
        err.lines()
            .filter(|l| l.ends_with("Read-only file system") || l.ends_with("Permission denied"))
            .count(),
        2,
        "not refused by the guest's kernel: {err}"
    );

    // A warm install reaches for nothing.
    let out = run("npm ci --offline --no-audit --no-fund");
    assert_eq!(
        out.status.code(),
        Some(0),
        "warm install: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let warm = c.last_run("vm");
    assert_eq!(
        box_cache::tally(&warm, "allowed") + box_cache::tally(&warm, "denied"),
        0,
        "the warm install reached for the network: {warm}"
    );
    assert_eq!(
        reg.requests().len(),
        after_refresh,
        "the warm install hit the registry: {:?}",
        reg.requests()
    );
    let out = run(NPM.prove);
    assert_eq!(stdout(&out).trim(), NPM.proved, "{}", stderr(&out));
    assert_eq!(
        box_cache::tree_digest(&entry),
        stored,
        "a microvm box changed the cache"
    );
    let booted = qemu_pid_of(&c, "vm").expect("the VM is up");

    // The box changes its lockfile: the key it had is stale, and the next run has no trace of it.
    let out = run("echo ' ' >> package-lock.json");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(&format!(
        "echo cache=${{npm_config_cache:-unset}}; grep -c ' 9p ' /proc/mounts; \
         ls /.h5i/cache/npm 2>&1; grep -rl {key} /.h5i /proc/cmdline 2>/dev/null; echo end"
    ));
    let text = stdout(&out);
    assert!(text.contains("cache=unset"), "{text}{}", stderr(&out));
    // /work and the spool only.
    assert_eq!(text.lines().nth(1), Some("2"), "{text}");
    assert!(
        !text.contains("_cacache"),
        "the stale cache is visible: {text}"
    );
    assert!(!text.contains(&key), "the stale key is visible: {text}");
    let mounts = c.ok(&["box", "cache", "mounts", "vm"]);
    assert!(
        mounts.contains("npm: nothing mounted") && mounts.contains("(stale)"),
        "{mounts}"
    );
    assert_ne!(
        qemu_pid_of(&c, "vm"),
        Some(booted),
        "the VM that had the stale key's share served the run"
    );
    c.ok(&["box", "rm", "--force", "vm"]);
}

/// The QEMU pid `status` names for `name`, when its VM is up.
fn qemu_pid_of(c: &common::caller::Caller, name: &str) -> Option<i32> {
    let text = c.ok(&["box", "status", name]);
    let line = text.lines().find(|l| l.starts_with("microvm: VM up"))?;
    line.split("QEMU pid ")
        .nth(1)?
        .split(|ch: char| !ch.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}
