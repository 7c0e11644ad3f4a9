//! The per-box HOME: made at `box create`, seeded once from the creating user's agent config
//! (runtime-scoped, credential shapes stripped at any depth), the box's `HOME` at every run,
//! and never written back.
//!
//! The host's HOME in these tests is a temp directory the test plants (a fake `~/.claude`
//! with credential files nested deep); h5i is pointed at it through `HOME`. The kernel-tier
//! checks run a real process-tier box as root (CI). An agent-scoped box needs a tier that
//! enforces an egress allowlist (supervised and up): where this build has none, the test that
//! needs one says `skipped:` and returns, and the seed is checked through the same library
//! call `box create` makes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::support;

use std::collections::BTreeSet;
use std::path::Path;

use common::{stderr, stdout, Repo};
use h5i::box_home::{create, HomeMade};
use h5i::store::BoxPaths;
use h5i_policy::{AgentRuntime, HostTiers, ResolveRequest};

/// What every planted credential file holds.
const SECRET: &str = "sk-PLANTED-never-in-a-box-7d1e";

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// Every path under `root`, relative, without following links.
fn tree(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            out.insert(p.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// A fake host HOME: `~/.claude` with ordinary config and credential shapes at every depth,
/// `~/.codex` with Codex's, and credentials beside them in HOME itself.
fn planted_home() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let h = t.path();
    write(h, ".claude/settings.json", "{\"theme\":\"dark\"}");
    write(h, ".claude/CLAUDE.md", "be brief");
    write(h, ".claude/agents/reviewer.md", "review things");
    for cred in [
        ".claude/credentials.json",
        ".claude/.credentials.json",
        ".claude/agents/.netrc",
        ".claude/plugins/x/y/z/id_rsa",
        ".claude/plugins/x/y/z/w/v/x.pem",
        ".claude/deep/a/b/c/d/e/tls.key",
        ".claude/deep/a/b/c/bundle.p12",
        ".codex/auth.json",
        ".netrc",
        ".ssh/id_rsa",
    ] {
        write(h, cred, SECRET);
    }
    write(h, ".codex/config.toml", "model = \"x\"");
    t
}

/// The policy `box create --profile PROFILE` resolves to on a host that can run every tier.
fn agent_policy(profile: &str, proxy_off: bool) -> h5i_policy::ResolvedPolicy {
    let req = ResolveRequest {
        profile: Some(profile.to_owned()),
        isolation: Some("supervised".to_owned()),
        credential_proxy: proxy_off.then(|| "0".to_owned()),
        ..ResolveRequest::default()
    };
    h5i_policy::resolve(None, &req, &HostTiers::all_available()).unwrap()
}

#[test]
fn a_claude_box_home_gets_the_config_and_no_credential_shape_at_any_depth() {
    let host = planted_home();
    let before = tree(host.path());
    let boxdir = tempfile::tempdir().unwrap();
    let paths = BoxPaths {
        dir: boxdir.path().to_path_buf(),
    };
    let made = create(
        &paths,
        &agent_policy("agent-claude", false),
        Some(host.path()),
    )
    .unwrap()
    .unwrap();
    assert!(
        matches!(&made, HomeMade::Seeded(AgentRuntime::Claude, r) if !r.kept_token),
        "{made:?}"
    );
    let home = paths.home();
    let got = tree(&home);
    let want: BTreeSet<String> = [
        ".claude",
        ".claude/settings.json",
        ".claude/CLAUDE.md",
        ".claude/agents",
        ".claude/agents/reviewer.md",
        ".claude/plugins",
        ".claude/plugins/x",
        ".claude/plugins/x/y",
        ".claude/plugins/x/y/z",
        ".claude/plugins/x/y/z/w",
        ".claude/plugins/x/y/z/w/v",
        ".claude/deep",
        ".claude/deep/a",
        ".claude/deep/a/b",
        ".claude/deep/a/b/c",
        ".claude/deep/a/b/c/d",
        ".claude/deep/a/b/c/d/e",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);
    assert!(common::files_containing(&home, SECRET.as_bytes()).is_empty());
    assert!(made
        .describe()
        .contains("credential-shaped entries stripped"));
    assert!(!made.describe().contains("credentials.json"));
    // The host's config is exactly as it was.
    assert_eq!(tree(host.path()), before);
}

#[test]
fn the_runtime_token_is_kept_only_when_the_credential_proxy_is_off() {
    let host = planted_home();
    let boxdir = tempfile::tempdir().unwrap();
    let paths = BoxPaths {
        dir: boxdir.path().to_path_buf(),
    };
    let made = create(
        &paths,
        &agent_policy("agent-claude", true),
        Some(host.path()),
    )
    .unwrap()
    .unwrap();
    assert!(
        matches!(&made, HomeMade::Seeded(_, r) if r.kept_token),
        "{made:?}"
    );
    let home = paths.home();
    // Only the runtime's own token, only at the top: every other shape still goes.
    assert_eq!(
        common::files_containing(&home, SECRET.as_bytes()),
        vec![home.join(".claude/.credentials.json").display().to_string()]
    );
}

#[test]
fn a_codex_box_gets_codex_state_and_nothing_of_claude() {
    let host = planted_home();
    let boxdir = tempfile::tempdir().unwrap();
    let paths = BoxPaths {
        dir: boxdir.path().to_path_buf(),
    };
    create(
        &paths,
        &agent_policy("agent-codex", false),
        Some(host.path()),
    )
    .unwrap()
    .unwrap();
    let want: BTreeSet<String> = [".codex", ".codex/config.toml"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(tree(&paths.home()), want);
}

/// Runs in the box: everything under HOME, whether the host's HOME is reachable, then a write
/// into HOME's config. Prints one JSON line.
const LOOK_AND_WRITE: &str = r#"
import json, os, sys
home = os.environ["HOME"]
files = []
for d, dirs, fs in os.walk(home):
    for f in fs + dirs:
        files.append(os.path.relpath(os.path.join(d, f), home))
secret_hits = []
for d, _, fs in os.walk(home):
    for f in fs:
        try:
            if sys.argv[2].encode() in open(os.path.join(d, f), "rb").read():
                secret_hits.append(f)
        except OSError:
            pass
try:
    os.listdir(sys.argv[1])
    host = "readable"
except OSError as e:
    host = e.strerror
os.makedirs(os.path.join(home, ".claude"), exist_ok=True)
with open(os.path.join(home, ".claude", "settings.json"), "w") as f:
    f.write('{"theme":"written-in-the-box"}')
with open(os.path.join(home, ".claude", "new-in-box.txt"), "w") as f:
    f.write("box state")
print(json.dumps({"home": home, "files": sorted(files), "hits": secret_hits, "host": host}))
"#;

fn look_and_write(r: &Repo, name: &str, host: &Path, env: &[(&str, &str)]) -> serde_json::Value {
    let mut env = env.to_vec();
    let host_text = host.display().to_string();
    env.push(("HOME", &host_text));
    let out = r.h5i_env(
        &[
            "box",
            "run",
            name,
            "--",
            "python3",
            "-c",
            LOOK_AND_WRITE,
            &host_text,
            SECRET,
        ],
        &env,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    serde_json::from_str(stdout(&out).trim()).unwrap()
}

#[test]
fn a_process_tier_box_runs_with_its_own_home_that_persists_and_never_reaches_the_host() {
    let host = planted_home();
    let host_text = host.path().display().to_string();
    let before = (
        tree(host.path()),
        std::fs::read_to_string(host.path().join(".claude/settings.json")).unwrap(),
    );
    let r = Repo::new();
    let out = r.h5i_env(
        &["box", "create", "p", "--isolation=process"],
        &[("HOME", &host_text)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let home = r.box_dir("p").join("home");

    let first = look_and_write(&r, "p", host.path(), &[]);
    // HOME is the box's own directory, seen at its in-box place (never a host path); a box
    // scoped to no runtime gets no agent state.
    assert_eq!(first["home"], h5i_policy::inbox::HOME, "{first}");
    assert_eq!(first["files"], serde_json::json!([]), "{first}");
    // The user's HOME is not in the box at all.
    assert_eq!(first["host"], "No such file or directory", "{first}");

    // The box's writes stayed in its HOME and are there for its next run.
    let second = look_and_write(&r, "p", host.path(), &[]);
    let files: Vec<&str> = second["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        [".claude", ".claude/new-in-box.txt", ".claude/settings.json"]
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".claude/settings.json")).unwrap(),
        "{\"theme\":\"written-in-the-box\"}"
    );
    // Nothing of it reached the host's config.
    assert_eq!(
        (
            tree(host.path()),
            std::fs::read_to_string(host.path().join(".claude/settings.json")).unwrap()
        ),
        before
    );
    let events = std::fs::read_to_string(r.box_dir("p").join("events.jsonl")).unwrap();
    assert!(
        events.contains("not scoped to an agent runtime"),
        "{events}"
    );
}

#[test]
fn a_workspace_tier_box_gets_no_home_of_its_own() {
    let host = planted_home();
    let host_text = host.path().display().to_string();
    let r = Repo::new();
    let out = r.h5i_env(
        &["box", "create", "w", "--isolation=workspace"],
        &[("HOME", &host_text)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!r.box_dir("w").join("home").exists());
}

#[test]
fn a_claude_box_sees_its_seeded_config_and_no_planted_credential_and_writes_stay_in_it() {
    let host = planted_home();
    let host_text = host.path().display().to_string();
    let before = (
        tree(host.path()),
        std::fs::read_to_string(host.path().join(".claude/settings.json")).unwrap(),
    );
    let r = Repo::new();
    let out = r.h5i_env(
        &[
            "box",
            "create",
            "c",
            "--profile",
            "agent-claude",
            "--isolation=supervised",
        ],
        &[("HOME", &host_text)],
    );
    if stderr(&out).contains("not in this build") {
        h5i_testsupport::skipped!(
            "an agent-scoped box needs the supervised tier, which this build of h5i lacks ({}); the seed itself is checked by a_claude_box_home_gets_the_config_and_no_credential_shape_at_any_depth",
            stderr(&out).trim()
        );
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ca = support::TestCa::new();
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_file = ca_dir.path().join("ca.der");
    std::fs::write(&ca_file, &ca.ca_der).unwrap();
    let ca_text = ca_file.display().to_string();
    let seen = look_and_write(
        &r,
        "c",
        host.path(),
        &[
            ("ANTHROPIC_API_KEY", "sk-ant-test-not-used"),
            ("H5I_TEST_HOSTS", "api.anthropic.com=127.0.0.1:9"),
            ("H5I_TEST_CA_FILE", &ca_text),
        ],
    );
    let files: BTreeSet<&str> = seen["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for present in [
        ".claude/settings.json",
        ".claude/CLAUDE.md",
        ".claude/agents/reviewer.md",
    ] {
        assert!(files.contains(present), "{present} missing: {seen}");
    }
    for absent in [
        ".claude/credentials.json",
        ".claude/.credentials.json",
        ".claude/agents/.netrc",
        ".claude/plugins/x/y/z/id_rsa",
        ".claude/plugins/x/y/z/w/v/x.pem",
        ".codex",
        ".netrc",
        ".ssh",
    ] {
        assert!(!files.contains(absent), "{absent} in the box: {seen}");
    }
    assert_eq!(seen["hits"], serde_json::json!([]), "{seen}");
    assert_ne!(seen["host"], "readable", "{seen}");
    assert_eq!(
        (
            tree(host.path()),
            std::fs::read_to_string(host.path().join(".claude/settings.json")).unwrap()
        ),
        before
    );
}
