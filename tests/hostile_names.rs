//! Untracked names a box chooses, through h5i's own listing of the workspace (issue 13: every
//! read of a workspace path is relative to the workspace's directory descriptor, git never
//! lists it): a box at each kernel tier (process, supervised, container), as root and as the
//! unprivileged `h5i-test`, makes files whose names hold a newline, an escape sequence, a
//! leading dash and pathspec magic, a `.gitignore` of its own, a deep tree, a repository of its
//! own and a fifo. Then:
//!
//! - `box diff` lists each new name (quoted by git, escaped by h5i: no raw control byte), leaves
//!   out what the box's `.gitignore` ignores, names the nested repository it did not read, and
//!   hangs on nothing;
//! - `box export` carries the plain ones (`-rf`, `:(glob)*`, the deep file) in its patch,
//!   excludes and names the ones with control characters, and writes no raw control byte.
//!
//! As another user than root every test says `skipped:` (switching to h5i-test needs root).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{assert_nothing_raw, stderr, stdout, tier_case as case, Caller};

/// Made inside the box, by the box's own shell (busybox's at the container tier).
const MAKE: &str = r#"set -e
touch -- "$(printf 'new\nline')" "$(printf 'esc\033]0;pwned\007x')" -rf ':(glob)*'
printf '*.ign\n' > .gitignore
echo ignored > ignored.ign
mkdir -p deep/er nest/.git/refs
echo deep > deep/er/x
echo 'ref: refs/heads/main' > nest/.git/HEAD
echo inner > nest/inner
mkfifo pipe
"#;

fn hostile_names_through_the_listing(c: &mut Caller, tier: &str) {
    c.create_at("hn", tier);
    let out = c.h5i(&["box", "run", "hn", "--", "sh", "-c", MAKE]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let who = format!("at {tier} as {}", c.who());

    let out = c.h5i(&["box", "diff", "hn"]);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "box diff {who}: {text}");
    assert_nothing_raw(&format!("box diff {who}"), &text);
    for shown in [
        "b/-rf",
        "b/:(glob)*",
        "\"b/new\\nline\"",
        "b/esc\\033]0;pwned\\ax",
        "b/deep/er/x",
        "b/.gitignore",
        "not in the diff: nest: a nested repository (never staged)",
    ] {
        assert!(
            text.contains(shown),
            "box diff {who} lacks `{shown}`:\n{text}"
        );
    }
    for hidden in ["ignored.ign", "nest/inner", "b/pipe"] {
        assert!(
            !text.contains(hidden),
            "box diff {who} shows `{hidden}`:\n{text}"
        );
    }

    let out_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(out_dir.path(), Some(c.uid()), Some(c.uid())).unwrap();
    let review = out_dir.path().join("review");
    let out = c.h5i(&["box", "export", "hn", "--out", review.to_str().unwrap()]);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "box export {who}: {text}");
    assert_nothing_raw(&format!("box export {who}"), &text);
    let patch = std::fs::read_to_string(review.join("patch.diff")).unwrap();
    for carried in ["b/-rf", "b/:(glob)*", "b/deep/er/x"] {
        assert!(
            patch.contains(carried),
            "the patch {who} lacks `{carried}`:\n{patch}"
        );
    }
    for left_out in [
        "new\\nline",
        "esc\\033",
        "ignored.ign",
        "nest/inner",
        "b/pipe",
    ] {
        assert!(
            !patch.contains(left_out),
            "the patch {who} carries `{left_out}`:\n{patch}"
        );
    }
    let report = std::fs::read_to_string(review.join("report.md")).unwrap();
    assert_nothing_raw(&format!("report.md {who}"), &report);
    assert!(
        report.contains("a control character in a name"),
        "report.md {who} does not name the excluded names:\n{report}"
    );
}

#[test]
fn hostile_names_are_listed_from_the_workspace_fd_and_escaped_at_the_process_tier() {
    case(
        "names_process_root",
        "process",
        false,
        hostile_names_through_the_listing,
    );
}

#[test]
fn hostile_names_are_listed_from_the_workspace_fd_at_the_process_tier_as_the_test_user() {
    case(
        "names_process_user",
        "process",
        true,
        hostile_names_through_the_listing,
    );
}

#[test]
fn hostile_names_are_listed_from_the_workspace_fd_and_escaped_at_the_supervised_tier() {
    case(
        "names_supervised_root",
        "supervised",
        false,
        hostile_names_through_the_listing,
    );
}

#[test]
fn hostile_names_are_listed_from_the_workspace_fd_at_the_supervised_tier_as_the_test_user() {
    case(
        "names_supervised_user",
        "supervised",
        true,
        hostile_names_through_the_listing,
    );
}

#[test]
fn hostile_names_are_listed_from_the_workspace_fd_and_escaped_at_the_container_tier() {
    case(
        "names_container_root",
        "container",
        false,
        hostile_names_through_the_listing,
    );
}

#[test]
fn hostile_names_are_listed_from_the_workspace_fd_at_the_container_tier_as_the_test_user() {
    case(
        "names_container_user",
        "container",
        true,
        hostile_names_through_the_listing,
    );
}
