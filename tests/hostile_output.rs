//! Terminal injection (issue 13, finding 4): a table of hostile sequences (OSC 0 titles, OSC 52
//! clipboard writes, `CSI 2J`, C1 CSI, a bidi override, BEL) placed everywhere a box can put a
//! string (file names and contents, a fifo's and a set-id file's name, argv, service output, an
//! event line, a forged manifest) and read back through every printing verb: none reaches the
//! terminal raw, and each is shown as visible text. `box service logs --raw` is the one way to
//! get the bytes as they are, and it warns on stderr.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{stderr, stdout, Repo};

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

#[test]
fn hostile_sequences_never_reach_the_terminal_through_any_printing_verb() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: hostile_sequences_... needs root (process tier services as root)");
        return;
    }
    let r = Repo::new();
    std::fs::write(
        r.path().join("noisy.sh"),
        "printf '\\033]0;pwned-title\\007\\033]52;c;aGk=\\007\\033[2J\\302\\23331m\\342\\200\\256 done\\n'\nexec sleep 60\n",
    )
    .unwrap();
    r.write_policy("[service.noisy]\ncommand = \"sh ./noisy.sh\"\n");
    r.git(&["add", "-A"]);
    r.git(&["commit", "-qm", "noisy"]);
    r.ok(&["box", "create", "ho", "--isolation", "process"]);
    let ws = r.workspace("ho");
    let evil = hostile();
    // Names and contents the box chooses.
    std::fs::write(ws.join(format!("name{evil}.txt")), format!("body {evil}\n")).unwrap();
    let out = r.h5i(&[
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
    let suid = ws.join(format!("suid{evil}"));
    std::fs::copy("/bin/true", &suid).unwrap();
    std::fs::set_permissions(&suid, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    // A service that writes the sequences to its log.
    r.ok(&["box", "service", "start", "ho", "noisy"]);
    let log = r.box_dir("ho").join("services/noisy.log");
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
    // An event line and manifest fields carrying the sequences (as a forged store would).
    let events = r.box_dir("ho").join("events.jsonl");
    let mut ev = std::fs::read_to_string(&events).unwrap();
    ev.push_str(
        &serde_json::json!({"at_ms": 1, "event": format!("x{evil}"), "detail": evil}).to_string(),
    );
    ev.push('\n');
    ev.push_str(&format!("not json {evil}\n"));
    std::fs::write(&events, ev).unwrap();
    let mpath = r.box_dir("ho").join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    m["source"] =
        serde_json::json!({"kind": "clone", "url": format!("https://example.test/{evil}")});
    std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();

    let verbs: &[(&[&str], &[&str])] = &[
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
        (&["box", "service", "status", "ho"], &[]),
        (
            &["box", "service", "logs", "ho", "noisy"],
            &["\\x1b]0;pwned-title\\x07\\x1b]52;c;aGk=\\x07\\x1b[2J\\u{9b}31m\\u{202e} done"],
        ),
        (&["box", "capabilities", "ho", "--json"], &[]),
    ];
    for (args, shown) in verbs {
        let out = r.h5i(args);
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert_escaped(&format!("h5i {args:?}"), &text);
        for s in *shown {
            assert!(
                text.contains(s),
                "h5i {args:?} does not show `{s}`:\n{text}"
            );
        }
    }

    // --raw is the explicit way to the bytes, and it says so on stderr.
    let out = r.h5i(&["box", "service", "logs", "ho", "noisy", "--raw"]);
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
    r.ok(&["box", "service", "stop", "ho", "noisy"]);
}
