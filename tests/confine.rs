//! What a box may not make or open at any kernel tier, and the ceilings every box gets,
//! asserted from inside real boxes (issue 12):
//! - no set-id file leaves a box: every way to set S_ISUID/S_ISGID answers EPERM (the chmod
//!   family, open/openat/creat with O_CREAT or O_TMPFILE, mkdir, mknod), `openat2` answers
//!   ENOSYS, plain modes still work, and the workspace holds no set-id file afterwards;
//! - `socket()` of every address family `h5i_policy::families` refuses answers EPERM (vsock
//!   first among them), unless `net.families` grants it;
//! - the protective defaults: `status` lists mem, procs and wall for a default box, a fork
//!   loop stops at the process ceiling, and an allocation past the memory ceiling is
//!   OOM-killed with the receipt saying so.
//!
//! The probe is runtime/tests/support/probe.c (static), so the same binary answers at the
//! process, supervised and container tiers. Runs as root (CI) and, where named, as the
//! unprivileged `h5i-test` user `make setup` creates.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::{stderr, stdout, Repo};
use h5i_policy::families::{FamilyVerdict, ADDRESS_FAMILIES};

const USER: &str = "h5i-test";
const IMAGE: &str = "localhost/h5i-busybox:latest";

/// The set-id attempts the probe makes, each of which must answer EPERM.
const SETID_ATTEMPTS: [&str; 15] = [
    "chmod_6755",
    "chmod_u+s",
    "chmod_g+s",
    "chmod_highbits",
    "fchmod_4755",
    "fchmodat_2755",
    "fchmodat2_6755",
    "open_creat_4755",
    "openat_creat_2755",
    "creat_6755",
    "openat_tmpfile_4755",
    "mkdir_2755",
    "mkdirat_6755",
    "mknod_4755",
    "mknodat_2755",
];
/// What must keep working.
const PLAIN_MODES: [&str; 4] = ["chmod_755", "chmod_1777", "open_creat_644", "mkdir_755"];

fn probe() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| common::static_helper("runtime/tests/support/probe.c", "h5i-confine-probe"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn results(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run(r: &Repo, name: &str, argv: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec!["box", "run", name, "--"];
    args.extend_from_slice(argv);
    r.h5i_env(&args, env)
}

/// Every set-id file under `dir`, as paths relative to it.
fn setid_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = e.path().symlink_metadata().unwrap();
            if meta.permissions().mode() & 0o6000 != 0 {
                found.push(e.path().strip_prefix(dir).unwrap().display().to_string());
            }
            if meta.is_dir() && e.file_name() != ".git" {
                stack.push(e.path());
            }
        }
    }
    found
}

/// The set-id claims on one probe run's output and the workspace it ran in.
fn assert_no_setid_file_was_made(tier: &str, out: &Output, workspace: &Path) {
    let got = results(&stdout(out));
    for k in SETID_ATTEMPTS {
        assert_eq!(
            got.get(k).map(String::as_str),
            Some("EPERM"),
            "{tier}: {k}: {got:?} {}",
            stderr(out)
        );
    }
    assert_eq!(got["openat2"], "ENOSYS", "{tier}: {got:?}");
    for k in PLAIN_MODES {
        assert_eq!(got[k], "OK", "{tier}: {k} must still work: {got:?}");
    }
    assert_eq!(setid_files(workspace), Vec::<String>::new(), "{tier}");
}

/// The family claims on one `probe families` run: every family the table does not allow
/// (nor `granted`) is EPERM for all four socket types, numbers past the table too; `inet`
/// still makes a stream socket.
fn assert_refused_families(tier: &str, out: &Output, granted: &[&str]) {
    let got = results(&stdout(out));
    let eperm = "EPERM,EPERM,EPERM,EPERM";
    for f in ADDRESS_FAMILIES {
        let key = format!("family_{}", f.number);
        let answer = got
            .get(&key)
            .unwrap_or_else(|| panic!("{tier}: no {key}: {}", stderr(out)));
        let allowed = f.verdict == FamilyVerdict::Allowed || granted.contains(&f.name);
        if !allowed {
            assert_eq!(answer, eperm, "{tier}: {} ({})", f.name, f.number);
        } else if f.name == "inet" {
            assert!(answer.starts_with("OK,OK"), "{tier}: inet: {answer}");
        } else if granted.contains(&f.name) {
            assert_ne!(answer, eperm, "{tier}: granted {} still refused", f.name);
        }
    }
    for n in ADDRESS_FAMILIES.len()..64 {
        assert_eq!(got[&format!("family_{n}")], eperm, "{tier}: family {n}");
    }
}

fn boxed(r: &Repo, name: &str, args: &[&str]) -> PathBuf {
    let mut all = vec!["box", "create", name];
    all.extend_from_slice(args);
    r.ok(&all);
    let ws = r.workspace(name);
    common::copy_program(probe(), &ws.join("probe"));
    ws
}

