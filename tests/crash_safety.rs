//! Crash safety of h5i's own verbs: `create`, `run`, `export`, `apply`, `rebase` and `rm`,
//! each killed with SIGKILL (no handler, no cleanup) at a random point of its run, 100 trials
//! each. After every kill: no half box (a name is a whole box `status` and `doctor` accept, or
//! free for a new `create`), no torn receipt line, no half-written export (the directory is
//! absent or whole), a parent repository git finds sound, and the next use of the box works.
//!
//! The kill points are spread over the verb's own duration, measured first in the same run;
//! the dice are seeded (`H5I_CRASH_SEED`, printed) so a failing trial can be replayed. Runs as
//! root at the workspace tier: what is under test is h5i's own state (store, manifest, refs,
//! receipt log, export), which every tier shares. A rebase killed past its commit point leaves
//! a journal: `doctor` names the mend (`h5i box rebase NAME`), other verbs refuse the box until
//! it is finished, and finishing lands exactly the merge the killed rebase computed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::dice::Dice;
use common::{stderr, stdout, Repo, H5I};

const TRIALS: usize = 100;

fn h5i_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(H5I);
    c.args(args)
        .current_dir(dir)
        .env_remove("H5I_AGENT")
        .env_remove("H5I_DEFAULT_ISOLATION")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// How long `args` takes uninterrupted (it must succeed).
fn duration_of(dir: &Path, args: &[&str]) -> Duration {
    let start = Instant::now();
    let st = h5i_cmd(dir, args).status().unwrap();
    assert!(st.success(), "h5i {args:?} failed uninterrupted");
    start.elapsed()
}

/// Start `args` and SIGKILL it after `after` (if it is still running).
fn kill_after(dir: &Path, args: &[&str], after: Duration) {
    let mut child = h5i_cmd(dir, args).spawn().unwrap();
    std::thread::sleep(after);
    let _ = child.kill();
    common::wait_bounded(child, Duration::from_secs(60), "a killed h5i");
}

/// Every line of `name`'s receipt log is whole: newline-terminated JSON.
fn receipts_whole(r: &Repo, name: &str, trial: &str) {
    let p = r.box_dir(name).join("receipts.jsonl");
    let text = std::fs::read_to_string(&p).unwrap_or_default();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "{trial}: torn receipt line at the end of {}",
        p.display()
    );
    for line in text.lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "{trial}: damaged receipt line {line:?}"
        );
    }
}

/// `box doctor NAME --json`: whether every check of the box itself holds, and the checks as
/// text. The host-wide `host network` check is left out: the suite is one binary, and another
/// subject's test may have just killed a supervised network of its own, whose leftover the
/// doctor of any box names until the next supervised run clears it.
fn doctor_of_the_box(r: &Repo, name: &str, trial: &str) -> (bool, String) {
    let out = r.h5i(&["box", "doctor", name, "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{trial}: doctor {name} --json: {e}: {}", stderr(&out)));
    let checks = doc["checks"].as_array().unwrap();
    assert!(!checks.is_empty(), "{trial}: doctor {name}: no checks");
    let of_the_box = checks.iter().filter(|c| c["what"] != "host network");
    let holds = of_the_box.clone().all(|c| c["ok"] == true);
    let text = of_the_box
        .map(|c| {
            format!(
                "{} {} {}\n",
                c["what"],
                c["ok"],
                c["detail"].as_str().unwrap_or("")
            )
        })
        .collect();
    (holds, text)
}

/// A listed box is whole: `status` and `doctor` answer, every check of the box holds, its log
/// is whole.
fn box_whole(r: &Repo, name: &str, trial: &str) {
    let st = r.h5i(&["box", "status", name]);
    assert!(
        st.status.success(),
        "{trial}: status {name}: {}",
        stderr(&st)
    );
    let (holds, text) = doctor_of_the_box(r, name, trial);
    assert!(holds, "{trial}: doctor {name}: {text}");
    receipts_whole(r, name, trial);
}

