//! Claude Code in a box, end to end, against the scripted model service (tests/model): the real
//! `claude` binary (installed by `make setup`) runs `claude -p` in a box, the model's script
//! has it read, edit and check a file, and the test checks what came out: the edit in `box
//! diff` and in the export's patch, the real credential at the model service and nowhere the
//! box could see it.
//!
//! The model service listens on 127.0.0.1 with a certificate from a CA this test made; the
//! credential proxy is pointed at it through h5i's test seams (`H5I_TEST_HOSTS`,
//! `H5I_TEST_CA_FILE`), never through the system resolver. Runs as root (CI).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod model;
#[path = "../broker/tests/support/mod.rs"]
mod support;

use std::path::Path;

use common::{stderr, stdout, Repo};
use model::{Api, Call, Kind, ModelService, Turn};
use serde_json::json;
use support::TestCa;

const REAL: &str = "sk-ant-REAL-host-only-9d2e61c0b4";
const CLAUDE: &str = "/usr/local/bin/claude";

/// The scripted model, the CA file the proxy trusts for it, and a HOME with no agent config.
struct Model {
    service: ModelService,
    _dir: tempfile::TempDir,
    ca_file: String,
    home: String,
    hosts: String,
}

impl Model {
    fn start(turns: Vec<Turn>) -> Model {
        let ca = TestCa::new();
        let service = ModelService::start(
            ca.server_config(&["api.anthropic.com"]),
            Api::Anthropic,
            turns,
        );
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.der");
        std::fs::write(&ca_file, &ca.ca_der).unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        Model {
            hosts: format!("api.anthropic.com={}", service.addr),
            service,
            ca_file: ca_file.display().to_string(),
            home: home.display().to_string(),
            _dir: dir,
        }
    }

    /// h5i's environment: the host's real key and the seams that point the proxy here.
    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("ANTHROPIC_API_KEY", REAL),
            ("H5I_TEST_HOSTS", self.hosts.as_str()),
            ("H5I_TEST_CA_FILE", self.ca_file.as_str()),
            ("HOME", self.home.as_str()),
        ]
    }
}

fn have_claude(test: &str) -> bool {
    if !common::require_root(test, "boxes run as root in CI") {
        return false;
    }
    assert!(
        Path::new(CLAUDE).exists(),
        "{CLAUDE} is missing: run `make setup` (it installs the pinned Claude Code)"
    );
    true
}

/// The pinned version `make setup` installs (images/agent-versions.env).
fn pinned(var: &str) -> String {
    let pins = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("images/agent-versions.env"),
    )
    .unwrap();
    pins.lines()
        .find_map(|l| l.strip_prefix(&format!("{var}=")))
        .unwrap_or_else(|| panic!("no {var} in images/agent-versions.env"))
        .to_owned()
}

#[test]
fn the_installed_claude_is_the_pinned_one() {
    if !have_claude("the_installed_claude_is_the_pinned_one") {
        return;
    }
    let out = std::process::Command::new(CLAUDE)
        .arg("--version")
        .env("DISABLE_AUTOUPDATER", "1")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(
        v.starts_with(&format!("{} ", pinned("CLAUDE_CODE_VERSION"))),
        "{v}"
    );
}

/// A command the model runs in the box: a host outside the profile (a test name, never
/// resolved by the system: the box's proxy refuses it by name), and the OpenAI API through the
/// Anthropic grant's base URL, which the credential proxy must refuse (421).
const REACH_OUT: &str =
    "curl -sS -m 10 -o /dev/null -w 'denied=%{http_connect}\\n' https://denied.test/; \
     curl -sS -m 10 -o /dev/null -w 'openai=%{http_code}\\n' -H 'Host: api.openai.com' \
     -H \"x-api-key: $ANTHROPIC_API_KEY\" \"$ANTHROPIC_BASE_URL/v1/models\"; true";

