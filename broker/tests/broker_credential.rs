//! The credential proxy, end to end on loopback: the grants come from the real built-in
//! profiles, the upstreams are local TLS stand-ins for the Anthropic and OpenAI APIs with a CA
//! made by the test, and names are pinned through an in-process resolver map.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use h5i_broker::credential::{
    routes_for_policy, CredentialError, CredentialOptions, CredentialProxy, CredentialRoute,
    UpstreamTls,
};
use h5i_broker::pin::{AddressRules, MapResolver};
use h5i_policy::{resolve, HostTiers, ResolveRequest, ResolvedPolicy};
use support::*;

const REAL_ANTHROPIC: &str = "sk-ant-REAL-host-only-key-0123456789";
const REAL_OPENAI: &str = "sk-proj-REAL-host-only-key-9876543210";

fn host_env(var: &str) -> Option<String> {
    match var {
        "ANTHROPIC_API_KEY" => Some(REAL_ANTHROPIC.into()),
        "OPENAI_API_KEY" => Some(REAL_OPENAI.into()),
        _ => None,
    }
}

fn policy(profile: &str, credential_proxy: Option<&str>) -> ResolvedPolicy {
    let req = ResolveRequest {
        profile: Some(profile.into()),
        isolation: Some("supervised".into()),
        credential_proxy: credential_proxy.map(str::to_owned),
        ..ResolveRequest::default()
    };
    resolve(None, &req, &HostTiers::all_available()).unwrap()
}

struct Setup {
    ca: TestCa,
    anthropic: TlsUpstream,
    openai: TlsUpstream,
    resolver: MapResolver,
    tls: UpstreamTls,
}

fn setup(answer: Answer) -> Setup {
    let ca = TestCa::new();
    let anthropic = TlsUpstream::start(ca.server_config(&["api.anthropic.com"]), answer.clone());
    let openai = TlsUpstream::start(ca.server_config(&["api.openai.com"]), answer);
    let resolver = MapResolver::new();
    resolver.insert("api.anthropic.com", 443, vec![anthropic.addr]);
    resolver.insert("api.openai.com", 443, vec![openai.addr]);
    let tls = UpstreamTls::webpki_with_extra_root(&ca.ca_der).unwrap();
    Setup {
        ca,
        anthropic,
        openai,
        resolver,
        tls,
    }
}

impl Setup {
    /// The one route a built-in agent profile asks for.
    fn route(&self, profile: &str) -> CredentialRoute {
        let mut routes = routes_for_policy(
            &policy(profile, None),
            host_env,
            &self.resolver,
            &AddressRules::allowing_loopback(),
        )
        .unwrap();
        assert_eq!(routes.len(), 1, "{profile} should have exactly one grant");
        routes.remove(0)
    }

    fn serve(&self, route: CredentialRoute) -> CredentialProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        CredentialProxy::serve(
            listener,
            route,
            self.tls.clone(),
            CredentialOptions::default(),
        )
        .unwrap()
    }
}

