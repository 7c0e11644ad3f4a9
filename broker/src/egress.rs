//! The egress allowlist proxy: an HTTP forward proxy (CONNECT tunnels and plain-HTTP requests in
//! absolute form) that lets a box reach exactly the `host:port` destinations of its plan, at the
//! addresses pinned when the plan was built, and counts every attempt.
//!
//! Owns [`EgressPlan`] (the policy's `net.egress` plus the user allowlist, each destination
//! resolved once through the caller's [`Resolver`](crate::pin::Resolver) and filtered by
//! [`AddressRules`](crate::pin::AddressRules)), [`EgressProxy`] (served on a listener the caller
//! hands in, so it can be created inside a box's network namespace), the tally
//! ([`EgressReport`], whose [`EgressTally`] goes into the run's receipt) and the user
//! allowlist's file format and merge rule ([`parse_user_allowlist`], [`merge_user_allowlist`]).
//!
//! Must never: resolve a name at request time (a name that re-resolves elsewhere later never
//! widens anything), dial an address that was not pinned, reach the host's loopback or its own
//! addresses (production [`AddressRules`](crate::pin::AddressRules)), or widen a deny-all
//! profile with the user allowlist.
//!
//! Decisions, stated once:
//! - A request names a destination by the name the policy lists. An IP literal (`CONNECT
//!   198.18.0.5:443`) is allowed only when that literal is itself an egress entry; being one of
//!   the pinned addresses of an allowed name is not enough, because the tally would then count a
//!   name the box never used and the literal gains nothing for proxy-respecting clients, which
//!   send names. IPv6 literals are never allowed (the policy cannot list one).
//! - `localhost`, `0.0.0.0`, `[::1]` and every other name are judged like any name: refused
//!   unless listed, and a listed one whose addresses are all refused by the rules is refused.
//! - A plain-HTTP request's `Host` header is replaced by the authority of its absolute URI
//!   (RFC 9112 3.2.2), so a box cannot ask an allowed server for another virtual host.
//! - A denial answers `403` with a `refusing: ...; to fix: ...` body and closes the connection.
//!
//! Guarded by `tests/broker_egress.rs` and the unit tests below.

use std::collections::BTreeMap;
use std::io::{self, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use h5i_policy::receipt::EgressTally;
use h5i_policy::values::normalize_host;
use h5i_policy::HostPort;

use crate::forward::{self, ExchangeError};
use crate::http1::{self, Request};
use crate::pin::{pin, AddressRules, Pinned, Resolver};
use crate::serve::{Conn, Server, Tracked};

/// How many denied attempts a report keeps in full (host, port, time, reason).
pub const DEFAULT_KEEP_DENIED: usize = 20;
/// Distinct denied destinations counted by name; more are counted under [`OTHER_DENIED`].
pub const MAX_DENIED_KEYS: usize = 256;
/// The tally key for denied destinations beyond [`MAX_DENIED_KEYS`].
pub const OTHER_DENIED: &str = "(other destinations)";
/// The tally key for a request whose destination could not be read.
pub const MALFORMED: &str = "(malformed)";

/// The destinations one run may reach, each pinned to the addresses it had when the plan was
/// built.
#[derive(Debug, Clone)]
pub struct EgressPlan {
    entries: BTreeMap<(String, u16), Pinned>,
}

/// Why an attempt was denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// The destination is not in the plan.
    NotAllowed,
    /// An IP literal that is not itself an egress entry (IPv6 literals never are).
    AddressLiteral,
    /// Listed, but no usable address was pinned when the plan was built.
    Unusable(String),
    /// The request's destination could not be read.
    Malformed(String),
}

impl DenyReason {
    /// Why, in words, for a refusal body and the report.
    pub fn describe(&self) -> String {
        match self {
            DenyReason::NotAllowed => "not in this box's egress allowlist".into(),
            DenyReason::AddressLiteral => {
                "an IP address, and only names (or IPv4 addresses listed as they are) are allowed"
                    .into()
            }
            DenyReason::Unusable(why) => format!("allowed, but unusable for this run: {why}"),
            DenyReason::Malformed(why) => format!("the destination could not be read: {why}"),
        }
    }
}