/// A command the model runs in the box: it looks for the host's real key (passed in two
/// halves, so the whole key is in no argv and no transcript) in its environment, every
/// `/proc/*/environ` it can read, HOME and the workspace, and prints `hits=[...]`.
fn scan_command() -> String {
    let (a, b) = REAL.split_at(12);
    let script = r#"
import os, sys
real = (sys.argv[1] + sys.argv[2]).encode()
hits = [k for k, v in os.environ.items() if real in v.encode()]
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if real in open("/proc/%s/environ" % p, "rb").read():
                hits.append("/proc/%s/environ" % p)
        except OSError:
            pass
for top in (os.environ["HOME"], os.getcwd()):
    for d, _, files in os.walk(top):
        for f in files:
            try:
                if real in open(os.path.join(d, f), "rb").read():
                    hits.append(os.path.join(d, f))
            except OSError:
                pass
print("hits=%s" % hits)
"#;
    format!("python3 -c '{script}' {a} {b}")
}

/// The script: read the file, fix it, check it, look for the key, finish.
fn fix_script(file: &str) -> Vec<Turn> {
    vec![
        Turn::calls(vec![Call::new("Read", json!({"file_path": file}))])
            .expecting("fix the greeting"),
        Turn::calls(vec![Call::new(
            "Edit",
            json!({"file_path": file, "old_string": "helo wrld", "new_string": "hello world"}),
        )])
        .expecting("helo wrld"),
        Turn::calls(vec![Call::new(
            "Bash",
            json!({"command": format!("cat {file}"), "description": "show the fixed file"}),
        )])
        .expecting("has been updated"),
        Turn::calls(vec![Call::new(
            "Bash",
            json!({"command": scan_command(), "description": "look for the host's key"}),
        )])
        .expecting("hello world"),
        Turn::calls(vec![Call::new(
            "Bash",
            json!({"command": REACH_OUT, "description": "reach hosts outside the profile"}),
        )])
        .expecting("hits=[]"),
        Turn::finish("The greeting is fixed.").expecting("openai=421"),
    ]
}

/// Where every confining tier shows the box its workspace.
const WORK: &str = "/work";

/// The Claude image `make images` builds.
const CLAUDE_IMAGE: &str = "localhost/h5i-agent-claude:latest";

/// Claude Code, in a box at `tier`, plays the fix script against the scripted model: the edit
/// shows in `box diff` and applies from the export, the model service saw the real key on
/// every call and never the dummy, and the box never held the key.
fn claude_fixes_the_greeting(tier: &str) {
    let r = Repo::new();
    std::fs::write(r.path().join("greeting.txt"), "helo wrld\n").unwrap();
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", "greeting"]);
    let mut create = vec![
        "box",
        "create",
        "cl",
        "--profile",
        "agent-claude",
        "--isolation",
        tier,
    ];
    if tier == "container" {
        create.extend(["--image", CLAUDE_IMAGE]);
    }
    let out = r.h5i(&create);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let file = format!("{WORK}/greeting.txt");
    let m = Model::start(fix_script(&file));
    let started = std::time::Instant::now();
    let out = r.h5i_env(
        &[
            "box",
            "run",
            "cl",
            "--",
            "claude",
            "-p",
            "fix the greeting in greeting.txt",
            "--allowedTools",
            "Read",
            "Edit",
            "Bash",
        ],
        &m.env(),
    );
    eprintln!(
        "claude scripted session at {tier}: {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let reqs = m.service.requests();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}\nproblems: {:?}\nrequests: {:?}",
        stdout(&out),
        stderr(&out),
        m.service.problems(),
        reqs.iter()
            .map(|l| (&l.kind, &l.seen.path))
            .collect::<Vec<_>>()
    );
    assert!(
        m.service.problems().is_empty(),
        "{:?}",
        m.service.problems()
    );
    assert_eq!(m.service.turns_served(), vec![0, 1, 2, 3, 4, 5]);
    assert!(
        stdout(&out).contains("The greeting is fixed."),
        "{}",
        stdout(&out)
    );

    // Every model call reached the service with the real key, never the box's dummy.
    for l in reqs
        .iter()
        .filter(|l| matches!(l.kind, Kind::Turn(_) | Kind::Side))
    {
        assert_eq!(l.seen.header("x-api-key"), Some(REAL), "{:?}", l.seen.path);
    }
    assert!(reqs
        .iter()
        .all(|l| !l.seen.all_text().contains("h5i-dummy-")));

    assert_eq!(
        std::fs::read_to_string(r.workspace("cl").join("greeting.txt")).unwrap(),
        "hello world\n"
    );
    let diff = r.ok(&["box", "diff", "cl"]);
    assert!(diff.contains("+hello world"), "{diff}");
    let report = exported_patch_applies(&r, "cl");
    // The request for the OpenAI host was refused by the credential proxy and never reached
    // the model service.
    assert!(reqs.iter().all(|l| l.seen.path != "/v1/models"));
    if tier == "container" {
        // The CONNECT to a host outside the profile was refused by the box's egress proxy.
        let denied = report
            .split("## Denied egress attempts")
            .nth(1)
            .and_then(|t| t.split("\n## ").next())
            .unwrap_or("");
        assert!(denied.contains("denied.test:443"), "{report}");
    }
    // Nothing the box or its records hold has the key: the box directory (workspace, HOME,
    // spool, receipts) and the export.
    assert!(common::files_containing(&r.box_dir("cl"), REAL.as_bytes()).is_empty());
}

