//! The box spine end to end on real git repositories: every source kind, every verb, and the
//! refusals, through the real `h5i` binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{git, stderr, stdout, Repo};

const WS: &str = "--isolation=workspace";

#[test]
fn create_from_this_repo_pins_the_base_and_gives_the_box_its_own_repository() {
    let r = Repo::new();
    let head = r.git(&["rev-parse", "HEAD"]);
    r.ok(&["box", "create", "fix", WS]);
    let m = r.manifest("fix");
    assert_eq!(m["base"], head);
    assert_eq!(m["source"]["kind"], "worktree");
    assert_eq!(m["source"]["parent_branch"], "main");
    // The pin lives in the parent, where the box cannot reach it.
    assert_eq!(r.git(&["rev-parse", "refs/h5i/boxes/fix/base"]), head);
    let ws = r.workspace("fix");
    assert_eq!(
        std::fs::read_to_string(ws.join("README.md")).unwrap(),
        "hello\n"
    );
    // The box's git is a repository of its own on its own branch, borrowing the parent's objects.
    assert!(ws.join(".git").is_dir());
    assert_eq!(git(&ws, &["symbolic-ref", "HEAD"]), "refs/heads/h5i/fix");
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    let alternates = std::fs::read_to_string(ws.join(".git/objects/info/alternates")).unwrap();
    assert!(alternates.trim().ends_with(".git/objects"), "{alternates}");
    // The parent has no branch or worktree entry the box could move.
    assert!(!r.git(&["branch", "--list"]).contains("h5i/fix"));
}

#[test]
fn box_dot_is_shorthand_for_create_and_derives_a_name() {
    let r = Repo::new();
    let out = r.ok(&["box", ".", WS]);
    assert!(out.contains("created box"), "{out}");
    let ls = r.ok(&["box", "ls"]);
    assert_eq!(ls.lines().count(), 1, "{ls}");
    let name = ls.split_whitespace().next().unwrap().to_string();
    assert!(name.ends_with("-1"), "{name}");
    r.ok(&["box", ".", WS]);
    assert!(r.ok(&["box", "ls"]).contains(&name.replace("-1", "-2")));
}

#[test]
fn create_from_a_revision_pins_that_revision() {
    let r = Repo::new();
    let first = r.git(&["rev-parse", "HEAD"]);
    std::fs::write(r.path().join("README.md"), "second\n").unwrap();
    r.git(&["commit", "-qam", "second"]);
    r.ok(&["box", "create", "old", "--from", &first, WS]);
    assert_eq!(r.manifest("old")["base"], first);
    assert_eq!(
        std::fs::read_to_string(r.workspace("old").join("README.md")).unwrap(),
        "hello\n"
    );
    // A sha names no branch, so apply has nowhere to land.
    assert!(r.manifest("old")["source"]["parent_branch"].is_null());
}

fn origin_with_pull_request() -> (tempfile::TempDir, String) {
    let origin = tempfile::tempdir().unwrap();
    git(origin.path(), &["init", "-q", "--bare"]);
    let work = Repo::new();
    std::fs::write(work.path().join("pr.txt"), "from the PR\n").unwrap();
    work.git(&["add", "pr.txt"]);
    work.git(&["commit", "-qm", "pr change"]);
    let sha = work.git(&["rev-parse", "HEAD"]);
    work.git(&[
        "push",
        "-q",
        origin.path().to_str().unwrap(),
        "HEAD:refs/pull/7/head",
    ]);
    (origin, sha)
}

#[test]
fn create_from_a_pull_request_fetches_its_head_into_a_detached_box() {
    let (origin, sha) = origin_with_pull_request();
    let r = Repo::new();
    r.git(&["remote", "add", "origin", origin.path().to_str().unwrap()]);
    r.ok(&["box", "--pr", "#7", WS]);
    let m = r.manifest("pr-7-1");
    assert_eq!(m["base"], sha);
    assert_eq!(m["source"]["kind"], "pull-request");
    let ws = r.workspace("pr-7-1");
    assert_eq!(
        std::fs::read_to_string(ws.join("pr.txt")).unwrap(),
        "from the PR\n"
    );
    assert_eq!(git(&ws, &["remote"]), "", "a detached box holds no remote");
    // Nothing was fetched into this repository.
    assert!(!r.path().join(".git/FETCH_HEAD").exists());

    // The URL form names the repository and the number.
    let url = format!("{}/pull/7", origin.path().display());
    r.ok(&["box", "create", "pr-url", "--pr", &url, WS]);
    assert_eq!(r.manifest("pr-url")["base"], sha);
}