fn messages_request(addr: SocketAddr, auth_header: &str) -> String {
    let body = r#"{"model":"claude-x","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    format!(
        "POST /v1/messages HTTP/1.1\r\nHost: {addr}\r\n{auth_header}anthropic-version: 2023-06-01\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn the_upstream_sees_the_real_credential_and_never_the_dummy() {
    let s = setup(Answer::Json);
    let route = s.route("agent-claude");
    let dummy = route.dummy_token().to_owned();
    let proxy = s.serve(route);
    let addr = proxy.local_addr();
    let env = proxy.route().box_env(addr);
    assert_eq!(
        env[0],
        ("ANTHROPIC_BASE_URL".into(), format!("http://{addr}"))
    );
    assert_eq!(env[1], ("ANTHROPIC_API_KEY".into(), dummy.clone()));

    // Two requests on one kept-alive connection: x-api-key, then Authorization: Bearer.
    let mut c = dial(addr);
    let mut r = BufReader::new(c.try_clone().unwrap());
    c.write_all(messages_request(addr, &format!("x-api-key: {dummy}\r\n")).as_bytes())
        .unwrap();
    let got = read_response(&mut r, "POST").unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.text(), r#"{"ok":true,"api":"anthropic"}"#);
    c.write_all(messages_request(addr, &format!("Authorization: Bearer {dummy}\r\n")).as_bytes())
        .unwrap();
    let got = read_response(&mut r, "POST").unwrap();
    assert_eq!(got.status, 200, "{}", got.text());

    let seen = s.anthropic.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].header("x-api-key"), Some(REAL_ANTHROPIC));
    assert_eq!(
        seen[1].header("authorization"),
        Some(format!("Bearer {REAL_ANTHROPIC}").as_str())
    );
    for req in &seen {
        assert_eq!(req.header("host"), Some("api.anthropic.com"));
        assert_eq!(req.header("anthropic-version"), Some("2023-06-01"));
        assert!(req.body.starts_with(b"{\"model\""));
        assert!(
            !req.all_text().contains(&dummy),
            "the upstream saw the dummy"
        );
    }
    assert_eq!(
        s.anthropic.connections(),
        1,
        "the upstream connection was not reused"
    );
    assert!(s.openai.seen().is_empty());
    let report = proxy.shutdown();
    assert_eq!(report.forwarded, 2);
    assert_eq!(report.statuses.get(&200), Some(&2));
}

#[test]
fn a_subscription_token_is_used_when_the_host_has_no_api_key_and_the_box_gets_only_its_dummy() {
    const REAL_OAUTH: &str = "sk-ant-oat01-REAL-host-only-subscription-token";
    let s = setup(Answer::Json);
    let oauth_only = |var: &str| (var == "CLAUDE_CODE_OAUTH_TOKEN").then(|| REAL_OAUTH.to_owned());
    let mut routes = routes_for_policy(
        &policy("agent-claude", None),
        oauth_only,
        &s.resolver,
        &AddressRules::allowing_loopback(),
    )
    .unwrap();
    let route = routes.remove(0);
    assert_eq!(route.grant().credential_env, "CLAUDE_CODE_OAUTH_TOKEN");
    assert_eq!(
        format!("{:?}", route.redaction()),
        "SecretValue(credential:CLAUDE_CODE_OAUTH_TOKEN, <redacted>)"
    );
    let dummy = route.dummy_token().to_owned();
    let proxy = s.serve(route);
    let addr = proxy.local_addr();
    // The box is told the token under Claude Code's own variable, and has no API key at all.
    let env = proxy.route().box_env(addr);
    assert_eq!(
        env,
        vec![
            ("ANTHROPIC_BASE_URL".into(), format!("http://{addr}")),
            ("CLAUDE_CODE_OAUTH_TOKEN".into(), dummy.clone()),
        ]
    );
    let mut c = dial(addr);
    let mut r = BufReader::new(c.try_clone().unwrap());
    c.write_all(messages_request(addr, &format!("Authorization: Bearer {dummy}\r\n")).as_bytes())
        .unwrap();
    let got = read_response(&mut r, "POST").unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    let seen = s.anthropic.seen();
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {REAL_OAUTH}").as_str())
    );
    assert!(!seen[0].all_text().contains(&dummy));
    // With both set the API key wins, as Claude Code itself prefers it.
    let both = |var: &str| match var {
        "CLAUDE_CODE_OAUTH_TOKEN" => Some(REAL_OAUTH.to_owned()),
        other => host_env(other),
    };
    let routes = routes_for_policy(
        &policy("agent-claude", None),
        both,
        &s.resolver,
        &AddressRules::allowing_loopback(),
    )
    .unwrap();
    assert_eq!(routes[0].grant().token_var, "ANTHROPIC_API_KEY");
    // With neither, the refusal names both and how to set either.
    let err = routes_for_policy(
        &policy("agent-claude", None),
        |_| None,
        &s.resolver,
        &AddressRules::allowing_loopback(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN) is not set")
            && err.contains("export ANTHROPIC_API_KEY=... (or CLAUDE_CODE_OAUTH_TOKEN=...)"),
        "{err}"
    );
    drop(proxy.shutdown());
}

