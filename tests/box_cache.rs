//! Warm dependency caches (`h5i box cache`), asserted with a real npm, pnpm, Yarn 1, cargo, pip,
//! uv, Poetry and Go project, each against a static registry stand-in this test serves from its own network namespace
//! (HOST.md network rules; the names are `registry.test`), as root and as h5i-test. Each
//! finds the stand-in the way a host names its mirror (NPM_CONFIG_REGISTRY for npm, pnpm and
//! Yarn, CARGO_REGISTRIES_TEST_INDEX, PIP_INDEX_URL, GOPROXY in the caller's environment; uv's
//! as UV_DEFAULT_INDEX, Poetry's as pip's), which `refresh` hands its box:
//! - a cold install in a supervised box fetches (the stand-in's log and the receipt's egress
//!   tally agree); `refresh` fills the cache in a dedicated box it removes;
//! - a warm install with the cache mounted makes no request at all (no allowed and no denied
//!   connection in the tally, nothing in the stand-in's log) at the supervised tier, and works
//!   at the process tier, which has no network (no route to the stand-in, from inside);
//! - a box cannot write the cache (EROFS/EACCES from inside) at the process, supervised and
//!   container tiers;
//! - a changed lockfile makes the cache stale: not mounted, the variable not even set;
//! - refresh without a registry profile refuses with the profile text, before any box exists;
//! - a uv.lock or poetry.lock with a tampered hash or an option smuggled into a package name
//!   fails the refresh, and nothing is stored;
//! - npm's, pnpm's and Yarn's refresh keep the built node_modules, which a box gets overlaid as
//!   its own (its writes in its own upper layer, the cache byte for byte as stored) and the
//!   package manager finds up to date;
//! - a `cache-<eco>` profile granting more than registry egress (host paths, AF_UNIX, another
//!   address family, a host the caller's registry configuration does not name, for every
//!   ecosystem) is refused before any box, and the project's own `.npmrc`, `.yarnrc` or
//!   `.cargo/config.toml` widens nothing;
//! - the progress line shows while a slow stand-in serves, and what the install step prints
//!   reaches the caller escaped, never raw.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use common::caller::{container_image, Caller};
use common::testnet::TestHosts;
use common::{require_root, stderr, stdout};

pub(crate) const PORT: u16 = 8080;

/// One ecosystem as the test drives it.
pub(crate) struct Eco {
    pub(crate) name: &'static str,
    /// bench/<fixture> REGISTRY_DIR PROJECT_DIR ARGS... (`{base}` is the stand-in's URL)
    fixture: &'static [&'static str],
    /// The caller's own registry configuration, naming the stand-in.
    host_env: &'static [(&'static str, &'static str)],
    /// The variable that points the package manager at the cache.
    var: &'static str,
    /// The install in a box.
    install: &'static str,
    /// The install in a box with the cache mounted, when it differs (uv and Poetry install the
    /// locked set from the wheelhouse with pip's interface: their own installers cannot use it).
    warm_install: Option<&'static str>,
    /// A command whose stdout proves the packages are there and usable.
    pub(crate) prove: &'static str,
    /// What `prove` prints.
    pub(crate) proved: &'static str,
    /// The lockfile.
    lockfile: &'static str,
    /// npm, pnpm, Yarn: the variable naming the kept `node_modules` in a box, and what the warm
    /// install prints when it finds that tree (overlaid as the box's `node_modules`) up to date.
    tree: Option<(&'static str, &'static str)>,
}

/// The caller's npm registry setting naming the stand-in, which npm, pnpm and Yarn 1 all read
/// (and `refresh` with them: a `cache-<eco>` profile may grant no other host).
const NODE_HOST_ENV: &[(&str, &str)] = &[("NPM_CONFIG_REGISTRY", "http://registry.test:8080/")];

pub(crate) const NPM: Eco = Eco {
    name: "npm",
    fixture: &["npm_fixture.py", "5", "4096", "{base}"],
    host_env: NODE_HOST_ENV,
    var: "npm_config_cache",
    install: "npm ci --no-audit --no-fund",
    warm_install: None,
    prove: "node -e \"console.log(require('h5i-fixture-002'))\"",
    proved: "2",
    lockfile: "package-lock.json",
    tree: None,
};

/// pnpm's project: the npm fixture's packages locked in pnpm-lock.yaml. The cold box names a
/// store in its own home (with no store setting pnpm looks for one on the project's filesystem).
/// Warm, the box's node_modules is the tree the refresh kept (its `.pnpm` virtual store with
/// it), overlaid, and pnpm finds it up to date, offline.
const PNPM: Eco = Eco {
    name: "pnpm",
    fixture: &["npm_fixture.py", "5", "4096", "{base}", "pnpm"],
    host_env: NODE_HOST_ENV,
    var: "npm_config_store_dir",
    install: "pnpm install --frozen-lockfile --store-dir \"$HOME/.pnpm-store\"",
    warm_install: Some("pnpm install --frozen-lockfile --offline"),
    prove: NPM.prove,
    proved: NPM.proved,
    lockfile: "pnpm-lock.yaml",
    tree: Some(("H5I_PNPM_TREE", "Already up to date")),
};

/// Yarn 1's project: the npm fixture's packages locked in yarn.lock. Warm, the box's
/// node_modules is the tree the refresh kept, overlaid, and yarn finds it up to date, offline
/// (with `--ignore-scripts`, the flag the tree was built with and its `.yarn-integrity` records).
const YARN: Eco = Eco {
    name: "yarn",
    fixture: &["npm_fixture.py", "5", "4096", "{base}", "yarn"],
    host_env: NODE_HOST_ENV,
    var: "YARN_CACHE_FOLDER",
    install: "yarn install --frozen-lockfile --non-interactive",
    warm_install: Some(
        "yarn install --frozen-lockfile --offline --ignore-scripts --non-interactive",
    ),
    prove: NPM.prove,
    proved: NPM.proved,
    lockfile: "yarn.lock",
    tree: Some(("H5I_YARN_TREE", "success Already up-to-date.")),
};

const CARGO: Eco = Eco {
    name: "cargo",
    fixture: &["cargo_fixture.py", "3", "{base}"],
    // The project's own .cargo/config.toml names the registry too, but refresh reads only the
    // caller's configuration.
    host_env: &[(
        "CARGO_REGISTRIES_TEST_INDEX",
        "http://registry.test:8080/index.git",
    )],
    var: "CARGO_HOME",
    install: "cargo fetch --locked",
    warm_install: None,
    // What the build needs must already be where cargo looks (at the process tier there is no
    // network to fetch it from).
    prove: "cargo build --locked -q && ./target/debug/fixture-app",
    proved: "3",
    lockfile: "Cargo.lock",
    tree: None,
};

const PIP: Eco = Eco {
    name: "pip",
    fixture: &["pip_fixture.py", "3", "4096"],
    host_env: &[
        ("PIP_INDEX_URL", "http://registry.test:8080/simple"),
        ("PIP_TRUSTED_HOST", "registry.test"),
    ],
    var: "PIP_FIND_LINKS",
    // The cold box has no cache: it names the index itself (a box's environment is not the
    // caller's). Warm, PIP_NO_INDEX makes pip use the wheelhouse alone.
    install: "python3 -m pip install -q --disable-pip-version-check --target deps \
              --index-url http://registry.test:8080/simple --trusted-host registry.test \
              -r requirements.txt",
    warm_install: None,
    prove: "python3 -c \"import sys; sys.path.insert(0, 'deps'); import h5i_fixture_002 as m; print(m.VALUE)\"",
    proved: "3",
    lockfile: "requirements.txt",
    tree: None,
};

/// Poetry with its virtualenv in the project (`.venv`) and no keyring (a box has no session bus).
macro_rules! poetry {
    ($args:literal) => {
        concat!(
            "POETRY_VIRTUALENVS_IN_PROJECT=true PYTHON_KEYRING_BACKEND=keyring.backends.null.Keyring poetry ",
            $args
        )
    };
}

/// What proves a uv or Poetry install: the project's venv imports a locked package.
const VENV_PROVE: &str = ".venv/bin/python -c \"import h5i_fixture_002 as m; print(m.VALUE)\"";

const UV: Eco = Eco {
    name: "uv",
    fixture: &["pip_fixture.py", "3", "4096", "uv", "{base}"],
    host_env: &[("UV_DEFAULT_INDEX", "http://registry.test:8080/simple")],
    var: "UV_FIND_LINKS",
    // Cold: uv's own installer, from the wheel URLs uv.lock names.
    install: "uv sync --frozen -q",
    warm_install: Some(
        "uv venv -q && uv pip install -q -r \"$UV_FIND_LINKS/h5i-requirements.txt\"",
    ),
    prove: VENV_PROVE,
    proved: "3",
    lockfile: "uv.lock",
    tree: None,
};

const POETRY: Eco = Eco {
    name: "poetry",
    fixture: &["pip_fixture.py", "3", "4096", "poetry", "{base}"],
    host_env: PIP.host_env,
    var: "PIP_FIND_LINKS",
    // Cold: Poetry's own installer, from the source pyproject.toml names.
    install: poetry!("install --no-root -q"),
    warm_install: Some(poetry!(
        "run pip install -q --disable-pip-version-check -r \"$PIP_FIND_LINKS/h5i-requirements.txt\""
    )),
    prove: VENV_PROVE,
    proved: "3",
    lockfile: "poetry.lock",
    tree: None,
};

