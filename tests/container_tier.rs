//! The container tier, asserted from inside real rootless Podman containers: exit codes pass
//! through; `/work` writes land in the workspace and in `box diff` and `box export`; the image
//! root is read-only and the box holds no capability; the only way out of the box's own
//! network namespace is the egress proxy on its loopback, which reaches the allowed test host
//! and refuses (and counts) the other; the credential proxy serves a container box; mem and
//! procs hold and an OOM kill is reported; no Podman socket is in the box; `socket(AF_UNIX)` is
//! refused with EPERM unless `net.unix` allows it (h5i-runc's deny list, from the
//! `h5i.net.unix` annotation); `status` shows the spec Podman handed the runtime and that it
//! matches.
//!
//! Run as root (CI), h5i runs rootless Podman as the test user (`H5I_CONTAINER_USER=h5i-test`,
//! made by `make setup`), with the box's paths attached in that user's mount namespace; one
//! test runs h5i itself as the test user. The image is the registry-free
//! `localhost/h5i-busybox` (scripts/make-test-image.sh). Every destination is one of this
//! test's own hosts (tests/common/testnet.rs) or loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::testnet::TestHosts;
use common::{stderr, stdout, Repo};

const IMAGE: &str = "localhost/h5i-busybox:latest";
const USER: &str = "h5i-test";

/// Root, the test user and its image, or a loud skip.
fn ready(test: &str) -> bool {
    if !common::require_root(
        test,
        &format!("h5i runs rootless Podman as {USER} for root"),
    ) {
        return false;
    }
    common::caller::container_image();
    true
}

/// `podman ARGS` as the engine user (in its own home, where its storage is).
fn podman_as_user(args: &[&str]) -> Output {
    common::as_user(USER, None)
        .arg("podman")
        .args(args)
        .current_dir("/")
        .output()
        .unwrap()
}

/// h5i with the engine user named.
fn h5i(r: &Repo, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec![("H5I_CONTAINER_USER", USER), ("H5I_NO_PROBE_CACHE", "1")];
    all.extend_from_slice(env);
    r.h5i_env(args, &all)
}