/// The plan's answer for one destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Dial these pinned addresses, in order.
    Allow(&'a [SocketAddr]),
    /// Refuse.
    Deny(DenyReason),
}

impl EgressPlan {
    /// Resolve every destination once and pin what the rules allow. Never fails: a destination
    /// with no usable address stays in the plan as unusable (denied, with its reason) and is
    /// listed by [`EgressPlan::unusable`], for the caller to report or refuse the run.
    pub fn build(egress: &[HostPort], resolver: &dyn Resolver, rules: &AddressRules) -> Self {
        let mut entries = BTreeMap::new();
        for hp in egress {
            let key = (hp.host.to_ascii_lowercase(), hp.port);
            if entries.contains_key(&key) {
                continue;
            }
            let pinned = pin(&key.0, key.1, resolver, rules);
            entries.insert(key, pinned);
        }
        EgressPlan { entries }
    }

    /// A plan that allows nothing.
    pub fn deny_all() -> Self {
        EgressPlan {
            entries: BTreeMap::new(),
        }
    }

    /// Every destination and what it was pinned to.
    pub fn destinations(&self) -> impl Iterator<Item = (HostPort, &Pinned)> {
        self.entries.iter().map(|((host, port), p)| {
            (
                HostPort {
                    host: host.clone(),
                    port: *port,
                },
                p,
            )
        })
    }

    /// The destinations that have no usable address, with why.
    pub fn unusable(&self) -> Vec<(HostPort, String)> {
        self.destinations()
            .filter_map(|(hp, p)| match p {
                Pinned::Unusable(why) => Some((hp, why.clone())),
                Pinned::Addrs(_) => None,
            })
            .collect()
    }

    /// Judge a destination as a request named it (`host` as written, before normalization).
    pub fn decide(&self, host: &str, port: u16) -> Decision<'_> {
        let host = host.strip_suffix('.').unwrap_or(host);
        if host.starts_with('[') || host.contains(':') {
            return Decision::Deny(DenyReason::AddressLiteral);
        }
        let Ok(name) = normalize_host(host) else {
            return Decision::Deny(DenyReason::Malformed(format!(
                "`{}` is not a host name",
                printable(host)
            )));
        };
        let entry = self.entries.get(&(name.clone(), port));
        if name.parse::<std::net::Ipv4Addr>().is_ok() && entry.is_none() {
            return Decision::Deny(DenyReason::AddressLiteral);
        }
        match entry {
            None => Decision::Deny(DenyReason::NotAllowed),
            Some(Pinned::Unusable(why)) => Decision::Deny(DenyReason::Unusable(why.clone())),
            Some(Pinned::Addrs(a)) => Decision::Allow(a),
        }
    }
}

/// One denied attempt, kept in full for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedAttempt {
    /// The host as the request named it (normalized; `(malformed)` when unreadable).
    pub host: String,
    /// The port it named (0 when unreadable).
    pub port: u16,
    /// When, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// `CONNECT` or the plain-HTTP method.
    pub method: String,
    /// Why it was denied.
    pub reason: String,
}

/// What the proxy saw in one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressReport {
    /// Per-`host:port` allowed and denied counts (the receipt's egress summary).
    pub tally: EgressTally,
    /// The first denied attempts, in order (at most the configured number).
    pub first_denied: Vec<DeniedAttempt>,
    /// Every denied attempt, counted.
    pub denied_total: u64,
    /// Allowed destinations the proxy could not reach (connect failed), per `host:port`.
    pub unreachable: BTreeMap<String, u64>,
    /// Connection threads still running when shutdown stopped waiting (0 on a clean stop).
    pub lingering: usize,
}

