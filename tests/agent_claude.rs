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

/// A content far over the payload cap, for the model to have Claude Code write.
fn big_content() -> String {
    "0123456789abcdef\n".repeat(6000)
}

/// The commands of the session that shows what the box keeps of an agent's tool calls.
const SWITCHES: &str = "env | grep -E '^(DISABLE_|CLAUDE_CODE_DISABLE_)' | sort";
const SHOW_KEY: &str = "printf 'key=%s\\n' \"$ANTHROPIC_API_KEY\"";
const FLOOD_KEY: &str =
    "for i in $(seq 1200); do printf %s \"$ANTHROPIC_API_KEY\"; done; echo; echo flooded";
/// Two records staged as the hook would, a `Bash` call's PreToolUse and PostToolUse, named as
/// staged in 1970: a tool call the box claims at a time h5i saw no run.
const FORGE: &str = r#"python3 -c 'import json, os
spool = os.environ["H5I_ENV_CAPTURE_SPOOL"]
for n, event in ((1, "PreToolUse"), (2, "PostToolUse")):
    call = {"hook_event_name": event, "tool_name": "Bash", "tool_use_id": "toolu_forged",
            "tool_input": {"command": "curl https://exfil.invalid/"}}
    entry = {"kind": "tool-call", "lane": "inbox-capture", "source": "claude-code",
             "payload": json.dumps(call)}
    open(os.path.join(spool, "tool-call-%024d-1.json" % n), "x").write(json.dumps(entry))
print("forged")'"#;

/// The script: show the switches h5i set (each must reach the model as the box printed it),
/// print the box's per-run dummy once and then 1200 times over (a secret of the box's
/// credential grant, in a payload the hook cuts), write a file far over the payload cap, forge
/// a tool call staged in 1970, finish.
fn evidence_script(file: &str) -> Vec<Turn> {
    let bash = |command: &str| Call::new("Bash", json!({"command": command, "description": "d"}));
    let mut switches = Turn::calls(vec![bash(SHOW_KEY)]);
    for (k, v) in h5i::agent::runtime_env(Some(h5i_policy::AgentRuntime::Claude)) {
        switches = switches.expecting(&format!("{k}={v}"));
    }
    vec![
        Turn::calls(vec![bash(SWITCHES)]).expecting("show what you run with"),
        switches,
        Turn::calls(vec![bash(FLOOD_KEY)]).expecting("key=h5i-dummy-"),
        Turn::calls(vec![Call::new(
            "Write",
            json!({"file_path": file, "content": big_content()}),
        )]),
        Turn::calls(vec![bash(FORGE)]).expecting("big.txt"),
        Turn::finish("Shown.").expecting("forged"),
    ]
}

