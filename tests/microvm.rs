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
//! boots; `probe` and `status` say "software-emulated".
//!
//! Run as root (CI): the image is the registry-free `localhost/h5i-busybox` in the container
//! engine user's storage (scripts/make-test-image.sh), as at the container tier. The guest
//! agent is the musl build of `h5i-guest`, built here when missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

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
    let target = Path::new(env!("CARGO_BIN_EXE_h5i"))
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let agent = target.join("x86_64-unknown-linux-musl/release/h5i-guest");
    if !agent.is_file() {
        let built = Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "-p",
                "h5i-guest",
                "--target",
                "x86_64-unknown-linux-musl",
            ])
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        if !built.success() {
            eprintln!("skipped: {test}: the musl target is not installed (rustup target add x86_64-unknown-linux-musl)");
            return None;
        }
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
#[test]
fn qemu_is_confined_on_the_host_and_cannot_open_a_host_file_outside_its_grants() {
    const TEST: &str =
        "qemu_is_confined_on_the_host_and_cannot_open_a_host_file_outside_its_grants";
    let Some(_one) = ready(TEST) else {
        return;
    };
    if Command::new("gdb").arg("--version").output().is_err() {
        eprintln!("skipped: {TEST}: gdb is not installed (apt-get install gdb)");
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

/// `box shell` at the microvm tier: with stdin not a terminal it is `box run` of the guest's
/// `/bin/sh` (the image's, never a host path's guess); on a real terminal (a pty made by
/// `script`) it is refused with the mend, before any VM boots, because the guest agent gives no
/// pty of its own yet.
#[test]
fn a_microvm_shell_runs_piped_and_refuses_a_terminal_with_the_mend() {
    let Some(_one) = ready("a_microvm_shell_runs_piped_and_refuses_a_terminal_with_the_mend")
    else {
        return;
    };
    let r = Repo::new();
    let b = VmBox::create(&r, "sh", &["--isolation", "microvm"]);
    let on_a_terminal = Command::new("script")
        .args([
            "-qec",
            &format!("{} box shell sh", common::H5I),
            "/dev/null",
        ])
        .current_dir(r.path())
        .env("H5I_CONTAINER_USER", USER)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&on_a_terminal.stdout);
    assert_ne!(on_a_terminal.status.code(), Some(0), "{text}");
    assert!(
        text.contains("refusing:") && text.contains("microvm") && text.contains("to fix:"),
        "{text}"
    );
    assert_eq!(b.qemu_pid(), None, "a VM was booted for a refused shell");
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