#[test]
fn no_setid_file_can_be_made_at_the_process_tier() {
    let r = Repo::new();
    let ws = boxed(&r, "p", &["--isolation", "process"]);
    let out = run(&r, "p", &["./probe", "setid", "."], &[]);
    assert_no_setid_file_was_made("process", &out, &ws);
    // The shell spellings a person would try, through coreutils.
    let out = run(
        &r,
        "p",
        &[
            "sh",
            "-c",
            "cp /bin/true t; chmod 6755 t; echo chmod=$?; chmod u+s t; echo us=$?; \
             mkdir -m 2755 d; echo mkdir=$?; chmod 755 t; echo plain=$?",
        ],
        &[],
    );
    let got = results(&stdout(&out));
    assert_eq!(got["chmod"], "1", "{got:?}");
    assert_eq!(got["us"], "1", "{got:?}");
    assert_ne!(got["mkdir"], "0", "mkdir -m 2755: {got:?}");
    assert_eq!(got["plain"], "0", "{got:?}");
    assert!(
        stderr(&out).contains("Operation not permitted"),
        "{}",
        stderr(&out)
    );
    assert_eq!(setid_files(&ws), Vec::<String>::new());
}

#[test]
fn no_setid_file_can_be_made_at_the_supervised_tier() {
    if !is_root() {
        h5i_testsupport::skipped!(
            "supervised set-id: the supervised tier's network needs root here"
        );
        return;
    }
    let r = Repo::new();
    let ws = boxed(&r, "s", &["--isolation", "supervised"]);
    let out = run(&r, "s", &["./probe", "setid", "."], &[]);
    assert_no_setid_file_was_made("supervised", &out, &ws);
}

#[test]
fn every_refused_address_family_answers_eperm_at_the_process_tier() {
    let r = Repo::new();
    boxed(&r, "f", &["--isolation", "process"]);
    let out = run(&r, "f", &["./probe", "families"], &[]);
    assert_refused_families("process", &out, &[]);
    let got = results(&stdout(&out));
    assert_eq!(got["family_40"], "EPERM,EPERM,EPERM,EPERM", "vsock");
}

#[test]
fn every_refused_address_family_answers_eperm_at_the_supervised_tier() {
    if !is_root() {
        h5i_testsupport::skipped!(
            "supervised families: the supervised tier's network needs root here"
        );
        return;
    }
    let r = Repo::new();
    boxed(&r, "g", &["--isolation", "supervised"]);
    let out = run(&r, "g", &["./probe", "families"], &[]);
    assert_refused_families("supervised", &out, &[]);
}

#[test]
fn net_families_grants_vsock_and_nothing_else() {
    let r = Repo::new();
    r.write_policy(
        "[profile.v]\nisolation = \"process\"\n[profile.v.net]\nfamilies = [\"vsock\"]\n",
    );
    boxed(&r, "v", &["--profile", "v"]);
    let out = run(&r, "v", &["./probe", "families"], &[]);
    assert_refused_families("process+vsock", &out, &["vsock"]);
    let caps: serde_json::Value =
        serde_json::from_str(&stdout(&r.h5i(&["box", "capabilities", "v", "--json"]))).unwrap();
    assert_eq!(
        caps["net"]["families"]["granted"],
        serde_json::json!(["vsock"])
    );
    let refused = caps["net"]["families"]["refused"].as_array().unwrap();
    assert!(refused.iter().all(|f| f["family"] != "vsock"), "{caps}");
    assert!(refused.iter().any(|f| f["family"] == "alg"), "{caps}");
}

