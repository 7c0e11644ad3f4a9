//! The directory-swap race against the host verbs that read a box's tree (issue 13, finding 2):
//! something inside a box exchanges `d/` with a symlink to a host directory holding
//! `canary.txt` that the box itself cannot read (0700, the caller's, outside every path the
//! box sees), as fast as it can, while the host runs `box apply`, `box rebase` and
//! `box export` over and over. The canary's bytes must never reach the parent's object store
//! (every object, as `git cat-file --batch-all-objects` gives it, and every file under `.git`,
//! the box's scratch included), an export bundle, or anything h5i prints.
//!
//! At the process tier the swapper is a service (services hold no box lock; the verbs freeze
//! them): fifty rounds as root, fewer as the test user (the count is printed), then rounds of
//! `box diff` and `box status`, which must read under the same freeze (the service's freezer is
//! watched while each runs and must be seen holding it). At the
//! supervised and container tiers a box has no services; its only way to run is `box run`,
//! which holds the box's lock, so there every round while the swapping run is live must be
//! refused as busy (nothing read), `box diff` too, `box status` must say it did not scan the
//! tree (supervised tier), and the canary still never appears. As root and as
//! `h5i-test`; switching users needs root, so as another user every test says `skipped:`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{files_containing, stderr, stdout, Caller};

/// Exchange `d` and `l` (a symlink to the canary directory) with `renameat2(RENAME_EXCHANGE)`
/// in a tight loop, for at most ten minutes: whichever name a host read goes through, it is a
/// real directory one instant and a symlink out of the tree the next.
const SWAPPER: &str = r#"import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
end = time.monotonic() + 600
while time.monotonic() < end:
    for _ in range(1000):
        libc.renameat2(-100, b"d", -100, b"l", 2)
"#;

/// The same exchange from a shell, for a box without python (the container tier's image):
/// `mv` is not atomic, but `d` still flips between the directory and the symlink.
const SHELL_SWAPPER: &str = "exec timeout 30 sh -c 'while :; do mv d t; mv l d; mv t l; done'";

/// The canary: a 0700 directory of the caller's under the host's /tmp (a box has a private
/// /tmp and no grant there) holding `canary.txt`. Returns the directory and the canary's text.
fn canary(c: &Caller) -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new()
        .prefix("h5i-canary")
        .tempdir_in("/tmp")
        .unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let text = format!("H5I-CANARY-{}-{nanos}", std::process::id());
    std::fs::write(dir.path().join("canary.txt"), &text).unwrap();
    std::os::unix::fs::chown(dir.path(), Some(c.uid()), Some(c.uid())).unwrap();
    std::os::unix::fs::chown(dir.path().join("canary.txt"), Some(c.uid()), Some(c.uid())).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    (dir, text)
}

/// The fixture: a parent with `d/canary.txt` (innocent bytes of the canary's length) and the
/// swapper, a box `race` at `tier` with `l -> <canary dir>` in its workspace, and the parent
/// moved on (so `box rebase` has a tip to carry the box onto). The box itself cannot read the
/// canary: checked.
fn fixture(c: &mut Caller, tier: &str, canary_dir: &Path, canary: &str) {
    if tier == "process" {
        c.write(
            ".h5i/env.toml",
            "[service.swap]\ncommand = \"exec python3 .swap.py\"\n",
        );
    }
    c.write(".swap.py", SWAPPER);
    c.write("d/canary.txt", "i".repeat(canary.len()));
    c.commit_all("race fixture");
    c.create_at("race", tier);
    let link = format!("ln -s {} l", canary_dir.display());
    c.in_box("race", &link);
    let out = c.h5i(&["box", "run", "race", "--", "cat", "l/canary.txt"]);
    assert!(
        !out.status.success() && !stdout(&out).contains(canary),
        "the box reads the canary itself, so the race proves nothing: {}{}",
        stdout(&out),
        stderr(&out)
    );
    c.write("README.md", "moved on\n");
    c.commit_all("parent moves");
}

/// `rounds` rounds of apply, rebase and export; returns everything h5i printed. `busy`: each
/// round must be refused because a run holds the box (nothing read); otherwise each round reads
/// the whole tree (export passes, the symlink excluded and named; apply and rebase refuse only
/// after the gate has seen the snapshot).
fn rounds(c: &Caller, rounds: usize, busy: bool, out_root: &Path) -> Vec<u8> {
    let mut printed = Vec::new();
    for i in 0..rounds {
        let out = out_root.join("bundle");
        let out_s = out.display().to_string();
        let args: Vec<&str> = match i % 3 {
            0 => vec!["box", "apply", "race"],
            1 => vec!["box", "rebase", "race"],
            _ => vec!["box", "export", "race", "--out", &out_s, "--force"],
        };
        let o = c.h5i(&args);
        printed.extend_from_slice(&o.stdout);
        printed.extend_from_slice(&o.stderr);
        let said = format!("{}{}", stdout(&o), stderr(&o));
        if busy {
            assert!(
                !o.status.success(),
                "{args:?} went through a live run: {said}"
            );
            assert!(said.contains("is busy"), "{args:?}: {said}");
        } else if i % 3 == 2 {
            assert!(o.status.success(), "export failed: {said}");
            assert!(said.contains("symlink to an absolute path"), "{said}");
        } else {
            assert!(!o.status.success(), "{args:?} went through: {said}");
            assert!(said.contains("export gate excludes"), "{args:?}: {said}");
        }
        // A box that rebased is pinned to the tip; move the parent again for the next round.
        if i % 3 == 1 && o.status.success() {
            c.write("README.md", format!("round {i}\n"));
            c.commit_all("parent moves again");
        }
    }
    printed
}