/// Proxy settings.
#[derive(Debug, Clone)]
pub struct EgressOptions {
    /// Per-address connect timeout.
    pub connect_timeout: Duration,
    /// How long a client connection may sit idle between requests (and take to send a head).
    pub idle_timeout: Duration,
    /// How long the upstream may go quiet in a plain-HTTP response.
    pub upstream_timeout: Duration,
    /// How many denied attempts to keep in full.
    pub keep_denied: usize,
    /// How long shutdown waits for connection threads.
    pub shutdown_grace: Duration,
}

impl Default for EgressOptions {
    fn default() -> Self {
        EgressOptions {
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            upstream_timeout: Duration::from_secs(600),
            keep_denied: DEFAULT_KEEP_DENIED,
            shutdown_grace: Duration::from_secs(2),
        }
    }
}

struct Shared {
    plan: EgressPlan,
    opts: EgressOptions,
    report: Mutex<EgressReport>,
}

impl Shared {
    fn allowed(&self, key: &str) {
        if let Ok(mut r) = self.report.lock() {
            *r.tally.allowed.entry(key.to_owned()).or_default() += 1;
        }
    }

    fn unreachable(&self, key: &str) {
        if let Ok(mut r) = self.report.lock() {
            *r.unreachable.entry(key.to_owned()).or_default() += 1;
        }
    }

    fn denied(&self, host: &str, port: u16, method: &str, reason: &DenyReason) {
        let Ok(mut r) = self.report.lock() else {
            return;
        };
        let key = if host == MALFORMED {
            MALFORMED.to_owned()
        } else {
            format!("{host}:{port}")
        };
        let key = if r.tally.denied.contains_key(&key) || r.tally.denied.len() < MAX_DENIED_KEYS {
            key
        } else {
            OTHER_DENIED.to_owned()
        };
        *r.tally.denied.entry(key).or_default() += 1;
        r.denied_total += 1;
        if r.first_denied.len() < self.opts.keep_denied {
            r.first_denied.push(DeniedAttempt {
                host: host.to_owned(),
                port,
                at_ms: now_ms(),
                method: printable(method),
                reason: reason.describe(),
            });
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A box-supplied string made safe for a report: printable ASCII only, at most 255 bytes.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .take(255)
        .collect()
}

/// A host as the tally names it: normalized when it is a name, kept (sanitized) when it is an
/// address literal, `(malformed)` otherwise.
fn tally_host(host: &str) -> String {
    let h = host.strip_suffix('.').unwrap_or(host);
    if let Ok(n) = normalize_host(h) {
        return n;
    }
    let literal = h.len() <= 64
        && h.bytes()
            .all(|b| b.is_ascii_hexdigit() || b":.[]".contains(&b));
    if literal && !h.is_empty() {
        h.to_ascii_lowercase()
    } else {
        MALFORMED.to_owned()
    }
}

/// Split `host:port` (authority form; `[v6]:port` too). The port is required.
fn split_authority(auth: &str) -> Option<(&str, u16)> {
    let (host, port) = if let Some(rest) = auth.strip_prefix('[') {
        let end = rest.find(']')?;
        let port = rest[end + 1..].strip_prefix(':')?;
        (&auth[..end + 2], port)
    } else {
        auth.rsplit_once(':')?
    };
    if host.is_empty()
        || port.is_empty()
        || port.len() > 5
        || !port.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    Some((host, port))
}

/// The destination and origin-form target of an absolute-form `http://` request target.
fn split_absolute(target: &str) -> Result<(String, u16, String), String> {
    let lower = target
        .get(..8)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    if lower.starts_with("https://") {
        return Err(
            "an https:// URL sent as a plain request; use CONNECT (set HTTPS_PROXY)".into(),
        );
    }
    if !lower.starts_with("http://") {
        return Err(
            "not an absolute http:// URL; this is a forward proxy (set HTTP_PROXY/HTTPS_PROXY)"
                .into(),
        );
    }
    let rest = &target[7..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err("the URL carries user info".into());
    }
    let (host, port) = if authority.starts_with('[') || authority.contains(':') {
        let (h, p) = split_authority(authority).ok_or("the URL's port is not a number")?;
        (h.to_owned(), p)
    } else {
        (authority.to_owned(), 80)
    };
    if host.is_empty() {
        return Err("the URL has no host".into());
    }
    let path = if path.is_empty() {
        "/".to_owned()
    } else if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    // A fragment never goes on the wire.
    let path = path.split('#').next().unwrap_or("/").to_owned();
    Ok((host, port, path))
}

/// The request-target handling, driven on `target` for the fuzz targets (`fuzzing` feature):
/// what it splits out holds the properties the proxy relies on.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_target(target: &str) {
    let plan = EgressPlan::deny_all();
    if let Some((host, port)) = split_authority(target) {
        assert!(
            port != 0 && !host.is_empty(),
            "split {target:?} into {host:?}:{port}"
        );
        let _ = tally_host(host);
        let _ = plan.decide(host, port);
    }
    if let Ok((host, port, path)) = split_absolute(target) {
        assert!(
            path.starts_with('/') && !path.contains('#') && !host.contains('@') && port != 0,
            "split {target:?} into {host:?}:{port} {path:?}"
        );
        let _ = tally_host(&host);
        let _ = plan.decide(&host, port);
    }
    assert!(printable(target).len() <= 255);
}

/// The egress proxy, running.
pub struct EgressProxy {
    server: Server,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("local_addr", &self.server.local_addr())
            .finish_non_exhaustive()
    }
}

