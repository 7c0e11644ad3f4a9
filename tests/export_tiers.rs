//! The export gate's two policy rows of issue 13 at every kernel tier (process, supervised,
//! container), as root and as the unprivileged `h5i-test`, the box doing the writing itself:
//!
//! - secrets (finding 5): a box granted `DEPLOY_KEY` writes it into its workspace literally and
//!   in every encoding the gate knows (base64 in three alignments, base64url, hex both cases,
//!   URL-encoding both cases, reversed; made by python3's standard library, independent of
//!   h5i). Exported with the secret resolvable, each copy is excluded with its rule named and
//!   no encoded value is anywhere in the bundle; exported from a shell where
//!   `H5I_SECRET_DEPLOY_KEY` is unset, the export refuses with the mend and writes nothing.
//! - policy (finding 6): a box rewrites its own `.h5i/env.toml` to the workspace tier, the host
//!   network and `fs.write = ["/"]`. Export flags it first in report.md with the digests and
//!   what widens; `box apply` refuses it (the branch unmoved, the widened blob not in the
//!   parent's objects) unless `--allow-policy-change`.
//!
//! As another user than root every test says `skipped:` (switching to h5i-test needs root).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::secrets::{assert_each_encoding_excluded, encoded_copies, ODD_VALUE};
use common::{stderr, stdout, tier_case as case, Caller};

const KEY: (&str, &str) = ("H5I_SECRET_DEPLOY_KEY", ODD_VALUE);

fn secret_policy(tier: &str) -> String {
    format!(
        "[profile.deploy]\nisolation = \"{tier}\"\nsecrets = [\"DEPLOY_KEY\"]\n\n[profile.deploy.secret.DEPLOY_KEY]\nsource = \"env:H5I_SECRET_DEPLOY_KEY\"\ninject = \"env\"\n"
    )
}

/// A review directory the caller can write into.
fn out_dir(c: &Caller) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(d.path(), Some(c.uid()), Some(c.uid())).unwrap();
    d
}

