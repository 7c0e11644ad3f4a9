//! The box-lifetime sandbox at the process tier, asserted from inside real boxes and from the
//! host, as root and as the unprivileged test user (whose runs go through the same sandbox, in
//! the cgroup root delegated to it): a run's leftovers die with it, a changed plan rebuilds the
//! sandbox, the memory cap and the wall clock act per run, a run cannot reach the init it was
//! forked from, `abort` and `rm` leave no init, cgroup or sandbox directory behind, and a
//! sandbox run is confined exactly as a container per run is. Every other process-tier test runs
//! through the sandbox too (it is the default path); `H5I_SANDBOX=off` is the per-run container
//! path.
//!
//! Needs root (a cgroup of h5i's own for each run, and switching to h5i-test); prints
//! `skipped: ...` otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::sandbox::{self, cgroups_named, pid_in, Held};
use common::{process_alive as alive, stderr, stdout, Caller};

/// The caller for a row of `test`: root or the test user; None (said loudly) without root.
fn caller(test: &str, as_user: bool) -> Option<Caller> {
    common::require_root(test, "cgroups of h5i's own, and switching to h5i-test")
        .then(|| Caller::either(as_user))
}

fn run(c: &Caller, name: &str, argv: &[&str]) -> Output {
    let mut args = vec!["box", "run", name, "--"];
    args.extend_from_slice(argv);
    c.h5i(&args)
}

/// The sandbox's container id, from `box status` (None when it is down).
fn sandbox_id(c: &Caller, name: &str) -> Option<String> {
    sandbox::id(c, name)
}

fn init_pid(c: &Caller, id: &str) -> i32 {
    pid_in(&sandbox::dir(c, id).join("init.pid"))
}

/// `pgrep -f marker`'s pids (a marker unique to one test row).
fn pids_matching(marker: &str) -> String {
    let ps = Command::new("pgrep").args(["-f", marker]).output().unwrap();
    stdout(&ps).trim().to_string()
}

/// A process profile `name` with `extra` TOML after its header, committed.
fn process_profile(c: &Caller, name: &str, extra: &str) {
    c.write(
        ".h5i/env.toml",
        format!("[profile.{name}]\nisolation = \"process\"\n{extra}"),
    );
    c.commit_all(name);
}

