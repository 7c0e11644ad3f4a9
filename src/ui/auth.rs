//! Who may talk to the console, decided before any route runs.
//!
//! Three secrets, minted per `h5i ui` process from the kernel's random source and kept in this
//! process's memory only (never written to disk, so no box can read them):
//! - the token, in the URL `h5i ui` prints (`/?token=…`); presented on `/`, it is traded for
//! - the session cookie (`SameSite=Strict; HttpOnly`), set by a redirect to the session path,
//!   or, when the request came from another site (`--open`'s handoff file is a `file:` page), by
//!   a page that moves the browser on from the console's own origin: a navigation that began on
//!   another site stays cross-site through redirects, and a strict cookie is not sent on it;
//!   scoped to
//! - the session path `/c/<random>/`, where every other route lives. Browsers send a cookie to
//!   every port of a host, so a box's service published on `127.0.0.1:<port>` would be sent a
//!   cookie scoped to `/`; scoped to a path the box cannot know, it is never sent there.
//!
//! With `--open`, a fourth: the one-time code (`/?code=…`), the only secret written to disk
//! (in `--open`'s handoff file, private to the user, in the store no box grant exposes). It is
//! not the token: it is traded for the cookie like the token, once ([`Gate::take_code`]
//! forgets it on first use), and only within [`CODE_TTL`] of its minting, after which it is
//! forgotten and its file removed. So the file outlives neither the browser's first load nor
//! two minutes, and what it held opens nothing after either.
//!
//! Every request, before anything else: a method other than GET is refused (405), a `Host` other
//! than `127.0.0.1:<our port>` is refused (DNS rebinding: another name pointed at loopback), an
//! `Origin` other than ours is refused, and so is a `Sec-Fetch-Site` other than `none` or
//! `same-origin` (a page of a box's service on another loopback port is same-site to us), except
//! on `/` carrying the token: the token is the proof there, and all it buys is the cookie (the
//! handoff file `--open` writes is a `file:` page, another site). Then a request without the
//! token (on `/`) or the cookie (under the session path) is 401.
//!
//! Must never: accept a secret by prefix or in variable time, send the token in a response, let
//! a request reach a route before these checks, or let a cross-site request past them but the
//! token's trade for the cookie.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The session cookie's name.
const COOKIE: &str = "h5i_ui";

/// Random bytes in each secret.
const SECRET_BYTES: usize = 32;

/// How long `--open`'s one-time code may be traded for the cookie after it was minted: the
/// desktop's browser starting and loading a local file, with room for a slow machine.
pub const CODE_TTL: Duration = Duration::from_secs(120);

/// The console's secrets and the address it answers as.
pub struct Gate {
    token: String,
    session: String,
    /// `/c/<random>`: the session path, without its trailing slash.
    pub base: String,
    /// `127.0.0.1:<port>`: the only `Host` accepted.
    host: String,
    /// `http://127.0.0.1:<port>`: the only `Origin` accepted.
    origin: String,
    /// `--open`'s one-time code and when it was minted, until it is used or expires.
    code: Mutex<Option<(String, Instant)>>,
    /// The `--open` handoff file, removed once the code is used or expires.
    pub handoff: OnceLock<Arc<super::handoff::Handoff>>,
}

/// What a request's one-time code turned out to be.
#[derive(Debug, PartialEq, Eq)]
enum Code {
    /// The request carries no `code=`.
    Absent,
    /// The live code, now used up.
    Taken,
    /// A code that opens nothing: wrong, used before, or expired.
    Refused,
}