/// The canary is nowhere: not in any object of the parent, not in any file under its `.git`
/// (the boxes' scratch included), not in an export bundle, not in what h5i printed.
fn assert_no_canary(c: &Caller, canary: &str, out_root: &Path, printed: &[u8]) {
    let needle = canary.as_bytes();
    let all = Command::new("git")
        .args(["cat-file", "--batch-all-objects", "--batch"])
        .current_dir(c.repo())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_PARAMETERS", "'safe.directory'='*'")
        .output()
        .unwrap();
    assert!(all.status.success(), "{}", stderr(&all));
    assert!(
        !all.stdout.windows(needle.len()).any(|w| w == needle),
        "the canary is in the parent's object store"
    );
    let leaked = files_containing(&c.repo().join(".git"), needle);
    assert!(
        leaked.is_empty(),
        "the canary is in files under .git: {leaked:?}"
    );
    let leaked = files_containing(out_root, needle);
    assert!(
        leaked.is_empty(),
        "the canary is in an export bundle: {leaked:?}"
    );
    assert!(
        !printed.windows(needle.len()).any(|w| w == needle),
        "h5i printed the canary"
    );
}

/// Whether the cgroup freezer holds the process `pid` now (v1 `freezer.state` FREEZING or
/// FROZEN, v2 `cgroup.freeze` 1). `None` when the process is gone.
fn frozen(pid: u32) -> Option<bool> {
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v1 = groups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        ctrl.split(',')
            .any(|c| c == "freezer")
            .then(|| path.to_string())
    });
    if let Some(path) = v1 {
        let state =
            std::fs::read_to_string(format!("/sys/fs/cgroup/freezer{path}/freezer.state")).ok()?;
        return Some(matches!(state.trim(), "FROZEN" | "FREEZING"));
    }
    let path = groups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let state = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cgroup.freeze")).ok()?;
    Some(state.trim() == "1")
}

/// `rounds` rounds of `box diff` and `box status` (alternating) while the swapping service
/// runs; returns what they printed. They must read the tree with the service frozen: the
/// service's freezer is watched while each verb runs and must be seen holding it (in at least
/// one round per verb: a short scan can fall between two looks), and each must succeed (diff
/// prints the change, status scanned the workspace).
fn looking_rounds(c: &Caller, rounds: usize) -> Vec<u8> {
    let services: serde_json::Value =
        serde_json::from_str(&c.ok(&["box", "service", "status", "race", "--json"])).unwrap();
    let pid = services["services"][0]["pid"].as_u64().unwrap() as u32;
    assert_eq!(
        frozen(pid),
        Some(false),
        "the swapper is held before any verb"
    );
    let mut printed = Vec::new();
    let mut held = [0usize; 2];
    for i in 0..rounds {
        let args: &[&str] = if i % 2 == 0 {
            &["box", "diff", "race"]
        } else {
            &["box", "status", "race"]
        };
        let mut child = c
            .h5i_in(&c.repo(), args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Drain the pipes on threads so a large diff never blocks the verb while it is watched.
        let drain = |mut r: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut b = Vec::new();
                r.read_to_end(&mut b).unwrap();
                b
            })
        };
        let out = drain(Box::new(child.stdout.take().unwrap()));
        let err = drain(Box::new(child.stderr.take().unwrap()));
        let started = Instant::now();
        let mut seen_frozen = 0u64;
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if frozen(pid) == Some(true) {
                seen_frozen += 1;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "{args:?} never returned"
            );
            std::thread::yield_now();
        };
        let (out, err) = (out.join().unwrap(), err.join().unwrap());
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err)
        );
        assert!(status.success(), "{args:?}: {said}");
        if seen_frozen > 0 {
            held[i % 2] += 1;
        }
        if i % 2 == 0 {
            assert!(said.contains("diff --git"), "{args:?}: {said}");
        } else {
            assert!(said.contains("entries scanned"), "{args:?}: {said}");
        }
        printed.extend_from_slice(&out);
        printed.extend_from_slice(&err);
    }
    // A status scan can be over between two looks at the freezer, so one round may miss it;
    // a verb that never froze the service is never seen holding it at all.
    eprintln!(
        "the swapper was seen frozen during {} of {} diff and {} of {} status rounds",
        held[0],
        rounds.div_ceil(2),
        held[1],
        rounds / 2
    );
    assert!(
        held[0] > 0 && held[1] > 0,
        "box diff or box status read the tree while the swapping service ran (never seen frozen)"
    );
    printed
}

