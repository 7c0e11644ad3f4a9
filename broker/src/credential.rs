//! The credential proxy: a reverse proxy, one per authenticated-egress grant per run, that the
//! box reaches through the grant's base-URL variable. The box holds only a per-run dummy token;
//! the proxy checks it on every request, swaps in the real credential read on the host, and
//! forwards over verified TLS to the grant's pinned upstream.
//!
//! Owns [`CredentialRoute`] (one grant: its upstream pinned once, the real credential, the dummy),
//! [`routes_for_policy`] (the routes a policy's grants ask for; none when `credential_proxy` is
//! off), [`UpstreamTls`] (webpki roots, plus a caller-supplied root for tests) and
//! [`CredentialProxy`] (served on a listener the caller hands in).
//!
//! Must never: forward a request whose every credential header does not carry this route's
//! dummy (compared in constant time), send the dummy upstream, forward anywhere but this route's
//! pinned upstream, send a byte before the upstream's certificate verified for the grant's host,
//! put the real credential in an error, a `Debug` output or a response to the box, or buffer a
//! streamed (SSE) response.
//!
//! Decisions, stated once:
//! - Credential headers are `x-api-key` (Anthropic clients) and `Authorization` with the scheme
//!   `Bearer` (Anthropic and OpenAI clients) or `token` (GitHub). The real credential goes into
//!   the same header and scheme the dummy came in. A request with none is refused `401`; one
//!   with a wrong dummy, or with another scheme, `403`. Either way the upstream never sees it.
//! - A request names its destination by `Host` (or an absolute URI). Accepted: the grant's own
//!   host, `localhost`, an IP literal (the box dialed the proxy by address) and names the caller
//!   adds with [`CredentialRoute::accept_host_name`] (e.g. `host.containers.internal`). Any other
//!   name is refused `421`: a Claude box's proxy answers a request for `api.openai.com` with a
//!   refusal, never with Anthropic's upstream. `Host` is rewritten to the grant's host upstream.
//! - `H5I_CREDENTIAL_PROXY=0` (policy `credential_proxy = false`): [`routes_for_policy`] returns
//!   no routes and no proxy runs; the caller then passes the real credential into the box
//!   itself under the grant's `token_var`, and leaves the base-URL variable unset.
//!
//! Guarded by `tests/broker_credential.rs` and the unit tests below.

use std::collections::BTreeMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use h5i_policy::values::normalize_host;
use h5i_policy::{AuthGrant, ResolvedPolicy};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use crate::forward::{self, ExchangeError};
use crate::http1::{self, Request};
use crate::pin::{pin, AddressRules, Pinned, Resolver};
use crate::redact::SecretValue;
use crate::serve::{Conn, Server, Tracked};

/// The credential proxy cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// None of the grant's host variables is set (non-empty).
    #[error("refusing: the credential for {host} cannot be read: host variable {} is not set; to fix: export {} in the shell that runs h5i (it stays on the host), or drop the grant from the profile", .grant.credential_vars(), assignments(.grant))]
    Unresolved {
        /// The grant's upstream host.
        host: String,
        /// The grant.
        grant: Box<AuthGrant>,
    },
    /// The grant's host is not a DNS name TLS can verify.
    #[error("refusing: credential grant host `{host}` is not a DNS name: {why}; to fix: name the API host in the grant, like \"api.github.com\"")]
    BadHost {
        /// The grant's host.
        host: String,
        /// What is wrong.
        why: String,
    },
    /// The upstream has no usable address.
    #[error("refusing: the credential proxy's upstream {host} has no usable address: {why}; to fix: check {host} resolves to a public address on the host, then start a new run")]
    Unpinned {
        /// The grant's host.
        host: String,
        /// Why.
        why: String,
    },
    /// A caller-supplied TLS root is not a usable certificate.
    #[error("refusing: the extra TLS root certificate is not usable: {0}; to fix: pass one DER-encoded CA certificate")]
    Root(String),
    /// No randomness for the dummy token.
    #[error(
        "refusing: cannot make a per-run dummy token: {0}; to fix: check /dev/urandom is readable"
    )]
    Random(io::Error),
}

