//! `h5i skill`: the skill the binary carries, printed, installed and shown to an agent box.
//!
//! The CLI rows run h5i as a plain command (no box). The box rows create a real Claude box at
//! the process and supervised tiers, as root and as the test user, whose creator's HOME holds a
//! different, planted `~/.claude/skills/h5i`: the box must see the embedded skill, byte for
//! byte, and a write to it must fail with the kernel's read-only answer. The same rows check
//! the capture wiring h5i puts beside it (`h5i::capture`): Claude Code's managed settings at
//! `/etc/claude-code` and the hook program are h5i's and read-only, and a call the hook
//! stages becomes a box-claimed record with its payload stored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::caller::Caller;
use common::{stderr, stdout, H5I};

fn h5i(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(H5I);
    c.args(args).current_dir("/");
    for k in ["H5I_AGENT", "H5I_SKILL_DIR", "H5I_ENV_ID", "HOME"] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    c.output().unwrap()
}

fn ok(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = h5i(args, env);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    stdout(&out)
}

#[test]
fn show_prints_skill_md_and_each_page_and_refuses_an_unknown_one_with_the_list() {
    let skill = ok(&["skill", "show"], &[]);
    assert!(skill.starts_with("---\nname: h5i\n"), "{skill}");
    for page in ["in-a-box", "policy", "proposal", "browser"] {
        let text = ok(&["skill", "show", page], &[]);
        assert!(skill.contains(&format!("reference/{page}.md")), "{page}");
        assert!(text.starts_with("# "), "{page}: {text}");
    }
    for bad in ["nope", "../SKILL", "SKILL.md"] {
        let out = h5i(&["skill", "show", bad], &[]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let err = stderr(&out);
        assert!(
            err.contains("refusing: the skill has no page")
                && err.contains("in-a-box, policy, proposal, browser"),
            "{err}"
        );
        assert!(stdout(&out).is_empty());
    }
}

#[test]
fn path_follows_h5i_agent_and_h5i_skill_dir() {
    assert_eq!(
        ok(&["skill", "path"], &[("HOME", "/home/u")]),
        "/home/u/.claude/skills/h5i\n"
    );
    assert_eq!(
        ok(
            &["skill", "path"],
            &[("HOME", "/home/u"), ("H5I_AGENT", "codex")]
        ),
        "/home/u/.codex/skills/h5i\n"
    );
    assert_eq!(
        ok(
            &["skill", "path"],
            &[
                ("HOME", "/home/u"),
                ("H5I_AGENT", "codex"),
                ("H5I_SKILL_DIR", "/srv/skills/h5i")
            ]
        ),
        "/srv/skills/h5i\n"
    );
    let out = h5i(&["skill", "path"], &[]);
    assert!(stderr(&out).contains("HOME is not set"), "{}", stderr(&out));
}

/// Every file `h5i skill install` wrote under `dir`, as `h5i skill show` prints it.
fn assert_installed(dir: &Path) {
    assert_eq!(
        std::fs::read_to_string(dir.join("SKILL.md")).unwrap(),
        ok(&["skill", "show"], &[])
    );
    for page in ["in-a-box", "policy", "proposal", "browser"] {
        assert_eq!(
            std::fs::read_to_string(dir.join(format!("reference/{page}.md"))).unwrap(),
            ok(&["skill", "show", page], &[]),
            "{page}"
        );
    }
}

#[test]
fn install_writes_where_path_says_and_refuses_inside_a_box_and_through_a_symlink() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    let home_s = home.to_str().unwrap();
    let said = ok(&["skill", "path"], &[("HOME", home_s)]);
    let printed = ok(&["skill", "install"], &[("HOME", home_s)]);
    assert!(printed.contains("wrote "), "{printed}");
    assert_installed(Path::new(said.trim()));
    assert_installed(&home.join(".claude/skills/h5i"));

    let codex = ok(
        &["skill", "install"],
        &[("HOME", home_s), ("H5I_AGENT", "codex")],
    );
    assert!(codex.contains(".codex/skills/h5i"), "{codex}");
    assert_installed(&home.join(".codex/skills/h5i"));

    let target = t.path().join("chosen");
    ok(
        &["skill", "install", "--target", target.to_str().unwrap()],
        &[("HOME", home_s)],
    );
    assert_installed(&target);

    // Inside a box: refused, and nothing written.
    let inside = t.path().join("inside");
    let out = h5i(
        &["skill", "install", "--target", inside.to_str().unwrap()],
        &[("HOME", home_s), ("H5I_ENV_ID", "b1")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("refusing: this process is inside box `b1`"),
        "{}",
        stderr(&out)
    );
    assert!(!inside.exists());

    // Through a symlink: the target, a directory in it, a file in it.
    let victim = t.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("SKILL.md"), "theirs").unwrap();
    let linked = t.path().join("linked");
    std::os::unix::fs::symlink(&victim, &linked).unwrap();
    let dir_link = t.path().join("dir-link");
    std::fs::create_dir(&dir_link).unwrap();
    std::os::unix::fs::symlink(&victim, dir_link.join("reference")).unwrap();
    let file_link = t.path().join("file-link");
    std::fs::create_dir(&file_link).unwrap();
    std::os::unix::fs::symlink(victim.join("SKILL.md"), file_link.join("SKILL.md")).unwrap();
    for target in [&linked, &dir_link, &file_link] {
        let out = h5i(
            &["skill", "install", "--target", target.to_str().unwrap()],
            &[("HOME", home_s)],
        );
        assert_eq!(out.status.code(), Some(1), "{}", target.display());
        assert!(
            stderr(&out).contains("is a symlink, and the skill is never written through one"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(
        std::fs::read_to_string(victim.join("SKILL.md")).unwrap(),
        "theirs"
    );
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1);
}

/// What the planted host skill says: never what a box may see.
const PLANTED: &str = "PLANTED host skill: not the embedded one";

/// A HOME for the box's creator with a planted `~/.claude/skills/h5i`, readable by `c`.
fn planted_home(c: &Caller) -> PathBuf {
    let home = c.repo().parent().unwrap().join("creator-home");
    let skill = home.join(".claude/skills/h5i/reference");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(home.join(".claude/skills/h5i/SKILL.md"), PLANTED).unwrap();
    std::fs::write(skill.join("policy.md"), PLANTED).unwrap();
    std::fs::write(home.join(".claude/settings.json"), "{}").unwrap();
    let st = Command::new("chown")
        .args(["-R", &format!("{0}:{0}", c.uid())])
        .arg(&home)
        .status()
        .unwrap();
    assert!(st.success());
    home
}

/// In the box: the skill's SKILL.md, then the answer to a write into the skill directory, to
/// a file of it, and a removal (each must fail with the kernel's read-only answer).
const LOOK: &str = r#"
import errno, json, os
CALL = '{"hook_event_name":"PreToolUse","tool_name":"Bash","tool_use_id":"t1","tool_input":{"command":"echo staged-in-box"}}'

d = os.path.join(os.environ["HOME"], ".claude/skills/h5i")
out = {"env": sorted(k for k in os.environ if k.startswith("H5I_ENV_")),
       "skill": open(os.path.join(d, "SKILL.md")).read(),
       "policy": open(os.path.join(d, "reference/policy.md")).read()}
def attempt(name, f):
    try:
        f()
        out[name] = "succeeded"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
attempt("append", lambda: open(os.path.join(d, "SKILL.md"), "a").write("x"))
attempt("create", lambda: open(os.path.join(d, "new.md"), "w").write("x"))
attempt("unlink", lambda: os.unlink(os.path.join(d, "SKILL.md")))
# The capture: h5i's managed settings and hook, read-only; the hook stages a call.
m = "/etc/claude-code/managed-settings.json"
out["managed"] = json.load(open(m))
attempt("managed_write", lambda: open(m, "a").write("x"))
attempt("hook_write", lambda: open("/.h5i/bin/h5i-hook", "a").write("x"))
import subprocess
out["hook_rc"] = subprocess.run(["/.h5i/bin/h5i-hook", "capture", "claude-code"], input=CALL.encode()).returncode
print(json.dumps(out))
"#;

fn the_box_sees_the_embedded_skill_read_only(tier: &str, as_user: bool) {
    let c = Caller::either(as_user);
    let home = planted_home(&c);
    let ca = support::TestCa::new();
    let ca_file = c.repo().parent().unwrap().join("ca.der");
    std::fs::write(&ca_file, &ca.ca_der).unwrap();
    std::fs::set_permissions(
        &ca_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let c = c
        .with_env("HOME", home.to_str().unwrap())
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-not-used")
        .with_env("H5I_TEST_HOSTS", "api.anthropic.com=127.0.0.1:9")
        .with_env("H5I_TEST_CA_FILE", ca_file.to_str().unwrap());
    c.ok(&[
        "box",
        "create",
        "sk",
        "--profile",
        "agent-claude",
        "--isolation",
        tier,
    ]);
    let out = c.h5i(&["box", "run", "sk", "--", "python3", "-c", LOOK]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{tier} as {}: {}{}",
        c.who(),
        stdout(&out),
        stderr(&out)
    );
    let seen: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(seen["skill"], h5i::skill::page(None).unwrap(), "{seen}");
    // The variables reference/in-a-box.md says h5i sets, and no other.
    assert_eq!(
        seen["env"],
        serde_json::json!([
            "H5I_ENV_CAPTURE_SPOOL",
            "H5I_ENV_ID",
            "H5I_ENV_POLICY_DIGEST"
        ]),
        "{seen}"
    );
    for v in [
        "H5I_ENV_ID",
        "H5I_ENV_POLICY_DIGEST",
        "H5I_ENV_CAPTURE_SPOOL",
    ] {
        assert!(
            h5i::skill::page(Some("in-a-box"))
                .unwrap()
                .contains(&format!("| `{v}` |")),
            "{v}"
        );
    }
    assert_eq!(
        seen["policy"],
        h5i::skill::page(Some("policy")).unwrap(),
        "{seen}"
    );
    // Claude Code's managed settings are h5i's: the capture hook on every tool call.
    assert_eq!(
        seen["managed"],
        serde_json::from_str::<serde_json::Value>(&h5i::capture::tool_hooks(
            h5i_policy::AgentRuntime::Claude
        ))
        .unwrap(),
        "{seen}"
    );
    assert_eq!(seen["hook_rc"], 0, "{seen}");
    for attempt in ["append", "create", "unlink", "managed_write", "hook_write"] {
        let got = seen[attempt].as_str().unwrap();
        // The hook program may also be busy: the supervised tier's sentry is the same binary.
        let busy = attempt == "hook_write" && got == "ETXTBSY";
        assert!(
            matches!(got, "EROFS" | "EACCES") || busy,
            "{tier} as {}: {attempt}: {got}",
            c.who()
        );
    }
    // The call the hook staged is a box-claimed record, its raw payload stored beside the log.
    let dir = c.repo().join(".git/.h5i/env/claude/sk");
    let receipts = std::fs::read_to_string(dir.join("receipts.jsonl")).unwrap();
    let staged: Vec<serde_json::Value> = receipts
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["claimed_kind"] == "tool-call")
        .collect();
    assert_eq!(staged.len(), 1, "{receipts}");
    assert_eq!(staged[0]["lane"], "inbox-capture");
    assert_eq!(staged[0]["claim"]["command"], "echo staged-in-box");
    assert_eq!(staged[0]["claim"]["tool"], "Bash");
    let payload = staged[0]["payload"].as_str().unwrap();
    let stored = std::fs::read_to_string(dir.join("payloads").join(payload)).unwrap();
    assert!(
        stored.contains("\"command\":\"echo staged-in-box\""),
        "{stored}"
    );
    // Nothing of the planted skill reached the box directory (its HOME seed included).
    let env_root = c.repo().join(".git/.h5i/env");
    assert!(
        common::files_containing(&env_root, PLANTED.as_bytes()).is_empty(),
        "{tier} as {}",
        c.who()
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".claude/skills/h5i/SKILL.md")).unwrap(),
        PLANTED
    );
    c.ok(&["box", "rm", "sk", "--force"]);
}

