//! `h5i box shell`, driven through a real pseudo-terminal: the test opens a pty pair, runs h5i
//! with the slave as its stdin, stdout, stderr and controlling terminal (the "user's
//! terminal"), and types into / reads from the master with bounded, poll-based waits.
//!
//! Every claim is checked from where it matters: output the box printed, the exit status h5i
//! passed through, what the kernel left in the user's terminal's input queue, files on the host.
//! Runs as root (CI); the process-tier sessions go through `h5i-runc`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::pty::{pending_input, set_size, sized_pair, termios, Session};
use common::{with_controlling_terminal, Repo, H5I};

/// Long enough for a process-tier box to start on a busy 2-core machine.
const WAIT: Duration = Duration::from_secs(30);

/// `h5i ARGS` in `r` on a terminal of its own.
fn start(r: &Repo, args: &[&str]) -> Session {
    start_with(r, args, false)
}

/// With `stray`, h5i also inherits a descriptor of its terminal at fd 9 that is not
/// close-on-exec (a careless parent's leak).
fn start_with(r: &Repo, args: &[&str], stray: bool) -> Session {
    let mut cmd = Command::new(H5I);
    cmd.args(args)
        .current_dir(r.path())
        .env("TERM", "xterm")
        .env_remove("H5I_AGENT")
        .env_remove("H5I_DEFAULT_ISOLATION");
    if stray {
        // SAFETY: dup2 is async-signal-safe; the copy it makes is not close-on-exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::dup2(0, 9) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    Session::spawn(cmd, WAIT)
}

/// A repository with a workspace-tier box `w` and a process-tier box `p`.
fn boxes() -> Repo {
    let r = Repo::new();
    r.ok(&["box", "create", "w", "--isolation=workspace"]);
    r.ok(&["box", "create", "p", "--isolation=process"]);
    r
}

const BASH: &[&str] = &["bash", "--norc", "--noprofile", "-i"];

fn shell_args<'a>(name: &'a str, cmd: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["box", "shell", name];
    if !cmd.is_empty() {
        v.push("--");
        v.extend_from_slice(cmd);
    }
    v
}

/// A unique suffix for host paths a test checks.
fn tag() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{nanos}-{n}", std::process::id())
}

#[test]
fn a_session_runs_commands_and_passes_the_exit_status_through() {
    let r = boxes();
    for name in ["w", "p"] {
        let mut s = start(&r, &shell_args(name, BASH));
        s.send("echo $((6*7))X\r");
        s.expect("42X");
        s.send("exit 7\r");
        assert_eq!(s.finish(), 7, "{name}: {}", s.transcript());
        let last = r.receipts(name).pop().unwrap();
        assert_eq!(last["lane"], "host-env-run", "{last}");
        assert_eq!(last["argv"][0], "bash", "{last}");
        assert_eq!(last["exit"]["code"], 7, "{last}");
    }
}

#[test]
fn a_process_tier_session_starts_in_work_and_names_no_host_path() {
    let r = boxes();
    let script = "echo \"cwd=$(pwd) home=$HOME\"; tr '\\0' '\\n' < /proc/self/environ";
    let mut s = start(&r, &shell_args("p", &["sh", "-c", script]));
    s.expect("cwd=/work home=/.h5i/home");
    assert_eq!(s.finish(), 0, "{}", s.transcript());
    let repo = r.path().display().to_string();
    assert!(!s.transcript().contains(&repo), "{}", s.transcript());
}

#[test]
fn a_command_that_closes_its_terminal_before_exiting_keeps_its_exit_status() {
    // Closing every descriptor of the box's pty makes h5i's reads of the master fail with EIO
    // while the command still runs; h5i must not hang the pty up (SIGHUP: exit 129) then.
    let r = boxes();
    for name in ["w", "p"] {
        let mut s = start(
            &r,
            &shell_args(
                name,
                &[
                    "sh",
                    "-c",
                    "echo CLOSING; exec 0<&- 1>&- 2>&-; sleep 0.5; exit 6",
                ],
            ),
        );
        s.expect("CLOSING");
        assert_eq!(s.finish(), 6, "{name}: {}", s.transcript());
    }
}

