//! Host verbs never trust what a box wrote (issue 13, findings 1 and 3; issue 12's set-id
//! report), asserted with real boxes at every kernel tier (process, supervised, container), as
//! root and as the unprivileged `h5i-test`:
//!
//! - discovery: run from inside a workspace where the box planted a fake store (a config with
//!   a `filter.x.clean` driver, attributes applying it, forged manifests full of escape
//!   sequences), `h5i box diff/ls/status/rm/doctor` resolve to the parent's store: the planted
//!   program never runs (its marker file stays absent) and nothing forged is printed raw;
//! - bounded reads: two sparse 2 GiB files, a `/dev/zero` symlink, fifos (over a tracked file,
//!   at `.git/objects/info/alternates`, as a `.gitignore`) under `diff`, `status`, `doctor`,
//!   `rm` and `log`: each returns within 60 s (a child killed on timeout) with its peak RSS (the
//!   kernel's `wait4` account, git children included) under 200 MB, and names what it skipped;
//! - streaming: four sparse files just under the per-file cap, every one a different blob, are
//!   read, hashed and staged by `box rm`'s has-changes check with the whole process tree's peak
//!   RSS far below one of them;
//! - a set-id file the box holds is named by `status`, `doctor`, `diff` and `rm`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use common::{assert_nothing_raw, stderr, stdout, tier_case as case, Caller};

const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
const RSS_CEILING_KB: i64 = 200 * 1024;

/// What one bounded run of a verb gave.
struct Bounded {
    code: Option<i32>,
    out: String,
    peak_rss_kb: i64,
    timed_out: bool,
}

/// The parent that measures: it runs the command given after the figure's file and writes that
/// child's `wait4` `ru_maxrss` there, then exits with its status. Why a parent of its own: the
/// kernel keeps the high-water mark of the image a process had before `exec` in `ru_maxrss`,
/// so a child spawned straight from this test process (the whole suite is one binary, tens of
/// MB) would carry the test's figure, not h5i's. This parent is a few MB.
const MEASURING_PARENT: &str = r#"import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"#;

/// `cmd` under [`MEASURING_PARENT`], which writes its peak RSS (KiB) to `figure`.
fn measured(cmd: &Command, figure: &std::path::Path) -> Command {
    let mut m = Command::new("python3");
    m.arg("-c")
        .arg(MEASURING_PARENT)
        .arg(figure)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => m.env(k, v),
            None => m.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        m.current_dir(dir);
    }
    m
}

/// Run `cmd` (stdout and stderr to files, so a full pipe cannot stall it) and wait for it on a
/// pidfd with a timeout; on timeout it is killed. The peak RSS is `wait4`'s `ru_maxrss` of
/// `cmd` as [`MEASURING_PARENT`] reads it, which covers h5i and every descendant it waited for
/// (the git processes h5i runs).
fn run_bounded(cmd: Command) -> Bounded {
    let figure = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = measured(&cmd, figure.path());
    let out = tempfile::tempfile().unwrap();
    let err = out.try_clone().unwrap();
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err);
    // Its own process group, so a timeout kills h5i and its git children together.
    cmd.process_group(0);
    let child = cmd.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let pidfd = h5i_sys::pidfd::open(pid).unwrap();
    let timed_out = !h5i_sys::pidfd::wait_exited(&pidfd, TIMEOUT).unwrap();
    if timed_out {
        // SAFETY: signalling the child's own process group.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: pid is our unwaited child; status points to writable memory.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    let peak_rss_kb = if timed_out {
        0
    } else {
        std::fs::read_to_string(figure.path())
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let mut text = String::new();
    let mut f = out;
    std::io::Seek::rewind(&mut f).unwrap();
    std::io::Read::read_to_string(&mut f, &mut text).unwrap();
    Bounded {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        out: text,
        peak_rss_kb,
        timed_out,
    }
}

