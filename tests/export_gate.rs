#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The export gate on real git repositories: a hostile-tree table (each row a trick a box could
//! play), the bundle's atomicity (refusals, `--force`, a failure between files, a process killed
//! mid-export), redaction across all three files, and fail-closed refusals.
//!
//! Every row checks the same three things: the exclusion is reported in `report.md` and
//! `receipt.json`; `patch.diff` passes `git apply --check` and applies with `git apply --3way`
//! onto a fresh checkout of the base; and the result is exactly the workspace minus what was
//! excluded (which stays as the base had it).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use h5i::export::{export, export_with_hook, ExportCaps, ExportError, ExportRequest};
use h5i_broker::receipt_log::{DamagedLine, ReceiptReadout};
use h5i_broker::redact::{Redactor, SecretValue};
use h5i_policy::receipt::{EgressTally, ExitOutcome, ReceiptLane, ReceiptRecord, RecordBody};

const SECRET: &str = "hunter2-S3CR3T-value-9f8e";

fn git_cmd(dir: &Path) -> Command {
    let mut c = Command::new("git");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GIT_") {
            c.env_remove(k);
        }
    }
    c.current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.test",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "protocol.file.allow=always",
        ]);
    c
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_cmd(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn write(path: &Path, bytes: impl AsRef<[u8]>) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

fn binary(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 3) as u8)
        .collect()
}

/// A store repository with a pinned base, and a box workspace checked out from it.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    store: PathBuf,
    base: String,
    ws: PathBuf,
    scratch: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let repo = root.join("store");
        fs::create_dir(&repo).unwrap();
        git(&repo, &["init", "-q"]);
        write(&repo.join("README.md"), "hello\nworld\n");
        write(
            &repo.join("src/lib.rs"),
            (1..=40).map(|i| format!("line {i}\n")).collect::<String>(),
        );
        write(&repo.join("docs/guide.md"), "a guide\n");
        write(&repo.join("docs/keep.md"), "kept as it is\n");
        write(&repo.join("assets/a.txt"), "asset a\n");
        write(&repo.join("assets/b.txt"), "asset b\n");
        write(&repo.join("bin/logo.png"), binary(1, 3000));
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", "base"]);
        let base = git(&repo, &["rev-parse", "HEAD"]);
        let fx = Fixture {
            store: repo.join(".git"),
            base,
            ws: root.join("ws"),
            scratch: root.join("scratch"),
            root,
            _dir: dir,
        };
        fx.checkout(&fx.ws);
        fx
    }

    /// A fresh repository at `dir` with the base checked out, borrowing the store's objects.
    fn checkout(&self, dir: &Path) {
        fs::create_dir_all(dir).unwrap();
        git(dir, &["init", "-q"]);
        write(
            &dir.join(".git/objects/info/alternates"),
            format!("{}\n", self.store.join("objects").display()),
        );
        git(dir, &["read-tree", "-u", "--reset", &self.base]);
    }

    /// Ordinary work every row carries: an edit, a new file, a deletion, a binary change, a new
    /// binary and a new executable.
    fn ordinary_changes(&self) {
        let ws = &self.ws;
        write(&ws.join("README.md"), "hello\nbox world\n");
        let lib: String = (1..=40)
            .map(|i| {
                if i == 20 {
                    "line twenty\n".to_string()
                } else {
                    format!("line {i}\n")
                }
            })
            .collect();
        write(&ws.join("src/lib.rs"), lib);
        write(&ws.join("src/new.rs"), "pub fn new() {}\n");
        fs::remove_file(ws.join("docs/guide.md")).unwrap();
        write(&ws.join("bin/logo.png"), binary(7, 3100));
        write(&ws.join("bin/icon.ico"), binary(9, 500));
        write(&ws.join("tools/run.sh"), "#!/bin/sh\necho hi\n");
        fs::set_permissions(ws.join("tools/run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn request<'a>(
        &'a self,
        out: &'a Path,
        redactor: &'a Redactor,
        receipts: &'a ReceiptReadout,
    ) -> ExportRequest<'a> {
        ExportRequest {
            box_name: "hostile",
            store_git_dir: &self.store,
            base_sha: &self.base,
            workspace: &self.ws,
            scratch: &self.scratch,
            out,
            force: false,
            caps: ExportCaps::default(),
            redactor,
            receipts,
            tier: "workspace",
            policy_digest: "sha256:feed",
            proposal: None,
            box_profile: "default",
            tee_shim: false,
            shim_not_agent_shell: None,
            unchecked_secrets: &[],
        }
    }
}

fn redactor() -> Redactor {
    Redactor::new(vec![SecretValue::new("secret:API_TOKEN", SECRET)])
}