#[test]
fn without_a_command_the_session_is_the_boxs_login_bash() {
    let r = boxes();
    for name in ["w", "p"] {
        let mut s = start(&r, &shell_args(name, &[]));
        s.send("echo ${BASH_VERSION:+IS}BASH:$H5I_ENV_ID\r");
        s.expect(&format!("ISBASH:{name}"));
        s.send("exit\r");
        assert_eq!(s.finish(), 0, "{name}: {}", s.transcript());
        let last = r.receipts(name).pop().unwrap();
        assert!(
            last["argv"][0].as_str().unwrap().ends_with("/bash") && last["argv"][1] == "-l",
            "{last}"
        );
    }
}

#[test]
fn the_box_gets_its_own_pty_never_the_users_terminal() {
    let r = boxes();
    for name in ["w", "p"] {
        // h5i itself holds a stray, inheritable descriptor of the user's terminal too.
        let mut s = start_with(&r, &shell_args(name, BASH), true);
        // The user's terminal as the kernel knows it (devpts instance, device number): pty
        // names alone collide between the host's devpts and a box's own.
        let outer = {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(format!("/proc/self/fd/{}", s.slave.as_raw_fd())).unwrap();
            format!("ID {}:{}\r\n", m.dev(), m.rdev())
        };
        s.send(
            "echo FDS; for f in /proc/$$/fd/*; do stat -L -c 'ID %d:%r' $f; done; tty; echo END\r",
        );
        s.expect("FDS\r\n");
        s.expect("END");
        let shown = String::from_utf8_lossy(&s.seen).into_owned();
        let listing = &shown[shown.rfind("FDS\r\n").unwrap()..];
        assert!(listing.contains("/dev/pts/"), "{name}: {listing}");
        assert!(listing.matches("ID ").count() >= 3, "{name}: {listing}");
        assert!(
            !listing.contains(&outer),
            "{name}: the box holds the user's terminal ({}): {listing}",
            outer.trim()
        );
        s.send("exit\r");
        assert_eq!(s.finish(), 0);
    }
}

#[test]
fn a_full_screen_program_starts_and_quits_back_to_the_shell() {
    let r = boxes();
    for name in ["w", "p"] {
        let mut s = start(&r, &shell_args(name, BASH));
        s.send("echo $((1+1))READY\r");
        s.expect("2READY");
        // less switches to the alternate screen, draws the file and waits for a key.
        s.send("less src/lib.txt\r");
        s.expect("\x1b[?1049h");
        s.expect("three");
        s.send("q");
        s.expect("\x1b[?1049l");
        s.send("echo $((6*7))AFTER\r");
        s.expect("42AFTER");
        s.send("exit 3\r");
        assert_eq!(s.finish(), 3, "{name}: {}", s.transcript());
    }
}

#[test]
fn a_window_resize_reaches_the_box() {
    let r = boxes();
    for name in ["w", "p"] {
        let mut s = start(&r, &shell_args(name, BASH));
        s.send("echo SIZE $(stty size)\r");
        s.expect("SIZE 24 80");
        // Resizing the user's terminal signals h5i (its foreground group) with SIGWINCH.
        set_size(s.master.as_raw_fd(), 37, 111);
        s.send("echo SIZE $(stty size)\r");
        s.expect("SIZE 37 111");
        s.send("exit\r");
        assert_eq!(s.finish(), 0);
    }
}

#[test]
fn ctrl_c_interrupts_the_boxs_foreground_job_and_the_shell_continues() {
    let r = boxes();
    for name in ["w", "p"] {
        let mut s = start(&r, &shell_args(name, BASH));
        // The marker comes from the foreground job itself, so it is running (and holds the
        // box's terminal) when Ctrl-C is typed.
        s.send("sh -c 'echo $((2+2))GO; exec sleep 100'\r");
        s.expect("4GO");
        let started = Instant::now();
        s.send("\x03");
        s.send("echo $((6*7))BACK\r");
        s.expect("42BACK");
        assert!(started.elapsed() < Duration::from_secs(20), "sleep ran on");
        s.send("exit 5\r");
        assert_eq!(s.finish(), 5, "{name}: {}", s.transcript());
    }
}