#[test]
fn claude_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key() {
    if have_claude("claude_fixes_a_file_at_the_process_tier_and_the_box_never_holds_the_key") {
        claude_fixes_the_greeting("process");
    }
}

#[test]
fn claude_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key() {
    if have_claude("claude_fixes_a_file_at_the_supervised_tier_and_the_box_never_holds_the_key") {
        claude_fixes_the_greeting("supervised");
    }
}

#[test]
fn claude_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key() {
    if !common::require_root(
        "claude_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key",
        "the container tier runs as the engine user make setup made",
    ) {
        return;
    }
    // The agent image is `make images`' (about 17 minutes of image builds on this machine), not
    // `make setup`'s, so a fresh CI machine lacks it: say so loudly rather than fail or pass.
    // Images live in the store of the engine user the container tier runs Podman as.
    let exists = std::process::Command::new("runuser")
        .args([
            "-u",
            common::TEST_USER,
            "--",
            "podman",
            "image",
            "exists",
            CLAUDE_IMAGE,
        ])
        .current_dir("/")
        .status()
        .is_ok_and(|s| s.success());
    if !exists {
        eprintln!(
            "skipped: claude_fixes_a_file_at_the_container_tier_and_the_box_never_holds_the_key: \
             the image {CLAUDE_IMAGE} is not built on this host (run `make images`)"
        );
        return;
    }
    claude_fixes_the_greeting("container");
}

/// Export `name` and apply its patch to a fresh checkout of main: the edit lands, and the
/// export holds no credential. Returns the export's report.md.
fn exported_patch_applies(r: &Repo, name: &str) -> String {
    let out_dir = tempfile::tempdir().unwrap();
    let review = out_dir.path().join("review");
    r.ok(&["box", "export", name, "--out", review.to_str().unwrap()]);
    assert!(common::files_containing(&review, REAL.as_bytes()).is_empty());
    let clone = out_dir.path().join("clone");
    common::git(
        out_dir.path(),
        &[
            "clone",
            "-q",
            r.path().to_str().unwrap(),
            clone.to_str().unwrap(),
        ],
    );
    common::git(
        &clone,
        &[
            "apply",
            "--3way",
            review.join("patch.diff").to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("greeting.txt")).unwrap(),
        "hello world\n"
    );
    std::fs::read_to_string(review.join("report.md")).unwrap()
}