/// How the proxy verifies its upstreams.
#[derive(Clone)]
pub struct UpstreamTls {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpstreamTls")
    }
}

impl UpstreamTls {
    /// The Mozilla root set (`webpki-roots`), as every real run uses.
    pub fn webpki() -> Result<Self, CredentialError> {
        Self::build(None)
    }

    /// The Mozilla root set plus one more CA (DER), for tests whose stand-in upstreams use a CA
    /// the test made.
    pub fn webpki_with_extra_root(der: &[u8]) -> Result<Self, CredentialError> {
        Self::build(Some(der))
    }

    fn build(extra: Option<&[u8]>) -> Result<Self, CredentialError> {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(der) = extra {
            roots
                .add(CertificateDer::from(der.to_vec()))
                .map_err(|e| CredentialError::Root(e.to_string()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| CredentialError::Root(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(UpstreamTls {
            config: Arc::new(config),
        })
    }
}

/// Base-URL paths some clients expect after the origin (OpenAI clients append `/chat/...` to a
/// base that already ends in `/v1`). Reviewed data: host, path, why.
const BASE_URL_PATHS: &[(&str, &str)] = &[
    // OpenAI SDKs and Codex read OPENAI_BASE_URL as `https://api.openai.com/v1`.
    ("api.openai.com", "/v1"),
];

/// One grant, ready to serve: the upstream pinned once, the real credential, the dummy.
pub struct CredentialRoute {
    grant: AuthGrant,
    pinned: Vec<SocketAddr>,
    credential: String,
    dummy: String,
    extra_names: Vec<String>,
}

impl std::fmt::Debug for CredentialRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialRoute")
            .field("host", &self.grant.host)
            .field("pinned", &self.pinned)
            .field("credential", &"<redacted>")
            .field("dummy", &"<redacted>")
            .finish()
    }
}

/// The port every credential upstream is dialed on (HTTPS).
pub const UPSTREAM_PORT: u16 = 443;

impl CredentialRoute {
    /// Resolve `grant` for one run: read its real credential through `lookup` (the host's
    /// environment in production), pin its host once through `resolver` under `rules`, and make
    /// a fresh dummy token. Fails closed on each.
    pub fn new(
        grant: &AuthGrant,
        lookup: impl Fn(&str) -> Option<String>,
        resolver: &dyn Resolver,
        rules: &AddressRules,
    ) -> Result<Self, CredentialError> {
        let host = normalize_host(&grant.host).map_err(|why| CredentialError::BadHost {
            host: grant.host.clone(),
            why,
        })?;
        if host.parse::<IpAddr>().is_ok() {
            return Err(CredentialError::BadHost {
                host,
                why: "it is an IP address, and certificates are checked against a name".into(),
            });
        }
        let (mut grant, credential) =
            grant
                .choose(lookup)
                .ok_or_else(|| CredentialError::Unresolved {
                    host: host.clone(),
                    grant: Box::new(grant.clone()),
                })?;
        let pinned = match pin(&host, UPSTREAM_PORT, resolver, rules) {
            Pinned::Addrs(a) => a,
            Pinned::Unusable(why) => return Err(CredentialError::Unpinned { host, why }),
        };
        grant.host = host;
        Ok(CredentialRoute {
            grant,
            pinned,
            credential,
            dummy: dummy_token().map_err(CredentialError::Random)?,
            extra_names: Vec::new(),
        })
    }

    /// Also accept requests whose `Host` is `name` (how the box reaches the proxy, when that is
    /// a name: `host.containers.internal` under Podman).
    pub fn accept_host_name(mut self, name: &str) -> Self {
        if let Ok(n) = normalize_host(name) {
            self.extra_names.push(n);
        }
        self
    }

    /// The grant this route serves.
    pub fn grant(&self) -> &AuthGrant {
        &self.grant
    }

    /// The addresses the upstream was pinned to.
    pub fn pinned(&self) -> &[SocketAddr] {
        &self.pinned
    }

    /// The per-run dummy token the box is handed in `token_var`.
    pub fn dummy_token(&self) -> &str {
        &self.dummy
    }

    /// The base URL the box is handed in `base_url_var`, for a proxy the box reaches at `addr`.
    pub fn base_url(&self, addr: SocketAddr) -> String {
        let path = BASE_URL_PATHS
            .iter()
            .find(|(h, _)| *h == self.grant.host)
            .map_or("", |(_, p)| p);
        format!("http://{addr}{path}")
    }

    /// The variables the box gets for this grant: `base_url_var` and `token_var` (the dummy).
    pub fn box_env(&self, addr: SocketAddr) -> Vec<(String, String)> {
        vec![
            (self.grant.base_url_var.clone(), self.base_url(addr)),
            (self.grant.token_var.clone(), self.dummy.clone()),
        ]
    }

    /// The real credential as a value for the redactor (recorded as `credential:<VAR>`), so it is
    /// scrubbed from anything h5i writes.
    pub fn redaction(&self) -> SecretValue {
        SecretValue::new(
            format!("credential:{}", self.grant.credential_env),
            self.credential.clone(),
        )
    }
}

/// `A=...`, or `A=... (or B=...)` for a grant with fallbacks.
fn assignments(grant: &AuthGrant) -> String {
    let mut vars = grant
        .credential_choices()
        .map(|(env, _)| format!("{env}=..."));
    let first = vars.next().unwrap_or_default();
    let rest: Vec<String> = vars.collect();
    if rest.is_empty() {
        first
    } else {
        format!("{first} (or {})", rest.join(", "))
    }
}

/// How every per-run dummy begins (what tells it from a real key in the box).
pub const DUMMY_PREFIX: &str = "h5i-dummy-";

/// A fresh dummy: [`DUMMY_PREFIX`] and 64 lowercase hex digits from the kernel's CSPRNG.
fn dummy_token() -> io::Result<String> {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!("{DUMMY_PREFIX}{hex}"))
}

/// The routes a policy's grants ask for, one per grant; empty when the policy turned the
/// credential proxy off (`H5I_CREDENTIAL_PROXY=0`) or declares no grants. Fails closed when any
/// grant cannot be served.
pub fn routes_for_policy(
    policy: &ResolvedPolicy,
    lookup: impl Fn(&str) -> Option<String>,
    resolver: &dyn Resolver,
    rules: &AddressRules,
) -> Result<Vec<CredentialRoute>, CredentialError> {
    if !policy.credential_proxy {
        return Ok(Vec::new());
    }
    policy
        .auth_grants()
        .iter()
        .map(|g| CredentialRoute::new(g, &lookup, resolver, rules))
        .collect()
}

/// Constant-time equality for equal-length secrets (the length of the dummy is public).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// Proxy settings.
#[derive(Debug, Clone)]
pub struct CredentialOptions {
    /// Per-address connect timeout to the upstream.
    pub connect_timeout: Duration,
    /// The TLS handshake's limit.
    pub handshake_timeout: Duration,
    /// How long the upstream may go quiet mid-response (a streamed answer's gaps).
    pub upstream_timeout: Duration,
    /// How long a box connection may sit idle between requests.
    pub idle_timeout: Duration,
    /// How long shutdown waits for connection threads.
    pub shutdown_grace: Duration,
}

impl Default for CredentialOptions {
    fn default() -> Self {
        CredentialOptions {
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(15),
            upstream_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(2),
        }
    }
}

/// Why a request was refused, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// No credential header.
    MissingToken,
    /// A credential header that is not this run's dummy (or an unsupported scheme).
    WrongToken,
    /// A request naming another host.
    WrongHost,
    /// Not a request this proxy serves (CONNECT, unreadable, ambiguous framing).
    Malformed,
}

