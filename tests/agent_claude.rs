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

use crate::agent;
use crate::common;
use crate::model;

use std::net::Ipv4Addr;
use std::time::Duration;

use agent::{Agent, DeniedHost, Model, WORK};
use common::pty::{screen_text, Session};
use model::{Api, Call, Kind, Turn};
use serde_json::json;

const CLAUDE: &str = "/usr/local/bin/claude";

const CLAUDE_AGENT: Agent = Agent {
    profile: "agent-claude",
    api: Api::Anthropic,
    host: "api.anthropic.com",
    other_host: "api.openai.com",
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
            agent::reach_out("$ANTHROPIC_BASE_URL/v1/models", agent.other_host, denied_ip),
            "reach hosts outside the profile",
        )])
        .expecting("hits=[]")
        .expecting("skill=refused"),
        Turn::calls(vec![bash(agent::stage_proposal(), "stage the proposal")])
            .expecting("direct=000")
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

/// The script of a person's session: they ask for the fix at Claude Code's prompt; the model
/// reads the file, fixes it, shows it and stages the proposal.
fn shell_script(file: &str) -> Vec<Turn> {
    let bash = |command: String| Call::new("Bash", json!({"command": command, "description": "d"}));
    vec![
        Turn::calls(vec![Call::new("Read", json!({"file_path": file}))])
            .expecting("fix the greeting"),
        Turn::calls(vec![Call::new(
            "Edit",
            json!({"file_path": file, "old_string": "helo wrld", "new_string": "hello world"}),
        )])
        .expecting("helo wrld"),
        Turn::calls(vec![bash(format!("cat {file}"))]).expecting("has been updated"),
        Turn::calls(vec![bash(agent::stage_proposal())]).expecting("hello world"),
        Turn::finish("The greeting is fixed.").expecting("staged"),
    ]
}