#[test]
fn a_process_tier_claude_box_sees_the_embedded_skill_read_only_as_root() {
    if common::require_root(
        "a_process_tier_claude_box_sees_the_embedded_skill_read_only_as_root",
        "boxes run as root in CI",
    ) {
        the_box_sees_the_embedded_skill_read_only("process", false);
    }
}

#[test]
fn a_process_tier_claude_box_sees_the_embedded_skill_read_only_as_the_test_user() {
    if common::require_root(
        "a_process_tier_claude_box_sees_the_embedded_skill_read_only_as_the_test_user",
        "the test runs h5i as the test user through runuser",
    ) {
        the_box_sees_the_embedded_skill_read_only("process", true);
    }
}

#[test]
fn a_supervised_tier_claude_box_sees_the_embedded_skill_read_only_as_root() {
    if common::require_root(
        "a_supervised_tier_claude_box_sees_the_embedded_skill_read_only_as_root",
        "boxes run as root in CI",
    ) {
        the_box_sees_the_embedded_skill_read_only("supervised", false);
    }
}

#[test]
fn a_supervised_tier_claude_box_sees_the_embedded_skill_read_only_as_the_test_user() {
    if common::require_root(
        "a_supervised_tier_claude_box_sees_the_embedded_skill_read_only_as_the_test_user",
        "the test runs h5i as the test user through runuser",
    ) {
        the_box_sees_the_embedded_skill_read_only("supervised", true);
    }
}