#[test]
fn ctrl_z_stops_the_boxs_foreground_job_and_job_control_brings_it_back() {
    let r = boxes();
    for name in ["w", "p"] {
        let mut s = start(&r, &shell_args(name, BASH));
        // The job says when it is resumed (its CONT trap), so the test knows `fg` gave it the
        // box's terminal back before typing Ctrl-C at it. Its `sleep` runs in a subshell: dash
        // runs a plain foreground command with vfork(), blocking every signal in the parent until
        // the child execs, so a ^Z landing in that window stops the not-yet-exec'd child while the
        // parent stays blocked in vfork forever (`D`, SIGTSTP pending) and the job never reports
        // Stopped. A subshell is a real fork() that then execs `sleep` directly, with no vfork.
        s.send("sh -c 'trap \"echo \\$((4+5))CONT\" CONT; echo $((3+4))RUN; while :; do (sleep 1); done'\r");
        s.expect("7RUN");
        s.send("\x1a");
        s.expect("Stopped");
        s.send("jobs -l | grep -c Stopped; echo $((5*5))JOBS\r");
        s.expect("25JOBS");
        s.send("fg\r");
        s.expect("9CONT");
        s.send("\x03");
        s.send("jobs | wc -l; echo $((8*8))GONE\r");
        s.expect("64GONE");
        s.send("exit 3\r");
        assert_eq!(s.finish(), 3, "{name}: {}", s.transcript());
    }
}

/// Pushes `touch <target>` plus Enter into its controlling terminal's input queue, one byte per
/// TIOCSTI, then reports.
fn injector(target: &str) -> String {
    format!(
        "import errno, fcntl, sys, termios\n\
         payload = b'touch {target}\\n'\n\
         for b in payload:\n\
         \x20   try:\n\
         \x20       fcntl.ioctl(0, termios.TIOCSTI, bytes([b]))\n\
         \x20   except OSError as e:\n\
         \x20       print('TIOCSTI=' + errno.errorcode[e.errno], flush=True)\n\
         \x20       sys.exit(3)\n\
         print('TIOCSTI=OK', flush=True)\n"
    )
}

#[test]
fn tiocsti_from_a_workspace_box_never_reaches_the_users_terminal() {
    assert_eq!(
        std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti")
            .unwrap()
            .trim(),
        "1",
        "this test needs a kernel that allows TIOCSTI (dev.tty.legacy_tiocsti=1)"
    );
    // Control: the same program on a terminal of its own does fill that terminal's input
    // queue, so the check below can see an injection when there is one.
    let control = format!("/tmp/h5i-injected-control-{}", tag());
    let (_m, slave) = sized_pair(24, 80);
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(injector(&control))
        .stdin(slave.try_clone().unwrap())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    with_controlling_terminal(&mut cmd);
    assert!(cmd.status().unwrap().success());
    assert!(pending_input(slave.as_raw_fd()).contains(&control));

    // In a box session the same ioctl succeeds, into the box's own pty, and goes nowhere.
    let r = boxes();
    let target = format!("/tmp/h5i-injected-{}", tag());
    let script = injector(&target);
    let mut s = start(&r, &shell_args("w", &["python3", "-c", &script]));
    s.expect("TIOCSTI=OK");
    assert_eq!(s.finish(), 0, "{}", s.transcript());
    let queued = pending_input(s.slave.as_raw_fd());
    assert!(
        !queued.contains("h5i-injected"),
        "injected input reached the user's terminal: {queued:?}"
    );
    assert!(!Path::new(&target).exists(), "the injected command ran");
}