#[test]
fn a_pull_request_that_does_not_exist_is_refused_and_leaves_nothing() {
    let (origin, _) = origin_with_pull_request();
    let r = Repo::new();
    r.git(&["remote", "add", "origin", origin.path().to_str().unwrap()]);
    let out = r.h5i(&["box", "create", "nope", "--pr", "99", WS]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("refusing:") && stderr(&out).contains("to fix:"),
        "{}",
        stderr(&out)
    );
    assert!(!r.h5i_dir().exists(), "a refused create left state behind");
}

#[test]
fn create_from_a_clone_is_detached_and_drops_origin() {
    let upstream = Repo::new();
    let sha = upstream.git(&["rev-parse", "HEAD"]);
    let r = Repo::new();
    std::fs::write(r.path().join("other.txt"), "x\n").unwrap();
    r.git(&["add", "other.txt"]);
    r.git(&["commit", "-qm", "diverge"]);
    r.ok(&[
        "box",
        upstream.path().to_str().unwrap(),
        "--name",
        "ext",
        WS,
    ]);
    let m = r.manifest("ext");
    assert_eq!(m["base"], sha);
    assert_eq!(m["source"]["kind"], "clone");
    let dir = r.box_dir("ext");
    assert_eq!(git(&dir.join("base.git"), &["remote"]), "");
    assert_eq!(git(&r.workspace("ext"), &["remote"]), "");
    assert!(!r.workspace("ext").join("other.txt").exists());
}

#[test]
fn the_external_repositorys_own_policy_is_never_used() {
    let upstream = Repo::new();
    // Were this file read, create would fail on it; the clone's policy comes from this clone.
    upstream.write_policy("this is = [ not toml");
    upstream.git(&["add", "-A"]);
    upstream.git(&["commit", "-qm", "hostile policy"]);
    let r = Repo::new();
    r.ok(&[
        "box",
        "create",
        "ext",
        "--clone",
        upstream.path().to_str().unwrap(),
        WS,
    ]);
    let policy = std::fs::read_to_string(r.box_dir("ext").join("policy.resolved.toml")).unwrap();
    assert!(policy.contains("profile = \"default\""), "{policy}");
}

#[test]
fn create_new_is_one_empty_commit() {
    let r = Repo::new();
    r.ok(&["box", "create", "blank", "--new", WS]);
    let ws = r.workspace("blank");
    assert_eq!(git(&ws, &["rev-list", "--count", "HEAD"]), "1");
    assert_eq!(git(&ws, &["ls-tree", "HEAD"]), "");
    assert_eq!(r.manifest("blank")["source"]["kind"], "new");
}

