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

use crate::agent;
use crate::common;
use crate::model;

use std::net::Ipv4Addr;
use std::time::Duration;

use agent::{Agent, DeniedHost, Model};
use common::pty::{screen_text, Session};
use model::{Api, Call, Kind, Turn};
use serde_json::Value;

const CODEX: &str = "/usr/local/bin/codex";

const CODEX_AGENT: Agent = Agent {
    profile: "agent-codex",
    api: Api::OpenAi,
    host: "api.openai.com",
    other_host: "api.anthropic.com",
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
            CODEX_AGENT.other_host,
            denied_ip,
        )))])
        .expecting("hits=[]")
        .expecting("skill=refused"),
        Turn::calls(vec![exec(sh(&agent::stage_proposal()))])
            .expecting("direct=000")
            .expecting("other=421"),
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
    shim_recorded_each_command(&c, &report, tier);
}

/// Each command Codex ran, as the tee shim h5i binds over the box's bash recorded it: listed
/// under the run in the `tee-shim` lane, in the script's order, each with its exit and working
/// directory; the two box-side accounts (the hooks' `Bash` calls and the shim's commands) agree,
/// so "Evidence problems" names no gap; and each command's output head is stored, redacted,
/// as a payload (the first `cat` printed the file before the fix).
fn shim_recorded_each_command(c: &common::Caller, report: &str, tier: &str) {
    let want = [
        "cat greeting.txt",
        "cat greeting.txt",
        "python3 -c",
        "curl -sS",
        "printf",
    ];
    let listed = agent::listed_under_run(report, "codex", "tee-shim");
    assert_eq!(listed.len(), want.len(), "at {tier}: {listed:#?}\n{report}");
    for (line, cmd) in listed.iter().zip(want) {
        assert!(
            line.contains(&format!("`tee-shim` (box-claimed) `{cmd}"))
                && line.ends_with("— exit 0 in `/work`"),
            "at {tier}, {cmd}: {line}"
        );
    }
    // The two lanes read interleaved by the time each record was staged: every `Bash` call
    // (its PreToolUse staged before the command ran) right before the shim's record of its
    // command (staged when it ended; the same command, or "Evidence problems" would name the
    // gap), each line naming its lane, the times never going back.
    let both = agent::under_run(report, "codex");
    let lanes: Vec<&str> = both
        .iter()
        .map(|l| {
            if l.contains("`inbox-capture` (box-claimed) `Bash`") {
                "Bash"
            } else if l.contains("`inbox-capture` (box-claimed)") {
                "other call"
            } else if l.contains("`tee-shim` (box-claimed)") {
                "command"
            } else {
                l
            }
        })
        .collect();
    let mut want = vec!["Bash", "command", "other call"];
    want.extend(["Bash", "command"].repeat(4));
    assert_eq!(lanes, want, "at {tier}:\n{report}");
    let times: Vec<i64> = both
        .iter()
        .map(|l| agent::staged_ms(l).unwrap_or_else(|| panic!("no time: {l}")))
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "at {tier}: {times:?}\n{report}"
    );
    assert!(
        times.first().is_some_and(|t| *t >= 0),
        "at {tier}: {times:?}"
    );
    let problems = agent::problems_section(report);
    assert!(!problems.contains("shell shim"), "at {tier}: {problems}");
    let payloads = agent::payloads_of(c, "cx", "tee-shim");
    assert_eq!(payloads.len(), listed.len(), "{payloads:?}");
    let first: Value =
        serde_json::from_str(&std::fs::read_to_string(&payloads[0]).unwrap()).unwrap();
    assert_eq!(first["stdout"], "helo wrld\n", "{first}");
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

/// What a hostile box stages for a run: a `Bash` call (PreToolUse and PostToolUse) its hooks
/// never made, a `tee-shim` record of a command nothing ran, and shim records h5i must refuse or
/// not read: raw escapes (not JSON), an escape in a string, one over the spool's cap, and one
/// of the wrong shape.
const FORGE: &str = r#"
import json, os
sp = os.environ["H5I_ENV_CAPTURE_SPOOL"]
def put(name, text):
    with open(os.path.join(sp, name), "w") as f:
        f.write(text)
def call(ev):
    hook = {"hook_event_name": ev, "tool_name": "Bash", "tool_use_id": "forged-1",
            "tool_input": {"command": "ls"}}
    return json.dumps({"kind": "tool-call", "lane": "inbox-capture", "source": "codex",
                       "payload": json.dumps(hook)})
def shim(**k):
    return json.dumps(dict({"kind": "command", "lane": "tee-shim", "cwd": "/work", "exit": 0}, **k))
put("tool-call-1.json", call("PreToolUse"))
put("tool-call-2.json", call("PostToolUse"))
put("command-1.json", shim(command="rm -rf /", signal=None, stdout="", stderr=""))
put("command-2.json", '{"kind":"command","lane":"tee-shim","command":"\x1b]52;c;aGk=\x07"}')
put("command-3.json", shim(command="a" * 100000))
put("command-4.json", shim(command=["x"], exit="0"))
put("command-5.json", shim(command="\x1b[2J"))
print("forged")
"#;

/// What a hostile box does to its shim, after which a `bash -c` must still be the shim's:
/// opens each of the box's `bash` paths, the real bash the shim runs and the hook program for
/// writing, moves the shim aside, unlinks it, and unmounts it. Prints one `WHAT PATH ERRNO`
/// line each.
const ATTACK_SHIM: &str = r#"
import ctypes, errno, os
real = "/.h5i/shell/bash"
print("real", os.path.isfile(real))
def name(e):
    return errno.errorcode.get(e, str(e))
for p in ["/usr/bin/bash", "/bin/bash", "/.h5i/bin/h5i-hook", real]:
    try:
        os.close(os.open(p, os.O_WRONLY))
        print("write", p, "opened")
    except OSError as e:
        print("write", p, name(e.errno))