#[test]
fn tiocsti_is_refused_by_seccomp_at_the_process_tier() {
    let r = boxes();
    let target = format!("/tmp/h5i-injected-{}", tag());
    let script = injector(&target);
    let mut s = start(&r, &shell_args("p", &["python3", "-c", &script]));
    s.expect("TIOCSTI=EPERM");
    assert_eq!(s.finish(), 3, "{}", s.transcript());
    assert!(!pending_input(s.slave.as_raw_fd()).contains("h5i-injected"));
    assert!(!Path::new(&target).exists());
}

#[test]
fn a_leftover_background_job_cannot_write_to_or_read_from_the_users_terminal() {
    let r = boxes();
    let ws = r.workspace("w");
    let mut s = start(&r, &shell_args("w", BASH));
    s.send(
        "(sleep 2; echo LEAK; echo $? > wrote) & \
         (sleep 2; read -r line; echo \"got:$line:$?\" > read) & \
         echo $((3+3))JOBS\r",
    );
    s.expect("6JOBS");
    s.send("exit\r");
    assert_eq!(s.finish(), 0, "{}", s.transcript());
    // The user types at their own shell now.
    s.send("typed-after-the-session\r");
    // Bounded: both jobs wake after 2 s; watch the terminal until both have run.
    let deadline = Instant::now() + WAIT;
    while !(ws.join("wrote").exists() && ws.join("read").exists()) && Instant::now() < deadline {
        s.read_for(Duration::from_millis(200));
    }
    s.read_for(Duration::from_millis(500));
    assert!(ws.join("wrote").exists(), "the writer never ran");
    let shown = String::from_utf8_lossy(&s.seen[s.cursor..]).into_owned();
    assert!(
        !shown.contains("LEAK"),
        "a leftover job wrote to the user's terminal: {shown:?}"
    );
    assert_ne!(
        std::fs::read_to_string(ws.join("wrote")).unwrap().trim(),
        "0",
        "the leftover writer's echo succeeded somewhere"
    );
    let got = std::fs::read_to_string(ws.join("read")).unwrap_or_default();
    assert!(
        !got.contains("typed"),
        "a leftover job read the user's typing: {got:?}"
    );
    // What the user typed is still theirs.
    assert!(pending_input(s.slave.as_raw_fd()).contains("typed-after-the-session"));
}

#[test]
fn the_users_terminal_is_restored_on_every_exit_path() {
    let r = boxes();
    for (name, cmd, code) in [
        ("w", BASH, 0),
        ("p", BASH, 0),
        ("w", &["/nonexistent/h5i-shell"][..], 127),
    ] {
        let mut s = start(&r, &shell_args(name, cmd));
        let before = s.before;
        if code == 0 {
            s.send("stty -echo raw; echo $((5+5))RAW\r");
            s.expect("10RAW");
            s.send("exit\r");
        }
        assert_eq!(s.finish(), code, "{name}: {}", s.transcript());
        let after = termios(s.slave.as_raw_fd());
        assert_eq!(
            (after.c_iflag, after.c_oflag, after.c_lflag, after.c_cflag),
            (
                before.c_iflag,
                before.c_oflag,
                before.c_lflag,
                before.c_cflag
            ),
            "{name}: the terminal was left changed"
        );
    }
}

#[test]
fn the_wall_clock_ends_a_session_with_124() {
    let r = Repo::new();
    r.write_policy(
        "[profile.quick]\nisolation = \"process\"\n[profile.quick.resources]\nwall = \"2s\"\n",
    );
    r.ok(&["box", "create", "slow", "--profile", "quick"]);
    let mut s = start(&r, &shell_args("slow", BASH));
    let before = s.before;
    s.send("sleep 60\r");
    assert_eq!(s.finish(), 124, "{}", s.transcript());
    assert_eq!(termios(s.slave.as_raw_fd()).c_lflag, before.c_lflag);
    let last = r.receipts("slow").pop().unwrap();
    assert_eq!(last["exit"]["timed_out"], true, "{last}");
}

