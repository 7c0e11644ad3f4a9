//! `h5i box inspect`, `h5i box log`'s filters and `h5i box compare`, on real boxes at the process
//! and supervised tiers, as root and as the test user: the rendered receipt carries the kernel's
//! figures for the run, a box-claimed record says it is the box's account, what the box staged
//! reaches the terminal escaped, compare reads a box's tree only when it is held still.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Stdio;

use common::caller::Caller;
use common::{stderr, stdout};

/// A process-tier box `a` with one failed run and one box-claimed record; a supervised box `b`
/// with one clean run.
fn two_boxes(c: &mut Caller) {
    c.create_at("a", "process");
    c.create_at("b", "supervised");
    let script = r#"s="$H5I_ENV_CAPTURE_SPOOL"
        printf '{"kind":"command","argv":["make","test"]}' > "$s/01-cmd.json"
        printf '{"kind":"note","text":"\033]0;pwned\007"}' > "$s/02-escape.json"
        echo added > new.txt
        exit 7"#;
    let out = c.h5i(&["box", "run", "a", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(7), "{}: {}", c.who(), stderr(&out));
    c.ok(&["box", "run", "b", "--", "true"]);
}

fn inspect_renders_the_kernels_figures_and_names_the_lane(c: &mut Caller) {
    two_boxes(c);
    let run = c.ok(&["box", "inspect", "a", "--capture", "1"]);
    for want in [
        "receipt #1 of box a",
        "lane        host-env-run (host-observed",
        "command     `sh` `-c`",
        "tier        process",
        "exit        7",
        "(wait4)",
        "oom         none",
    ] {
        assert!(run.contains(want), "{}: no `{want}` in:\n{run}", c.who());
    }
    let claimed = c.ok(&["box", "inspect", "a", "--capture", "2"]);
    assert!(
        claimed.contains("lane        inbox-capture (box-claimed: the box's own account"),
        "{claimed}"
    );
    assert!(claimed.contains("\"make\""), "{claimed}");
    // The escape sequence the box staged was quarantined at ingestion; its record still prints
    // only as text.
    let quarantined = c.ok(&["box", "inspect", "a", "--capture", "3"]);
    assert!(
        quarantined.contains("quarantined spool entry"),
        "{quarantined}"
    );
    assert!(!quarantined.contains('\u{1b}'), "{quarantined}");

    let missing = c.h5i(&["box", "inspect", "a", "--capture", "99"]);
    assert_ne!(missing.status.code(), Some(0));
    let err = stderr(&missing);
    assert!(
        err.contains("refusing: box `a` has no receipt #99") && err.contains("#1..#3"),
        "{err}"
    );

    let json = c.ok(&["box", "inspect", "a", "--capture", "1", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["record"]["exit"]["code"], 7);
    assert!(doc["record"]["rusage"]["user_us"].is_u64(), "{doc}");

    // The supervised box's table refuses a dial its profile does not list (a test address:
    // nothing leaves the box) and counts it; the receipt's egress line says so.
    let dial = "import socket; s = socket.socket(); s.settimeout(5); print(s.connect_ex(('198.18.0.9', 8080)))";
    let out = c.h5i(&["box", "run", "b", "--", "python3", "-c", dial]);
    assert!(out.status.success(), "{}: {}", c.who(), stderr(&out));
    assert_ne!(stdout(&out).trim(), "0", "{}: the dial connected", c.who());
    let refused = c.ok(&["box", "inspect", "b", "--capture", "2"]);
    assert!(
        refused.contains("egress      allowed none; denied 198.18.0.9:8080/tcp x1"),
        "{}: {refused}",
        c.who()
    );
    let calm = c.ok(&["box", "inspect", "b", "--capture", "1"]);
    assert!(
        calm.contains("egress      allowed none; denied none"),
        "{}: {calm}",
        c.who()
    );
}

fn log_filters_narrow_to_what_was_asked(c: &mut Caller) {
    two_boxes(c);
    let all = c.ok(&["box", "log", "a"]);
    assert!(all.contains("created"), "{all}");
    assert_eq!(all.matches("receipt #").count(), 3, "{all}");
    let failed = c.ok(&["box", "log", "a", "--failed"]);
    assert!(
        failed.contains("receipt #1") && failed.contains("exit 7"),
        "{failed}"
    );
    assert!(
        !failed.contains("receipt #2") && !failed.contains("created"),
        "{failed}"
    );
    let claimed = c.ok(&["box", "log", "a", "--box-claimed"]);
    assert_eq!(claimed.matches("box-claimed]").count(), 2, "{claimed}");
    assert!(!claimed.contains("receipt #1 "), "{claimed}");
    let lane = c.ok(&["box", "log", "a", "--lane", "host-env-run", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&lane).unwrap();
    assert_eq!(doc["receipts"].as_array().unwrap().len(), 1, "{doc}");
    let bad = c.h5i(&["box", "log", "a", "--lane", "root"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("the lanes: host-env-run"),
        "{}",
        stderr(&bad)
    );
}

fn compare_sets_two_boxes_side_by_side(c: &mut Caller) {
    two_boxes(c);
    let out = c.ok(&["box", "compare", "a", "b"]);
    let row = |key: &str| -> String {
        out.lines()
            .find(|l| l[1..].trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no `{key}` row in:\n{out}"))
            .to_string()
    };
    let tier = row("tier ");
    assert!(
        tier.starts_with('*') && tier.contains("process") && tier.contains("supervised"),
        "{tier}"
    );
    assert!(row("files added").starts_with('*'), "{out}");
    assert!(row("runs failed").starts_with('*'), "{out}");
    assert!(row("base ").starts_with(' '), "same base: {out}");
    let same = c.h5i(&["box", "compare", "a", "a"]);
    assert!(
        stderr(&same).contains("compared with itself"),
        "{}",
        stderr(&same)
    );

    // A live run holds the box's lock: compare does not read a tree that can change under it.
    let mut live = c
        .h5i_in(
            &c.repo(),
            &["box", "run", "a", "--", "sh", "-c", "echo up; sleep 30"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut up = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(live.stdout.as_mut().unwrap()),
        &mut up,
    )
    .unwrap();
    assert_eq!(up.trim(), "up");
    let busy = c.ok(&["box", "compare", "a", "b"]);
    // SIGTERM, as a terminal would send: h5i ends the run and everything in it.
    // SAFETY: kill has no memory preconditions; the pid is h5i's, this test's child (or
    // runuser's, for the test user), not yet reaped.
    unsafe { libc::kill(common::caller::h5i_pid(live.id()), libc::SIGTERM) };
    let ended = live.wait().unwrap();
    assert_eq!(ended.code(), Some(143), "{ended:?}");
    assert!(
        busy.contains("not read: a run or shell of the box is live"),
        "{busy}"
    );
}

#[test]
fn inspect_renders_the_kernels_figures_and_names_the_lane_as_root() {
    inspect_renders_the_kernels_figures_and_names_the_lane(&mut Caller::root());
}

#[test]
fn inspect_renders_the_kernels_figures_and_names_the_lane_as_the_test_user() {
    inspect_renders_the_kernels_figures_and_names_the_lane(&mut Caller::user());
}

#[test]
fn log_filters_narrow_to_what_was_asked_as_root() {
    log_filters_narrow_to_what_was_asked(&mut Caller::root());
}

#[test]
fn log_filters_narrow_to_what_was_asked_as_the_test_user() {
    log_filters_narrow_to_what_was_asked(&mut Caller::user());
}

#[test]
fn compare_sets_two_boxes_side_by_side_and_never_reads_a_live_tree_as_root() {
    compare_sets_two_boxes_side_by_side(&mut Caller::root());
}

#[test]
fn compare_sets_two_boxes_side_by_side_and_never_reads_a_live_tree_as_the_test_user() {
    compare_sets_two_boxes_side_by_side(&mut Caller::user());
}