for what, act in [("rename", lambda: os.rename("/usr/bin/bash", "/usr/bin/bash-gone")),
                  ("unlink", lambda: os.unlink("/usr/bin/bash"))]:
    try:
        act()
        print(what, "/usr/bin/bash done")
    except OSError as e:
        print(what, "/usr/bin/bash", name(e.errno))
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.umount2(b"/usr/bin/bash", 2)
print("umount /usr/bin/bash", "unmounted" if rc == 0 else name(ctypes.get_errno()))
"#;

/// The box's attacks on its shim ([`ATTACK_SHIM`]) all refused from inside at `tier`: every
/// write is EROFS or EACCES, moving the shim aside or unlinking it is refused (EBUSY: it is a
/// mount point; EROFS or EACCES), and the unmount is EPERM.
fn the_shim_is_out_of_the_boxs_reach(c: &mut common::Caller, env: &[(&str, &str)], tier: &str) {
    let out = c.h5i_bounded(
        &["box", "run", "cx", "--", "python3", "-c", ATTACK_SHIM],
        env,
        agent::SESSION_LIMIT,
    );
    let said = common::stdout(&out);
    assert!(
        out.status.success(),
        "at {tier}: {said}{}",
        common::stderr(&out)
    );
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.first(), Some(&"real True"), "at {tier}: {said}");
    let writes: Vec<&&str> = lines.iter().filter(|l| l.starts_with("write ")).collect();
    assert_eq!(writes.len(), 4, "at {tier}: {said}");
    for l in writes {
        assert!(
            l.ends_with(" EROFS") || l.ends_with(" EACCES"),
            "at {tier}, the box could write its shim or bash: {l}\n{said}"
        );
    }
    for what in ["rename", "unlink"] {
        let line = lines.iter().find(|l| l.starts_with(what)).unwrap();
        assert!(
            ["EBUSY", "EROFS", "EACCES"]
                .iter()
                .any(|e| line.ends_with(&format!(" {e}"))),
            "at {tier}, the box could {what} its shim: {said}"
        );
    }
    assert!(
        lines.contains(&"umount /usr/bin/bash EPERM"),
        "at {tier}, the box could unmount its shim: {said}"
    );
}