const GO: Eco = Eco {
    name: "go",
    fixture: &["go_fixture.py", "3"],
    host_env: &[("GOPROXY", "http://registry.test:8080")],
    var: "GOMODCACHE",
    install: "GOPROXY=http://registry.test:8080 go mod download",
    warm_install: None,
    // What the build needs must already be in the module cache (no network at the process
    // tier, and GOPROXY=off besides).
    prove: "GOPROXY=off go build -o app . && ./app",
    proved: "3",
    lockfile: "go.sum",
    tree: None,
};

/// The static registry: `python3 -m http.server` on the first test host, in the test's netns.
pub struct Registry {
    pub hosts: TestHosts,
    server: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
    pub root: PathBuf,
}

/// A static server that waits `DELAY` seconds before answering each request (argv: DELAY
/// ADDR PORT ROOT), logging as `http.server` does.
const SLOW_SERVER: &str = r#"
import functools, http.server, sys, time
delay, addr, port, root = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
class Slow(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        time.sleep(delay)
        super().do_GET()
srv = http.server.ThreadingHTTPServer((addr, port), functools.partial(Slow, directory=root))
print("Serving HTTP (slow)", flush=True)
srv.serve_forever()
"#;

impl Registry {
    pub fn up(test: &str) -> Option<Registry> {
        Registry::serve(test, None)
    }

    /// A stand-in that answers each request `delay` seconds late.
    pub fn up_slow(test: &str, delay: u32) -> Option<Registry> {
        Registry::serve(test, Some(delay))
    }

    fn serve(test: &str, delay: Option<u32>) -> Option<Registry> {
        let hosts = TestHosts::up(test, &[], &[])?;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("registry");
        std::fs::create_dir(&root).unwrap();
        let log = dir.path().join("requests.log");
        let mut server = Command::new("ip");
        server.args(["netns", "exec", hosts.ns(), "python3", "-u"]);
        match delay {
            None => server
                .args(["-m", "http.server", &PORT.to_string()])
                .args(["--bind", &hosts.first.to_string(), "--directory"])
                .arg(&root),
            Some(d) => server
                .args(["-c", SLOW_SERVER, &d.to_string()])
                .args([hosts.first.to_string(), PORT.to_string()])
                .arg(&root),
        };
        let mut server = server
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

/// Root or h5i-test with `registry.test` pinned to the stand-in and `eco`'s registry
/// configuration in the environment.
pub(crate) fn caller(as_user: bool, reg: &Registry, eco: &Eco) -> Caller {
    let mut c = Caller::either(as_user).with_env("H5I_TEST_HOSTS", &reg.pin());
    for (k, v) in eco.host_env {
        c = c.with_env(k, v);
    }
    c
}

/// The profiles: `cache-ECO` for refresh (egress: the registry only), `dev` for agent boxes
/// (the same egress, so a cold install can work at all).
pub(crate) fn profiles(eco: &Eco) -> String {
    format!(
        "[profile.cache-{e}]\nisolation = \"supervised\"\n[profile.cache-{e}.net]\negress = [\"registry.test:{PORT}\"]\n\n\
         [profile.dev]\nisolation = \"supervised\"\n[profile.dev.net]\negress = [\"registry.test:{PORT}\"]\n",
        e = eco.name
    )
}

/// The caller's repository holding `eco`'s fixture project (locked against the stand-in) and
/// the profiles, committed.
pub(crate) fn project(c: &Caller, reg: &Registry, eco: &Eco) {
    project_with(c, reg, eco, &[]);
}

/// [`project`] with `env` set for the fixture script.
fn project_with(c: &Caller, reg: &Registry, eco: &Eco, env: &[(&str, &str)]) {
    let mut args =
        vec![concat!(env!("CARGO_MANIFEST_DIR"), "/bench/").to_string() + eco.fixture[0]];
    args.push(reg.root.display().to_string());
    args.push(c.repo().display().to_string());
    args.extend(
        eco.fixture[1..]
            .iter()
            .map(|s| s.replace("{base}", &format!("http://registry.test:{PORT}"))),
    );
    let st = Command::new("python3")
        .args(&args)
        .envs(env.iter().copied())
        .status()
        .unwrap();
    assert!(st.success(), "{args:?}");
    c.write(".h5i/env.toml", profiles(eco));
    c.commit_all(&format!("{} project", eco.name));
}

/// `h5i box cache refresh ECO`, which must succeed.
pub(crate) fn refresh(c: &Caller, eco: &str) -> std::process::Output {
    let out = c.h5i(&["box", "cache", "refresh", eco]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "refresh {eco} as {}: {}{}",
        c.who(),
        stdout(&out),
        stderr(&out)
    );
    out
}

fn run(c: &Caller, name: &str, script: &str) -> std::process::Output {
    c.h5i(&["box", "run", name, "--", "sh", "-c", script])
}

/// The box's latest host-observed run record.
fn last_run(c: &Caller, name: &str) -> serde_json::Value {
    std::fs::read_to_string(c.box_dir(name).join("receipts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .rfind(|r| r["lane"] == "host-env-run")
        .expect("a host-env-run receipt")
}

/// Install in box `name` with `script`, insist it worked and the packages are usable; the
/// install's receipt and what it printed.
fn install(c: &Caller, eco: &Eco, name: &str, script: &str) -> (serde_json::Value, String) {
    let out = run(c, name, script);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{script} in {name} as {}: {}{}",
        c.who(),
        stdout(&out),
        stderr(&out)
    );
    let receipt = last_run(c, name);
    let said = stdout(&out);
    let out = run(c, name, eco.prove);
    assert_eq!(
        stdout(&out).trim(),
        eco.proved,
        "{} in {name} as {}: {}",
        eco.prove,
        c.who(),
        stderr(&out)
    );
    (receipt, said)
}

pub(crate) fn tally(rec: &serde_json::Value, side: &str) -> u64 {
    rec["egress"][side]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0)
}

/// From inside box `name`: try to plant a file in the cache and to append to every file of
/// it (up to 50); one errno name per attempt.
fn write_attempts(c: &Caller, eco: &Eco, name: &str) -> Vec<String> {
    let probe = format!(
        r#"
import errno, os
cache = os.environ["{var}"]
def attempt(f):
    try:
        f()
        return "WROTE"
    except OSError as e:
        return errno.errorcode[e.errno]
print(attempt(lambda: open(os.path.join(cache, "planted"), "w").write("x")))
n = 0
for d, _, files in os.walk(cache):
    for f in files:
        if n < 50:
            print(attempt(lambda: open(os.path.join(d, f), "a").write("x")))
            n += 1
"#,
        var = eco.var
    );
    let out = c.h5i(&["box", "run", name, "--", "python3", "-c", &probe]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out).lines().map(str::to_string).collect()
}

fn assert_cannot_write(c: &Caller, eco: &Eco, name: &str) {
    let got = write_attempts(c, eco, name);
    assert!(got.len() >= 2, "{name}: nothing to try: {got:?}");
    for g in &got {
        assert!(
            g == "EROFS" || g == "EACCES",
            "box {name} (as {}) wrote the {} cache: {got:?}",
            c.who(),
            eco.name
        );
    }
}

/// From inside box `name`: a TCP connect to the stand-in is refused at once with EHOSTUNREACH
/// (the box's own deny-all table refuses every dial, so whatever it installs comes from the
/// cache).
fn assert_no_route(c: &Caller, reg: &Registry, name: &str) {
    let probe = format!(
        "import errno, socket\ns = socket.socket()\ns.settimeout(10)\ntry:\n    s.connect(('{ip}', {PORT}))\n    print('CONNECTED')\nexcept OSError as e:\n    print(errno.errorcode.get(e.errno, e))\n",
        ip = reg.hosts.first
    );
    let out = c.h5i(&["box", "run", name, "--", "python3", "-c", &probe]);
    assert_eq!(
        stdout(&out).trim(),
        "EHOSTUNREACH",
        "box {name} reached for the registry: {}",
        stderr(&out)
    );
}

/// The whole story for one ecosystem and one caller.
fn cold_refresh_warm_stale(eco: &Eco, as_user: bool) {
    let test = format!(
        "box cache {} as {}",
        eco.name,
        if as_user { "h5i-test" } else { "root" }
    );
    let Some(reg) = Registry::up(&test) else {
        return;
    };
    let c = caller(as_user, &reg, eco);
    project(&c, &reg, eco);
    assert!(c.ok(&["box", "cache", "ls"]).contains("no caches"));

    // Cold: a supervised box with no cache fetches from the registry.
    c.ok(&["box", "create", "cold", "--profile", "dev"]);
    let (cold, _) = install(&c, eco, "cold", eco.install);
    assert!(
        tally(&cold, "allowed") >= 1,
        "cold install made no connection: {cold}"
    );
    let after_cold = reg.requests().len();
    assert!(after_cold >= 1, "the stand-in saw no request");

    // Refresh: a dedicated box fills the cache, then goes away.
    let out = refresh(&c, eco.name);
    assert!(
        stderr(&out).contains(&format!(
            "h5i: refresh {}: installing in a dedicated supervised box",
            eco.name
        )),
        "{}",
        stderr(&out)
    );
    let after_refresh = reg.requests().len();
    assert!(after_refresh > after_cold, "the refresh fetched nothing");
    assert!(
        !c.ok(&["box", "ls"]).contains("refresh"),
        "the refresh box was left behind"
    );
    let ls = c.ok(&["box", "cache", "ls"]);
    assert!(
        ls.starts_with(&format!("{} ", eco.name)) && ls.contains(" current "),
        "{ls}"
    );

    // Warm, supervised: mounted read-only, the install asks the network for nothing.
    c.ok(&["box", "create", "warm", "--profile", "dev"]);
    let mounts = c.ok(&["box", "cache", "mounts", "warm"]);
    assert!(
        mounts.contains(&format!("{}: ", eco.name)) && mounts.contains("mounted read-only at"),
        "{mounts}"
    );
    let warm_install = eco.warm_install.unwrap_or(eco.install);
    let ls: serde_json::Value =
        serde_json::from_str(&c.ok(&["box", "cache", "ls", "--json"])).unwrap();
    let key = ls["caches"][0]["key"].as_str().unwrap().to_string();
    let entry = c.repo().join(".git/.h5i/cache").join(eco.name).join(&key);
    let stored = tree_digest(&entry);
    let (warm, said) = install(&c, eco, "warm", warm_install);
    if let Some((_, up_to_date)) = eco.tree {
        // The kept tree is the box's node_modules: the package manager finds it up to date
        // rather than copying or unpacking a package.
        let named = mounts
            .split('`')
            .nth(1)
            .filter(|_| mounts.contains("` finds it up to date"));
        assert!(
            mounts.contains("and overlaid at /work/node_modules")
                && named.is_some_and(|n| warm_install.starts_with(n)),
            "the install mounts names is not the one run ({warm_install}): {mounts}"
        );
        assert!(
            said.contains(up_to_date),
            "{} did not find the kept tree up to date: {said}",
            eco.name
        );
    }
    assert_eq!(
        tally(&warm, "allowed"),
        0,
        "warm install reached the network: {warm}"
    );
    assert_eq!(
        tally(&warm, "denied"),
        0,
        "warm install tried the network: {warm}"
    );
    assert_eq!(
        reg.requests().len(),
        after_refresh,
        "warm install hit the registry: {:?}",
        reg.requests()
    );
    let out = run(&c, "warm", &format!("echo ${}", eco.var));
    assert_eq!(
        stdout(&out).trim(),
        format!("/.h5i/cache/{}", eco.name),
        "the box sees the cache at its in-box place, never the host path: {}",
        stderr(&out)
    );
    assert_cannot_write(&c, eco, "warm");

    // Warm, process tier: no network at all there, so the install works from the cache alone.
    c.ok(&["box", "create", "warmp", "--isolation", "process"]);
    assert_no_route(&c, &reg, "warmp");
    let (_, said) = install(&c, eco, "warmp", warm_install);
    assert_cannot_write(&c, eco, "warmp");
    assert_eq!(reg.requests().len(), after_refresh);
    if let Some((var, up_to_date)) = eco.tree {
        assert!(said.contains(up_to_date), "warmp: {said}");
        // The kept tree, read-only where the box sees it and beneath its node_modules: a box
        // writes, removes and replaces there in its own upper layer, never in the cache.
        let tree_eco = Eco { var, ..*eco };
        for b in ["warm", "warmp"] {
            assert_cannot_write(&c, &tree_eco, b);
            let out = run(
                &c,
                b,
                "set -e; echo 'module.exports = 0;' > node_modules/h5i-fixture-002/index.js
                 rm -rf node_modules/h5i-fixture-001 && mkdir node_modules/planted
                 node -p \"require('h5i-fixture-002')\"",
            );
            assert_eq!(stdout(&out).trim(), "0", "{b}: {}", stderr(&out));
        }
        assert!(
            c.box_dir("warm")
                .join(format!("{}-tree/{key}/upper/planted", eco.name))
                .is_dir(),
            "the box's write is not in its own upper layer"
        );
    }
    assert_eq!(
        tree_digest(&entry),
        stored,
        "a box changed the {} cache",
        eco.name
    );

    // A changed lockfile in the box: another dependency set, so the cache is stale and not
    // mounted (the variable is not even set).
    let out = run(&c, "warm", &format!("echo ' ' >> {}", eco.lockfile));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mounts = c.ok(&["box", "cache", "mounts", "warm"]);
    assert!(
        mounts.contains("nothing mounted") && mounts.contains("(stale)"),
        "{mounts}"
    );
    let out = run(&c, "warm", &format!("echo ${{{}:-unset}}", eco.var));
    assert_eq!(stdout(&out).trim(), "unset", "{}", stderr(&out));

    // The same on the host: the working tree's lockfile moved, so `ls` says STALE.
    let lock = c.repo().join(eco.lockfile);
    let mut text = std::fs::read_to_string(&lock).unwrap();
    text.push(' ');
    c.write(eco.lockfile, text);
    assert!(c.ok(&["box", "cache", "ls"]).contains(" STALE "));
    c.ok(&["box", "cache", "rm", eco.name]);
    assert!(c.ok(&["box", "cache", "ls"]).contains("no caches"));
    for b in ["cold", "warm", "warmp"] {
        c.ok(&["box", "rm", "--force", b]);
    }
}

/// Two tests per ecosystem, the whole story as root and as h5i-test.
macro_rules! each_caller {
    ($($eco:ident: $as_root:ident, $as_user:ident;)*) => {$(
        #[test]
        fn $as_root() {
            cold_refresh_warm_stale(&$eco, false);
        }

        #[test]
        fn $as_user() {
            cold_refresh_warm_stale(&$eco, true);
        }
    )*};
}

each_caller! {
    NPM: npm_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_root,
        npm_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_h5i_test;
    PNPM: pnpm_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_root,
        pnpm_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_h5i_test;
    YARN: yarn_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_root,
        yarn_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_h5i_test;
    CARGO: cargo_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_root,
        cargo_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_h5i_test;
    PIP: pip_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_root,
        pip_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_h5i_test;
    UV: uv_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_root,
        uv_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_h5i_test;
    POETRY: poetry_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_root,
        poetry_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_h5i_test;
    GO: go_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_root,
        go_cold_install_fetches_warm_install_makes_no_request_and_cannot_write_the_cache_as_h5i_test;
}

/// The container tier mounts the same cache read-only (the test image has no npm: the box
/// reads the cache and cannot write it), and a stale one not at all.
fn container_box_reads_but_cannot_write_the_cache(as_user: bool) {
    let test = format!(
        "box cache at the container tier as {}",
        if as_user { "h5i-test" } else { "root" }
    );
    let Some(reg) = Registry::up(&test) else {
        return;
    };
    let mut c = caller(as_user, &reg, &NPM);
    project(&c, &reg, &NPM);
    refresh(&c, "npm");
    c.create_container("ctr", container_image());
    let mounts = c.ok(&["box", "cache", "mounts", "ctr"]);
    assert!(mounts.contains("mounted read-only at"), "{mounts}");
    let out = run(
        &c,
        "ctr",
        "ls \"$npm_config_cache\" && echo x > \"$npm_config_cache/planted\"; echo rc=$?; \
         f=$(find \"$npm_config_cache\" -type f | head -n 1); [ -n \"$f\" ] && echo x >> \"$f\"; echo rc=$?",
    );
    let text = stdout(&out);
    let err = stderr(&out);
    assert!(
        text.contains("_cacache"),
        "the cache is not readable: {text}{err}"
    );
    assert_eq!(
        text.lines().filter(|l| *l == "rc=1").count(),
        2,
        "the box wrote the cache: {text}{err}"
    );
    // The spec Podman handed the runtime has the cache's bind, read-only, and h5i's check of
    // that spec accepts it as planned.
    let status = c.ok(&["box", "status", "ctr"]);
    assert!(
        status.contains("mount     /.h5i/cache/npm bind")
            && status.contains("matches the policy: yes"),
        "{status}"
    );
    // EROFS (the read-only bind), or EACCES where the permission check comes first (the root
    // caller's cache is root's, the engine user only reads it).
    assert_eq!(
        err.lines()
            .filter(|l| l.ends_with(": Read-only file system") || l.ends_with(": Permission denied"))
            .count(),
        2,
        "not refused by the kernel: {err}"
    );
    // Stale: not mounted, the variable not set.
    let out = run(&c, "ctr", "echo ' ' >> package-lock.json");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(&c, "ctr", "echo ${npm_config_cache:-unset}");
    assert_eq!(stdout(&out).trim(), "unset", "{}", stderr(&out));
    c.ok(&["box", "rm", "--force", "ctr"]);
}

/// The container tier with an image of its own node, npm, pnpm and yarn (`localhost/h5i-base`,
/// made by images/build.sh): a warm offline install (`npm ci --offline`, pnpm's and yarn's
/// `install --frozen-lockfile --offline`) from the read-only cache installs a usable tree and
/// makes no request (none in the receipt's tally though the registry is in the box's egress,
/// none at the stand-in), the box cannot write the cache, and the cache entry is byte for byte
/// as refresh stored it. npm's built tree is not mounted there: the image's node is not the one
/// that built it, and `mounts` says so.
fn container_box_installs_warm_from_the_cache(eco: &Eco, warm_install: &str, as_user: bool) {
    const IMAGE: &str = "localhost/h5i-base:latest";
    let test = format!(
        "box cache {} warm install at the container tier as {}",
        eco.name,
        if as_user { "h5i-test" } else { "root" }
    );
    let Some(reg) = Registry::up(&test) else {
        return;
    };
    let mut c = caller(as_user, &reg, eco);
    project(&c, &reg, eco);
    c.write(
        ".h5i/env.toml",
        format!(
            "{}\n[profile.devc]\nisolation = \"container\"\n[profile.devc.net]\negress = [\"registry.test:{PORT}\"]\n",
            profiles(eco)
        ),
    );
    c.commit_all("a container profile");
    refresh(&c, eco.name);
    let after_refresh = reg.requests().len();
    let ls: serde_json::Value =
        serde_json::from_str(&c.ok(&["box", "cache", "ls", "--json"])).unwrap();
    let key = ls["caches"][0]["key"].as_str().unwrap().to_string();
    let entry = c.repo().join(".git/.h5i/cache").join(eco.name).join(&key);
    let stored = tree_digest(&entry);

    c.create_container_with("ctr", IMAGE, &["--profile", "devc"]);
    let mounts = c.ok(&["box", "cache", "mounts", "ctr"]);
    assert!(
        mounts.starts_with(&format!("{}: {key} (", eco.name))
            && mounts.contains(&format!("mounted read-only at /.h5i/cache/{}", eco.name))
            && (!matches!(eco.name, "npm" | "pnpm" | "yarn")
                || mounts.contains("built node_modules not mounted: built for ")
                    && mounts.contains("this tier brings its own")),
        "{mounts}"
    );
    let out = run(&c, "ctr", warm_install);
    assert_eq!(
        out.status.code(),
        Some(0),
        "warm {warm_install} as {}: {}{}",
        c.who(),
        stdout(&out),
        stderr(&out)
    );
    let warm = last_run(&c, "ctr");
    assert_eq!(
        tally(&warm, "allowed") + tally(&warm, "denied"),
        0,
        "warm install reached for the network: {warm}"
    );
    assert_eq!(
        reg.requests().len(),
        after_refresh,
        "warm install hit the registry: {:?}",
        reg.requests()
    );
    let out = run(&c, "ctr", eco.prove);
    assert_eq!(stdout(&out).trim(), eco.proved, "{}", stderr(&out));
    assert_cannot_write(&c, eco, "ctr");
    assert_eq!(
        tree_digest(&entry),
        stored,
        "a container box changed the cache"
    );
    c.ok(&["box", "rm", "--force", "ctr"]);
}

/// A container-tier warm install per node package manager and caller.
macro_rules! container_warm {
    ($($eco:ident, $install:literal: $as_root:ident, $as_user:ident;)*) => {$(
        #[test]
        fn $as_root() {
            if require_root("container warm install as root", "the test registry's netns") {
                container_box_installs_warm_from_the_cache(&$eco, $install, false);
            }
        }

        #[test]
        fn $as_user() {
            if require_root("container warm install as h5i-test", "the test registry's netns") {
                container_box_installs_warm_from_the_cache(&$eco, $install, true);
            }
        }
    )*};
}

container_warm! {
    NPM, "npm ci --offline --no-audit --no-fund":
        a_container_box_installs_warm_from_the_cache_with_no_request_as_root,
        a_container_box_installs_warm_from_the_cache_with_no_request_as_h5i_test;
    PNPM, "pnpm install --frozen-lockfile --offline":
        a_container_box_installs_warm_from_the_pnpm_store_with_no_request_as_root,
        a_container_box_installs_warm_from_the_pnpm_store_with_no_request_as_h5i_test;
    YARN, "yarn install --frozen-lockfile --offline --non-interactive":
        a_container_box_installs_warm_from_the_yarn_cache_with_no_request_as_root,
        a_container_box_installs_warm_from_the_yarn_cache_with_no_request_as_h5i_test;
}

#[test]
fn a_container_box_reads_but_cannot_write_the_cache_as_root() {
    if require_root("container cache as root", "the test registry's netns") {
        container_box_reads_but_cannot_write_the_cache(false);
    }
}

#[test]
fn a_container_box_reads_but_cannot_write_the_cache_as_h5i_test() {
    if require_root("container cache as h5i-test", "the test registry's netns") {
        container_box_reads_but_cannot_write_the_cache(true);
    }
}

#[test]
fn refresh_without_a_registry_profile_refuses_with_the_profile_text() {
    // pip's and Go's hosts come from the caller's own configuration (here its environment;
    // pip.conf and Go's env file are read the same way).
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        &'static [(&'static str, &'static str)],
    );
    let cases: [Case; 8] = [
        (
            "npm",
            "package-lock.json",
            "\"registry.npmjs.org:443\"",
            &[],
        ),
        ("pnpm", "pnpm-lock.yaml", "\"registry.npmjs.org:443\"", &[]),
        ("yarn", "yarn.lock", "\"registry.yarnpkg.com:443\"", &[]),
        (
            "cargo",
            "Cargo.lock",
            "\"index.crates.io:443\", \"static.crates.io:443\"",
            &[],
        ),
        (
            "pip",
            "requirements.txt",
            "\"mirror.example.com:443\", \"extra.example.com:8443\"",
            &[
                ("PIP_INDEX_URL", "https://mirror.example.com/pypi/simple"),
                (
                    "PIP_EXTRA_INDEX_URL",
                    "https://extra.example.com:8443/simple",
                ),
            ],
        ),
        (
            "uv",
            "uv.lock",
            "\"mirror.example.com:443\"",
            &[("UV_DEFAULT_INDEX", "https://mirror.example.com/simple")],
        ),
        (
            "poetry",
            "poetry.lock",
            "\"mirror.example.com:443\"",
            &[("PIP_INDEX_URL", "https://mirror.example.com/pypi/simple")],
        ),
        (
            "go",
            "go.sum",
            "\"goproxy.example.com:443\"",
            &[("GOPROXY", "https://goproxy.example.com,direct")],
        ),
    ];
    for (eco, lock, hosts, host_env) in cases {
        let mut c = Caller::root();
        for (k, v) in host_env {
            c = c.with_env(k, v);
        }
        c.write(lock, "{}");
        c.commit_all("lock");
        for policy in [
            None,
            Some(format!(
                "[profile.cache-{eco}]\nisolation = \"supervised\"\n"
            )),
        ] {
            if let Some(p) = policy {
                c.write(".h5i/env.toml", p);
            }
            let out = c.h5i(&["box", "cache", "refresh", eco]);
            assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
            let err = stderr(&out);
            assert!(
                err.contains(&format!(
                    "refusing: refreshing the {eco} cache needs a profile `cache-{eco}`"
                )),
                "{err}"
            );
            let text = format!(
                "\n[profile.cache-{eco}]\nisolation = \"supervised\"\n[profile.cache-{eco}.net]\negress = [{hosts}]"
            );
            assert!(
                err.contains(&text),
                "the profile is not written out ready to paste: {err}"
            );
            // Refused before any box existed.
            assert!(c.ok(&["box", "ls"]).contains("no boxes"));
        }
    }
    let c = Caller::root();
    assert!(stderr(&c.h5i(&["box", "cache", "refresh", "maven"]))
        .contains("no cache ecosystem `maven`"));
}

/// A `cache-<eco>` profile that grants the refresh box anything beyond egress to the registry
/// hosts is refused before any box exists, with the ready-to-paste profile: host paths, AF_UNIX
/// (host listeners), another address family, and (where the host's configuration names the
/// mirror, so the registry hosts are known) an egress entry that is not the mirror's.
fn refresh_refuses_a_profile_reaching_beyond_the_registry(as_user: bool) {
    let cases: [(&str, &str, &str, &str); 4] = [
        (
            "npm",
            "[profile.cache-npm.fs]\nwrite = [\"/tmp\"]\n",
            "it grants host paths beyond the default profile's (/tmp)",
            "\"registry.npmjs.org:443\"",
        ),
        (
            "npm",
            "[profile.cache-npm.net]\negress = [\"registry.test:8080\"]\nunix = true\n",
            "it allows AF_UNIX sockets (net.unix)",
            "\"registry.npmjs.org:443\"",
        ),
        (
            "npm",
            "[profile.cache-npm.net]\negress = [\"registry.test:8080\"]\nfamilies = [\"alg\"]\n",
            "it grants the address families alg (net.families)",
            "\"registry.npmjs.org:443\"",
        ),
        (
            "pip",
            "[profile.cache-pip.net]\negress = [\"registry.test:8080\", \"other.test:443\"]\n",
            "its egress names other.test:443, which the host's registry configuration does not",
            "\"registry.test:8080\"",
        ),
    ];
    for (eco, extra, why, hosts) in cases {
        let c = Caller::either(as_user)
            .with_env("PIP_INDEX_URL", "http://registry.test:8080/simple")
            .with_env("PIP_TRUSTED_HOST", "registry.test");
        c.write(
            if eco == "pip" {
                "requirements.txt"
            } else {
                "package-lock.json"
            },
            "{}",
        );
        let base = if extra.contains(".net]") {
            String::new()
        } else {
            format!("[profile.cache-{eco}.net]\negress = [\"registry.test:8080\"]\n")
        };
        c.write(
            ".h5i/env.toml",
            format!("[profile.cache-{eco}]\nisolation = \"supervised\"\n{base}{extra}"),
        );
        c.commit_all("a wide cache profile");
        let out = c.h5i(&["box", "cache", "refresh", eco]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{extra}: {err}");
        assert!(
            err.contains(&format!(
                "refusing: refreshing the {eco} cache needs a profile `cache-{eco}`"
            )) && err.contains(why)
                && err.contains(&format!("\n[profile.cache-{eco}.net]\negress = [{hosts}]")),
            "{extra} as {}: {err}",
            c.who()
        );
        assert!(
            c.ok(&["box", "ls"]).contains("no boxes"),
            "{extra}: a box was made"
        );
    }
}

#[test]
fn refresh_refuses_a_profile_reaching_beyond_the_registry_as_root() {
    refresh_refuses_a_profile_reaching_beyond_the_registry(false);
}

#[test]
fn refresh_refuses_a_profile_reaching_beyond_the_registry_as_h5i_test() {
    refresh_refuses_a_profile_reaching_beyond_the_registry(true);
}

/// The project's own registry files, each naming `evil.test` (npm's, pnpm's and Yarn's
/// `.npmrc`, Yarn's `.yarnrc`, cargo's `.cargo/config.toml`: a source replacement and a
/// registry), committed: the box's workspace, which must not widen what refresh allows.
const HOSTILE_PROJECT_FILES: &[(&str, &str)] = &[
    (
        ".npmrc",
        "registry=http://evil.test:8080/\n@evil:registry=http://evil.test:8080/\n",
    ),
    (".yarnrc", "registry \"http://evil.test:8080/\"\n"),
    (
        ".cargo/config.toml",
        "[source.crates-io]\nreplace-with = \"evil\"\n[source.evil]\nregistry = \"sparse+http://evil.test:8080/\"\n\
         [registries.evil]\nindex = \"http://evil.test:8080/index.git\"\n",
    ),
];

/// npm, pnpm, Yarn and cargo: a `cache-<eco>` profile whose egress names a host beyond the
/// registries the caller's own configuration names is refused before any box exists, with
/// the profile naming those registries ready to paste, and the project's own registry files
/// (hostile: [`HOSTILE_PROJECT_FILES`]) widen nothing. The caller's configuration is read as the
/// package manager reads it: npm's from the user's npmrc (`NPM_CONFIG_USERCONFIG`), pnpm's from
/// `NPM_CONFIG_REGISTRY`, Yarn's from `YARN_REGISTRY`, cargo's from `$CARGO_HOME/config.toml`
/// (crates.io replaced); with none, the package manager's default registry is the only host.
fn refresh_refuses_an_egress_host_the_callers_registry_configuration_does_not_name(as_user: bool) {
    use std::os::unix::fs::PermissionsExt;
    let conf = tempfile::tempdir().unwrap();
    std::fs::set_permissions(conf.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let npmrc = conf.path().join("user.npmrc");
    std::fs::write(&npmrc, "registry=http://registry.test:8080/\n").unwrap();
    let cargo_home = conf.path().join("cargo");
    std::fs::create_dir(&cargo_home).unwrap();
    std::fs::write(
        cargo_home.join("config.toml"),
        "[source.crates-io]\nreplace-with = \"mirror\"\n[source.mirror]\nregistry = \"sparse+http://registry.test:8080/index/\"\n",
    )
    .unwrap();
    let (npmrc, cargo_home) = (
        npmrc.display().to_string(),
        cargo_home.display().to_string(),
    );
    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, &'a str);
    let cases: [Case; 8] = [
        (
            "npm",
            "package-lock.json",
            vec![("NPM_CONFIG_USERCONFIG", &npmrc)],
            "\"registry.test:8080\"",
        ),
        (
            "npm",
            "package-lock.json",
            vec![],
            "\"registry.npmjs.org:443\"",
        ),
        (
            "pnpm",
            "pnpm-lock.yaml",
            vec![("NPM_CONFIG_REGISTRY", "http://registry.test:8080/")],
            "\"registry.test:8080\"",
        ),
        (
            "pnpm",
            "pnpm-lock.yaml",
            vec![],
            "\"registry.npmjs.org:443\"",
        ),
        (
            "yarn",
            "yarn.lock",
            vec![("YARN_REGISTRY", "http://registry.test:8080/")],
            "\"registry.test:8080\"",
        ),
        ("yarn", "yarn.lock", vec![], "\"registry.yarnpkg.com:443\""),
        (
            "cargo",
            "Cargo.lock",
            vec![("CARGO_HOME", &cargo_home)],
            "\"registry.test:8080\"",
        ),
        (
            "cargo",
            "Cargo.lock",
            vec![],
            "\"index.crates.io:443\", \"static.crates.io:443\"",
        ),
    ];
    for (eco, lock, host_env, hosts) in cases {
        let mut c = Caller::either(as_user);
        for (k, v) in &host_env {
            c = c.with_env(k, v);
        }
        c.write(lock, "{}");
        for (file, text) in HOSTILE_PROJECT_FILES {
            c.write(file, text);
        }
        let egress = if host_env.is_empty() {
            // Exactly what the project's own files name.
            "\"evil.test:8080\""
        } else {
            "\"registry.test:8080\", \"evil.test:8080\""
        };
        c.write(
            ".h5i/env.toml",
            format!("[profile.cache-{eco}]\nisolation = \"supervised\"\n[profile.cache-{eco}.net]\negress = [{egress}]\n"),
        );
        c.commit_all("a cache profile reaching evil.test");
        let out = c.h5i(&["box", "cache", "refresh", eco]);
        let err = stderr(&out);
        let case = format!("{eco} {host_env:?} as {}", c.who());
        assert_eq!(out.status.code(), Some(1), "{case}: {err}");
        assert!(
            err.contains(&format!(
                "refusing: refreshing the {eco} cache needs a profile `cache-{eco}`"
            )) && err.contains(
                "its egress names evil.test:8080, which the host's registry configuration does not"
            ) && err.contains(&format!(
                "\n[profile.cache-{eco}.net]\negress = [{hosts}]\n"
            )),
            "{case}: {err}"
        );
        assert!(
            c.ok(&["box", "ls"]).contains("no boxes"),
            "{case}: a box was made"
        );
    }
}

#[test]
fn refresh_refuses_an_egress_host_the_callers_registry_configuration_does_not_name_as_root() {
    refresh_refuses_an_egress_host_the_callers_registry_configuration_does_not_name(false);
}

#[test]
fn refresh_refuses_an_egress_host_the_callers_registry_configuration_does_not_name_as_h5i_test() {
    refresh_refuses_an_egress_host_the_callers_registry_configuration_does_not_name(true);
}

/// The progress line while a refresh runs (stderr not a terminal: one line every 5 s), against
/// a stand-in slow enough for the install to last past 5 s; what the install step prints reaches
/// the caller escaped, each line after `h5i: refresh npm: | `, never raw: a lockfile naming a
/// package with an escape sequence in its name makes npm print it, and the caller's stderr
/// carries no ESC byte.
fn refresh_progress_line_and_escaped_output(as_user: bool) {
    let test = format!(
        "box cache refresh progress as {}",
        if as_user { "h5i-test" } else { "root" }
    );
    let Some(reg) = Registry::up_slow(&test, 6) else {
        return;
    };
    let c = caller(as_user, &reg, &NPM);
    project(&c, &reg, &NPM);
    let out = refresh(&c, "npm");
    let err = stderr(&out);
    assert!(
        err.contains("h5i: refresh npm: installing in a dedicated supervised box")
            && err.contains(" MiB in the cache, 5 s\n"),
        "no progress line: {err}"
    );
    assert!(
        err.contains("h5i: refresh npm: | added 5 packages"),
        "the install's own output was not relayed: {err}"
    );

    let lock = std::fs::read_to_string(c.repo().join("package-lock.json")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&lock).unwrap();
    let evil = "h5i-\u{1b}[31mRED\u{1b}]0;title\u{7}";
    doc["packages"][""]["dependencies"][evil] = "1.0.0".into();
    doc["packages"][&format!("node_modules/{evil}")] = serde_json::json!({
        "version": "1.0.0",
        "resolved": format!("http://registry.test:{PORT}/evil/-/evil-1.0.0.tgz"),
        "integrity": "sha512-AAAA",
    });
    c.write("package-lock.json", doc.to_string());
    let manifest = std::fs::read_to_string(c.repo().join("package.json")).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    manifest["dependencies"][evil] = "1.0.0".into();
    c.write("package.json", manifest.to_string());
    c.commit_all("a hostile package name");
    let out = c.h5i(&["box", "cache", "refresh", "npm"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        !out.stderr.contains(&0x1b) && !out.stdout.contains(&0x1b) && !out.stderr.contains(&0x07),
        "box-supplied control bytes reached the caller raw: {err:?}"
    );
    assert!(
        err.contains("h5i: refresh npm: | ") && err.contains("h5i-\\x1b[31mRED"),
        "the box's output is not shown escaped: {err}"
    );
    assert!(
        err.contains("refusing: the npm install step exited "),
        "{err}"
    );
}

#[test]
fn refresh_shows_a_progress_line_and_escapes_what_the_box_prints_as_root() {
    refresh_progress_line_and_escaped_output(false);
}

#[test]
fn refresh_shows_a_progress_line_and_escapes_what_the_box_prints_as_h5i_test() {
    refresh_progress_line_and_escaped_output(true);
}

/// A symlinked lockfile (pointing out of the tree) is refused, never followed: nothing is
/// mounted for that ecosystem and the refusal names the lockfile.
#[test]
fn a_symlinked_cargo_lock_is_refused_not_followed() {
    let c = Caller::root();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("Cargo.lock"), "version = 3\n").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("Cargo.lock"),
        c.repo().join("Cargo.lock"),
    )
    .unwrap();
    let text = c.ok(&["box", "cache", "mounts"]);
    assert!(
        text.starts_with("cargo: nothing mounted: refusing: the lockfile ")
            && text.contains("Cargo.lock is "),
        "{text}"
    );
}

/// pip's refresh takes requirements.txt as a lockfile: a line without its hash, or a VCS
/// requirement (whose metadata step would run the repository's code in the refresh box), fails
/// the install step, and nothing is stored.
#[test]
fn pip_refresh_refuses_an_unhashed_or_vcs_requirement_and_stores_nothing() {
    let Some(reg) = Registry::up("box cache pip hostile requirements") else {
        return;
    };
    let mut c = Caller::root().with_env("H5I_TEST_HOSTS", &reg.pin());
    for (k, v) in PIP.host_env {
        c = c.with_env(k, v);
    }
    project(&c, &reg, &PIP);
    for (what, line) in [
        ("unhashed", "h5i-fixture-000==1.0.0\n"),
        (
            "vcs",
            "h5i-evil @ git+http://registry.test:8080/evil.git --hash=sha256:00\n",
        ),
    ] {
        c.write("requirements.txt", line);
        c.commit_all(what);
        let out = c.h5i(&["box", "cache", "refresh", "pip"]);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("refusing: the pip install step exited"),
            "{what}: {}",
            stderr(&out)
        );
        assert!(
            c.ok(&["box", "cache", "ls"]).contains("no caches"),
            "{what}"
        );
        assert!(
            !c.ok(&["box", "ls"]).contains("refresh"),
            "{what}: the refresh box was left behind"
        );
    }
}

/// `text` committed as `eco`'s lockfile (`what` says how it was made hostile): `h5i box cache
/// refresh` exits 1 with a refusal holding each of `says` and the mend, stores nothing and leaves
/// no refresh box.
fn assert_refresh_refused(c: &Caller, eco: &Eco, what: &str, text: String, says: &[&str]) {
    c.write(eco.lockfile, text);
    c.commit_all(what);
    let out = c.h5i(&["box", "cache", "refresh", eco.name]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{} {what}: {err}", eco.name);
    assert!(
        says.iter().all(|s| err.contains(s)) && err.contains("; to fix: "),
        "{} {what}: {err}",
        eco.name
    );
    assert!(
        c.ok(&["box", "cache", "ls"]).contains("no caches"),
        "{} {what}: a cache was stored",
        eco.name
    );
    assert!(
        !c.ok(&["box", "ls"]).contains("refresh"),
        "{} {what}: the refresh box was left behind",
        eco.name
    );
}

/// A uv.lock or poetry.lock is hostile input to the refresh: a tampered hash (a well-formed one
/// that is not the file's) fails pip's check in the refresh box, and a name carrying a pip
/// option is refused on the host before the install step runs. Either way nothing is stored,
/// no refresh box is left, and the refusal names the mend.
#[test]
fn uv_and_poetry_refresh_refuse_a_tampered_hash_or_a_smuggled_option_and_store_nothing() {
    let Some(reg) = Registry::up("box cache uv and poetry hostile lockfiles") else {
        return;
    };
    for eco in [&UV, &POETRY] {
        let mut c = Caller::root().with_env("H5I_TEST_HOSTS", &reg.pin());
        for (k, v) in eco.host_env {
            c = c.with_env(k, v);
        }
        project(&c, &reg, eco);
        let locked = std::fs::read_to_string(c.repo().join(eco.lockfile)).unwrap();
        let hash_at = locked.find("sha256:").unwrap() + "sha256:".len();
        let mut tampered = locked.clone();
        tampered.replace_range(hash_at..hash_at + 64, &"0123456789abcdef".repeat(4));
        let entry = "[[package]]\nname = \"h5i-fixture-000\"";
        assert!(locked.contains(entry), "{locked}");
        let smuggled = locked.replacen(
            entry,
            "[[package]]\nname = \"h5i-fixture-000 --index-url http://registry.test:8080/evil\"",
            1,
        );
        for (what, text, refusal) in [
            (
                "tampered hash",
                tampered,
                format!("refusing: the {} install step exited 1", eco.name),
            ),
            (
                "smuggled option",
                smuggled,
                format!("refusing: {} package ", eco.lockfile),
            ),
        ] {
            let before = reg.requests().len();
            assert_refresh_refused(&c, eco, what, text, &[&refusal]);
            if what == "smuggled option" {
                assert_eq!(reg.requests().len(), before, "{}: fetched anyway", eco.name);
            }
        }
    }
}

/// A pnpm-lock.yaml or yarn.lock is hostile input to the refresh: a package whose integrity is
/// another package's fails the package manager's check in the refresh box, and a tarball URL on
/// a host outside the `cache-<eco>` profile's egress (the test net's second host) is refused at
/// connect by the box's egress (the refusal's tally names it denied). Either way the install step
/// fails, nothing is stored, no refresh box is left, and the refusal names the mend.
#[test]
fn pnpm_and_yarn_refresh_refuse_a_swapped_integrity_or_an_off_registry_tarball_and_store_nothing() {
    let Some(reg) = Registry::up("box cache pnpm and yarn hostile lockfiles") else {
        return;
    };
    let off_registry = format!("{}:{PORT}", reg.hosts.second);
    for eco in [&PNPM, &YARN] {
        let c = caller(false, &reg, eco);
        project(&c, &reg, eco);
        let locked = std::fs::read_to_string(c.repo().join(eco.lockfile)).unwrap();
        let integrities: Vec<&str> = locked
            .split(|ch: char| ch.is_whitespace() || ch == ',')
            .filter(|w| w.starts_with("sha512-"))
            .collect();
        assert!(integrities.len() >= 2, "{locked}");
        let swapped = locked.replacen(integrities[0], integrities[1], 1);
        let elsewhere = locked.replacen(
            &format!("registry.test:{PORT}/h5i-fixture-000/"),
            &format!("{off_registry}/h5i-fixture-000/"),
            1,
        );
        assert_ne!(elsewhere, locked);
        for (what, text, says) in [
            ("swapped integrity", swapped, String::new()),
            (
                "off-registry tarball",
                elsewhere,
                format!("denied {off_registry}/tcp x"),
            ),
        ] {
            let exited = format!("refusing: the {} install step exited ", eco.name);
            assert_refresh_refused(&c, eco, what, text, &[&exited, &says]);
        }
    }
}

/// npm's project with platform-marker packages (the esbuild/@swc pattern): `h5i-native` and one
/// optional package per platform, each with `os`/`cpu`/`libc` (bench/npm_platform_fixture.py).
const NPM_PLATFORM: Eco = Eco {
    name: "npm",
    fixture: &["npm_platform_fixture.py", "{base}"],
    host_env: NODE_HOST_ENV,
    var: "npm_config_cache",
    install: "npm ci --no-audit --no-fund",
    warm_install: Some(WARM_FROM_TREE),
    prove: "node -e \"console.log(require('h5i-native'))\" && ls node_modules/@h5i-native",
    proved: "",
    lockfile: "package-lock.json",
    tree: None,
};

/// The built tree as the box sees it (`H5I_NPM_TREE`), for the write attempts.
const NPM_TREE: Eco = Eco {
    var: "H5I_NPM_TREE",
    ..NPM_PLATFORM
};

/// A warm install from the built tree: the box's `node_modules` is the tree (overlaid, no
/// copy), and npm (offline, saving nothing) finds it up to date.
const WARM_FROM_TREE: &str = "npm install --offline --no-save --no-audit --no-fund";

/// Every path under `root` with its mode and bytes (a symlink's target), sorted: what a box
/// must leave exactly as it was.
pub(crate) fn tree_digest(root: &std::path::Path) -> Vec<(String, u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let bytes = if meta.is_dir() {
                stack.push(p.clone());
                Vec::new()
            } else if meta.file_type().is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                std::fs::read(&p).unwrap()
            };
            out.push((
                p.strip_prefix(root).unwrap().display().to_string(),
                meta.permissions().mode(),
                bytes,
            ));
        }
    }
    out.sort();
    out
}

