//! `H5I_LOG` (falling back to `RUST_LOG`): with a filter set, h5i prints a debug event for every
//! process it starts (a box run's command included) and for the refusal it ends with; unset,
//! it prints nothing it would not print anyway; a malformed filter is named once and ignored.
//! At the process, supervised and container tiers, as root and as h5i-test, and at the microvm
//! tier as root (its image is in the engine user's storage, as in tests/microvm.rs). At the
//! container tier h5i-runc's and the OCI hooks' own events (started by Podman's conmon, whose
//! stderr is not the caller's) reach the caller's stderr through h5i-log's relay, those of
//! the verbs Podman hands no bundle (`start`, `kill`, `delete`, `state`) too.
//!
//! The relay directory, attacked: from inside a real container box its path does not exist
//! (ENOENT) and no process of the box holds a descriptor into it; and what h5i drains from it
//! (as the engine user, the one user who can write there, would plant it during a run) is
//! never read through a symlink, never waited on as a FIFO, never read from a hard link,
//! capped per file and in all (a huge file crowds out none of the run's own events), shown
//! with its control bytes escaped, and a directory swapped for a symlink is neither read nor
//! emptied.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::caller::{as_user, uid_of, Caller, TEST_USER};
use common::{stderr, stdout, tier_case};

fn spawn_and_refusal_events(c: &mut Caller, tier: &str) {
    c.create_at("logged", tier);

    let out = c.h5i_with(
        &["box", "run", "logged", "--", "echo", "h5i-log-probe"],
        &[("H5I_LOG", "debug")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "h5i-log-probe\n", "the events went to stdout");
    let err = stderr(&out);
    // From h5i itself (plain text, with the target), and for the box's command from whoever
    // started it: the warm sandbox (h5i's answer from the init) or h5i-runc (runc's format).
    assert!(
        err.lines().any(|l| l.contains("DEBUG h5i::spawn: spawned")),
        "no spawn event from h5i ({tier}, {}):\n{err}",
        c.who()
    );
    assert!(
        err.lines()
            .any(|l| l.contains("spawned") && l.contains("h5i-log-probe")),
        "no spawn event for the run's command ({tier}, {}):\n{err}",
        c.who()
    );
    if tier == "container" {
        // Podman's conmon started h5i-runc, and h5i-runc the hooks: their stderr is not the
        // caller's, and their events come back through the relay, each led by who wrote it.
        assert!(
            err.lines().any(|l| l.starts_with("h5i-runc.")
                && l.contains("DEBUG h5i::spawn: spawned")
                && l.contains("h5i-log-probe")
                && l.contains("by=\"h5i-runc\"")),
            "no spawn event from h5i-runc at the container tier ({}):\n{err}",
            c.who()
        );
        assert!(
            err.lines().any(|l| l.starts_with("h5i-hook.")
                && l.contains("DEBUG h5i::spawn: spawned")
                && l.contains("loopback")),
            "no event from the container tier's OCI hook ({}):\n{err}",
            c.who()
        );
        // The verbs Podman hands no bundle find the relay through the container's saved
        // spec: `start` comes in every run, from an h5i-runc of its own.
        assert!(
            err.lines().any(|l| l.starts_with("h5i-runc.")
                && l.contains("DEBUG h5i::runc: done")
                && l.contains("verb=\"start\"")),
            "no relayed event from h5i-runc start ({}):\n{err}",
            c.who()
        );
    }

    // Only the named target: the same events, nothing else at debug.
    let out = c.h5i_with(
        &["box", "run", "logged", "--", "true"],
        &[("H5I_LOG", "h5i::spawn=debug")],
    );
    let err = stderr(&out);
    assert!(err.contains("h5i::spawn: spawned"), "{err}");
    assert!(
        err.lines().all(|l| l.contains("spawned")),
        "a target the filter did not name printed:\n{err}"
    );

    // RUST_LOG is the fallback.
    let out = c.h5i_with(
        &["box", "run", "logged", "--", "true"],
        &[("RUST_LOG", "debug")],
    );
    assert!(
        stderr(&out).contains("h5i::spawn: spawned"),
        "{}",
        stderr(&out)
    );

    // A refusal: its event carries the typed form.
    let out = c.h5i_with(
        &["box", "run", "nosuch", "--", "true"],
        &[("H5I_LOG", "debug")],
    );
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines()
            .any(|l| l.contains("DEBUG h5i::refusal: refused") && l.contains("NoSuchBox")),
        "no refusal event:\n{err}"
    );
    assert!(err.ends_with("h5i: refusing: no box named `nosuch`; to fix: `h5i box ls` lists the boxes of this clone\n"), "{err}");

    // Unset: nothing extra.
    let out = c.h5i(&["box", "run", "logged", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "h5i printed something with no filter set");

    // Malformed: named once, ignored, the command still runs.
    let out = c.h5i_with(
        &["box", "run", "logged", "--", "true"],
        &[("H5I_LOG", "h5i=loud")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("h5i: ignoring H5I_LOG=\"h5i=loud\": "),
        "{err}"
    );
    c.ok(&["box", "rm", "--force", "logged"]);
}

fn case(tier: &str, as_user: bool) {
    // The test's own environment must not carry a filter into the "unset" case.
    assert!(
        std::env::var_os("RUST_LOG").is_none() && std::env::var_os("H5I_LOG").is_none(),
        "run this test without RUST_LOG/H5I_LOG set"
    );
    if tier == "microvm" && !common::guest_agent_ready(&format!("h5i_log at {tier}")) {
        return;
    }
    tier_case(
        &format!("h5i_log at {tier}"),
        tier,
        as_user,
        spawn_and_refusal_events,
    );
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_process_tier_as_root() {
    case("process", false);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_process_tier_as_h5i_test() {
    case("process", true);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_supervised_tier_as_root() {
    case("supervised", false);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_supervised_tier_as_h5i_test() {
    case("supervised", true);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_container_tier_as_root() {
    case("container", false);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_container_tier_as_h5i_test() {
    case("container", true);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_microvm_tier_as_root() {
    case("microvm", false);
}

/// Where the caller's container runs keep their run directories (each run's relay directory
/// is `<this>/run-<id>/out/log`): root's engine user's, or the caller's own runtime dir's.
fn runs_parent(c: &Caller) -> String {
    if c.uid() == 0 {
        "/run/h5i-engine".to_string()
    } else {
        format!("/run/user/{}/h5i", c.uid())
    }
}

/// The relay directory h5i named in a run's `podman run` (its spawn event, `h5i.log.dir=...`).
fn relay_dir_named(err: &str) -> String {
    let at = err
        .find("h5i.log.dir=")
        .unwrap_or_else(|| panic!("no h5i.log.dir annotation in the podman spawn event:\n{err}"));
    err[at + "h5i.log.dir=".len()..]
        .split(['"', ' ', ','])
        .next()
        .unwrap()
        .to_string()
}

fn relay_unreachable_from_the_box(c: &mut Caller, _tier: &str) {
    c.create_at("reach", "container");
    let parent = runs_parent(c);
    // Every way in the box might name it: the runs directory (whose child is this run's), a
    // relay file in it, and every descriptor of every process the box can see.
    let script = r#"ls -d "$1" 2>&1; ls -d "$1"/run-* 2>&1; { printf 'H5I-%s\n' FORGED > "$1/h5i-runc.1.log"; } 2>&1;
for f in /proc/[0-9]*/fd/*; do echo "fd $f -> $(readlink "$f")"; done"#;
    let out = c.h5i_with(
        &[
            "box", "run", "reach", "--", "sh", "-c", script, "probe", &parent,
        ],
        &[("H5I_LOG", "debug")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = stdout(&out);
    let err = stderr(&out);
    // The run had a relay directory, under the parent the box probed.
    let dir = relay_dir_named(&err);
    assert!(
        dir.starts_with(&format!("{parent}/run-reach-")),
        "{dir} {parent}"
    );
    assert!(
        err.lines().any(|l| l.starts_with("h5i-runc.")),
        "the relay was not in use:\n{err}"
    );
    // The kernel's answer to each: ENOENT (busybox's ash says it as "nonexistent directory").
    let enoent = "No such file or directory";
    for line in [
        format!("ls: {parent}: {enoent}"),
        format!("ls: {parent}/run-*: {enoent}"),
        format!("can't create {parent}/h5i-runc.1.log: nonexistent directory"),
    ] {
        assert!(
            said.lines().any(|l| l.ends_with(&line)),
            "no `{line}`: the box reached {parent}? ({}):\n{said}",
            c.who()
        );
    }
    assert!(
        !said.lines().any(|l| l.starts_with(&parent)),
        "the box listed {parent}:\n{said}"
    );
    let fds: Vec<&str> = said.lines().filter(|l| l.starts_with("fd ")).collect();
    assert!(!fds.is_empty(), "the box saw no descriptor at all:\n{said}");
    assert!(
        !fds.iter()
            .any(|l| l.contains("/out/log") || l.contains("h5i-runc.") || l.contains("h5i-hook.")),
        "a process of the box holds a descriptor into the relay ({}):\n{said}",
        c.who()
    );
    // Nothing the box wrote came back as an event.
    assert!(!err.contains("H5I-FORGED"), "{err}");
    c.ok(&["box", "rm", "--force", "reach"]);
}

#[test]
fn the_relay_directory_does_not_exist_inside_a_container_box_as_root() {
    tier_case(
        "relay unreachable from the box",
        "container",
        false,
        relay_unreachable_from_the_box,
    );
}

#[test]
fn the_relay_directory_does_not_exist_inside_a_container_box_as_h5i_test() {
    tier_case(
        "relay unreachable from the box",
        "container",
        true,
        relay_unreachable_from_the_box,
    );
}

/// Run `box run NAME -- sh -c 'read x < /work/gate'` with H5I_LOG=debug; once the run's relay
/// directory exists, `plant` (given it) as the engine user, then open the gate; h5i's output.
fn run_with_planted(c: &mut Caller, name: &str, plant: impl FnOnce(&str)) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let gate = c.workspace(name).join("gate");
    let _ = std::fs::remove_file(&gate);
    let made = std::process::Command::new("mkfifo")
        .args(["-m", "0666"])
        .arg(&gate)
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::set_permissions(&gate, std::fs::Permissions::from_mode(0o666)).unwrap();
    let parent = runs_parent(c);
    let runs_now = || -> std::collections::BTreeSet<std::path::PathBuf> {
        std::fs::read_dir(&parent)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let before = runs_now();
    let child = c
        .h5i_cmd_with(
            &[
                "box",
                "run",
                name,
                "--",
                "sh",
                "-c",
                "read x < /work/gate; echo released",
            ],
            &[("H5I_LOG", "debug")],
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    // Should the test fail before the gate opens, the run is ended rather than left waiting.
    let run = EndOnDrop(Some(child));
    let mut dir = None;
    let found = common::until(std::time::Duration::from_secs(120), || {
        dir = runs_now()
            .difference(&before)
            .map(|run| run.join("out/log"))
            .find(|p| {
                p.to_string_lossy().contains(&format!("/run-{name}-"))
                    && std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_some())
            });
        dir.is_some()
    });
    assert!(found, "no relay directory with events under {parent}");
    plant(&dir.unwrap().display().to_string());
    // The box waits in open(2) for a writer: a non-blocking open succeeds once it reads.
    let opened = common::until(std::time::Duration::from_secs(60), || {
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&gate)
            .is_ok()
    });
    assert!(opened, "the box never opened its gate");
    common::child_output_bounded(
        run.take(),
        std::time::Duration::from_secs(120),
        &format!("box run {name} with hostile relay entries"),
    )
}

use std::os::unix::fs::OpenOptionsExt as _;

/// A spawned run (the leader of its own process group) that is ended with its group when
/// dropped before it is taken.
struct EndOnDrop(Option<std::process::Child>);

impl EndOnDrop {
    fn take(mut self) -> std::process::Child {
        self.0.take().unwrap()
    }
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SAFETY: kill(2) of this test's own child's process group; the child is not
            // reaped yet (wait below), so the group id is still its own.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM) };
            let _ = child.wait();
        }
    }
}

/// `script` as the engine user (the one user who can write the relay directory), which must
/// succeed.
fn as_engine_user(script: &str) {
    let out = as_user(TEST_USER, Some("/tmp"))
        .args(["sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {}", stderr(&out));
}

fn hostile_relay_entries(c: &mut Caller, _tier: &str) {
    c.create_at("relayed", "container");
    let engine = uid_of(TEST_USER);
    let own = format!("/run/user/{engine}/h5i-relay-test.{}", std::process::id());
    as_engine_user(&format!(
        "mkdir -p {own} && echo H5I-RELAY-SECRET > {own}/secret && echo H5I-RELAY-LINKED > {own}/linked"
    ));
    let out = run_with_planted(c, "relayed", |log| {
        as_engine_user(&format!(
            "ln -s {own}/secret {log}/h5i-hook.90001.log && mkfifo {log}/h5i-hook.90002.log \
             && truncate -s 8G {log}/h5i-runc.90003.log \
             && printf '2026-01-01T00:00:00Z DEBUG \\033]52;c;aGk=\\007\\033[2J H5I-RELAY-ESC \\302\\233 \\342\\200\\256\\n' > {log}/h5i-hook.90004.log \
             && ln {own}/linked {log}/h5i-runc.90005.log"
        ));
    });
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(stdout(&out), "released\n");
    // The real events still came back.
    assert!(
        err.lines()
            .any(|l| l.starts_with("h5i-runc.") && l.contains("spawned")),
        "{err}"
    );
    // Never through the symlink, never the hard link's file.
    assert!(
        !err.contains("H5I-RELAY-SECRET"),
        "followed a symlink:\n{err}"
    );
    assert!(
        !err.contains("H5I-RELAY-LINKED"),
        "read a hard link:\n{err}"
    );
    // The escape sequences are shown, not sent: no ESC, BEL or C1 byte, no bidi override.
    let esc = err
        .lines()
        .find(|l| l.contains("H5I-RELAY-ESC"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(esc.starts_with("h5i-hook.90004: "), "{esc}");
    assert!(esc.contains("\\x1b]52;c;aGk=\\x07\\x1b[2J"), "{esc}");
    assert!(
        !err.contains(['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}']),
        "a control character reached the terminal:\n{err}"
    );
    // The sparse 8 GiB file: read up to the cap, its one line cut, the whole output bounded.
    let sparse = err
        .lines()
        .find(|l| l.starts_with("h5i-runc.90003: "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        sparse.ends_with(" bytes cut]"),
        "{}",
        &sparse[sparse.len().saturating_sub(80)..]
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("h5i-runc.90003: [relay: ")
                && l.ends_with(" more bytes of this file not read]")),
        "{err}"
    );
    assert!(err.len() < 256 * 1024, "{} bytes of stderr", err.len());
    // Every relay-named entry is gone (the FIFO too), and with them the run's directory.
    let leftovers: Vec<_> = std::fs::read_dir(runs_parent(c))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("run-relayed-"))
        .map(|e| e.path())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(std::path::Path::new(&format!("{own}/secret")).exists());

    // The relay directory itself swapped for a symlink to someone else's: nothing there is
    // read or removed.
    let victim = tempfile::tempdir().unwrap();
    std::fs::write(
        victim.path().join("h5i-runc.90009.log"),
        "2026 DEBUG H5I-RELAY-VICTIM\n",
    )
    .unwrap();
    std::fs::set_permissions(
        victim.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let swapped = std::sync::Mutex::new(String::new());
    let out = run_with_planted(c, "relayed", |log| {
        as_engine_user(&format!(
            "mv {log} {log}.real && ln -s {} {log}",
            victim.path().display()
        ));
        *swapped.lock().unwrap() = log.to_string();
    });
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("H5I-RELAY-VICTIM"),
        "read through a swapped directory:\n{err}"
    );
    assert!(
        victim.path().join("h5i-runc.90009.log").exists(),
        "removed through a swapped directory"
    );
    // What the swap left behind (the moved directory keeps the run's directory) is the test's.
    let log = swapped.into_inner().unwrap();
    let run_dir = std::path::Path::new(&log)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let _ = std::fs::remove_dir_all(&run_dir);
    as_engine_user(&format!("rm -rf {own}"));
    c.ok(&["box", "rm", "--force", "relayed"]);
}

#[test]
fn hostile_relay_entries_are_never_followed_waited_on_or_shown_raw_as_root() {
    tier_case(
        "hostile relay entries",
        "container",
        false,
        hostile_relay_entries,
    );
}

#[test]
fn hostile_relay_entries_are_never_followed_waited_on_or_shown_raw_as_h5i_test() {
    tier_case(
        "hostile relay entries",
        "container",
        true,
        hostile_relay_entries,
    );
}
