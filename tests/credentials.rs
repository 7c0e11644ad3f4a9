//! The credential proxy in real process-tier boxes: a client in the box reaches a stand-in
//! Anthropic upstream (a TLS server on 127.0.0.1 with a CA this test made) through the base URL
//! and dummy token it was handed, the upstream sees the real key, and the box, its records and
//! its directory never hold it.
//!
//! Upstream names are mapped through h5i's test seams (`H5I_TEST_HOSTS`, `H5I_TEST_CA_FILE`),
//! never through the system resolver. Runs as root (CI).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::support;

use std::collections::BTreeMap;

use common::{stderr, stdout, Repo};
use support::{Answer, TestCa, TlsUpstream};

const REAL: &str = "sk-ant-REAL-host-only-3f9c0d1e7a";
const REAL_OTHER: &str = "sk-other-REAL-host-only-55aa01";

const POLICY: &str = r#"
[profile.ai]
isolation = "process"

[[profile.ai.auth]]
host = "api.anthropic.test"
credential_env = "H5I_TEST_ANTHROPIC_KEY"
base_url_var = "ANTHROPIC_BASE_URL"
token_var = "ANTHROPIC_API_KEY"

[[profile.ai.auth]]
host = "api.other.test"
credential_env = "H5I_TEST_OTHER_KEY"
base_url_var = "OTHER_BASE_URL"
token_var = "OTHER_TOKEN"
"#;

/// Runs inside the box. argv: the real key in two halves (so the whole key is in no argv).
const SCRIPT: &str = r#"
import json, os, sys, urllib.request, urllib.error
real = sys.argv[1] + sys.argv[2]
base = os.environ["ANTHROPIC_BASE_URL"]
tok = os.environ["ANTHROPIC_API_KEY"]
def post(url, key, host=None):
    body = b'{"model":"claude-x","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
    req = urllib.request.Request(url + "/v1/messages", data=body, method="POST")
    req.add_header("x-api-key", key)
    req.add_header("anthropic-version", "2023-06-01")
    req.add_header("content-type", "application/json")
    if host:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
out = {}
out["ok"] = post(base, tok)
out["wrong"] = post(base, "sk-ant-guessed-wrong")[0]
out["other_host"] = post(base, tok, "api.other.test")[0]
out["other_token"] = post(base, os.environ["OTHER_TOKEN"])[0]
hits = [k for k, v in os.environ.items() if real in v]
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if real.encode() in open("/proc/%s/environ" % p, "rb").read():
                hits.append("/proc/%s/environ" % p)
        except OSError:
            pass
for d, _, files in os.walk(os.environ["HOME"]):
    for f in files:
        try:
            if real.encode() in open(os.path.join(d, f), "rb").read():
                hits.append(os.path.join(d, f))
        except OSError:
            pass
out["hits"] = hits
out["dummy"] = tok
out["other_base"] = os.environ["OTHER_BASE_URL"]
spool = os.environ["H5I_ENV_CAPTURE_SPOOL"]
with open(os.path.join(spool, "note.json"), "w") as f:
    json.dump({"kind": "note", "text": "the box held " + tok}, f)
print(json.dumps(out))
"#;

struct Upstreams {
    anthropic: TlsUpstream,
    other: TlsUpstream,
    _ca_dir: tempfile::TempDir,
    env: BTreeMap<&'static str, String>,
}

fn upstreams() -> Upstreams {
    let ca = TestCa::new();
    let anthropic = TlsUpstream::start(ca.server_config(&["api.anthropic.test"]), Answer::Json);
    let other = TlsUpstream::start(ca.server_config(&["api.other.test"]), Answer::Json);
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_file = ca_dir.path().join("ca.der");
    std::fs::write(&ca_file, &ca.ca_der).unwrap();
    let mut env = BTreeMap::new();
    env.insert("H5I_TEST_ANTHROPIC_KEY", REAL.to_string());
    env.insert("H5I_TEST_OTHER_KEY", REAL_OTHER.to_string());
    env.insert(
        "H5I_TEST_HOSTS",
        format!(
            "api.anthropic.test={},api.other.test={}",
            anthropic.addr, other.addr
        ),
    );
    env.insert("H5I_TEST_CA_FILE", ca_file.display().to_string());
    Upstreams {
        anthropic,
        other,
        _ca_dir: ca_dir,
        env,
    }
}