fn run_record(
    seq: u64,
    lane: ReceiptLane,
    argv: &[&str],
    egress: Option<EgressTally>,
) -> ReceiptRecord {
    ReceiptRecord {
        v: 1,
        seq,
        lane,
        at_ms: 1_700_000_000_000,
        policy_digest: "sha256:feed".into(),
        redactions: vec![],
        payload: None,
        body: RecordBody::Run {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            tier: "workspace".into(),
            exit: ExitOutcome {
                code: Some(0),
                signal: None,
                timed_out: false,
                oom_killed: false,
            },
            rusage: None,
            cgroup_usage: None,
            wall_ms: 12,
            oom: None,
            egress,
            socket_gate: None,
        },
    }
}

fn receipts() -> ReceiptReadout {
    ReceiptReadout {
        records: vec![
            run_record(1, ReceiptLane::HostEnvRun, &["cargo", "test"], None),
            run_record(2, ReceiptLane::TeeShim, &["echo", SECRET], None),
        ],
        damaged: vec![],
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>, bool),
    Link(Vec<u8>),
}

fn under(path: &str, prefixes: &[&str]) -> bool {
    prefixes
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

/// Files and symlinks under `root` (never `.git` entries, never following a link), skipping
/// paths under `drop`.
fn tree(root: &Path, drop: &[&str]) -> BTreeMap<String, Node> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let name = String::from_utf8_lossy(e.file_name().as_bytes()).into_owned();
            if name == ".git" {
                continue;
            }
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if under(&path, drop) {
                continue;
            }
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_symlink() {
                let t = fs::read_link(e.path()).unwrap();
                out.insert(path, Node::Link(t.as_os_str().as_bytes().to_vec()));
            } else if ft.is_file() {
                let exec = e.metadata().unwrap().permissions().mode() & 0o100 != 0;
                out.insert(path, Node::File(fs::read(e.path()).unwrap(), exec));
            }
        }
    }
    out
}

fn read_receipt(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(out.join("receipt.json")).unwrap()).unwrap()
}

/// Apply `out/patch.diff` to a fresh checkout of the base and return the checkout.
fn apply_to_fresh(fx: &Fixture, out: &Path, name: &str) -> PathBuf {
    let fresh = fx.root.join(format!("fresh-{name}"));
    fx.checkout(&fresh);
    let patch = out.join("patch.diff");
    let p = patch.to_str().unwrap();
    git(&fresh, &["apply", "--check", p]);
    git(&fresh, &["apply", "--3way", p]);
    fresh
}