#[test]
fn refusals_at_create_leave_nothing_on_disk() {
    let r = Repo::new();
    let cases: &[&[&str]] = &[
        &["box", "create", "a", "--profile", "no-such-profile"],
        &["box", "create", "a", "--isolation", "fortress"],
        &["box", "create", "a", "--from", "no-such-rev", WS],
        &["box", "create", "a", "--from=--upload-pack=x", WS],
        &["box", "create", "a", "--clone", "/nonexistent/repo", WS],
        &["box", "create", "a", "--clone", "ext::sh -c id", WS],
        &["box", "create", "Bad/Name", WS],
        &["box", "create", "a", "--isolation", "microvm"],
    ];
    for args in cases {
        let out = r.h5i(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let e = stderr(&out);
        assert!(
            e.contains("refusing:") && e.contains("to fix:"),
            "{args:?}: {e}"
        );
        assert!(!r.h5i_dir().exists(), "{args:?} left state behind");
    }
}

#[test]
fn an_agent_box_whose_agent_is_not_installed_is_refused_at_create_and_leaves_nothing() {
    if !common::require_root(
        "an_agent_box_whose_agent_is_not_installed_...",
        "it empties /usr/local in a mount namespace of its own",
    ) {
        return;
    }
    let r = Repo::new();
    // This h5i alone sees /usr/local/{bin,sbin} empty: the pinned agents `make setup` installs
    // are not where a kernel-tier box could run them.
    let hidden = "mount -t tmpfs -o ro tmpfs /usr/local/bin && mount -t tmpfs -o ro tmpfs /usr/local/sbin && exec \"$0\" \"$@\"";
    for (profile, agent) in [("agent-claude", "claude"), ("agent-codex", "codex")] {
        let out = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", hidden])
            .arg(common::H5I)
            .args(["box", "create", "a", "--profile", profile])
            .args(["--isolation", "process"])
            .env_remove("H5I_AGENT")
            .current_dir(r.path())
            .output()
            .unwrap();
        let e = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{profile}: {e}");
        assert!(
            e.contains(&format!("`{agent}` is not installed"))
                && e.contains("to fix: run `make setup`"),
            "{profile}: {e}"
        );
        assert!(
            !r.h5i_dir().exists(),
            "{profile}: the refused create left state"
        );
    }
}

#[test]
fn a_second_box_with_the_same_name_is_refused() {
    let r = Repo::new();
    r.ok(&["box", "create", "dup", WS]);
    let out = r.h5i(&["box", "create", "dup", WS]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("already exists"));
}

#[test]
fn run_passes_the_exit_code_through_and_records_a_host_observed_receipt() {
    let r = Repo::new();
    r.ok(&["box", "create", "r", WS]);
    let out = r.h5i(&[
        "box",
        "run",
        "r",
        "--",
        "sh",
        "-c",
        "echo in-box; exit 3",
        "a b",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(stdout(&out), "in-box\n");
    let recs = r.receipts("r");
    assert_eq!(recs.len(), 1);
    let rec = &recs[0];
    assert_eq!(rec["lane"], "host-env-run");
    assert_eq!(rec["seq"], 1);
    assert_eq!(rec["kind"], "run");
    assert_eq!(
        rec["argv"],
        serde_json::json!(["sh", "-c", "echo in-box; exit 3", "a b"])
    );
    assert_eq!(rec["exit"]["code"], 3);
    assert_eq!(rec["policy_digest"], r.manifest("r")["policy_digest"]);
    assert!(rec["rusage"]["maxrss_kb"].as_u64().unwrap() > 0);
    // The command ran in the workspace, not the parent.
    let out = r.h5i(&["box", "run", "r", "--", "sh", "-c", "pwd; echo $H5I_ENV_ID"]);
    let text = stdout(&out);
    assert!(
        text.lines().next().unwrap().ends_with("/r/workspace"),
        "{text}"
    );
    assert_eq!(text.lines().nth(1), Some("r"));
}

#[test]
fn the_wall_clock_limit_kills_and_exits_124() {
    let r = Repo::new();
    r.write_policy(
        "[profile.quick]\nisolation = \"workspace\"\n[profile.quick.resources]\nwall = \"1s\"\n",
    );
    r.ok(&["box", "create", "slow", "--profile", "quick"]);
    let started = std::time::Instant::now();
    let out = r.h5i(&[
        "box",
        "run",
        "slow",
        "--",
        "sh",
        "-c",
        "sleep 60 & sleep 60",
    ]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert!(stderr(&out).contains("wall-clock"));
    let rec = &r.receipts("slow")[0];
    assert_eq!(rec["exit"]["timed_out"], true);
}

#[test]
fn a_signal_death_exits_128_plus_the_signal() {
    let r = Repo::new();
    r.ok(&["box", "create", "sig", WS]);
    let out = r.h5i(&["box", "run", "sig", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(137));
    assert_eq!(r.receipts("sig")[0]["exit"]["signal"], 9);
}

#[test]
fn run_refusals_exit_125_and_a_missing_command_127() {
    let r = Repo::new();
    let out = r.h5i(&["box", "run", "ghost", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("no box named `ghost`"));
    r.ok(&["box", "create", "b", WS]);
    let out = r.h5i(&["box", "run", "b", "--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(127));
    r.ok(&["box", "abort", "b"]);
    let out = r.h5i(&["box", "run", "b", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("is aborted"), "{}", stderr(&out));
}

#[test]
fn a_tampered_policy_is_refused_never_repaired() {
    let r = Repo::new();
    r.ok(&["box", "create", "t", WS]);
    let p = r.box_dir("t").join("policy.resolved.toml");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, text.replace("mode = \"deny\"", "mode = \"host\"")).unwrap();
    let out = r.h5i(&["box", "run", "t", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).contains("does not match its digest"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&p).unwrap(),
        text.replace("mode = \"deny\"", "mode = \"host\"")
    );
}

#[test]
fn diff_and_status_and_log_show_what_happened() {
    let r = Repo::new();
    r.ok(&["box", "create", "d", WS]);
    r.ok(&[
        "box",
        "run",
        "d",
        "--",
        "sh",
        "-c",
        "echo changed >> README.md; echo new > added.txt",
    ]);
    let diff = r.ok(&["box", "diff", "d"]);
    assert!(diff.contains("+changed"), "{diff}");
    assert!(diff.contains("added.txt"), "{diff}");
    let stat = r.ok(&["box", "diff", "d", "--stat"]);
    assert!(stat.contains("2 files changed"), "{stat}");
    let status = r.ok(&["box", "status", "d"]);
    assert!(status.contains("tier       workspace"), "{status}");
    assert!(status.contains("1 host-observed"), "{status}");
    assert!(
        status.contains(" *"),
        "the workspace tier must mark what it does not enforce: {status}"
    );
    assert!(status.contains("base drift none"), "{status}");
    std::fs::write(r.path().join("x"), "x").unwrap();
    r.git(&["add", "x"]);
    r.git(&["commit", "-qm", "advance"]);
    assert!(r.ok(&["box", "status", "d"]).contains("1 commit(s) ahead"));
    let log = r.ok(&["box", "log", "d"]);
    assert!(
        log.contains("created") && log.contains("receipt #1"),
        "{log}"
    );
}

#[test]
fn export_writes_a_bundle_whose_patch_applies_onto_the_base() {
    let r = Repo::new();
    r.ok(&["box", "create", "e", WS]);
    r.ok(&["box", "run", "e", "--", "sh", "-c", "printf 'one\\n2\\nthree\\n' > src/lib.txt; printf '\\000\\001bin' > blob.bin; rm README.md"]);
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("review");
    r.ok(&["box", "export", "e", "--out", dest.to_str().unwrap()]);
    for f in ["patch.diff", "report.md", "receipt.json"] {
        assert!(dest.join(f).is_file(), "{f}");
    }
    let fresh = Repo::new();
    fresh.git(&["apply", "--3way", dest.join("patch.diff").to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(fresh.path().join("src/lib.txt")).unwrap(),
        "one\n2\nthree\n"
    );
    assert_eq!(
        std::fs::read(fresh.path().join("blob.bin")).unwrap(),
        b"\x00\x01bin"
    );
    assert!(!fresh.path().join("README.md").exists());
    let receipt: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dest.join("receipt.json")).unwrap()).unwrap();
    assert_eq!(receipt["policy_digest"], r.manifest("e")["policy_digest"]);
    assert_eq!(receipt["records"].as_array().unwrap().len(), 1);
    // A second export into the same non-empty directory is refused; --force replaces it.
    let again = r.h5i(&["box", "export", "e", "--out", dest.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
    r.ok(&[
        "box",
        "export",
        "e",
        "--out",
        dest.to_str().unwrap(),
        "--force",
    ]);
}

#[test]
fn apply_lands_a_worktree_box_on_its_parent_branch() {
    let r = Repo::new();
    r.ok(&["box", "create", "a", WS]);
    r.ok(&[
        "box",
        "run",
        "a",
        "--",
        "sh",
        "-c",
        "echo applied > new.txt",
    ]);
    let out = r.ok(&["box", "apply", "a"]);
    assert!(out.contains("merged into main"), "{out}");
    assert_eq!(
        std::fs::read_to_string(r.path().join("new.txt")).unwrap(),
        "applied\n"
    );
    assert_eq!(r.git(&["log", "-1", "--format=%s"]), "h5i: apply box a");
    assert_eq!(r.manifest("a")["state"], "applied");
    let again = r.h5i(&["box", "apply", "a"]);
    assert_eq!(again.status.code(), Some(1));
}

#[test]
fn apply_refuses_a_dirty_parent_a_wrong_branch_and_a_detached_box() {
    let r = Repo::new();
    r.ok(&["box", "create", "a", WS]);
    r.ok(&["box", "run", "a", "--", "sh", "-c", "echo x > new.txt"]);
    let head = r.git(&["rev-parse", "HEAD"]);

    std::fs::write(r.path().join("README.md"), "dirty\n").unwrap();
    let out = r.h5i(&["box", "apply", "a"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("uncommitted changes"),
        "{}",
        stderr(&out)
    );
    r.git(&["checkout", "--", "README.md"]);

    r.git(&["switch", "-q", "-c", "other"]);
    let out = r.h5i(&["box", "apply", "a"]);
    assert!(stderr(&out).contains("not on `main`"), "{}", stderr(&out));
    r.git(&["switch", "-q", "main"]);
    assert_eq!(
        r.git(&["rev-parse", "HEAD"]),
        head,
        "a refusal moved the branch"
    );
    assert_eq!(r.manifest("a")["state"], "active");

    r.ok(&["box", "create", "n", "--new", WS]);
    let out = r.h5i(&["box", "apply", "n"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("detached") && stderr(&out).contains("h5i box export"),
        "{}",
        stderr(&out)
    );
    let out = r.h5i(&["box", "rebase", "n"]);
    assert!(stderr(&out).contains("detached"), "{}", stderr(&out));
}

#[test]
fn rebase_carries_the_box_onto_the_new_tip() {
    let r = Repo::new();
    r.ok(&["box", "create", "rb", WS]);
    r.ok(&[
        "box",
        "run",
        "rb",
        "--",
        "sh",
        "-c",
        "echo box >> src/lib.txt",
    ]);
    std::fs::write(r.path().join("README.md"), "parent moved\n").unwrap();
    r.git(&["commit", "-qam", "parent"]);
    let tip = r.git(&["rev-parse", "HEAD"]);
    r.ok(&["box", "rebase", "rb"]);
    assert_eq!(r.manifest("rb")["base"], tip);
    assert_eq!(r.git(&["rev-parse", "refs/h5i/boxes/rb/base"]), tip);
    let ws = r.workspace("rb");
    assert_eq!(
        std::fs::read_to_string(ws.join("README.md")).unwrap(),
        "parent moved\n"
    );
    assert!(std::fs::read_to_string(ws.join("src/lib.txt"))
        .unwrap()
        .ends_with("box\n"));
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), tip);
    assert_eq!(git(&ws, &["status", "--porcelain"]), " M src/lib.txt");
    let diff = r.ok(&["box", "diff", "rb"]);
    assert!(
        diff.contains("+box") && !diff.contains("parent moved"),
        "{diff}"
    );
}

#[test]
fn a_conflicting_rebase_is_refused_and_changes_nothing() {
    let r = Repo::new();
    r.ok(&["box", "create", "c", WS]);
    r.ok(&["box", "run", "c", "--", "sh", "-c", "echo box > README.md"]);
    std::fs::write(r.path().join("README.md"), "parent\n").unwrap();
    r.git(&["commit", "-qam", "parent"]);
    let base = r.manifest("c")["base"].clone();
    let out = r.h5i(&["box", "rebase", "c"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("conflict"), "{}", stderr(&out));
    assert_eq!(r.manifest("c")["base"], base);
    assert_eq!(
        std::fs::read_to_string(r.workspace("c").join("README.md")).unwrap(),
        "box\n"
    );
}

#[test]
fn rm_refuses_unexported_changes_without_force_and_removes_the_pin() {
    let r = Repo::new();
    r.ok(&["box", "create", "gone", WS]);
    r.ok(&["box", "run", "gone", "--", "sh", "-c", "echo x > y"]);
    let out = r.h5i(&["box", "rm", "gone"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    r.ok(&["box", "rm", "gone", "--force"]);
    assert!(!r.ok(&["box", "ls"]).contains("gone"));
    let refs = r.git(&["for-each-ref", "refs/h5i/"]);
    assert!(refs.is_empty(), "{refs}");
    // A clean box goes without --force.
    r.ok(&["box", "create", "clean", WS]);
    r.ok(&["box", "rm", "clean"]);
}

#[test]
fn git_locks_a_killed_verb_left_on_pins_stop_neither_create_nor_rm() {
    let r = Repo::new();
    // What a `git update-ref` killed inside `create` leaves: the pin's own lock.
    std::fs::create_dir_all(r.path().join(".git/refs/h5i/boxes/p")).unwrap();
    std::fs::write(r.path().join(".git/refs/h5i/boxes/p/base.lock"), "").unwrap();
    r.ok(&["box", "create", "p", WS]);
    assert_eq!(
        r.git(&["rev-parse", "refs/h5i/boxes/p/base"]),
        r.git(&["rev-parse", "HEAD"])
    );
    // A `packed-refs.lock` (someone's git at work, or one killed) is not h5i's to take, and a
    // loose pin is removed without it.
    std::fs::write(r.path().join(".git/packed-refs.lock"), "").unwrap();
    r.ok(&["box", "rm", "p"]);
    assert!(r.git(&["for-each-ref", "refs/h5i/"]).is_empty());
    assert!(r.path().join(".git/packed-refs.lock").exists());
    std::fs::remove_file(r.path().join(".git/packed-refs.lock")).unwrap();
    // A packed pin goes through git, so packed-refs does not bring it back.
    r.ok(&["box", "create", "q", WS]);
    r.git(&["pack-refs", "--all"]);
    r.ok(&["box", "rm", "q"]);
    assert!(r.git(&["for-each-ref", "refs/h5i/"]).is_empty());
}

#[test]
fn gc_drops_a_pin_no_box_owns_and_keeps_every_boxs_own() {
    let r = Repo::new();
    r.ok(&["box", "create", "kept", WS]);
    // The pin a create or rm killed between the ref and the directory leaves.
    r.git(&["update-ref", "refs/h5i/boxes/ghost/base", "HEAD"]);
    // A create of the orphan's name takes the name over rather than refuse.
    r.git(&["update-ref", "refs/h5i/boxes/reborn/base", "HEAD"]);
    r.ok(&["box", "create", "reborn", WS]);
    r.ok(&["box", "gc"]);
    let pins = r.git(&["for-each-ref", "--format=%(refname)", "refs/h5i/"]);
    assert_eq!(
        pins, "refs/h5i/boxes/kept/base\nrefs/h5i/boxes/reborn/base",
        "{pins}"
    );
    r.ok(&["box", "doctor", "kept"]);
    r.ok(&["box", "doctor", "reborn"]);
}

#[test]
fn gc_reclaims_aborted_workspaces_and_keeps_their_receipts() {
    let r = Repo::new();
    r.ok(&["box", "create", "old", WS]);
    r.ok(&["box", "run", "old", "--", "true"]);
    r.ok(&["box", "create", "live", WS]);
    r.ok(&["box", "abort", "old"]);
    let out = r.ok(&["box", "gc"]);
    assert!(out.contains("reclaimed the workspace of old"), "{out}");
    assert!(!r.box_dir("old").join("workspace").exists());
    assert_eq!(r.receipts("old").len(), 1);
    assert!(r.workspace("live").exists());
}

#[test]
fn unknown_boxes_are_refused_by_every_verb() {
    let r = Repo::new();
    for verb in ["status", "diff", "log", "apply", "rebase", "abort", "rm"] {
        let out = r.h5i(&["box", verb, "ghost"]);
        assert_eq!(out.status.code(), Some(1), "{verb}");
        assert!(
            stderr(&out).contains("no box named `ghost`"),
            "{verb}: {}",
            stderr(&out)
        );
    }
    let out = r.h5i(&["box", "export", "ghost", "--out", "/tmp/never-written-h5i"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!std::path::Path::new("/tmp/never-written-h5i").exists());
}

#[test]
fn a_repository_under_tmp_works() {
    let dir = tempfile::Builder::new()
        .prefix("h5i-tmp-repo")
        .tempdir_in("/tmp")
        .unwrap();
    git(dir.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(dir.path().join("f"), "x\n").unwrap();
    git(dir.path(), &["add", "f"]);
    git(
        dir.path(),
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@x",
            "commit",
            "-qm",
            "i",
        ],
    );
    let out = common::h5i_in(dir.path(), &["box", "create", "tmpbox", WS], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = common::h5i_in(dir.path(), &["box", "run", "tmpbox", "--", "cat", "f"], &[]);
    assert_eq!(stdout(&out), "x\n");
}

#[test]
fn doctor_passes_a_healthy_box_and_names_each_broken_part() {
    let r = Repo::new();
    r.ok(&["box", "create", "doc", WS]);
    let out = r.ok(&["box", "doctor", "doc"]);
    for what in [
        "policy",
        "tier",
        "base",
        "pin",
        "workspace",
        "parent",
        "receipts",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(what) && l.contains(" ok ")),
            "{what}: {out}"
        );
    }
    // A moved pin, a damaged receipt line and a tampered policy are each named; nothing is fixed.
    r.git(&["commit", "-q", "--allow-empty", "-m", "elsewhere"]);
    r.git(&["update-ref", "refs/h5i/boxes/doc/base", "HEAD"]);
    std::fs::write(r.box_dir("doc").join("receipts.jsonl"), "{torn").unwrap();
    let p = r.box_dir("doc").join("policy.resolved.toml");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, text.replace("mode = \"deny\"", "mode = \"host\"")).unwrap();
    let out = r.h5i(&["box", "doctor", "doc"]);
    assert_eq!(out.status.code(), Some(1));
    let text_out = stdout(&out);
    for what in ["policy", "pin", "receipts"] {
        assert!(
            text_out
                .lines()
                .any(|l| l.starts_with(what) && l.contains("FAIL")),
            "{what}: {text_out}"
        );
    }
    assert!(text_out.contains("moved to"), "{text_out}");
    assert_eq!(
        std::fs::read_to_string(r.box_dir("doc").join("receipts.jsonl")).unwrap(),
        "{torn"
    );
}

/// The first section of report.md: everything before the first `## ` heading.
fn first_section(report: &str) -> &str {
    report.split("\n## ").next().unwrap_or_default()
}

#[test]
fn a_box_widening_its_policy_is_flagged_by_export_and_refused_by_apply_without_the_flag() {
    let r = Repo::new();
    r.write_policy("[profile.dev]\nisolation = \"process\"\n");
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", "policy"]);
    r.ok(&["box", "create", "w", "--isolation=workspace"]);
    let widened = "[profile.dev]\nisolation = \"workspace\"\n[profile.dev.net]\nmode = \"host\"\n[profile.dev.fs]\nwrite = [\"/\"]\n";
    std::fs::write(r.workspace("w").join(".h5i/env.toml"), widened).unwrap();

    let out_dir = tempfile::tempdir().unwrap();
    let review = out_dir.path().join("review");
    let printed = r.ok(&["box", "export", "w", "--out", review.to_str().unwrap()]);
    assert!(printed.contains("POLICY CHANGE"), "{printed}");
    let report = std::fs::read_to_string(review.join("report.md")).unwrap();
    let first = first_section(&report);
    for needle in [
        "POLICY CHANGE",
        ".h5i/env.toml",
        "profile `dev`: policy digest before sha256:",
        "after sha256:",
        "isolation process -> workspace",
        "network deny -> host",
        "fs.write + /",
    ] {
        assert!(
            first.contains(needle),
            "`{needle}` not in the first section:\n{first}"
        );
    }

    let head = r.git(&["rev-parse", "HEAD"]);
    let out = r.h5i(&["box", "apply", "w"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("refusing:")
            && err.contains(".h5i/env.toml")
            && err.contains("--allow-policy-change"),
        "{err}"
    );
    assert!(err.contains("network deny -> host"), "{err}");
    assert_eq!(
        r.git(&["rev-parse", "HEAD"]),
        head,
        "the refused apply moved the branch"
    );
    let widened_blob = {
        let p = out_dir.path().join("widened");
        std::fs::write(&p, widened).unwrap();
        r.git(&["hash-object", p.to_str().unwrap()])
    };
    let present = std::process::Command::new("git")
        .args(["cat-file", "-e", &widened_blob])
        .current_dir(r.path())
        .status()
        .unwrap();
    assert!(
        !present.success(),
        "a refused apply wrote the box's blob into the parent"
    );

    r.ok(&["box", "apply", "w", "--allow-policy-change"]);
    assert_eq!(r.git(&["show", "HEAD:.h5i/env.toml"]), widened.trim_end());
}

#[test]
fn export_and_apply_refuse_a_set_id_file_naming_it() {
    use std::os::unix::fs::PermissionsExt;
    let r = Repo::new();
    r.ok(&["box", "create", "s", "--isolation=workspace"]);
    let ws = r.workspace("s");
    let planted = ws.join("tool\x1b]0;x\x07");
    std::fs::write(&planted, "#!/bin/sh\nid\n").unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // A tracked file chmod'ed set-gid keeps its bytes and its git mode: still refused.
    std::fs::set_permissions(
        ws.join("README.md"),
        std::fs::Permissions::from_mode(0o2644),
    )
    .unwrap();

    let out_dir = tempfile::tempdir().unwrap();
    let review = out_dir.path().join("review");
    let out = r.h5i(&["box", "export", "s", "--out", review.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("refusing:") && err.contains("set-user-id or set-group-id"),
        "{err}"
    );
    assert!(
        err.contains("README.md") && err.contains("tool\\x1b]0;x\\x07"),
        "{err}"
    );
    assert!(err.contains("chmod ug-s"), "{err}");
    assert!(
        !err.contains('\x1b'),
        "a box-chosen name reached the terminal raw: {err:?}"
    );
    assert!(!review.exists(), "a refused export wrote its bundle");

    let head = r.git(&["rev-parse", "HEAD"]);
    let out = r.h5i(&["box", "apply", "s"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("set-user-id or set-group-id") && err.contains("chmod ug-s"),
        "{err}"
    );
    assert_eq!(r.git(&["rev-parse", "HEAD"]), head);

    // Mended, both go through.
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(ws.join("README.md"), std::fs::Permissions::from_mode(0o644)).unwrap();
    r.ok(&["box", "export", "s", "--out", review.to_str().unwrap()]);
}

#[test]
fn apply_merges_onto_a_branch_that_moved_on() {
    let r = Repo::new();
    r.ok(&["box", "create", "a", WS]);
    r.ok(&["box", "run", "a", "--", "sh", "-c", "echo boxed > new.txt"]);
    std::fs::write(r.path().join("other.txt"), "parent\n").unwrap();
    r.git(&["add", "other.txt"]);
    r.git(&["commit", "-q", "-m", "parent moved on"]);
    let tip = r.git(&["rev-parse", "HEAD"]);
    r.ok(&["box", "apply", "a"]);
    let parents = r.git(&["log", "-1", "--format=%P"]);
    assert!(parents.starts_with(&tip), "{parents}");
    assert_eq!(parents.split(' ').count(), 2, "{parents}");
    assert_eq!(
        std::fs::read_to_string(r.path().join("new.txt")).unwrap(),
        "boxed\n"
    );
    assert!(r.path().join("other.txt").exists());
    assert_eq!(r.git(&["status", "--porcelain"]), "");
    assert_eq!(r.manifest("a")["state"], "applied");
}

#[test]
fn apply_refuses_to_overwrite_an_untracked_file_and_moves_nothing() {
    let r = Repo::new();
    r.ok(&["box", "create", "a", WS]);
    r.ok(&["box", "run", "a", "--", "sh", "-c", "echo boxed > new.txt"]);
    std::fs::write(r.path().join("new.txt"), "mine\n").unwrap();
    let head = r.git(&["rev-parse", "HEAD"]);
    let out = r.h5i(&["box", "apply", "a"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("to fix:"), "{}", stderr(&out));
    assert_eq!(r.git(&["rev-parse", "HEAD"]), head);
    assert_eq!(
        std::fs::read_to_string(r.path().join("new.txt")).unwrap(),
        "mine\n"
    );
    assert!(!r.h5i_dir().join("landing.json").exists());
    assert_eq!(r.manifest("a")["state"], "active");
}

/// A landing cut off half-way, as a killed `apply` leaves it: the journal written, the work
/// tree part-way to the box's commit, the branch not yet moved.
fn cut_off_landing(r: &Repo, name: &str) -> String {
    let from = r.git(&["rev-parse", "HEAD"]);
    let scratch = tempfile::tempdir().unwrap();
    let index = scratch.path().join("index");
    let with_index = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(r.path())
            .env("GIT_INDEX_FILE", &index)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    with_index(&["read-tree", &from]);
    let blob = {
        std::fs::write(scratch.path().join("blob"), "landed\n").unwrap();
        r.git(&[
            "hash-object",
            "-w",
            scratch.path().join("blob").to_str().unwrap(),
        ])
    };
    with_index(&[
        "update-index",
        "--add",
        "--cacheinfo",
        &format!("100644,{blob},new.txt"),
    ]);
    with_index(&["update-index", "--force-remove", "src/lib.txt"]);
    let tree = with_index(&["write-tree"]);
    let to = r.git(&["commit-tree", &tree, "-p", &from, "-m", "h5i: apply box a"]);
    let plan = serde_json::json!({
        "name": name,
        "created_ms": r.manifest(name)["created_ms"],
        "branch": "main",
        "from": from,
        "to": to,
    });
    std::fs::write(
        r.h5i_dir().join("landing.json"),
        serde_json::to_vec(&plan).unwrap(),
    )
    .unwrap();
    // Half the work tree: the new file written, the removal not yet made.
    std::fs::write(r.path().join("new.txt"), "landed\n").unwrap();
    to
}

#[test]
fn a_cut_off_landing_is_finished_by_the_next_apply() {
    let r = Repo::new();
    r.ok(&["box", "create", "a", WS]);
    let to = cut_off_landing(&r, "a");
    // The index lock a git killed with the landing left behind.
    std::fs::write(r.path().join(".git/index.lock"), "").unwrap();
    let out = r.ok(&["box", "apply", "a"]);
    assert!(out.contains(&to), "{out}");
    assert_eq!(r.git(&["rev-parse", "HEAD"]), to);
    assert_eq!(r.git(&["status", "--porcelain"]), "");
    assert!(!r.path().join("src/lib.txt").exists());
    assert!(!r.h5i_dir().join("landing.json").exists());
    assert_eq!(r.manifest("a")["state"], "applied");
}

#[test]
fn a_cut_off_landing_for_another_box_is_finished_before_this_one_lands() {
    let r = Repo::new();
    r.ok(&["box", "create", "a", WS]);
    r.ok(&["box", "create", "b", WS]);
    r.ok(&["box", "run", "b", "--", "sh", "-c", "echo b > b.txt"]);
    let to = cut_off_landing(&r, "a");
    r.ok(&["box", "apply", "b"]);
    assert_eq!(r.manifest("a")["state"], "applied");
    assert_eq!(r.manifest("b")["state"], "applied");
    assert!(r.git(&["log", "--format=%H"]).contains(&to));
    assert!(r.path().join("b.txt").exists() && r.path().join("new.txt").exists());
    assert_eq!(r.git(&["status", "--porcelain"]), "");
}

#[test]
fn a_cut_off_landing_is_not_finished_over_a_persons_later_changes() {
    let r = Repo::new();
    r.ok(&["box", "create", "a", WS]);
    let from = r.git(&["rev-parse", "HEAD"]);
    cut_off_landing(&r, "a");
    // A person edits a file the landing does not touch, and git holds an older lock.
    std::fs::write(r.path().join("README.md"), "mine\n").unwrap();
    let out = r.h5i(&["box", "apply", "a"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("was cut off") && err.contains("README.md") && err.contains("landing.json"),
        "{err}"
    );
    assert_eq!(r.git(&["rev-parse", "HEAD"]), from);
    assert_eq!(
        std::fs::read_to_string(r.path().join("README.md")).unwrap(),
        "mine\n"
    );
    assert_eq!(r.manifest("a")["state"], "active");

    r.git(&["checkout", "--", "README.md"]);
    let lock = r.path().join(".git/index.lock");
    std::fs::write(&lock, "").unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&lock)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let out = r.h5i(&["box", "apply", "a"]);
    assert!(stderr(&out).contains("index.lock"), "{}", stderr(&out));
    assert!(lock.exists(), "another git's lock was removed");
    assert_eq!(r.git(&["rev-parse", "HEAD"]), from);

    std::fs::remove_file(&lock).unwrap();
    std::fs::write(r.h5i_dir().join("landing.json"), "{ not json").unwrap();
    let out = r.h5i(&["box", "apply", "a"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("landing.json"), "{}", stderr(&out));
    assert_eq!(r.git(&["rev-parse", "HEAD"]), from);
}