impl Upstreams {
    fn env(&self) -> Vec<(&str, &str)> {
        self.env.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }
}

fn ai_box(r: &Repo, name: &str, extra_env: &[(&str, &str)]) {
    r.write_policy(POLICY);
    let out = r.h5i_env(&["box", "create", name, "--profile", "ai"], extra_env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_box_reaches_the_upstream_through_the_proxy_and_never_holds_the_key() {
    let r = Repo::new();
    ai_box(&r, "ai", &[]);
    let up = upstreams();
    let (a, b) = REAL.split_at(12);
    let out = r.h5i_env(
        &["box", "run", "ai", "--", "python3", "-c", SCRIPT, a, b],
        &up.env(),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let seen: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();

    // The box's client got the upstream's answer.
    assert_eq!(seen["ok"][0], 200, "{seen}");
    assert_eq!(seen["ok"][1], r#"{"ok":true,"api":"anthropic"}"#);
    // A wrong key, another grant's host, and another grant's dummy are refused at the proxy.
    assert_eq!(seen["wrong"], 403, "{seen}");
    assert_eq!(seen["other_host"], 421, "{seen}");
    assert_eq!(seen["other_token"], 403, "{seen}");
    // The box holds only the dummy: nothing in its environment, /proc/*/environ or HOME.
    assert_eq!(seen["hits"], serde_json::json!([]), "{seen}");
    let dummy = seen["dummy"].as_str().unwrap().to_owned();
    assert!(dummy.starts_with("h5i-dummy-"), "{dummy}");
    assert!(seen["other_base"]
        .as_str()
        .unwrap()
        .starts_with("http://127.0.0.1:"));

    // The upstream saw exactly the one good request, with the real key and never the dummy.
    let got = up.anthropic.seen();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].header("x-api-key"), Some(REAL));
    assert_eq!(got[0].header("host"), Some("api.anthropic.test"));
    assert!(!got[0].all_text().contains(&dummy));
    assert!(!got[0].all_text().contains("guessed-wrong"));
    // The other grant's upstream was never reached through the first grant's URL.
    assert!(up.other.seen().is_empty());
    assert_eq!(up.other.connections(), 0);

    // The records and the box directory hold neither the real key nor the dummy.
    let dir = r.box_dir("ai");
    assert!(common::files_containing(&dir, REAL.as_bytes()).is_empty());
    assert!(common::files_containing(&dir, dummy.as_bytes()).is_empty());
    let recs = r.receipts("ai");
    let run = recs.iter().find(|x| x["kind"] == "run").unwrap();
    assert_eq!(
        run["egress"]["allowed"]["api.anthropic.test:443"], 1,
        "{run}"
    );
    assert_eq!(
        run["egress"]["denied"]["api.anthropic.test:443"], 3,
        "{run}"
    );
    assert_eq!(run["egress"]["allowed"]["api.other.test:443"], 0, "{run}");
    let claimed = recs.iter().find(|x| x["kind"] == "box-claimed").unwrap();
    assert!(
        claimed["claim"]["text"]
            .as_str()
            .unwrap()
            .contains("[REDACTED:credential-dummy:ANTHROPIC_API_KEY]"),
        "{claimed}"
    );
}

#[test]
fn an_unset_credential_fails_the_run_before_the_box_starts() {
    let r = Repo::new();
    ai_box(&r, "ai", &[]);
    let up = upstreams();
    let mut env = up.env();
    env.retain(|(k, _)| *k != "H5I_TEST_OTHER_KEY");
    let out = r.h5i_env(&["box", "run", "ai", "--", "touch", "ran"], &env);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("H5I_TEST_OTHER_KEY") && err.contains("to fix:"),
        "{err}"
    );
    assert!(!r.workspace("ai").join("ran").exists());
    assert!(r.receipts("ai").is_empty());
}

#[test]
fn a_half_set_test_seam_is_refused() {
    let r = Repo::new();
    ai_box(&r, "ai", &[]);
    let up = upstreams();
    let mut env = up.env();
    env.retain(|(k, _)| *k != "H5I_TEST_CA_FILE");
    let out = r.h5i_env(&["box", "run", "ai", "--", "touch", "ran"], &env);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("test seam"), "{}", stderr(&out));
    assert!(!r.workspace("ai").join("ran").exists());
}

