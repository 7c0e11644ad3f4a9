//! Claude Code in a box, end to end, against the scripted model service (tests/model): the real
//! `claude` binary (installed by `make setup`) runs `claude -p` in a box, the model's script
//! has it read, edit and check a file, and the test checks what came out (tests/model/agent.rs):
//! the edit in `box diff` and in the export's patch, the real credential at the model service
//! and nowhere the box could see it.
//!
//! The model service listens on a test host of the test's own (a `198.18.0.0/15` address in a
//! network namespace the test made) with a certificate from a CA this test made; the credential
//! proxy is pointed at it through h5i's test seams (`H5I_TEST_HOSTS`, `H5I_TEST_CA_FILE`), never
//! through the system resolver. Every tier runs twice: h5i as root, and as the unprivileged test
//! user `h5i-test` (`_as_h5i_test`); the test process itself is root (it makes the test hosts).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "model/agent.rs"]
mod agent;
mod common;
mod model;
#[path = "../broker/tests/support/mod.rs"]
mod support;

use std::net::Ipv4Addr;

use agent::{Agent, DeniedHost, Model, WORK};
use model::{Api, Call, Turn};
use serde_json::json;

const CLAUDE: &str = "/usr/local/bin/claude";

const CLAUDE_AGENT: Agent = Agent {
    profile: "agent-claude",
    api: Api::Anthropic,
    host: "api.anthropic.com",
    key_var: "ANTHROPIC_API_KEY",
    real: "sk-ant-REAL-host-only-9d2e61c0b4",
    key_header: "x-api-key",
    key_prefix: "",
    image: "localhost/h5i-agent-claude:latest",
};

/// Claude Code logged in with a subscription token (`claude setup-token`) instead of an API
/// key: the host has only `CLAUDE_CODE_OAUTH_TOKEN`, which Claude Code sends as a bearer token.
const CLAUDE_SUBSCRIPTION: Agent = Agent {
    key_var: "CLAUDE_CODE_OAUTH_TOKEN",
    real: "sk-ant-oat01-REAL-host-only-subscription-5f1a",
    key_header: "authorization",
    key_prefix: "Bearer ",
    ..CLAUDE_AGENT
};

#[test]
fn the_installed_claude_is_the_pinned_one() {
    if !agent::have_agent("the_installed_claude_is_the_pinned_one", CLAUDE) {
        return;
    }
    let out = std::process::Command::new(CLAUDE)
        .arg("--version")
        .env("DISABLE_AUTOUPDATER", "1")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(
        v.starts_with(&format!("{} ", agent::pinned("CLAUDE_CODE_VERSION"))),
        "{v}"
    );
}

/// The script: read the file, fix it, check it, look for the key, reach out, stage the
/// proposal, finish.
fn fix_script(agent: &Agent, file: &str, denied_ip: Ipv4Addr) -> Vec<Turn> {
    let bash = |command: String, description: &str| {
        Call::new(
            "Bash",
            json!({"command": command, "description": description}),
        )
    };
    vec![
        Turn::calls(vec![Call::new("Read", json!({"file_path": file}))])
            .expecting("fix the greeting"),
        Turn::calls(vec![Call::new(
            "Edit",
            json!({"file_path": file, "old_string": "helo wrld", "new_string": "hello world"}),
        )])
        .expecting("helo wrld"),
        Turn::calls(vec![bash(format!("cat {file}"), "show the fixed file")])
            .expecting("has been updated"),
        Turn::calls(vec![bash(
            agent::scan_command(agent.real),
            "look for the host's key",
        )])
        .expecting("hello world"),
        Turn::calls(vec![bash(
            agent::reach_out("$ANTHROPIC_BASE_URL/v1/models", "api.openai.com", denied_ip),
            "reach hosts outside the profile",
        )])
        .expecting("hits=[]")
        .expecting("skill=refused"),
        Turn::calls(vec![bash(agent::stage_proposal(), "stage the proposal")])
            .expecting("other=421"),
        Turn::finish("The greeting is fixed.").expecting("staged"),
    ]
}

