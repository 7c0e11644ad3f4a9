//! The box sees its workspace at `/work` (issue 22), asserted from inside real boxes at the
//! process, supervised and container tiers: every run starts there, and nothing the box reads
//! from `pwd`, its environment, `/proc/self/environ`, its mount points or its git names the
//! host path of the workspace or of the parent repository (which holds the box store under its
//! `.git/.h5i`). The box's git still works in `/work` (its borrowed objects are at
//! `/.h5i/objects`), and what it writes there is what `box diff` and `box export` show.
//!
//! The supervised tier names a network namespace on the host, so its cases run as root (CI);
//! the process tier's run as whoever runs the suite. The container tier's run as root (whose
//! engine is the test user's rootless Podman) and as the test user itself, in the test image
//! with git (`scripts/make-test-image.sh --git`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::Output;

use common::caller::{container_git_image, Caller};
use common::{stderr, stdout, Repo};

/// A repository whose boxes at `tier` use the default confinement (system paths read-only,
/// `$WORK` read-write), with one box `name`.
fn boxed(tier: &str, name: &str) -> Repo {
    let r = Repo::new();
    r.write_policy(&format!("[profile.t]\nisolation = \"{tier}\"\n"));
    r.ok(&["box", "create", name, "--profile", "t"]);
    r
}

fn run(r: &Repo, name: &str, script: &str) -> Output {
    r.h5i(&["box", "run", name, "--", "sh", "-c", script])
}