/// What node on this host says for `expr`.
fn host_node(expr: &str) -> String {
    let out = Command::new("node").args(["-p", expr]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().to_string()
}

/// The paths the stand-in served.
fn served(reg: &Registry) -> Vec<String> {
    let mut paths: Vec<String> = reg
        .requests()
        .iter()
        .filter_map(|l| l.split("\"GET ").nth(1))
        .filter_map(|r| r.split(' ').next())
        .map(str::to_string)
        .collect();
    paths.sort();
    paths
}

/// Box `name`'s view of the cache variables: `npm_config_cache H5I_NPM_TREE`, `unset` for each
/// the box did not get.
fn cache_vars(c: &Caller, name: &str) -> String {
    let out = run(
        c,
        name,
        "echo ${npm_config_cache:-unset} ${H5I_NPM_TREE:-unset}",
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out).trim().to_string()
}

/// The cache entry at `entry` is forged by `forge`: `box cache mounts NAME` refuses the whole
/// npm cache (naming `what`, with the mend), and the box gets neither variable.
fn assert_forged_refused(c: &Caller, name: &str, key: &str, what: &str) {
    let mounts = c.ok(&["box", "cache", "mounts", name]);
    assert!(
        mounts.starts_with(&format!(
            "npm: nothing mounted: refusing: the npm cache {key} is not one `h5i box cache refresh` left ("
        )) && mounts.contains(what)
            && mounts.contains("; to fix: `h5i box cache rm npm`, then `h5i box cache refresh npm`"),
        "{what}: {mounts}"
    );
    assert_eq!(cache_vars(c, name), "unset unset", "{what}");
}

/// Box `name`'s upper layer for the tree of `key` on the host: `<box dir>/npm-tree/<key>`.
fn upper_of(c: &Caller, name: &str, key: &str) -> PathBuf {
    c.box_dir(name).join("npm-tree").join(key)
}

/// From inside box `name`: `os.chmod` of each path to each set-id mode; one errno name (or
/// `CHANGED`) per attempt.
fn setid_chmods(c: &Caller, name: &str, paths: &[&str]) -> Vec<String> {
    let probe = format!(
        r#"
import errno, os
for p in {paths:?}:
    for mode in (0o4777, 0o2755, 0o6755):
        try:
            os.chmod(p, mode)
            print("CHANGED")
        except OSError as e:
            print(errno.errorcode[e.errno])
"#
    );
    let out = c.h5i(&["box", "run", name, "--", "python3", "-c", &probe]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out).lines().map(str::to_string).collect()
}

fn npm_tree_for_the_boxs_platform(as_user: bool) {
    let test = format!(
        "box cache npm tree as {}",
        if as_user { "h5i-test" } else { "root" }
    );
    let Some(reg) = Registry::up(&test) else {
        return;
    };
    let c = caller(as_user, &reg, &NPM_PLATFORM);
    project(&c, &reg, &NPM_PLATFORM);
    let arch = host_node("process.arch");
    let platform = format!(
        "linux-{arch}-glibc-abi{}",
        host_node("process.versions.modules")
    );

    // The refresh box fetched the loader and this platform's package, no other platform's.
    refresh(&c, "npm");
    assert_eq!(
        served(&reg),
        [
            format!("/@h5i-native/linux-{arch}/-/linux-{arch}-1.0.0.tgz"),
            "/h5i-native/-/h5i-native-1.0.0.tgz".to_string()
        ]
    );
    let ls: serde_json::Value =
        serde_json::from_str(&c.ok(&["box", "cache", "ls", "--json"])).unwrap();
    assert_eq!(
        ls["caches"][0]["refresh"]["tree"]["platform"],
        platform.as_str(),
        "{ls}"
    );
    let key = ls["caches"][0]["key"].as_str().unwrap().to_string();
    let eco_dir = c.repo().join(".git/.h5i/cache/npm");
    let entry = eco_dir.join(&key);
    let stored: Vec<String> = std::fs::read_dir(entry.join("tree/node_modules/@h5i-native"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(stored, [format!("linux-{arch}")], "the stored tree");

    // Warm at the supervised and process tiers: the box copies the tree, npm finds it up to
    // date, nothing reaches the network, the package for this platform loads.
    let want = format!("@h5i-native/linux-{arch}\nlinux-{arch}");
    for (name, tier) in [("warm", "supervised"), ("warmp", "process")] {
        match tier {
            "supervised" => c.ok(&["box", "create", name, "--profile", "dev"]),
            _ => c.ok(&["box", "create", name, "--isolation", tier]),
        };
        let mounts = c.ok(&["box", "cache", "mounts", name]);
        assert!(
            mounts.contains(&format!("built node_modules for {platform} ("))
                && mounts.contains("H5I_NPM_TREE=/.h5i/cache/npm-tree")
                && mounts.contains("and overlaid at /work/node_modules"),
            "{mounts}"
        );
        let before = served(&reg);
        let out = run(&c, name, WARM_FROM_TREE);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        assert!(stdout(&out).contains("up to date"), "{}", stdout(&out));
        let warm = last_run(&c, name);
        assert_eq!(
            tally(&warm, "allowed") + tally(&warm, "denied"),
            0,
            "{warm}"
        );
        assert_eq!(served(&reg), before, "{name} reached the registry");
        let out = run(&c, name, NPM_PLATFORM.prove);
        assert_eq!(stdout(&out).trim(), want, "{name}: {}", stderr(&out));
        assert_cannot_write(&c, &NPM_TREE, name);
    }
    // The lockfile is as committed: npm saved nothing, so the cache stays current.
    assert!(c
        .ok(&["box", "cache", "mounts", "warm"])
        .contains("mounted read-only"));

    // The box's node_modules is its own: writing, renaming, removing and changing modes under
    // it lands in the box's upper layer; the cache is byte for byte as refresh stored it, and
    // another box still sees the tree as stored.
    let host_tree = entry.join("tree/node_modules");
    let stored = tree_digest(&host_tree);

    // A set-id mode under the overlay answers EPERM, as it does on the box's own workspace
    // files: the box's seccomp denylist refuses every call that sets S_ISUID/S_ISGID (a set-id
    // file in the box's upper layer would be a set-id program owned by the box's identity on the
    // host, the same threat as in its workspace). Refused before the call reaches overlayfs: no
    // copy-up, the cached file's mode as stored.
    let native_pkg = format!("node_modules/@h5i-native/linux-{arch}/package.json");
    for name in ["warm", "warmp"] {
        let out = run(&c, name, "echo x > own-file");
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(
            setid_chmods(
                &c,
                name,
                &[&native_pkg, "node_modules/h5i-native", "own-file"]
            ),
            ["EPERM"; 9],
            "{name}"
        );
        assert!(
            !upper_of(&c, name, &key).join("upper/@h5i-native").exists(),
            "{name}: a refused chmod copied the file up"
        );
        let out = run(&c, name, &format!("rm own-file; stat -c %a {native_pkg}"));
        let stored_mode = std::fs::metadata(entry.join("tree").join(&native_pkg))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(
            stdout(&out).trim(),
            format!("{stored_mode:o}"),
            "{name}: {}",
            stderr(&out)
        );
    }
    assert_eq!(tree_digest(&host_tree), stored);
    let out = run(
        &c,
        "warm",
        "set -e; echo 'module.exports = 0;' > node_modules/h5i-native/index.js
         mv node_modules/h5i-native/package.json node_modules/h5i-native/package.moved
         rm -rf node_modules/@h5i-native
         chmod 0777 node_modules/h5i-native/index.js
         mkdir node_modules/planted && echo x > node_modules/planted/f
         ln -s /etc/shadow node_modules/h5i-native/shadow
         node -p \"require('./node_modules/h5i-native/index.js')\"",
    );
    assert_eq!(stdout(&out).trim(), "0", "{}", stderr(&out));
    assert_eq!(
        tree_digest(&host_tree),
        stored,
        "a box changed the cached tree"
    );
    // Kept in the box across runs (its upper layer), and only there.
    let out = run(
        &c,
        "warm",
        "ls node_modules/@h5i-native 2>&1; cat node_modules/planted/f; ls node_modules/h5i-native",
    );
    assert!(
        stdout(&out).contains("No such file")
            && stdout(&out).contains("x\n")
            && stdout(&out).contains("package.moved"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = run(&c, "warmp", NPM_PLATFORM.prove);
    assert_eq!(stdout(&out).trim(), want, "warmp: {}", stderr(&out));
    let out = run(&c, "warmp", "ls node_modules");
    assert!(!stdout(&out).contains("planted"), "{}", stdout(&out));
    // What the box wrote is in its upper layer, in the box's directory (outside every grant).
    let upper = upper_of(&c, "warm", &key).join("upper");
    assert!(upper.join("planted/f").is_file());

    // A box that changes its lockfile (as `npm install foo` does) keeps its node_modules: the
    // tree it started from stays beneath the same upper layer, its changes with it. The cache
    // itself is stale for the new lockfile and is not handed out: neither variable is set.
    let out = run(
        &c,
        "warm",
        "cp package-lock.json lock.saved && echo ' ' >> package-lock.json",
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mounts = c.ok(&["box", "cache", "mounts", "warm"]);
    assert!(
        mounts.starts_with("npm: nothing mounted: the lockfiles make key ")
            && mounts.contains("(stale)")
            && mounts.contains(&format!(
                "node_modules: the box's own, overlaid at /work/node_modules: the tree of npm cache {key} it started from"
            )),
        "{mounts}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&c.ok(&["box", "cache", "mounts", "warm", "--json"])).unwrap();
    assert_eq!(doc["node_modules"]["state"], "overlaid", "{doc}");
    assert_eq!(doc["node_modules"]["key"], key.as_str(), "{doc}");
    assert_eq!(doc["node_modules"]["current"], false, "{doc}");
    assert_eq!(cache_vars(&c, "warm"), "unset unset");
    let out = run(
        &c,
        "warm",
        "cat node_modules/planted/f; ls node_modules/h5i-native; ls node_modules/@h5i-native 2>&1; echo y > node_modules/planted/g",
    );
    assert!(
        stdout(&out).contains("x\n")
            && stdout(&out).contains("package.moved")
            && stdout(&out).contains("No such file"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        upper.join("planted/g").is_file(),
        "not in the same upper layer"
    );
    assert_eq!(
        c.box_dir("warm")
            .join("npm-tree")
            .read_dir()
            .unwrap()
            .count(),
        1,
        "a second upper layer"
    );
    assert_eq!(tree_digest(&host_tree), stored);
    // Its lockfile back: the cache is current again, and handed out.
    let out = run(&c, "warm", "mv lock.saved package-lock.json");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        cache_vars(&c, "warm"),
        "/.h5i/cache/npm /.h5i/cache/npm-tree"
    );

    // A workspace with a node_modules of its own keeps it: no overlay hides it.
    c.ok(&["box", "create", "own", "--profile", "dev"]);
    let own_ws = c
        .repo()
        .join(".git/.h5i/env")
        .read_dir()
        .unwrap()
        .map(|a| a.unwrap().path().join("own/workspace"))
        .find(|p| p.is_dir())
        .expect("the own box's workspace");
    std::fs::create_dir(own_ws.join("node_modules")).unwrap();
    std::fs::write(own_ws.join("node_modules/mine"), "mine").unwrap();
    // The caller's own (root's files a root caller's box reads as nobody's, and its rm removes).
    for p in [
        own_ws.join("node_modules"),
        own_ws.join("node_modules/mine"),
    ] {
        std::os::unix::fs::chown(p, Some(c.uid()), None).unwrap();
    }
    let mounts = c.ok(&["box", "cache", "mounts", "own"]);
    assert!(
        mounts.contains("not overlaid: the workspace has a node_modules of its own"),
        "{mounts}"
    );
    let out = run(&c, "own", "ls node_modules");
    assert_eq!(stdout(&out).trim(), "mine", "{}", stderr(&out));
    c.ok(&["box", "rm", "--force", "own"]);

    // A tree another node built (another platform or ABI, or node changed since) is not
    // mounted; the download cache still is.
    let record_path = entry.join("refresh.json");
    let record = std::fs::read_to_string(&record_path).unwrap();
    let mut other: serde_json::Value = serde_json::from_str(&record).unwrap();
    other["tree"]["node"]["ino"] = serde_json::json!(1);
    std::fs::write(&record_path, other.to_string()).unwrap();
    let mounts = c.ok(&["box", "cache", "mounts", "warm"]);
    assert!(
        mounts.contains(&format!(
            "built node_modules not mounted: built for {platform} by "
        )),
        "{mounts}"
    );
    assert_eq!(cache_vars(&c, "warm"), "/.h5i/cache/npm unset");
    std::fs::write(&record_path, &record).unwrap();
    assert_eq!(
        cache_vars(&c, "warm"),
        "/.h5i/cache/npm /.h5i/cache/npm-tree"
    );

    // Forged entries: each refused whole, nothing mounted.
    use std::os::unix::fs::{symlink, PermissionsExt};
    let tree = entry.join("tree/node_modules");
    let aside = entry.join("tree/aside");
    std::fs::rename(&tree, &aside).unwrap();
    symlink("/etc", &tree).unwrap();
    assert_forged_refused(&c, "warm", &key, "tree/node_modules is a symlink");
    std::fs::remove_file(&tree).unwrap();
    std::fs::rename(&aside, &tree).unwrap();

    let data = entry.join("data");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_forged_refused(&c, "warm", &key, "data is writable by others (mode 777)");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();

    std::os::unix::fs::chown(&entry, Some(4242), None).unwrap();
    assert_forged_refused(&c, "warm", &key, "is owned by uid 4242");
    std::os::unix::fs::chown(&entry, Some(c.uid()), None).unwrap();

    let elsewhere = eco_dir.join("elsewhere");
    std::fs::rename(&entry, &elsewhere).unwrap();
    symlink(&elsewhere, &entry).unwrap();
    assert_forged_refused(&c, "warm", &key, &format!("{key} is a symlink"));
    std::fs::remove_file(&entry).unwrap();
    std::fs::rename(&elsewhere, &entry).unwrap();
    assert_eq!(
        cache_vars(&c, "warm"),
        "/.h5i/cache/npm /.h5i/cache/npm-tree"
    );

    // A cache renamed to the key another lockfile makes: its record names the key it was
    // built for, so it is refused, not taken for the new dependency set.
    let out = run(&c, "warm", "echo ' ' >> package-lock.json");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mounts = c.ok(&["box", "cache", "mounts", "warm", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&mounts).unwrap();
    let new_key = doc["offers"][0]["want"].as_str().unwrap().to_string();
    assert_ne!(new_key, key);
    std::fs::rename(&entry, eco_dir.join(&new_key)).unwrap();
    assert_forged_refused(
        &c,
        "warm",
        &new_key,
        &format!("its refresh.json is the record of the npm cache {key}, not of npm {new_key}"),
    );
    // The tree the box's node_modules was built on is gone: not overlaid, and `mounts` names
    // where the box's changes stay.
    let mounts = c.ok(&["box", "cache", "mounts", "warm"]);
    assert!(
        mounts.contains(&format!(
            "node_modules: not overlaid: the box's was built on the tree of npm cache {key}, and the npm cache {key} cannot be overlaid ("
        )) && mounts.contains(&format!("its changes stay in {}", upper_of(&c, "warm", &key).display())),
        "{mounts}"
    );
    let out = run(&c, "warm", "ls -A node_modules | wc -l");
    assert_eq!(stdout(&out).trim(), "0", "{}", stderr(&out));
    assert!(upper.join("planted/f").is_file());
    for b in ["warm", "warmp"] {
        c.ok(&["box", "rm", "--force", b]);
    }
}

/// The built tree is right for the box's platform and node, a box cannot write it, and a forged
/// entry (symlinked, writable by others, owned by another user, renamed to another key) is
/// refused whole, as root and as h5i-test.
#[test]
fn npm_platform_packages_get_the_boxs_platform_tree_and_forged_caches_are_refused_as_root() {
    npm_tree_for_the_boxs_platform(false);
}

#[test]
fn npm_platform_packages_get_the_boxs_platform_tree_and_forged_caches_are_refused_as_h5i_test() {
    npm_tree_for_the_boxs_platform(true);
}

/// Files a project plants (path, text, mode).
type HookFiles<'a> = &'a [(&'a str, String, u32)];

/// The refresh runs the install step alone: a project's own hooks into its package manager (a
/// `.pnpmfile.cjs`, a `yarn-path` in `.yarnrc`, a `rustc-wrapper` in `.cargo/config.toml`) are
/// the project's code, and none of them runs in the refresh box. Each hook would print a
/// marker and plant a file in the cache it is filling; neither shows up, whether the install
/// then succeeds or refuses.
#[test]
fn refresh_runs_none_of_the_projects_own_hooks() {
    let Some(reg) = Registry::up("box cache refresh runs no project hook") else {
        return;
    };
    const PLANT: &str = "require('fs').writeFileSync(require('path').join(process.env.npm_config_store_dir || process.env.YARN_CACHE_FOLDER || '/tmp', 'planted-by-project'), 'PLANTED-' + 'BY-PROJECT');";
    let hooks: [(&Eco, HookFiles); 3] = [
        (
            &PNPM,
            &[(
                ".pnpmfile.cjs",
                format!("console.error('PROJECT-HOOK-RAN'); {PLANT} module.exports = {{ hooks: {{}} }};\n"),
                0o644,
            )],
        ),
        (
            &YARN,
            &[
                (".yarnrc", "yarn-path \"./evil.js\"\n".to_string(), 0o644),
                (
                    "evil.js",
                    format!("console.log('PROJECT-HOOK-RAN'); {PLANT}\n"),
                    0o755,
                ),
            ],
        ),
        (
            &CARGO,
            &[(
                "evil-wrapper.sh",
                "#!/bin/sh\necho PROJECT-HOOK-RAN >&2\necho PLANTED-\"\"BY-PROJECT > \"$CARGO_HOME/planted-by-project\"\nexec \"$@\"\n"
                    .to_string(),
                0o755,
            )],
        ),
    ];
    for (eco, files) in hooks {
        let c = caller(false, &reg, eco);
        project(&c, &reg, eco);
        for (rel, text, mode) in files {
            c.write(rel, text);
            std::fs::set_permissions(
                c.repo().join(rel),
                std::os::unix::fs::PermissionsExt::from_mode(*mode),
            )
            .unwrap();
        }
        if eco.name == "cargo" {
            let config = c.repo().join(".cargo/config.toml");
            let mut text = std::fs::read_to_string(&config).unwrap_or_default();
            text.push_str("\n[build]\nrustc-wrapper = \"./evil-wrapper.sh\"\n");
            c.write(".cargo/config.toml", text);
        }
        c.commit_all(&format!("{} project hooks", eco.name));
        let out = c.h5i(&["box", "cache", "refresh", eco.name]);
        let said = format!("{}{}", stdout(&out), stderr(&out));
        assert!(!said.contains("PROJECT-HOOK-RAN"), "{}: {said}", eco.name);
        let cache = c.repo().join(".git/.h5i/cache").join(eco.name);
        let planted = common::files_containing(&cache, b"PLANTED-BY-PROJECT");
        assert!(planted.is_empty(), "{}: {planted:?} ({said})", eco.name);
        assert!(
            !c.ok(&["box", "ls"]).contains("refresh"),
            "{}: the refresh box was left behind",
            eco.name
        );
    }
}

/// A hostile package: a crate whose tarball carries a symlink to a file of the caller's outside
/// the cache (mode 0600). cargo unpacks it into the refresh box's CARGO_HOME; taking the tree
/// back (chown, then every mode set) follows no symlink, so the caller's file keeps its mode,
/// owner and bytes, and the stored cache holds the symlink as it was. (A hard link to a host
/// file cannot be planted this way: tar refuses a link target outside the archive, and the
/// staging directory is a mount of its own in the box, so link(2) from anywhere else fails
/// with EXDEV; `cache::tree_walk`'s unit tests hold the refusal of one.)
fn a_planted_symlink_changes_no_host_file(as_user: bool) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let test = format!(
        "a planted symlink in a refreshed tree as {}",
        if as_user { "h5i-test" } else { "root" }
    );
    let Some(reg) = Registry::up(&test) else {
        return;
    };
    let c = caller(as_user, &reg, &CARGO);
    let victim = c.repo().join("caller-secret");
    let victim_path = victim.display().to_string();
    project_with(
        &c,
        &reg,
        &CARGO,
        &[("H5I_FIXTURE_PLANT_SYMLINK", victim_path.as_str())],
    );
    // Made after the project's commit: the file is the caller's alone, in no box's clone.
    let out = c
        .sh("printf 'caller secret\\n' > caller-secret && chmod 600 caller-secret")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let before = std::fs::metadata(&victim).unwrap();
    refresh(&c, "cargo");
    let after = std::fs::metadata(&victim).unwrap();
    assert_eq!(
        after.permissions().mode() & 0o7777,
        0o600,
        "refresh changed the mode of the caller's file as {}",
        c.who()
    );
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "caller secret\n");
    let cache = c.repo().join(".git/.h5i/cache/cargo");
    let planted: Vec<PathBuf> = walk_files(&cache)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "planted"))
        .collect();
    assert_eq!(
        planted.len(),
        1,
        "the crate's symlink is not in the cache: {planted:?}"
    );
    assert_eq!(std::fs::read_link(&planted[0]).unwrap(), victim);
}

/// Every entry beneath `root` (symlinks not followed).
fn walk_files(root: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

#[test]
fn a_symlink_a_package_plants_in_the_cache_changes_no_host_file_as_root() {
    if require_root("planted symlink as root", "the test registry's netns") {
        a_planted_symlink_changes_no_host_file(false);
    }
}

#[test]
fn a_symlink_a_package_plants_in_the_cache_changes_no_host_file_as_h5i_test() {
    if require_root("planted symlink as h5i-test", "the test registry's netns") {
        a_planted_symlink_changes_no_host_file(true);
    }
}