fn background_job_is_gone_before_the_next_run(as_user: bool) {
    let Some(c) = caller("background job", as_user) else {
        return;
    };
    c.ok(&["box", "create", "bg", "--isolation=process"]);
    // The two rows run at once: a marker of each row's own.
    let marker = format!("sleep 987.{}", 61 + u32::from(as_user));
    let out = run(
        &c,
        "bg",
        &[
            "sh",
            "-c",
            &format!("{marker} & echo $! > bg.pid; echo started"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}: {}", c.who(), stderr(&out));
    assert!(
        sandbox_id(&c, "bg").is_some(),
        "{}: the run did not use the sandbox",
        c.who()
    );
    let left = pids_matching(&marker);
    assert!(
        left.is_empty(),
        "{}: the background job outlived its run: {left}",
        c.who()
    );
    // From inside: the pid the first run recorded names no process in the box any more.
    let out = run(
        &c,
        "bg",
        &["sh", "-c", "kill -0 $(cat bg.pid) 2>&1; echo kill=$?"],
    );
    let text = stdout(&out);
    assert!(
        text.contains("kill=1"),
        "{}: {text}{}",
        c.who(),
        stderr(&out)
    );
    c.ok(&["box", "rm", "--force", "bg"]);
}

#[test]
fn a_background_job_started_by_one_run_is_gone_before_the_next_run_starts() {
    background_job_is_gone_before_the_next_run(false);
}

#[test]
fn a_background_job_started_by_one_run_is_gone_before_the_next_run_starts_as_the_test_user() {
    background_job_is_gone_before_the_next_run(true);
}

fn changed_plan_rebuilds(as_user: bool) {
    let Some(c) = caller("changed plan", as_user) else {
        return;
    };
    let late = tempfile::tempdir().unwrap();
    // The test user must be able to reach the grant once it exists.
    std::fs::set_permissions(
        late.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let grant = late.path().join("granted-later");
    process_profile(
        &c,
        "late",
        &format!(
            "[profile.late.fs]\nread = [\"/usr\", \"/etc\", \"/bin\", \"/lib\", \"/lib64\", \"{}\"]\n",
            grant.display()
        ),
    );
    c.ok(&["box", "create", "late", "--profile", "late"]);
    let probe = format!("cat {}/f 2>&1; echo cat=$?", grant.display());
    let out = run(&c, "late", &["sh", "-c", &probe]);
    assert!(
        stdout(&out).contains("cat=1"),
        "{}: {}{}",
        c.who(),
        stdout(&out),
        stderr(&out)
    );
    let first = sandbox_id(&c, "late").expect("sandbox up after the first run");
    let first_init = init_pid(&c, &first);

    std::fs::create_dir(&grant).unwrap();
    std::fs::write(grant.join("f"), "visible-after-rebuild\n").unwrap();
    let out = run(&c, "late", &["sh", "-c", &probe]);
    let text = stdout(&out);
    assert!(
        text.contains("visible-after-rebuild") && text.contains("cat=0"),
        "{}: {text}{}",
        c.who(),
        stderr(&out)
    );
    let second = sandbox_id(&c, "late").expect("sandbox up after the second run");
    assert_ne!(first, second, "{}: the sandbox was not rebuilt", c.who());
    assert!(
        !alive(first_init),
        "{}: the old sandbox's init is still running",
        c.who()
    );
    assert!(
        cgroups_named(&first).is_empty(),
        "{}: the old sandbox's cgroup is left",
        c.who()
    );
    c.ok(&["box", "rm", "--force", "late"]);
}

#[test]
fn a_changed_plan_rebuilds_the_sandbox_and_the_next_run_sees_the_new_grant() {
    changed_plan_rebuilds(false);
}

#[test]
fn a_changed_plan_rebuilds_the_sandbox_and_the_next_run_sees_the_new_grant_as_the_test_user() {
    changed_plan_rebuilds(true);
}

fn oom_kills_only_that_run(as_user: bool) {
    let Some(c) = caller("oom", as_user) else {
        return;
    };
    process_profile(&c, "small", "[profile.small.resources]\nmem = \"64M\"\n");
    c.ok(&["box", "create", "oom2", "--profile", "small"]);
    // Make the sandbox first, so both runs below share it.
    assert!(run(&c, "oom2", &["true"]).status.success(), "{}", c.who());
    let id = sandbox_id(&c, "oom2").expect("sandbox up");
    // The run's sub-cgroup lives under the sandbox's own (delegated, for the test user).
    let cgroups = cgroups_named(&id);
    assert!(!cgroups.is_empty(), "{}: no cgroup named {id}", c.who());
    // The calm run is in the sandbox (it says so) before the hog starts beside it.
    let mut calm = c
        .h5i_in(
            &c.repo(),
            &[
                "box",
                "run",
                "oom2",
                "--",
                "sh",
                "-c",
                "echo in; sleep 3; echo calm-survived",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut calm_out = BufReader::new(calm.stdout.take().unwrap());
    let mut line = String::new();
    calm_out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "in", "{}", c.who());
    let runs: Vec<_> = cgroups
        .iter()
        .flat_map(|g| std::fs::read_dir(g.join("c")).into_iter().flatten())
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        runs.iter().any(|r| r.starts_with("run-")),
        "{}: the calm run has no sub-cgroup of the sandbox's: {runs:?}",
        c.who()
    );
    sandbox::memory_hog_is_killed(&c, "oom2");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut calm_out, &mut rest).unwrap();
    let status = common::wait_bounded(calm, Duration::from_secs(60), "the calm run");
    assert_eq!(
        status.code(),
        Some(0),
        "{}: the concurrent run was hit",
        c.who()
    );
    assert!(rest.contains("calm-survived"), "{}: {rest}", c.who());
    assert_eq!(
        sandbox_id(&c, "oom2").as_deref(),
        Some(id.as_str()),
        "{}: the sandbox itself went down",
        c.who()
    );
    let recs = c.receipts("oom2");
    let hog_rec = recs
        .iter()
        .find(|rec| rec["argv"][0] == sandbox::MEMORY_HOG[0])
        .expect("hog receipt");
    assert_eq!(
        hog_rec["exit"]["oom_killed"],
        true,
        "{}: {hog_rec}",
        c.who()
    );
    assert!(
        hog_rec["oom"]["kill_count"].as_u64().unwrap() >= 1,
        "{hog_rec}"
    );
    let calm_rec = recs
        .iter()
        .find(|rec| rec["argv"][0] == "sh")
        .expect("calm receipt");
    assert_eq!(calm_rec["exit"]["oom_killed"], false, "{calm_rec}");
    assert!(calm_rec["oom"].is_null(), "{calm_rec}");
    // The sandbox still serves the next run.
    c.in_box("oom2", "echo still-here");
    assert_eq!(sandbox_id(&c, "oom2").as_deref(), Some(id.as_str()));
    c.ok(&["box", "rm", "--force", "oom2"]);
}

#[test]
fn a_runs_oom_kills_that_run_and_not_a_concurrent_run() {
    oom_kills_only_that_run(false);
}

#[test]
fn a_runs_oom_kills_that_run_and_not_a_concurrent_run_as_the_test_user() {
    oom_kills_only_that_run(true);
}

fn wall_clock_kills_with_124(as_user: bool) {
    let Some(c) = caller("wall clock", as_user) else {
        return;
    };
    process_profile(&c, "quick", "[profile.quick.resources]\nwall = \"2s\"\n");
    c.ok(&["box", "create", "slow2", "--profile", "quick"]);
    let marker = format!("sleep 73.{}", 19 + u32::from(as_user));
    let out = run(&c, "slow2", &["sh", "-c", &format!("{marker} & {marker}")]);
    assert_eq!(
        out.status.code(),
        Some(124),
        "{}: {}",
        c.who(),
        stderr(&out)
    );
    assert!(
        sandbox_id(&c, "slow2").is_some(),
        "{}: the run did not use the sandbox",
        c.who()
    );
    let left = pids_matching(&marker);
    assert!(
        left.is_empty(),
        "{}: box processes outlived the wall clock: {left}",
        c.who()
    );
    let out = run(&c, "slow2", &["echo", "next-run-ok"]);
    assert_eq!(out.status.code(), Some(0), "{}: {}", c.who(), stderr(&out));
    assert!(stdout(&out).contains("next-run-ok"));
    c.ok(&["box", "rm", "--force", "slow2"]);
}

#[test]
fn the_wall_clock_kills_a_sandbox_run_with_124_and_the_next_run_works() {
    wall_clock_kills_with_124(false);
}

#[test]
fn the_wall_clock_kills_a_sandbox_run_with_124_and_the_next_run_works_as_the_test_user() {
    wall_clock_kills_with_124(true);
}

fn run_cannot_reach_its_init(as_user: bool) {
    let Some(c) = caller("init out of reach", as_user) else {
        return;
    };
    c.ok(&["box", "create", "nosy", "--isolation=process"]);
    let out = run(
        &c,
        "nosy",
        &[
            "sh",
            "-c",
            "readlink /proc/1/fd/0 >/dev/null 2>&1; echo fd=$?; \
             head -c1 /proc/1/environ >/dev/null 2>&1; echo environ=$?; \
             kill -KILL 1; kill -STOP 1; kill -TERM 1; echo signalled",
        ],
    );
    let text = stdout(&out);
    assert!(
        text.contains("fd=1"),
        "{}: the init's descriptors were reached: {text}",
        c.who()
    );
    assert!(
        text.contains("environ=1"),
        "{}: the init's environment was read: {text}",
        c.who()
    );
    assert!(text.contains("signalled"), "{text}{}", stderr(&out));
    let id = sandbox_id(&c, "nosy").expect("the init survived its run's signals");
    let pid = init_pid(&c, &id);
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(
        !state.contains(") T "),
        "{}: the init was stopped: {state}",
        c.who()
    );
    let out = run(&c, "nosy", &["echo", "still-served"]);
    assert!(stdout(&out).contains("still-served"), "{}", stderr(&out));
    assert_eq!(
        sandbox_id(&c, "nosy"),
        Some(id),
        "{}: the sandbox was rebuilt",
        c.who()
    );
    c.ok(&["box", "rm", "--force", "nosy"]);
}

#[test]
fn a_run_cannot_read_signal_or_stop_the_init_it_was_forked_from() {
    run_cannot_reach_its_init(false);
}

#[test]
fn a_run_cannot_read_signal_or_stop_the_init_it_was_forked_from_as_the_test_user() {
    run_cannot_reach_its_init(true);
}

/// Every box's first run makes its sandbox, and each making sweeps the other boxes' sandbox
/// directories that look orphaned, as one still being set up does: no run may lose its
/// directory to another's sweep.
fn first_runs_at_once_keep_their_sandboxes(as_user: bool) {
    let Some(c) = caller("first runs at once", as_user) else {
        return;
    };
    for round in 0..4 {
        let names: Vec<String> = (0..6).map(|i| format!("m{round}-{i}")).collect();
        for n in &names {
            c.ok(&["box", "create", n, "--isolation=process"]);
        }
        std::thread::scope(|s| {
            let runs: Vec<_> = names
                .iter()
                .map(|n| (n, s.spawn(|| run(&c, n, &["echo", "up"]))))
                .collect();
            for (n, h) in runs {
                let out = h.join().unwrap();
                assert!(
                    out.status.success() && stdout(&out).trim() == "up",
                    "{}: round {round}, box {n}: {}",
                    c.who(),
                    stderr(&out)
                );
                assert!(
                    sandbox_id(&c, n).is_some(),
                    "{}: round {round}: {n} has no sandbox up",
                    c.who()
                );
            }
        });
        for n in &names {
            c.ok(&["box", "rm", "--force", n]);
        }
    }
}

#[test]
fn first_runs_of_many_boxes_at_once_each_keep_the_sandbox_they_make() {
    first_runs_at_once_keep_their_sandboxes(false);
}

#[test]
fn first_runs_of_many_boxes_at_once_each_keep_the_sandbox_they_make_as_the_test_user() {
    first_runs_at_once_keep_their_sandboxes(true);
}

/// `verb` (`rm --force` or `abort`) takes box `name`'s process sandbox down: its init, its
/// cgroups and its directory are gone, and `status` (for abort) says so.
fn teardown_leaves_nothing(as_user: bool, verb: &[&str]) {
    let Some(c) = caller("teardown", as_user) else {
        return;
    };
    c.ok(&["box", "create", "gone", "--isolation=process"]);
    assert!(run(&c, "gone", &["true"]).status.success(), "{}", c.who());
    let held = Held::now(&c, "gone");
    let mut args = vec!["box"];
    args.extend_from_slice(verb);
    args.push("gone");
    c.ok(&args);
    let left = held.left();
    assert!(
        left.is_empty(),
        "{}: `box {}` left {left:?}",
        c.who(),
        verb.join(" ")
    );
    if verb == ["abort"] {
        let status = c.ok(&["box", "status", "gone"]);
        assert!(status.contains("sandbox: down"), "{}: {status}", c.who());
    }
}

#[test]
fn rm_leaves_no_init_cgroup_or_sandbox_directory_behind() {
    teardown_leaves_nothing(false, &["rm", "--force"]);
}

#[test]
fn rm_leaves_no_init_cgroup_or_sandbox_directory_behind_as_the_test_user() {
    teardown_leaves_nothing(true, &["rm", "--force"]);
}

#[test]
fn abort_takes_the_sandbox_down_and_status_says_so() {
    teardown_leaves_nothing(false, &["abort"]);
}

#[test]
fn abort_takes_the_sandbox_down_and_status_says_so_as_the_test_user() {
    teardown_leaves_nothing(true, &["abort"]);
}

fn same_confinement_as_a_container_per_run(as_user: bool) {
    let Some(mut c) = caller("equivalence", as_user) else {
        return;
    };
    c.ok(&["box", "create", "same", "--isolation=process"]);
    common::copy_program(common::probe(), &c.workspace("same").join("probe"));
    // Then, from inside: Landlock's answers (the root directory and a new file in /dev are on
    // mounts the box may use but outside every grant; /dev is the box user's own, so only
    // Landlock can refuse there) and the seccomp filter's answer to every call it rules on.
    let script = "grep -E '^(Uid|Gid|Groups|Cap|NoNewPrivs|Seccomp)' /proc/self/status; \
                  ulimit -a; cat /proc/self/uid_map /proc/self/gid_map; pwd; \
                  cat /proc/self/mountinfo | awk '{print $5, $6}' | grep -v -E '^/.h5i-(box-)?init ' | sort; \
                  echo box-uid=$(id -u); stat -c 'dev-owner=%u dev-mode=%a' /dev; \
                  ./probe read / | sed 's/^/root_/'; \
                  ./probe write /dev/h5i-landlock-probe | sed 's/^/dev_/'; \
                  ./probe write /tmp/h5i-landlock-probe | sed 's/^/tmp_/'; \
                  ./probe syscalls; ./probe unlisted; ./probe setid /tmp";
    let per_run = c.h5i_with(
        &["box", "run", "same", "--", "sh", "-c", script],
        &[("H5I_SANDBOX", "off")],
    );
    assert!(
        per_run.status.success(),
        "{}: {}",
        c.who(),
        stderr(&per_run)
    );
    assert!(
        sandbox_id(&c, "same").is_none(),
        "{}: H5I_SANDBOX=off made a sandbox",
        c.who()
    );
    let warm = run(&c, "same", &["sh", "-c", script]);
    assert!(warm.status.success(), "{}: {}", c.who(), stderr(&warm));
    assert!(
        sandbox_id(&c, "same").is_some(),
        "{}: the run did not use the sandbox",
        c.who()
    );
    // Only the inits' own read-only mounts differ (left out above): the sandbox's box init, and
    // the catatonit a run in a container of its own starts under.
    assert_eq!(stdout(&warm), stdout(&per_run), "{}", c.who());
    let text = stdout(&warm);
    assert!(text.contains("NoNewPrivs:\t1"), "{}: {text}", c.who());
    let got = common::labelled_results(&warm);
    // /dev belongs to the box's user and is writable by its owner: a refusal there is
    // Landlock's, as is the root directory's; /tmp, which is granted, takes the same write.
    assert_eq!(
        got["dev-owner"].split_whitespace().next(),
        Some(got["box-uid"].as_str()),
        "{}: {text}",
        c.who()
    );
    assert!(got["dev-owner"].ends_with("dev-mode=755"), "{text}");
    for (probe, want) in [
        ("root_read", "EACCES"),
        ("dev_write", "EACCES"),
        ("tmp_write", "OK"),
        // The filter's answers: EPERM for what it denies, ENOSYS for clone3.
        ("keyctl", "EPERM"),
        ("io_uring_setup", "EPERM"),
        ("unshare", "EPERM"),
        ("clone_newuser", "EPERM"),
        ("clone3", "ENOSYS"),
        ("chmod_u+s", "EPERM"),
    ] {
        assert_eq!(
            got.get(probe).map(String::as_str),
            Some(want),
            "{}: {probe} in a sandbox run: {text}",
            c.who()
        );
    }
    c.ok(&["box", "rm", "--force", "same"]);
}

#[test]
fn a_sandbox_run_carries_the_same_credentials_limits_and_filters_as_a_container_per_run() {
    same_confinement_as_a_container_per_run(false);
}

#[test]
fn a_sandbox_run_carries_the_same_credentials_limits_and_filters_as_a_container_per_run_as_the_test_user(
) {
    same_confinement_as_a_container_per_run(true);
}

fn idle_case(as_user: bool) {
    let Some(mut c) = caller("idle timeout", as_user) else {
        return;
    };
    sandbox::idle_teardown(&mut c, "process");
}

#[test]
fn the_idle_timeout_tears_a_process_sandbox_down() {
    idle_case(false);
}

#[test]
fn the_idle_timeout_tears_a_process_sandbox_down_as_the_test_user() {
    idle_case(true);
}

#[test]
fn an_idle_time_that_is_not_whole_seconds_from_one_to_a_day_is_refused_and_makes_no_sandbox() {
    let Some(mut c) = caller("bad idle time", false) else {
        return;
    };
    c.ok(&["box", "create", "badidle", "--isolation=process"]);
    for bad in [
        "0",
        "-5",
        "3s",
        "1e3",
        "86401",
        "18446744073709551616",
        "",
        " 5",
    ] {
        let out = c.h5i_with(
            &["box", "run", "badidle", "--", "echo", "ran"],
            &[("H5I_SANDBOX_IDLE_SECS", bad)],
        );
        let err = stderr(&out);
        assert_ne!(out.status.code(), Some(0), "{bad:?} was taken: {err}");
        assert!(
            err.contains("refusing: H5I_SANDBOX_IDLE_SECS=") && err.contains("to fix:"),
            "{bad:?}: {err}"
        );
        assert!(!stdout(&out).contains("ran"), "{bad:?}: the command ran");
        assert_eq!(sandbox_id(&c, "badidle"), None, "{bad:?} made a sandbox");
    }
    let out = c.h5i_with(
        &["box", "run", "badidle", "--", "echo", "ran"],
        &[("H5I_SANDBOX_IDLE_SECS", "86400")],
    );
    assert!(stdout(&out).contains("ran"), "{}", stderr(&out));
    assert!(sandbox_id(&c, "badidle").is_some());
    c.ok(&["box", "rm", "--force", "badidle"]);
}

fn oom_spares_service(as_user: bool) {
    let Some(mut c) = caller("oom and a service", as_user) else {
        return;
    };
    sandbox::oom_spares_a_service(&mut c, "process");
}

#[test]
fn a_runs_oom_kills_that_run_not_a_service_of_the_box() {
    oom_spares_service(false);
}

#[test]
fn a_runs_oom_kills_that_run_not_a_service_of_the_box_as_the_test_user() {
    oom_spares_service(true);
}

#[test]
fn what_runs_leave_in_the_boxs_scratch_counts_against_its_memory() {
    if let Some(mut c) = caller("leftovers", false) {
        sandbox::leftovers_count_against_the_box(&mut c, "process");
    }
}

#[test]
fn what_runs_leave_in_the_boxs_scratch_counts_against_its_memory_as_the_test_user() {
    if let Some(mut c) = caller("leftovers", true) {
        sandbox::leftovers_count_against_the_box(&mut c, "process");
    }
}

/// The box init ends after its idle time without a run even while something keeps connecting
/// to ask whether it answers (h5i's `status`, `box ls`, the console's refresh do): a check is
/// not a run. Before, every connection restarted the idle clock, so a watched box's sandbox
/// never went down.
#[test]
fn the_box_init_ends_when_idle_though_status_checks_keep_connecting() {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::os::unix::process::CommandExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("init.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let fd = listener.as_raw_fd();
    let mut init = Command::new(Path::new(common::H5I).with_file_name("h5i-runc"));
    init.args(["box-init", "--idle-secs", "2"]);
    // SAFETY: dup2 and fcntl are async-signal-safe; the listener becomes the init's
    // descriptor 3 without close-on-exec, as the sandbox hands it over (dup2 onto itself
    // keeps the flag, so it is cleared by hand).
    unsafe {
        init.pre_exec(move || {
            let ok = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if ok < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = init.spawn().unwrap();
    drop(listener);
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let (stop, sock) = (stop.clone(), sock.clone());
        std::thread::spawn(move || {
            let mut answered = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if UnixStream::connect(&sock).is_ok() {
                    answered += 1;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            answered
        })
    };
    let status = common::wait_bounded(
        child,
        Duration::from_secs(30),
        "a box init idle for 2 s while status checks connect",
    );
    stop.store(true, Ordering::Relaxed);
    let answered = pinger.join().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        answered >= 3,
        "the checks never reached the init: {answered}"
    );
}