/// While a run holds the box: `box diff` is refused as busy (nothing read) and `box status`
/// reports without scanning the tree, saying why.
fn looking_under_a_run(c: &Caller) -> Vec<u8> {
    let diff = c.h5i(&["box", "diff", "race"]);
    let status = c.h5i(&["box", "status", "race"]);
    let said = format!("{}{}", stdout(&diff), stderr(&diff));
    assert!(
        !diff.status.success(),
        "diff went through a live run: {said}"
    );
    assert!(said.contains("is busy"), "{said}");
    let said = format!("{}{}", stdout(&status), stderr(&status));
    assert!(status.status.success(), "{said}");
    assert!(
        said.contains("workspace  not scanned: a run or shell of the box is live"),
        "{said}"
    );
    [diff.stdout, diff.stderr, status.stdout, status.stderr].concat()
}

fn is_symlink(p: &Path) -> bool {
    std::fs::symlink_metadata(p)
        .map(|m| m.file_type().is_symlink())
        .unwrap_or(false)
}

/// Wait (bounded) until `d` in `ws` is seen as something other than `was`.
fn wait_for_swap(ws: &Path, was: bool, what: &str) {
    let started = Instant::now();
    while is_symlink(&ws.join("d")) == was {
        assert!(started.elapsed() < Duration::from_secs(30), "{what}");
        std::thread::yield_now();
    }
}

/// The process tier: a service swaps, the verbs freeze it, read, and thaw it.
fn race_against_a_service(c: &mut Caller, n: usize) {
    let (canary_dir, canary) = canary(c);
    fixture(c, "process", canary_dir.path(), &canary);
    let ws = c.workspace("race");
    c.ok(&["box", "service", "start", "race", "swap"]);
    wait_for_swap(&ws, false, "the swapper never swapped");
    let out_root = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(out_root.path(), Some(c.uid()), Some(c.uid())).unwrap();
    eprintln!("process tier as {}: {n} rounds", c.who());
    let mut printed = rounds(c, n, false, out_root.path());
    printed.extend(looking_rounds(c, n.min(20)));
    // The service was thawed after every verb: it is still swapping.
    wait_for_swap(
        &ws,
        is_symlink(&ws.join("d")),
        "the service was left frozen",
    );
    let _ = c.h5i(&["box", "service", "stop", "race", "swap"]);
    assert_no_canary(c, &canary, out_root.path(), &printed);
}

/// The supervised and container tiers: a run swaps for 30 s (holding the box's lock); every
/// round while it lives is refused as busy.
fn race_against_a_run(c: &mut Caller, tier: &str, n: usize) {
    let (canary_dir, canary) = canary(c);
    fixture(c, tier, canary_dir.path(), &canary);
    let ws = c.workspace("race");
    let swap = if tier == "container" {
        SHELL_SWAPPER.to_string()
    } else {
        "exec timeout 30 python3 .swap.py".to_string()
    };
    let run = c
        .h5i_in(&c.repo(), &["box", "run", "race", "--", "sh", "-c", &swap])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_swap(&ws, false, "the swapping run never swapped");
    let out_root = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(out_root.path(), Some(c.uid()), Some(c.uid())).unwrap();
    eprintln!("{tier} tier as {}: {n} rounds against a live run", c.who());
    let mut printed = rounds(c, n, true, out_root.path());
    if tier != "container" {
        printed.extend(looking_under_a_run(c));
    }
    // The swapper ends itself (30 s): a signal to `h5i box run` is not what this test is about.
    common::wait_bounded(run, Duration::from_secs(180), "the swapping run");
    assert_no_canary(c, &canary, out_root.path(), &printed);
}

fn case(test: &str, as_user: bool, body: impl FnOnce(&mut Caller)) {
    if !common::require_root(
        test,
        "a canary the box cannot read, boxes as root, and switching to h5i-test",
    ) {
        return;
    }
    body(&mut Caller::either(as_user));
}

#[test]
fn a_directory_swapped_for_a_symlink_mid_read_never_leaks_a_host_file_at_the_process_tier() {
    case("race_process_root", false, |c| {
        race_against_a_service(c, 50)
    });
}

#[test]
fn a_directory_swapped_for_a_symlink_mid_read_never_leaks_at_the_process_tier_as_the_test_user() {
    case("race_process_user", true, |c| race_against_a_service(c, 15));
}

#[test]
fn a_swapping_run_at_the_supervised_tier_holds_the_box_so_no_verb_reads_under_it() {
    case("race_supervised_root", false, |c| {
        race_against_a_run(c, "supervised", 6)
    });
}

#[test]
fn a_swapping_run_at_the_supervised_tier_holds_the_box_as_the_test_user() {
    case("race_supervised_user", true, |c| {
        race_against_a_run(c, "supervised", 6)
    });
}

#[test]
fn a_swapping_run_at_the_container_tier_holds_the_box_so_no_verb_reads_under_it() {
    case("race_container_root", false, |c| {
        race_against_a_run(c, "container", 6)
    });
}

#[test]
fn a_swapping_run_at_the_container_tier_holds_the_box_as_the_test_user() {
    case("race_container_user", true, |c| {
        race_against_a_run(c, "container", 6)
    });
}
