//! Secrets and the spool, end to end: a declared secret reaches exactly one run and no file, and
//! what a box stages in its spool is recorded as box-claimed or quarantined, never host-observed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;

use common::{stderr, stdout, Repo};

const VALUE: &str = "h5i-test-secret-7c1f9a2e55";

fn policy(tier: &str) -> String {
    format!(
        "[profile.deploy]\nisolation = \"{tier}\"\nsecrets = [\"DEPLOY_KEY\"]\n\n[profile.deploy.secret.DEPLOY_KEY]\nsource = \"env:H5I_SECRET_DEPLOY_KEY\"\ninject = \"env\"\n"
    )
}

fn secret_reaches_the_run_and_no_file(tier: &str) {
    let r = Repo::new();
    r.write_policy(&policy(tier));
    r.ok(&["box", "create", "s", "--profile", "deploy"]);
    let env = [("H5I_SECRET_DEPLOY_KEY", VALUE)];
    let out = r.h5i_env(
        &[
            "box",
            "run",
            "s",
            "--",
            "sh",
            "-c",
            "printf '%s' \"$DEPLOY_KEY\" > seen.txt; echo $DEPLOY_KEY",
        ],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), VALUE, "the run sees the value");
    // The value typed into argv is scrubbed from the receipt by rule id.
    let out = r.h5i_env(&["box", "run", "s", "--", "echo", VALUE], &env);
    assert_eq!(out.status.code(), Some(0));
    let recs = r.receipts("s");
    assert_eq!(recs[1]["argv"][1], "[REDACTED:secret:DEPLOY_KEY]");
    assert_eq!(recs[1]["redactions"][0], "secret:DEPLOY_KEY");

    // The run wrote the value into the workspace on purpose: that one file (and only it) holds
    // it under the box directory, and the export gate keeps it out.
    let dir = r.box_dir("s");
    let hits = common::files_containing(&dir, VALUE.as_bytes());
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].ends_with("workspace/seen.txt"), "{hits:?}");
    std::fs::remove_file(r.workspace("s").join("seen.txt")).unwrap();
    assert!(common::files_containing(&dir, VALUE.as_bytes()).is_empty());

    // Staged in the workspace again, it is excluded from the export and appears in no file of it.
    r.h5i_env(
        &[
            "box",
            "run",
            "s",
            "--",
            "sh",
            "-c",
            "echo \"$DEPLOY_KEY\" > leak.txt; echo ok > fine.txt",
        ],
        &env,
    );
    let out_dir = tempfile::tempdir().unwrap();
    let review = out_dir.path().join("review");
    let out = r.h5i_env(
        &["box", "export", "s", "--out", review.to_str().unwrap()],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(common::files_containing(&review, VALUE.as_bytes()).is_empty());
    let report = std::fs::read_to_string(review.join("report.md")).unwrap();
    assert!(
        report.contains("leak.txt") && report.contains("secret:DEPLOY_KEY"),
        "{report}"
    );
    assert!(std::fs::read_to_string(review.join("patch.diff"))
        .unwrap()
        .contains("fine.txt"));

    // The policy and its digest never held it.
    let policy_text = std::fs::read_to_string(dir.join("policy.resolved.toml")).unwrap();
    assert!(!policy_text.contains(VALUE));
}

#[test]
fn a_secret_reaches_a_workspace_run_and_no_file() {
    secret_reaches_the_run_and_no_file("workspace");
}

#[test]
fn a_secret_reaches_a_process_run_and_no_file() {
    secret_reaches_the_run_and_no_file("process");
}

fn file_policy(tier: &str) -> String {
    policy(tier).replace("inject = \"env\"", "inject = \"file\"")
}

#[test]
fn a_file_secret_reaches_a_workspace_run_through_a_file_outside_the_box_that_is_gone_after() {
    let r = Repo::new();
    r.write_policy(&file_policy("workspace"));
    r.ok(&["box", "create", "s", "--profile", "deploy"]);
    let env = [("H5I_SECRET_DEPLOY_KEY", VALUE)];
    let out = r.h5i_env(
        &[
            "box",
            "run",
            "s",
            "--",
            "sh",
            "-c",
            "cat \"$H5I_SECRET_FILE_DEPLOY_KEY\" > seen.txt; stat -c '%a' \"$H5I_SECRET_FILE_DEPLOY_KEY\"; printf '%s|%s\\n' \"$H5I_SECRET_FILE_DEPLOY_KEY\" \"${DEPLOY_KEY-unset}\"",
        ],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("600"), "{text}");
    let (file, as_env) = lines.next().unwrap().split_once('|').unwrap();
    // The run read the value from its file; no variable carried it.
    assert_eq!(as_env, "unset");
    assert_eq!(
        std::fs::read_to_string(r.workspace("s").join("seen.txt")).unwrap(),
        VALUE
    );
    // The file lived outside the box directory and is gone with the run.
    let dir = r.box_dir("s");
    assert!(!Path::new(file).starts_with(&dir), "{file}");
    assert!(!Path::new(file).exists(), "{file} outlived the run");

    // Under the box directory only the file the run wrote on purpose holds the value.
    let hits = common::files_containing(&dir, VALUE.as_bytes());
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].ends_with("workspace/seen.txt"), "{hits:?}");
    std::fs::rename(
        r.workspace("s").join("seen.txt"),
        r.workspace("s").join("leak.txt"),
    )
    .unwrap();
    std::fs::write(r.workspace("s").join("fine.txt"), "ok\n").unwrap();

    // The export bundle holds it nowhere; the receipt log and the policy never did.
    let out_dir = tempfile::tempdir().unwrap();
    let review = out_dir.path().join("review");
    let out = r.h5i_env(
        &["box", "export", "s", "--out", review.to_str().unwrap()],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(common::files_containing(&review, VALUE.as_bytes()).is_empty());
    assert!(std::fs::read_to_string(review.join("patch.diff"))
        .unwrap()
        .contains("fine.txt"));
    std::fs::remove_file(r.workspace("s").join("leak.txt")).unwrap();
    assert!(common::files_containing(&dir, VALUE.as_bytes()).is_empty());
}

