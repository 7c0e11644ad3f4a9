//! The egress proxy, end to end on loopback: every test builds a plan through an in-process
//! resolver map (no name goes to the system resolver), runs the proxy on a listener it made,
//! and checks both what the client got and what the stand-in destinations saw.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use h5i_broker::egress::{
    merge_user_allowlist, parse_user_allowlist, EgressOptions, EgressPlan, EgressProxy,
};
use h5i_broker::pin::{AddressRules, MapResolver};
use h5i_policy::HostPort;
use support::*;

fn hp(s: &str) -> HostPort {
    s.parse().unwrap()
}

fn serve(plan: EgressPlan, opts: EgressOptions) -> EgressProxy {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    EgressProxy::serve(listener, plan, opts).unwrap()
}

/// Read exactly `n` bytes from a tunnel.
fn read_n(r: &mut BufReader<std::net::TcpStream>, n: usize) -> String {
    let mut buf = vec![0; n];
    r.read_exact(&mut buf).unwrap();
    String::from_utf8(buf).unwrap()
}

fn tunnel_roundtrip(r: &mut BufReader<std::net::TcpStream>, tag: &str) {
    assert_eq!(read_n(r, tag.len()), tag);
    r.get_mut().write_all(b"ping").unwrap();
    assert_eq!(read_n(r, 4), "ping");
}

#[test]
fn connect_to_a_host_not_on_the_allowlist_is_refused_and_counted() {
    let (a, _) = echo_server("A");
    let (b, b_count) = echo_server("B");
    let m = MapResolver::new();
    m.insert("allowed.test", 443, vec![a]);
    m.insert("denied.test", 443, vec![b]);
    let plan = EgressPlan::build(
        &[hp("allowed.test")],
        &m,
        &AddressRules::allowing_loopback(),
    );
    let proxy = serve(plan, EgressOptions::default());

    let (status, body, _) = connect_via(proxy.local_addr(), "denied.test:443");
    assert_eq!(status, 403);
    assert!(
        body.contains("refusing: CONNECT to denied.test:443"),
        "{body}"
    );
    assert!(body.contains("to fix:"), "{body}");

    let report = proxy.shutdown();
    assert_eq!(report.tally.denied.get("denied.test:443"), Some(&1));
    assert!(report.tally.allowed.is_empty());
    assert_eq!(report.denied_total, 1);
    let first = &report.first_denied[0];
    assert_eq!(
        (first.host.as_str(), first.port, first.method.as_str()),
        ("denied.test", 443, "CONNECT")
    );
    assert!(first.at_ms > 0);
    assert_eq!(
        *b_count.lock().unwrap(),
        0,
        "the denied destination was dialed"
    );
}

#[test]
fn connect_to_an_allowed_host_tunnels_to_its_pinned_address() {
    let (a, a_count) = echo_server("A");
    let m = MapResolver::new();
    m.insert("allowed.test", 443, vec![a]);
    let plan = EgressPlan::build(
        &[hp("allowed.test")],
        &m,
        &AddressRules::allowing_loopback(),
    );
    let proxy = serve(plan, EgressOptions::default());

    let (status, _, tunnel) = connect_via(proxy.local_addr(), "Allowed.Test:443");
    assert_eq!(status, 200);
    let mut t = tunnel.unwrap();
    tunnel_roundtrip(&mut t, "A");
    // A half-close passes through: the echo server sees EOF and closes, and so does the tunnel.
    t.get_ref().shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    t.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());

    let report = proxy.shutdown();
    assert_eq!(report.tally.allowed.get("allowed.test:443"), Some(&1));
    assert!(report.tally.denied.is_empty());
    assert_eq!(*a_count.lock().unwrap(), 1);
}

#[test]
fn bytes_sent_right_behind_the_connect_head_are_not_lost() {
    let (a, _) = echo_server("A");
    let m = MapResolver::new();
    m.insert("allowed.test", 443, vec![a]);
    let plan = EgressPlan::build(
        &[hp("allowed.test")],
        &m,
        &AddressRules::allowing_loopback(),
    );
    let proxy = serve(plan, EgressOptions::default());
    let mut s = dial(proxy.local_addr());
    s.write_all(b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\nEARLY")
        .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    line.clear();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "\r\n");
    assert_eq!(read_n(&mut r, 6), "AEARLY");
    proxy.shutdown();
}

