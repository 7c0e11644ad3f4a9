//! Per-box HOME seeding over a fixture tree holding every credential shape at several depths,
//! ordinary config, session records, symlinks in and out, and a socket.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use h5i_broker::home::{seed, HomeError, SkipReason, TokenPolicy};
use h5i_policy::AgentRuntime;

const SECRET: &str = "SECRET-MATERIAL";

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// Every path under `root` (relative), with a trailing `@` for symlinks.
fn tree(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let rel = e
                .path()
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                out.insert(format!("{rel}@"));
            } else if ft.is_dir() {
                out.insert(format!("{rel}/"));
                walk(root, &e.path(), out);
            } else {
                out.insert(rel);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

fn contents(root: &Path) -> String {
    let mut all = String::new();
    for rel in tree(root) {
        let p = root.join(rel.trim_end_matches('@'));
        if p.is_file() && !rel.ends_with('@') {
            all.push_str(&fs::read_to_string(p).unwrap_or_default());
        }
    }
    all
}

/// A Claude config dir with every shape in it; returns (scratch, src).
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("dot-claude");
    write(&src, "settings.json", "{\"theme\":\"dark\"}");
    write(&src, "CLAUDE.md", "be brief");
    write(&src, "agents/reviewer.md", "review things");
    write(&src, "plugins/x/config.toml", "a = 1");
    write(&src, "keys.txt", "not a key, just a name");
    for cred in [
        ".credentials.json",
        "credentials",
        "agents/.netrc",
        "plugins/x/credentials.json",
        "plugins/x/Credentials.JSON",
        "plugins/x/.credentials.bak",
        "deep/a/b/c/id_ed25519",
        "deep/a/b/c/id_ed25519.pub",
        "deep/a/b/c/id_rsa",
        "deep/a/server.pem",
        "deep/a/tls.KEY",
        "deep/a/bundle.p12",
        "deep/a/win.pfx",
        "deep/a/auth.json",
        "deep/.git-credentials",
        ".ssh/config",
        "credentials.d/inner.txt",
    ] {
        write(&src, cred, SECRET);
    }
    write(
        &src,
        "projects/-home-u-other/transcript.jsonl",
        "another project's prompt",
    );
    write(&src, "todos/x.json", "another session");
    // The host's own copy of h5i's skill (the box gets the embedded one instead), beside
    // another skill that is copied.
    write(&src, "skills/h5i/SKILL.md", "the host's h5i skill");
    write(&src, "skills/other/SKILL.md", "another skill");
    write(t.path(), "outside.txt", SECRET);
    symlink("agents/reviewer.md", src.join("link_in")).unwrap();
    symlink("/etc/passwd", src.join("link_abs")).unwrap();
    symlink("../outside.txt", src.join("link_up")).unwrap();
    symlink("agents/../../outside.txt", src.join("link_sneaky")).unwrap();
    symlink(".credentials.json", src.join("link_to_token")).unwrap();
    symlink(t.path(), src.join("dir_out")).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(src.join("agent.sock")).unwrap();
    (t, src)
}