/// The boxes `ls` lists (it must answer).
fn listed(r: &Repo, trial: &str) -> Vec<String> {
    let ls = r.h5i(&["box", "ls", "--json"]);
    assert!(ls.status.success(), "{trial}: ls: {}", stderr(&ls));
    let doc: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    doc["boxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The parent repository is sound.
fn parent_sound(r: &Repo, trial: &str) {
    let out = Command::new("git")
        .args(["fsck", "--no-progress", "--connectivity-only"])
        .current_dir(r.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{trial}: git fsck: {}", stderr(&out));
}

/// A name is a whole box or free: `create` of it then works.
fn whole_or_free(r: &Repo, name: &str, trial: &str) -> bool {
    if listed(r, trial).iter().any(|n| n == name) {
        box_whole(r, name, trial);
        true
    } else {
        let again = r.h5i(&["box", "create", name, "--isolation", "workspace"]);
        assert!(
            again.status.success(),
            "{trial}: {name} is neither a box nor free: {}",
            stderr(&again)
        );
        false
    }
}

fn create(r: &Repo, name: &str) {
    r.ok(&["box", "create", name, "--isolation", "workspace"]);
}

/// An edit in the box, so export and apply have a patch.
fn edit(r: &Repo, name: &str, n: usize) {
    r.ok(&[
        "box",
        "run",
        name,
        "--",
        "sh",
        "-c",
        &format!("echo change-{n} >> README.md"),
    ]);
}

#[test]
fn create_killed_at_any_point_leaves_a_whole_box_or_a_free_name() {
    if !common::require_root("create_killed_...", "the suite's host setup runs as root") {
        return;
    }
    let r = Repo::new();
    let span = duration_of(
        r.path(),
        &["box", "create", "probe", "--isolation", "workspace"],
    );
    let mut dice = Dice::new("create_killed");
    for i in 0..TRIALS {
        let name = format!("c{i}");
        let at = dice.within(span);
        kill_after(
            r.path(),
            &["box", "create", &name, "--isolation", "workspace"],
            at,
        );
        let trial = format!("create trial {i} killed at {at:?} of {span:?}");
        whole_or_free(&r, &name, &trial);
    }
    r.ok(&["box", "gc"]);
    parent_sound(&r, "create");
}

#[test]
fn run_killed_at_any_point_leaves_a_whole_receipt_log_and_a_usable_box() {
    if !common::require_root("run_killed_...", "the suite's host setup runs as root") {
        return;
    }
    let r = Repo::new();
    create(&r, "b");
    let script = "echo x >> log.txt; echo done";
    let span = duration_of(r.path(), &["box", "run", "b", "--", "sh", "-c", script]);
    let mut dice = Dice::new("run_killed");
    for i in 0..TRIALS {
        let at = dice.within(span);
        kill_after(r.path(), &["box", "run", "b", "--", "sh", "-c", script], at);
        let trial = format!("run trial {i} killed at {at:?} of {span:?}");
        receipts_whole(&r, "b", &trial);
        let next = r.h5i(&["box", "run", "b", "--", "true"]);
        assert!(
            next.status.success(),
            "{trial}: next run: {}",
            stderr(&next)
        );
    }
    box_whole(&r, "b", "run");
}

#[test]
fn export_killed_at_any_point_leaves_no_half_written_bundle() {
    if !common::require_root("export_killed_...", "the suite's host setup runs as root") {
        return;
    }
    let r = Repo::new();
    create(&r, "e");
    edit(&r, "e", 0);
    let out_root = tempfile::tempdir().unwrap();
    let whole_dir = out_root.path().join("whole");
    let span = duration_of(
        r.path(),
        &["box", "export", "e", "--out", whole_dir.to_str().unwrap()],
    );
    let mut whole: Vec<String> = std::fs::read_dir(&whole_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    whole.sort();
    let mut dice = Dice::new("export_killed");
    // One --out for every trial, as a user retrying would: a killed export's staging sibling
    // is cleared by the next export to that place.
    let dir = out_root.path().join("x");
    let out = dir.to_str().unwrap().to_owned();
    for i in 0..TRIALS {
        let at = dice.within(span);
        kill_after(r.path(), &["box", "export", "e", "--out", &out], at);
        let trial = format!("export trial {i} killed at {at:?} of {span:?}");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            let mut got: Vec<String> = entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            got.sort();
            assert!(
                got.is_empty() || got == whole,
                "{trial}: a half-written export: {got:?} (whole: {whole:?})"
            );
            for f in &got {
                let bytes = std::fs::read(dir.join(f)).unwrap();
                let whole_bytes = std::fs::read(whole_dir.join(f)).unwrap();
                match f.rsplit('.').next() {
                    Some("json") => assert!(
                        serde_json::from_slice::<serde_json::Value>(&bytes).is_ok(),
                        "{trial}: {f} is not whole JSON"
                    ),
                    Some("diff") => assert_eq!(bytes, whole_bytes, "{trial}: {f} differs"),
                    _ => assert!(
                        bytes.ends_with(b"\n") && !bytes.is_empty(),
                        "{trial}: {f} is cut short"
                    ),
                }
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
        receipts_whole(&r, "e", &trial);
    }
    r.ok(&["box", "export", "e", "--out", &out]);
    // Nothing but the exports is left beside them (no staging leftovers).
    let strays: Vec<String> = std::fs::read_dir(out_root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "whole" && n != "x")
        .collect();
    assert!(strays.is_empty(), "{strays:?}");
    box_whole(&r, "e", "export");
}

#[test]
fn apply_killed_at_any_point_lands_all_or_nothing() {
    if !common::require_root("apply_killed_...", "the suite's host setup runs as root") {
        return;
    }
    let r = Repo::new();
    create(&r, "probe");
    edit(&r, "probe", 0);
    let span = duration_of(r.path(), &["box", "apply", "probe"]);
    let mut dice = Dice::new("apply_killed");
    for i in 0..TRIALS {
        let name = format!("a{i}");
        create(&r, &name);
        edit(&r, &name, i + 1);
        let before = r.git(&["rev-parse", "HEAD"]);
        let at = dice.within(span);
        kill_after(r.path(), &["box", "apply", &name], at);
        let trial = format!("apply trial {i} killed at {at:?} of {span:?}");
        parent_sound(&r, &trial);
        if r.path().join(".git/.h5i/landing.json").exists() {
            // Killed mid-landing: until the next apply finishes it from the journal, the work
            // tree may stand between the two commits (git's read-tree is not atomic; seen in a
            // full run with README.md between its unlink and its write).
            let finished = r.h5i(&["box", "apply", &name]);
            assert!(
                finished.status.success(),
                "{trial}: the next apply did not finish the landing: {}",
                stderr(&finished)
            );
        }
        let after = r.git(&["rev-parse", "HEAD"]);
        let readme = std::fs::read_to_string(r.path().join("README.md")).unwrap();
        let landed = readme.contains(&format!("change-{}", i + 1));
        if after == before {
            // Nothing landed: the box is whole and a second apply lands it.
            box_whole(&r, &name, &trial);
            let again = r.h5i(&["box", "apply", &name]);
            assert!(
                again.status.success(),
                "{trial}: apply again: {}",
                stderr(&again)
            );
        } else {
            assert!(landed, "{trial}: HEAD moved without the box's change");
        }
        let status = r.git(&["status", "--porcelain"]);
        assert!(
            status.is_empty(),
            "{trial}: the parent is left dirty: {status}"
        );
        receipts_whole(&r, &name, &trial);
        let _ = r.h5i(&["box", "rm", &name, "--force"]);
    }
}

#[test]
fn rm_killed_at_any_point_leaves_a_whole_box_or_nothing() {
    if !common::require_root("rm_killed_...", "the suite's host setup runs as root") {
        return;
    }
    let r = Repo::new();
    create(&r, "probe");
    let span = duration_of(r.path(), &["box", "rm", "probe", "--force"]);
    let mut dice = Dice::new("rm_killed");
    for i in 0..TRIALS {
        let name = format!("r{i}");
        create(&r, &name);
        edit(&r, &name, i);
        let at = dice.within(span);
        kill_after(r.path(), &["box", "rm", &name, "--force"], at);
        let trial = format!("rm trial {i} killed at {at:?} of {span:?}");
        if listed(&r, &trial).contains(&name) {
            box_whole(&r, &name, &trial);
            r.ok(&["box", "rm", &name, "--force"]);
        }
        assert!(!listed(&r, &trial).contains(&name), "{trial}");
    }
    r.ok(&["box", "gc"]);
    parent_sound(&r, "rm");
    // No pin outlives its box.
    let pins = r.git(&["for-each-ref", "--format=%(refname)", "refs/h5i/boxes/"]);
    assert!(pins.is_empty(), "{pins}");
}

/// Files the parent rewrites on every rebase trial, so the in-place checkout takes long enough
/// for kills to land in it.
const BULK: usize = 300;

/// A parent commit for trial `i`: every bulk file rewritten, `p{i}.txt` added and the last
/// trial's removed.
fn parent_commit(r: &Repo, i: usize) {
    let bulk = r.path().join("bulk");
    std::fs::create_dir_all(&bulk).unwrap();
    for f in 0..BULK {
        std::fs::write(
            bulk.join(format!("f{f:03}")),
            format!("trial {i} file {f}\n"),
        )
        .unwrap();
    }
    std::fs::write(r.path().join(format!("p{i}.txt")), format!("parent {i}\n")).unwrap();
    if i > 0 {
        std::fs::remove_file(r.path().join(format!("p{}.txt", i - 1))).unwrap();
    }
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", &format!("parent {i}")]);
}

/// The box holds exactly the parent's trial `i` plus its own edits.
fn rebased_whole(r: &Repo, i: usize, trial: &str) {
    let tip = r.git(&["rev-parse", "HEAD"]);
    assert_eq!(
        r.manifest("b")["base"],
        tip.as_str(),
        "{trial}: manifest base"
    );
    let pin = r.git(&["rev-parse", "refs/h5i/boxes/b/base"]);
    assert_eq!(pin, tip, "{trial}: pin");
    let ws = r.workspace("b");
    for f in 0..BULK {
        let got = std::fs::read_to_string(ws.join(format!("bulk/f{f:03}"))).unwrap();
        assert_eq!(
            got,
            format!("trial {i} file {f}\n"),
            "{trial}: bulk/f{f:03}"
        );
    }
    assert!(ws.join(format!("p{i}.txt")).is_file(), "{trial}: p{i}.txt");
    if i > 0 {
        let gone = ws.join(format!("p{}.txt", i - 1));
        assert!(!gone.exists(), "{trial}: p{}.txt is back", i - 1);
    }
    let readme = std::fs::read_to_string(ws.join("README.md")).unwrap();
    assert!(
        readme.contains("change-0"),
        "{trial}: the box's edit was lost"
    );
    let note = std::fs::read_to_string(ws.join("box-note.txt")).unwrap();
    assert_eq!(note, "the box's own file\n", "{trial}: the box's new file");
    let head = std::fs::read_to_string(
        ws.join(".git/refs/heads/")
            .join(r.manifest("b")["branch"].as_str().unwrap()),
    )
    .unwrap();
    assert_eq!(head.trim(), tip, "{trial}: the box's branch");
    assert!(
        !r.box_dir("b").join("rebase").exists(),
        "{trial}: the journal outlived the rebase"
    );
}

#[test]
fn rebase_killed_at_any_point_leaves_a_whole_box_or_a_journal_that_finishes() {
    if !common::require_root("rebase_killed_...", "the suite's host setup runs as root") {
        return;
    }
    let r = Repo::new();
    create(&r, "b");
    edit(&r, "b", 0);
    r.ok(&[
        "box",
        "run",
        "b",
        "--",
        "sh",
        "-c",
        "echo \"the box's own file\" > box-note.txt",
    ]);
    parent_commit(&r, 0);
    let span = duration_of(r.path(), &["box", "rebase", "b"]);
    rebased_whole(&r, 0, "the uninterrupted rebase");
    let mut dice = Dice::new("rebase_killed");
    let (mut journaled, mut untouched) = (0, 0);
    for i in 1..=TRIALS {
        parent_commit(&r, i);
        let at = dice.within(span);
        kill_after(r.path(), &["box", "rebase", "b"], at);
        let trial = format!("rebase trial {i} killed at {at:?} of {span:?}");
        receipts_whole(&r, "b", &trial);
        assert!(listed(&r, &trial).contains(&"b".to_owned()), "{trial}: ls");
        let st = r.h5i(&["box", "status", "b"]);
        assert!(st.status.success(), "{trial}: status: {}", stderr(&st));
        let (holds, said) = doctor_of_the_box(&r, "b", &trial);
        let tip = r.git(&["rev-parse", "HEAD"]);
        if !holds {
            // Past the commit point: doctor and status name the mend, other verbs refuse.
            journaled += 1;
            assert!(
                said.contains("`h5i box rebase b` finishes it"),
                "{trial}: doctor fails without naming the mend: {said}"
            );
            assert!(
                stdout(&st).contains("h5i box rebase b"),
                "{trial}: status does not name the mend: {}",
                stdout(&st)
            );
            let run = r.h5i(&["box", "run", "b", "--", "true"]);
            assert!(
                !run.status.success() && stderr(&run).contains("rebase was interrupted"),
                "{trial}: a run went ahead mid-rebase: {}",
                stderr(&run)
            );
            let fin = r.h5i(&["box", "rebase", "b"]);
            assert!(
                fin.status.success() && stdout(&fin).contains("interrupted"),
                "{trial}: finishing: {}{}",
                stdout(&fin),
                stderr(&fin)
            );
        } else if r.manifest("b")["base"] != tip.as_str() {
            // Before the commit point: the old box is whole, and a new rebase goes through.
            untouched += 1;
            let again = r.h5i(&["box", "rebase", "b"]);
            assert!(
                again.status.success(),
                "{trial}: rebase again: {}",
                stderr(&again)
            );
        }
        rebased_whole(&r, i, &trial);
        box_whole(&r, "b", &trial);
    }
    eprintln!(
        "rebase_killed: {journaled} trial(s) finished from the journal, {untouched} left untouched, {} completed before the kill",
        TRIALS - journaled - untouched
    );
    parent_sound(&r, "rebase");
    r.ok(&[
        "box",
        "export",
        "b",
        "--out",
        r.path().join("out").to_str().unwrap(),
    ]);
}