fn create(r: &Repo, name: &str, profile: &str, env: &[(&str, &str)]) {
    let out = h5i(r, &["box", "create", name, "--profile", profile], env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

fn policy(extra: &str) -> String {
    format!("[profile.c]\nisolation = \"container\"\n[profile.c.container]\nimage = \"{IMAGE}\"\n{extra}")
}

fn run(r: &Repo, name: &str, argv: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec!["box", "run", name, "--"];
    args.extend_from_slice(argv);
    h5i(r, &args, env)
}

#[test]
fn the_exit_code_passes_through_and_work_writes_land_in_the_workspace() {
    if !ready("the_exit_code_passes_through_and_work_writes_land_in_the_workspace") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy(""));
    create(&r, "c", "c", &[]);
    let out = run(
        &r,
        "c",
        &[
            "sh",
            "-c",
            "pwd; echo made-in-box > made.txt; echo more >> README.md; exit 7",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(stdout(&out), "/work\n");
    let ws = r.workspace("c");
    assert_eq!(
        std::fs::read_to_string(ws.join("made.txt")).unwrap(),
        "made-in-box\n"
    );
    // Root made the box: what the box wrote is the box range's on disk (h5i-box), like the
    // rest of the workspace, never root's.
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(ws.join("made.txt")).unwrap().uid();
    assert_ne!(owner, 0);
    assert_eq!(owner, std::fs::metadata(&ws).unwrap().uid());
    let diff = h5i(&r, &["box", "diff", "c"], &[]);
    let diff = stdout(&diff);
    assert!(
        diff.contains("+made-in-box") && diff.contains("+more"),
        "{diff}"
    );
    let rec = r.last_run("c");
    assert_eq!(rec["tier"], "container");
    assert_eq!(rec["exit"]["code"], 7);
    // The run left no container, run directory or cgroup behind.
    let ps = podman_as_user(&["ps", "-a", "--format", "{{.Names}}"]);
    assert!(!stdout(&ps).contains("h5i-c-"), "{}", stdout(&ps));
}

#[test]
fn the_image_root_is_read_only_and_the_box_holds_no_capability() {
    if !ready("the_image_root_is_read_only_and_the_box_holds_no_capability") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy(""));
    create(&r, "ro", "c", &[]);
    let out = run(
        &r,
        "ro",
        &[
            "sh",
            "-c",
            "touch /etc/h5i-x 2>&1; touch /usr/h5i-x 2>&1; touch /tmp/ok && echo tmp=ok; \
             grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status; \
             mount | grep ' /tmp '",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.matches("Read-only file system").count(), 2, "{text}");
    assert!(text.contains("tmp=ok"), "{text}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            text.contains(&format!("{set}:\t0000000000000000")),
            "{set} is not empty:\n{text}"
        );
    }
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    let tmp = text.lines().find(|l| l.contains(" /tmp ")).unwrap();
    assert!(
        tmp.contains("tmpfs")
            && tmp.contains("nosuid")
            && tmp.contains("nodev")
            && tmp.contains("size=1048576k"),
        "{tmp}"
    );
}

#[test]
fn no_podman_socket_and_no_host_path_but_the_workspace_is_in_the_box() {
    if !ready("no_podman_socket_and_no_host_path_but_the_workspace_is_in_the_box") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy(""));
    create(&r, "sock", "c", &[]);
    let out = run(
        &r,
        "sock",
        &[
            "sh",
            "-c",
            "for p in /var/run/podman /run/podman /run/user /var/run/docker.sock /run/docker.sock; do \
               test -e $p && echo present:$p; done; \
             find / -xdev -type s 2>/dev/null; \
             cat /proc/self/mountinfo | awk '{print $5}'",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(!text.contains("present:"), "{text}");
    assert!(!text.contains(".sock"), "{text}");
    // Binds from the host: /work, the spool, the object store the workspace borrows (ro) at
    // its in-box place, never at the store's host path.
    for want in ["/work", "/.h5i/spool", "/.h5i/objects"] {
        assert!(
            text.lines().any(|l| l == want),
            "{want} not mounted:\n{text}"
        );
    }
    let host = r.path().display().to_string();
    assert!(!text.lines().any(|l| l.starts_with(&host)), "{text}");
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("/home") || l.starts_with("/root")),
        "{text}"
    );
}

#[test]
fn the_host_loopback_is_unreachable_except_the_proxy_endpoint() {
    if !ready("the_host_loopback_is_unreachable_except_the_proxy_endpoint") {
        return;
    }
    let mut hosts = TestHosts::up(
        "the_host_loopback_is_unreachable_except_the_proxy_endpoint",
        &[8443],
        &[],
    )
    .unwrap();
    let r = Repo::new();
    r.write_policy(&policy(
        "[profile.c.net]\negress = [\"allowed.test:8443\"]\n",
    ));
    let pin = hosts.pin(&[("allowed.test", hosts.first)]);
    create(&r, "lo", "c", &[("H5I_TEST_HOSTS", &pin)]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let first = hosts.first.to_string();
    let out = run(
        &r,
        "lo",
        &[
            "sh",
            "-c",
            "nc -w 3 127.0.0.1 $1 </dev/null 2>&1; echo host-lo-rc=$?; \
             nc -w 3 $2 8443 </dev/null 2>&1; echo direct-rc=$?; \
             printf 'GET http://allowed.test:8443/ HTTP/1.1\r\nHost: allowed.test:8443\r\n\r\n' \
               | nc -w 3 127.0.0.1 3128 | head -c 12; echo; echo proxy-rc=$?; \
             ip -o link | cut -d: -f2",
            "sh",
            &port,
            &first,
        ],
        &[("H5I_TEST_HOSTS", &pin)],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    // The box's 127.0.0.1 is its own: the host's listener is refused and never accepts.
    assert!(text.contains("Connection refused"), "{text}");
    assert!(text.contains("host-lo-rc=1"), "{text}");
    assert!(
        listener.accept().is_err(),
        "the host listener accepted a box connection"
    );
    // No route anywhere but the proxy.
    assert!(text.contains("Network is unreachable"), "{text}");
    // The proxy endpoint answers (the greeter speaks no HTTP: a 502 from the proxy itself).
    assert!(text.contains("HTTP/1.1"), "{text}");
    let links: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains('=') && !l.contains("nc:") && !l.contains("HTTP/"))
        .map(str::trim)
        .collect();
    assert_eq!(links, ["lo"], "{text}");
    // The test host saw the proxy's one connection, never the box's direct attempt.
    assert_eq!(hosts.log(), [format!("tcp {}:8443", hosts.first)]);
}

#[test]
fn egress_reaches_the_allowed_test_host_and_refuses_and_counts_the_other() {
    if !ready("egress_reaches_the_allowed_test_host_and_refuses_and_counts_the_other") {
        return;
    }
    let mut hosts = TestHosts::up(
        "egress_reaches_the_allowed_test_host_and_refuses_and_counts_the_other",
        &[8443],
        &[],
    )
    .unwrap();
    let r = Repo::new();
    r.write_policy(&policy(
        "[profile.c.net]\negress = [\"allowed.test:8443\"]\n",
    ));
    let pin = hosts.pin(&[("allowed.test", hosts.first), ("denied.test", hosts.second)]);
    create(&r, "eg", "c", &[("H5I_TEST_HOSTS", &pin)]);
    // CONNECT through the proxy on the box's loopback, by name, as any client would.
    let connect = |host: &str| {
        format!(
            "printf 'CONNECT {host}:8443 HTTP/1.1\\r\\nHost: {host}:8443\\r\\n\\r\\n' | nc -w 5 127.0.0.1 3128 | head -c 300; echo"
        )
    };
    let script = format!(
        "echo proxy=$HTTPS_PROXY; {}; echo ---; {}",
        connect("allowed.test"),
        connect("denied.test"),
    );
    let out = run(
        &r,
        "eg",
        &["sh", "-c", &script],
        &[("H5I_TEST_HOSTS", &pin)],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("proxy=http://127.0.0.1:3128"), "{text}");
    let (allowed, denied) = text.split_once("---").unwrap();
    assert!(allowed.contains("200"), "{allowed}");
    assert!(
        allowed.contains(&format!("hello {}:8443", hosts.first)),
        "{allowed}"
    );
    assert!(denied.contains("403"), "{denied}");
    assert!(!denied.contains("hello"), "{denied}");
    // The allowed host was reached once; the other never.
    assert_eq!(hosts.log(), [format!("tcp {}:8443", hosts.first)]);
    let rec = r.last_run("eg");
    assert_eq!(rec["egress"]["allowed"]["allowed.test:8443"], 1, "{rec}");
    assert_eq!(rec["egress"]["denied"]["denied.test:8443"], 1, "{rec}");
}

#[test]
fn the_credential_proxy_serves_a_container_box_that_never_holds_the_key() {
    if !ready("the_credential_proxy_serves_a_container_box_that_never_holds_the_key") {
        return;
    }
    const REAL: &str = "sk-ant-REAL-container-host-only-77c1";
    let ca = support::TestCa::new();
    let upstream = support::TlsUpstream::start(
        ca.server_config(&["api.anthropic.test"]),
        support::Answer::Json,
    );
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_file = ca_dir.path().join("ca.der");
    std::fs::write(&ca_file, &ca.ca_der).unwrap();
    let hosts = format!("api.anthropic.test={}", upstream.addr);
    let env = [
        ("H5I_TEST_HOSTS", hosts.as_str()),
        ("H5I_TEST_CA_FILE", ca_file.to_str().unwrap()),
        ("H5I_TEST_ANTHROPIC_KEY", REAL),
    ];
    let r = Repo::new();
    r.write_policy(&policy(
        "[[profile.c.auth]]\nhost = \"api.anthropic.test\"\ncredential_env = \"H5I_TEST_ANTHROPIC_KEY\"\n\
         base_url_var = \"ANTHROPIC_BASE_URL\"\ntoken_var = \"ANTHROPIC_API_KEY\"\n",
    ));
    create(&r, "ai", "c", &[]);
    let (a, b) = REAL.split_at(10);
    let script = r#"
        post() { wget -q -O- --header "x-api-key: $1" --header 'anthropic-version: 2023-06-01' \
                 --header 'content-type: application/json' \
                 --post-data '{"model":"claude-x","max_tokens":8,"messages":[]}' \
                 "$ANTHROPIC_BASE_URL/v1/messages" 2>&1; }
        echo "ok=$(post "$ANTHROPIC_API_KEY")"
        echo "wrong=$(post sk-ant-guessed-wrong)"
        echo "dummy=$ANTHROPIC_API_KEY"
        echo "hits=$(cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c "$1$2")"
    "#;
    let out = run(&r, "ai", &["sh", "-c", script, "sh", a, b], &env);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(
        text.contains(r#"ok={"ok":true,"api":"anthropic"}"#),
        "{text}"
    );
    assert!(text.contains("wrong=") && text.contains("403"), "{text}");
    assert!(text.contains("hits=0"), "{text}");
    let dummy = text
        .lines()
        .find_map(|l| l.strip_prefix("dummy="))
        .unwrap()
        .to_owned();
    assert!(dummy.starts_with("h5i-dummy-"), "{dummy}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].header("x-api-key"), Some(REAL));
    assert!(!seen[0].all_text().contains(&dummy));
    let dir = r.box_dir("ai");
    assert!(common::files_containing(&dir, REAL.as_bytes()).is_empty());
    assert!(common::files_containing(&dir, dummy.as_bytes()).is_empty());
    let rec = r.last_run("ai");
    assert_eq!(
        rec["egress"]["allowed"]["api.anthropic.test:443"], 1,
        "{rec}"
    );
}

#[test]
fn mem_and_procs_hold_and_an_oom_kill_is_reported() {
    if !ready("mem_and_procs_hold_and_an_oom_kill_is_reported") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy(
        "[profile.c.resources]\nmem = \"64M\"\nprocs = 16\n",
    ));
    create(&r, "lim", "c", &[]);
    // procs: the 17th task cannot be made.
    let out = run(
        &r,
        "lim",
        &[
            "sh",
            "-c",
            "for i in $(seq 40); do sleep 5 & done 2>&1; wait",
        ],
        &[],
    );
    assert!(
        stdout(&out).contains("can't fork") || stderr(&out).contains("can't fork"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // mem: a 200 MB string in a 64 MiB cage is OOM-killed; Podman's flag misses a v1 OOM, the
    // cage's count does not.
    let out = run(
        &r,
        "lim",
        &[
            "sh",
            "-c",
            "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    let rec = r.last_run("lim");
    assert_eq!(rec["exit"]["oom_killed"], true, "{rec}");
    assert!(rec["oom"]["kill_count"].as_u64().unwrap() >= 1, "{rec}");
    assert_eq!(rec["oom"]["limit_bytes"], 64 << 20, "{rec}");
    // status calls both held (no `*`), and the evidence names the cage.
    let status = stdout(&h5i(&r, &["box", "status", "lim"], &[]));
    let line = |k: &str| {
        status
            .lines()
            .find(|l| l.trim_start().starts_with(k))
            .unwrap()
            .to_owned()
    };
    assert!(
        !line("mem").contains('*') && !line("procs").contains('*'),
        "{status}"
    );
    assert!(status.contains("mem and procs held there"), "{status}");
}

#[test]
fn the_wall_clock_ends_a_container_run_with_124() {
    if !ready("the_wall_clock_ends_a_container_run_with_124") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy("[profile.c.resources]\nwall = \"2s\"\n"));
    create(&r, "wall", "c", &[]);
    let out = run(&r, "wall", &["sleep", "600"], &[]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert_eq!(r.last_run("wall")["exit"]["timed_out"], true);
}

/// The box's command is not its pid 1 (catatonit is), so a signal it has no handler for ends
/// it as it would outside: busybox `timeout` signals the command it watches, which as pid 1 of
/// the box's pid namespace would ignore SIGTERM and run forever. And what a hostile command
/// tries against that init, as root's box and as the test user's: the init program h5i binds
/// in (`/run/podman-init`) cannot be written or replaced (read-only bind), so nothing the box
/// does survives into the next run's pid 1.
fn the_init_is_read_only_and_forwards_signals(test: &str, as_user: bool) {
    if !ready(test) {
        return;
    }
    let mut c = common::caller::Caller::either(as_user);
    c.create_container("init", common::caller::container_image());
    let sh = |script: &str| c.h5i(&["box", "run", "init", "--", "sh", "-c", script]);
    let pid = sh("echo $$");
    assert_eq!(pid.status.code(), Some(0), "{}", stderr(&pid));
    assert_ne!(stdout(&pid).trim(), "1", "the command is the box's pid 1");
    let out = sh(
        "echo x > /run/podman-init; echo write=$?; rm -f /run/podman-init; echo rm=$?; \
         ln -sf /bin/sh /run/podman-init; echo ln=$?",
    );
    let text = stdout(&out);
    for what in ["write", "rm", "ln"] {
        assert!(
            text.contains(&format!("{what}=")) && !text.contains(&format!("{what}=0")),
            "{}: {what} over the init went through: {text}{}",
            c.who(),
            stderr(&out)
        );
    }
    let sig = sh("exec timeout 2 sh -c 'while :; do :; done'");
    assert_eq!(
        sig.status.code(),
        Some(128 + libc::SIGTERM),
        "{}: {}",
        c.who(),
        stderr(&sig)
    );
    let status = c.ok(&["box", "status", "init"]);
    assert!(
        status.contains("matches the policy: yes"),
        "{}: {status}",
        c.who()
    );
}

#[test]
fn a_box_cannot_replace_its_init_and_its_signals_still_arrive_as_root() {
    the_init_is_read_only_and_forwards_signals("a_box_cannot_replace_its_init_..._as_root", false);
}

#[test]
fn a_box_cannot_replace_its_init_and_its_signals_still_arrive_as_the_test_user() {
    the_init_is_read_only_and_forwards_signals(
        "a_box_cannot_replace_its_init_..._as_the_test_user",
        true,
    );
}

/// SIGTERM to `h5i box run` (a CI job's cancel, `timeout`, systemd stopping a unit) reaches the
/// command in a container box, which ends; h5i exits as the command did.
#[test]
fn sigterm_to_h5i_box_run_ends_a_container_run() {
    if !ready("sigterm_to_h5i_box_run_ends_a_container_run") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy(""));
    create(&r, "term", "c", &[]);
    let mut child = Command::new(common::H5I)
        .args(["box", "run", "term", "--", "sh", "-c"])
        .arg("echo up; while :; do sleep 1; done")
        .current_dir(r.path())
        .env("H5I_CONTAINER_USER", USER)
        .env("H5I_NO_PROBE_CACHE", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "up\n");
    // SAFETY: kill(2) of this test's own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = common::wait_bounded(child, std::time::Duration::from_secs(60), "h5i box run");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    assert!(
        podman_as_user(&["ps", "-a", "--format", "{{.Names}}"])
            .stdout
            .split(|b| *b == b'\n')
            .all(|n| !n.starts_with(b"h5i-term-")),
        "the container outlived the run"
    );
}

#[test]
fn status_shows_the_spec_podman_handed_the_runtime_and_that_it_matches() {
    if !ready("status_shows_the_spec_podman_handed_the_runtime_and_that_it_matches") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy(""));
    create(&r, "ev", "c", &[]);
    let before = stdout(&h5i(&r, &["box", "status", "ev"], &[]));
    assert!(
        before.contains("container evidence: no run yet"),
        "{before}"
    );
    let out = run(&r, "ev", &["true"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let status = stdout(&h5i(&r, &["box", "status", "ev"], &[]));
    let id = podman_as_user(&["image", "inspect", "--format", "{{.Id}}", IMAGE]);
    let id = stdout(&id).trim().to_owned();
    assert!(!id.is_empty());
    for want in [
        "runtime   h5i-runc (",
        &format!("= sha256:{id}"),
        "--read-only",
        "--cap-drop=ALL",
        "--userns=keep-id",
        "root read-only; capabilities none; no-new-privileges on",
        "network=new",
        "mount     /work bind",
        "matches the policy: yes",
    ] {
        assert!(status.contains(want), "missing `{want}` in:\n{status}");
    }
}

#[test]
fn an_explicit_container_box_fails_closed_without_its_image_or_a_rootless_engine() {
    if !ready("an_explicit_container_box_fails_closed_without_its_image_or_a_rootless_engine") {
        return;
    }
    let r = Repo::new();
    let out = h5i(
        &r,
        &[
            "box",
            "create",
            "x",
            "--isolation",
            "container",
            "--image",
            "localhost/h5i-no-such-image:1",
        ],
        &[],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("localhost/h5i-no-such-image:1")
            && err.contains("never pull")
            && err.contains("to fix:"),
        "{err}"
    );
    assert!(!r.h5i_dir().join("env/none/x").exists());
    // Root with root as the engine: refused, never rootful.
    let out = r.h5i_env(
        &[
            "box",
            "create",
            "y",
            "--isolation",
            "container",
            "--image",
            IMAGE,
        ],
        &[("H5I_CONTAINER_USER", "root"), ("H5I_NO_PROBE_CACHE", "1")],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("rootful") && err.contains("to fix:"), "{err}");
    assert!(!r.h5i_dir().join("env/none/y").exists());
}

/// An image is input from whoever built it: Podman copies its annotations into the spec it
/// hands h5i-runc, where an `h5i.net.families=vsock` would read as h5i's own grant. A box is
/// refused such an image at create, names the keys and the mend, and leaves nothing.
#[test]
fn an_image_carrying_h5i_annotations_is_refused_at_create() {
    if !ready("an_image_carrying_h5i_annotations_is_refused_at_create") {
        return;
    }
    const ANNOTATED: &str = "localhost/h5i-annotated-test:1";
    let ctx = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        ctx.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let file = ctx.path().join("Containerfile");
    std::fs::write(&file, format!("FROM {IMAGE}\n")).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let built = podman_as_user(&[
        "build",
        "-q",
        "--annotation",
        "h5i.net.families=vsock",
        "--annotation",
        "h5i.net.unix=true",
        "-t",
        ANNOTATED,
        ctx.path().to_str().unwrap(),
    ]);
    assert!(built.status.success(), "{}", stderr(&built));
    let r = Repo::new();
    let out = h5i(
        &r,
        &[
            "box",
            "create",
            "x",
            "--isolation",
            "container",
            "--image",
            ANNOTATED,
        ],
        &[],
    );
    let _ = podman_as_user(&["rmi", "--force", ANNOTATED]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("h5i.net.families, h5i.net.unix") && err.contains("to fix:"),
        "{err}"
    );
    assert!(!r.h5i_dir().join("env/none/x").exists());
}

#[test]
fn probe_reports_rootless_podman_its_runtime_limits_and_images() {
    if !ready("probe_reports_rootless_podman_its_runtime_limits_and_images") {
        return;
    }
    let r = Repo::new();
    let text = stdout(&h5i(&r, &["box", "probe"], &[]));
    for want in [
        "tier container= available",
        "container engine= rootless Podman 4.",
        &format!("as {USER} (Host.Security.Rootless = true)"),
        "container runtime= h5i-runc",
        "container limits= cgroup v",
        "mem and procs are held by a cage",
        "container images= ",
        IMAGE,
    ] {
        assert!(text.contains(want), "missing `{want}` in:\n{text}");
    }
}

#[test]
fn export_of_a_container_box_applies() {
    if !ready("export_of_a_container_box_applies") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy(""));
    create(&r, "ex", "c", &[]);
    let out = run(
        &r,
        "ex",
        &[
            "sh",
            "-c",
            "mkdir -p docs && echo from-the-box > docs/new.md && echo edited >> src/lib.txt",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let review = tempfile::tempdir().unwrap();
    let dest = review.path().join("review");
    let out = h5i(
        &r,
        &["box", "export", "ex", "--out", dest.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let checkout = review.path().join("checkout");
    common::git(
        r.path(),
        &["worktree", "add", "-q", checkout.to_str().unwrap(), "HEAD"],
    );
    common::git(
        &checkout,
        &["apply", "--3way", dest.join("patch.diff").to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read_to_string(checkout.join("docs/new.md")).unwrap(),
        "from-the-box\n"
    );
    assert!(std::fs::read_to_string(checkout.join("src/lib.txt"))
        .unwrap()
        .ends_with("three\nedited\n"));
    let receipt = std::fs::read_to_string(dest.join("receipt.json")).unwrap();
    assert!(receipt.contains("\"container\""), "{receipt}");
}

#[test]
fn an_unprivileged_user_runs_a_container_box() {
    if !ready("an_unprivileged_user_runs_a_container_box") {
        return;
    }
    // The build tree may sit where the user cannot reach (CI clones under /root).
    let (dir, uid) = common::unprivileged_tree(USER, &[]);
    let repo = dir.path().join("repo");
    let bin = dir.path().join("bin");
    let h5i_bin: PathBuf = bin.join("h5i");
    let script = format!(
        r#"set -e
        cd {repo}
        git init -q -b main .
        echo hi > f
        git add f
        git -c user.name=u -c user.email=u@x commit -qm i
        {h5i} box create u --isolation container --image {IMAGE} >/dev/null
        {h5i} box run u -- sh -c 'id -u; grep CapEff /proc/self/status; echo w > by-box; touch /etc/x 2>&1 || true' || true
        set +e
        {h5i} box run u -- sh -c 'exit 9'
        echo rc=$?
        stat -c owner=%u .git/.h5i/env/none/u/workspace/by-box
        "#,
        repo = repo.display(),
        h5i = h5i_bin.display(),
    );
    let out = common::as_user(USER, Some("/tmp"))
        .args(["H5I_NO_PROBE_CACHE=1", "bash", "-c", &script])
        .current_dir("/")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.lines().any(|l| l == uid.to_string()), "{text}");
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(text.contains("Read-only file system"), "{text}");
    assert!(text.contains("rc=9"), "{text}");
    assert!(text.contains(&format!("owner={uid}")), "{text}");
}

/// The engine user owns the mount namespace root's runs are attached in, so it can mount over
/// any path there. A box's trees are cloned in the host's namespace, never looked up in that
/// one: a decoy mounted over the workspace path is not what the box gets, and the decoy's
/// files are never written.
#[test]
fn the_engine_user_cannot_redirect_a_root_box_onto_a_host_path_of_its_choice() {
    if !ready("the_engine_user_cannot_redirect_a_root_box_onto_a_host_path_of_its_choice") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let r = Repo::new();
    r.write_policy(&policy(""));
    create(&r, "redir", "c", &[]);
    // Let the engine user reach the workspace path (a repository others can traverse).
    let ws = r.workspace("redir");
    let open_path = || {
        let mut p = ws.clone();
        while p.pop() && p.starts_with(r.path().parent().unwrap()) && p != Path::new("/tmp") {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    };
    open_path();
    let decoy = tempfile::Builder::new()
        .prefix("h5i-decoy")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(decoy.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(decoy.path().join("victim"), "original\n").unwrap();
    let unshare = |script: String| {
        let out = podman_as_user(&["unshare", "sh", "-c", &script]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    unshare(format!(
        "mount --bind {} {}",
        decoy.path().display(),
        ws.display()
    ));
    let out = run(
        &r,
        "redir",
        &[
            "sh",
            "-c",
            "ls /work; echo pwned > /work/victim; echo real > /work/landed",
        ],
        &[],
    );
    // Each run puts the box directory back to 0700 (box identity), which shuts the engine user
    // out of the path again: open it once more so the decoy can be taken down.
    open_path();
    unshare(format!("umount {}", ws.display()));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("README.md"),
        "the box saw: {}",
        stdout(&out)
    );
    assert_eq!(
        std::fs::read_to_string(decoy.path().join("victim")).unwrap(),
        "original\n"
    );
    assert!(!decoy.path().join("landed").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("landed")).unwrap(),
        "real\n"
    );
}

/// The static `netprobe` (hooks/tests/support/netprobe.c), built once per test binary.
fn netprobe() -> &'static Path {
    h5i_testsupport::process::netprobe(env!("CARGO_TARGET_TMPDIR"))
}

/// `net.unix` decides `socket(AF_UNIX)` inside a container box, asked of the kernel from
/// inside: refused with EPERM by default, made when the profile grants it. A private
/// `socketpair(AF_UNIX)` and an inet socket are made either way, so the refusal is AF_UNIX's.
#[test]
fn a_container_box_gets_af_unix_sockets_only_when_net_unix_allows_them() {
    if !ready("a_container_box_gets_af_unix_sockets_only_when_net_unix_allows_them") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&format!(
        "{}[profile.u]\nisolation = \"container\"\n[profile.u.container]\nimage = \"{IMAGE}\"\n\
         [profile.u.net]\nunix = true\n",
        policy("")
    ));
    let probes = "./netprobe socket 1 1 0; ./netprobe socket 1 2 0; ./netprobe socketpair; \
                  ./netprobe socket 2 1 0";
    let mut seen = Vec::new();
    for (name, profile) in [("nounix", "c"), ("unix", "u")] {
        create(&r, name, profile, &[]);
        let probe = r.workspace(name).join("netprobe");
        common::copy_program(netprobe(), &probe);
        let out = run(&r, name, &["sh", "-c", probes], &[]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        seen.push(stdout(&out));
    }
    assert_eq!(
        seen[0], "socket 1 1 0=EPERM\nsocket 1 2 0=EPERM\nsocketpair=OK\nsocket 2 1 0=OK\n",
        "net.unix unset"
    );
    assert_eq!(
        seen[1], "socket 1 1 0=OK\nsocket 1 2 0=OK\nsocketpair=OK\nsocket 2 1 0=OK\n",
        "net.unix = true"
    );
}

/// The receipt's resource figures are the box's own, read from the cage: a box that burns a
/// second of CPU (by its own kernel account, `/proc/self/stat`) gets a CPU figure of about
/// that, not the few milliseconds of the Podman client h5i supervises; the client's `wait4`
/// rusage is left out rather than passed off as the box's.
#[test]
fn a_container_receipt_counts_the_boxs_own_cpu_time() {
    if !ready("a_container_receipt_counts_the_boxs_own_cpu_time") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy(""));
    create(&r, "cpu", "c", &[]);
    // Builtins only (no fork): spin until this shell has used 100 ticks (1 s) of CPU, bounded
    // by an iteration cap.
    let script = r#"n=0; t=0
        while [ "$t" -lt 100 ] && [ "$n" -lt 20000000 ]; do
            read -r line < /proc/$$/stat; set -- $line; t=$((${14} + ${15})); n=$((n + 1))
        done
        echo ticks=$t"#;
    let out = run(&r, "cpu", &["sh", "-c", script], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ticks: u64 = stdout(&out)
        .trim()
        .strip_prefix("ticks=")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{}", stdout(&out)));
    assert!(
        ticks >= 100,
        "the box did not burn its second: {ticks} ticks"
    );
    let rec = r.last_run("cpu");
    assert!(rec["rusage"].is_null(), "Podman's client figures: {rec}");
    let usage = &rec["cgroup_usage"];
    let cpu_us = usage["cpu_us"].as_u64().unwrap_or_else(|| panic!("{rec}"));
    assert!(
        cpu_us >= 900_000,
        "{cpu_us} µs of CPU for a box that used 1 s: {rec}"
    );
    let split = usage["user_us"].as_u64().unwrap() + usage["sys_us"].as_u64().unwrap();
    assert!(split >= 900_000, "{rec}");
    assert!(usage["mem_peak_bytes"].as_u64().unwrap() > 0, "{rec}");
}

/// `runtime = "host-default"` runs none of h5i-runc's layers, so nothing there refuses
/// `socket(AF_UNIX)`: a profile with `net.unix` off is refused at create, before any state;
/// one that grants it is accepted.
#[test]
fn the_host_default_runtime_is_refused_unless_the_profile_grants_af_unix() {
    if !ready("the_host_default_runtime_is_refused_unless_the_profile_grants_af_unix") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&format!(
        "{}runtime = \"host-default\"\n[profile.u]\nisolation = \"container\"\n\
         [profile.u.container]\nimage = \"{IMAGE}\"\nruntime = \"host-default\"\n\
         [profile.u.net]\nunix = true\n",
        policy("")
    ));
    let out = h5i(&r, &["box", "create", "hd", "--profile", "c"], &[]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("host-default") && err.contains("AF_UNIX") && err.contains("to fix:"),
        "{err}"
    );
    assert!(!r.h5i_dir().join("env/none/hd").exists());
    create(&r, "hdu", "u", &[]);
}

/// The pids of `h5i box run NAME ...` run by `bin`.
fn h5i_runs_of(bin: &Path, name: &str) -> Vec<i32> {
    let head = common::cmdline(&[bin.to_str().unwrap(), "box", "run", name]);
    common::pids_where(|c| c.starts_with(&head))
}

/// Start `sh -c 'touch /work/started; exec sleep SECS'` in container box `name` and kill its
/// `h5i box run` with SIGKILL (no handler runs) once the command is up: its container is left
/// running under conmon, the case the reaper exists for.
fn kill_h5i_mid_run(c: &common::caller::Caller, name: &str, secs: &str) {
    let script = format!("touch /work/started; exec sleep {secs}");
    let child = c
        .h5i_in(&c.repo(), &["box", "run", name, "--", "sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = c.workspace(name).join("started");
    let sleeping = || !common::pids_running(&["sleep", secs]).is_empty();
    assert!(
        common::until(std::time::Duration::from_secs(120), || started.exists()
            && sleeping()),
        "{}: the run never started",
        c.who()
    );
    let h5i = h5i_runs_of(&c.h5i_bin(), name);
    assert_eq!(h5i.len(), 1, "{}: {h5i:?}", c.who());
    // SAFETY: kill(2) of the h5i this test started (found by its command line).
    assert_eq!(unsafe { libc::kill(h5i[0], libc::SIGKILL) }, 0);
    common::wait_bounded(child, std::time::Duration::from_secs(60), "the killed h5i");
    assert!(
        sleeping(),
        "{}: the run ended with its h5i: nothing left to reap",
        c.who()
    );
}

/// An `h5i box run` killed with SIGKILL runs no cleanup, and its container kept running under
/// conmon. The next container run finds the run's lock free and removes the container, its
/// cage and its run directory, saying so.
fn a_killed_run_is_reaped_by_the_next_run(test: &str, as_user: bool, secs: &str) {
    if !ready(test) {
        return;
    }
    let mut c = common::caller::Caller::either(as_user);
    c.create_container("orphan", common::caller::container_image());
    kill_h5i_mid_run(&c, "orphan", secs);
    let next = c.h5i(&["box", "run", "orphan", "--", "true"]);
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    assert!(
        stderr(&next).contains("left running by an h5i that was killed"),
        "{}: {}",
        c.who(),
        stderr(&next)
    );
    assert!(
        common::until(std::time::Duration::from_secs(30), || common::pids_running(
            &["sleep", secs]
        )
        .is_empty()),
        "{}: the orphaned command still runs after the next run",
        c.who()
    );
    let ps = podman_as_user(&["ps", "-a", "--format", "{{.Names}}"]);
    assert!(!stdout(&ps).contains("h5i-orphan-"), "{}", stdout(&ps));
    let runs = if as_user {
        PathBuf::from(format!("/run/user/{}/h5i", c.uid()))
    } else {
        PathBuf::from("/run/h5i-engine")
    };
    // Another test's run may be reaping it at this moment (any run reaps every orphan): wait.
    assert!(
        common::until(std::time::Duration::from_secs(30), || left_in(
            &runs, "orphan"
        )
        .is_empty()),
        "{}: {:?}",
        c.who(),
        left_in(&runs, "orphan")
    );
}

/// What a box's runs left in a runs directory (run directories and locks).
fn left_in(runs: &Path, name: &str) -> Vec<String> {
    std::fs::read_dir(runs)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(&format!("run-{name}-")))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_killed_run_is_reaped_by_the_next_run_as_root() {
    a_killed_run_is_reaped_by_the_next_run("a_killed_run_is_reaped_..._as_root", false, "987");
}

#[test]
fn a_killed_run_is_reaped_by_the_next_run_as_the_test_user() {
    a_killed_run_is_reaped_by_the_next_run(
        "a_killed_run_is_reaped_..._as_the_test_user",
        true,
        "986",
    );
}

/// With no next run to reap it, a killed run still ends by its wall clock (conmon's own
/// timeout, a few seconds past it), and `rm` removes what it left.
#[test]
fn a_killed_run_never_outlives_its_wall_clock() {
    if !ready("a_killed_run_never_outlives_its_wall_clock") {
        return;
    }
    let r = Repo::new();
    r.write_policy(&policy("[profile.c.resources]\nwall = \"2s\"\n"));
    create(&r, "walled", "c", &[]);
    let child = Command::new(common::H5I)
        .args(["box", "run", "walled", "--", "sh", "-c"])
        .arg("touch /work/started; exec sleep 985")
        .envs([("H5I_CONTAINER_USER", USER), ("H5I_NO_PROBE_CACHE", "1")])
        .current_dir(r.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = r.workspace("walled").join("started");
    assert!(common::until(std::time::Duration::from_secs(120), || {
        started.exists()
    }));
    let running = h5i_runs_of(Path::new(common::H5I), "walled");
    assert_eq!(running.len(), 1, "{running:?}");
    // SAFETY: kill(2) of the h5i this test started.
    assert_eq!(unsafe { libc::kill(running[0], libc::SIGKILL) }, 0);
    common::wait_bounded(child, std::time::Duration::from_secs(60), "the killed h5i");
    // The wall is 2 s; conmon's timeout is 7 s; a generous bound, never a timing claim.
    assert!(
        common::until(std::time::Duration::from_secs(90), || common::pids_running(
            &["sleep", "985"]
        )
        .is_empty()),
        "a killed run outlived its wall clock"
    );
    let rm = h5i(&r, &["box", "rm", "walled", "--force"], &[]);
    assert_eq!(rm.status.code(), Some(0), "{}", stderr(&rm));
    let runs = Path::new("/run/h5i-engine");
    assert!(
        common::until(std::time::Duration::from_secs(30), || left_in(
            runs, "walled"
        )
        .is_empty()),
        "{:?}",
        left_in(runs, "walled")
    );
}

/// The box's private `/tmp` (also its HOME at this tier: the agent's state, package caches and
/// `TMPDIR` all land there) holds what the README says, 1 GiB, the same as the kernel tiers'
/// (`h5i::process::TMP_BYTES`), and no more: a box writes 1000 MiB there, and the next 100 MiB
/// meet the kernel's ENOSPC ("No space left on device") with the file cut short at the size
/// limit; `df` shows the 1 GiB tmpfs. The bytes live in memory charged to the box's `mem`, and
/// are gone with the run (`--rm`): the next run starts with an empty `/tmp`.
fn tmp_holds_its_documented_size_and_no_more(test: &str, as_user: bool) {
    if !ready(test) {
        return;
    }
    let mut c = common::caller::Caller::either(as_user);
    c.create_container("tmp", common::caller::container_image());
    let out = c.h5i(&[
        "box",
        "run",
        "tmp",
        "--",
        "sh",
        "-c",
        "df -k /tmp | tail -n 1; \
         dd if=/dev/zero of=/tmp/fill bs=1M count=1000 2>/dev/null; echo fill=$?; \
         dd if=/dev/zero of=/tmp/more bs=1M count=100 2>&1; echo more=$?; \
         echo size=$(( $(wc -c < /tmp/fill) + $(wc -c < /tmp/more) ))",
    ]);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}: {text}{}",
        c.who(),
        stderr(&out)
    );
    let df: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!((df[0], df[1]), ("tmpfs", "1048576"), "{}: {text}", c.who());
    assert!(text.contains("fill=0\n"), "{}: {text}", c.who());
    assert!(
        text.contains("No space left on device") && !text.contains("more=0\n"),
        "{}: {text}",
        c.who()
    );
    let size: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("size="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        size <= 1 << 30 && size > (1 << 30) - (16 << 20),
        "{}: {size} bytes in /tmp",
        c.who()
    );
    let next = c.h5i(&[
        "box",
        "run",
        "tmp",
        "--",
        "sh",
        "-c",
        "ls -A /tmp | grep -c -e fill -e more",
    ]);
    assert_eq!(stdout(&next).trim(), "0", "{}: {}", c.who(), stderr(&next));
}

#[test]
fn a_container_boxs_tmp_holds_1_gib_and_then_enospc_as_root() {
    tmp_holds_its_documented_size_and_no_more(
        "a_container_boxs_tmp_holds_1_gib_and_then_enospc_as_root",
        false,
    );
}

#[test]
fn a_container_boxs_tmp_holds_1_gib_and_then_enospc_as_the_test_user() {
    tmp_holds_its_documented_size_and_no_more(
        "a_container_boxs_tmp_holds_1_gib_and_then_enospc_as_the_test_user",
        true,
    );
}