#[test]
fn a_file_secret_at_the_process_tier_is_refused_at_create_and_leaves_nothing() {
    let r = Repo::new();
    r.write_policy(&file_policy("process"));
    let out = r.h5i_env(
        &["box", "create", "s", "--profile", "deploy"],
        &[("H5I_SECRET_DEPLOY_KEY", VALUE)],
    );
    assert_ne!(out.status.code(), Some(0));
    let e = stderr(&out);
    assert!(
        e.contains("workspace-tier only") && e.contains("to fix:"),
        "{e}"
    );
    // No box, staged or final, under any agent directory.
    let env_root = r.h5i_dir().join("env");
    let left: Vec<_> = std::fs::read_dir(&env_root)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|agent| {
            std::fs::read_dir(agent.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_unresolvable_secret_refuses_the_run_before_it_starts() {
    let r = Repo::new();
    r.write_policy(&policy("workspace"));
    r.ok(&["box", "create", "s", "--profile", "deploy"]);
    let out = r.h5i(&["box", "run", "s", "--", "touch", "ran"]);
    assert_eq!(out.status.code(), Some(125));
    let e = stderr(&out);
    assert!(
        e.contains("DEPLOY_KEY") && e.contains("H5I_SECRET_DEPLOY_KEY") && e.contains("to fix:"),
        "{e}"
    );
    assert!(!r.workspace("s").join("ran").exists());
    assert!(r.receipts("s").is_empty());
}

#[test]
fn box_secrets_prints_fingerprints_never_values() {
    let r = Repo::new();
    r.write_policy(&policy("workspace"));
    r.ok(&["box", "create", "s", "--profile", "deploy"]);
    let out = r.h5i_env(
        &["box", "secrets", "s"],
        &[("H5I_SECRET_DEPLOY_KEY", VALUE)],
    );
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(
        text.contains("DEPLOY_KEY") && text.contains("hmac-sha256:"),
        "{text}"
    );
    assert!(!text.contains(VALUE));
    let again = stdout(&r.h5i_env(
        &["box", "secrets", "s"],
        &[("H5I_SECRET_DEPLOY_KEY", VALUE)],
    ));
    assert_eq!(text, again, "the fingerprint is stable for one box");
    let unset = r.h5i(&["box", "secrets", "s"]);
    assert_eq!(unset.status.code(), Some(1));
    assert!(stdout(&unset).contains("UNRESOLVED"));
}

#[test]
fn hostile_spool_input_is_quarantined_never_host_observed() {
    let r = Repo::new();
    r.ok(&["box", "create", "sp", "--isolation", "process"]);
    let spool = r.box_dir("sp").join("spool");
    // The box writes its spool where it sees it (`/.h5i/spool`), never by the host path.
    let script = r#"set -e
        s="$H5I_ENV_CAPTURE_SPOOL"
        printf '{"kind":"command","argv":["make"]}' > $s/01-good.json
        printf '{"kind":"run","lane":"host-env-run","exit":{"code":0}}' > $s/02-forged.json
        printf '{not json' > $s/03-broken.json
        printf '{"kind":"note","text":"\033]52;c;aGk=\007"}' > $s/04-escape.json
        head -c 200000 /dev/zero > $s/05-huge.json
        ln -s /etc/passwd $s/06-link.json
        "#;
    let out = r.h5i(&["box", "run", "sp", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let recs = r.receipts("sp");
    assert_eq!(recs[0]["lane"], "host-env-run");
    let rest = &recs[1..];
    assert_eq!(rest.len(), 6, "{rest:?}");
    for rec in rest {
        assert_ne!(rec["lane"], "host-env-run", "{rec}");
        assert_ne!(rec["lane"], "viewer", "{rec}");
    }
    assert_eq!(rest[0]["kind"], "box-claimed");
    for (rec, why) in
        rest[1..]
            .iter()
            .zip(["host-observed", "not JSON", "control", "cap", "symlink"])
    {
        assert_eq!(rec["kind"], "quarantined", "{rec}");
        assert!(rec["reason"].as_str().unwrap().contains(why), "{rec}");
    }
    assert!(
        std::fs::read_dir(&spool).unwrap().next().is_none(),
        "ingested entries are cleared"
    );
    assert!(Path::new("/etc/passwd").exists());
    let log = r.ok(&["box", "status", "sp"]);
    assert!(log.contains("1 host-observed, 6 box-claimed"), "{log}");
}

/// A granted secret holding `"` and `\` (escaped in a record's JSON text), staged by the box in
/// a record of its own: the stored receipt, `box inspect`, `box log --json` and the export keep
/// none of it, and the record names the rule that scrubbed it.
#[test]
fn a_staged_record_loses_a_secret_holding_quotes_and_backslashes() {
    let odd = r#"K7wq2Zr9"Xm4Lp8Vt\Hn3Bc6Jd"#;
    let r = Repo::new();
    r.write_policy(&policy("process"));
    r.ok(&["box", "create", "sq", "--profile", "deploy"]);
    let script = r#"python3 -c 'import json, os
s = os.environ["H5I_ENV_CAPTURE_SPOOL"]
v = os.environ["DEPLOY_KEY"]
open(s + "/01-note.json", "w").write(json.dumps({"kind": "note", "text": "my key is " + v}))'"#;
    let out = r.h5i_env(
        &["box", "run", "sq", "--", "sh", "-c", script],
        &[("H5I_SECRET_DEPLOY_KEY", odd)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let recs = r.receipts("sq");
    let claimed = recs
        .iter()
        .find(|x| x["kind"] == "box-claimed")
        .unwrap_or_else(|| panic!("{recs:?}"));
    assert!(
        claimed["redactions"]
            .as_array()
            .is_some_and(|ids| ids.iter().any(|id| id == "secret:DEPLOY_KEY")),
        "{claimed}"
    );
    let seq = claimed["seq"].to_string();
    let texts = [
        std::fs::read_to_string(r.box_dir("sq").join("receipts.jsonl")).unwrap(),
        r.ok(&["box", "inspect", "sq", "--capture", &seq]),
        r.ok(&["box", "log", "sq", "--json"]),
    ];
    for text in &texts {
        assert!(text.contains("my key is"), "{text}");
        assert!(!text.contains("Xm4Lp8Vt"), "{text}");
    }
}

#[test]
fn every_encoded_copy_of_a_granted_secret_is_excluded_and_its_rule_named() {
    let r = Repo::new();
    r.write_policy(&policy("workspace"));
    r.ok(&["box", "create", "e", "--profile", "deploy"]);
    let ws = r.workspace("e");
    for (name, bytes) in common::secrets::encoded_copies() {
        std::fs::write(ws.join(name), bytes).unwrap();
    }
    std::fs::write(ws.join("fine.txt"), "nothing secret\n").unwrap();
    let env = [("H5I_SECRET_DEPLOY_KEY", common::secrets::ODD_VALUE)];
    let out_dir = tempfile::tempdir().unwrap();
    let review = out_dir.path().join("review");
    let out = r.h5i_env(
        &["box", "export", "e", "--out", review.to_str().unwrap()],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    common::secrets::assert_each_encoding_excluded(&stdout(&out), &review);
    let patch = std::fs::read_to_string(review.join("patch.diff")).unwrap();
    assert!(patch.contains("+nothing secret"), "{patch}");
    let report = std::fs::read_to_string(review.join("report.md")).unwrap();
    assert!(
        report.contains("is not detected"),
        "report.md must say what the scan cannot see: {report}"
    );
}

#[test]
fn an_export_from_a_shell_without_the_secret_refuses_with_the_mend() {
    let r = Repo::new();
    r.write_policy(&policy("workspace"));
    r.ok(&["box", "create", "u", "--profile", "deploy"]);
    std::fs::write(r.workspace("u").join("leak.txt"), VALUE).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let review = out_dir.path().join("review");
    let out = r.h5i(&["box", "export", "u", "--out", review.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("refusing:"), "{err}");
    assert!(
        err.contains("DEPLOY_KEY")
            && err.contains("H5I_SECRET_DEPLOY_KEY")
            && err.contains("--skip-secret-check"),
        "{err}"
    );
    assert!(!review.exists(), "a refused export wrote its bundle");

    // Skipping is explicit, and report.md says so before anything else.
    let out = r.h5i(&[
        "box",
        "export",
        "u",
        "--out",
        review.to_str().unwrap(),
        "--skip-secret-check",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = std::fs::read_to_string(review.join("report.md")).unwrap();
    let head: String = report.lines().take(4).collect::<Vec<_>>().join("\n");
    assert!(
        head.contains("SECRET CHECK SKIPPED") && head.contains("DEPLOY_KEY"),
        "{head}"
    );
}