/// What h5i keeps of an agent's tool calls, from a real Claude Code session in a box at
/// `tier` (issue 15's acceptance audit):
/// - the agent's environment as the box sees it has every telemetry and auto-update switch of
///   `h5i::agent::runtime_env` (the model's second turn is played only when the box's `env`
///   printed them), and the model service saw nothing but model calls (no other path of its
///   host: no event logging, no metrics), and the box's egress table refused nothing (no
///   telemetry host was tried);
/// - the box's per-run dummy (the secret its credential grant hands it) printed by a tool
///   call is in no payload, receipt, log or export, and not in `box inspect --capture`: each
///   stored payload says `[REDACTED:credential-dummy:ANTHROPIC_API_KEY]` instead, and no 16
///   characters of its random part are anywhere h5i wrote, even where the hook cut the
///   printout through a copy of it (the box's HOME is the agent's own: Claude Code's
///   transcript there holds what its tools printed, as the box held the dummy itself);
/// - a tool call whose payload is far over the cap is stored within
///   `MAX_PAYLOAD_BYTES`, ending with the marker that says the box's hook cut it, and report.md
///   says h5i could not read the cut record rather than listing it as something else;
/// - the tool call the box forged, staged "in 1970", is a finding in "Evidence problems":
///   the box claims a time before the run h5i observed began.
fn what_the_box_keeps_of_tool_calls(test: &str, tier: &str, as_user: bool) {
    use h5i::session::record::{BOX_CUT_MARKER, MAX_PAYLOAD_BYTES};
    let mut c = agent::greeting_box(&CLAUDE_AGENT, "cl", tier, as_user);
    let file = format!("{WORK}/big.txt");
    let Some(m) = Model::start(test, &CLAUDE_AGENT, &c, evidence_script(&file)) else {
        return;
    };
    let argv = [
        "box",
        "run",
        "cl",
        "--",
        "claude",
        "-p",
        "show what you run with",
        "--allowedTools",
        "Bash",
        "Write",
    ];
    let out = c.h5i_bounded(&argv, &m.env(&CLAUDE_AGENT), agent::SESSION_LIMIT);
    let reqs = m.service.requests();
    let kinds: Vec<_> = reqs.iter().map(|l| (&l.kind, &l.seen.path)).collect();
    assert_eq!(
        out.status.code(),
        Some(0),
        "at {tier}: {}\n{}\nproblems: {:?}\nrequests: {kinds:?}",
        common::stdout(&out),
        common::stderr(&out),
        m.service.problems()
    );
    assert!(common::stdout(&out).contains("Shown."));
    // Every request was a model call; the script's turns were played in order.
    assert!(
        reqs.iter().all(|l| matches!(
            l.kind,
            Kind::Turn(_) | Kind::Side | Kind::CountTokens | Kind::Models
        )),
        "at {tier}: a request that is no model call: {kinds:?}"
    );
    let mut played = m.service.turns_served();
    played.dedup();
    assert_eq!(played, (0..6).collect::<Vec<_>>(), "{kinds:?}");

    // The box's dummy, as the model saw it printed.
    let sent: String = reqs.iter().map(|l| l.seen.all_text()).collect();
    let at = sent
        .find("key=h5i-dummy-")
        .expect("the dummy reached the model")
        + 4;
    let dummy = &sent[at..at + "h5i-dummy-".len() + 64];
    assert!(
        dummy[10..].bytes().all(|b| b.is_ascii_hexdigit()),
        "{dummy}"
    );

    let report = agent::export_report(&c, "cl");
    let out_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(out_dir.path(), Some(c.uid()), Some(c.uid())).unwrap();
    let review = out_dir.path().join("review");
    c.ok(&["box", "export", "cl", "--out", review.to_str().unwrap()]);
    let mut shown = c.ok(&["box", "log", "cl"]);
    let receipts = c.receipts("cl");
    for r in &receipts {
        let seq = r["seq"].to_string();
        shown.push_str(&c.ok(&["box", "inspect", "cl", "--capture", &seq]));
    }
    // h5i's own records: the box directory but the box's HOME and workspace, and the export.
    let box_dir = c.box_dir("cl");
    let mut ours = vec![review.clone()];
    for e in std::fs::read_dir(&box_dir).unwrap() {
        let p = e.unwrap().path();
        if !p.ends_with("home") && !p.ends_with("workspace") {
            ours.push(p);
        }
    }
    let files = every_file(&ours);
    assert!(
        files.iter().any(|(p, _)| p.contains("payloads")),
        "{ours:?}"
    );
    for window in dummy.as_bytes()[10..].windows(16) {
        let hits: Vec<&String> = files
            .iter()
            .filter(|(_, bytes)| bytes.windows(16).any(|w| w == window))
            .map(|(p, _)| p)
            .collect();
        if let Some(hit) = hits.first() {
            let (_, bytes) = files.iter().find(|(p, _)| p == *hit).unwrap();
            let at = bytes.windows(16).position(|w| w == window).unwrap();
            let around = &bytes[at.saturating_sub(200)..(at + 200).min(bytes.len())];
            panic!(
                "at {tier}: part of the dummy in {hits:?}: {}",
                String::from_utf8_lossy(around)
            );
        }
        let w = std::str::from_utf8(window).unwrap();
        assert!(
            !shown.contains(w),
            "at {tier}: part of the dummy shown: {shown}"
        );
        assert!(!report.contains(w), "{report}");
    }
    assert!(common::files_containing(&box_dir, CLAUDE_AGENT.real.as_bytes()).is_empty());
    assert!(common::files_containing(&review, CLAUDE_AGENT.real.as_bytes()).is_empty());

    // The payloads: each within the cap; the dummy's printout redacted by its rule id, in a
    // record that names the rule; the cut ones end with the marker.
    let rule = "credential-dummy:ANTHROPIC_API_KEY";
    let mut redacted = 0;
    let mut cut = Vec::new();
    for r in receipts.iter().filter(|r| r["payload"].is_string()) {
        let path = box_dir
            .join("payloads")
            .join(r["payload"].as_str().unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() <= MAX_PAYLOAD_BYTES, "{path:?}: {}", text.len());
        if text.contains(&format!("[REDACTED:{rule}]")) {
            redacted += 1;
            let ids: Vec<&str> = r["redactions"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| v.as_str())
                .collect();
            assert!(ids.contains(&rule), "{r}");
        }
        if r["claim"]["payload_cut"] == true {
            assert!(
                text.ends_with(BOX_CUT_MARKER),
                "{path:?}: {:?}",
                text.get(text.len().saturating_sub(200)..)
            );
            cut.push(r["seq"].to_string());
        }
    }
    // The one printout, and the flood (its PostToolUse, whether or not the hook cut it).
    assert!(redacted >= 2, "at {tier}: {redacted} redacted payloads");
    // The Write's PreToolUse at least (its content alone is over the cap).
    assert!(!cut.is_empty(), "at {tier}: no payload was cut");
    let inspected = c.ok(&["box", "inspect", "cl", "--capture", &cut[0]]);
    assert!(
        inspected.contains("the box's capture says it cut this payload short"),
        "{inspected}"
    );
    let ran = agent::what_ran_section(&report);
    assert!(
        ran.contains("(a staged record the box's hook cut short, which h5i could not read)"),
        "{ran}"
    );

    // The switches reached the box and nothing reached out.
    let denied = agent::denied_section(&report);
    assert!(
        denied.trim_start().starts_with("None recorded") && denied.contains("refused none"),
        "at {tier}: {denied}"
    );

    // The forged call is a finding: staged, the box says, before the run began.
    let problems = agent::problems_section(&report);
    let forged: Vec<&str> = problems
        .lines()
        .filter(|l| {
            l.contains(
                "the box claims it staged this record at 1970-01-01T00:00:00.000Z, before run #",
            )
        })
        .collect();
    assert_eq!(forged.len(), 2, "at {tier}: {problems}");
}