impl Refusal {
    /// The report's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MissingToken => "missing-token",
            Refusal::WrongToken => "wrong-token",
            Refusal::WrongHost => "wrong-host",
            Refusal::Malformed => "malformed",
        }
    }
}

/// What one credential proxy saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialReport {
    /// The upstream host.
    pub host: String,
    /// Requests forwarded with the real credential.
    pub forwarded: u64,
    /// Requests refused, by why.
    pub refused: BTreeMap<&'static str, u64>,
    /// Upstream answers, by status (a `401` here means the host's real credential was refused).
    pub statuses: BTreeMap<u16, u64>,
    /// Forwarded requests the upstream failed (connect, TLS, or a broken response).
    pub upstream_errors: u64,
    /// Connection threads still running when shutdown stopped waiting.
    pub lingering: usize,
}

struct Shared {
    route: CredentialRoute,
    tls: UpstreamTls,
    opts: CredentialOptions,
    report: Mutex<CredentialReport>,
}

impl Shared {
    fn count(&self, f: impl FnOnce(&mut CredentialReport)) {
        if let Ok(mut r) = self.report.lock() {
            f(&mut r);
        }
    }
}

/// One grant's credential proxy, running.
pub struct CredentialProxy {
    server: Server,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CredentialProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialProxy")
            .field("local_addr", &self.server.local_addr())
            .field("host", &self.shared.route.grant.host)
            .finish_non_exhaustive()
    }
}