impl EgressProxy {
    /// Serve `listener` (made by the caller, inside the box's network namespace when the box
    /// must reach it there) with `plan`. Each connection runs on its own thread; the proxy stops
    /// with [`EgressProxy::shutdown`] (or when dropped).
    pub fn serve(listener: TcpListener, plan: EgressPlan, opts: EgressOptions) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            plan,
            opts,
            report: Mutex::new(EgressReport::default()),
        });
        let s = Arc::clone(&shared);
        let server = Server::start(
            listener,
            "egress",
            Arc::new(move |conn| handle(conn, &s)),
            busy,
        )?;
        Ok(EgressProxy { server, shared })
    }

    /// The address the proxy listens on (in the listener's namespace).
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// What the proxy has seen so far.
    pub fn report(&self) -> EgressReport {
        self.shared
            .report
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Stop accepting, end every open connection and tunnel, and return the final report.
    pub fn shutdown(mut self) -> EgressReport {
        let lingering = self.server.shutdown(self.shared.opts.shutdown_grace);
        let mut r = self.report();
        r.lingering = lingering;
        r
    }
}

fn busy(s: &mut TcpStream) {
    let body = "refusing: too many open connections through the egress proxy; to fix: close some and retry\n";
    let _ = s.write_all(&http1::simple_response(
        503,
        "Service Unavailable",
        "text/plain",
        body,
        true,
    ));
}

fn refuse(out: &mut TcpStream, status: u16, reason: &str, body: &str) {
    http1::send_final(
        out,
        &http1::simple_response(status, reason, "text/plain; charset=utf-8", body, true),
    );
}

fn deny_body(method: &str, host: &str, port: u16, reason: &DenyReason) -> String {
    let dest = if host == MALFORMED {
        MALFORMED.to_owned()
    } else {
        format!("{host}:{port}")
    };
    let mend = match reason {
        DenyReason::NotAllowed => format!(
            "add `{host}:{port}` to the profile's net.egress, or `h5i box allow {host}:{port}` on the host for a profile that already sets egress"
        ),
        DenyReason::AddressLiteral => "name the host as the policy lists it".into(),
        DenyReason::Unusable(_) => "check the name resolves to a public address on the host, then start a new run".into(),
        DenyReason::Malformed(_) => "send `CONNECT host:port` or an absolute http:// URL".into(),
    };
    format!(
        "h5i egress: refusing: {method} to {dest}: {}; to fix: {mend}\n",
        reason.describe()
    )
}