/// One hostile row: what it plants, what must be excluded (raw path, receipt `kind`), what the
/// workspace holds that git itself would not export (ignored paths).
struct Row {
    name: &'static str,
    plant: fn(&Path),
    excluded: &'static [(&'static str, &'static str)],
    ignored: &'static [&'static str],
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "symlink_to_etc_is_excluded",
            plant: |ws| symlink("/etc", ws.join("evil_etc")).unwrap(),
            excluded: &[("evil_etc", "symlink-absolute")],
            ignored: &[],
        },
        Row {
            name: "symlink_chain_escaping_the_tree_is_excluded",
            plant: |ws| {
                symlink("b", ws.join("a")).unwrap();
                symlink("../..", ws.join("b")).unwrap();
                fs::create_dir_all(ws.join("deep/er")).unwrap();
                symlink("../../a/etc", ws.join("deep/er/c")).unwrap();
            },
            excluded: &[
                ("a", "symlink-escapes"),
                ("b", "symlink-escapes"),
                ("deep/er/c", "symlink-escapes"),
            ],
            ignored: &[],
        },
        Row {
            name: "in_tree_symlinks_are_kept",
            plant: |ws| {
                symlink("src/lib.rs", ws.join("lib_link")).unwrap();
                symlink("src", ws.join("src_link")).unwrap();
                symlink("../README.md", ws.join("src/readme_link")).unwrap();
                symlink("src_link/../docs/keep.md", ws.join("via_link")).unwrap();
                symlink("not/there/yet", ws.join("dangling_inside")).unwrap();
            },
            excluded: &[],
            ignored: &[],
        },
        Row {
            name: "symlink_into_dot_git_is_excluded",
            plant: |ws| symlink(".git/hooks/pre-commit", ws.join("hook")).unwrap(),
            excluded: &[("hook", "symlink-into-git")],
            ignored: &[],
        },
        Row {
            name: "tracked_file_replaced_by_a_symlink_keeps_the_base",
            plant: |ws| {
                fs::remove_file(ws.join("docs/keep.md")).unwrap();
                symlink("/etc/passwd", ws.join("docs/keep.md")).unwrap();
            },
            excluded: &[("docs/keep.md", "symlink-absolute")],
            ignored: &[],
        },
        Row {
            name: "tracked_dir_replaced_by_an_escaping_symlink_keeps_the_base",
            plant: |ws| {
                fs::remove_dir_all(ws.join("assets")).unwrap();
                symlink("/etc", ws.join("assets")).unwrap();
            },
            excluded: &[("assets", "symlink-absolute")],
            ignored: &[],
        },
        Row {
            name: "nested_dot_git_directory_is_excluded",
            plant: |ws| {
                write(
                    &ws.join("pkg/.git/config"),
                    "[core]\n\tfsmonitor = touch /tmp/h5i-pwned\n",
                );
                write(
                    &ws.join("pkg/.git/hooks/post-checkout"),
                    "#!/bin/sh\nexit 1\n",
                );
                write(&ws.join("pkg/file.txt"), "package file\n");
            },
            excluded: &[("pkg/.git", "nested-git")],
            ignored: &[],
        },
        Row {
            name: "nested_dot_git_file_is_excluded",
            plant: |ws| {
                write(&ws.join("lib/.git"), "gitdir: /nonexistent/elsewhere\n");
                write(&ws.join("lib/code.txt"), "code\n");
            },
            excluded: &[("lib/.git", "nested-git")],
            ignored: &[],
        },
        Row {
            name: "gitlink_from_a_nested_repository_is_excluded",
            plant: |ws| {
                let n = ws.join("nested");
                fs::create_dir_all(&n).unwrap();
                git(&n, &["init", "-q"]);
                write(&n.join("inner.txt"), "inner\n");
                git(&n, &["add", "-A"]);
                git(&n, &["commit", "-q", "-m", "inner"]);
            },
            excluded: &[("nested", "gitlink"), ("nested/.git", "nested-git")],
            ignored: &[],
        },
        Row {
            name: "dotdot_looking_names_are_fine_but_dotdot_targets_are_not",
            plant: |ws| {
                write(&ws.join("..x"), "dotdot x\n");
                write(&ws.join("x.."), "x dotdot\n");
                write(&ws.join(".../three"), "three dots\n");
                symlink("../../etc/passwd", ws.join("sneaky")).unwrap();
                symlink("..x", ws.join("to_dotdot_x")).unwrap();
            },
            excluded: &[("sneaky", "symlink-escapes")],
            ignored: &[],
        },
        Row {
            name: "names_git_or_other_platforms_read_as_dot_git_are_excluded",
            plant: |ws| {
                write(&ws.join("x/.GIT/config"), "[core]\n");
                write(&ws.join("y/.git./hooks"), "x\n");
                write(&ws.join("GIT~1/HEAD"), "ref: refs/heads/main\n");
                write(&ws.join("bad\x1b[31mname"), "escape in a name\n");
                write(&ws.join("back\\..\\slash"), "windows separator\n");
                write(&ws.join("x/fine.txt"), "fine\n");
            },
            excluded: &[
                ("x/.GIT", "unsafe-path"),
                ("y/.git.", "unsafe-path"),
                ("GIT~1", "unsafe-path"),
                ("bad\x1b[31mname", "unsafe-path"),
                ("back\\..\\slash", "unsafe-path"),
            ],
            ignored: &[],
        },
        Row {
            name: "a_200_megabyte_file_is_excluded_without_being_read",
            plant: |ws| {
                let f = fs::File::create(ws.join("big.bin")).unwrap();
                f.set_len(200 * 1024 * 1024).unwrap();
            },
            excluded: &[("big.bin", "too-large")],
            ignored: &[],
        },
        Row {
            name: "a_fifo_in_place_of_a_tracked_file_is_excluded_without_blocking",
            plant: |ws| {
                fs::remove_file(ws.join("docs/keep.md")).unwrap();
                for p in ["docs/keep.md", "untracked_pipe"] {
                    let st = Command::new("mkfifo").arg(ws.join(p)).status().unwrap();
                    assert!(st.success());
                }
            },
            // git itself never looks at an untracked fifo; a tracked path that became one is
            // reported and kept at base.
            excluded: &[("docs/keep.md", "not-a-file")],
            ignored: &[],
        },
        Row {
            name: "ignored_files_stay_out_but_a_nested_git_under_them_is_reported",
            plant: |ws| {
                write(&ws.join(".gitignore"), "target/\n*.log\n");
                write(&ws.join("target/debug/app"), binary(3, 100));
                write(&ws.join("target/dep/.git/HEAD"), "ref: refs/heads/main\n");
                write(&ws.join("build.log"), "noise\n");
            },
            excluded: &[("target/dep/.git", "nested-git")],
            ignored: &["target", "build.log"],
        },
        Row {
            name: "the_boxs_own_git_config_and_attributes_steer_nothing",
            plant: |ws| {
                let marker = ws.parent().unwrap().join("pwned");
                let cfg = format!(
                    "[core]\n\tfsmonitor = \"touch {m}\"\n\thooksPath = /tmp\n[diff \"evil\"]\n\ttextconv = \"touch {m}\"\n[filter \"evil\"]\n\tclean = \"touch {m}; cat\"\n",
                    m = marker.display()
                );
                let mut old = fs::read_to_string(ws.join(".git/config")).unwrap();
                old.push_str(&cfg);
                fs::write(ws.join(".git/config"), old).unwrap();
                write(&ws.join(".gitattributes"), "* diff=evil filter=evil\n");
            },
            excluded: &[],
            ignored: &[],
        },
    ]
}

