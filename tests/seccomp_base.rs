//! The default-deny seccomp base (`h5i-v2`, runtime/src/confine/allowlist.rs) from inside real
//! process-tier boxes (issue 20):
//! - a syscall the base leaves out answers ENOSYS inside, where the same probe on the host
//!   (the control, no filter) gets the kernel's real answer; the deny list's own EPERM
//!   survives the layering;
//! - real workloads run under it: git (clone, commit, diff), cargo building a crate offline,
//!   node + npm (pack and install from a local tarball, offline), python3 (threads,
//!   multiprocessing, subprocess, sqlite) and Chromium headless `--dump-dom` of a file:// page.
//!   Each workload's script first checks, with the probe, that the base is in force in that
//!   very box, so a pass cannot come from an unconfined run.
//! - Claude Code and Codex run their scripted sessions under it at every tier, as root and as
//!   the test user, in tests/agent_claude.rs and tests/agent_codex.rs: each session's box then
//!   answers the same probe with ENOSYS (`agent::base_was_in_force`, tests/model/agent.rs).
//!
//! A workload whose tool this host lacks prints `skipped: <reason>` to stderr (loudly) and
//! returns; `make setup` installs Debian's `cargo` and `chromium` (the rustup toolchain under
//! /root is not readable by a box's identity).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use common::{probe, stderr, stdout, Repo};

fn results(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A repository with a process-tier box `name` holding the probe.
fn boxed(name: &str) -> Repo {
    let r = Repo::new();
    r.ok(&["box", "create", name, "--isolation", "process"]);
    common::copy_program(probe(), &r.workspace(name).join("probe"));
    r
}

/// `sh -c SCRIPT` in the box, after checking that the base answers kcmp with ENOSYS there.
fn run_script(r: &Repo, name: &str, script: &str) -> Output {
    let guarded = format!(
        "./probe unlisted | grep -qx kcmp=ENOSYS || {{ echo 'the h5i-v2 base is not in force' >&2; exit 97; }}\n{script}"
    );
    r.h5i(&["box", "run", name, "--", "sh", "-c", &guarded])
}

fn assert_ran(what: &str, out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what} under the h5i-v2 base:\n--- stdout\n{}\n--- stderr\n{}",
        stdout(out),
        stderr(out)
    );
}

fn tool(path: &str, test: &str) -> bool {
    if Path::new(path).exists() {
        return true;
    }
    h5i_testsupport::skipped!(
        "{test}: {path} is not installed on this host (make setup installs it)"
    );
    false
}