fn connect_pinned(addrs: &[SocketAddr], timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no pinned address");
    for a in addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn handle(conn: Conn, shared: &Shared) {
    let Ok(read_half) = conn.stream.try_clone() else {
        return;
    };
    let _ = conn.stream.set_read_timeout(Some(shared.opts.idle_timeout));
    let mut out = match conn.stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    };
    let mut client = BufReader::with_capacity(64 * 1024, read_half);
    // The kept-alive plain-HTTP upstream: (destination key, connection, its tracking).
    let mut upstream: Option<Upstream> = None;
    loop {
        let req = match http1::read_request(&mut client) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(http1::HeadError::Io(_)) | Err(http1::HeadError::Truncated) => return,
            Err(e) => {
                shared.denied(MALFORMED, 0, "?", &DenyReason::Malformed(e.to_string()));
                refuse(&mut out, 400, "Bad Request", &format!("h5i egress: refusing: a malformed request ({e}); to fix: send CONNECT host:port or an absolute http:// URL\n"));
                return;
            }
        };
        if req.method.eq_ignore_ascii_case("CONNECT") {
            connect(&conn, shared, client, out, &req);
            return;
        }
        match plain(&conn, shared, &mut client, &mut out, req, &mut upstream) {
            true => continue,
            false => return,
        }
    }
}

type Upstream = (String, BufReader<TcpStream>, Tracked);

/// A CONNECT: judge, dial the pinned address, answer 200 and pump until both sides close.
fn connect(
    conn: &Conn,
    shared: &Shared,
    client: BufReader<TcpStream>,
    mut out: TcpStream,
    req: &Request,
) {
    let Some((host, port)) = split_authority(&req.target) else {
        let reason =
            DenyReason::Malformed(format!("`{}` is not host:port", printable(&req.target)));
        shared.denied(MALFORMED, 0, "CONNECT", &reason);
        refuse(
            &mut out,
            400,
            "Bad Request",
            &deny_body("CONNECT", MALFORMED, 0, &reason),
        );
        return;
    };
    let shown = tally_host(host);
    let addrs = match shared.plan.decide(host, port) {
        Decision::Allow(a) => a,
        Decision::Deny(reason) => {
            shared.denied(&shown, port, "CONNECT", &reason);
            refuse(
                &mut out,
                403,
                "Forbidden",
                &deny_body("CONNECT", &shown, port, &reason),
            );
            return;
        }
    };
    let key = format!("{shown}:{port}");
    shared.allowed(&key);
    let up = match connect_pinned(addrs, shared.opts.connect_timeout) {
        Ok(s) => s,
        Err(e) => {
            shared.unreachable(&key);
            refuse(&mut out, 502, "Bad Gateway", &format!("h5i egress: refusing: CONNECT to {key}: the pinned address did not answer ({e}); to fix: check the destination is up\n"));
            return;
        }
    };
    let Ok(_tracked) = conn.track(&up) else {
        return;
    };
    let _ = conn.stream.set_read_timeout(None);
    if out
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    // Bytes the client sent right behind the CONNECT head (a pipelined TLS hello) go first.
    let pending = client.buffer().to_vec();
    let client = client.into_inner();
    if !pending.is_empty() && (&up).write_all(&pending).is_err() {
        return;
    }
    drop(out);
    let _ = crate::tunnel::run(client, up);
}