#[test]
fn piped_stdin_runs_the_shell_without_a_terminal() {
    let r = boxes();
    for name in ["w", "p"] {
        let mut cmd = Command::new(H5I);
        cmd.args(["box", "shell", name])
            .current_dir(r.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: setsid is async-signal-safe: no controlling terminal at all.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"echo piped-$((1+2)) $H5I_ENV_ID\nexit 4\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("piped-3 {name}")), "{name}: {text}");
        assert_eq!(
            out.status.code(),
            Some(4),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Prints the run's network namespace, and whether it leads its session and is its terminal's
/// foreground job (`/proc/$$/stat`: pid, pgrp, session, tpgid).
const LEADS: &str = "echo \"NS=$(readlink /proc/self/ns/net)\"; \
    awk '{print \"LEAD\", ($1==$6) ($5==$8) \"X\"}' /proc/$$/stat; tty";

/// A terminal run goes through the box's sandbox (issue 21): `box shell` and `box run` on a
/// terminal at `tier` run in the network namespace of the sandbox a plain run made (no
/// container of their own, the sandbox not remade), on a pty of the box's own that the run
/// leads (session leader, foreground job) and that is not the user's terminal.
fn terminal_runs_go_through_the_sandbox(test: &str, tier: &str, as_user: bool) {
    if !common::require_root(test, "cgroups of h5i's own, and switching to h5i-test") {
        return;
    }
    let mut c = common::Caller::either(as_user);
    c.create_at("b", tier);
    let plain = c.ok(&["box", "run", "b", "--", "readlink", "/proc/self/ns/net"]);
    let netns = plain.trim().to_string();
    let id = common::sandbox::id(&c, "b");
    assert!(
        id.is_some(),
        "{} at {tier}: no sandbox after a run",
        c.who()
    );
    for verb in ["shell", "run"] {
        let cmd = c.h5i_cmd_with(
            &["box", verb, "b", "--", "sh", "-c", LEADS],
            &[("TERM", "xterm")],
        );
        let mut s = Session::spawn(cmd, WAIT);
        s.expect("X");
        assert_eq!(s.finish(), 0, "{verb}: {}", s.transcript());
        let seen = s.transcript();
        let who = c.who();
        assert!(
            seen.contains(&format!("NS={netns}")),
            "{who} at {tier}: box {verb} on a terminal ran outside the sandbox's network ({netns}): {seen}"
        );
        assert!(
            seen.contains("LEAD 11X"),
            "{who} at {tier}: box {verb}: {seen}"
        );
        assert!(
            seen.contains("/dev/pts/"),
            "{who} at {tier}: box {verb}: {seen}"
        );
        assert_eq!(common::sandbox::id(&c, "b"), id, "{who} at {tier}: remade");
    }
}

#[test]
fn process_tier_terminal_runs_go_through_the_box_sandbox_and_lead_their_pty() {
    terminal_runs_go_through_the_sandbox(
        "process_tier_terminal_runs_go_through_the_box_sandbox_and_lead_their_pty",
        "process",
        false,
    );
}

#[test]
fn process_tier_terminal_runs_go_through_the_box_sandbox_and_lead_their_pty_as_h5i_test() {
    terminal_runs_go_through_the_sandbox(
        "process_tier_terminal_runs_go_through_the_box_sandbox_and_lead_their_pty_as_h5i_test",
        "process",
        true,
    );
}

#[test]
fn supervised_terminal_runs_go_through_the_box_sandbox_and_lead_their_pty() {
    terminal_runs_go_through_the_sandbox(
        "supervised_terminal_runs_go_through_the_box_sandbox_and_lead_their_pty",
        "supervised",
        false,
    );
}

#[test]
fn supervised_terminal_runs_go_through_the_box_sandbox_and_lead_their_pty_as_h5i_test() {
    terminal_runs_go_through_the_sandbox(
        "supervised_terminal_runs_go_through_the_box_sandbox_and_lead_their_pty_as_h5i_test",
        "supervised",
        true,
    );
}