#[test]
fn a_name_that_re_resolves_elsewhere_still_reaches_only_the_pinned_address() {
    let (a, a_count) = echo_server("A");
    let (b, b_count) = echo_server("B");
    let m = MapResolver::new();
    m.insert("rebind.test", 443, vec![a]);
    let plan = EgressPlan::build(&[hp("rebind.test")], &m, &AddressRules::allowing_loopback());
    let asked = m.times_asked();
    // The name now answers with another address (DNS rebinding).
    m.insert("rebind.test", 443, vec![b]);
    let proxy = serve(plan, EgressOptions::default());

    for _ in 0..3 {
        let (status, _, tunnel) = connect_via(proxy.local_addr(), "rebind.test:443");
        assert_eq!(status, 200);
        tunnel_roundtrip(&mut tunnel.unwrap(), "A");
    }
    proxy.shutdown();
    assert_eq!(*a_count.lock().unwrap(), 3);
    assert_eq!(
        *b_count.lock().unwrap(),
        0,
        "the re-resolved address was dialed"
    );
    assert_eq!(m.times_asked(), asked, "the proxy resolved at request time");
}

#[test]
fn loopback_and_unspecified_destinations_are_refused_unless_listed() {
    let (a, a_count) = echo_server("A");
    let port = a.port();
    let m = MapResolver::new();
    m.insert("allowed.test", 443, vec![a]);
    m.insert("localhost", port, vec![a]);
    // Tests' upstreams live on loopback, so these rules allow it: even so, nothing the plan does
    // not list is reachable, and a pinned address is not reachable as a literal.
    let plan = EgressPlan::build(
        &[hp("allowed.test")],
        &m,
        &AddressRules::allowing_loopback(),
    );
    let proxy = serve(plan, EgressOptions::default());
    for target in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("0.0.0.0:{port}"),
        format!("127.1:{port}"),
        format!("2130706433:{port}"),
        "127.0.0.1:443".to_string(),
    ] {
        let (status, body, _) = connect_via(proxy.local_addr(), &target);
        assert_eq!(status, 403, "{target}: {body}");
    }
    let report = proxy.shutdown();
    assert_eq!(report.denied_total, 7);
    assert!(
        report.tally.denied.contains_key(&format!("[::1]:{port}")),
        "{:?}",
        report.tally
    );
    assert_eq!(
        *a_count.lock().unwrap(),
        0,
        "a loopback destination was dialed"
    );
}

#[test]
fn the_production_rules_refuse_a_name_that_resolves_to_loopback() {
    let (a, a_count) = echo_server("A");
    let port = a.port();
    let m = MapResolver::new();
    m.insert("localhost", port, vec![a]);
    m.insert(
        "sneaky.test",
        443,
        vec![a, SocketAddr::from(([0, 0, 0, 0], port))],
    );
    let plan = EgressPlan::build(
        &[
            hp(&format!("localhost:{port}")),
            hp("sneaky.test"),
            hp(&format!("127.0.0.1:{port}")),
        ],
        &m,
        &AddressRules::production().unwrap(),
    );
    assert_eq!(plan.unusable().len(), 3, "{:?}", plan.unusable());
    let proxy = serve(plan, EgressOptions::default());
    for target in [
        format!("localhost:{port}"),
        "sneaky.test:443".into(),
        format!("127.0.0.1:{port}"),
    ] {
        let (status, body, _) = connect_via(proxy.local_addr(), &target);
        assert_eq!(status, 403, "{target}: {body}");
        assert!(
            body.contains("loopback") || body.contains("unspecified"),
            "{body}"
        );
    }
    proxy.shutdown();
    assert_eq!(*a_count.lock().unwrap(), 0, "host loopback was reached");
}

#[test]
fn plain_http_goes_only_to_allowed_hosts_with_the_host_header_pinned() {
    let (origin, seen) = http_origin("A");
    let (other, other_seen) = http_origin("B");
    let m = MapResolver::new();
    m.insert("web.test", 80, vec![origin]);
    m.insert("other.test", 80, vec![other]);
    let plan = EgressPlan::build(&[hp("web.test:80")], &m, &AddressRules::allowing_loopback());
    let proxy = serve(plan, EgressOptions::default());

    let mut s = dial(proxy.local_addr());
    let mut r = BufReader::new(s.try_clone().unwrap());
    for i in 0..3 {
        write!(s, "GET http://web.test/x{i}?q HTTP/1.1\r\nHost: evil.test\r\nProxy-Connection: keep-alive\r\n\r\n").unwrap();
        let got = read_response(&mut r, "GET").unwrap();
        assert_eq!(got.status, 200);
        assert_eq!(got.text(), format!("A /x{i}?q host=web.test"));
    }
    write!(
        s,
        "GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n"
    )
    .unwrap();
    let got = read_response(&mut r, "GET").unwrap();
    assert_eq!(got.status, 403);
    assert!(
        got.text().contains("refusing: GET to other.test:80"),
        "{}",
        got.text()
    );

    let report = proxy.shutdown();
    assert_eq!(report.tally.allowed.get("web.test:80"), Some(&3));
    assert_eq!(report.tally.denied.get("other.test:80"), Some(&1));
    assert!(other_seen.lock().unwrap().is_empty());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s.header("proxy-connection").is_none()));
}