/// The tee shim at `tier`, without a model: a person's `bash -c` in a Codex box passes through
/// unchanged (its output bytes, escapes and all, and its exit code) and is recorded in the
/// `tee-shim` lane with its output head as a payload, with no finding (no agent ran it); the
/// box cannot write, replace or unmount its shim ([`the_shim_is_out_of_the_boxs_reach`]), and a
/// `bash -c` after its attempts is still recorded, its 1 MiB of output passed through whole
/// and kept only to its 8 KiB head; then the box forges its account ([`FORGE`]) and every
/// forged or hostile record is a finding in "Evidence problems", never a line that reads as a
/// command that ran, and no escape byte reaches report.md.
fn forged_shim_records_are_findings(test: &str, tier: &str, as_user: bool) {
    let mut c = agent::greeting_box(&CODEX_AGENT, "cx", tier, as_user);
    let Some(m) = Model::start(test, &CODEX_AGENT, &c, Vec::new()) else {
        return;
    };
    let env = m.env(&CODEX_AGENT);
    let person = "printf '\\033[31mred\\n'; echo err >&2; exit 3";
    let out = c.h5i_bounded(
        &["box", "run", "cx", "--", "bash", "-c", person],
        &env,
        agent::SESSION_LIMIT,
    );
    assert_eq!(out.status.code(), Some(3), "{}", common::stderr(&out));
    assert_eq!(out.stdout, b"\x1b[31mred\n");
    assert!(common::stderr(&out).contains("err"));
    the_shim_is_out_of_the_boxs_reach(&mut c, &env, tier);
    let flood = "head -c 1048576 /dev/zero | tr '\\0' x";
    let out = c.h5i_bounded(
        &["box", "run", "cx", "--", "bash", "-c", flood],
        &env,
        agent::SESSION_LIMIT,
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(out.stdout, vec![b'x'; 1 << 20], "at {tier}");
    let out = c.h5i_bounded(
        &["box", "run", "cx", "--", "python3", "-c", FORGE],
        &env,
        agent::SESSION_LIMIT,
    );
    assert_eq!(common::stdout(&out), "forged\n", "{}", common::stderr(&out));
    let report = agent::export_report(&c, "cx");
    assert!(
        !report.contains('\x1b') && !report.contains('\x07'),
        "{report:?}"
    );
    let listed = agent::listed_under_run(&report, "bash", "tee-shim");
    assert_eq!(listed.len(), 1, "{report}");
    assert!(listed[0].ends_with("— exit 3 in `/work`"), "{}", listed[0]);
    let shim_lines: Vec<&str> = agent::what_ran_section(&report)
        .lines()
        .filter(|l| l.contains("`tee-shim` (box-claimed) `head -c 1048576"))
        .collect();
    assert_eq!(
        shim_lines.len(),
        1,
        "the command after the attacks: {report}"
    );
    let problems = agent::problems_section(&report);
    let cross_checked = [
        "the box's hooks claim the `Bash` call `ls` ran, and its shell shim recorded no such command",
        "the shell shim recorded `rm -rf /`, which no tool call the box claims ran",
    ];
    for finding in [
        "a staged command h5i could not read",
        "`command-2.json` was refused (not JSON",
        "`command-3.json` was refused (",
        "`command-5.json` was refused (a string holds control characters",
    ] {
        assert!(
            problems.contains(finding),
            "at {tier}, {finding}: {problems}"
        );
    }
    // The two accounts are compared at every tier: the shim is the agent's shell at each
    // (`capture::tee_shim_wired`; at the container tier the box user's login shell).
    for finding in cross_checked {
        assert!(
            problems.contains(finding),
            "at {tier}, {finding}: {problems}"
        );
    }
    assert!(!problems.contains("printf"), "{problems}");
    let payloads = agent::payloads_of(&c, "cx", "tee-shim");
    let first: Value =
        serde_json::from_str(&std::fs::read_to_string(&payloads[0]).unwrap()).unwrap();
    assert_eq!(first["stdout"], "\\x1b[31mred\n", "{first}");
    assert_eq!(first["stderr"], "err\n", "{first}");
    let flooded: Value =
        serde_json::from_str(&std::fs::read_to_string(&payloads[1]).unwrap()).unwrap();
    assert_eq!(
        flooded["stdout"].as_str().map(str::len),
        Some(h5i_hook::tee_shim::OUTPUT_HEAD),
        "at {tier}"
    );
}

#[test]
fn the_tee_shim_records_a_command_and_forged_records_are_findings_at_the_process_tier() {
    let test = "the_tee_shim_records_a_command_and_forged_records_are_findings_at_the_process_tier";
    if agent::have_agent(test, CODEX) {
        forged_shim_records_are_findings(test, "process", false);
    }
}

#[test]
fn the_tee_shim_records_a_command_and_forged_records_are_findings_at_the_supervised_tier() {
    let test =
        "the_tee_shim_records_a_command_and_forged_records_are_findings_at_the_supervised_tier";
    if agent::have_agent(test, CODEX) {
        forged_shim_records_are_findings(test, "supervised", false);
    }
}

#[test]
fn the_tee_shim_records_a_command_and_forged_records_are_findings_at_the_container_tier() {
    let test =
        "the_tee_shim_records_a_command_and_forged_records_are_findings_at_the_container_tier";
    if agent::have_agent(test, CODEX) && agent::image_built(test, CODEX_AGENT.image) {
        forged_shim_records_are_findings(test, "container", false);
    }
}

#[test]
fn the_tee_shim_records_a_command_and_forged_records_are_findings_at_the_container_tier_as_h5i_test(
) {
    let test = "the_tee_shim_records_a_command_and_forged_records_are_findings_at_the_container_tier_as_h5i_test";
    if agent::have_agent(test, CODEX) && agent::image_built(test, CODEX_AGENT.image) {
        forged_shim_records_are_findings(test, "container", true);
    }
}

/// The script of a person's session: they ask for the fix at Codex's prompt; the model reads
/// the file, patches it and shows it, and stages the proposal.
fn shell_script() -> Vec<Turn> {
    let patch = "*** Begin Patch\n*** Update File: greeting.txt\n@@\n-helo wrld\n+hello world\n*** End Patch\n";
    vec![
        // The interactive Codex can run the first cell before its nested tools are there
        // ("tools.exec_command is not a function", seen once in three runs): the cell waits
        // for it, bounded (5 s).
        Turn::calls(vec![exec(format!(
            "for (let i = 0; i < 50 && typeof tools.exec_command !== 'function'; i++) {{ await new Promise(r => setTimeout(r, 100)); }} {}",
            sh("cat greeting.txt")
        ))])
        .expecting("fix the greeting"),
        Turn::calls(vec![exec(format!(
            "await tools.apply_patch({}); {}",
            Value::String(patch.to_owned()),
            sh("cat greeting.txt")
        ))])
        .expecting("helo wrld"),
        Turn::calls(vec![exec(sh(&agent::stage_proposal()))]).expecting("hello world"),
        Turn::finish("The greeting is fixed.").expecting("staged"),
    ]
}

/// A person runs `h5i box shell cx -- codex` at `tier`, on a real terminal: Codex's TUI comes
/// up at its prompt (its app-server in-process: no unix socket, which the box may not make),
/// they type the task and answer whether to trust the folder, the scripted model plays it, and
/// they leave with Ctrl-C. The edit is in `box diff`; report.md lists each tool call
/// (`inbox-capture`) and each command the shim saw (`tee-shim`) under the host-observed run of
/// `codex`, with no gap between the two accounts; every model call carried the real key. Then
/// the box's own tries at a unix socket are refused ([`no_unix_socket_for_the_box`]).
fn codex_in_box_shell(test: &str, tier: &str, as_user: bool) {
    let mut c = agent::greeting_box(&CODEX_AGENT, "cx", tier, as_user);
    let Some(m) = Model::start(test, &CODEX_AGENT, &c, shell_script()) else {
        return;
    };
    let mut env = m.env(&CODEX_AGENT);
    env.push(("TERM", "xterm-256color"));
    let argv = ["box", "shell", "cx", "--", "codex"];
    let who = c.who();
    let started = std::time::Instant::now();
    let mut s = Session::spawn(c.h5i_cmd_with(&argv, &env), agent::SESSION_LIMIT);
    s.expect_screen("Ask Codex to do anything");
    s.send("fix the greeting in greeting.txt");
    s.read_for(Duration::from_millis(500));
    s.send("\r");
    // The folder's trust is the person's to answer (the cursor starts on "Trust and
    // continue"); the task waits for it.
    s.expect_screen("Trust this folder?");
    s.expect_screen("1. Trust and continue");
    s.read_for(Duration::from_millis(500));
    s.send("\r");
    s.expect_screen("The greeting is fixed.");
    // The session's wall time for BENCHMARKS.md: from `box shell` to the model's last answer
    // on the screen, the person's two half-second pauses included.
    eprintln!(
        "agent-codex interactive session at {tier} as {who}: {:.2} s",
        started.elapsed().as_secs_f64()
    );
    s.send("\x03");
    s.read_for(Duration::from_millis(300));
    s.send("\x03");
    let code = s.finish();
    assert_eq!(code, 0, "at {tier}: {}", screen_text(&s.seen));
    assert!(
        m.service.problems().is_empty(),
        "{:?}; the code-mode tools Codex offered: {:?}",
        m.service.problems(),
        offered_tools(&m)
    );
    let want = format!("{}{}", CODEX_AGENT.key_prefix, CODEX_AGENT.real);
    let turns: Vec<_> = m
        .service
        .requests()
        .into_iter()
        .filter(|l| matches!(l.kind, Kind::Turn(_)))
        .collect();
    assert!(turns.len() >= 4, "at {tier}: {} turns", turns.len());
    for l in &turns {
        assert_eq!(l.seen.header(CODEX_AGENT.key_header), Some(want.as_str()));
    }
    let diff = c.ok(&["box", "diff", "cx"]);
    assert!(diff.contains("+hello world"), "at {tier}: {diff}");
    let report = agent::export_report(&c, "cx");
    assert!(
        agent::proposal_section(&report).contains(agent::PROPOSAL),
        "{report}"
    );
    agent::tool_calls_listed(
        &c,
        "cx",
        &report,
        "codex",
        &[
            ("Bash", "cat greeting.txt"),
            ("apply_patch", "*** Begin Patch"),
            ("Bash", "cat greeting.txt"),
            ("Bash", "printf"),
        ],
    );
    let shim = agent::listed_under_run(&report, "codex", "tee-shim");
    let want = ["cat greeting.txt", "cat greeting.txt", "printf"];
    assert_eq!(shim.len(), want.len(), "at {tier}: {report}");
    for (line, cmd) in shim.iter().zip(want) {
        assert!(
            line.contains(&format!("`tee-shim` (box-claimed) `{cmd}")),
            "at {tier}: {line}"
        );
    }
    let problems = agent::problems_section(&report);
    assert!(!problems.contains("shell shim"), "at {tier}: {problems}");
    no_unix_socket_for_the_box(&mut c, &env, tier);
}

/// Codex's switches (`h5i::agent::codex_config`), one line each, as its box must show them.
const CODEX_SWITCH_LINES: &[&str] = &[
    "sandbox_mode = \"danger-full-access\"",
    "check_for_update_on_startup = false",
    "[analytics]",
    "enabled = false",
    "[otel]",
    "exporter = \"none\"",
];

/// Codex's switches from inside a real box at `tier`: the model's second turn is played only
/// when the configuration Codex reads in the box (`/etc/codex/config.toml`, h5i's read-only
/// system folder; Codex has no variables for them) printed every switch line; the model
/// service saw nothing but model calls (no other path of its host); and the box's egress
/// table refused no connection to any host (no analytics, telemetry or update host was
/// reached for). Codex 0.171 does still ask the box's resolver for names, which the box refuses
/// (it has none; `…:53/udp` in "Denied egress attempts"): which names is not known yet, and
/// nothing is sent to any of them, as the table saw no other attempt.
fn codex_runs_with_its_switches_off(test: &str, tier: &str, as_user: bool) {
    let mut c = agent::greeting_box(&CODEX_AGENT, "cx", tier, as_user);
    let mut shown = Turn::finish("Shown.");
    for line in CODEX_SWITCH_LINES {
        shown = shown.expecting(line);
    }
    let script = vec![
        Turn::calls(vec![exec(sh("cat /etc/codex/config.toml"))]).expecting("show your switches"),
        shown,
    ];
    let Some(m) = Model::start(test, &CODEX_AGENT, &c, script) else {
        return;
    };
    let out = c.h5i_bounded(
        &[
            "box",
            "run",
            "cx",
            "--",
            "codex",
            "exec",
            "show your switches",
        ],
        &m.env(&CODEX_AGENT),
        agent::SESSION_LIMIT,
    );
    let kinds: Vec<_> = m
        .service
        .requests()
        .into_iter()
        .map(|l| (l.kind, l.seen.path))
        .collect();
    assert_eq!(
        out.status.code(),
        Some(0),
        "at {tier}: {}\n{}\nproblems: {:?}\nrequests: {kinds:?}",
        common::stdout(&out),
        common::stderr(&out),
        m.service.problems()
    );
    assert!(
        common::stdout(&out).contains("Shown."),
        "{}",
        common::stdout(&out)
    );
    assert!(
        m.service.problems().is_empty(),
        "{:?}",
        m.service.problems()
    );
    assert!(
        kinds.iter().all(|(k, _)| matches!(
            k,
            Kind::Turn(_) | Kind::Side | Kind::CountTokens | Kind::Models
        )),
        "at {tier}: a request that is no model call: {kinds:?}"
    );
    let report = agent::export_report(&c, "cx");
    let denied = agent::denied_section(&report);
    let refused: Vec<&str> = denied.lines().filter(|l| l.starts_with("- ")).collect();
    assert!(
        refused.iter().all(|l| l.contains(":53/udp` refused")),
        "at {tier}: a connection was tried: {denied}"
    );
    assert!(!denied.contains("Not counted"), "at {tier}: {denied}");
}

#[test]
fn codex_runs_with_telemetry_and_updates_off_at_the_process_tier() {
    let test = "codex_runs_with_telemetry_and_updates_off_at_the_process_tier";
    if agent::have_agent(test, CODEX) {
        codex_runs_with_its_switches_off(test, "process", false);
    }
}

#[test]
fn codex_runs_with_telemetry_and_updates_off_at_the_process_tier_as_h5i_test() {
    let test = "codex_runs_with_telemetry_and_updates_off_at_the_process_tier_as_h5i_test";
    if agent::have_agent(test, CODEX) {
        codex_runs_with_its_switches_off(test, "process", true);
    }
}

/// The `tools.NAME` Codex's first request offered the model's code-mode cell, by name.
fn offered_tools(m: &Model) -> Vec<String> {
    let first = m
        .service
        .requests()
        .into_iter()
        .find(|l| l.kind == Kind::Turn(0))
        .map(|l| l.seen.all_text())
        .unwrap_or_default();
    let mut names: Vec<String> = first
        .split("tools.")
        .skip(1)
        .map(|t| {
            t.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .filter(|n: &String| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What the interactive Codex's background app-server would have done, and worse, tried by
/// the box itself: make a unix socket in its own `~/.codex` and listen there, reach an
/// abstract socket, and reach a host socket (Podman's). Prints `WHAT ERRNO` per try.
const UNIX_TRIES: &str = r#"
import errno, os, socket
def name(e):
    return errno.errorcode.get(e, str(e))
tries = [("listen-home", os.path.expanduser("~/.codex/app-server.sock")),
         ("abstract", "\0h5i-test-abstract"),
         ("host", "/run/podman/podman.sock")]
for what, addr in tries:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as e:
        print(what, name(e.errno))
        continue
    try:
        if what == "listen-home":
            s.bind(addr)
            s.listen(1)
        else:
            s.connect(addr)
        print(what, "made")
    except OSError as e:
        print(what, "socket made, then", name(e.errno))
"#;

/// The box at `tier` makes no unix socket at all, as its policy says (`net.unix` off in
/// `agent-codex`: a socket() there could reach a host listener): each of [`UNIX_TRIES`] is
/// refused at socket() with EPERM, so the interactive Codex runs its server in-process
/// (h5i's system config sets `daemon_auto_start = false`), never over a socket.
fn no_unix_socket_for_the_box(c: &mut common::Caller, env: &[(&str, &str)], tier: &str) {
    let out = c.h5i_bounded(
        &["box", "run", "cx", "--", "python3", "-c", UNIX_TRIES],
        env,
        agent::SESSION_LIMIT,
    );
    let said = common::stdout(&out);
    assert!(
        out.status.success(),
        "at {tier}: {said}{}",
        common::stderr(&out)
    );
    assert_eq!(
        said.lines().collect::<Vec<_>>(),
        ["listen-home EPERM", "abstract EPERM", "host EPERM"],
        "at {tier}, the box made a unix socket"
    );
}

/// [`no_unix_socket_for_the_box`] in a fresh Codex box at `tier`.
fn the_box_makes_no_unix_socket(test: &str, tier: &str, as_user: bool) {
    let mut c = agent::greeting_box(&CODEX_AGENT, "cx", tier, as_user);
    let Some(m) = Model::start(test, &CODEX_AGENT, &c, Vec::new()) else {
        return;
    };
    no_unix_socket_for_the_box(&mut c, &m.env(&CODEX_AGENT), tier);
}

#[test]
fn a_codex_box_makes_no_unix_socket_at_the_process_tier() {
    let test = "a_codex_box_makes_no_unix_socket_at_the_process_tier";
    if agent::have_agent(test, CODEX) {
        the_box_makes_no_unix_socket(test, "process", false);
    }
}

#[test]
fn a_codex_box_makes_no_unix_socket_at_the_supervised_tier_as_h5i_test() {
    let test = "a_codex_box_makes_no_unix_socket_at_the_supervised_tier_as_h5i_test";
    if agent::have_agent(test, CODEX) {
        the_box_makes_no_unix_socket(test, "supervised", true);
    }
}

#[test]
fn a_codex_box_makes_no_unix_socket_at_the_container_tier() {
    let test = "a_codex_box_makes_no_unix_socket_at_the_container_tier";
    if agent::have_agent(test, CODEX) && agent::image_built(test, CODEX_AGENT.image) {
        the_box_makes_no_unix_socket(test, "container", false);
    }
}

#[test]
fn a_person_runs_codex_in_box_shell_at_the_process_tier() {
    let test = "a_person_runs_codex_in_box_shell_at_the_process_tier";
    if agent::have_agent(test, CODEX) {
        codex_in_box_shell(test, "process", false);
    }
}

#[test]
fn a_person_runs_codex_in_box_shell_at_the_process_tier_as_h5i_test() {
    let test = "a_person_runs_codex_in_box_shell_at_the_process_tier_as_h5i_test";
    if agent::have_agent(test, CODEX) {
        codex_in_box_shell(test, "process", true);
    }
}

#[test]
fn a_person_runs_codex_in_box_shell_at_the_supervised_tier() {
    let test = "a_person_runs_codex_in_box_shell_at_the_supervised_tier";
    if agent::have_agent(test, CODEX) {
        codex_in_box_shell(test, "supervised", false);
    }
}

#[test]
fn a_person_runs_codex_in_box_shell_at_the_supervised_tier_as_h5i_test() {
    let test = "a_person_runs_codex_in_box_shell_at_the_supervised_tier_as_h5i_test";
    if agent::have_agent(test, CODEX) {
        codex_in_box_shell(test, "supervised", true);
    }
}

#[test]
fn a_person_runs_codex_in_box_shell_at_the_container_tier() {
    let test = "a_person_runs_codex_in_box_shell_at_the_container_tier";
    if agent::have_agent(test, CODEX) && agent::image_built(test, CODEX_AGENT.image) {
        codex_in_box_shell(test, "container", false);
    }
}

#[test]
fn a_person_runs_codex_in_box_shell_at_the_container_tier_as_h5i_test() {
    let test = "a_person_runs_codex_in_box_shell_at_the_container_tier_as_h5i_test";
    if agent::have_agent(test, CODEX) && agent::image_built(test, CODEX_AGENT.image) {
        codex_in_box_shell(test, "container", true);
    }
}

/// A Codex box at the container tier in an image with no bash (the busybox test image): the
/// tee shim, which records each command Codex runs, is bound over the image's bash, so create
/// refuses with the mend and leaves no box.
#[test]
fn a_codex_box_in_an_image_without_bash_is_refused_at_create() {
    let test = "a_codex_box_in_an_image_without_bash_is_refused_at_create";
    if !agent::have_agent(test, CODEX) {
        return;
    }
    let c = common::Caller::root()
        .with_env("H5I_NO_PROBE_CACHE", "1")
        .with_env("H5I_CONTAINER_USER", common::TEST_USER);
    let image = common::caller::container_image();
    let out = c.h5i(&[
        "box",
        "create",
        "cx",
        "--profile",
        "agent-codex",
        "--isolation",
        "container",
        "--image",
        image,
    ]);
    let err = common::stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("refusing: the image {image} has no bash"))
            && err.contains("; to fix: use an image with bash"),
        "{err}"
    );
    assert!(!c.box_dir("cx").exists(), "create left the box behind");
    assert!(!common::stdout(&c.h5i(&["box", "ls"])).contains("cx"));
}

/// The image `localhost/h5i-agent-codex` with an entry of its own for the engine user's uid
/// (the box user under `--userns=keep-id`) whose shell is `/bin/sh`: Podman then writes no
/// entry, so Codex runs its commands through `/bin/sh`, past h5i's shim over bash. The image
/// also leaves its `USER` at root (the step that edits `/etc/passwd` needs it) and its
/// `/etc/group` puts that entry in root's group and in `staff`: Podman left to itself would run
/// the box as the image's root with the engine user's gid as a supplementary group, which
/// h5i-runc refuses in a rootless user namespace, so the container did not start; or give the
/// entry's groups to the box. Built once (a layer over the project's image), into the test
/// user's storage.
fn own_passwd_image(test: &str) -> Option<&'static str> {
    const IMAGE: &str = "localhost/h5i-test-codex-own-passwd:latest";
    if !agent::image_built(test, CODEX_AGENT.image) {
        return None;
    }
    let uid = common::caller::uid_of(common::TEST_USER);
    let containerfile = format!(
        "FROM {}\nUSER root\nRUN echo 'own:x:{uid}:{uid}:own entry:/tmp:/bin/sh' >> /etc/passwd \
         && sed -i -e 's/^root:x:0:$/root:x:0:own/' -e 's/^staff:x:50:$/staff:x:50:own/' /etc/group \
         && grep -qx 'root:x:0:own' /etc/group && grep -qx 'staff:x:50:own' /etc/group\n",
        CODEX_AGENT.image
    );
    // The build context: a directory of the test's that the test user can read.
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("Containerfile");
    std::fs::write(&file, containerfile).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = std::process::Command::new("runuser")
        .args([
            "-u",
            common::TEST_USER,
            "--",
            "podman",
            "build",
            "-q",
            "-t",
            IMAGE,
            "-f",
        ])
        .arg(&file)
        .arg(dir.path())
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman build of {IMAGE}: {}",
        common::stderr(&out)
    );
    Some(IMAGE)
}

/// A Codex box made in [`own_passwd_image`], by root (Podman as the test user) or by the test
/// user: its container starts and the command runs as the engine user with its own gid and no
/// other group (not the image's root, not the groups the image's `/etc/group` gives the entry),
/// under the image's entry and its `/bin/sh`; Codex would run its commands through that shell,
/// past h5i's shim over bash, so the box's pin keeps why from create, and report.md says the
/// hooks-vs-shim cross-check does not apply to this box and why (the image's own entry and its
/// shell) instead of reading each `Bash` call as a gap.
fn own_passwd_entry_box(test: &str, as_user: bool) {
    if !agent::have_agent(test, CODEX) {
        return;
    }
    let Some(image) = own_passwd_image(test) else {
        return;
    };
    let agent = Agent {
        image,
        ..CODEX_AGENT
    };
    let mut c = agent::greeting_box(&agent, "cx", "container", as_user);
    let pin = std::fs::read_to_string(c.box_dir("cx").join("container-image.json")).unwrap();
    assert!(pin.contains("login shell `/bin/sh`"), "{pin}");
    let Some(m) = Model::start(test, &agent, &c, Vec::new()) else {
        return;
    };
    let out = c.h5i_bounded(
        &[
            "box",
            "run",
            "cx",
            "--",
            "sh",
            "-c",
            "id -u; id -g; id -G; getent passwd \"$(id -u)\"; cat greeting.txt",
        ],
        &m.env(&agent),
        agent::SESSION_LIMIT,
    );
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let uid = common::caller::uid_of(common::TEST_USER);
    assert_eq!(
        common::stdout(&out),
        format!("{uid}\n{uid}\n{uid}\nown:x:{uid}:{uid}:own entry:/tmp:/bin/sh\nhelo wrld\n")
    );
    let status = c.ok(&["box", "status", "cx"]);
    assert!(status.contains("matches the policy: yes"), "{status}");
    let report = agent::export_report(&c, "cx");
    let problems = agent::problems_section(&report);
    assert!(
        problems.contains(&format!(
            "the cross-check of the hooks' `Bash` calls against the shell shim's commands does not apply to this box: the image's own /etc/passwd gives the box user (uid {uid}) the login shell `/bin/sh`"
        )),
        "{problems}"
    );
}

#[test]
fn an_image_with_its_own_passwd_entry_runs_as_the_engine_user_and_says_the_shim_cross_check_does_not_apply(
) {
    own_passwd_entry_box(
        "an_image_with_its_own_passwd_entry_runs_as_the_engine_user_and_says_the_shim_cross_check_does_not_apply",
        false,
    );
}

#[test]
fn an_image_with_its_own_passwd_entry_runs_as_the_engine_user_and_says_the_shim_cross_check_does_not_apply_as_h5i_test(
) {
    own_passwd_entry_box(
        "an_image_with_its_own_passwd_entry_runs_as_the_engine_user_and_says_the_shim_cross_check_does_not_apply_as_h5i_test",
        true,
    );
}

/// Runs inside a Codex box for the sandbox-folder rows. argv: the mode (`attack`: also try to
/// change `/etc/codex` every way a file or mount can be changed; `wait`: say `ready` in the
/// workspace and wait for the host's `go` before asking), then an earlier run's base URL and
/// dummy (or `-`). Asks the proxy `/etc/codex/config.toml` names with the run's dummy, and the
/// earlier run's proxy with the earlier dummy.
const FOLDER_SCRIPT: &str = r#"
import ctypes, errno, json, os, re, sys, time, urllib.error, urllib.request
mode, old_base, old_tok = sys.argv[1], sys.argv[2], sys.argv[3]
def named():
    m = re.search(r'^base_url = "(.*)"$', open("/etc/codex/config.toml").read(), re.M)
    return m.group(1) if m else None
def ask(base, tok):
    req = urllib.request.Request(base + "/models")
    req.add_header("authorization", "Bearer " + tok)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except urllib.error.URLError as e:
        if isinstance(e.reason, ConnectionRefusedError):
            return "refused"
        return "error %s" % e.reason
def answer(f):
    try:
        f()
        return "OK"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
libc = ctypes.CDLL(None, use_errno=True)
def call(rc):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
tok = os.environ["OPENAI_API_KEY"]
out = {"env": os.environ["OPENAI_BASE_URL"], "dummy": tok, "named": named(),
       "netns": os.readlink("/proc/self/ns/net")}
if mode == "attack":
    open("/tmp/planted", "w").write("x")
    out["attacks"] = {
        "write": answer(lambda: open("/etc/codex/config.toml", "w")),
        "append": answer(lambda: open("/etc/codex/config.toml", "a")),
        "create": answer(lambda: open("/etc/codex/planted.toml", "w")),
        "rename": answer(lambda: os.rename("/etc/codex/config.toml", "/etc/codex/moved")),
        "unlink": answer(lambda: os.unlink("/etc/codex/hooks.json")),
        "chmod": answer(lambda: os.chmod("/etc/codex/config.toml", 0o666)),
        "chmod_dir": answer(lambda: os.chmod("/etc/codex", 0o777)),
        "mkdir": answer(lambda: os.mkdir("/etc/codex/d")),
        "symlink": answer(lambda: os.symlink("/tmp/planted", "/etc/codex/linked.toml")),
        "remount_rw": answer(lambda: call(libc.mount(None, b"/etc/codex", None, 32 | 4096, None))),
        "umount": answer(lambda: call(libc.umount2(b"/etc/codex", 2))),
    }
if mode == "wait":
    open("/work/ready", "w").write("ready")
    for _ in range(2400):
        if os.path.exists("/work/go"):
            break
        time.sleep(0.05)
    out["named_late"] = named()
out["status"] = ask(named(), tok)
if old_base != "-":
    out["earlier"] = ask(old_base, old_tok)
print(json.dumps(out))
"#;

/// The stand-in OpenAI upstream for the folder rows, its CA file where `c` can read it, and
/// `c` pointed at it through the test seams with the host's real key.
fn folder_upstream(
    c: common::Caller,
) -> (
    common::Caller,
    crate::support::TlsUpstream,
    tempfile::TempDir,
) {
    use crate::support::{Answer, TestCa, TlsUpstream};
    let ca = TestCa::new();
    let up = TlsUpstream::start(ca.server_config(&[CODEX_AGENT.host]), Answer::Json);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.der");
    std::fs::write(&ca_file, &ca.ca_der).unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let c = c
        .with_env(CODEX_AGENT.key_var, CODEX_AGENT.real)
        .with_env(
            "H5I_TEST_HOSTS",
            &format!("{}={}", CODEX_AGENT.host, up.addr),
        )
        .with_env("H5I_TEST_CA_FILE", &ca_file.display().to_string());
    (c, up, dir)
}

/// One run of [`FOLDER_SCRIPT`] in box `cxf`, which must exit 0: what it printed.
fn folder_run(c: &common::Caller, mode: &str, earlier: Option<&Value>) -> Value {
    let (base, tok) = earlier.map_or(("-".to_owned(), "-".to_owned()), |e| {
        (
            e["env"].as_str().unwrap().to_owned(),
            e["dummy"].as_str().unwrap().to_owned(),
        )
    });
    let out = c.h5i(&[
        "box",
        "run",
        "cxf",
        "--",
        "python3",
        "-c",
        FOLDER_SCRIPT,
        mode,
        &base,
        &tok,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}: {}\n{}",
        c.who(),
        common::stdout(&out),
        common::stderr(&out)
    );
    serde_json::from_str(common::stdout(&out).trim()).unwrap()
}

/// A Codex box's runs go through its sandbox (issue 21), and its `/etc/codex` there is safe
/// to share between them: the box cannot change the folder or its files any way a file or a
/// mount is changed (EACCES or EROFS; EPERM for the mount calls), h5i's copy on the host is
/// untouched, 0644 files in a 0755 folder of h5i's own, naming no proxy between runs; each run's
/// `config.toml` names that run's own proxy, which answers its dummy; the previous run's proxy
/// refuses a dial once that run ended; and two runs at once each reach their own proxy (the
/// second in a container of its own, the first's folder still naming the first's proxy).
fn codex_folder_in_the_sandbox(test: &str, tier: &str, as_user: bool) {
    if !agent::have_agent(test, CODEX)
        || !common::require_root(test, "cgroups of h5i's own, and switching to h5i-test")
    {
        return;
    }
    let (c, up, _ca_dir) = folder_upstream(common::Caller::either(as_user));
    let who = format!("{} at {tier}", c.who());
    c.ok(&[
        "box",
        "create",
        "cxf",
        "--profile",
        CODEX_AGENT.profile,
        "--isolation",
        tier,
    ]);
    let first = folder_run(&c, "attack", None);
    let sandbox = common::sandbox::id(&c, "cxf")
        .unwrap_or_else(|| panic!("{who}: the Codex run did not go through the box's sandbox"));
    let init = common::sandbox::Held::now(&c, "cxf").init;
    assert_eq!(first["status"], 200, "{who}: {first}");
    assert_eq!(first["named"], first["env"], "{who}: {first}");
    for (attack, answer) in first["attacks"].as_object().unwrap() {
        let want: &[&str] = if attack == "remount_rw" || attack == "umount" {
            &["EPERM"]
        } else {
            &["EACCES", "EROFS"]
        };
        assert!(
            want.contains(&answer.as_str().unwrap()),
            "{who}: {attack} answered {answer}, not {want:?}: {first}"
        );
    }
    // h5i's copy: its own, the box's attacks left no trace, and it names no proxy now.
    let folder = common::sandbox::dir(&c, &sandbox).join("codex");
    let mut names: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["config.toml", "hooks.json"], "{who}");
    for (path, mode) in [
        (folder.clone(), 0o755),
        (folder.join("config.toml"), 0o644),
        (folder.join("hooks.json"), 0o644),
    ] {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.uid(), c.uid(), "{who}: {}", path.display());
        assert_eq!(meta.mode() & 0o7777, mode, "{who}: {}", path.display());
    }
    let between = std::fs::read_to_string(folder.join("config.toml")).unwrap();
    assert!(!between.contains("base_url"), "{who}: {between}");

    let second = folder_run(&c, "plain", Some(&first));
    assert_eq!(second["status"], 200, "{who}: {second}");
    assert_eq!(second["named"], second["env"], "{who}: {second}");
    assert_ne!(second["env"], first["env"], "{who}: one proxy for two runs");
    assert_eq!(second["earlier"], "refused", "{who}: {second}");
    assert_eq!(
        second["netns"], first["netns"],
        "{who}: not the same sandbox"
    );
    assert_eq!(
        common::sandbox::Held::now(&c, "cxf").init,
        init,
        "{who}: the sandbox was remade"
    );

    // Two runs at once: the first holds the sandbox's folder until the host says go.
    let ready = c.workspace("cxf").join("ready");
    let waiting = c
        .h5i_in(
            &c.repo(),
            &[
                "box",
                "run",
                "cxf",
                "--",
                "python3",
                "-c",
                FOLDER_SCRIPT,
                "wait",
                "-",
                "-",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !ready.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{who}: the first run never got ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let meanwhile = folder_run(&c, "plain", None);
    std::fs::write(c.workspace("cxf").join("go"), "go").unwrap();
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{who}: {}\n{}",
        common::stdout(&out),
        common::stderr(&out)
    );
    let held_run: Value = serde_json::from_str(common::stdout(&out).trim()).unwrap();
    assert_eq!(held_run["status"], 200, "{who}: {held_run}");
    assert_eq!(meanwhile["status"], 200, "{who}: {meanwhile}");
    assert_eq!(held_run["named"], held_run["env"], "{who}: {held_run}");
    assert_eq!(held_run["named_late"], held_run["env"], "{who}: {held_run}");
    assert_eq!(meanwhile["named"], meanwhile["env"], "{who}: {meanwhile}");
    assert_ne!(held_run["env"], meanwhile["env"], "{who}");
    // The sandbox served the run that held it; the other had a container (a network) of its own.
    assert_eq!(held_run["netns"], first["netns"], "{who}: {held_run}");
    assert_ne!(meanwhile["netns"], first["netns"], "{who}: {meanwhile}");
    let seen = up.seen();
    assert_eq!(seen.len(), 4, "{who}: {seen:?}");
    assert!(
        seen.iter().all(|s| s.header("authorization")
            == Some(&format!("Bearer {}", CODEX_AGENT.real)[..])),
        "{who}: {seen:?}"
    );
    c.ok(&["box", "rm", "--force", "cxf"]);
    assert!(!folder.exists(), "{who}: rm left {}", folder.display());
}