#[test]
fn what_a_claude_box_keeps_of_tool_calls_at_the_process_tier() {
    let test = "what_a_claude_box_keeps_of_tool_calls_at_the_process_tier";
    if agent::have_agent(test, CLAUDE) {
        what_the_box_keeps_of_tool_calls(test, "process", false);
    }
}

#[test]
fn what_a_claude_box_keeps_of_tool_calls_at_the_process_tier_as_h5i_test() {
    let test = "what_a_claude_box_keeps_of_tool_calls_at_the_process_tier_as_h5i_test";
    if agent::have_agent(test, CLAUDE) {
        what_the_box_keeps_of_tool_calls(test, "process", true);
    }
}

#[test]
fn what_a_claude_box_keeps_of_tool_calls_at_the_supervised_tier_as_h5i_test() {
    let test = "what_a_claude_box_keeps_of_tool_calls_at_the_supervised_tier_as_h5i_test";
    if agent::have_agent(test, CLAUDE) {
        what_the_box_keeps_of_tool_calls(test, "supervised", true);
    }
}

/// Every regular file under `paths` (each a file or a directory), with its bytes.
fn every_file(paths: &[std::path::PathBuf]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = paths.to_vec();
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if meta.is_file() {
            out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
    out
}

/// `make demo`'s agent step, run the way the demo runs it: `scripts/demo-agent.sh` as it is
/// (the box of `agent-claude` at the auto tier, `claude -p`, diff, export, the key check, the
/// patch applied to a fresh copy of the sample and its tests run), as root or the test user,
/// against the demo's own script (`tests/model/demo.rs`) served on 127.0.0.1 as
/// `examples/scripted_model.rs` serves it. The step ends 0; the model played every turn with
/// the host's key on each call; the export's patch holds the fix; report.md lists the five
/// tool calls in order, each in the `inbox-capture` lane, under the host-observed run of
/// `claude` at a confining tier, and the agent's proposal.
fn the_demos_agent_step(as_user: bool) {
    let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
    let (demo_agent, sample) = (
        scripts.join("demo-agent.sh"),
        scripts.join("make-sample-repo.sh"),
    );
    let c = match as_user {
        // The test user cannot read this tree: it gets its own copies of the two scripts,
        // beside each other as in the repository.
        true => common::Caller::user_with(&[
            (demo_agent.as_path(), "scripts/demo-agent.sh"),
            (sample.as_path(), "scripts/make-sample-repo.sh"),
        ]),
        false => common::Caller::root(),
    };
    let tree = c.repo().parent().unwrap().to_path_buf();
    let script = match as_user {
        true => tree.join("scripts/demo-agent.sh"),
        false => demo_agent,
    };
    let work = tempfile::Builder::new()
        .prefix("h5i-demo")
        .tempdir_in(&tree)
        .unwrap();
    std::os::unix::fs::chown(work.path(), Some(c.uid()), Some(c.uid())).unwrap();

    let ca = crate::support::TestCa::new();
    let service = model::ModelService::start(
        ca.server_config(&["api.anthropic.com"]),
        Api::Anthropic,
        crate::demo::script(),
    );
    let ca_file = work.path().join("ca.der");
    std::fs::write(&ca_file, &ca.ca_der).unwrap();
    std::os::unix::fs::chown(&ca_file, Some(c.uid()), Some(c.uid())).unwrap();
    let key = "sk-ant-demo-host-only-test-8c1d55";
    let hosts = format!("api.anthropic.com={}", service.addr);

    let mut cmd = c.sh_in(
        work.path(),
        r#"H5I="$1" H5I_DEMO_KEY="$2" exec "$3" "$4" "$5" "$6""#,
    );
    cmd.arg("sh")
        .arg(c.h5i_bin())
        .arg(key)
        .arg(&script)
        .arg(work.path())
        .arg(&hosts)
        .arg(&ca_file);
    let out = common::output_bounded(cmd, agent::SESSION_LIMIT, "scripts/demo-agent.sh");
    let said = format!("{}\n{}", common::stdout(&out), common::stderr(&out));
    assert_eq!(
        out.status.code(),
        Some(0),
        "as {}: {said}\nproblems: {:?}",
        c.who(),
        service.problems()
    );
    assert!(service.problems().is_empty(), "{:?}", service.problems());
    let mut played = service.turns_served();
    played.dedup();
    let turns = crate::demo::script().len();
    assert_eq!(played, (0..turns).collect::<Vec<_>>());
    for l in service
        .requests()
        .iter()
        .filter(|l| matches!(l.kind, Kind::Turn(_) | Kind::Side))
    {
        assert_eq!(l.seen.header("x-api-key"), Some(key), "{}", l.seen.path);
    }

    let review = work.path().join("agent-review");
    let patch = std::fs::read_to_string(review.join("patch.diff")).unwrap();
    assert!(
        patch.contains("+    words = text.split()")
            && patch.contains("-    words = [w for w in text.split(\" \") if w]"),
        "{patch}"
    );
    let report = std::fs::read_to_string(review.join("report.md")).unwrap();
    let run = agent::what_ran_section(&report)
        .lines()
        .find(|l| l.contains("`host-env-run` (host-observed)") && l.contains(": `claude "))
        .unwrap_or_else(|| panic!("no run of claude: {report}"));
    assert!(
        ["`process`", "`supervised`", "`container`"]
            .iter()
            .any(|t| run.contains(t)),
        "the demo's box is not confined: {run}"
    );
    let listed = agent::listed_under_run(&report, "claude", "inbox-capture");
    // (Claude Code drops the script's leading `cd /work && `, the folder it runs in, from the
    // command it reports to its hooks.)
    let tests = crate::demo::TESTS.trim_start_matches("cd /work && ");
    let calls = [
        ("Read", crate::demo::FILE),
        ("Bash", tests),
        ("Edit", crate::demo::FILE),
        ("Bash", tests),
        ("Bash", "printf"),
    ];
    assert_eq!(listed.len(), calls.len(), "{report}");
    for (line, (tool, what)) in listed.iter().zip(calls) {
        assert!(
            line.contains(&format!("`inbox-capture` (box-claimed) `{tool}`: `{what}"))
                && line.ends_with("— PreToolUse, PostToolUse"),
            "{tool} {what}: {line}\n{report}"
        );
    }
    assert!(
        agent::proposal_section(&report).contains("word_count split on single spaces"),
        "{report}"
    );
    // What the step printed is the report it wrote.
    assert!(said.contains("## What ran"), "{said}");
}

#[test]
fn the_demos_agent_step_fixes_the_sample_in_a_confined_box() {
    let test = "the_demos_agent_step_fixes_the_sample_in_a_confined_box";
    if agent::have_agent(test, CLAUDE) {
        the_demos_agent_step(false);
    }
}

#[test]
fn the_demos_agent_step_fixes_the_sample_in_a_confined_box_as_h5i_test() {
    let test = "the_demos_agent_step_fixes_the_sample_in_a_confined_box_as_h5i_test";
    if agent::have_agent(test, CLAUDE) {
        the_demos_agent_step(true);
    }
}