impl CredentialProxy {
    /// Serve `route` on `listener` (made by the caller where the box can reach it; the box is
    /// handed [`CredentialRoute::box_env`] for that address).
    pub fn serve(
        listener: TcpListener,
        route: CredentialRoute,
        tls: UpstreamTls,
        opts: CredentialOptions,
    ) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            report: Mutex::new(CredentialReport {
                host: route.grant.host.clone(),
                ..CredentialReport::default()
            }),
            route,
            tls,
            opts,
        });
        let s = Arc::clone(&shared);
        let server = Server::start(
            listener,
            "credential",
            Arc::new(move |conn| handle(conn, &s)),
            busy,
        )?;
        Ok(CredentialProxy { server, shared })
    }

    /// The listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The route it serves.
    pub fn route(&self) -> &CredentialRoute {
        &self.shared.route
    }

    /// What it has seen so far.
    pub fn report(&self) -> CredentialReport {
        self.shared
            .report
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Stop, end every connection, and return the final report.
    pub fn shutdown(mut self) -> CredentialReport {
        let lingering = self.server.shutdown(self.shared.opts.shutdown_grace);
        let mut r = self.report();
        r.lingering = lingering;
        r
    }
}

fn busy(s: &mut TcpStream) {
    let body = http1::json_error(
        "h5i_refused",
        "refusing: too many open connections to the credential proxy; to fix: close some and retry",
    );
    let _ = s.write_all(&http1::simple_response(
        503,
        "Service Unavailable",
        "application/json",
        &body,
        true,
    ));
}

fn refuse(out: &mut TcpStream, status: u16, reason: &str, message: &str) {
    let body = http1::json_error("h5i_refused", message);
    http1::send_final(
        out,
        &http1::simple_response(status, reason, "application/json", &body, true),
    );
}

type Upstream = (BufReader<StreamOwned<ClientConnection, TcpStream>>, Tracked);

fn handle(conn: Conn, shared: &Shared) {
    let (Ok(read_half), Ok(mut out)) = (conn.stream.try_clone(), conn.stream.try_clone()) else {
        return;
    };
    let _ = conn.stream.set_read_timeout(Some(shared.opts.idle_timeout));
    let mut client = BufReader::with_capacity(64 * 1024, read_half);
    let mut upstream: Option<Upstream> = None;
    loop {
        let req = match http1::read_request(&mut client) {
            Ok(Some(r)) => r,
            Ok(None) | Err(http1::HeadError::Io(_)) | Err(http1::HeadError::Truncated) => return,
            Err(e) => {
                shared.count(|r| *r.refused.entry(Refusal::Malformed.as_str()).or_default() += 1);
                refuse(&mut out, 400, "Bad Request", &format!("h5i credential proxy: refusing: a malformed request ({e}); to fix: send an HTTP/1.1 request to the base URL"));
                return;
            }
        };
        match one_request(&conn, shared, &mut client, &mut out, req, &mut upstream) {
            Ok(true) => continue,
            Ok(false) => return,
            Err((refusal, status, reason, message)) => {
                shared.count(|r| *r.refused.entry(refusal.as_str()).or_default() += 1);
                refuse(&mut out, status, reason, &message);
                return;
            }
        }
    }
}

