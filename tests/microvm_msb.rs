//! The microvm tier's msb backend, contract-tested against a recording fake `msb` on PATH (the
//! real one cannot run on this kind of host): the argv h5i hands msb (volumes, limits, default
//! deny plus one address rule per pinned destination, the environment file), the secret staged
//! in a 0600 file and never in argv, the file removed after the run, the exit code passed
//! through, `status` saying there is no per-request egress tally, `probe` naming which
//! requirement is missing, and an auth grant refused at this tier.
//!
//! Run as root (CI): box creation looks the image up in the container engine user's storage,
//! as at the container tier. Every destination is pinned through `H5I_TEST_HOSTS` to a
//! 198.18.0.0/15 address; nothing is dialled (the fake only records).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{stderr, stdout, Repo};

const IMAGE: &str = "localhost/h5i-busybox:latest";
const USER: &str = "h5i-test";

/// A fake `msb` that answers `--version` and `image ls` and records each `run`: its argv (one
/// word per line), the environment file it was named (content and mode), then exits with
/// `$FAKE_MSB_EXIT`.
const FAKE_MSB: &str = r#"#!/bin/sh
log="$FAKE_MSB_LOG"
case "$1" in
--version) echo "msb ${FAKE_MSB_VERSION:-0.6.3}"; exit 0 ;;
image) [ "$2" = ls ] && echo "${FAKE_MSB_IMAGES:-}"; exit 0 ;;
run)
    : >"$log/argv"
    for a in "$@"; do printf '%s\n' "$a" >>"$log/argv"; done
    prev=""
    for a in "$@"; do
        if [ "$prev" = --env-file ]; then
            cat "$a" >"$log/env"
            stat -c %a "$a" >"$log/env-mode"
            printf '%s\n' "$a" >"$log/env-path"
        fi
        prev="$a"
    done
    echo "fake msb ran"
    exit "${FAKE_MSB_EXIT:-0}" ;;
esac
exit 2
"#;

struct Fake {
    bin: tempfile::TempDir,
    log: tempfile::TempDir,
}

impl Fake {
    fn new() -> Fake {
        let bin = tempfile::tempdir().unwrap();
        let msb = bin.path().join("msb");
        std::fs::write(&msb, FAKE_MSB).unwrap();
        std::fs::set_permissions(&msb, std::fs::Permissions::from_mode(0o755)).unwrap();
        Fake {
            bin,
            log: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> String {
        format!(
            "{}:{}",
            self.bin.path().display(),
            std::env::var("PATH").unwrap()
        )
    }

    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.log.path().join(name)).unwrap_or_default()
    }
}

fn h5i(r: &Repo, fake: &Fake, args: &[&str], env: &[(&str, &str)]) -> Output {
    let path = fake.path();
    let log = fake.log.path().display().to_string();
    let mut all = vec![
        ("H5I_CONTAINER_USER", USER),
        ("H5I_NO_PROBE_CACHE", "1"),
        ("PATH", path.as_str()),
        ("FAKE_MSB_LOG", log.as_str()),
    ];
    all.extend_from_slice(env);
    r.h5i_env(args, &all)
}

fn ready(test: &str) -> bool {
    if !common::require_root(test, &format!("the image is in {USER}'s rootless storage")) {
        return false;
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        h5i_testsupport::skipped!(
            "{test}: /dev/kvm cannot be opened here (msb's second requirement)"
        );
        return false;
    }
    common::caller::container_image();
    true
}