fn encoded_secrets_and_an_unset_variable_at_export(c: &mut Caller, tier: &str) {
    c.write(".h5i/env.toml", secret_policy(tier));
    c.commit_all("a profile granting a secret");
    c.create_at_with("sec", tier, &["--profile", "deploy"]);
    let who = format!("at {tier} as {}", c.who());
    // The box writes every copy itself: the literal from its environment, the encodings given.
    let script = r#"printf %s "$DEPLOY_KEY" > literal.txt
printf 'nothing secret\n' > fine.txt
while [ $# -gt 0 ]; do printf %s "$2" > "$1"; shift 2; done"#;
    let copies: Vec<(String, String)> = encoded_copies()
        .into_iter()
        .map(|(n, b)| (n, String::from_utf8(b).unwrap()))
        .collect();
    let mut args = vec!["box", "run", "sec", "--", "sh", "-c", script, "sh"];
    for (name, text) in &copies {
        args.extend([name.as_str(), text.as_str()]);
    }
    let out = c.h5i_with(&args, &[KEY]);
    assert!(out.status.success(), "box run {who}: {}", stderr(&out));

    let dir = out_dir(c);
    let review = dir.path().join("review");
    let out = c.h5i_with(
        &["box", "export", "sec", "--out", review.to_str().unwrap()],
        &[KEY],
    );
    assert!(out.status.success(), "box export {who}: {}", stderr(&out));
    let printed = stdout(&out);
    assert_each_encoding_excluded(&printed, &review);
    assert!(
        printed
            .lines()
            .any(|l| l.contains("excluded") && l.contains("literal.txt")),
        "the literal copy was not excluded {who}:\n{printed}"
    );
    assert!(
        common::files_containing(&review, ODD_VALUE.as_bytes()).is_empty(),
        "the literal secret is in the bundle {who}"
    );
    let patch = std::fs::read_to_string(review.join("patch.diff")).unwrap();
    assert!(patch.contains("+nothing secret"), "{who}: {patch}");

    // A second terminal, a later CI step: the variable is unset where the export runs.
    let review = dir.path().join("unset");
    let out = c.h5i(&["box", "export", "sec", "--out", review.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{who}: {}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("refusing:")
            && err.contains("DEPLOY_KEY")
            && err.contains("H5I_SECRET_DEPLOY_KEY")
            && err.contains("--skip-secret-check"),
        "{who}: {err}"
    );
    assert!(!review.exists(), "a refused export wrote its bundle {who}");
}

fn a_policy_widening_patch(c: &mut Caller, tier: &str) {
    // A container profile names its image, so the policy before the edit resolves.
    let image = if tier == "container" {
        format!(
            "[profile.dev.container]\nimage = \"{}\"\n",
            common::caller::container_image()
        )
    } else {
        String::new()
    };
    c.write(
        ".h5i/env.toml",
        format!("[profile.dev]\nisolation = \"{tier}\"\n{image}"),
    );
    c.commit_all("policy");
    c.create_at("pol", tier);
    let who = format!("at {tier} as {}", c.who());
    let widened = "[profile.dev]\nisolation = \"workspace\"\n[profile.dev.net]\nmode = \"host\"\n[profile.dev.fs]\nwrite = [\"/\"]\n";
    let out = c.h5i(&[
        "box",
        "run",
        "pol",
        "--",
        "sh",
        "-c",
        "printf %s \"$1\" > .h5i/env.toml",
        "sh",
        widened,
    ]);
    assert!(out.status.success(), "box run {who}: {}", stderr(&out));

    let dir = out_dir(c);
    let review = dir.path().join("review");
    let printed = c.ok(&["box", "export", "pol", "--out", review.to_str().unwrap()]);
    assert!(printed.contains("POLICY CHANGE"), "{who}: {printed}");
    let report = std::fs::read_to_string(review.join("report.md")).unwrap();
    let first = report.split("\n## ").next().unwrap_or_default();
    for needle in [
        "POLICY CHANGE",
        ".h5i/env.toml",
        "profile `dev`: policy digest before sha256:",
        "after sha256:",
        &format!("isolation {tier} -> workspace"),
        "network deny -> host",
        "fs.write + /",
    ] {
        assert!(
            first.contains(needle),
            "`{needle}` not in the first section {who}:\n{first}"
        );
    }

    let git = |args: &str| {
        let out = c.sh(&format!("git {args}")).output().unwrap();
        (out.status.success(), stdout(&out).trim().to_string())
    };
    let (_, head) = git("rev-parse HEAD");
    let out = c.h5i(&["box", "apply", "pol"]);
    assert_eq!(out.status.code(), Some(1), "{who}: {}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("refusing:")
            && err.contains(".h5i/env.toml")
            && err.contains("--allow-policy-change")
            && err.contains("network deny -> host"),
        "{who}: {err}"
    );
    assert_eq!(
        git("rev-parse HEAD").1,
        head,
        "the refused apply moved the branch {who}"
    );
    let blob = c
        .sh("git hash-object --stdin")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(widened.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let blob = stdout(&blob).trim().to_string();
    assert!(
        !git(&format!("cat-file -e {blob}")).0,
        "a refused apply wrote the box's blob into the parent {who}"
    );

    // The merge commit is the caller's: the test user has no identity of its own.
    assert!(git("config user.name u").0 && git("config user.email u@example.invalid").0);
    c.ok(&["box", "apply", "pol", "--allow-policy-change"]);
    assert_eq!(
        git("show HEAD:.h5i/env.toml").1,
        widened.trim_end(),
        "{who}"
    );
}

#[test]
fn encoded_secrets_and_an_unset_secret_variable_at_export_from_a_process_box() {
    case(
        "secrets_process_root",
        "process",
        false,
        encoded_secrets_and_an_unset_variable_at_export,
    );
}

#[test]
fn encoded_secrets_and_an_unset_secret_variable_at_export_from_a_process_box_as_the_test_user() {
    case(
        "secrets_process_user",
        "process",
        true,
        encoded_secrets_and_an_unset_variable_at_export,
    );
}

#[test]
fn encoded_secrets_and_an_unset_secret_variable_at_export_from_a_supervised_box() {
    case(
        "secrets_supervised_root",
        "supervised",
        false,
        encoded_secrets_and_an_unset_variable_at_export,
    );
}

#[test]
fn encoded_secrets_and_an_unset_secret_variable_at_export_from_a_supervised_box_as_the_test_user() {
    case(
        "secrets_supervised_user",
        "supervised",
        true,
        encoded_secrets_and_an_unset_variable_at_export,
    );
}

#[test]
fn encoded_secrets_and_an_unset_secret_variable_at_export_from_a_container_box() {
    case(
        "secrets_container_root",
        "container",
        false,
        encoded_secrets_and_an_unset_variable_at_export,
    );
}

#[test]
fn encoded_secrets_and_an_unset_secret_variable_at_export_from_a_container_box_as_the_test_user() {
    case(
        "secrets_container_user",
        "container",
        true,
        encoded_secrets_and_an_unset_variable_at_export,
    );
}

#[test]
fn a_process_box_widening_its_policy_is_flagged_and_refused_by_apply() {
    case(
        "policy_process_root",
        "process",
        false,
        a_policy_widening_patch,
    );
}

#[test]
fn a_process_box_widening_its_policy_is_flagged_and_refused_by_apply_as_the_test_user() {
    case(
        "policy_process_user",
        "process",
        true,
        a_policy_widening_patch,
    );
}

#[test]
fn a_supervised_box_widening_its_policy_is_flagged_and_refused_by_apply() {
    case(
        "policy_supervised_root",
        "supervised",
        false,
        a_policy_widening_patch,
    );
}

#[test]
fn a_supervised_box_widening_its_policy_is_flagged_and_refused_by_apply_as_the_test_user() {
    case(
        "policy_supervised_user",
        "supervised",
        true,
        a_policy_widening_patch,
    );
}

#[test]
fn a_container_box_widening_its_policy_is_flagged_and_refused_by_apply() {
    case(
        "policy_container_root",
        "container",
        false,
        a_policy_widening_patch,
    );
}

#[test]
fn a_container_box_widening_its_policy_is_flagged_and_refused_by_apply_as_the_test_user() {
    case(
        "policy_container_user",
        "container",
        true,
        a_policy_widening_patch,
    );
}