#[test]
fn with_the_proxy_off_the_box_gets_the_real_credential_and_no_base_url() {
    let r = Repo::new();
    ai_box(&r, "ai", &[("H5I_CREDENTIAL_PROXY", "0")]);
    let env = [
        ("H5I_TEST_ANTHROPIC_KEY", REAL),
        ("H5I_TEST_OTHER_KEY", REAL_OTHER),
    ];
    let out = r.h5i_env(
        &[
            "box",
            "run",
            "ai",
            "--",
            "sh",
            "-c",
            "printf '%s|%s' \"$ANTHROPIC_API_KEY\" \"${ANTHROPIC_BASE_URL-unset}\"",
        ],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{REAL}|unset"));
}

/// `h5i ARGS` on a fresh pseudo-terminal (its stdin, stdout, stderr and controlling terminal),
/// so `box shell` takes its interactive path. Returns the exit code and everything shown.
/// Bounded: gives up (and kills h5i) after 60 s.
fn on_a_terminal(r: &Repo, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let (master, slave) = common::pty_pair();
    let mut cmd = std::process::Command::new(common::H5I);
    cmd.args(args)
        .current_dir(r.path())
        .env("TERM", "dumb")
        .env_remove("H5I_AGENT")
        .env_remove("H5I_DEFAULT_ISOLATION")
        .env_remove("H5I_CREDENTIAL_PROXY")
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave.try_clone().unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: only async-signal-safe calls (setsid, ioctl) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(slave);
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let read_ready = |ms: i32, seen: &mut Vec<u8>| -> bool {
        let mut p = libc::pollfd {
            fd: master.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        if unsafe { libc::poll(&mut p, 1, ms) } <= 0 || p.revents & libc::POLLIN == 0 {
            return false;
        }
        let mut buf = [0u8; 4096];
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::read(master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return false;
        }
        seen.extend_from_slice(&buf[..n as usize]);
        true
    };
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            while read_ready(0, &mut seen) {}
            break st.code().unwrap_or(-1);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "h5i {args:?} did not exit: {}",
                String::from_utf8_lossy(&seen)
            );
        }
        read_ready(100, &mut seen);
    };
    (code, String::from_utf8_lossy(&seen).into_owned())
}

