//! The box-lifetime sandbox at the process tier, asserted from inside real boxes and from the
//! host: a run's leftovers die with it, a changed plan rebuilds the sandbox, the memory cap and
//! the wall clock act per run, a run cannot reach the init it was forked from, and `rm` leaves
//! no init, cgroup or sandbox directory behind. Every other process-tier test runs through the
//! sandbox too (it is the default path); `H5I_SANDBOX=off` is the per-run container path.
//!
//! Needs root (a cgroup of h5i's own for each run); prints `skipped: ...` otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{process_alive as alive, stderr, stdout, Repo};

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the box sandbox tests need root (cgroups of h5i's own)");
        return false;
    }
    true
}

fn run(r: &Repo, name: &str, argv: &[&str]) -> std::process::Output {
    let mut args = vec!["box", "run", name, "--"];
    args.extend_from_slice(argv);
    r.h5i(&args)
}

/// The sandbox's container id, from `box status` (None when it is down).
fn sandbox_id(r: &Repo, name: &str) -> Option<String> {
    common::sandbox_id_in(&r.ok(&["box", "status", name]))
}

/// The sandbox directory holding the state of container `id`.
fn sandbox_dir(id: &str) -> Option<PathBuf> {
    std::fs::read_dir("/run/h5i").ok()?.flatten().find_map(|e| {
        let state = std::fs::read_to_string(e.path().join("state.json")).ok()?;
        state
            .contains(&format!("\"container\":\"{id}\""))
            .then(|| e.path())
    })
}