/// Whether `a` and `b` are equal, in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Gate {
    /// Fresh secrets for a console answering on loopback `port`.
    pub fn mint(port: u16) -> std::io::Result<Gate> {
        Ok(Gate {
            token: crate::random::hex(SECRET_BYTES)?,
            session: crate::random::hex(SECRET_BYTES)?,
            base: format!("/c/{}", crate::random::hex(16)?),
            host: format!("127.0.0.1:{port}"),
            origin: format!("http://127.0.0.1:{port}"),
            code: Mutex::new(None),
            handoff: OnceLock::new(),
        })
    }

    /// The URL a human opens: the only place the token is ever written.
    pub fn url(&self) -> String {
        format!("{}/?token={}", self.origin, self.token)
    }

    /// Mint `--open`'s one-time code (replacing any earlier one); the URL that carries it.
    pub fn one_time_url(&self) -> std::io::Result<String> {
        let code = crate::random::hex(SECRET_BYTES)?;
        let url = format!("{}/?code={code}", self.origin);
        *self.code.lock().unwrap_or_else(|p| p.into_inner()) = Some((code, Instant::now()));
        Ok(url)
    }

    /// Forget the one-time code if it outlived [`CODE_TTL`], removing its handoff file; whether
    /// it did (a code already used or never minted did not).
    pub fn expire_code(&self) -> bool {
        let mut code = self.code.lock().unwrap_or_else(|p| p.into_inner());
        let expired = code
            .as_ref()
            .is_some_and(|(_, minted)| minted.elapsed() >= CODE_TTL);
        if expired {
            *code = None;
            if let Some(h) = self.handoff.get() {
                h.used();
            }
        }
        expired
    }

    /// The request's one-time code judged, and used up when it is the live one.
    fn take_code(&self, req: &Request) -> Code {
        let Some(given) = req.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("code="))
                .map(str::to_string)
        }) else {
            return Code::Absent;
        };
        self.expire_code();
        let mut code = self.code.lock().unwrap_or_else(|p| p.into_inner());
        match code.as_ref() {
            Some((live, _)) if same(given.as_bytes(), live.as_bytes()) => {
                *code = None;
                Code::Taken
            }
            _ => Code::Refused,
        }
    }

    /// Why this request is refused before routing, if it is; `with_token`: the request is the
    /// token's trade on `/`, which may come from another site.
    fn refusal(&self, method: &Method, headers: &HeaderMap, with_token: bool) -> Option<Response> {
        if method != Method::GET {
            return Some(
                (
                    StatusCode::METHOD_NOT_ALLOWED,
                    [(header::ALLOW, "GET")],
                    "refusing: the console is read-only; every route is a GET\n",
                )
                    .into_response(),
            );
        }
        let one = |name: header::HeaderName| -> Result<Option<&str>, ()> {
            let mut all = headers.get_all(name).iter();
            match (all.next(), all.next()) {
                (None, _) => Ok(None),
                (Some(v), None) => v.to_str().map(Some).map_err(drop),
                (Some(_), Some(_)) => Err(()),
            }
        };
        let forbidden =
            |why: &str| Some((StatusCode::FORBIDDEN, format!("refusing: {why}\n")).into_response());
        if one(header::HOST) != Ok(Some(self.host.as_str())) {
            return forbidden("a Host other than the console's own address (127.0.0.1 and its port); to fix: open the URL `h5i ui` printed");
        }
        match one(header::ORIGIN) {
            Ok(None) => {}
            Ok(Some(o)) if o == self.origin => {}
            _ => return forbidden("a request from another origin"),
        }
        match one(header::HeaderName::from_static("sec-fetch-site")) {
            Ok(None | Some("none" | "same-origin")) => {}
            Ok(Some(_)) if with_token => {}
            _ => return forbidden("a request another site started"),
        }
        None
    }

    /// Whether the request carries the token in its query.
    fn has_token(&self, req: &Request) -> bool {
        req.uri().query().is_some_and(|q| {
            q.split('&')
                .filter_map(|kv| kv.strip_prefix("token="))
                .any(|t| same(t.as_bytes(), self.token.as_bytes()))
        })
    }

    /// Whether the request carries the session cookie (any cookie of that name matching: a
    /// box's service can set a cookie of the same name, never one of the same value).
    fn has_session(&self, headers: &HeaderMap) -> bool {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .any(|v| same(v.as_bytes(), self.session.as_bytes()))
    }

    /// `/?token=…` answered: the handoff file (if any) removed, the cookie set, and the browser
    /// sent on to the session path (so the token leaves the address bar): by a redirect, or,
    /// for a request another site started, by a page of this origin, so the navigation that
    /// follows is same-origin and carries the cookie.
    fn login(&self, cross_site: bool) -> Response {
        if let Some(h) = self.handoff.get() {
            h.used();
        }
        let cookie = format!(
            "{COOKIE}={}; Path={}/; HttpOnly; SameSite=Strict",
            self.session, self.base
        );
        let mut res = if cross_site {
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                format!(
                    "<!doctype html><meta http-equiv=\"refresh\" content=\"0;url={}/\"><title>h5i ui</title>\n",
                    self.base
                ),
            )
                .into_response()
        } else {
            (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, format!("{}/", self.base))],
            )
                .into_response()
        };
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            res.headers_mut().insert(header::SET_COOKIE, v);
        }
        res
    }
}