type Refused = (Refusal, u16, &'static str, String);

/// The host part of a `Host` value or URI authority (port dropped; IPv6 brackets kept).
fn host_part(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority
            .split(']')
            .next()
            .map_or(authority, |h| &authority[..h.len() + 1]);
    }
    authority.split(':').next().unwrap_or(authority)
}

/// Whether a request naming `authority` may be served by this route.
fn names_this_route(route: &CredentialRoute, authority: &str) -> bool {
    let host = host_part(authority);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return true;
    }
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    host == route.grant.host || host == "localhost" || route.extra_names.contains(&host)
}

/// Check and rewrite the credential headers. `Err` names the refusal.
fn swap_credentials(route: &CredentialRoute, req: &mut Request) -> Result<(), Refused> {
    let dummy = route.dummy.as_bytes();
    let mut seen = 0;
    for h in req.headers.0.iter_mut() {
        let (prefix, token) = if h.name.eq_ignore_ascii_case("x-api-key") {
            ("", h.value.as_str())
        } else if h.name.eq_ignore_ascii_case("authorization") {
            let (scheme, token) = h.value.split_once(' ').unwrap_or((h.value.as_str(), ""));
            let prefix = if scheme.eq_ignore_ascii_case("bearer") {
                "Bearer "
            } else if scheme.eq_ignore_ascii_case("token") {
                "token "
            } else {
                return Err((
                    Refusal::WrongToken,
                    403,
                    "Forbidden",
                    format!("h5i credential proxy: refusing: an Authorization scheme other than Bearer or token; to fix: send this box's dummy from ${} as `Authorization: Bearer` or `x-api-key`", route.grant.token_var),
                ));
            };
            (prefix, token.trim())
        } else {
            continue;
        };
        seen += 1;
        if !ct_eq(token.as_bytes(), dummy) {
            return Err((
                Refusal::WrongToken,
                403,
                "Forbidden",
                format!("h5i credential proxy: refusing: the credential sent is not this run's token; to fix: send the value of ${} as the box was given it (the real key stays on the host)", route.grant.token_var),
            ));
        }
        h.value = format!("{prefix}{}", route.credential);
    }
    if seen == 0 {
        return Err((
            Refusal::MissingToken,
            401,
            "Unauthorized",
            format!("h5i credential proxy: refusing: the request carries no credential; to fix: send the value of ${} as `x-api-key` or `Authorization: Bearer`", route.grant.token_var),
        ));
    }
    Ok(())
}

fn wrong_host(route: &CredentialRoute, named: &str) -> Refused {
    (
        Refusal::WrongHost,
        421,
        "Misdirected Request",
        format!(
            "h5i credential proxy: refusing: the request names `{}`, and this proxy serves only {}; to fix: use the base URL in ${} for {}, and nothing else through it",
            named.chars().filter(char::is_ascii_graphic).take(255).collect::<String>(),
            route.grant.host,
            route.grant.base_url_var,
            route.grant.host
        ),
    )
}