/// A plain-HTTP request in absolute form. Returns whether the client connection stays open.
fn plain(
    conn: &Conn,
    shared: &Shared,
    client: &mut BufReader<TcpStream>,
    out: &mut TcpStream,
    mut req: Request,
    upstream: &mut Option<Upstream>,
) -> bool {
    let method = printable(&req.method);
    let (host, port, path) = match split_absolute(&req.target) {
        Ok(d) => d,
        Err(why) => {
            let reason = DenyReason::Malformed(why);
            shared.denied(MALFORMED, 0, &method, &reason);
            refuse(
                out,
                400,
                "Bad Request",
                &deny_body(&method, MALFORMED, 0, &reason),
            );
            return false;
        }
    };
    let shown = tally_host(&host);
    let addrs = match shared.plan.decide(&host, port) {
        Decision::Allow(a) => a,
        Decision::Deny(reason) => {
            shared.denied(&shown, port, &method, &reason);
            refuse(
                out,
                403,
                "Forbidden",
                &deny_body(&method, &shown, port, &reason),
            );
            return false;
        }
    };
    let body = match req.body() {
        Ok(b) => b,
        Err(why) => {
            refuse(out, 400, "Bad Request", &format!("h5i egress: refusing: {why}; to fix: send one unambiguous Content-Length or Transfer-Encoding: chunked\n"));
            return false;
        }
    };
    let key = format!("{shown}:{port}");
    shared.allowed(&key);
    let expect = req.headers.has_token("expect", "100-continue");
    let wants_close = req.wants_close();
    req.headers.strip_hop_by_hop();
    req.headers.set_framing(body);
    req.headers.remove("host");
    let authority = if port == 80 {
        shown.clone()
    } else {
        key.clone()
    };
    req.headers.0.insert(
        0,
        http1::Header {
            name: "Host".into(),
            value: authority,
        },
    );
    req.target = path;

    let reuse = matches!(upstream, Some((k, up, _)) if *k == key && up.buffer().is_empty() && !forward::is_stale(up.get_ref()));
    if !reuse {
        *upstream = None;
        match connect_pinned(addrs, shared.opts.connect_timeout) {
            Ok(s) => {
                let Ok(tracked) = conn.track(&s) else {
                    return false;
                };
                let _ = s.set_read_timeout(Some(shared.opts.upstream_timeout));
                *upstream = Some((key.clone(), BufReader::with_capacity(64 * 1024, s), tracked));
            }
            Err(e) => {
                shared.unreachable(&key);
                refuse(out, 502, "Bad Gateway", &format!("h5i egress: refusing: {method} to {key}: the pinned address did not answer ({e}); to fix: check the destination is up\n"));
                return false;
            }
        }
    }
    let Some((_, up, _)) = upstream.as_mut() else {
        return false;
    };
    match forward::exchange(client, out, &req, body, wants_close, expect, up) {
        Ok(x) => {
            if !x.upstream_reusable {
                *upstream = None;
            }
            x.client_keep
        }
        Err(ExchangeError::Upstream(why)) => {
            refuse(out, 502, "Bad Gateway", &format!("h5i egress: refusing: {method} to {key}: {why}; to fix: check the destination is up\n"));
            false
        }
        Err(ExchangeError::Abort) => false,
    }
}

/// A user allowlist line that is not a destination.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing: the user egress allowlist, line {line}: {what}; to fix: {mend}")]
pub struct AllowlistError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub what: String,
    /// How to mend it.
    pub mend: String,
}

/// Parse the user allowlist (`~/.config/h5i/allow.txt`): one `host` or `host:port` per line
/// (port 443 when absent), validated exactly as `net.egress` entries are; blank lines and lines
/// starting with `#` are skipped. The result is sorted and deduplicated.
pub fn parse_user_allowlist(text: &str) -> Result<Vec<HostPort>, AllowlistError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let hp: HostPort = line
            .parse()
            .map_err(|p: h5i_policy::values::ValueProblem| AllowlistError {
                line: i + 1,
                what: p.what,
                mend: p.mend,
            })?;
        out.push(hp);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The user allowlist as file text, one entry per line.
pub fn render_user_allowlist(entries: &[HostPort]) -> String {
    let mut sorted = entries.to_vec();
    sorted.sort();
    sorted.dedup();
    let mut s = String::from(
        "# h5i user egress allowlist: one host or host:port per line (port 443 when absent).\n# Merged into boxes whose profile already sets net.egress; a deny-all profile is never widened.\n",
    );
    for hp in sorted {
        s.push_str(&hp.to_string());
        s.push('\n');
    }
    s
}