#[test]
fn a_shell_session_reaches_the_upstream_through_the_proxy_and_never_holds_the_key() {
    let r = Repo::new();
    ai_box(&r, "ai", &[]);
    let up = upstreams();
    let (a, b) = REAL.split_at(12);
    let (code, shown) = on_a_terminal(
        &r,
        &["box", "shell", "ai", "--", "python3", "-c", SCRIPT, a, b],
        &up.env(),
    );
    assert_eq!(code, 0, "{shown}");
    let line = shown
        .lines()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in the session: {shown}"));
    let seen: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(seen["ok"][0], 200, "{seen}");
    assert_eq!(seen["wrong"], 403, "{seen}");
    assert_eq!(seen["other_host"], 421, "{seen}");
    assert_eq!(seen["other_token"], 403, "{seen}");
    assert_eq!(seen["hits"], serde_json::json!([]), "{seen}");
    let dummy = seen["dummy"].as_str().unwrap().to_owned();
    assert!(dummy.starts_with("h5i-dummy-"), "{dummy}");

    let got = up.anthropic.seen();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].header("x-api-key"), Some(REAL));
    assert!(!got[0].all_text().contains(&dummy));
    assert_eq!(up.other.connections(), 0);

    let dir = r.box_dir("ai");
    assert!(common::files_containing(&dir, REAL.as_bytes()).is_empty());
    assert!(common::files_containing(&dir, dummy.as_bytes()).is_empty());
    let recs = r.receipts("ai");
    let run = recs.iter().find(|x| x["kind"] == "run").unwrap();
    assert_eq!(
        run["egress"]["allowed"]["api.anthropic.test:443"], 1,
        "{run}"
    );
    assert_eq!(
        run["egress"]["denied"]["api.anthropic.test:443"], 3,
        "{run}"
    );
}

#[test]
fn a_shell_session_with_an_unset_credential_is_refused_before_the_box_starts() {
    let r = Repo::new();
    ai_box(&r, "ai", &[]);
    let up = upstreams();
    let mut env = up.env();
    env.retain(|(k, _)| *k != "H5I_TEST_ANTHROPIC_KEY");
    let (code, shown) = on_a_terminal(&r, &["box", "shell", "ai", "--", "touch", "ran"], &env);
    assert_ne!(code, 0, "{shown}");
    assert!(
        shown.contains("H5I_TEST_ANTHROPIC_KEY") && shown.contains("to fix:"),
        "{shown}"
    );
    assert!(!r.workspace("ai").join("ran").exists());
    assert!(r.receipts("ai").is_empty());
}

/// The box port the service test's server listens on (in the box's own namespace).
const SERVICE_PORT: u16 = 8766;

/// A service in the box: an HTTP server that, for every GET, calls the upstream through the
/// credential proxy with its dummy and with a wrong one, looks for the real key everywhere it
/// can read, and answers with what it saw. The real key is in this file only in two halves.
fn service_script() -> String {
    let (a, b) = REAL.split_at(12);
    format!(
        r#"import http.server, json, os, urllib.request, urllib.error
real = "{a}" + "{b}"
def post(key):
    req = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
        data=b'{{"model":"claude-x","max_tokens":8,"messages":[]}}', method="POST")
    req.add_header("x-api-key", key)
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
def hits():
    out = [k for k, v in os.environ.items() if real in v]
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if real.encode() in open("/proc/%s/environ" % p, "rb").read():
                    out.append(p)
            except OSError:
                pass
    return out
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        tok = os.environ["ANTHROPIC_API_KEY"]
        body = json.dumps({{"ok": post(tok), "wrong": post("sk-ant-guessed-wrong"),
            "hits": hits(), "dummy": tok}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", {SERVICE_PORT}), H).serve_forever()
"#
    )
}

/// One GET on the host's loopback `port`, retried while the service starts (at most 100
/// tries, 50 ms apart); the response body.
fn get_json(port: u16) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut last = String::new();
    for _ in 0..100 {
        let attempt = (|| -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                std::time::Duration::from_secs(2),
            )?;
            s.set_read_timeout(Some(std::time::Duration::from_secs(40)))?;
            s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        })();
        match attempt {
            Ok(t) if t.starts_with("HTTP/") => {
                let body = t.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
                return serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {t}"));
            }
            Ok(t) => last = t,
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("127.0.0.1:{port} never answered: {last}");
}