#[test]
fn seeding_strips_every_credential_shape_and_keeps_ordinary_config() {
    let (t, src) = fixture();
    let before = (tree(&src), contents(&src));
    let dst = t.path().join("boxhome/.claude");
    let r = seed(&src, &dst, AgentRuntime::Claude, TokenPolicy::Strip).unwrap();

    let got = tree(&dst);
    let want: BTreeSet<String> = [
        "settings.json",
        "CLAUDE.md",
        "keys.txt",
        "agents/",
        "agents/reviewer.md",
        "plugins/",
        "plugins/x/",
        "plugins/x/config.toml",
        "deep/",
        "deep/a/",
        "deep/a/b/",
        "deep/a/b/c/",
        "link_in@",
        "link_to_token@",
        "skills/",
        "skills/other/",
        "skills/other/SKILL.md",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);
    assert!(!contents(&dst).contains(SECRET), "a credential was copied");
    assert_eq!(
        fs::read_to_string(dst.join("link_in")).unwrap(),
        "review things"
    );
    assert!(
        !dst.join("link_to_token").exists(),
        "the link to the token resolves"
    );

    let stripped: BTreeSet<String> = r
        .stripped
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    for s in [
        ".credentials.json",
        "agents/.netrc",
        "deep/a/b/c/id_ed25519",
        "deep/a/auth.json",
        ".ssh",
        "credentials.d",
    ] {
        assert!(stripped.contains(s), "{s} not reported: {stripped:?}");
    }
    assert_eq!(stripped.len(), 17, "{stripped:?}");
    let skipped: Vec<(String, SkipReason)> = r
        .skipped
        .iter()
        .map(|(p, why)| (p.to_string_lossy().into_owned(), *why))
        .collect();
    for (name, why) in [
        ("projects", SkipReason::SessionState),
        ("todos", SkipReason::SessionState),
        ("link_abs", SkipReason::SymlinkOut),
        ("link_up", SkipReason::SymlinkOut),
        ("link_sneaky", SkipReason::SymlinkOut),
        ("dir_out", SkipReason::SymlinkOut),
        ("agent.sock", SkipReason::Special),
        ("skills/h5i", SkipReason::H5iSkill),
    ] {
        assert!(
            skipped.contains(&(name.to_string(), why)),
            "{name}: {skipped:?}"
        );
    }
    assert!(!r.kept_token);
    assert_eq!(r.files, 6);
    // The source is never written.
    assert_eq!((tree(&src), contents(&src)), before);
}

#[test]
fn the_runtime_token_is_kept_only_at_the_top_and_only_when_asked() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("dot-codex");
    write(&src, "auth.json", "{\"OPENAI_API_KEY\":\"x\"}");
    write(&src, "config.toml", "model = \"x\"");
    write(&src, "nested/auth.json", SECRET);
    write(&src, ".credentials.json", SECRET);
    write(&src, "sessions/2025/x.jsonl", "another project");

    let strip = seed(
        &src,
        &t.path().join("a"),
        AgentRuntime::Codex,
        TokenPolicy::Strip,
    )
    .unwrap();
    assert!(!t.path().join("a/auth.json").exists());
    assert!(!strip.kept_token);

    let keep = seed(
        &src,
        &t.path().join("b"),
        AgentRuntime::Codex,
        TokenPolicy::KeepRuntimeToken,
    )
    .unwrap();
    assert!(keep.kept_token);
    assert!(t.path().join("b/auth.json").exists());
    assert!(t.path().join("b/config.toml").exists());
    assert!(!t.path().join("b/nested/auth.json").exists());
    // Claude's token file is not Codex's: still stripped in a Codex seed.
    assert!(!t.path().join("b/.credentials.json").exists());
    assert!(!t.path().join("b/sessions").exists());
    assert!(!contents(&t.path().join("b")).contains(SECRET));
}

#[test]
fn a_seed_is_made_once_into_an_empty_directory_outside_the_source() {
    let (t, src) = fixture();
    let dst = t.path().join("home");
    write(&dst, "already-here", "x");
    let err = seed(&src, &dst, AgentRuntime::Claude, TokenPolicy::Strip).unwrap_err();
    assert!(matches!(err, HomeError::NotEmpty(_)), "{err}");
    assert!(err.to_string().starts_with("refusing: ") && err.to_string().contains("to fix:"));

    let inside = src.join("agents/copy");
    let err = seed(&src, &inside, AgentRuntime::Claude, TokenPolicy::Strip).unwrap_err();
    assert!(matches!(err, HomeError::Overlap { .. }), "{err}");
    assert!(!inside.exists(), "a refused seed wrote into the source");

    let missing = seed(
        &t.path().join("nope"),
        &t.path().join("fresh"),
        AgentRuntime::Codex,
        TokenPolicy::Strip,
    )
    .unwrap();
    assert!(!missing.source_found);
    assert!(tree(&t.path().join("fresh")).is_empty());
}
