//! Warm dependency caches (`h5i box cache`), asserted with a real npm project against a static
//! registry stand-in this test serves from its own network namespace (HOST.md network rules):
//! a cold install in a box fetches, a warm one with the cache mounted makes no request at all
//! (the stand-in's log and the receipt's egress tally agree), a changed lockfile makes the cache
//! stale and unmounted, refresh without a registry profile refuses with the profile text, and
//! a box cannot write the cache (EROFS from inside).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::testnet::TestHosts;
use common::{stderr, stdout, Repo};

const PORT: u16 = 8080;

/// The static registry's packages and the project locked against it (bench/npm_fixture.py,
/// shared with the bench row), resolved URLs on `registry.test`.
pub fn npm_fixture(reg: &Path, project: &Path, count: usize, bytes: usize) {
    let st = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/npm_fixture.py"))
        .arg(reg)
        .arg(project)
        .arg(count.to_string())
        .arg(bytes.to_string())
        .arg(format!("http://registry.test:{PORT}"))
        .status()
        .unwrap();
    assert!(st.success());
}

/// The static registry: `python3 -m http.server` on the first test host, in the test's netns.
pub struct Registry {
    pub hosts: TestHosts,
    server: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
    pub root: PathBuf,
}

impl Registry {
    pub fn up(test: &str) -> Option<Registry> {
        let hosts = TestHosts::up(test, &[], &[])?;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("registry");
        std::fs::create_dir(&root).unwrap();
        let log = dir.path().join("requests.log");
        let mut server = Command::new("ip")
            .args([
                "netns",
                "exec",
                hosts.ns(),
                "python3",
                "-u",
                "-m",
                "http.server",
            ])
            .arg(PORT.to_string())
            .args(["--bind", &hosts.first.to_string(), "--directory"])
            .arg(&root)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(server.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("Serving HTTP"), "registry: {line}");
        Some(Registry {
            hosts,
            server,
            log,
            _dir: dir,
            root,
        })
    }