#[test]
fn a_post_body_reaches_the_allowed_origin_intact() {
    let (origin, seen) = http_origin("A");
    let m = MapResolver::new();
    m.insert("web.test", 80, vec![origin]);
    let plan = EgressPlan::build(&[hp("web.test:80")], &m, &AddressRules::allowing_loopback());
    let proxy = serve(plan, EgressOptions::default());
    let mut s = dial(proxy.local_addr());
    s.write_all(b"POST http://web.test/p HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    // The proxy answers the Expect itself, before the body is sent.
    let cont = read_response(&mut r, "POST").unwrap();
    assert_eq!(cont.status, 100);
    s.write_all(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n")
        .unwrap();
    let got = read_response(&mut r, "POST").unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.text(), "A /p host=web.test");
    proxy.shutdown();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].body, b"abcde");
    assert!(seen[0].header("expect").is_none());
}

#[test]
fn the_user_allowlist_does_not_widen_a_deny_all_profile() {
    let (a, a_count) = echo_server("A");
    let m = MapResolver::new();
    m.insert("user.test", 443, vec![a]);
    m.insert("profile.test", 443, vec![a]);
    let user = parse_user_allowlist("# mine\nuser.test\n").unwrap();

    let deny_all = merge_user_allowlist(&[], &user);
    assert!(deny_all.is_empty());
    let proxy = serve(
        EgressPlan::build(&deny_all, &m, &AddressRules::allowing_loopback()),
        EgressOptions::default(),
    );
    let (status, _, _) = connect_via(proxy.local_addr(), "user.test:443");
    assert_eq!(status, 403);
    proxy.shutdown();
    assert_eq!(*a_count.lock().unwrap(), 0);

    // A profile that already sets egress gets the user's entries too.
    let merged = merge_user_allowlist(&[hp("profile.test")], &user);
    let proxy = serve(
        EgressPlan::build(&merged, &m, &AddressRules::allowing_loopback()),
        EgressOptions::default(),
    );
    let (status, _, t) = connect_via(proxy.local_addr(), "user.test:443");
    assert_eq!(status, 200);
    tunnel_roundtrip(&mut t.unwrap(), "A");
    proxy.shutdown();
}

#[test]
fn the_first_denied_attempts_are_kept_and_the_rest_counted() {
    let m = MapResolver::new();
    let opts = EgressOptions {
        keep_denied: 3,
        ..EgressOptions::default()
    };
    let proxy = serve(EgressPlan::deny_all(), opts);
    for i in 0..5 {
        let (status, _, _) = connect_via(proxy.local_addr(), &format!("d{i}.test:443"));
        assert_eq!(status, 403);
    }
    let (status, _, _) = connect_via(proxy.local_addr(), "d0.test:443");
    assert_eq!(status, 403);
    let report = proxy.shutdown();
    assert_eq!(report.denied_total, 6);
    assert_eq!(report.first_denied.len(), 3);
    assert_eq!(report.first_denied[2].host, "d2.test");
    assert_eq!(report.tally.denied.get("d0.test:443"), Some(&2));
    assert_eq!(report.tally.denied.len(), 5);
    assert_eq!(m.times_asked(), 0);
}

#[test]
fn malformed_requests_are_refused_and_counted() {
    let proxy = serve(EgressPlan::deny_all(), EgressOptions::default());
    for raw in [
        "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "CONNECT nohostport HTTP/1.1\r\n\r\n",
        "GET https://x.test/ HTTP/1.1\r\n\r\n",
        "BAD\r\n\r\n",
    ] {
        let got = exchange(proxy.local_addr(), raw);
        assert_eq!(got.status, 400, "{raw:?}: {}", got.text());
        assert!(
            got.text().contains("refusing:") && got.text().contains("to fix:"),
            "{}",
            got.text()
        );
    }
    let report = proxy.shutdown();
    assert_eq!(report.tally.denied.get("(malformed)"), Some(&4));
}

#[test]
fn shutdown_ends_open_tunnels_and_stops_accepting() {
    let (a, _) = echo_server("A");
    let m = MapResolver::new();
    m.insert("allowed.test", 443, vec![a]);
    let plan = EgressPlan::build(
        &[hp("allowed.test")],
        &m,
        &AddressRules::allowing_loopback(),
    );
    let proxy = serve(plan, EgressOptions::default());
    let addr = proxy.local_addr();
    let (_, _, t) = connect_via(addr, "allowed.test:443");
    let mut t = t.unwrap();
    tunnel_roundtrip(&mut t, "A");

    let started = Instant::now();
    let report = proxy.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(report.lingering, 0);
    let mut rest = Vec::new();
    let _ = t.read_to_end(&mut rest);
    assert!(rest.is_empty());
    assert!(std::net::TcpStream::connect_timeout(&addr, IO_TIMEOUT).is_err());
}