#[test]
fn msb_gets_volumes_limits_address_rules_and_a_secret_file_never_argv() {
    if !ready("msb_gets_volumes_limits_address_rules_and_a_secret_file_never_argv") {
        return;
    }
    let fake = Fake::new();
    let r = Repo::new();
    r.write_policy(
        "[profile.m]\nisolation = \"microvm\"\nsecrets = [\"DEPLOY_KEY\"]\n\n\
         [profile.m.net]\nmode = \"deny\"\negress = [\"api.example.com:443\"]\n\n\
         [profile.m.resources]\nmem = \"256M\"\nprocs = 100\n",
    );
    let images = [("FAKE_MSB_IMAGES", IMAGE)];
    let out = h5i(
        &r,
        &fake,
        &["box", "create", "m", "--profile", "m", "--image", IMAGE],
        &images,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let secret = "s3cr3t-deploy-value";
    let out = h5i(
        &r,
        &fake,
        &["box", "run", "m", "--", "sh", "-c", "echo hi"],
        &[
            ("FAKE_MSB_IMAGES", IMAGE),
            ("FAKE_MSB_EXIT", "5"),
            ("H5I_SECRET_DEPLOY_KEY", secret),
            ("H5I_TEST_HOSTS", "api.example.com=198.18.0.7:443"),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(5),
        "the exit passes through: {}",
        stderr(&out)
    );
    assert!(stdout(&out).contains("fake msb ran"));

    let argv: Vec<String> = fake.file("argv").lines().map(str::to_owned).collect();
    let ws = r.workspace("m").display().to_string();
    let spool = r.box_dir("m").join("spool").display().to_string();
    let at = |w: &str| {
        argv.iter()
            .position(|a| a == w)
            .unwrap_or_else(|| panic!("{w} not in {argv:?}"))
    };
    assert_eq!(argv[0], "run");
    assert_eq!(argv[at("--name") + 1], "h5i-m");
    assert!(argv.contains(&format!("{ws}:/work")), "{argv:?}");
    assert!(argv.contains(&format!("{spool}:/.h5i/spool")), "{argv:?}");
    assert_eq!(argv[at("--memory") + 1], "256M");
    assert_eq!(argv[at("--max-procs") + 1], "100");
    assert_eq!(argv[at("--net-default") + 1], "deny");
    let allows: Vec<&String> = argv
        .windows(2)
        .filter(|w| w[0] == "--net-allow")
        .map(|w| &w[1])
        .collect();
    assert_eq!(
        allows,
        [&"198.18.0.7:443".to_string()],
        "one rule per pinned address"
    );
    let dash = at("--");
    assert_eq!(argv[dash - 1], IMAGE);
    assert_eq!(&argv[dash + 1..], ["sh", "-c", "echo hi"]);

    // The secret travels in the 0600 file only, which is gone after the run.
    assert!(
        !fake.file("argv").contains(secret),
        "a secret reached msb's argv"
    );
    assert!(fake
        .file("env")
        .lines()
        .any(|l| l == format!("DEPLOY_KEY={secret}")));
    assert!(fake.file("env").contains("H5I_ENV_ID=m"));
    assert_eq!(fake.file("env-mode").trim(), "600");
    let staged = PathBuf::from(fake.file("env-path").trim());
    assert!(!staged.exists(), "the environment file outlived the run");
    // Neither the receipts nor the box log hold the value.
    assert!(common::files_containing(&r.box_dir("m"), secret.as_bytes()).is_empty());

    let status = stdout(&h5i(&r, &fake, &["box", "status", "m"], &images));
    assert!(status.contains("microvm backend: msb"), "{status}");
    assert!(status.contains("no per-request egress tally"), "{status}");
    let _ = h5i(&r, &fake, &["box", "rm", "--force", "m"], &[]);
}

#[test]
fn probe_names_which_msb_requirement_is_missing() {
    if !ready("probe_names_which_msb_requirement_is_missing") {
        return;
    }
    let fake = Fake::new();
    let r = Repo::new();
    let line = |env: &[(&str, &str)], path: Option<&str>| {
        let mut all = env.to_vec();
        if let Some(p) = path {
            all.push(("PATH", p));
        }
        let out = h5i(&r, &fake, &["box", "probe"], &all);
        stdout(&out)
            .lines()
            .find(|l| l.contains("microvm msb="))
            .unwrap_or_default()
            .to_owned()
    };
    let old = line(&[("FAKE_MSB_VERSION", "0.5.9")], None);
    assert!(
        old.contains("older than 0.6") && old.contains("to fix:"),
        "{old}"
    );
    let none = line(&[], Some("/usr/bin:/bin"));
    assert!(
        none.contains("msb is not on PATH") && none.contains("to fix:"),
        "{none}"
    );
    let ok = line(&[], None);
    assert!(ok.contains("msb 0.6.3"), "{ok}");
}

#[test]
fn an_auth_grant_is_refused_at_the_microvm_tier_with_the_reason() {
    if !ready("an_auth_grant_is_refused_at_the_microvm_tier_with_the_reason") {
        return;
    }
    let fake = Fake::new();
    let r = Repo::new();
    r.write_policy(
        "[profile.a]\nisolation = \"microvm\"\n\n[profile.a.net]\nmode = \"deny\"\negress = [\"api.github.com:443\"]\n\n\
         [[profile.a.auth]]\nhost = \"api.github.com\"\ncredential_env = \"GITHUB_TOKEN\"\nbase_url_var = \"GH_HOST\"\ntoken_var = \"GH_TOKEN\"\n",
    );
    let out = h5i(
        &r,
        &fake,
        &["box", "create", "a", "--profile", "a", "--image", IMAGE],
        &[("FAKE_MSB_IMAGES", IMAGE)],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("microVM") && err.contains("to fix:"), "{err}");
    assert!(
        !Path::new(&r.h5i_dir().join("env/none/a")).exists(),
        "a refused create left a box"
    );
    assert!(fake.file("argv").is_empty(), "msb ran for a refused box");
}