#[test]
fn an_openai_grant_forwards_chat_completions_and_responses_with_the_real_key() {
    let s = setup(Answer::Json);
    let route = s.route("agent-codex");
    let dummy = route.dummy_token().to_owned();
    let proxy = s.serve(route);
    let addr = proxy.local_addr();
    let env = proxy.route().box_env(addr);
    assert_eq!(
        env[0],
        ("OPENAI_BASE_URL".into(), format!("http://{addr}/v1"))
    );
    assert_eq!(env[1], ("OPENAI_API_KEY".into(), dummy.clone()));
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let body = r#"{"model":"gpt-x","input":"hi"}"#;
        let got = exchange(
            addr,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {dummy}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        );
        assert_eq!(got.status, 200, "{path}: {}", got.text());
    }
    let seen = s.openai.seen();
    assert_eq!(
        seen.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(),
        ["/v1/chat/completions", "/v1/responses"]
    );
    for req in &seen {
        assert_eq!(
            req.header("authorization"),
            Some(format!("Bearer {REAL_OPENAI}").as_str())
        );
        assert_eq!(req.header("host"), Some("api.openai.com"));
        assert!(!req.all_text().contains(&dummy));
    }
    assert!(s.anthropic.seen().is_empty());
    proxy.shutdown();
}

#[test]
fn a_missing_dummy_is_refused_and_the_upstream_never_sees_the_request() {
    let s = setup(Answer::Json);
    let proxy = s.serve(s.route("agent-claude"));
    let got = exchange(
        proxy.local_addr(),
        &messages_request(proxy.local_addr(), ""),
    );
    assert_eq!(got.status, 401);
    let text = got.text();
    assert!(
        text.contains("refusing:")
            && text.contains("to fix:")
            && text.contains("$ANTHROPIC_API_KEY"),
        "{text}"
    );
    assert!(!text.contains(REAL_ANTHROPIC));
    let report = proxy.shutdown();
    assert_eq!(report.refused.get("missing-token"), Some(&1));
    assert_eq!(report.forwarded, 0);
    assert_eq!(s.anthropic.connections(), 0, "the upstream was contacted");
}

#[test]
fn a_wrong_dummy_is_refused_and_the_upstream_never_sees_the_request() {
    let s = setup(Answer::Json);
    let claude = s.route("agent-claude");
    let codex_dummy = s.route("agent-codex").dummy_token().to_owned();
    let dummy = claude.dummy_token().to_owned();
    let proxy = s.serve(claude);
    let addr = proxy.local_addr();
    let mut near = dummy.clone().into_bytes();
    let last = near.len() - 1;
    near[last] = if near[last] == b'0' { b'1' } else { b'0' };
    let near = String::from_utf8(near).unwrap();
    for header in [
        format!("x-api-key: {near}\r\n"),
        format!("x-api-key: {codex_dummy}\r\n"),
        format!("x-api-key: {REAL_ANTHROPIC}\r\n"),
        format!("Authorization: Bearer {}\r\n", &dummy[..dummy.len() - 1]),
        // Every credential header must carry the dummy, not just one of them.
        format!("x-api-key: {dummy}\r\nAuthorization: Bearer {near}\r\n"),
        format!("Authorization: Basic {dummy}\r\n"),
    ] {
        let got = exchange(addr, &messages_request(addr, &header));
        assert_eq!(got.status, 403, "{header:?}: {}", got.text());
        assert!(!got.text().contains(REAL_ANTHROPIC));
    }
    let report = proxy.shutdown();
    assert_eq!(report.refused.get("wrong-token"), Some(&6));
    assert_eq!(s.anthropic.connections(), 0, "the upstream was contacted");
}

