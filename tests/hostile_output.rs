//! Terminal injection (issue 13, finding 4): a table of hostile sequences (OSC 0 titles, OSC 52
//! clipboard writes, `CSI 2J`, C1 CSI, a bidi override, BEL) placed everywhere a box can put a
//! string (file names and contents, a fifo's and a set-id file's name, argv, service output, an
//! event line, a forged manifest) and read back through every printing verb: none reaches the
//! terminal raw, and each is shown as visible text. `box service logs --raw` is the one way to
//! get the bytes as they are, and it warns on stderr.
//!
//! At every kernel tier (services, and so `service logs`, only where the tier has them: the
//! process tier), as root and as the unprivileged `h5i-test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{stderr, stdout, Caller};

/// Every sequence a box might aim at a terminal.
const HOSTILE: &[&str] = &[
    "\u{1b}]0;pwned-title\u{7}",
    "\u{1b}]52;c;aGk=\u{7}",
    "\u{1b}[2J",
    "\u{9b}31m",
    "\u{202e}",
    "\u{7}",
];

/// The raw characters that must never be printed.
const RAW: &[char] = &['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}'];

fn hostile() -> String {
    HOSTILE.concat()
}

fn assert_escaped(what: &str, text: &str) {
    for c in RAW {
        assert!(
            !text.contains(*c),
            "{what}: U+{:04X} printed raw:\n{}",
            *c as u32,
            text.escape_debug()
        );
    }
}

/// Write `bytes` at `path` with `mode`, owned by the caller (as a box of theirs would leave it).
fn plant(c: &Caller, path: &Path, bytes: &[u8], mode: u32) {
    std::fs::write(path, bytes).unwrap();
    std::os::unix::fs::lchown(path, Some(c.uid()), Some(c.uid())).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

fn hostile_sequences_through_every_printing_verb(c: &mut Caller, tier: &str) {
    let services = tier == "process";
    if services {
        c.write(
            "noisy.sh",
            "printf '\\033]0;pwned-title\\007\\033]52;c;aGk=\\007\\033[2J\\302\\23331m\\342\\200\\256 done\\n'\nexec sleep 60\n",
        );
        c.write(
            ".h5i/env.toml",
            "[service.noisy]\ncommand = \"sh ./noisy.sh\"\n",
        );
        c.commit_all("noisy");
    }
    c.create_at("ho", tier);
    let ws = c.workspace("ho");
    let evil = hostile();
    // Names and contents the box chooses.
    plant(
        c,
        &ws.join(format!("name{evil}.txt")),
        format!("body {evil}\n").as_bytes(),
        0o644,
    );
    let out = c.h5i(&[
        "box",
        "run",
        "ho",
        "--",
        "sh",
        "-c",
        "mkfifo \"$1\"; true",
        "sh",
        &format!("fifo{evil}"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A set-id program, as a box on an older h5i could leave (a box cannot make one now).
    plant(
        c,
        &ws.join(format!("suid{evil}")),
        &std::fs::read("/bin/true").unwrap(),
        0o4755,
    );
    if services {
        // A service that writes the sequences to its log.
        c.ok(&["box", "service", "start", "ho", "noisy"]);
        let log = c.box_dir("ho").join("services/noisy.log");
        for _ in 0..100 {
            if std::fs::read(&log)
                .map(|b| b.ends_with(b"done\n"))
                .unwrap_or(false)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            std::fs::read(&log).unwrap().ends_with(b"done\n"),
            "the service never wrote"
        );
    }
    // An event line and manifest fields carrying the sequences (as a forged store would).
    let events = c.box_dir("ho").join("events.jsonl");
    let mut ev = std::fs::read_to_string(&events).unwrap();
    ev.push_str(
        &serde_json::json!({"at_ms": 1, "event": format!("x{evil}"), "detail": evil}).to_string(),
    );
    ev.push('\n');
    ev.push_str(&format!("not json {evil}\n"));
    std::fs::write(&events, ev).unwrap();
    let mpath = c.box_dir("ho").join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    m["source"] =
        serde_json::json!({"kind": "clone", "url": format!("https://example.test/{evil}")});
    std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();

    let mut verbs: Vec<(&[&str], &[&str])> = vec![
        (
            &["box", "ls"],
            &["https://example.test/\\x1b]0;pwned-title\\x07"],
        ),
        (&["box", "status", "ho"], &["suid\\x1b]0;pwned-title"]),
        (
            &["box", "diff", "ho"],
            &["body \\x1b]0;pwned-title", "fifo\\x1b]0;pwned-title"],
        ),
        (&["box", "diff", "--stat", "ho"], &[]),
        (&["box", "rm", "ho"], &["suid\\x1b]0;pwned-title"]),
        (&["box", "doctor", "ho"], &["suid\\x1b]0;pwned-title"]),
        (
            &["box", "log", "ho"],
            &[
                "\\x1b]52;c;aGk=\\x07",
                "(unreadable event line: not json \\x1b]0;pwned-title",
            ],
        ),
        (&["box", "ports", "ho"], &[]),
        (&["box", "capabilities", "ho", "--json"], &[]),
    ];
    if services {
        verbs.push((&["box", "service", "status", "ho"], &[]));
        verbs.push((
            &["box", "service", "logs", "ho", "noisy"],
            &["\\x1b]0;pwned-title\\x07\\x1b]52;c;aGk=\\x07\\x1b[2J\\u{9b}31m\\u{202e} done"],
        ));
    }
    for (args, shown) in &verbs {
        let out = c.h5i(args);
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert_escaped(&format!("h5i {args:?} at {tier} as {}", c.who()), &text);
        for s in *shown {
            assert!(
                text.contains(s),
                "h5i {args:?} at {tier} as {} does not show `{s}`:\n{text}",
                c.who()
            );
        }
    }
    if !services {
        return;
    }
    // --raw is the explicit way to the bytes, and it says so on stderr.
    let out = c.h5i(&["box", "service", "logs", "ho", "noisy", "--raw"]);
    assert!(
        stdout(&out).contains("\u{1b}]52;c;aGk=\u{7}"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("--raw copies the service's bytes as they are"),
        "{}",
        stderr(&out)
    );
    c.ok(&["box", "service", "stop", "ho", "noisy"]);
}

fn case(test: &str, tier: &str, as_user: bool) {
    if !common::require_root(
        test,
        "boxes as root, set-id files, and switching to h5i-test",
    ) {
        return;
    }
    hostile_sequences_through_every_printing_verb(&mut Caller::either(as_user), tier);
}

#[test]
fn hostile_sequences_never_reach_the_terminal_through_any_printing_verb_at_the_process_tier() {
    case("output_process_root", "process", false);
}

#[test]
fn hostile_sequences_never_reach_the_terminal_at_the_process_tier_as_the_test_user() {
    case("output_process_user", "process", true);
}

#[test]
fn hostile_sequences_never_reach_the_terminal_through_any_printing_verb_at_the_supervised_tier() {
    case("output_supervised_root", "supervised", false);
}

#[test]
fn hostile_sequences_never_reach_the_terminal_at_the_supervised_tier_as_the_test_user() {
    case("output_supervised_user", "supervised", true);
}

#[test]
fn hostile_sequences_never_reach_the_terminal_through_any_printing_verb_at_the_container_tier() {
    case("output_container_root", "container", false);
}

#[test]
fn hostile_sequences_never_reach_the_terminal_at_the_container_tier_as_the_test_user() {
    case("output_container_user", "container", true);
}