fn discovery_from_inside_a_workspace(c: &mut Caller, tier: &str) {
    c.create_at("p1", tier);
    let ws = c.workspace("p1");
    let base = c.base("p1");
    let marker_dir = tempfile::Builder::new()
        .prefix("h5i-marker")
        .tempdir_in("/tmp")
        .unwrap();
    // The planted program, run as whoever runs h5i, would leave this behind.
    let marker = marker_dir.path().join("RAN");
    std::fs::set_permissions(
        marker_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let run = format!("sh -c 'touch {}; cat'", marker.display());
    let manifest = serde_json::json!({
        "v": 1,
        "name": "p1\u{1b}]0;pwned\u{7}",
        "agent": "none\u{1b}[2J",
        "created_ms": 1,
        "source": {"kind": "clone", "url": "\u{1b}]52;c;aGk=\u{7}\u{9b}31m\u{202e}"},
        "base": base,
        "base_ref": "refs/h5i/boxes/p1/base",
        "store": ws.join(".git"),
        "branch": "h5i/p1",
        "state": "active",
        "tier": "process\u{1b}[31m",
        "policy_digest": "sha256:\u{1b}[1A",
    });
    let fake = ".git/.h5i/env/none/p1";
    // Config written with `git config -f`: the container tier's image has no git, so there the
    // caller plants the same bytes from the host side.
    let script = format!(
        r#"set -e
        git config -f .git/config filter.x.clean "{run}"
        git config -f .git/config filter.x.smudge "{run}"
        git config -f .git/config filter.x.required true
        git config -f .git/config diff.x.textconv "{run}"
        git config -f .git/config merge.x.driver "{run}"
        git config -f .git/config core.fsmonitor "{run}"
        git config -f evil.cfg filter.y.clean "{run}"
        git config -f .git/config include.path "$PWD/evil.cfg"
        printf '* filter=x diff=x merge=x\nREADME.md filter=y\n' > .gitattributes
        mkdir -p .git/info {fake}/workspace {fake}/scratch
        printf '* filter=x diff=x merge=x\n' > .git/info/attributes
        echo changed >> README.md
        echo new > {fake}/workspace/f
        cat > {fake}/manifest.json <<'EOM'
{manifest}
EOM
        "#
    );
    if tier == "container" {
        let out = c.sh_in(&ws, &script).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    } else {
        c.in_box("p1", &script);
    }
    let deep = ws.join(fake);
    for cwd in [ws.clone(), deep.clone(), c.box_dir("p1")] {
        for verb in [
            &["box", "diff", "p1"][..],
            &["box", "ls"],
            &["box", "status", "p1"],
            &["box", "doctor", "p1"],
            &["box", "rm", "p1"],
        ] {
            let out = c.h5i_in(&cwd, verb).output().unwrap();
            let text = format!("{}{}", stdout(&out), stderr(&out));
            eprintln!("h5i {verb:?} from {}:\n{text}", cwd.display());
            assert!(
                !marker.exists(),
                "h5i {verb:?} from {} ran the box's planted program:\n{text}",
                cwd.display()
            );
            assert_nothing_raw(&format!("h5i {verb:?} from {}", cwd.display()), &text);
            if verb[1] == "ls" {
                // The parent's store: its one box, by its real name.
                assert!(
                    text.lines()
                        .any(|l| l.split_whitespace().next() == Some("p1")),
                    "{text}"
                );
            }
            if verb[1] == "rm" {
                assert_eq!(
                    out.status.code(),
                    Some(1),
                    "rm from {} must refuse: {text}",
                    cwd.display()
                );
            }
        }
    }
    // The real box's diff shows the box's change, through the parent's store.
    let out = c.h5i_in(&ws, &["box", "diff", "p1"]).output().unwrap();
    assert!(
        stdout(&out).contains("+changed"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(!marker.exists());
}

#[test]
fn discovery_from_inside_a_process_workspace_with_a_planted_store_runs_nothing() {
    case(
        "discovery_process_root",
        "process",
        false,
        discovery_from_inside_a_workspace,
    );
}

#[test]
fn discovery_from_inside_a_process_workspace_with_a_planted_store_runs_nothing_as_the_test_user() {
    case(
        "discovery_process_user",
        "process",
        true,
        discovery_from_inside_a_workspace,
    );
}

#[test]
fn discovery_from_inside_a_supervised_workspace_with_a_planted_store_runs_nothing() {
    case(
        "discovery_supervised_root",
        "supervised",
        false,
        discovery_from_inside_a_workspace,
    );
}

#[test]
fn discovery_from_inside_a_supervised_workspace_with_a_planted_store_runs_nothing_as_the_test_user()
{
    case(
        "discovery_supervised_user",
        "supervised",
        true,
        discovery_from_inside_a_workspace,
    );
}

#[test]
fn discovery_from_inside_a_container_workspace_with_a_planted_store_runs_nothing() {
    case(
        "discovery_container_root",
        "container",
        false,
        discovery_from_inside_a_workspace,
    );
}

#[test]
fn discovery_from_inside_a_container_workspace_with_a_planted_store_runs_nothing_as_the_test_user()
{
    case(
        "discovery_container_user",
        "container",
        true,
        discovery_from_inside_a_workspace,
    );
}

/// Every verb that reads a workspace, bounded; `expect` names what each one's output must
/// mention.
fn every_verb_bounded(c: &Caller, name: &str, expect: &[(&str, &[&str])]) {
    every_verb_under(c, name, RSS_CEILING_KB, expect);
}

/// [`every_verb_bounded`] with its own RSS ceiling.
fn every_verb_under(c: &Caller, name: &str, ceiling_kb: i64, expect: &[(&str, &[&str])]) {
    let out = c.repo().join("hostile-export").display().to_string();
    for (verb, needles) in expect {
        let args: Vec<&str> = match *verb {
            "diff" | "status" | "doctor" | "log" | "rm" | "apply" => {
                vec!["box", verb, name]
            }
            "export" => vec!["box", "export", name, "--out", &out],
            other => panic!("{other}"),
        };
        let b = run_bounded(c.h5i_in(&c.repo(), &args));
        assert!(
            !b.timed_out,
            "h5i box {verb} hung (killed after 60 s):\n{}",
            b.out
        );
        assert!(
            b.peak_rss_kb < ceiling_kb,
            "h5i box {verb}: peak RSS {} MB (ceiling {} MB)\n{}",
            b.peak_rss_kb / 1024,
            ceiling_kb / 1024,
            b.out
        );
        assert!(
            b.code.is_some(),
            "h5i box {verb} died by a signal:\n{}",
            b.out
        );
        eprintln!(
            "h5i box {verb}: exit {:?}, peak RSS {} KB",
            b.code, b.peak_rss_kb
        );
        for n in *needles {
            assert!(
                b.out.contains(n),
                "h5i box {verb} does not name `{n}`:\n{}",
                b.out
            );
        }
        assert_nothing_raw(&format!("h5i box {verb}"), &b.out);
        if *verb == "rm" {
            assert_eq!(
                b.code,
                Some(1),
                "rm must refuse a box holding unread changes:\n{}",
                b.out
            );
            assert!(c.box_dir(name).exists());
        }
        if matches!(*verb, "export" | "apply") {
            assert_eq!(
                b.code,
                Some(1),
                "{verb} must refuse a tree git would block on:\n{}",
                b.out
            );
        }
    }
}

fn sparse_giants_dev_zero_and_fifos(c: &mut Caller, tier: &str) {
    c.create_at("hb", tier);
    c.in_box(
        "hb",
        "set -e; truncate -s 2G big1 big2; ln -s /dev/zero zero; rm README.md; mkfifo README.md fifo",
    );
    // A set-id copy of a program, as a box on an older h5i (or a container tier) could leave.
    let ws = c.workspace("hb");
    let out = c
        .sh_in(&ws, "cp /bin/true suid-true && chmod 6755 suid-true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    every_verb_bounded(
        c,
        "hb",
        &[
            (
                "diff",
                &[
                    "big1: 2147483648 bytes, over the",
                    "README.md: a fifo",
                    "suid-true: set-id file (mode 6755)",
                ],
            ),
            (
                "status",
                &[
                    "suid-true: set-id file (mode 6755)",
                    "README.md: a fifo",
                    "fifo: a fifo",
                ],
            ),
            ("doctor", &["set-id", "suid-true"]),
            ("rm", &["big2: 2147483648 bytes", "suid-true: set-id"]),
            ("log", &[]),
        ],
    );

    // alternates: a symlink to /dev/zero, then a fifo; then a fifo where git reads ignore rules.
    // In the box its `alternates` is h5i's read-only file bound over the workspace's own (rm:
    // EBUSY), so the box replaces the directory that holds it.
    c.in_box(
        "hb",
        "set -e; cd .git/objects; if rm info/alternates; then exit 3; fi; \
         mv info info.was; mkdir info; ln -s /dev/zero info/alternates",
    );
    every_verb_bounded(
        c,
        "hb",
        &[
            (
                "doctor",
                &["alternates is a symbolic link (never followed)"],
            ),
            ("diff", &["big1"]),
            ("status", &["suid-true"]),
            ("rm", &["big1"]),
            ("log", &[]),
        ],
    );
    c.in_box(
        "hb",
        "set -e; rm .git/objects/info/alternates; mkfifo .git/objects/info/alternates .gitignore",
    );
    every_verb_bounded(
        c,
        "hb",
        &[
            ("doctor", &["alternates is a fifo, not a regular file"]),
            ("diff", &[".gitignore: a file git reads, but a fifo"]),
            (
                "status",
                &[
                    ".gitignore: a file git reads, but a fifo",
                    ".git/objects/info/alternates: a fifo",
                ],
            ),
            ("rm", &[".gitignore"]),
            ("log", &[]),
            ("export", &[".gitignore: a file git reads, but a fifo"]),
            ("apply", &[".gitignore: a file git reads, but a fifo"]),
        ],
    );
}

#[test]
fn sparse_giants_a_dev_zero_symlink_and_fifos_stay_bounded_under_every_verb_at_the_process_tier() {
    case(
        "bounded_process_root",
        "process",
        false,
        sparse_giants_dev_zero_and_fifos,
    );
}

#[test]
fn sparse_giants_a_dev_zero_symlink_and_fifos_stay_bounded_at_the_process_tier_as_the_test_user() {
    case(
        "bounded_process_user",
        "process",
        true,
        sparse_giants_dev_zero_and_fifos,
    );
}

#[test]
fn sparse_giants_a_dev_zero_symlink_and_fifos_stay_bounded_under_every_verb_at_the_supervised_tier()
{
    case(
        "bounded_supervised_root",
        "supervised",
        false,
        sparse_giants_dev_zero_and_fifos,
    );
}

#[test]
fn sparse_giants_a_dev_zero_symlink_and_fifos_stay_bounded_at_the_supervised_tier_as_the_test_user()
{
    case(
        "bounded_supervised_user",
        "supervised",
        true,
        sparse_giants_dev_zero_and_fifos,
    );
}

#[test]
fn sparse_giants_a_dev_zero_symlink_and_fifos_stay_bounded_under_every_verb_at_the_container_tier()
{
    case(
        "bounded_container_root",
        "container",
        false,
        sparse_giants_dev_zero_and_fifos,
    );
}

#[test]
fn sparse_giants_a_dev_zero_symlink_and_fifos_stay_bounded_at_the_container_tier_as_the_test_user()
{
    case(
        "bounded_container_user",
        "container",
        true,
        sparse_giants_dev_zero_and_fifos,
    );
}

/// Peak RSS allowed while four 60 MiB files are hashed and staged: well under one of them
/// (h5i itself, and every git it runs, stream them).
const STREAM_CEILING_KB: i64 = 48 * 1024;

/// Four sparse files just under the per-file cap (64 MiB), each a different blob: `box rm`'s
/// has-changes check reads, hashes and stages every one, and the peak RSS of h5i and its git
/// children stays far below one file's size (it held all four, 240 MiB, when it buffered them).
fn files_under_the_cap_are_hashed_streaming(c: &mut Caller, tier: &str) {
    c.create_at("hs", tier);
    c.in_box(
        "hs",
        "set -e; for i in 1 2 3 4; do truncate -s 60M s$i; echo $i >> s$i; done",
    );
    every_verb_under(
        c,
        "hs",
        STREAM_CEILING_KB,
        &[("rm", &["4 changed path(s)"])],
    );
}

#[test]
fn files_under_the_cap_are_hashed_in_bounded_memory_at_the_process_tier() {
    case(
        "streaming_process_root",
        "process",
        false,
        files_under_the_cap_are_hashed_streaming,
    );
}

#[test]
fn files_under_the_cap_are_hashed_in_bounded_memory_at_the_supervised_tier_as_the_test_user() {
    case(
        "streaming_supervised_user",
        "supervised",
        true,
        files_under_the_cap_are_hashed_streaming,
    );
}