    /// Every request the stand-in has answered so far.
    pub fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"GET "))
            .map(str::to_string)
            .collect()
    }

    /// `H5I_TEST_HOSTS` pinning `registry.test` to the stand-in.
    pub fn pin(&self) -> String {
        self.hosts.pin(&[("registry.test", self.hosts.first)])
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// The profiles: `cache-npm` for refresh (egress: the registry only), `dev` for agent boxes
/// (the same egress, so a cold install can work at all).
pub const PROFILES: &str = r#"
[profile.cache-npm]
isolation = "supervised"
[profile.cache-npm.net]
egress = ["registry.test:8080"]

[profile.dev]
isolation = "supervised"
[profile.dev.net]
egress = ["registry.test:8080"]
"#;

/// A repository holding the npm fixture project and the profiles, committed.
pub fn npm_project(reg: &Registry, count: usize, bytes: usize) -> Repo {
    let r = Repo::new();
    npm_fixture(&reg.root, r.path(), count, bytes);
    r.write_policy(PROFILES);
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", "npm project"]);
    r
}

fn with_pin(r: &Repo, pin: &str, args: &[&str]) -> std::process::Output {
    r.h5i_env(args, &[("H5I_TEST_HOSTS", pin)])
}

/// `sh -c SCRIPT` in box `name`.
fn sh(r: &Repo, pin: &str, name: &str, script: &str) -> std::process::Output {
    with_pin(r, pin, &["box", "run", name, "--", "sh", "-c", script])
}

/// Run the box's npm ci; insist it worked and the packages are there.
fn npm_ci(r: &Repo, pin: &str, name: &str) -> serde_json::Value {
    let out = sh(r, pin, name, "npm ci --no-audit --no-fund");
    assert_eq!(
        out.status.code(),
        Some(0),
        "npm ci in {name}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let install = r.last_run(name);
    let out = sh(
        r,
        pin,
        name,
        "node -e \"console.log(require('h5i-fixture-002'))\"",
    );
    assert_eq!(stdout(&out).trim(), "2", "{}", stderr(&out));
    install
}

fn allowed_to_registry(rec: &serde_json::Value) -> u64 {
    rec["egress"]["allowed"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0)
}

#[test]
fn refresh_without_a_registry_profile_refuses_with_the_profile_text() {
    let r = Repo::new();
    std::fs::write(r.path().join("package-lock.json"), "{}").unwrap();
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", "lock"]);
    for policy in [
        None,
        Some("[profile.cache-npm]\nisolation = \"supervised\"\n"),
    ] {
        if let Some(p) = policy {
            r.write_policy(p);
        }
        let out = r.h5i(&["box", "cache", "refresh", "npm"]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("refusing: refreshing the npm cache needs a profile `cache-npm`"),
            "{err}"
        );
        assert!(
            err.contains("\n[profile.cache-npm]\nisolation = \"supervised\"\n[profile.cache-npm.net]\negress = [\"registry.npmjs.org:443\"]"),
            "the profile is not written out ready to paste: {err}"
        );
        // Refused before any box existed.
        assert!(stdout(&r.h5i(&["box", "ls"])).contains("no boxes"));
    }
    assert!(stderr(&r.h5i(&["box", "cache", "refresh", "maven"]))
        .contains("no cache ecosystem `maven`"));
}

#[test]
fn a_warm_install_makes_no_network_request_and_a_box_cannot_write_the_cache() {
    let Some(reg) = Registry::up("box cache warm install") else {
        return;
    };
    let r = npm_project(&reg, 5, 4096);
    let pin = reg.pin();
    assert!(stdout(&r.h5i(&["box", "cache", "ls"])).contains("no caches"));

    // Cold: a box with no cache fetches every tarball from the registry.
    let out = with_pin(&r, &pin, &["box", "create", "cold", "--profile", "dev"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let cold = npm_ci(&r, &pin, "cold");
    assert!(
        allowed_to_registry(&cold) >= 1,
        "cold install made no allowed connection: {cold}"
    );
    assert_eq!(reg.requests().len(), 5, "{:?}", reg.requests());

    // Refresh: a dedicated box fills the cache, then goes away.
    let out = with_pin(&r, &pin, &["box", "cache", "refresh", "npm"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stderr(&out).contains("h5i: refresh npm: installing in a dedicated supervised box"));
    assert_eq!(reg.requests().len(), 10, "{:?}", reg.requests());
    assert!(
        !stdout(&r.h5i(&["box", "ls"])).contains("cache-npm-refresh"),
        "the refresh box was left behind"
    );
    let ls = stdout(&r.h5i(&["box", "cache", "ls"]));
    assert!(ls.starts_with("npm ") && ls.contains(" current "), "{ls}");

    // Warm: the cache is mounted read-only, the install asks the network for nothing.
    let out = with_pin(&r, &pin, &["box", "create", "warm", "--profile", "dev"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mounts = stdout(&r.h5i(&["box", "cache", "mounts", "warm"]));
    assert!(
        mounts.contains("npm: ") && mounts.contains("mounted read-only at"),
        "{mounts}"
    );
    let warm = npm_ci(&r, &pin, "warm");
    assert_eq!(
        allowed_to_registry(&warm),
        0,
        "warm install reached the network: {warm}"
    );
    assert!(
        warm["egress"]["denied"]
            .as_object()
            .is_none_or(|m| m.is_empty()),
        "warm install tried the network: {warm}"
    );
    assert_eq!(
        reg.requests().len(),
        10,
        "warm install hit the registry: {:?}",
        reg.requests()
    );

    // The box cannot write the cache: not a new file, not an existing index entry.
    let probe = r#"
import errno, os, sys
cache = os.environ["npm_config_cache"]
for path, mode in [(os.path.join(cache, "planted"), "w"), (os.path.join(cache, "_cacache"), None)]:
    try:
        if mode:
            open(path, mode).write("x")
        else:
            for d, _, files in os.walk(path):
                for f in files:
                    open(os.path.join(d, f), "a").write("x")
        print("WROTE", path)
    except OSError as e:
        print(errno.errorcode[e.errno])
"#;
    let out = with_pin(
        &r,
        &pin,
        &["box", "run", "warm", "--", "python3", "-c", probe],
    );
    let got: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(got.len(), 2, "{got:?} {}", stderr(&out));
    for g in &got {
        assert!(
            g == "EROFS" || g == "EACCES",
            "the box wrote the cache: {got:?}"
        );
    }

    // The box sees the cache at its in-box place, never at the host path naming the parent.
    let out = sh(&r, &pin, "warm", "echo $npm_config_cache");
    assert_eq!(stdout(&out).trim(), "/.h5i/cache/npm", "{}", stderr(&out));

    // A changed lockfile in the box: another dependency set, so the cache is stale and not
    // mounted (the variable is not even set).
    let out = sh(&r, &pin, "warm", "echo ' ' >> package-lock.json");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mounts = stdout(&r.h5i(&["box", "cache", "mounts", "warm"]));
    assert!(
        mounts.contains("nothing mounted") && mounts.contains("(stale)"),
        "{mounts}"
    );
    let out = sh(&r, &pin, "warm", "echo ${npm_config_cache:-unset}");
    assert_eq!(stdout(&out).trim(), "unset", "{}", stderr(&out));

    // The same on the host: the working tree's lockfile moved, so `ls` says STALE.
    let lock = r.path().join("package-lock.json");
    let mut text = std::fs::read_to_string(&lock).unwrap();
    text.push(' ');
    std::fs::write(&lock, text).unwrap();
    let ls = stdout(&r.h5i(&["box", "cache", "ls"]));
    assert!(ls.contains(" STALE "), "{ls}");

    let out = r.h5i(&["box", "cache", "rm", "npm"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&r.h5i(&["box", "cache", "ls"])).contains("no caches"));
}