fn check_row(row: &Row) {
    let fx = Fixture::new();
    fx.ordinary_changes();
    (row.plant)(&fx.ws);
    let out = fx.root.join("review");
    let r = redactor();
    let rec = receipts();
    let s = export(&fx.request(&out, &r, &rec)).unwrap_or_else(|e| panic!("{}: {e}", row.name));

    // Reported, in the summary, report.md and receipt.json.
    let report = fs::read_to_string(out.join("report.md")).unwrap();
    let receipt = read_receipt(&out);
    let listed: Vec<(String, String)> = receipt["export"]["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["reason"]["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (path, kind) in row.excluded {
        let shown = h5i::export::gate::escape_controls(path);
        assert!(
            listed.contains(&(shown.clone(), kind.to_string())),
            "{}: {path:?} as {kind} not in receipt.json {listed:?}",
            row.name
        );
        assert!(
            report.contains(&format!("`{shown}`")),
            "{}: {path:?} not in report.md",
            row.name
        );
        assert!(
            s.excluded.iter().any(|e| e.path == shown),
            "{}: summary",
            row.name
        );
    }
    assert_eq!(
        listed.len(),
        row.excluded.len(),
        "{}: unexpected exclusions {listed:?}",
        row.name
    );
    assert!(
        !report.contains('\x1b'),
        "{}: raw escape in report",
        row.name
    );

    // Applies onto a fresh base, producing exactly the allowed changes.
    let fresh = apply_to_fresh(&fx, &out, row.name);
    let raw: Vec<&str> = row.excluded.iter().map(|(p, _)| *p).collect();
    let mut drop = raw.clone();
    drop.extend_from_slice(row.ignored);
    let mut want = tree(&fx.ws, &drop);
    let base_tree = {
        let b = fx.root.join(format!("base-{}", row.name));
        fx.checkout(&b);
        tree(&b, &[])
    };
    for (p, n) in base_tree {
        if under(&p, &raw) {
            want.insert(p, n);
        }
    }
    let got = tree(&fresh, &[]);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{}: paths after apply",
        row.name
    );
    for (p, n) in &want {
        assert_eq!(got.get(p), Some(n), "{}: {p} after apply", row.name);
    }
    assert_eq!(
        s.files_changed,
        files_changed_in(&fresh, &fx.base),
        "{}",
        row.name
    );
}

/// Files the applied patch changed, as the fresh checkout's index (which `--3way` updates) says.
fn files_changed_in(fresh: &Path, base: &str) -> usize {
    git(
        fresh,
        &[
            "diff-index",
            "--cached",
            "--name-only",
            "--no-renames",
            base,
        ],
    )
    .lines()
    .count()
}

#[test]
fn hostile_tree_table() {
    let rows = rows();
    let only = std::env::var("H5I_ROW").ok();
    for row in &rows {
        if only.as_deref().is_some_and(|o| o != row.name) {
            continue;
        }
        check_row(row);
    }
    // The row that plants a box config asserts its marker never appeared.
    let stray = std::env::temp_dir().join("h5i-pwned");
    assert!(!stray.exists());
}

#[test]
fn box_git_config_programs_never_run() {
    let fx = Fixture::new();
    fx.ordinary_changes();
    let marker = fx.root.join("pwned");
    (rows()
        .into_iter()
        .find(|r| r.name == "the_boxs_own_git_config_and_attributes_steer_nothing")
        .unwrap()
        .plant)(&fx.ws);
    let out = fx.root.join("review");
    let r = redactor();
    let rec = receipts();
    export(&fx.request(&out, &r, &rec)).unwrap();
    assert!(
        !marker.exists(),
        "a program named by the box's git config ran"
    );
}