/// The middleware in front of every route (see the module doc), and the headers every response
/// carries: no caching, no sniffing, no referrer, no framing.
pub async fn guard(State(gate): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let at_root = req.uri().path() == "/";
    // The code is judged (and used up) only for a GET that passes every other check.
    let code_given = at_root && req.uri().query().is_some_and(|q| q.contains("code="));
    let with_token = at_root && (gate.has_token(&req) || code_given);
    let refused = gate.refusal(req.method(), req.headers(), with_token);
    let with_token = match (&refused, code_given) {
        (None, true) => gate.take_code(&req) == Code::Taken,
        _ => with_token,
    };
    let mut res = match refused {
        Some(refused) => refused,
        None if with_token => gate.login(!matches!(
            req.headers()
                .get("sec-fetch-site")
                .and_then(|v| v.to_str().ok()),
            None | Some("none" | "same-origin")
        )),
        None if req.uri().path().starts_with(&format!("{}/", gate.base))
            && gate.has_session(req.headers()) =>
        {
            next.run(req).await
        }
        None if code_given => (
            StatusCode::UNAUTHORIZED,
            "refusing: this one-time code was used already, has expired or is not the console's; to fix: open the URL `h5i ui` printed (it carries the token)\n",
        )
            .into_response(),
        None => (
            StatusCode::UNAUTHORIZED,
            "refusing: no console session; to fix: open the URL `h5i ui` printed (it carries the token)\n",
        )
            .into_response(),
    };
    let h = res.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_matches_whole_or_not_at_all() {
        assert!(same(b"abcd", b"abcd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"abce", b"abcd"));
        assert!(!same(b"", b"abcd"));
    }

    fn root(query: &str) -> Request {
        Request::builder()
            .uri(format!("/?{query}"))
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn the_one_time_code_opens_once_and_is_not_the_token() {
        let g = Gate::mint(1).unwrap();
        assert_eq!(g.take_code(&root("code=00")), Code::Refused, "none minted");
        let url = g.one_time_url().unwrap();
        let code = url.split_once("?code=").unwrap().1.to_string();
        assert_ne!(code, g.token);
        assert!(!url.contains(&g.token));
        assert_eq!(
            g.take_code(&root(&format!("token={}", g.token))),
            Code::Absent
        );
        assert_eq!(
            g.take_code(&root(&format!("code={}", g.token))),
            Code::Refused
        );
        assert_eq!(g.take_code(&root(&format!("code={code}x"))), Code::Refused);
        assert_eq!(g.take_code(&root(&format!("code={code}"))), Code::Taken);
        assert_eq!(g.take_code(&root(&format!("code={code}"))), Code::Refused);
    }

    #[test]
    fn an_expired_code_opens_nothing() {
        let g = Gate::mint(1).unwrap();
        let url = g.one_time_url().unwrap();
        let code = url.split_once("?code=").unwrap().1.to_string();
        assert!(!g.expire_code(), "a fresh code expired");
        if let Some((_, minted)) = g.code.lock().unwrap().as_mut() {
            *minted -= CODE_TTL;
        }
        assert_eq!(g.take_code(&root(&format!("code={code}"))), Code::Refused);
        assert!(g.code.lock().unwrap().is_none());
    }

    #[test]
    fn every_secret_is_fresh() {
        let (a, b) = (Gate::mint(1).unwrap(), Gate::mint(1).unwrap());
        assert_ne!(a.token, b.token);
        assert_ne!(a.session, b.session);
        assert_ne!(a.token, a.session);
        assert_eq!(a.token.len(), 2 * SECRET_BYTES);
    }
}