/// The egress a run gets: the profile's own, plus the user allowlist only when the profile
/// already sets egress. A deny-all profile (no egress entries) stays deny-all.
pub fn merge_user_allowlist(policy_egress: &[HostPort], user: &[HostPort]) -> Vec<HostPort> {
    let mut out = policy_egress.to_vec();
    if !policy_egress.is_empty() {
        out.extend_from_slice(user);
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pin::MapResolver;

    fn hp(s: &str) -> HostPort {
        s.parse().unwrap()
    }

    #[test]
    fn the_user_allowlist_never_widens_a_deny_all_profile() {
        let user = vec![hp("registry.npmjs.org"), hp("api.github.com")];
        assert!(merge_user_allowlist(&[], &user).is_empty());
        let merged = merge_user_allowlist(&[hp("api.anthropic.com")], &user);
        assert_eq!(
            merged,
            vec![
                hp("api.anthropic.com"),
                hp("api.github.com"),
                hp("registry.npmjs.org")
            ]
        );
    }

    #[test]
    fn allowlist_lines_are_validated_like_egress_entries() {
        let ok = parse_user_allowlist("# c\n\nAPI.GitHub.com\nx.test:8443\napi.github.com:443\n")
            .unwrap();
        assert_eq!(ok, vec![hp("api.github.com"), hp("x.test:8443")]);
        let err = parse_user_allowlist("ok.test\nhttps://bad.test\n").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.to_string().starts_with("refusing: "), "{err}");
        assert!(err.to_string().contains("to fix: "), "{err}");
        assert_eq!(
            parse_user_allowlist(&render_user_allowlist(&ok)).unwrap(),
            ok
        );
    }

    #[test]
    fn literals_are_allowed_only_when_listed_as_they_are() {
        let m = MapResolver::new();
        m.insert("a.test", 443, vec!["198.18.0.7:443".parse().unwrap()]);
        let plan = EgressPlan::build(
            &[hp("a.test"), hp("198.18.0.9:443")],
            &m,
            &AddressRules::allowing_loopback(),
        );
        assert!(matches!(plan.decide("a.test", 443), Decision::Allow(_)));
        assert!(matches!(plan.decide("A.TEST.", 443), Decision::Allow(_)));
        assert_eq!(
            plan.decide("a.test", 80),
            Decision::Deny(DenyReason::NotAllowed)
        );
        assert_eq!(
            plan.decide("198.18.0.7", 443),
            Decision::Deny(DenyReason::AddressLiteral)
        );
        assert!(matches!(plan.decide("198.18.0.9", 443), Decision::Allow(_)));
        for lit in ["[::1]", "::1", "[::ffff:198.18.0.7]"] {
            assert_eq!(
                plan.decide(lit, 443),
                Decision::Deny(DenyReason::AddressLiteral),
                "{lit}"
            );
        }
        assert!(matches!(
            plan.decide("a b", 443),
            Decision::Deny(DenyReason::Malformed(_))
        ));
    }

    #[test]
    fn authorities_and_absolute_urls_split() {
        assert_eq!(split_authority("a.test:443"), Some(("a.test", 443)));
        assert_eq!(split_authority("[::1]:443"), Some(("[::1]", 443)));
        assert_eq!(split_authority("a.test"), None);
        assert_eq!(split_authority("a.test:0"), None);
        assert_eq!(split_authority("a.test:99999"), None);
        assert_eq!(
            split_absolute("http://A.test:8080/x?y#z").unwrap(),
            ("A.test".into(), 8080, "/x?y".into())
        );
        assert_eq!(
            split_absolute("http://a.test").unwrap(),
            ("a.test".into(), 80, "/".into())
        );
        assert!(split_absolute("https://a.test/").is_err());
        assert!(split_absolute("/relative").is_err());
        assert!(split_absolute("http://u@a.test/").is_err());
    }

    #[test]
    fn tally_hosts_are_normalized_or_marked_malformed() {
        assert_eq!(tally_host("API.test."), "api.test");
        assert_eq!(tally_host("[::1]"), "[::1]");
        assert_eq!(tally_host("evil\x1b[31m"), MALFORMED);
        assert_eq!(tally_host("a b"), MALFORMED);
    }
}