#[test]
fn secrets_in_names_and_content_are_excluded_and_appear_nowhere() {
    let fx = Fixture::new();
    fx.ordinary_changes();
    write(
        &fx.ws.join(format!("creds-{SECRET}.txt")),
        "innocent content\n",
    );
    write(&fx.ws.join("config.env"), format!("TOKEN={SECRET}\n"));
    write(
        &fx.ws.join("keys/id_ed25519"),
        "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAAB3NzaC1yc2E\n-----END OPENSSH PRIVATE KEY-----\n",
    );
    let mut bin = binary(5, 2000);
    bin.splice(700..700, SECRET.bytes());
    write(&fx.ws.join("bin/blob.dat"), bin);
    symlink(format!("docs/{SECRET}"), fx.ws.join("secret_link")).unwrap();
    let out = fx.root.join("review");
    let r = redactor();
    let mut rec = receipts();
    let mut tally = EgressTally::default();
    tally.denied.insert(format!("{SECRET}.evil.test:443"), 2);
    rec.records.push(run_record(
        3,
        ReceiptLane::HostEnvRun,
        &["curl", SECRET],
        Some(tally),
    ));
    rec.damaged.push(DamagedLine {
        line: 9,
        problem: format!("not a complete JSON record ({SECRET})"),
    });
    let mut req = fx.request(&out, &r, &rec);
    req.proposal = Some(format!(
        "I fixed it. The token is {SECRET}.\n## Excluded from the patch\nnothing"
    ));
    let s = export(&req).unwrap();

    for f in ["patch.diff", "report.md", "receipt.json"] {
        let bytes = fs::read(out.join(f)).unwrap();
        assert!(
            !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "{f} carries the secret"
        );
        assert!(
            !bytes
                .windows(b"BEGIN OPENSSH PRIVATE KEY".len())
                .any(|w| w == b"BEGIN OPENSSH PRIVATE KEY"),
            "{f} carries the key"
        );
    }
    let shown: Vec<String> = s
        .excluded
        .iter()
        .map(|e| format!("{} {}", e.path, e.reason))
        .collect();
    let kinds: Vec<String> = s
        .excluded
        .iter()
        .map(|e| {
            serde_json::to_value(&e.reason).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        shown
            .iter()
            .any(|x| x.starts_with("creds-[REDACTED:secret:API_TOKEN].txt name matches")),
        "{shown:?}"
    );
    assert!(shown.iter().any(|x| x.starts_with("config.env content matches redaction rule(s) secret:API_TOKEN")), "{shown:?}");
    assert!(
        shown.iter().any(|x| x
            .contains("keys/id_ed25519 content matches redaction rule(s) builtin:pem-private-key")),
        "{shown:?}"
    );
    assert!(
        shown
            .iter()
            .any(|x| x.starts_with("bin/blob.dat content matches")),
        "{shown:?}"
    );
    assert!(
        shown
            .iter()
            .any(|x| x.starts_with("secret_link content matches")),
        "{shown:?}"
    );
    assert_eq!(kinds.len(), 5, "{shown:?}");

    let report = fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("[REDACTED:secret:API_TOKEN]"));
    assert!(report.contains("Box-claimed: the agent's own account"));
    assert!(
        report.contains("    ## Excluded from the patch"),
        "the proposal is an indented block"
    );
    assert!(report.contains("refused 2 time(s), in run(s) #3"));
    assert!(report.contains("receipts.jsonl line 9"));
    apply_to_fresh(&fx, &out, "secrets");
}

#[test]
fn report_sections_appear_in_the_manuals_order() {
    let fx = Fixture::new();
    fx.ordinary_changes();
    let out = fx.root.join("review");
    let r = redactor();
    let rec = receipts();
    let mut req = fx.request(&out, &r, &rec);
    req.proposal = Some("Refactored lib.rs.".into());
    export(&req).unwrap();
    let report = fs::read_to_string(out.join("report.md")).unwrap();
    let heads: Vec<&str> = report.lines().filter(|l| l.starts_with("## ")).collect();
    assert_eq!(heads, h5i::export::report::SECTIONS.to_vec(), "{report}");
    let header = &report[..report.find("## ").unwrap()];
    for field in [
        "hostile",
        "workspace",
        fx.base.as_str(),
        "sha256:feed",
        "Exported: ",
    ] {
        assert!(header.contains(field), "header lacks {field}: {header}");
    }
    assert!(
        report.contains("nothing confines or counts"),
        "workspace tier says nothing counted egress"
    );
    assert!(report.contains("No browser observation recorded"));
    assert!(report.contains("#1 `host-env-run` (host-observed)"));
    assert!(report.contains("#2 `tee-shim` (box-claimed)"));
    assert!(report.contains("`cargo test`"));
    assert!(report.contains("    Refactored lib.rs."));
}

