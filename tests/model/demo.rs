//! The script of `make demo`'s agent step, shared by the model it runs
//! (`examples/scripted_model.rs`) and the test that runs the step (`tests/agent_claude.rs`):
//! Claude Code fixes the sample repository's bug (`scripts/make-sample-repo.sh`): read the
//! buggy file, run the tests (they fail), fix the line, run them again (they pass), stage a
//! proposal, finish.
//!
//! Include it beside `tests/model/mod.rs` as `crate::model`:
//! `#[path = "../tests/model/demo.rs"] mod demo;`.
#![allow(dead_code)]

use serde_json::json;

use crate::model::{Call, Turn};

/// The file the model fixes, as the box sees it.
pub const FILE: &str = "/work/wordcount/textstats.py";
/// The demo's proposal, staged where the skill's `proposal` page says.
pub const PROPOSAL: &str = "word_count split on single spaces, so newlines, tabs and runs of \
                            spaces miscounted; it now splits on any whitespace (str.split()). \
                            The failing test passes, and so do the other seven.";
/// The task the demo gives `claude -p`, which the first turn expects.
pub const TASK: &str = "fix the failing word count test";
/// What the model says last.
pub const FINISH: &str = "word_count is fixed; the tests pass and the proposal is staged.";
/// The command the model runs the tests with, before and after the change.
pub const TESTS: &str = "cd /work && python3 -m unittest 2>&1 | tail -n 3";

fn bash(command: &str, description: &str) -> Call {
    Call::new(
        "Bash",
        json!({"command": command, "description": description}),
    )
}

/// The turns, in order: Read, Bash (tests), Edit, Bash (tests), Bash (the proposal), finish.
pub fn script() -> Vec<Turn> {
    vec![
        Turn::calls(vec![Call::new("Read", json!({"file_path": FILE}))]).expecting("fix"),
        Turn::calls(vec![bash(TESTS, "run the tests before the change")])
            .expecting("text.split(\" \")"),
        Turn::calls(vec![Call::new(
            "Edit",
            json!({"file_path": FILE,
                   "old_string": "words = [w for w in text.split(\" \") if w]",
                   "new_string": "words = text.split()"}),
        )])
        .expecting("FAILED (failures=1)"),
        Turn::calls(vec![bash(TESTS, "run the tests after the change")])
            .expecting("has been updated"),
        Turn::calls(vec![bash(
            &format!("printf '%s\\n' '{PROPOSAL}' > \"$H5I_ENV_CAPTURE_SPOOL/proposal.md\" && echo staged"),
            "stage the proposal for the reviewer",
        )])
        .expecting("OK"),
        Turn::finish(FINISH).expecting("staged"),
    ]
}
