//! The directory-swap race against the host verbs that read a box's tree (issue 13, finding 2):
//! a service inside a process-tier box exchanges `d/` with a symlink to a root-only host
//! directory holding `canary.txt`, as fast as it can, while the host runs `box apply`,
//! `box rebase` and `box export` fifty times. The canary's bytes must never reach the parent's
//! object store (every object, as `git cat-file --batch-all-objects` gives it, and every file
//! under `.git`, the box's scratch included), an export bundle, or anything h5i prints.
//!
//! Runs as root (CI): the canary directory must be one the box's identity cannot open itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{files_containing, Repo};

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

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_directory_swapped_for_a_symlink_mid_read_never_leaks_a_root_only_file() {
    if !is_root() {
        eprintln!("skipped: the directory-swap race needs root (a root-only canary directory and a process-tier service)");
        return;
    }
    let canary_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(canary_dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let canary = format!("H5I-CANARY-{}-{nanos}", std::process::id());
    let innocent = "i".repeat(canary.len());
    std::fs::write(canary_dir.path().join("canary.txt"), &canary).unwrap();

    let r = Repo::new();
    r.write_policy("[service.swap]\ncommand = \"exec python3 .swap.py\"\n");
    std::fs::write(r.path().join(".swap.py"), SWAPPER).unwrap();
    std::fs::create_dir(r.path().join("d")).unwrap();
    std::fs::write(r.path().join("d/canary.txt"), &innocent).unwrap();
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", "race fixture"]);
    r.ok(&["box", "create", "race", "--isolation=process"]);
    let ws = r.workspace("race");
    std::os::unix::fs::symlink(canary_dir.path(), ws.join("l")).unwrap();
    // The parent moves on, so `box rebase` has a tip to carry the box onto.
    std::fs::write(r.path().join("README.md"), "moved on\n").unwrap();
    r.git(&["commit", "-q", "-am", "parent moves"]);

    r.ok(&["box", "service", "start", "race", "swap"]);
    let started = Instant::now();
    while !std::fs::symlink_metadata(ws.join("d"))
        .unwrap()
        .file_type()
        .is_symlink()
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the swapper never swapped"
        );
        std::thread::yield_now();
    }

    let out_root = tempfile::tempdir().unwrap();
    let mut printed = Vec::new();
    for i in 0..50 {
        let out = out_root.path().join("bundle");
        let out_s = out.display().to_string();
        let args: Vec<&str> = match i % 3 {
            0 => vec!["box", "apply", "race"],
            1 => vec!["box", "rebase", "race"],
            _ => vec!["box", "export", "race", "--out", &out_s, "--force"],
        };
        let o = r.h5i(&args);
        printed.extend_from_slice(&o.stdout);
        printed.extend_from_slice(&o.stderr);
        // Every round reads the whole tree: export passes (the symlink is excluded, named),
        // apply and rebase refuse only after the gate has seen the snapshot.
        let said = format!("{}{}", common::stdout(&o), common::stderr(&o));
        if i % 3 == 2 {
            assert!(o.status.success(), "export failed: {said}");
            assert!(said.contains("symlink to an absolute path"), "{said}");
        } else {
            assert!(!o.status.success(), "{args:?} went through: {said}");
            assert!(said.contains("export gate excludes"), "{args:?}: {said}");
        }
        // A box that rebased is pinned to the tip; move the parent again for the next round.
        if i % 3 == 1 && o.status.success() {
            std::fs::write(r.path().join("README.md"), format!("round {i}\n")).unwrap();
            r.git(&["commit", "-q", "-am", "parent moves again"]);
        }
    }
    // The service was thawed after every verb: it is still swapping.
    let was = std::fs::symlink_metadata(ws.join("d"))
        .unwrap()
        .file_type()
        .is_symlink();
    let waited = Instant::now();
    while std::fs::symlink_metadata(ws.join("d"))
        .unwrap()
        .file_type()
        .is_symlink()
        == was
    {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the service was left frozen"
        );
        std::thread::yield_now();
    }
    let _ = r.h5i(&["box", "service", "stop", "race", "swap"]);

    let needle = canary.as_bytes();
    let all = Command::new("git")
        .args(["cat-file", "--batch-all-objects", "--batch"])
        .current_dir(r.path())
        .output()
        .unwrap();
    assert!(all.status.success());
    assert!(
        !all.stdout.windows(needle.len()).any(|w| w == needle),
        "the canary is in the parent's object store"
    );
    let leaked = files_containing(&r.path().join(".git"), needle);
    assert!(
        leaked.is_empty(),
        "the canary is in files under .git: {leaked:?}"
    );
    let leaked = files_containing(out_root.path(), needle);
    assert!(
        leaked.is_empty(),
        "the canary is in an export bundle: {leaked:?}"
    );
    assert!(
        !printed.windows(needle.len()).any(|w| w == needle),
        "h5i printed the canary"
    );
}