#[test]
fn a_claude_grants_proxy_refuses_a_request_for_the_openai_host() {
    let s = setup(Answer::Json);
    let claude_policy = policy("agent-claude", None);
    assert!(claude_policy
        .auth
        .iter()
        .all(|g| g.host != "api.openai.com"));
    let route = s.route("agent-claude");
    let dummy = route.dummy_token().to_owned();
    let proxy = s.serve(route);
    let addr = proxy.local_addr();
    let body = r#"{"model":"gpt-x"}"#;
    for raw in [
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: api.openai.com\r\nAuthorization: Bearer {dummy}\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
        format!("POST https://api.openai.com/v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {dummy}\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
        format!("POST http://api.anthropic.com@api.openai.com/v1/x HTTP/1.1\r\nx-api-key: {dummy}\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
        format!("CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\nx-api-key: {dummy}\r\n\r\n"),
    ] {
        let got = exchange(addr, &raw);
        assert!(got.status == 421 || got.status == 405, "{raw:?}: {} {}", got.status, got.text());
        assert!(got.text().contains("refusing:"), "{}", got.text());
    }
    let report = proxy.shutdown();
    assert_eq!(report.refused.get("wrong-host"), Some(&3));
    assert_eq!(
        s.openai.connections(),
        0,
        "the OpenAI upstream was contacted"
    );
    assert_eq!(
        s.anthropic.connections(),
        0,
        "a refused request reached Anthropic"
    );
}

#[test]
fn an_sse_response_streams_before_the_upstream_finishes() {
    let (gate_tx, gate_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let s = setup(Answer::Sse(
        Arc::new(Mutex::new(Some(gate_rx))),
        Arc::new(Mutex::new(Some(done_tx))),
    ));
    let route = s.route("agent-claude");
    let dummy = route.dummy_token().to_owned();
    let proxy = s.serve(route);
    let addr = proxy.local_addr();
    let mut c = dial(addr);
    c.write_all(messages_request(addr, &format!("x-api-key: {dummy}\r\n")).as_bytes())
        .unwrap();
    let mut r = BufReader::new(c);

    // The first event arrives while the upstream is still holding the stream open.
    let started = Instant::now();
    let mut seen = String::new();
    while !seen.contains("message_start") {
        let mut line = String::new();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream closed early: {seen}"
        );
        seen.push_str(&line);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the first event was held back: {seen}"
        );
    }
    assert!(seen.contains("text/event-stream"), "{seen}");
    assert!(
        done_rx.try_recv().is_err(),
        "the upstream had already finished: the proxy buffered"
    );
    gate_tx.send(()).unwrap();
    let mut rest = String::new();
    while !rest.contains("\r\n0\r\n\r\n") {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            break;
        }
        rest.push_str(&line);
    }
    assert!(rest.contains("message_stop"), "{rest}");
    assert!(done_rx.recv_timeout(IO_TIMEOUT).is_ok());
    proxy.shutdown();
}

#[test]
fn an_upstream_with_an_untrusted_certificate_never_receives_the_credential() {
    let s = setup(Answer::Json);
    let other_ca = TestCa::new();
    let impostor = TlsUpstream::start(other_ca.server_config(&["api.anthropic.com"]), Answer::Json);
    s.resolver
        .insert("api.anthropic.com", 443, vec![impostor.addr]);
    let route = s.route("agent-claude");
    let dummy = route.dummy_token().to_owned();
    let proxy = s.serve(route);
    let got = exchange(
        proxy.local_addr(),
        &messages_request(proxy.local_addr(), &format!("x-api-key: {dummy}\r\n")),
    );
    assert_eq!(got.status, 502, "{}", got.text());
    assert!(got.text().contains("TLS"), "{}", got.text());
    assert!(
        impostor.seen().is_empty(),
        "the impostor received a request"
    );
    // A certificate for another name, from the trusted CA, is refused the same way.
    let wrong_name = TlsUpstream::start(s.ca.server_config(&["api.openai.com"]), Answer::Json);
    s.resolver
        .insert("api.anthropic.com", 443, vec![wrong_name.addr]);
    let proxy2 = s.serve(s.route("agent-claude"));
    let dummy2 = proxy2.route().dummy_token().to_owned();
    let got = exchange(
        proxy2.local_addr(),
        &messages_request(proxy2.local_addr(), &format!("x-api-key: {dummy2}\r\n")),
    );
    assert_eq!(got.status, 502);
    assert!(wrong_name.seen().is_empty());
    assert_eq!(proxy.shutdown().upstream_errors, 1);
    proxy2.shutdown();
}