fn init_pid(id: &str) -> i32 {
    let dir = sandbox_dir(id).expect("sandbox directory");
    std::fs::read_to_string(dir.join("init.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Every cgroup directory named `id` under this process's own memory (or unified) group.
fn cgroups_named(id: &str) -> Vec<PathBuf> {
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

#[test]
fn a_background_job_started_by_one_run_is_gone_before_the_next_run_starts() {
    if !root() {
        return;
    }
    let r = Repo::new();
    r.ok(&["box", "create", "bg", "--isolation=process"]);
    let out = run(
        &r,
        "bg",
        &["sh", "-c", "sleep 987.61 & echo $! > bg.pid; echo started"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        sandbox_id(&r, "bg").is_some(),
        "the run did not use the sandbox"
    );
    let ps = Command::new("pgrep")
        .args(["-f", "sleep 987.61"])
        .output()
        .unwrap();
    assert!(
        stdout(&ps).trim().is_empty(),
        "the background job outlived its run: {}",
        stdout(&ps)
    );
    // From inside: the pid the first run recorded names no process in the box any more.
    let out = run(
        &r,
        "bg",
        &["sh", "-c", "kill -0 $(cat bg.pid) 2>&1; echo kill=$?"],
    );
    let text = stdout(&out);
    assert!(text.contains("kill=1"), "{text}{}", stderr(&out));
}

#[test]
fn a_changed_plan_rebuilds_the_sandbox_and_the_next_run_sees_the_new_grant() {
    if !root() {
        return;
    }
    let r = Repo::new();
    let late = tempfile::tempdir().unwrap();
    let grant = late.path().join("granted-later");
    r.write_policy(&format!(
        "[profile.late]\nisolation = \"process\"\n[profile.late.fs]\nread = [\"/usr\", \"/etc\", \"/bin\", \"/lib\", \"/lib64\", \"{}\"]\n",
        grant.display()
    ));
    r.ok(&["box", "create", "late", "--profile", "late"]);
    let probe = format!("cat {}/f 2>&1; echo cat=$?", grant.display());
    let out = run(&r, "late", &["sh", "-c", &probe]);
    assert!(
        stdout(&out).contains("cat=1"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let first = sandbox_id(&r, "late").expect("sandbox up after the first run");
    let first_init = init_pid(&first);

    std::fs::create_dir(&grant).unwrap();
    std::fs::write(grant.join("f"), "visible-after-rebuild\n").unwrap();
    let out = run(&r, "late", &["sh", "-c", &probe]);
    let text = stdout(&out);
    assert!(
        text.contains("visible-after-rebuild") && text.contains("cat=0"),
        "{text}{}",
        stderr(&out)
    );
    let second = sandbox_id(&r, "late").expect("sandbox up after the second run");
    assert_ne!(first, second, "the sandbox was not rebuilt");
    assert!(
        !alive(first_init),
        "the old sandbox's init is still running"
    );
    assert!(
        cgroups_named(&first).is_empty(),
        "the old sandbox's cgroup is left"
    );
    r.ok(&["box", "rm", "--force", "late"]);
}

#[test]
fn a_runs_oom_kills_that_run_and_not_a_concurrent_run() {
    if !root() {
        return;
    }
    let r = Repo::new();
    r.write_policy(
        "[profile.small]\nisolation = \"process\"\n[profile.small.resources]\nmem = \"64M\"\n",
    );
    r.ok(&["box", "create", "oom2", "--profile", "small"]);
    // Make the sandbox first, so both runs below share it.
    assert!(run(&r, "oom2", &["true"]).status.success());
    let sandbox = sandbox_id(&r, "oom2").expect("sandbox up");
    let mut calm = Command::new(common::H5I)
        .args([
            "box",
            "run",
            "oom2",
            "--",
            "sh",
            "-c",
            "sleep 3; echo calm-survived",
        ])
        .current_dir(r.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let hog = run(
        &r,
        "oom2",
        &[
            "python3",
            "-c",
            "x = bytearray(512 * 1024 * 1024); print(len(x))",
        ],
    );
    assert_eq!(hog.status.code(), Some(137), "{}", stderr(&hog));
    let calm_out = {
        let mut so = String::new();
        std::io::Read::read_to_string(calm.stdout.as_mut().unwrap(), &mut so).unwrap();
        let st = calm.wait().unwrap();
        (st, so)
    };
    assert_eq!(calm_out.0.code(), Some(0), "the concurrent run was hit");
    assert!(calm_out.1.contains("calm-survived"), "{}", calm_out.1);
    assert_eq!(
        sandbox_id(&r, "oom2").as_deref(),
        Some(sandbox.as_str()),
        "the sandbox itself went down"
    );
    let recs = r.receipts("oom2");
    let hog_rec = recs
        .iter()
        .find(|rec| rec["argv"][0] == "python3")
        .expect("hog receipt");
    assert_eq!(hog_rec["exit"]["oom_killed"], true, "{hog_rec}");
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
}

#[test]
fn the_wall_clock_kills_a_sandbox_run_with_124_and_the_next_run_works() {
    if !root() {
        return;
    }
    let r = Repo::new();
    r.write_policy(
        "[profile.quick]\nisolation = \"process\"\n[profile.quick.resources]\nwall = \"2s\"\n",
    );
    r.ok(&["box", "create", "slow2", "--profile", "quick"]);
    let out = run(&r, "slow2", &["sh", "-c", "sleep 73.19 & sleep 73.19"]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(
        sandbox_id(&r, "slow2").is_some(),
        "the run did not use the sandbox"
    );
    let ps = Command::new("pgrep")
        .args(["-f", "sleep 73.19"])
        .output()
        .unwrap();
    assert!(
        stdout(&ps).trim().is_empty(),
        "box processes outlived the wall clock"
    );
    let out = run(&r, "slow2", &["echo", "next-run-ok"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("next-run-ok"));
}

#[test]
fn a_run_cannot_read_signal_or_stop_the_init_it_was_forked_from() {
    if !root() {
        return;
    }
    let r = Repo::new();
    r.ok(&["box", "create", "nosy", "--isolation=process"]);
    let out = run(
        &r,
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
        "the init's descriptors were reached: {text}"
    );
    assert!(
        text.contains("environ=1"),
        "the init's environment was read: {text}"
    );
    assert!(text.contains("signalled"), "{text}{}", stderr(&out));
    let id = sandbox_id(&r, "nosy").expect("the init survived its run's signals");
    let pid = init_pid(&id);
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(!state.contains(") T "), "the init was stopped: {state}");
    let out = run(&r, "nosy", &["echo", "still-served"]);
    assert!(stdout(&out).contains("still-served"), "{}", stderr(&out));
    assert_eq!(sandbox_id(&r, "nosy"), Some(id), "the sandbox was rebuilt");
}

/// Every box's first run makes its sandbox, and each making sweeps the other boxes' sandbox
/// directories that look orphaned, as one still being set up does: no run may lose its
/// directory to another's sweep.
#[test]
fn first_runs_of_many_boxes_at_once_each_keep_the_sandbox_they_make() {
    if !root() {
        return;
    }
    let r = Repo::new();
    for round in 0..4 {
        let names: Vec<String> = (0..6).map(|i| format!("m{round}-{i}")).collect();
        for n in &names {
            r.ok(&["box", "create", n, "--isolation=process"]);
        }
        std::thread::scope(|s| {
            let runs: Vec<_> = names
                .iter()
                .map(|n| (n, s.spawn(|| run(&r, n, &["echo", "up"]))))
                .collect();
            for (n, h) in runs {
                let out = h.join().unwrap();
                assert!(
                    out.status.success() && stdout(&out).trim() == "up",
                    "round {round}, box {n}: {}",
                    stderr(&out)
                );
                assert!(
                    sandbox_id(&r, n).is_some(),
                    "round {round}: {n} has no sandbox up"
                );
            }
        });
    }
}

#[test]
fn rm_leaves_no_init_cgroup_or_sandbox_directory_behind() {
    if !root() {
        return;
    }
    let r = Repo::new();
    r.ok(&["box", "create", "gone", "--isolation=process"]);
    assert!(run(&r, "gone", &["true"]).status.success());
    let id = sandbox_id(&r, "gone").expect("sandbox up");
    let pid = init_pid(&id);
    let dir = sandbox_dir(&id).unwrap();
    assert!(alive(pid));
    assert!(!cgroups_named(&id).is_empty(), "no cgroup found to check");
    r.ok(&["box", "rm", "--force", "gone"]);
    assert!(!alive(pid), "the init outlived rm");
    assert!(
        cgroups_named(&id).is_empty(),
        "cgroups left: {:?}",
        cgroups_named(&id)
    );
    assert!(!dir.exists(), "{} left", dir.display());
}

#[test]
fn abort_takes_the_sandbox_down_and_status_says_so() {
    if !root() {
        return;
    }
    let r = Repo::new();
    r.ok(&["box", "create", "ab", "--isolation=process"]);
    assert!(run(&r, "ab", &["true"]).status.success());
    let id = sandbox_id(&r, "ab").expect("sandbox up");
    let pid = init_pid(&id);
    r.ok(&["box", "abort", "ab"]);
    assert!(!alive(pid), "the init outlived abort");
    let status = r.ok(&["box", "status", "ab"]);
    assert!(status.contains("sandbox: down"), "{status}");
}

#[test]
fn a_sandbox_run_carries_the_same_credentials_limits_and_filters_as_a_container_per_run() {
    if !root() {
        return;
    }
    let r = Repo::new();
    r.ok(&["box", "create", "same", "--isolation=process"]);
    let script = "grep -E '^(Uid|Gid|Groups|Cap|NoNewPrivs|Seccomp)' /proc/self/status; \
                  ulimit -a; cat /proc/self/uid_map /proc/self/gid_map; pwd; \
                  cat /proc/self/mountinfo | awk '{print $5, $6}' | grep -v -E '^/.h5i-(box-)?init ' | sort";
    let per_run = r.h5i_env(
        &["box", "run", "same", "--", "sh", "-c", script],
        &[("H5I_SANDBOX", "off")],
    );
    assert!(per_run.status.success(), "{}", stderr(&per_run));
    assert!(
        sandbox_id(&r, "same").is_none(),
        "H5I_SANDBOX=off made a sandbox"
    );
    let warm = run(&r, "same", &["sh", "-c", script]);
    assert!(warm.status.success(), "{}", stderr(&warm));
    assert!(
        sandbox_id(&r, "same").is_some(),
        "the run did not use the sandbox"
    );
    // Only the inits' own read-only mounts differ (left out above): the sandbox's box init, and
    // the catatonit a run in a container of its own starts under.
    assert_eq!(stdout(&warm), stdout(&per_run));
    assert!(
        stdout(&warm).contains("NoNewPrivs:\t1"),
        "{}",
        stdout(&warm)
    );
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
