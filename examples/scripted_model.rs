//! The scripted model `make demo` runs Claude Code against (no model, no internet): the test
//! suite's model service (`tests/model`, TLS on 127.0.0.1 with a CA made here) playing the
//! demo's script (`tests/model/demo.rs`, which the test of the demo's agent step plays too) on
//! the sample repository (`scripts/make-sample-repo.sh`): read the buggy file, run the tests
//! (they fail), fix the line, run them again (they pass), stage a proposal, finish.
//!
//! Usage: `scripted_model DIR` with the host's key for the demo in `H5I_DEMO_KEY`. Writes the CA
//! to `DIR/ca.der`, prints the `H5I_TEST_HOSTS` entry that points h5i's credential proxy here
//! (`api.anthropic.com=127.0.0.1:PORT`) as its first line, serves until its stdin closes, then
//! prints what it saw: the turns played, every disagreement with the script, and whether every
//! model call carried the host's key (never the box's dummy). Exits 1 when the script was not
//! played through or a call carried anything else. Only a build whose h5i has the test seams
//! (`--features test-seams`) lets the proxy be pointed here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/model/demo.rs"]
mod demo;
#[path = "../tests/model/mod.rs"]
mod model;
#[path = "../broker/tests/support/mod.rs"]
mod support;

use std::io::{Read, Write};

use model::{Api, Kind, ModelService};

fn main() {
    let dir = std::env::args()
        .nth(1)
        .expect("usage: scripted_model DIR (H5I_DEMO_KEY in the environment)");
    let key = std::env::var("H5I_DEMO_KEY").expect("H5I_DEMO_KEY is not set");
    let ca = support::TestCa::new();
    let turns = demo::script();
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
