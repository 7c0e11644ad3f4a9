//! The scripted model `make demo` runs Claude Code against (no model, no internet): the test
//! suite's model service (`tests/model`, TLS on 127.0.0.1 with a CA made here) playing the
//! demo's script on the sample repository (`scripts/make-sample-repo.sh`): read the buggy
//! file, run the tests (they fail), fix the line, run them again (they pass), stage a proposal,
//! finish.
//!
//! Usage: `scripted_model DIR` with the host's key for the demo in `H5I_DEMO_KEY`. Writes the CA
//! to `DIR/ca.der`, prints the `H5I_TEST_HOSTS` entry that points h5i's credential proxy here
//! (`api.anthropic.com=127.0.0.1:PORT`) as its first line, serves until its stdin closes, then
//! prints what it saw: the turns played, every disagreement with the script, and whether every
//! model call carried the host's key (never the box's dummy). Exits 1 when the script was not
//! played through or a call carried anything else. Only a build whose h5i has the test seams
//! (`--features test-seams`) lets the proxy be pointed here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/model/mod.rs"]
mod model;
#[path = "../broker/tests/support/mod.rs"]
mod support;

use std::io::{Read, Write};

use model::{Api, Call, Kind, ModelService, Turn};
use serde_json::json;

/// The file the model fixes, as the box sees it.
const FILE: &str = "/work/wordcount/textstats.py";
/// The demo's proposal, staged where the skill's `proposal` page says.
const PROPOSAL: &str = "word_count split on single spaces, so newlines, tabs and runs of \
                        spaces miscounted; it now splits on any whitespace (str.split()). \
                        The failing test passes, and so do the other seven.";

fn bash(command: &str, description: &str) -> Call {
    Call::new(
        "Bash",
        json!({"command": command, "description": description}),
    )
}

fn script() -> Vec<Turn> {
    let tests = "cd /work && python3 -m unittest 2>&1 | tail -n 3";
    vec![
        Turn::calls(vec![Call::new("Read", json!({"file_path": FILE}))]).expecting("fix"),
        Turn::calls(vec![bash(tests, "run the tests before the change")])
            .expecting("text.split(\" \")"),
        Turn::calls(vec![Call::new(
            "Edit",
            json!({"file_path": FILE,
                   "old_string": "words = [w for w in text.split(\" \") if w]",
                   "new_string": "words = text.split()"}),
        )])
        .expecting("FAILED (failures=1)"),
        Turn::calls(vec![bash(tests, "run the tests after the change")])
            .expecting("has been updated"),
        Turn::calls(vec![bash(
            &format!("printf '%s\\n' '{PROPOSAL}' > \"$H5I_ENV_CAPTURE_SPOOL/proposal.md\" && echo staged"),
            "stage the proposal for the reviewer",
        )])
        .expecting("OK"),
        Turn::finish("word_count is fixed; the tests pass and the proposal is staged.")
            .expecting("staged"),
    ]
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .expect("usage: scripted_model DIR (H5I_DEMO_KEY in the environment)");
    let key = std::env::var("H5I_DEMO_KEY").expect("H5I_DEMO_KEY is not set");
    let ca = support::TestCa::new();
    let turns = script();
    let n = turns.len();
    let service = ModelService::start(
        ca.server_config(&["api.anthropic.com"]),
        Api::Anthropic,
        turns,
    );
    std::fs::write(std::path::Path::new(&dir).join("ca.der"), &ca.ca_der).unwrap();
    println!("api.anthropic.com={}", service.addr);
    std::io::stdout().flush().unwrap();
    // Serve until the demo closes our stdin.
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);

    let mut played = service.turns_served();
    played.dedup();
    let calls: Vec<_> = service
        .requests()
        .into_iter()
        .filter(|l| matches!(l.kind, Kind::Turn(_) | Kind::Side))
        .collect();
    let real = calls
        .iter()
        .filter(|l| l.seen.header("x-api-key") == Some(key.as_str()))
        .count();
    let dummy = calls
        .iter()
        .any(|l| l.seen.all_text().contains("h5i-dummy-"));
    println!(
        "turns played: {played:?} of {n}; model calls: {}; with the host's key: {real}; the box's dummy seen: {}",
        calls.len(),
        if dummy { "yes" } else { "no" }
    );
    for p in service.problems() {
        println!("disagreement with the script: {p}");
    }
    let whole = played == (0..n).collect::<Vec<_>>();
    let ok = whole && real == calls.len() && !dummy && service.problems().is_empty();
    std::process::exit(if ok { 0 } else { 1 });
}