#[test]
fn a_service_reaches_the_upstream_through_a_proxy_that_lives_as_long_as_its_supervisor() {
    let r = Repo::new();
    r.write_policy(&format!(
        "{POLICY}\n[service.api]\ncommand = \"exec python3 svc.py\"\nport = {SERVICE_PORT}\n"
    ));
    std::fs::write(r.path().join("svc.py"), service_script()).unwrap();
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", "svc"]);
    let out = r.h5i(&["box", "create", "ai", "--profile", "ai"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let up = upstreams();
    let out = r.h5i_env(&["box", "service", "start", "ai", "api"], &up.env());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // `service start` has exited: whatever answers now is served by the supervisor.
    let ports = r.ok(&["box", "ports", "ai"]);
    let port: u16 = ports
        .lines()
        .find_map(|l| {
            let (host, rest) = l.split_once(" -> ")?;
            (rest.split_whitespace().next()? == SERVICE_PORT.to_string())
                .then(|| host.strip_prefix("127.0.0.1:")?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no host port for {SERVICE_PORT}: {ports}"));
    let first = get_json(port);
    // A run of the box in between, then the service again: its proxy still serves.
    let out = r.h5i_env(&["box", "run", "ai", "--", "true"], &up.env());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let second = get_json(port);
    for seen in [&first, &second] {
        assert_eq!(seen["ok"], 200, "{seen}");
        assert_eq!(seen["wrong"], 403, "{seen}");
        assert_eq!(seen["hits"], serde_json::json!([]), "{seen}");
    }
    let dummy = first["dummy"].as_str().unwrap().to_owned();
    assert!(dummy.starts_with("h5i-dummy-"), "{dummy}");

    let got = up.anthropic.seen();
    assert_eq!(got.len(), 2, "{got:?}");
    for g in &got {
        assert_eq!(g.header("x-api-key"), Some(REAL));
        assert!(!g.all_text().contains(&dummy));
    }

    let stopped = r.ok(&["box", "service", "stop", "ai", "api"]);
    assert!(stopped.contains("exit"), "{stopped}");
    let recs = r.receipts("ai");
    let svc = recs
        .iter()
        .find(|x| x["kind"] == "run" && x["argv"][2] == "exec python3 svc.py")
        .unwrap_or_else(|| panic!("no service record: {recs:?}"));
    assert_eq!(
        svc["egress"]["allowed"]["api.anthropic.test:443"], 2,
        "{svc}"
    );
    assert_eq!(
        svc["egress"]["denied"]["api.anthropic.test:443"], 2,
        "{svc}"
    );
    let dir = r.box_dir("ai");
    assert!(common::files_containing(&dir, REAL.as_bytes()).is_empty());
    assert!(common::files_containing(&dir, dummy.as_bytes()).is_empty());
}

/// Runs inside the box for the warm-path rows: one request through the proxy with the run's
/// dummy, a dial to the previous run's proxy port (argv[1], 0 for none), and what the run sees
/// of its network namespace and dummy.
const WARM_SCRIPT: &str = r#"
import json, os, socket, sys, urllib.request
base = os.environ["ANTHROPIC_BASE_URL"]
tok = os.environ["ANTHROPIC_API_KEY"]
req = urllib.request.Request(base + "/v1/messages", data=b"{}", method="POST")
req.add_header("x-api-key", tok)
req.add_header("content-type", "application/json")
with urllib.request.urlopen(req, timeout=30) as r:
    status = r.status
old = int(sys.argv[1])
earlier = "none"
if old:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", old))
        earlier = "connected"
    except ConnectionRefusedError:
        earlier = "refused"
    except OSError as e:
        earlier = "error %s" % e
print(json.dumps({"netns": os.readlink("/proc/self/ns/net"), "dummy": tok, "status": status,
                  "port": int(base.rsplit(":", 1)[1]), "earlier": earlier}))
"#;

/// A caller of root or h5i-test (`as_user`) with `up`'s variables, and its box `name` of
/// [`POLICY`]'s profile `ai` at `tier`.
fn ai_box_as(up: &Upstreams, tier: &str, as_user: bool, name: &str) -> common::Caller {
    let mut c = common::Caller::either(as_user);
    if as_user {
        // The CA file's directory is the test's own (0700): the test user reads it too.
        use std::os::unix::fs::PermissionsExt;
        let dir = std::path::Path::new(&up.env["H5I_TEST_CA_FILE"])
            .parent()
            .unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for (k, v) in up.env() {
        c = c.with_env(k, v);
    }
    c.write(
        ".h5i/env.toml",
        POLICY.replace("\"process\"", &format!("\"{tier}\"")),
    );
    c.commit_all("ai");
    c.ok(&["box", "create", name, "--profile", "ai"]);
    c
}

/// A run with credential grants goes through the box's sandbox (issue 21), and keeps what a
/// container per run gave it: two runs share the sandbox (the same init, the same network
/// namespace), each has a dummy of its own, the proxy of the first run is gone when the second
/// runs (its port refuses), and each receipt counts that run's requests alone.
fn credential_runs_go_through_the_sandbox(test: &str, tier: &str, as_user: bool) {
    if !common::require_root(test, "cgroups of h5i's own, and switching to h5i-test") {
        return;
    }
    let up = upstreams();
    let c = ai_box_as(&up, tier, as_user, "ai");
    let mut seen = Vec::new();
    let mut sandboxes = Vec::new();
    let mut earlier_port = 0u16;
    for _ in 0..2 {
        let out = c.h5i(&[
            "box",
            "run",
            "ai",
            "--",
            "python3",
            "-c",
            WARM_SCRIPT,
            &earlier_port.to_string(),
        ]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{} at {tier}: {}\n{}",
            c.who(),
            stdout(&out),
            stderr(&out)
        );
        let run: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        earlier_port = run["port"].as_u64().unwrap() as u16;
        sandboxes.push(common::sandbox::id(&c, "ai"));
        seen.push(run);
    }
    let who = c.who();
    assert!(
        sandboxes[0].is_some(),
        "{who} at {tier}: no sandbox after a credential run"
    );
    assert_eq!(
        sandboxes[0], sandboxes[1],
        "{who} at {tier}: the sandbox was remade"
    );
    assert_eq!(
        seen[0]["netns"], seen[1]["netns"],
        "{who} at {tier}: {seen:?}"
    );
    for run in &seen {
        assert_eq!(run["status"], 200, "{who} at {tier}: {run}");
        assert!(
            run["dummy"].as_str().unwrap().starts_with("h5i-dummy-"),
            "{run}"
        );
    }
    assert_ne!(
        seen[0]["dummy"], seen[1]["dummy"],
        "{who} at {tier}: one dummy for two runs"
    );
    assert_eq!(seen[1]["earlier"], "refused", "{who} at {tier}: {seen:?}");
    let got = up.anthropic.seen();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(|g| g.header("x-api-key") == Some(REAL)));
    let runs: Vec<_> = c
        .receipts("ai")
        .into_iter()
        .filter(|x| x["kind"] == "run")
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    for run in &runs {
        assert_eq!(
            run["egress"]["allowed"]["api.anthropic.test:443"], 1,
            "{who} at {tier}: {run}"
        );
    }
    let dir = c.box_dir("ai");
    assert!(common::files_containing(&dir, REAL.as_bytes()).is_empty());
}

#[test]
fn process_tier_credential_runs_share_the_box_sandbox_and_each_has_its_own_proxy() {
    credential_runs_go_through_the_sandbox(
        "process_tier_credential_runs_share_the_box_sandbox_and_each_has_its_own_proxy",
        "process",
        false,
    );
}

#[test]
fn process_tier_credential_runs_share_the_box_sandbox_and_each_has_its_own_proxy_as_h5i_test() {
    credential_runs_go_through_the_sandbox(
        "process_tier_credential_runs_share_the_box_sandbox_and_each_has_its_own_proxy_as_h5i_test",
        "process",
        true,
    );
}

#[test]
fn supervised_credential_runs_share_the_box_sandbox_and_each_has_its_own_proxy() {
    credential_runs_go_through_the_sandbox(
        "supervised_credential_runs_share_the_box_sandbox_and_each_has_its_own_proxy",
        "supervised",
        false,
    );
}

#[test]
fn supervised_credential_runs_share_the_box_sandbox_and_each_has_its_own_proxy_as_h5i_test() {
    credential_runs_go_through_the_sandbox(
        "supervised_credential_runs_share_the_box_sandbox_and_each_has_its_own_proxy_as_h5i_test",
        "supervised",
        true,
    );
}

/// Runs inside the box for the grant-change rows: for each grant of [`POLICY`], whether the run
/// was handed it and the answer of its proxy to the run's dummy; and a dial to an earlier run's
/// proxy port (argv[1], 0 for none).
const GRANT_SCRIPT: &str = r#"
import json, os, socket, sys, urllib.error, urllib.request
out = {"netns": os.readlink("/proc/self/ns/net")}
for name, base_var, tok_var in [("anthropic", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
                                ("other", "OTHER_BASE_URL", "OTHER_TOKEN")]:
    base = os.environ.get(base_var)
    if base is None:
        out[name] = None
        continue
    req = urllib.request.Request(base + "/v1/messages", data=b"{}", method="POST")
    req.add_header("x-api-key", os.environ[tok_var])
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    out[name] = {"status": status, "port": int(base.rsplit(":", 1)[1])}
old = int(sys.argv[1])
if old:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", old))
        out["earlier"] = "connected"
    except ConnectionRefusedError:
        out["earlier"] = "refused"
    except OSError as e:
        out["earlier"] = "error %s" % e
print(json.dumps(out))
"#;

/// Box `name`'s stored policy with its credential grants replaced by `keep(grants)`, written
/// the way h5i writes a box's policy (the canonical text, its digest beside it and in the
/// manifest), so that h5i loads it as the box's policy from its next run on.
fn change_grants(
    c: &common::Caller,
    name: &str,
    keep: impl FnOnce(Vec<h5i_policy::AuthGrant>) -> Vec<h5i_policy::AuthGrant>,
) {
    let dir = c.box_dir(name);
    let text = std::fs::read_to_string(dir.join("policy.resolved.toml")).unwrap();
    let digest = std::fs::read_to_string(dir.join("policy.digest")).unwrap();
    let mut policy = h5i_policy::ResolvedPolicy::load_verified(&text, &digest).unwrap();
    policy.auth = keep(std::mem::take(&mut policy.auth));
    let new_digest = policy.digest().to_string();
    assert_ne!(new_digest, digest.trim(), "the grants did not change");
    // Written in place: the files keep their owner (the test user's box stays the test user's).
    std::fs::write(dir.join("policy.resolved.toml"), policy.to_canonical_toml()).unwrap();
    std::fs::write(dir.join("policy.digest"), format!("{new_digest}\n")).unwrap();
    let mut manifest = c.manifest(name);
    manifest["policy_digest"] = serde_json::Value::String(new_digest);
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
}

/// A changed credential grant rebuilds the box's sandbox though it changes none of the
/// sandbox's config (a grant is wired per run): box `g` granted only `api.anthropic.test` runs
/// once in its sandbox; its stored policy then grants only `api.other.test`; the next run is
/// served by a new sandbox (a new init, the old one gone), is handed the new grant and not the
/// old, its proxy answers its dummy, and the first run's proxy port refuses a dial.
fn changed_grant_rebuilds(test: &str, tier: &str, as_user: bool) {
    if !common::require_root(test, "cgroups of h5i's own, and switching to h5i-test") {
        return;
    }
    let up = upstreams();
    let c = ai_box_as(&up, tier, as_user, "g");
    change_grants(&c, "g", |grants| {
        grants
            .into_iter()
            .filter(|g| g.host == "api.anthropic.test")
            .collect()
    });
    let who = format!("{} at {tier}", c.who());
    let run = |earlier: u16| {
        let out = c.h5i(&[
            "box",
            "run",
            "g",
            "--",
            "python3",
            "-c",
            GRANT_SCRIPT,
            &earlier.to_string(),
        ]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who}: {}\n{}",
            stdout(&out),
            stderr(&out)
        );
        serde_json::from_str::<serde_json::Value>(stdout(&out).trim()).unwrap()
    };
    let first = run(0);
    assert_eq!(first["anthropic"]["status"], 200, "{who}: {first}");
    assert_eq!(first["other"], serde_json::Value::Null, "{who}: {first}");
    let before = common::sandbox::Held::now(&c, "g");

    change_grants(&c, "g", |grants| {
        let mut other = grants[0].clone();
        other.host = "api.other.test".into();
        other.credential_env = "H5I_TEST_OTHER_KEY".into();
        other.base_url_var = "OTHER_BASE_URL".into();
        other.token_var = "OTHER_TOKEN".into();
        vec![other]
    });
    let old_port = first["anthropic"]["port"].as_u64().unwrap() as u16;
    let second = run(old_port);
    let after = common::sandbox::Held::now(&c, "g");
    assert_ne!(
        after.init, before.init,
        "{who}: the sandbox was not rebuilt for the changed grant"
    );
    // The new sandbox has the box's sandbox directory (it is named after the box): the rest of
    // the old one is gone.
    let left: Vec<String> = before
        .left()
        .into_iter()
        .filter(|l| !l.starts_with("directory "))
        .collect();
    assert!(
        left.is_empty(),
        "{who}: the old sandbox left {left:?} behind"
    );
    assert_ne!(second["netns"], first["netns"], "{who}: {second}");
    assert_eq!(
        second["anthropic"],
        serde_json::Value::Null,
        "{who}: {second}"
    );
    assert_eq!(second["other"]["status"], 200, "{who}: {second}");
    assert_eq!(second["earlier"], "refused", "{who}: {second}");
    // Each upstream saw its own grant's run once, with its own real key.
    let anthropic = up.anthropic.seen();
    assert_eq!(anthropic.len(), 1, "{who}: {anthropic:?}");
    assert_eq!(anthropic[0].header("x-api-key"), Some(REAL));
    let other = up.other.seen();
    assert_eq!(other.len(), 1, "{who}: {other:?}");
    assert_eq!(other[0].header("x-api-key"), Some(REAL_OTHER));
    c.ok(&["box", "rm", "--force", "g"]);
}

#[test]
fn a_changed_credential_grant_rebuilds_the_process_sandbox_and_the_next_run_gets_only_the_new_grant(
) {
    changed_grant_rebuilds(
        "a_changed_credential_grant_rebuilds_the_process_sandbox_and_the_next_run_gets_only_the_new_grant",
        "process",
        false,
    );
}

#[test]
fn a_changed_credential_grant_rebuilds_the_process_sandbox_and_the_next_run_gets_only_the_new_grant_as_h5i_test(
) {
    changed_grant_rebuilds(
        "a_changed_credential_grant_rebuilds_the_process_sandbox_and_the_next_run_gets_only_the_new_grant_as_h5i_test",
        "process",
        true,
    );
}

#[test]
fn a_changed_credential_grant_rebuilds_the_supervised_sandbox_and_the_next_run_gets_only_the_new_grant(
) {
    changed_grant_rebuilds(
        "a_changed_credential_grant_rebuilds_the_supervised_sandbox_and_the_next_run_gets_only_the_new_grant",
        "supervised",
        false,
    );
}

#[test]
fn a_changed_credential_grant_rebuilds_the_supervised_sandbox_and_the_next_run_gets_only_the_new_grant_as_h5i_test(
) {
    changed_grant_rebuilds(
        "a_changed_credential_grant_rebuilds_the_supervised_sandbox_and_the_next_run_gets_only_the_new_grant_as_h5i_test",
        "supervised",
        true,
    );
}