/// A person runs `h5i box shell cl -- claude` in a fresh box at `tier`, on a real terminal:
/// Claude Code starts without its first-run screens in the way (no "Unable to connect to
/// Anthropic services": h5i made its onboarding done; no "Do you want to use this API key?":
/// h5i approved this run's dummy) and asks only whether to trust the folder, which the person
/// answers; they type the task, the scripted model plays it, and they leave with Ctrl-C twice.
/// The edit is in `box diff`, report.md lists each tool call with its lane under the
/// host-observed run of `claude`, and every model call carried the real key. A second session
/// in the same box (a new dummy) asks nothing at all when the box keeps its HOME.
fn claude_in_box_shell(test: &str, tier: &str, as_user: bool) {
    let mut c = agent::greeting_box(&CLAUDE_AGENT, "cl", tier, as_user);
    let file = format!("{WORK}/greeting.txt");
    let Some(m) = Model::start(test, &CLAUDE_AGENT, &c, shell_script(&file)) else {
        return;
    };
    let mut env = m.env(&CLAUDE_AGENT);
    env.push(("TERM", "xterm-256color"));
    let argv = [
        "box",
        "shell",
        "cl",
        "--",
        "claude",
        // Auto mode (the default) asks a classifier on Anthropic's side about each command,
        // which the scripted model does not serve.
        "--permission-mode",
        "acceptEdits",
        "--allowedTools",
        "Read",
        "Edit",
        "Bash",
    ];
    let mut s = Session::spawn(c.h5i_cmd_with(&argv, &env), agent::SESSION_LIMIT);
    // The folder's trust is the person's to answer (the cursor starts on "No, exit").
    // (It draws the question, then draws it again when it has settled, cursor reset: the
    // person answers the one that stays.)
    s.expect_screen("Yes, I trust this folder");
    s.read_for(Duration::from_secs(2));
    s.send("\x1b[B");
    s.expect_screen("❯ Yes, I trust this folder");
    s.read_for(Duration::from_millis(500));
    s.send("\r");
    s.expect_screen("shift+tab");
    s.send("fix the greeting in greeting.txt");
    s.read_for(Duration::from_millis(500));
    s.send("\r");
    s.expect_screen("The greeting is fixed.");
    s.send("\x03");
    s.read_for(Duration::from_millis(300));
    s.send("\x03");
    let code = s.finish();
    let screen = screen_text(&s.seen);
    for never in [
        "Unable to connect to Anthropic services",
        "Do you want to use this API key",
    ] {
        let never: String = never.chars().filter(|c| !c.is_whitespace()).collect();
        assert!(!screen.contains(&never), "at {tier}: {never}: {screen}");
    }
    assert_eq!(code, 0, "at {tier}: {screen}");
    assert!(
        m.service.problems().is_empty(),
        "{:?}",
        m.service.problems()
    );
    let want = format!("{}{}", CLAUDE_AGENT.key_prefix, CLAUDE_AGENT.real);
    let turns: Vec<_> = m
        .service
        .requests()
        .into_iter()
        .filter(|l| matches!(l.kind, Kind::Turn(_)))
        .collect();
    assert!(turns.len() >= 5, "at {tier}: {} turns", turns.len());
    for l in &turns {
        assert_eq!(l.seen.header(CLAUDE_AGENT.key_header), Some(want.as_str()));
    }
    let diff = c.ok(&["box", "diff", "cl"]);
    assert!(diff.contains("+hello world"), "at {tier}: {diff}");
    let report = agent::export_report(&c, "cl");
    assert!(
        agent::proposal_section(&report).contains(agent::PROPOSAL),
        "{report}"
    );
    agent::tool_calls_listed(
        &c,
        "cl",
        &report,
        "claude",
        &[
            ("Read", &file),
            ("Edit", &file),
            ("Bash", &format!("cat {file}")),
            ("Bash", "printf"),
        ],
    );
    if tier == "container" {
        // HOME is the run's own there: the next session starts as fresh as this one did.
        return;
    }
    // The second session: the box's HOME kept the trust and the onboarding, and h5i approved
    // the new dummy, so Claude Code goes straight to its prompt.
    let mut s = Session::spawn(c.h5i_cmd_with(&argv, &env), agent::SESSION_LIMIT);
    s.expect_screen("shift+tab");
    s.send("\x03");
    s.read_for(Duration::from_millis(300));
    s.send("\x03");
    assert_eq!(s.finish(), 0, "at {tier}: {}", screen_text(&s.seen));
    let screen = screen_text(&s.seen);
    assert!(!screen.contains("Doyouwanttousethis"), "{screen}");
    assert!(!screen.contains("Itrustthisfolder"), "{screen}");
}

#[test]
fn a_person_runs_claude_in_box_shell_at_the_process_tier() {
    let test = "a_person_runs_claude_in_box_shell_at_the_process_tier";
    if agent::have_agent(test, CLAUDE) {
        claude_in_box_shell(test, "process", false);
    }
}

#[test]
fn a_person_runs_claude_in_box_shell_at_the_process_tier_as_h5i_test() {
    let test = "a_person_runs_claude_in_box_shell_at_the_process_tier_as_h5i_test";
    if agent::have_agent(test, CLAUDE) {
        claude_in_box_shell(test, "process", true);
    }
}

#[test]
fn a_person_runs_claude_in_box_shell_at_the_supervised_tier() {
    let test = "a_person_runs_claude_in_box_shell_at_the_supervised_tier";
    if agent::have_agent(test, CLAUDE) {
        claude_in_box_shell(test, "supervised", false);
    }
}

#[test]
fn a_person_runs_claude_in_box_shell_at_the_supervised_tier_as_h5i_test() {
    let test = "a_person_runs_claude_in_box_shell_at_the_supervised_tier_as_h5i_test";
    if agent::have_agent(test, CLAUDE) {
        claude_in_box_shell(test, "supervised", true);
    }
}

