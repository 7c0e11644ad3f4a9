//! Codex in a box, end to end, against the scripted model service (tests/model): the real
//! `codex` (installed by `make setup`) runs `codex exec` in a box, the model's script has it
//! read, patch and check a file, and the test checks what came out (tests/model/agent.rs): the
//! edit in `box diff` and in the export's patch, the real credential at the model service and
//! nowhere the box could see it.
//!
//! The box runs plain `codex exec "..."`: everything Codex needs is in the system folder h5i
//! binds read-only at `/etc/codex` for the run (`h5i::capture`): a `config.toml` whose provider
//! is the run's credential proxy over HTTP streaming with the box's dummy as its key, Codex's
//! own sandbox off, its update check, analytics and OpenTelemetry off; a `hooks.json` whose
//! PreToolUse/PostToolUse hooks stage every tool call (`inbox-capture`); and the skill. What
//! Codex really sends, recorded from this version: its tools arrive as an `additional_tools`
//! input item, and in code mode the model drives them through one custom tool, `exec`, whose
//! input is JavaScript calling `tools.exec_command(...)` and `tools.apply_patch(...)`; the
//! script below is that, and Codex's hooks fire once per nested call (as `Bash` and
//! `apply_patch`), not per `exec` cell.
//!
//! The model service listens on a test host of the test's own (a `198.18.0.0/15` address in a
//! network namespace the test made) with a certificate from a CA this test made; the credential
//! proxy is pointed at it through h5i's test seams. Every tier runs twice: h5i as root, and as
//! the unprivileged test user `h5i-test` (`_as_h5i_test`); the test process itself is root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "model/agent.rs"]
mod agent;
mod common;
mod model;
#[path = "../broker/tests/support/mod.rs"]
mod support;

use std::net::Ipv4Addr;

use agent::{Agent, DeniedHost, Model};
use model::{Api, Call, Kind, Turn};
use serde_json::Value;

const CODEX: &str = "/usr/local/bin/codex";

const CODEX_AGENT: Agent = Agent {
    profile: "agent-codex",
    api: Api::OpenAi,
    host: "api.openai.com",
    key_var: "OPENAI_API_KEY",
    real: "sk-proj-REAL-host-only-51c7e0a93f",
    key_header: "authorization",
    key_prefix: "Bearer ",
    image: "localhost/h5i-agent-codex:latest",
};

/// `codex exec` as a person runs it in the box: no flags, h5i's system folder sets the rest.
const RUN_CODEX: &[&str] = &["codex", "exec", "fix the greeting in greeting.txt"];

#[test]
fn the_installed_codex_is_the_pinned_one() {
    if !agent::have_agent("the_installed_codex_is_the_pinned_one", CODEX) {
        return;
    }
    let out = std::process::Command::new(CODEX)
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        v.trim(),
        format!("codex-cli {}", agent::pinned("CODEX_VERSION"))
    );
}

/// One call of Codex's code-mode tool: `js` runs in its isolate.
fn exec(js: String) -> Call {
    Call::new("exec", Value::String(js))
}

/// JavaScript that runs `cmd` through Codex's `exec_command` and returns its output.
fn sh(cmd: &str) -> String {
    format!(
        "const r = await tools.exec_command({{cmd: {}}}); text(r.output);",
        Value::String(cmd.to_owned())
    )
}

/// The script: read the file, patch it and show it, look for the key, reach out, stage the
/// proposal, finish.
fn fix_script(denied_ip: Ipv4Addr) -> Vec<Turn> {
    let patch = "*** Begin Patch\n*** Update File: greeting.txt\n@@\n-helo wrld\n+hello world\n*** End Patch\n";
    vec![
        Turn::calls(vec![exec(sh("cat greeting.txt"))]).expecting("fix the greeting"),
        Turn::calls(vec![exec(format!(
            "await tools.apply_patch({}); {}",
            Value::String(patch.to_owned()),
            sh("cat greeting.txt")
        ))])
        .expecting("helo wrld"),
        Turn::calls(vec![exec(sh(&agent::scan_command(CODEX_AGENT.real)))])
            .expecting("hello world"),
        Turn::calls(vec![exec(sh(&agent::reach_out(
            "$OPENAI_BASE_URL/models",
            "api.anthropic.com",
            denied_ip,
        )))])
        .expecting("hits=[]")
        .expecting("skill=refused"),
        Turn::calls(vec![exec(sh(&agent::stage_proposal()))]).expecting("other=421"),
        Turn::finish("The greeting is fixed.").expecting("staged"),
    ]
}