#[test]
fn status_and_capabilities_list_the_protective_defaults_and_the_refusals() {
    let r = Repo::new();
    r.ok(&["box", "create", "d", "--isolation", "process"]);
    let status = r.ok(&["box", "status", "d"]);
    let line = |k: &str| {
        status
            .lines()
            .find(|l| l.trim_start().starts_with(k))
            .unwrap_or_else(|| panic!("no {k} line: {status}"))
            .to_owned()
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    let half_mib = (kib * 1024 / 2).max(1 << 30) >> 20;
    assert_eq!(
        line("mem").split_whitespace().nth(1).unwrap(),
        half_mib.to_string(),
        "{status}"
    );
    assert!(line("procs").contains("4096"), "{status}");
    assert!(line("wall").contains("86400s"), "{status}");
    assert!(!line("set-id files").contains('*'), "{status}");
    assert!(line("families").contains("inet,inet6,netlink"), "{status}");
    assert!(line("disk").ends_with('*'), "{status}");
    assert!(
        status.contains("* disk: no per-box disk ceiling"),
        "{status}"
    );
    let caps: serde_json::Value =
        serde_json::from_str(&stdout(&r.h5i(&["box", "capabilities", "d", "--json"]))).unwrap();
    let refused: Vec<&str> = caps["net"]["families"]["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["family"].as_str().unwrap())
        .collect();
    for f in ["vsock", "bluetooth", "can", "alg", "tipc", "packet", "unix"] {
        assert!(refused.contains(&f), "{f} not listed as refused: {caps}");
    }
}

#[test]
fn a_fork_loop_stops_at_the_default_process_ceiling() {
    let r = Repo::new();
    boxed(&r, "fork", &["--isolation", "process"]);
    let out = run(&r, "fork", &["./probe", "forkloop", "6000"], &[]);
    let got = results(&stdout(&out));
    let forked: u64 = got
        .get("forked")
        .unwrap_or_else(|| panic!("{}", stderr(&out)))
        .parse()
        .unwrap();
    assert_eq!(got["fork"], "EAGAIN", "{got:?}");
    assert!(forked < 4096, "{forked} children past a 4096-task ceiling");
    assert!(forked > 100, "the ceiling is generous: {forked}");
}

#[test]
fn an_allocation_past_the_memory_ceiling_is_oom_killed_and_the_receipt_says_so() {
    let r = Repo::new();
    r.write_policy("[profile.m]\nisolation = \"process\"\n[profile.m.resources]\nmem = \"96M\"\n");
    r.ok(&["box", "create", "oom", "--profile", "m"]);
    let out = run(
        &r,
        "oom",
        &["python3", "-c", "x = b'a' * (400 << 20); print(len(x))"],
        &[],
    );
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    let rec = r
        .receipts("oom")
        .into_iter()
        .rev()
        .find(|rec| rec["lane"] == "host-env-run")
        .unwrap();
    assert_eq!(rec["exit"]["oom_killed"], true, "{rec}");
    assert_eq!(rec["oom"]["limit_bytes"], 96 << 20, "{rec}");
}

/// Root's container tier: h5i runs rootless Podman as the test user with h5i-runc as its
/// OCI runtime, so the same seccomp list holds.
#[test]
fn the_container_tier_refuses_setid_files_and_unscoped_families() {
    if !is_root() {
        h5i_testsupport::skipped!("container tier: h5i runs rootless Podman as {USER} for root");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/make-test-image.sh");
    let made = Command::new("bash")
        .arg(script)
        .arg("--user")
        .env("H5I_TEST_USER", USER)
        .output()
        .unwrap();
    assert!(made.status.success(), "test image: {}", stderr(&made));
    let r = Repo::new();
    r.write_policy(&format!(
        "[profile.c]\nisolation = \"container\"\n[profile.c.container]\nimage = \"{IMAGE}\"\n"
    ));
    let env = [("H5I_CONTAINER_USER", USER), ("H5I_NO_PROBE_CACHE", "1")];
    let out = r.h5i_env(&["box", "create", "c", "--profile", "c"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ws = r.workspace("c");
    common::copy_program(probe(), &ws.join("probe"));
    // The engine user must be able to write the workspace's new files' directory.
    let out = run(&r, "c", &["./probe", "setid", "."], &env);
    assert_no_setid_file_was_made("container", &out, &ws);
    let out = run(&r, "c", &["./probe", "families"], &env);
    assert_refused_families("container", &out, &[]);
}

/// The unprivileged caller: the same refusals at the process tier, and at the supervised tier
/// (which `make setup` prepares for h5i-test).
#[test]
fn an_unprivileged_user_gets_the_same_refusals() {
    if !is_root() {
        h5i_testsupport::skipped!("unprivileged refusals: needs root to switch to {USER}");
        return;
    }
    let (dir, _) = common::unprivileged_tree(USER, &[(probe(), "probe")]);
    let repo = dir.path().join("repo");
    let bin = dir.path().join("bin");
    let script = format!(
        r#"set -e
        cd {repo}
        git init -q -b main .
        echo hi > f
        git add f
        git -c user.name=u -c user.email=u@x commit -qm i
        {h5i} box create u --isolation process >/dev/null
        {h5i} box create s --isolation supervised >/dev/null
        for b in u s; do cp ../probe .git/.h5i/env/none/$b/workspace/probe; done
        {h5i} box run u -- ./probe setid . | sed 's/^/u_/'
        {h5i} box run u -- ./probe families | sed 's/^/u_/'
        {h5i} box run s -- ./probe setid . | sed 's/^/s_/'
        {h5i} box run s -- ./probe families | sed 's/^/s_/'
        "#,
        repo = repo.display(),
        h5i = bin.join("h5i").display(),
    );
    let out = common::as_user(USER, Some("/tmp"))
        .args(["bash", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    for (prefix, tier, name) in [("u_", "process", "u"), ("s_", "supervised", "s")] {
        let text: String = stdout(&out)
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(|l| format!("{l}\n"))
            .collect();
        let ws = repo.join(format!(".git/.h5i/env/none/{name}/workspace"));
        let fake = Command::new("true").output().unwrap();
        let only = Output {
            stdout: text.into_bytes(),
            ..fake
        };
        assert_no_setid_file_was_made(&format!("{tier} as {USER}"), &only, &ws);
        assert_refused_families(&format!("{tier} as {USER}"), &only, &[]);
    }
}