#[test]
fn a_codex_boxs_runs_share_its_sandbox_each_naming_its_own_proxy_in_a_folder_the_box_cannot_write_at_the_process_tier(
) {
    codex_folder_in_the_sandbox(
        "a_codex_boxs_runs_share_its_sandbox_each_naming_its_own_proxy_in_a_folder_the_box_cannot_write_at_the_process_tier",
        "process",
        false,
    );
}

#[test]
fn a_codex_boxs_runs_share_its_sandbox_each_naming_its_own_proxy_in_a_folder_the_box_cannot_write_at_the_process_tier_as_h5i_test(
) {
    codex_folder_in_the_sandbox(
        "a_codex_boxs_runs_share_its_sandbox_each_naming_its_own_proxy_in_a_folder_the_box_cannot_write_at_the_process_tier_as_h5i_test",
        "process",
        true,
    );
}

#[test]
fn a_codex_boxs_runs_share_its_sandbox_each_naming_its_own_proxy_in_a_folder_the_box_cannot_write_at_the_supervised_tier(
) {
    codex_folder_in_the_sandbox(
        "a_codex_boxs_runs_share_its_sandbox_each_naming_its_own_proxy_in_a_folder_the_box_cannot_write_at_the_supervised_tier",
        "supervised",
        false,
    );
}

#[test]
fn a_codex_boxs_runs_share_its_sandbox_each_naming_its_own_proxy_in_a_folder_the_box_cannot_write_at_the_supervised_tier_as_h5i_test(
) {
    codex_folder_in_the_sandbox(
        "a_codex_boxs_runs_share_its_sandbox_each_naming_its_own_proxy_in_a_folder_the_box_cannot_write_at_the_supervised_tier_as_h5i_test",
        "supervised",
        true,
    );
}