/// Codex, in a box at `tier`, plays the fix script against the scripted model (checks in
/// `agent::check_session`, `agent::tool_calls_listed` and `DeniedHost::was_refused`); when
/// the test cannot make its denied host (not root) it has said `skipped:`.
fn codex_fixes_the_greeting(test: &str, tier: &str, as_user: bool) {
    let Some(denied) = DeniedHost::up(test) else {
        return;
    };
    let mut c = agent::greeting_box(&CODEX_AGENT, "cx", tier, as_user);
    let Some(m) = Model::start(test, &CODEX_AGENT, &c, fix_script(denied.ip())) else {
        return;
    };
    let report = agent::check_session(
        &CODEX_AGENT,
        &mut c,
        "cx",
        tier,
        &m,
        RUN_CODEX,
        "The greeting is fixed.",
    );
    denied.was_refused(&CODEX_AGENT, tier, &report);
    codex_loaded_the_skill(&m, tier);
    // What the agent ran, call by call, staged by h5i's hooks from Codex's read-only system
    // folder, listed under the host-observed run in the script's order.
    agent::tool_calls_listed(
        &c,
        "cx",
        &report,
        "codex",
        &[
            ("Bash", "cat greeting.txt"),
            ("apply_patch", "*** Begin Patch"),
            ("Bash", "cat greeting.txt"),
            ("Bash", "python3 -c"),
            ("Bash", "curl -sS"),
            ("Bash", "printf"),
        ],
    );
}

/// Codex loaded h5i's skill (the one embedded in h5i, in Codex's read-only system folder): the
/// request that opened the session, as the model service received it, lists the skill in its
/// catalog by its name and its description (read from `skills/h5i/SKILL.md`) with the file
/// Codex found it in.
fn codex_loaded_the_skill(m: &Model, tier: &str) {
    let skill = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("skills/h5i/SKILL.md"),
    )
    .unwrap();
    let description = skill
        .lines()
        .find_map(|l| l.strip_prefix("description: "))
        .expect("SKILL.md has a description");
    let first = m
        .service
        .requests()
        .into_iter()
        .find(|l| l.kind == Kind::Turn(0))
        .expect("the session's first turn");
    let sent = first.seen.all_text();
    // Its entry in Codex's catalog of available skills: `- NAME: DESCRIPTION (file: PATH)`,
    // the path under one of Codex's aliased skill roots (`r0/h5i/SKILL.md`).
    let entry = format!("- h5i: {description} (file: ");
    let path: Option<String> = sent.find(&entry).map(|at| {
        sent[at + entry.len()..]
            .chars()
            .take_while(|c| *c != ')')
            .collect()
    });
    assert!(
        path.as_deref()
            .is_some_and(|p| p.ends_with("/h5i/SKILL.md")),
        "at {tier}, Codex did not list h5i's skill to the model ({path:?}): {sent}"
    );
}

#[test]
fn codex_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key() {
    let test = "codex_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key";
    if agent::have_agent(test, CODEX) {
        codex_fixes_the_greeting(test, "process", false);
    }
}

#[test]
fn codex_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key_as_h5i_test() {
    let test = "codex_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key_as_h5i_test";
    if agent::have_agent(test, CODEX) {
        codex_fixes_the_greeting(test, "process", true);
    }
}

#[test]
fn codex_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key() {
    let test = "codex_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key";
    if agent::have_agent(test, CODEX) {
        codex_fixes_the_greeting(test, "supervised", false);
    }
}

#[test]
fn codex_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key_as_h5i_test() {
    let test =
        "codex_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key_as_h5i_test";
    if agent::have_agent(test, CODEX) {
        codex_fixes_the_greeting(test, "supervised", true);
    }
}

#[test]
fn codex_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key() {
    let test = "codex_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key";
    if agent::have_agent(test, CODEX) && agent::image_built(test, CODEX_AGENT.image) {
        codex_fixes_the_greeting(test, "container", false);
    }
}

#[test]
fn codex_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key_as_h5i_test() {
    let test =
        "codex_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key_as_h5i_test";
    if agent::have_agent(test, CODEX) && agent::image_built(test, CODEX_AGENT.image) {
        codex_fixes_the_greeting(test, "container", true);
    }
}
