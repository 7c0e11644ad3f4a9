//! Box services and ports, asserted with real boxes: a declared HTTP server started as a
//! service answers on the host port `box ports` prints, a run of the same box reaches it on its
//! own localhost, another box cannot, its log holds the server's request log, and stopping it
//! (or aborting the box) ends it with a recorded exit. Loopback only; every wait is bounded.
//!
//! Runs as root (CI): the process-tier forward enters the box's network namespace; one case
//! runs h5i as the unprivileged test user, whose forwarder joins the box's user namespace first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use common::{stderr, stdout, Caller, Repo};

/// The box port the process-tier tests' server listens on (each box has its own namespace).
const BOX_PORT: u16 = 8765;

fn repo_with_web(port: u16) -> Repo {
    let r = Repo::new();
    r.write_policy(&format!(
        "[service.web]\ncommand = \"exec python3 -m http.server {port} --bind 127.0.0.1\"\nport = {port}\n"
    ));
    std::fs::write(r.path().join("index.html"), "hello from the box\n").unwrap();
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", "web"]);
    r
}

/// The host port `box ports` maps to `box_port`.
fn host_port(r: &Repo, name: &str, box_port: u16) -> u16 {
    let out = r.ok(&["box", "ports", name]);
    out.lines()
        .find_map(|l| {
            let (host, rest) = l.split_once(" -> ")?;
            let bp: u16 = rest.split_whitespace().next()?.parse().ok()?;
            (bp == box_port).then(|| host.strip_prefix("127.0.0.1:")?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no mapping for {box_port} in `box ports`: {out}"))
}

/// One HTTP GET on loopback; the response, or the connect error.
fn get(port: u16) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_secs(2),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// GET until the server answers: at most 100 tries, 50 ms apart (the server needs a moment to
/// bind after its container starts).
fn get_eventually(port: u16) -> String {
    let mut last = String::new();
    for _ in 0..100 {
        match get(port) {
            Ok(b) if b.starts_with("HTTP/") => return b,
            Ok(b) => last = b,
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("127.0.0.1:{port} never answered: {last}");
}

fn refused(port: u16) -> bool {
    matches!(get(port), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// The service's line in `box service status`, checked to match the one `box status` shows.
fn status_line(r: &Repo, name: &str, svc: &str) -> String {
    let out = r.ok(&["box", "service", "status", name]);
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(svc))
        .unwrap_or_else(|| panic!("no status line for {svc}: {out}"))
        .to_string();
    let status = r.ok(&["box", "status", name]);
    assert!(
        status.contains("services\n") && status.contains(&line),
        "box status does not show `{line}`: {status}"
    );
    line
}

fn py_connect(port: u16) -> String {
    format!(
        "import socket\ns = socket.socket()\ns.settimeout(5)\ntry:\n    s.connect(('127.0.0.1', {port}))\n    print('connected')\nexcept ConnectionRefusedError:\n    print('refused')\n"
    )
}

#[test]
fn a_process_tier_service_answers_on_its_host_port_and_only_its_own_box_reaches_it() {
    let r = repo_with_web(BOX_PORT);
    r.ok(&["box", "create", "web", "--isolation=process"]);
    r.ok(&["box", "create", "other", "--isolation=process"]);
    let started = r.ok(&["box", "service", "start", "web", "web"]);
    assert!(started.contains("-> 8765"), "{started}");

    let port = host_port(&r, "web", BOX_PORT);
    assert_ne!(
        port, BOX_PORT,
        "the host port is h5i's choice, never the box's"
    );
    let body = get_eventually(port);
    assert!(
        body.contains("hello from the box") || body.contains("index.html"),
        "{body}"
    );
    assert!(status_line(&r, "web", "web").contains(" alive "));

    // A run of the same box joins the service's network namespace.
    let script = format!(
        "import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:{BOX_PORT}/', timeout=5).status)"
    );
    let out = r.h5i(&["box", "run", "web", "--", "python3", "-c", &script]);
    assert_eq!(stdout(&out).trim(), "200", "{}", stderr(&out));

    // Another box has a namespace of its own: nothing listens on its 127.0.0.1:8765.
    let out = r.h5i(&[
        "box",
        "run",
        "other",
        "--",
        "python3",
        "-c",
        &py_connect(BOX_PORT),
    ]);
    assert_eq!(stdout(&out).trim(), "refused", "{}", stderr(&out));

    let logs = r.ok(&["box", "service", "logs", "web", "web"]);
    assert!(logs.contains("\"GET / HTTP/1."), "{logs}");

    let stopped = r.ok(&["box", "service", "stop", "web", "web"]);
    assert!(stopped.contains("exit 137"), "{stopped}");
    assert!(refused(port), "the host port still answers after stop");
    let line = status_line(&r, "web", "web");
    assert!(
        line.contains(" dead ") && line.contains("last exit 137"),
        "{line}"
    );
    assert!(!r.ok(&["box", "ports", "web"]).contains("->"));
    let receipts = r.receipts("web");
    assert!(
        receipts.iter().any(|rec| {
            let t = rec.to_string();
            rec["lane"] == "host-env-run" && t.contains("http.server") && t.contains("137")
        }),
        "no host-observed receipt of the service: {receipts:?}"
    );
}

#[test]
fn aborting_a_box_stops_its_services_and_records_the_exit() {
    let r = repo_with_web(BOX_PORT);
    r.ok(&["box", "create", "ab", "--isolation=process"]);
    r.ok(&["box", "service", "start", "ab", "web"]);
    let port = host_port(&r, "ab", BOX_PORT);
    get_eventually(port);
    r.ok(&["box", "abort", "ab"]);
    assert!(refused(port), "the host port still answers after abort");
    let line = status_line(&r, "ab", "web");
    assert!(
        line.contains(" dead ") && line.contains("last exit"),
        "{line}"
    );
    let out = r.h5i(&["box", "service", "start", "ab", "web"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("refusing:"), "{}", stderr(&out));
}

#[test]
fn a_second_start_of_a_running_service_is_refused_and_undeclared_ones_too() {
    let r = repo_with_web(BOX_PORT);
    r.ok(&["box", "create", "twice", "--isolation=process"]);
    r.ok(&["box", "service", "start", "twice", "web"]);
    let out = r.h5i(&["box", "service", "start", "twice", "web"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("already running"), "{}", stderr(&out));
    let out = r.h5i(&["box", "service", "start", "twice", "db"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("declares no service `db`"),
        "{}",
        stderr(&out)
    );
    r.ok(&["box", "rm", "--force", "twice"]);
}

#[test]
fn a_workspace_tier_service_runs_on_the_hosts_network_and_says_so() {
    // A free host port: this tier has no namespace of its own.
    let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = repo_with_web(port);
    r.ok(&["box", "create", "ws", "--isolation=workspace"]);
    r.ok(&["box", "service", "start", "ws", "web"]);
    let ports = r.ok(&["box", "ports", "ws"]);
    assert!(
        ports.contains(&format!("127.0.0.1:{port} -> {port}")),
        "{ports}"
    );
    assert!(ports.contains("no isolation"), "{ports}");
    get_eventually(port);
    assert!(status_line(&r, "ws", "web").contains(" alive "));
    let logs = r.ok(&["box", "service", "logs", "ws", "web"]);
    assert!(logs.contains("\"GET / HTTP/1."), "{logs}");
    r.ok(&["box", "service", "stop", "ws", "web"]);
    assert!(refused(port));
    let line = status_line(&r, "ws", "web");
    assert!(
        line.contains(" dead ") && line.contains("last exit"),
        "{line}"
    );
}

/// Issue 14: an unprivileged caller's process-tier service is reachable on its host port. The
/// caller may not enter the box's network namespace from the host's user namespace (the
/// kernel wants CAP_SYS_ADMIN in both), so its supervisor starts a forwarder that joins the
/// box's user namespace first; the reply carries a page only the box's workspace holds.
#[test]
fn an_unprivileged_callers_process_tier_service_answers_on_its_forwarded_host_port() {
    if !common::require_root(
        "an_unprivileged_callers_process_tier_service_answers_on_its_forwarded_host_port",
        "switching to the unprivileged test user h5i-test",
    ) {
        return;
    }
    let c = Caller::user();
    c.write(
        ".h5i/env.toml",
        format!(
            "[service.web]\ncommand = \"exec python3 -m http.server {BOX_PORT} --bind 127.0.0.1\"\nport = {BOX_PORT}\n"
        ),
    );
    c.write("index.html", "served from inside h5i-test's box\n");
    c.commit_all("web");
    c.ok(&["box", "create", "web", "--isolation=process"]);
    let started = c.ok(&["box", "service", "start", "web", "web"]);
    assert!(started.contains("-> 8765"), "{started}");
    let ports = c.ok(&["box", "ports", "web"]);
    assert!(
        ports.contains("forwarded into the box's own network namespace"),
        "{ports}"
    );
    let port: u16 = ports
        .lines()
        .find_map(|l| {
            l.split_once(" -> ")?
                .0
                .strip_prefix("127.0.0.1:")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no host port in `box ports`: {ports}"));
    assert_ne!(port, BOX_PORT);
    let body = get_eventually(port);
    assert!(
        body.starts_with("HTTP/1.0 200") && body.contains("served from inside h5i-test's box"),
        "{body}"
    );
    let logs = c.ok(&["box", "service", "logs", "web", "web"]);
    assert!(logs.contains("\"GET / HTTP/1."), "{logs}");
    c.ok(&["box", "service", "stop", "web", "web"]);
    assert!(refused(port), "the host port still answers after stop");
}