#[test]
fn a_syscall_outside_the_base_answers_enosys_inside_and_works_outside() {
    let control = Command::new(probe()).arg("unlisted").output().unwrap();
    let host = results(&stdout(&control));
    // The control proves the kernel answers these calls itself: ENOSYS inside is the filter.
    assert_eq!(host["kcmp"], "OK", "host: {host:?}");
    assert_eq!(host["name_to_handle_at"], "EOVERFLOW", "host: {host:?}");
    let r = boxed("u");
    let out = r.h5i(&["box", "run", "u", "--", "./probe", "unlisted"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let inside = results(&stdout(&out));
    for call in ["kcmp", "name_to_handle_at", "syslog"] {
        assert_eq!(
            inside.get(call).map(String::as_str),
            Some("ENOSYS"),
            "{call}: {inside:?}"
        );
    }
    if cfg!(target_arch = "x86_64") {
        assert_eq!(inside["modify_ldt"], "ENOSYS", "{inside:?}");
    }
    assert_eq!(
        inside["unshare"], "EPERM",
        "the deny list's errno: {inside:?}"
    );
}

#[test]
fn git_clone_commit_and_diff_run_under_the_base() {
    let r = boxed("g");
    let out = run_script(
        &r,
        "g",
        "set -e
         g() { git -c user.name=box -c user.email=box@example.com -c init.defaultBranch=main \"$@\"; }
         g init -q src
         cd src && echo one > f && g add f && g commit -qm one && cd ..
         g clone -q src dst
         cd dst && echo two >> f
         g diff --stat | grep -q '1 file changed'
         g commit -qam two
         echo commits=$(g rev-list --count HEAD)
         g diff HEAD~1 --name-only",
    );
    assert_ran("git", &out);
    assert!(stdout(&out).contains("commits=2\nf\n"), "{}", stdout(&out));
}

#[test]
fn cargo_builds_a_crate_offline_under_the_base() {
    if !tool("/usr/bin/cargo", "cargo under the base") {
        return;
    }
    let r = boxed("c");
    let out = run_script(
        &r,
        "c",
        "set -e
         export CARGO_HOME=$PWD/.cargo-home PATH=/usr/bin:/bin
         cargo new -q --vcs none tiny
         cd tiny
         cargo build -q --offline --release
         ./target/release/tiny",
    );
    assert_ran("cargo", &out);
    assert!(stdout(&out).contains("Hello, world!"), "{}", stdout(&out));
}

#[test]
fn npm_packs_and_installs_offline_and_node_runs_under_the_base() {
    if !tool("/usr/bin/npm", "npm under the base") {
        return;
    }
    let r = boxed("n");
    let out = run_script(
        &r,
        "n",
        r#"set -e
         export npm_config_cache=$PWD/.npm-cache npm_config_update_notifier=false HOME=$PWD
         mkdir lib app
         cd lib
         printf '{"name":"h5i-tiny","version":"1.0.0","main":"index.js"}' > package.json
         echo 'module.exports = (a, b) => a + b;' > index.js
         npm pack --silent >/dev/null
         cd ../app
         printf '{"name":"app","version":"1.0.0","private":true}' > package.json
         npm install --offline --no-audit --no-fund --silent ../lib/h5i-tiny-1.0.0.tgz
         node -e 'const add = require("h5i-tiny"); const cp = require("child_process");
                  console.log("sum=" + add(2, 3)); console.log(cp.execSync("echo child").toString().trim());'"#,
    );
    assert_ran("npm + node", &out);
    assert!(stdout(&out).contains("sum=5\nchild\n"), "{}", stdout(&out));
}

#[test]
fn python_threads_multiprocessing_subprocess_and_sqlite_run_under_the_base() {
    if !tool("/usr/bin/python3", "python3 under the base") {
        return;
    }
    let r = boxed("py");
    let out = run_script(
        &r,
        "py",
        r#"/usr/bin/python3 - <<'EOF'
import concurrent.futures, hashlib, multiprocessing, sqlite3, subprocess, tempfile, threading

def square(n):
    return n * n

with multiprocessing.Pool(2) as pool:
    print("pool", sum(pool.map(square, range(10))))
with concurrent.futures.ThreadPoolExecutor(4) as ex:
    print("threads", sum(ex.map(square, range(10))))
print("sub", subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip())
with tempfile.TemporaryDirectory() as d:
    db = sqlite3.connect(d + "/x.db")
    db.execute("create table t (v)")
    db.executemany("insert into t values (?)", [(i,) for i in range(5)])
    print("sqlite", db.execute("select sum(v) from t").fetchone()[0])
print("sha", hashlib.sha256(b"h5i").hexdigest()[:8])
EOF"#,
    );
    assert_ran("python3", &out);
    let text = stdout(&out);
    for want in ["pool 285", "threads 285", "sub child", "sqlite 10", "sha "] {
        assert!(text.contains(want), "{want}: {text}");
    }
}

#[test]
fn chromium_headless_dumps_a_file_page_under_the_base() {
    if !tool("/usr/bin/chromium", "Chromium under the base") {
        return;
    }
    // Chromium's process singleton is an AF_UNIX socket, which the default net.unix = false
    // refuses (the deny list's rule, not the base's): the policy grants it, as for a browser box.
    let r = Repo::new();
    r.write_policy("[profile.web]\nisolation = \"process\"\n[profile.web.net]\nunix = true\n");
    r.ok(&["box", "create", "ch", "--profile", "web"]);
    common::copy_program(probe(), &r.workspace("ch").join("probe"));
    std::fs::write(
        r.workspace("ch").join("page.html"),
        "<html><body><p id=x>static</p><script>document.getElementById('x').textContent = 'made by script ' + (6 * 7);</script></body></html>",
    )
    .unwrap();
    // --no-sandbox: Chromium's own sandbox needs a user namespace, which the box refuses
    // (clone(CLONE_NEWUSER) is EPERM); the box is the sandbox here.
    let out = run_script(
        &r,
        "ch",
        "export HOME=$PWD
         exec /usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
           --no-first-run --user-data-dir=$PWD/.chromium --dump-dom file://$PWD/page.html",
    );
    assert_ran("chromium", &out);
    assert!(
        stdout(&out).contains("made by script 42"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
}