fn ok(r: &Repo, name: &str, script: &str) -> String {
    let out = run(r, name, script);
    assert!(
        out.status.success(),
        "`{script}` failed in the box: {}{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// Whether `tier` can run here (supervised needs root).
fn runnable(tier: &str, test: &str) -> bool {
    tier != "supervised" || common::require_root(test, "a supervised box names a netns")
}

/// The host strings the box must never see: the parent repository's path (which every host
/// path of the box starts with) and the store's layout under its `.git`.
fn host_names(r: &Repo, name: &str) -> Vec<String> {
    host_names_of(r.path(), &r.workspace(name))
}

fn host_names_of(repo: &Path, ws: &Path) -> Vec<String> {
    assert!(ws.starts_with(repo), "the store is under the repository");
    vec![
        repo.display().to_string(),
        ws.display().to_string(),
        ".git/.h5i".to_string(),
    ]
}

fn the_box_starts_in_work_and_its_environment_names_no_host_path_at(tier: &str) {
    let r = boxed(tier, "w");
    let out = ok(
        &r,
        "w",
        "pwd; readlink /proc/self/cwd; echo \"HOME=$HOME\"; echo \"SPOOL=$H5I_ENV_CAPTURE_SPOOL\"",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        ["/work", "/work", "HOME=/.h5i/home", "SPOOL=/.h5i/spool"],
        "{tier}"
    );
    // The box's own view of its environment, both as the shell exports it and as the kernel
    // holds it for the process.
    let seen = ok(
        &r,
        "w",
        "env; tr '\\0' '\\n' < /proc/self/environ; cat .git/objects/info/alternates",
    );
    assert!(seen.contains("PWD=/work"), "{tier}: {seen}");
    assert!(seen.contains("/.h5i/objects"), "{tier}: {seen}");
    for host in host_names(&r, "w") {
        assert!(
            !seen.contains(&host),
            "{tier}: the box sees `{host}`:\n{seen}"
        );
    }
    // And grep in the box finds nothing either (exit 1: no line matched).
    for host in host_names(&r, "w") {
        let out = r.h5i(&[
            "box",
            "run",
            "w",
            "--",
            "grep",
            "-F",
            "-e",
            &host,
            "/proc/self/environ",
        ]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{tier}: grep for `{host}` in the box's environ: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    // The host's view is unchanged: the workspace is still where h5i keeps it.
    assert!(r.workspace("w").join(".git").is_dir());
}

#[test]
fn the_box_starts_in_work_and_its_environment_names_no_host_path_at_the_process_tier() {
    the_box_starts_in_work_and_its_environment_names_no_host_path_at("process");
}

#[test]
fn the_box_starts_in_work_and_its_environment_names_no_host_path_at_the_supervised_tier() {
    if runnable(
        "supervised",
        "the_box_starts_in_work_..._at_the_supervised_tier",
    ) {
        the_box_starts_in_work_and_its_environment_names_no_host_path_at("supervised");
    }
}

fn git_works_in_work_and_what_the_box_writes_is_diffed_and_exported_at(tier: &str) {
    let r = boxed(tier, "g");
    // `git status` and `git log` read the base through the borrowed objects: without them the
    // box's git fails with "bad object HEAD".
    let status = ok(
        &r,
        "g",
        "git status --porcelain=v1 --branch && git log --oneline -1",
    );
    assert!(status.contains("## h5i/g"), "{tier}: {status}");
    ok(
        &r,
        "g",
        "echo from-the-box > made-in-box.txt && git diff --quiet && git add made-in-box.txt \
         && git -c user.name=box -c user.email=box@example.com commit -q -m 'in the box' \
         && echo second >> made-in-box.txt && git diff --stat",
    );
    the_write_is_on_the_host_in_diff_and_export(
        tier,
        |args| r.ok(args),
        &r.box_dir("g"),
        r.path(),
        None,
    );
}

/// What box `g` wrote in `/work` (`made-in-box.txt`: `from-the-box`, `second`) is in its
/// workspace on the host, in `box diff` and in the export's patch; the run receipts record the
/// commands as the box ran them, with no host path of the parent `repo`. `ok` runs h5i as the
/// caller; `owner`, when set, owns the export's directory.
fn the_write_is_on_the_host_in_diff_and_export(
    label: &str,
    ok: impl Fn(&[&str]) -> String,
    box_dir: &Path,
    repo: &Path,
    owner: Option<u32>,
) {
    let host = std::fs::read_to_string(box_dir.join("workspace/made-in-box.txt")).unwrap();
    assert_eq!(host, "from-the-box\nsecond\n", "{label}");
    let diff = ok(&["box", "diff", "g"]);
    assert!(
        diff.contains("made-in-box.txt") && diff.contains("+second"),
        "{label}: {diff}"
    );
    let out = tempfile::tempdir().unwrap();
    if let Some(uid) = owner {
        std::os::unix::fs::chown(out.path(), Some(uid), Some(uid)).unwrap();
    }
    let dest = out.path().join("review");
    ok(&["box", "export", "g", "--out", dest.to_str().unwrap()]);
    let patch = std::fs::read_to_string(dest.join("patch.diff")).unwrap();
    assert!(
        patch.contains("made-in-box.txt") && patch.contains("+second"),
        "{label}: {patch}"
    );
    let receipts = std::fs::read_to_string(box_dir.join("receipts.jsonl")).unwrap();
    assert!(
        !receipts.contains(&repo.display().to_string()),
        "{label}: {receipts}"
    );
}

#[test]
fn git_works_in_work_and_what_the_box_writes_is_diffed_and_exported_at_the_process_tier() {
    git_works_in_work_and_what_the_box_writes_is_diffed_and_exported_at("process");
}

#[test]
fn git_works_in_work_and_what_the_box_writes_is_diffed_and_exported_at_the_supervised_tier() {
    if runnable("supervised", "git_works_in_work_..._at_the_supervised_tier") {
        git_works_in_work_and_what_the_box_writes_is_diffed_and_exported_at("supervised");
    }
}

#[test]
fn the_borrowed_objects_and_the_in_box_alternates_are_read_only() {
    let r = boxed("process", "ro");
    let out = run(
        &r,
        "ro",
        "echo /elsewhere > .git/objects/info/alternates; echo alt=$?; \
         touch /.h5i/objects/planted; echo obj=$?",
    );
    let text = stdout(&out);
    for what in ["alt", "obj"] {
        assert!(
            text.contains(&format!("{what}=")) && !text.contains(&format!("{what}=0")),
            "{what}: {text}"
        );
    }
    let host =
        std::fs::read_to_string(r.workspace("ro").join(".git/objects/info/alternates")).unwrap();
    assert!(
        host.trim_end().ends_with("/objects") && host.starts_with(&r.path().display().to_string()),
        "the host's alternates still names the store: {host}"
    );
}

#[test]
fn a_work_subpath_write_grant_is_writable_at_work() {
    let r = Repo::new();
    r.write_policy(
        "[profile.t]\nisolation = \"process\"\n[profile.t.fs]\nwrite = [\"$WORK/out\"]\n",
    );
    std::fs::create_dir(r.path().join("out")).unwrap();
    std::fs::write(r.path().join("out/keep"), "").unwrap();
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", "out"]);
    r.ok(&["box", "create", "sub", "--profile", "t"]);
    ok(&r, "sub", "echo made > /work/out/made && cd out && pwd");
    assert_eq!(
        std::fs::read_to_string(r.workspace("sub").join("out/made")).unwrap(),
        "made\n"
    );
}

#[test]
fn a_policy_grant_over_the_in_box_workspace_is_refused() {
    let r = Repo::new();
    r.write_policy("[profile.t]\nisolation = \"process\"\n[profile.t.fs]\nread = [\"/work/x\"]\n");
    r.ok(&["box", "create", "over", "--profile", "t"]);
    let out = run(&r, "over", "true");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("refusing:") && err.contains("/work/x") && err.contains("to fix:"),
        "{err}"
    );
}

#[test]
fn a_process_tier_service_runs_in_work() {
    let r = Repo::new();
    r.write_policy(
        "[profile.t]\nisolation = \"process\"\n[service.where]\ncommand = \"pwd > service-cwd.txt; exec sleep 600\"\n",
    );
    r.ok(&["box", "create", "svc", "--profile", "t"]);
    r.ok(&["box", "service", "start", "svc", "where"]);
    let file = r.workspace("svc").join("service-cwd.txt");
    // Bounded: the readiness marker comes before the command runs.
    let mut seen = String::new();
    for _ in 0..100 {
        seen = std::fs::read_to_string(&file).unwrap_or_default();
        if seen.ends_with('\n') {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    r.ok(&["box", "service", "stop", "svc", "where"]);
    assert_eq!(seen, "/work\n");
}

/// A container box `name` in the git test image, run by root (whose engine is the test user's
/// rootless Podman) or by the test user; `None` (after a loud skip) when not root.
fn container_box(test: &str, as_user: bool, name: &str) -> Option<Caller> {
    if !common::require_root(
        test,
        "the container tier runs the test user's rootless Podman (root switches to it)",
    ) {
        return None;
    }
    let mut c = Caller::either(as_user);
    eprintln!("{test}: container tier, as {}", c.who());
    c.create_container(name, container_git_image());
    Some(c)
}

fn in_container(c: &Caller, name: &str, script: &str) -> String {
    let out = c.h5i(&["box", "run", name, "--", "sh", "-c", script]);
    assert!(
        out.status.success(),
        "`{script}` failed in the container box as {}: {}{}",
        c.who(),
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

fn a_container_box_starts_in_work_and_sees_no_host_path_of_the_parent(test: &str, as_user: bool) {
    let Some(c) = container_box(test, as_user, "w") else {
        return;
    };
    let who = c.who();
    let out = in_container(
        &c,
        "w",
        "pwd; readlink /proc/self/cwd; cat .git/objects/info/alternates; echo ---; \
         env; tr '\\0' '\\n' < /proc/self/environ; echo ---; awk '{print $5}' /proc/self/mountinfo",
    );
    let mut parts = out.split("---\n");
    let (head, env, mounts) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    assert_eq!(
        head.lines().collect::<Vec<_>>(),
        ["/work", "/work", "/.h5i/objects"],
        "{who}: {out}"
    );
    assert!(env.contains("PWD=/work"), "{who}: {env}");
    // The borrowed objects and the in-box alternates are mounted where the box expects them,
    // and no mount point is a host path (the sources in mountinfo's fourth field aside).
    for want in [
        "/work",
        "/.h5i/objects",
        "/work/.git/objects/info/alternates",
        "/.h5i/spool",
    ] {
        assert!(
            mounts.lines().any(|l| l == want),
            "{who}: {want} is not a mount point:\n{mounts}"
        );
    }
    for host in host_names_of(&c.repo(), &c.workspace("w")) {
        assert!(!out.contains(&host), "{who}: the box sees `{host}`:\n{out}");
    }
    // The host's own alternates still names the store, for h5i's host-side git.
    let host_alt =
        std::fs::read_to_string(c.workspace("w").join(".git/objects/info/alternates")).unwrap();
    assert!(
        host_alt.starts_with(&c.repo().display().to_string()),
        "{who}: {host_alt}"
    );
    // The bind is read-only: the box cannot point its git elsewhere, or plant an object.
    let out = c.h5i(&[
        "box",
        "run",
        "w",
        "--",
        "sh",
        "-c",
        "echo /elsewhere > .git/objects/info/alternates; echo alt=$?; \
         touch /.h5i/objects/planted; echo obj=$?",
    ]);
    let text = stdout(&out);
    for what in ["alt", "obj"] {
        assert!(
            text.contains(&format!("{what}=")) && !text.contains(&format!("{what}=0")),
            "{who}: {what}: {text}{}",
            stderr(&out)
        );
    }
    // And `status` calls the spec Podman handed the runtime a match for the policy.
    let status = c.ok(&["box", "status", "w"]);
    assert!(
        status.contains("matches the policy: yes"),
        "{who}: {status}"
    );
}

#[test]
fn a_container_box_starts_in_work_and_sees_no_host_path_of_the_parent_as_root() {
    a_container_box_starts_in_work_and_sees_no_host_path_of_the_parent(
        "a_container_box_starts_in_work_..._as_root",
        false,
    );
}

#[test]
fn a_container_box_starts_in_work_and_sees_no_host_path_of_the_parent_as_the_test_user() {
    a_container_box_starts_in_work_and_sees_no_host_path_of_the_parent(
        "a_container_box_starts_in_work_..._as_the_test_user",
        true,
    );
}

fn git_works_in_a_container_box_and_its_writes_are_diffed_and_exported(test: &str, as_user: bool) {
    let Some(c) = container_box(test, as_user, "g") else {
        return;
    };
    let who = c.who();
    // The base's commits resolve through /.h5i/objects: without the borrowed objects the box's
    // git fails with "bad object HEAD".
    let status = in_container(
        &c,
        "g",
        "git status --porcelain=v1 --branch && git log --oneline -1",
    );
    assert!(status.contains("## h5i/g"), "{who}: {status}");
    assert!(status.contains("initial"), "{who}: {status}");
    in_container(
        &c,
        "g",
        "echo from-the-box > made-in-box.txt && git add made-in-box.txt \
         && git -c user.name=box -c user.email=box@example.com commit -q -m 'in the box' \
         && echo second >> made-in-box.txt && git log --oneline -1",
    );
    the_write_is_on_the_host_in_diff_and_export(
        who,
        |args| c.ok(args),
        &c.box_dir("g"),
        &c.repo(),
        Some(c.uid()),
    );
}

#[test]
fn git_works_in_a_container_box_and_its_writes_are_diffed_and_exported_as_root() {
    git_works_in_a_container_box_and_its_writes_are_diffed_and_exported(
        "git_works_in_a_container_box_..._as_root",
        false,
    );
}

#[test]
fn git_works_in_a_container_box_and_its_writes_are_diffed_and_exported_as_the_test_user() {
    git_works_in_a_container_box_and_its_writes_are_diffed_and_exported(
        "git_works_in_a_container_box_..._as_the_test_user",
        true,
    );
}