#[test]
fn the_credential_proxy_is_off_when_the_policy_says_so() {
    let s = setup(Answer::Json);
    let off = policy("agent-claude", Some("0"));
    assert!(!off.credential_proxy);
    let routes = routes_for_policy(
        &off,
        host_env,
        &s.resolver,
        &AddressRules::allowing_loopback(),
    )
    .unwrap();
    assert!(routes.is_empty());
    assert_eq!(s.resolver.times_asked(), 0);
}

#[test]
fn an_unset_host_credential_fails_the_run_closed() {
    let s = setup(Answer::Json);
    let err = routes_for_policy(
        &policy("agent-codex", None),
        |_| None,
        &s.resolver,
        &AddressRules::allowing_loopback(),
    )
    .unwrap_err();
    assert!(
        matches!(err, CredentialError::Unresolved { ref grant, .. } if grant.credential_env == "OPENAI_API_KEY"),
        "{err}"
    );
}

#[test]
fn the_production_rules_refuse_an_upstream_that_resolves_to_loopback() {
    let s = setup(Answer::Json);
    let err = routes_for_policy(
        &policy("agent-claude", None),
        host_env,
        &s.resolver,
        &AddressRules::production().unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, CredentialError::Unpinned { .. }), "{err}");
    assert!(err.to_string().contains("loopback"), "{err}");
}

#[test]
fn a_request_pipelined_behind_a_valid_one_is_checked_on_its_own() {
    let s = setup(Answer::Json);
    let route = s.route("agent-claude");
    let dummy = route.dummy_token().to_owned();
    let proxy = s.serve(route);
    let addr = proxy.local_addr();
    let mut c = dial(addr);
    let both = format!(
        "{}{}",
        messages_request(addr, &format!("x-api-key: {dummy}\r\n")),
        messages_request(addr, "")
    );
    c.write_all(both.as_bytes()).unwrap();
    let mut r = BufReader::new(c);
    assert_eq!(read_response(&mut r, "POST").unwrap().status, 200);
    assert_eq!(read_response(&mut r, "POST").unwrap().status, 401);
    assert_eq!(s.anthropic.seen().len(), 1);

    // Ambiguous framing (the stuff of request smuggling) is refused outright.
    let got = exchange(
        addr,
        &format!("POST /v1/messages HTTP/1.1\r\nx-api-key: {dummy}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    );
    assert_eq!(got.status, 400);
    assert_eq!(s.anthropic.seen().len(), 1);
    proxy.shutdown();
}

#[test]
fn a_chunked_request_body_reaches_the_upstream_whole() {
    let s = setup(Answer::Json);
    let route = s.route("agent-claude");
    let dummy = route.dummy_token().to_owned();
    let proxy = s.serve(route);
    let mut c = dial(proxy.local_addr());
    write!(c, "POST /v1/messages HTTP/1.1\r\nx-api-key: {dummy}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").unwrap();
    for part in ["{\"model\":", "\"claude-x\"", "}"] {
        write!(c, "{:x}\r\n{part}\r\n", part.len()).unwrap();
    }
    c.write_all(b"0\r\n\r\n").unwrap();
    let mut r = BufReader::new(c);
    let got = read_response(&mut r, "POST").unwrap();
    assert_eq!(got.status, 200);
    let mut tail = Vec::new();
    r.read_to_end(&mut tail).unwrap();
    assert!(tail.is_empty());
    assert_eq!(s.anthropic.seen()[0].body, b"{\"model\":\"claude-x\"}");
    proxy.shutdown();
}

#[test]
fn a_refusal_is_answered_while_the_client_is_still_sending_its_body() {
    let s = setup(Answer::Json);
    let proxy = s.serve(s.route("agent-claude"));
    let addr = proxy.local_addr();
    let body = "x".repeat(600 * 1024);
    let mut c = dial(addr);
    write!(
        c,
        "POST /v1/messages HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    // The body may or may not all be taken before the refusal; either way the answer arrives
    // as a response, not as a connection reset.
    let _ = c.write_all(body.as_bytes());
    let got = read_response(&mut BufReader::new(c), "POST").expect("a response, not a reset");
    assert_eq!(got.status, 401);
    proxy.shutdown();
    assert_eq!(s.anthropic.connections(), 0);
}