/// Serve one request. `Ok(keep)`: whether the box's connection stays open.
fn one_request(
    conn: &Conn,
    shared: &Shared,
    client: &mut BufReader<TcpStream>,
    out: &mut TcpStream,
    mut req: Request,
    upstream: &mut Option<Upstream>,
) -> Result<bool, Refused> {
    let route = &shared.route;
    let malformed = |what: String| (Refusal::Malformed, 400, "Bad Request", what);
    if req.method.eq_ignore_ascii_case("CONNECT") {
        return Err((
            Refusal::Malformed,
            405,
            "Method Not Allowed",
            format!("h5i credential proxy: refusing: CONNECT; to fix: this is {}'s base URL, not a forward proxy", route.grant.host),
        ));
    }
    // The target: origin form, or an absolute URI naming this route's host.
    if !req.target.starts_with('/') {
        let lower = req.target.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://"))
            .ok_or_else(|| malformed(format!("h5i credential proxy: refusing: request target `{}`; to fix: send a path under the base URL", req.target.chars().take(255).collect::<String>())))?;
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..end];
        if authority.contains('@') || !names_this_route(route, authority) {
            return Err(wrong_host(route, authority));
        }
        let skip = req.target.len() - rest.len() + end;
        let path = &req.target[skip..];
        req.target = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
    }
    match req.headers.single("host") {
        Ok(Some(h)) if !names_this_route(route, h) => return Err(wrong_host(route, h)),
        Ok(_) => {}
        Err(()) => {
            return Err(malformed(
                "h5i credential proxy: refusing: more than one Host header; to fix: send one"
                    .into(),
            ))
        }
    }
    let body = req.body().map_err(|why| malformed(format!("h5i credential proxy: refusing: {why}; to fix: send one unambiguous Content-Length or Transfer-Encoding: chunked")))?;
    swap_credentials(route, &mut req)?;

    let expect = req.headers.has_token("expect", "100-continue");
    let wants_close = req.wants_close();
    req.headers.strip_hop_by_hop();
    req.headers.set_framing(body);
    req.headers.remove("host");
    req.headers.0.insert(
        0,
        http1::Header {
            name: "Host".into(),
            value: route.grant.host.clone(),
        },
    );

    let fresh = match upstream {
        Some((up, _)) => !up.buffer().is_empty() || forward::is_stale(up.get_ref().get_ref()),
        None => true,
    };
    if fresh {
        *upstream = None;
        match connect_upstream(conn, shared) {
            Ok(up) => *upstream = Some(up),
            Err(why) => {
                shared.count(|r| r.upstream_errors += 1);
                let body = http1::json_error(
                    "h5i_upstream",
                    &format!(
                        "h5i credential proxy: {} unreachable: {why}",
                        route.grant.host
                    ),
                );
                http1::send_final(
                    out,
                    &http1::simple_response(502, "Bad Gateway", "application/json", &body, true),
                );
                return Ok(false);
            }
        }
    }
    let Some((up, _)) = upstream.as_mut() else {
        return Ok(false);
    };
    shared.count(|r| r.forwarded += 1);
    match forward::exchange(client, out, &req, body, wants_close, expect, up) {
        Ok(x) => {
            shared.count(|r| *r.statuses.entry(x.status).or_default() += 1);
            if !x.upstream_reusable {
                *upstream = None;
            }
            Ok(x.client_keep)
        }
        Err(ExchangeError::Upstream(why)) => {
            shared.count(|r| r.upstream_errors += 1);
            let body = http1::json_error(
                "h5i_upstream",
                &format!("h5i credential proxy: {}: {why}", route.grant.host),
            );
            http1::send_final(
                out,
                &http1::simple_response(502, "Bad Gateway", "application/json", &body, true),
            );
            Ok(false)
        }
        Err(ExchangeError::Abort) => Ok(false),
    }
}