#[test]
fn a_person_runs_claude_in_box_shell_at_the_container_tier() {
    let test = "a_person_runs_claude_in_box_shell_at_the_container_tier";
    if agent::have_agent(test, CLAUDE) && agent::image_built(test, CLAUDE_AGENT.image) {
        claude_in_box_shell(test, "container", false);
    }
}

#[test]
fn a_person_runs_claude_in_box_shell_at_the_container_tier_as_h5i_test() {
    let test = "a_person_runs_claude_in_box_shell_at_the_container_tier_as_h5i_test";
    if agent::have_agent(test, CLAUDE) && agent::image_built(test, CLAUDE_AGENT.image) {
        claude_in_box_shell(test, "container", true);
    }
}

/// What a hostile box plants at `~/.claude.json` for h5i's state step
/// (`h5i_hook::claude_state`) to trip on, at `tier` (where the box keeps its HOME between
/// runs): a symlink to a file of the workspace the box could write (so following it would
/// have worked), then one to a host file, then a fifo (an open that blocks would hang the
/// session). Each time the next run starts, says it left the file as it is, and runs its
/// command; the link's target is untouched and the fifo is still a fifo.
fn a_planted_claude_json_is_left_alone(test: &str, tier: &str, as_user: bool) {
    let mut c = agent::greeting_box(&CLAUDE_AGENT, "cl", tier, as_user);
    let Some(m) = Model::start(test, &CLAUDE_AGENT, &c, Vec::new()) else {
        return;
    };
    let env = m.env(&CLAUDE_AGENT);
    let run = |c: &mut common::Caller, script: &str| {
        let out = c.h5i_bounded(
            &["box", "run", "cl", "--", "sh", "-c", script],
            &env,
            agent::SESSION_LIMIT,
        );
        (
            out.status.code(),
            common::stdout(&out),
            common::stderr(&out),
        )
    };
    let plant = [
        (
            "rm -f ~/.claude.json && ln -s /work/greeting.txt ~/.claude.json",
            "a symlink",
        ),
        (
            "rm ~/.claude.json && ln -s /etc/hostname ~/.claude.json",
            "a symlink",
        ),
        ("rm ~/.claude.json && mkfifo ~/.claude.json", "a fifo"),
    ];
    let hostname = std::fs::read("/etc/hostname").unwrap();
    for (script, what) in plant {
        let (code, out, err) = run(&mut c, &format!("{script} && echo planted"));
        assert_eq!(
            (code, out.as_str()),
            (Some(0), "planted\n"),
            "at {tier}: {err}"
        );
        let (code, out, err) = run(
            &mut c,
            "if [ -p ~/.claude.json ]; then echo fifo; else readlink ~/.claude.json; fi",
        );
        assert_eq!(code, Some(0), "at {tier}: {err}");
        assert!(
            err.contains("left /") && err.contains(&format!("it is {what}")),
            "at {tier}, {script}: {err}"
        );
        assert_ne!(out.trim(), "", "at {tier}: {err}");
        assert_eq!(
            std::fs::read_to_string(c.workspace("cl").join("greeting.txt")).unwrap(),
            "helo wrld\n",
            "at {tier}"
        );
        assert_eq!(std::fs::read("/etc/hostname").unwrap(), hostname);
    }
}

#[test]
fn a_planted_claude_json_link_or_fifo_is_left_alone_at_the_process_tier() {
    let test = "a_planted_claude_json_link_or_fifo_is_left_alone_at_the_process_tier";
    if agent::have_agent(test, CLAUDE) {
        a_planted_claude_json_is_left_alone(test, "process", false);
    }
}

#[test]
fn a_planted_claude_json_link_or_fifo_is_left_alone_at_the_supervised_tier_as_h5i_test() {
    let test =
        "a_planted_claude_json_link_or_fifo_is_left_alone_at_the_supervised_tier_as_h5i_test";
    if agent::have_agent(test, CLAUDE) {
        a_planted_claude_json_is_left_alone(test, "supervised", true);
    }
}