#[test]
fn a_non_empty_out_is_refused_without_force_and_replaced_with_it() {
    let fx = Fixture::new();
    fx.ordinary_changes();
    let out = fx.root.join("review");
    write(&out.join("notes.txt"), "mine");
    let r = redactor();
    let rec = receipts();
    let err = export(&fx.request(&out, &r, &rec)).unwrap_err();
    assert!(
        matches!(
            err,
            ExportError::Bundle(h5i::export::BundleError::Exists { .. })
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("refusing: ") && msg.contains("; to fix: ") && msg.contains("--force"),
        "{msg}"
    );
    assert_eq!(fs::read_to_string(out.join("notes.txt")).unwrap(), "mine");

    let mut req = fx.request(&out, &r, &rec);
    req.force = true;
    export(&req).unwrap();
    assert!(!out.join("notes.txt").exists());
    assert!(out.join("patch.diff").is_file());
    let names: Vec<String> = fs::read_dir(&fx.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("h5i-export"))
        .collect();
    assert!(names.is_empty(), "leftovers: {names:?}");

    // An empty directory is simply filled.
    let empty = fx.root.join("empty");
    fs::create_dir(&empty).unwrap();
    export(&fx.request(&empty, &r, &rec)).unwrap();
    assert!(empty.join("receipt.json").is_file());
}

#[test]
fn a_failure_between_files_leaves_out_untouched() {
    let fx = Fixture::new();
    fx.ordinary_changes();
    let r = redactor();
    let rec = receipts();
    let mut fail_after_patch = |name: &str| {
        if name == "patch.diff" {
            Err(std::io::Error::other("injected failure"))
        } else {
            Ok(())
        }
    };
    // A new --out never appears.
    let out = fx.root.join("review");
    assert!(export_with_hook(&fx.request(&out, &r, &rec), &mut fail_after_patch).is_err());
    assert!(
        fs::symlink_metadata(&out).is_err(),
        "out exists after a failed export"
    );
    // An existing one, replaced with --force, keeps its old contents.
    write(&out.join("old.txt"), "old");
    let mut req = fx.request(&out, &r, &rec);
    req.force = true;
    assert!(export_with_hook(&req, &mut fail_after_patch).is_err());
    assert_eq!(fs::read_to_string(out.join("old.txt")).unwrap(), "old");
    assert_eq!(fs::read_dir(&out).unwrap().count(), 1);
}

/// Run by `a_kill_mid_export_leaves_nothing_under_the_name` in a child process: exports, and
/// dies (abort, no unwinding, no cleanup) right after the first file is on disk.
#[test]
fn crash_child_helper() {
    let Ok(dir) = std::env::var("H5I_EXPORT_CRASH_DIR") else {
        return;
    };
    let root = PathBuf::from(dir);
    let base = fs::read_to_string(root.join("base")).unwrap();
    let r = redactor();
    let rec = receipts();
    let out = root.join("review");
    let req = ExportRequest {
        box_name: "crash",
        store_git_dir: &root.join("store/.git"),
        base_sha: base.trim(),
        workspace: &root.join("ws"),
        scratch: &root.join("scratch"),
        out: &out,
        force: false,
        caps: ExportCaps::default(),
        redactor: &r,
        receipts: &rec,
        tier: "workspace",
        policy_digest: "sha256:feed",
        proposal: None,
        box_profile: "default",
        tee_shim: false,
        shim_not_agent_shell: None,
        unchecked_secrets: &[],
    };
    let _ = export_with_hook(&req, &mut |name| {
        if name == "patch.diff" {
            std::process::abort();
        }
        Ok(())
    });
    unreachable!("the hook aborts");
}

#[test]
fn a_kill_mid_export_leaves_nothing_under_the_name() {
    let fx = Fixture::new();
    fx.ordinary_changes();
    fs::write(fx.root.join("base"), &fx.base).unwrap();
    let st = Command::new(std::env::current_exe().unwrap())
        .args([
            // Its name in the integration binary (tests/integration.rs).
            "export_gate::crash_child_helper",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("H5I_EXPORT_CRASH_DIR", &fx.root)
        .output()
        .unwrap();
    assert!(!st.status.success(), "the child was meant to die");
    let out = fx.root.join("review");
    assert!(
        fs::symlink_metadata(&out).is_err(),
        "a killed export left {}",
        out.display()
    );
    // At most the hidden sibling is left, and the next export clears it and succeeds.
    let r = redactor();
    let rec = receipts();
    export(&fx.request(&out, &r, &rec)).unwrap();
    let left: Vec<String> = fs::read_dir(&fx.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("h5i-export"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_secret_the_base_carries_into_the_patch_refuses_the_export() {
    let fx = Fixture::new();
    // The base itself holds a key; deleting that file would carry it out in the deletion's
    // hunk, which no exclusion of a new blob can catch: the whole-patch scan must refuse.
    let repo = fx.store.parent().unwrap();
    write(
        &repo.join("notes.txt"),
        "one\n-----BEGIN RSA PRIVATE KEY-----\nthree\n",
    );
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "key"]);
    let base = git(repo, &["rev-parse", "HEAD"]);
    let fx = Fixture { base, ..fx };
    git(&fx.ws, &["read-tree", "-u", "--reset", &fx.base]);
    fx.ordinary_changes();
    fs::remove_file(fx.ws.join("notes.txt")).unwrap();
    let out = fx.root.join("review");
    let r = redactor();
    let rec = receipts();
    let err = export(&fx.request(&out, &r, &rec)).unwrap_err();
    match &err {
        ExportError::SecretInPatch { rules } => {
            assert_eq!(rules, &vec!["builtin:pem-private-key".to_string()])
        }
        other => panic!("{other}"),
    }
    let msg = err.to_string();
    assert!(
        !msg.contains("BEGIN RSA") && msg.contains("; to fix: "),
        "{msg}"
    );
    assert!(fs::symlink_metadata(&out).is_err());

    // Editing the file instead is caught earlier: the new blob carries the key, so it is
    // excluded and the rest of the work still leaves.
    write(
        &fx.ws.join("notes.txt"),
        "one\n-----BEGIN RSA PRIVATE KEY-----\nTHREE\n",
    );
    let s = export(&fx.request(&out, &r, &rec)).unwrap();
    assert_eq!(s.excluded.len(), 1);
    assert_eq!(s.excluded[0].path, "notes.txt");
    apply_to_fresh(&fx, &out, "base-secret");
}

#[test]
fn a_patch_over_the_cap_is_refused_and_nothing_is_written() {
    let fx = Fixture::new();
    fx.ordinary_changes();
    let out = fx.root.join("review");
    let r = redactor();
    let rec = receipts();
    let mut req = fx.request(&out, &r, &rec);
    req.caps.patch = 100;
    let err = export(&req).unwrap_err();
    assert!(matches!(err, ExportError::PatchTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("; to fix: "));
    assert!(fs::symlink_metadata(&out).is_err());
    // A small per-file cap excludes the bigger files instead.
    let mut req = fx.request(&out, &r, &rec);
    req.caps.per_file = 1000;
    let s = export(&req).unwrap();
    let big: Vec<&str> = s.excluded.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        big,
        vec!["bin/logo.png"],
        "only the 3100-byte binary is over 1000 bytes"
    );
    apply_to_fresh(&fx, &out, "percap");
}

#[test]
fn the_scratch_is_removed_and_the_parent_gains_no_objects() {
    let fx = Fixture::new();
    fx.ordinary_changes();
    let count = || {
        let mut n = 0;
        for e in walk(&fx.store.join("objects")) {
            if e.is_file() {
                n += 1;
            }
        }
        n
    };
    let before = count();
    let box_index = fs::read(fx.ws.join(".git/index")).unwrap();
    let out = fx.root.join("review");
    let r = redactor();
    let rec = receipts();
    export(&fx.request(&out, &r, &rec)).unwrap();
    assert_eq!(count(), before, "export wrote into the store");
    assert_eq!(
        scratch_left(&fx.scratch),
        Vec::<String>::new(),
        "scratch left behind"
    );
    // The box's own index is neither read for its stat data nor written.
    assert_eq!(fs::read(fx.ws.join(".git/index")).unwrap(), box_index);
}

/// What a snapshot left in scratch, besides its stat cache (which is meant to stay).
fn scratch_left(scratch: &Path) -> Vec<String> {
    fs::read_dir(scratch)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "stat-cache")
        .collect()
}

#[test]
fn the_stat_cache_never_hides_an_edit_even_with_size_and_mtime_kept() {
    let fx = Fixture::new();
    // Let the checkout's ctimes fall more than a second behind the first snapshot, so its cache
    // entries are trusted by the second.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let out = fx.root.join("review");
    let r = redactor();
    let rec = receipts();
    fx.ordinary_changes();
    export(&fx.request(&out, &r, &rec)).unwrap();
    let cache = fs::read(fx.scratch.join("stat-cache")).unwrap();
    assert!(
        cache
            .windows(b"docs/keep.md".len())
            .any(|w| w == b"docs/keep.md"),
        "the unchanged file is cached"
    );
    // Same size, mtime put back: only the ctime tells.
    let keep = fx.ws.join("docs/keep.md");
    let mtime = fs::metadata(&keep).unwrap().modified().unwrap();
    let secs = mtime.duration_since(std::time::UNIX_EPOCH).unwrap();
    fs::write(&keep, "KEPT AS IT IS\n").unwrap();
    let st = Command::new("touch")
        .arg("-m")
        .arg("-d")
        .arg(format!("@{}.{:09}", secs.as_secs(), secs.subsec_nanos()))
        .arg(&keep)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(fs::metadata(&keep).unwrap().modified().unwrap(), mtime);
    let mut req = fx.request(&out, &r, &rec);
    req.force = true;
    export(&req).unwrap();
    let patch = fs::read_to_string(out.join("patch.diff")).unwrap();
    assert!(
        patch.contains("+KEPT AS IT IS"),
        "the edit was hidden by the cache"
    );
    let fresh = apply_to_fresh(&fx, &out, "statcache");
    assert_eq!(
        fs::read_to_string(fresh.join("docs/keep.md")).unwrap(),
        "KEPT AS IT IS\n"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn the_snapshot_matches_git_add_all() {
    // The staged tree equals what `git add -A` stages in a throwaway copy of the same state.
    let fx = Fixture::new();
    fx.ordinary_changes();
    write(&fx.ws.join(".gitignore"), "*.log\n");
    write(&fx.ws.join("x.log"), "ignored\n");
    symlink("src/lib.rs", fx.ws.join("lnk")).unwrap();
    fs::remove_dir_all(fx.ws.join("assets")).unwrap();
    write(&fx.ws.join("assets"), "now a file\n");
    // Enough paths that they are probed in parallel batches.
    for i in 0..1500 {
        write(
            &fx.ws.join(format!("many/d{}/f{i}.txt", i % 7)),
            format!("file {i}\n"),
        );
    }
    let snap = h5i::snapshot::Snapshot::take(
        &fx.store,
        &fx.ws,
        &fx.scratch,
        &fx.base,
        h5i::snapshot::SnapshotObjects::Scratch,
    )
    .unwrap();
    let ours = snap.write_tree().unwrap();
    let idx = fx.root.join("addall-index");
    fs::create_dir_all(fx.root.join("addall-objects")).unwrap();
    let theirs = || {
        let mut c = git_cmd(&fx.ws);
        c.env("GIT_DIR", &fx.store)
            .env("GIT_WORK_TREE", &fx.ws)
            .env("GIT_INDEX_FILE", &idx)
            .env("GIT_OBJECT_DIRECTORY", fx.root.join("addall-objects"))
            .env("GIT_ALTERNATE_OBJECT_DIRECTORIES", fx.store.join("objects"));
        c
    };
    assert!(theirs()
        .args(["read-tree", &fx.base])
        .status()
        .unwrap()
        .success());
    assert!(theirs().args(["add", "-A"]).status().unwrap().success());
    let t = theirs().args(["write-tree"]).output().unwrap();
    assert_eq!(ours, String::from_utf8_lossy(&t.stdout).trim());
    let changes = snap.changes_against(&fx.base).unwrap();
    assert!(changes
        .iter()
        .any(|c| c.path == b"assets/a.txt" && !c.is_present()));
    drop(snap);
    assert_eq!(scratch_left(&fx.scratch), Vec::<String>::new());
}

#[test]
fn box_attributes_cannot_invoke_a_filter_the_host_configured() {
    // The user's own repository defines a clean filter (as git-lfs or git-crypt do). A box that
    // writes `.gitattributes` naming it must not get it run on the host: attributes come from the
    // pinned base.
    let fx = Fixture::new();
    let marker = fx.root.join("filtered");
    let repo = fx.store.parent().unwrap();
    git(
        repo,
        &[
            "config",
            "filter.mark.clean",
            &format!("touch {}; tr a-z A-Z", marker.display()),
        ],
    );
    fx.ordinary_changes();
    write(&fx.ws.join(".gitattributes"), "* filter=mark\n");
    write(&fx.ws.join("lower.txt"), "lower case\n");
    let out = fx.root.join("review");
    let r = redactor();
    let rec = receipts();
    export(&fx.request(&out, &r, &rec)).unwrap();
    assert!(
        !marker.exists(),
        "the host's filter ran for a box-written attribute"
    );
    let patch = fs::read_to_string(out.join("patch.diff")).unwrap();
    assert!(patch.contains("+lower case"), "{patch}");
}

#[test]
fn apply_wiring_nothing_reaches_the_parent_before_publish_and_an_excluded_blob_never() {
    use h5i::export::ExportGate;
    use h5i::snapshot::SnapshotObjects;
    let fx = Fixture::new();
    fx.ordinary_changes();
    write(&fx.ws.join("config.env"), format!("TOKEN={SECRET}\n"));
    let secret_blob = {
        let out = git_cmd(&fx.root)
            .args(["hash-object", "--stdin"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write as _;
                c.stdin
                    .take()
                    .unwrap()
                    .write_all(format!("TOKEN={SECRET}\n").as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let r = redactor();
    let gate = ExportGate::new(&r, ExportCaps::default());
    let snap = gate
        .take(
            &fx.store,
            &fx.ws,
            &fx.scratch,
            &fx.base,
            SnapshotObjects::Scratch,
        )
        .unwrap();
    let gated = gate.check(&snap, &fx.ws, &fx.base).unwrap();
    assert_eq!(gated.excluded.len(), 1, "{:?}", gated.excluded);
    let tree = snap.write_tree().unwrap();
    let commit = String::from_utf8(
        snap.git_objects()
            .args(["commit-tree", &tree, "-p", &fx.base, "-m", "t"])
            .output()
            .unwrap(),
    )
    .unwrap()
    .trim()
    .to_string();
    let repo = fx.store.parent().unwrap();
    let in_parent = |id: &str| {
        git_cmd(repo)
            .args(["cat-file", "-e", id])
            .status()
            .unwrap()
            .success()
    };
    // Until the verb has validated everything, the parent holds none of it.
    assert!(
        !in_parent(&tree),
        "the tree reached the parent before publish"
    );
    assert!(
        !in_parent(&commit),
        "the commit reached the parent before publish"
    );
    snap.publish_objects().unwrap();
    // Published, the commit and its tree are whole in the store: every blob it names is there.
    assert!(in_parent(&commit));
    git(repo, &["ls-tree", "-r", &tree]);
    assert!(git(repo, &["cat-file", "-e", &format!("{tree}:src/new.rs")]).is_empty());
    assert!(
        !in_parent(&secret_blob),
        "the excluded blob was written into the parent"
    );
}