/// Claude Code, in a box at `tier`, plays the fix script against the scripted model (checks in
/// `agent::check_session`, `agent::tool_calls_listed` and `DeniedHost::was_refused`); when
/// the test cannot make its denied host (not root) it has said `skipped:`.
fn claude_fixes_the_greeting(who: &Agent, test: &str, tier: &str, as_user: bool) {
    let Some(denied) = DeniedHost::up(test) else {
        return;
    };
    let mut c = agent::greeting_box(who, "cl", tier, as_user);
    let Some(m) = Model::start(
        test,
        who,
        &c,
        fix_script(who, &format!("{WORK}/greeting.txt"), denied.ip()),
    ) else {
        return;
    };
    let argv = [
        "claude",
        "-p",
        "fix the greeting in greeting.txt",
        "--allowedTools",
        "Read",
        "Edit",
        "Bash",
    ];
    let report = agent::check_session(who, &mut c, "cl", tier, &m, &argv, "The greeting is fixed.");
    denied.was_refused(who, tier, &report);
    // What the agent ran, call by call, staged by h5i's hook from the box's read-only managed
    // settings, listed under the host-observed run in the script's order.
    let file = format!("{WORK}/greeting.txt");
    agent::tool_calls_listed(
        &c,
        "cl",
        &report,
        "claude",
        &[
            ("Read", &file),
            ("Edit", &file),
            ("Bash", &format!("cat {file}")),
            ("Bash", "python3 -c"),
            ("Bash", "curl -sS"),
            ("Bash", "printf"),
        ],
    );
}

#[test]
fn claude_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key() {
    let test = "claude_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key";
    if agent::have_agent(test, CLAUDE) {
        claude_fixes_the_greeting(&CLAUDE_AGENT, test, "process", false);
    }
}

#[test]
fn claude_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key_as_h5i_test() {
    let test =
        "claude_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key_as_h5i_test";
    if agent::have_agent(test, CLAUDE) {
        claude_fixes_the_greeting(&CLAUDE_AGENT, test, "process", true);
    }
}

#[test]
fn claude_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key() {
    let test = "claude_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key";
    if agent::have_agent(test, CLAUDE) {
        claude_fixes_the_greeting(&CLAUDE_AGENT, test, "supervised", false);
    }
}

#[test]
fn claude_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key_as_h5i_test() {
    let test =
        "claude_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key_as_h5i_test";
    if agent::have_agent(test, CLAUDE) {
        claude_fixes_the_greeting(&CLAUDE_AGENT, test, "supervised", true);
    }
}

#[test]
fn claude_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key() {
    let test = "claude_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key";
    if agent::have_agent(test, CLAUDE) && agent::image_built(test, CLAUDE_AGENT.image) {
        claude_fixes_the_greeting(&CLAUDE_AGENT, test, "container", false);
    }
}

#[test]
fn claude_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key_as_h5i_test() {
    let test =
        "claude_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key_as_h5i_test";
    if agent::have_agent(test, CLAUDE) && agent::image_built(test, CLAUDE_AGENT.image) {
        claude_fixes_the_greeting(&CLAUDE_AGENT, test, "container", true);
    }
}

#[test]
fn claude_with_a_subscription_token_at_the_process_tier_never_holds_the_token() {
    let test = "claude_with_a_subscription_token_at_the_process_tier_never_holds_the_token";
    if agent::have_agent(test, CLAUDE) {
        claude_fixes_the_greeting(&CLAUDE_SUBSCRIPTION, test, "process", false);
    }
}

#[test]
fn claude_with_a_subscription_token_at_the_supervised_tier_never_holds_the_token_as_h5i_test() {
    let test =
        "claude_with_a_subscription_token_at_the_supervised_tier_never_holds_the_token_as_h5i_test";
    if agent::have_agent(test, CLAUDE) {
        claude_fixes_the_greeting(&CLAUDE_SUBSCRIPTION, test, "supervised", true);
    }
}

#[test]
fn claude_with_a_subscription_token_at_the_container_tier_never_holds_the_token() {
    let test = "claude_with_a_subscription_token_at_the_container_tier_never_holds_the_token";
    if agent::have_agent(test, CLAUDE) && agent::image_built(test, CLAUDE_SUBSCRIPTION.image) {
        claude_fixes_the_greeting(&CLAUDE_SUBSCRIPTION, test, "container", false);
    }
}