/// Dial the pinned upstream and finish the TLS handshake (certificate verified for the grant's
/// host) before anything is written.
fn connect_upstream(conn: &Conn, shared: &Shared) -> Result<Upstream, String> {
    let route = &shared.route;
    let mut last = String::from("no pinned address");
    let mut tcp = None;
    for a in &route.pinned {
        match TcpStream::connect_timeout(a, shared.opts.connect_timeout) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    let mut tcp = tcp.ok_or(last)?;
    let tracked = conn.track(&tcp).map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    tcp.set_read_timeout(Some(shared.opts.handshake_timeout))
        .map_err(|e| e.to_string())?;
    tcp.set_write_timeout(Some(shared.opts.handshake_timeout))
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(route.grant.host.clone()).map_err(|e| e.to_string())?;
    let mut tls =
        ClientConnection::new(Arc::clone(&shared.tls.config), name).map_err(|e| e.to_string())?;
    while tls.is_handshaking() {
        tls.complete_io(&mut tcp)
            .map_err(|e| format!("TLS with {} failed: {e}", route.grant.host))?;
    }
    tcp.set_read_timeout(Some(shared.opts.upstream_timeout))
        .map_err(|e| e.to_string())?;
    tcp.set_write_timeout(Some(shared.opts.upstream_timeout))
        .map_err(|e| e.to_string())?;
    Ok((
        BufReader::with_capacity(64 * 1024, StreamOwned::new(tls, tcp)),
        tracked,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pin::MapResolver;

    fn grant(host: &str) -> AuthGrant {
        AuthGrant {
            host: host.into(),
            credential_env: "REAL_KEY".into(),
            base_url_var: "X_BASE_URL".into(),
            token_var: "X_TOKEN".into(),
            fallbacks: Vec::new(),
        }
    }

    fn route(host: &str) -> CredentialRoute {
        let m = MapResolver::new();
        m.insert(host, 443, vec!["198.18.0.3:443".parse().unwrap()]);
        CredentialRoute::new(
            &grant(host),
            |_| Some("sk-real-value".into()),
            &m,
            &AddressRules::allowing_loopback(),
        )
        .unwrap()
    }

    #[test]
    fn constant_time_compare_is_equality() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(!ct_eq(b"", b"a"));
    }

    #[test]
    fn every_run_gets_a_fresh_dummy_and_debug_hides_both_values() {
        let a = route("api.example.test");
        let b = route("api.example.test");
        assert_ne!(a.dummy_token(), b.dummy_token());
        assert!(a.dummy_token().starts_with("h5i-dummy-") && a.dummy_token().len() == 10 + 64);
        let d = format!("{a:?}");
        assert!(
            !d.contains("sk-real-value") && !d.contains(a.dummy_token()),
            "{d}"
        );
    }

    #[test]
    fn an_unset_credential_fails_closed_naming_the_variable() {
        let m = MapResolver::new();
        let err = CredentialRoute::new(
            &grant("api.example.test"),
            |_| None,
            &m,
            &AddressRules::allowing_loopback(),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("refusing: ") && msg.contains("REAL_KEY") && msg.contains("to fix:"),
            "{msg}"
        );
    }

    #[test]
    fn box_env_hands_the_dummy_and_the_base_url_never_the_credential() {
        let r = route("api.openai.com");
        let env = r.box_env("127.0.0.1:4000".parse().unwrap());
        assert_eq!(
            env[0],
            ("X_BASE_URL".into(), "http://127.0.0.1:4000/v1".into())
        );
        assert_eq!(env[1].1, r.dummy_token());
        assert!(env.iter().all(|(_, v)| !v.contains("sk-real-value")));
        let a = route("api.anthropic.com");
        assert_eq!(
            a.base_url("127.0.0.1:4000".parse().unwrap()),
            "http://127.0.0.1:4000"
        );
    }

    #[test]
    fn only_this_routes_host_loopback_names_and_literals_are_accepted() {
        let r = route("api.anthropic.com").accept_host_name("host.containers.internal");
        for ok in [
            "api.anthropic.com",
            "API.Anthropic.com.:443",
            "127.0.0.1:4000",
            "[::1]:4000",
            "localhost:4000",
            "host.containers.internal:4000",
        ] {
            assert!(names_this_route(&r, ok), "{ok}");
        }
        for bad in [
            "api.openai.com",
            "evil.test:443",
            "anthropic.com",
            "api.anthropic.com.evil.test",
        ] {
            assert!(!names_this_route(&r, bad), "{bad}");
        }
    }
}
