//! Just enough HTTP/1.1 for the two proxies: bounded head parsing, strict message framing, and
//! a relay that streams bodies piece by piece (an SSE response reaches the box as the upstream
//! writes it, never buffered whole).
//!
//! Owns reading a request or response head (size- and count-bounded, CRLF only, header names
//! checked, control characters refused), deciding a body's framing (refusing the ambiguous
//! shapes request smuggling is made of: both `Content-Length` and `Transfer-Encoding`, differing
//! lengths, a transfer coding other than `chunked`), and relaying a body in canonical framing
//! (chunk sizes rewritten, chunk extensions and trailers dropped), so the next hop parses exactly
//! the message this one checked. Must never: buffer a whole body, pass a hop-by-hop header on,
//! or read past the end of the message it was asked to relay.
//!
//! Guarded by the unit tests below and the proxies' integration tests.

use std::io::{self, BufRead, Write};

/// Largest request or response head accepted.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Most header lines accepted in one head.
pub(crate) const MAX_HEADERS: usize = 128;
/// Longest chunk-size line accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// A head could not be read.
#[derive(Debug)]
pub(crate) enum HeadError {
    /// The transport failed (including a read timeout).
    Io(io::Error),
    /// The peer closed in the middle of a head.
    Truncated,
    /// Bigger than [`MAX_HEAD`] or [`MAX_HEADERS`].
    TooLarge,
    /// Not HTTP/1.x as accepted here; the text says what.
    Malformed(String),
}

impl From<io::Error> for HeadError {
    fn from(e: io::Error) -> Self {
        HeadError::Io(e)
    }
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadError::Io(e) => write!(f, "{e}"),
            HeadError::Truncated => f.write_str("the connection closed in the middle of a head"),
            HeadError::TooLarge => f.write_str("the head is too large"),
            HeadError::Malformed(m) => f.write_str(m),
        }
    }
}

/// One header line, as received (name case preserved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub name: String,
    pub value: String,
}

/// A header list with the lookups the proxies need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Headers(pub Vec<Header>);

impl Headers {
    /// Every value of `name` (case-insensitive).
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    }

    /// The one value of `name`; `Err` when it appears more than once.
    pub(crate) fn single<'a>(&'a self, name: &'a str) -> Result<Option<&'a str>, ()> {
        let mut it = self.all(name);
        let first = it.next();
        if it.next().is_some() {
            return Err(());
        }
        Ok(first)
    }

    /// Remove every `name`.
    pub(crate) fn remove(&mut self, name: &str) {
        self.0.retain(|h| !h.name.eq_ignore_ascii_case(name));
    }

    /// Append `name: value`.
    pub(crate) fn push(&mut self, name: &str, value: impl Into<String>) {
        self.0.push(Header {
            name: name.to_owned(),
            value: value.into(),
        });
    }

    /// Whether a comma-separated header `name` lists `token` (case-insensitive).
    pub(crate) fn has_token(&self, name: &str, token: &str) -> bool {
        self.all(name)
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// Drop the hop-by-hop headers: the fixed set and every name `Connection` lists. Framing
    /// headers are left to [`Headers::set_framing`].
    pub(crate) fn strip_hop_by_hop(&mut self) {
        let listed: Vec<String> = self
            .all("connection")
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
            .filter(|t| !t.is_empty())
            .collect();
        for name in HOP_BY_HOP {
            self.remove(name);
        }
        for name in listed {
            if !name.eq_ignore_ascii_case("content-length")
                && !name.eq_ignore_ascii_case("transfer-encoding")
            {
                self.remove(&name);
            }
        }
    }

    /// Replace the framing headers with the canonical ones for `body`.
    pub(crate) fn set_framing(&mut self, body: Body) {
        match body {
            Body::Length(n) => {
                self.remove("transfer-encoding");
                self.remove("content-length");
                self.push("Content-Length", n.to_string());
            }
            Body::Chunked => {
                self.remove("transfer-encoding");
                self.remove("content-length");
                self.push("Transfer-Encoding", "chunked");
            }
            // No body on the wire: a `Content-Length` still describes the representation (a
            // HEAD or 304 answer), so it stays; it was checked single when the framing was read.
            Body::Empty => self.remove("transfer-encoding"),
            Body::UntilClose => {
                self.remove("transfer-encoding");
                self.remove("content-length");
            }
        }
    }
}

/// Hop-by-hop headers (RFC 9110 7.6.1, plus the de-facto `Proxy-Connection`). `Expect` is
/// answered by the proxy itself, never passed on.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// A request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    pub target: String,
    /// `1` for HTTP/1.1, `0` for HTTP/1.0.
    pub minor: u8,
    pub headers: Headers,
}

/// A response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    pub minor: u8,
    pub status: u16,
    pub reason: String,
    pub headers: Headers,
}

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

impl Request {
    /// Whether the client asked to close after this exchange.
    pub(crate) fn wants_close(&self) -> bool {
        self.headers.has_token("connection", "close")
            || (self.minor == 0 && !self.headers.has_token("connection", "keep-alive"))
    }

    /// The body's framing, refusing ambiguous shapes.
    pub(crate) fn body(&self) -> Result<Body, String> {
        let te: Vec<&str> = self.headers.all("transfer-encoding").collect();
        let cl = content_length(&self.headers)?;
        if !te.is_empty() {
            if cl.is_some() {
                return Err("both Content-Length and Transfer-Encoding are set".into());
            }
            let codings: Vec<&str> = te
                .iter()
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .collect();
            if codings.len() == 1 && codings[0].eq_ignore_ascii_case("chunked") {
                return Ok(Body::Chunked);
            }
            return Err(format!(
                "Transfer-Encoding `{}` is not exactly `chunked`",
                te.join(", ")
            ));
        }
        Ok(match cl {
            Some(0) | None => Body::Empty,
            Some(n) => Body::Length(n),
        })
    }

    /// The head as bytes, with `target` as the request target.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        write_headers(&mut out, &self.headers);
        out
    }
}

impl Response {
    /// The body's framing, given the request method it answers.
    pub(crate) fn body(&self, method: &str) -> Result<Body, String> {
        let cl = content_length(&self.headers)?;
        if method.eq_ignore_ascii_case("HEAD")
            || (100..200).contains(&self.status)
            || self.status == 204
            || self.status == 304
        {
            return Ok(Body::Empty);
        }
        let te: Vec<&str> = self
            .headers
            .all("transfer-encoding")
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .collect();
        if let Some(last) = te.last() {
            if last.eq_ignore_ascii_case("chunked") {
                if te.len() > 1 {
                    return Err("a transfer coding besides chunked".into());
                }
                return Ok(Body::Chunked);
            }
            return Ok(Body::UntilClose);
        }
        Ok(match cl {
            Some(0) => Body::Empty,
            Some(n) => Body::Length(n),
            None => Body::UntilClose,
        })
    }

    /// Whether the server will close after this response.
    pub(crate) fn closes(&self) -> bool {
        self.headers.has_token("connection", "close")
            || (self.minor == 0 && !self.headers.has_token("connection", "keep-alive"))
    }

    /// The head as bytes (always written as HTTP/1.1).
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(format!("HTTP/1.1 {} {}\r\n", self.status, self.reason).as_bytes());
        write_headers(&mut out, &self.headers);
        out
    }
}

fn write_headers(out: &mut Vec<u8>, headers: &Headers) {
    for h in &headers.0 {
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn content_length(headers: &Headers) -> Result<Option<u64>, String> {
    let mut found: Option<u64> = None;
    for v in headers.all("content-length") {
        for part in v.split(',') {
            let part = part.trim();
            if part.is_empty() || part.len() > 19 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("Content-Length `{v}` is not a number"));
            }
            let n: u64 = part
                .parse()
                .map_err(|_| format!("Content-Length `{v}` is out of range"))?;
            match found {
                Some(m) if m != n => return Err("differing Content-Length values".into()),
                _ => found = Some(n),
            }
        }
    }
    Ok(found)
}

/// Read one CRLF-terminated line into `line` (without the CRLF), spending at most `budget`
/// bytes. `Ok(false)` on EOF before any byte.
fn read_line<R: BufRead>(
    r: &mut R,
    line: &mut Vec<u8>,
    budget: &mut usize,
) -> Result<bool, HeadError> {
    line.clear();
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HeadError::Io(e)),
        };
        if avail.is_empty() {
            return if line.is_empty() {
                Ok(false)
            } else {
                Err(HeadError::Truncated)
            };
        }
        let (take, done) = match avail.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        if take > *budget {
            return Err(HeadError::TooLarge);
        }
        *budget -= take;
        line.extend_from_slice(&avail[..take]);
        r.consume(take);
        if done {
            if line.len() < 2 || line[line.len() - 2] != b'\r' {
                return Err(HeadError::Malformed("a line does not end in CRLF".into()));
            }
            line.truncate(line.len() - 2);
            return Ok(true);
        }
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn read_headers<R: BufRead>(r: &mut R, budget: &mut usize) -> Result<Headers, HeadError> {
    let mut headers = Vec::new();
    let mut line = Vec::new();
    loop {
        if !read_line(r, &mut line, budget)? {
            return Err(HeadError::Truncated);
        }
        if line.is_empty() {
            return Ok(Headers(headers));
        }
        if headers.len() >= MAX_HEADERS {
            return Err(HeadError::TooLarge);
        }
        let colon = line
            .iter()
            .position(|b| *b == b':')
            .ok_or_else(|| HeadError::Malformed("a header line has no colon".into()))?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|b| is_tchar(*b)) {
            return Err(HeadError::Malformed(
                "a header name is empty or has a character outside the token set".into(),
            ));
        }
        if value
            .iter()
            .any(|b| (*b < 0x20 && *b != b'\t') || *b == 0x7f)
        {
            return Err(HeadError::Malformed(
                "a header value has a control character".into(),
            ));
        }
        let value = String::from_utf8_lossy(value)
            .trim_matches(|c| c == ' ' || c == '\t')
            .to_owned();
        headers.push(Header {
            name: String::from_utf8_lossy(name).into_owned(),
            value,
        });
    }
}

fn parse_version(v: &[u8]) -> Result<u8, HeadError> {
    match v {
        b"HTTP/1.1" => Ok(1),
        b"HTTP/1.0" => Ok(0),
        _ => Err(HeadError::Malformed(format!(
            "version `{}` is not HTTP/1.1 or HTTP/1.0",
            String::from_utf8_lossy(v)
        ))),
    }
}

/// Read a request head. `Ok(None)` when the peer closed cleanly before a new request.
pub(crate) fn read_request<R: BufRead>(r: &mut R) -> Result<Option<Request>, HeadError> {
    let mut budget = MAX_HEAD;
    let mut line = Vec::new();
    if !read_line(r, &mut line, &mut budget)? {
        return Ok(None);
    }
    let parts: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(HeadError::Malformed(
            "the request line is not `METHOD TARGET VERSION`".into(),
        ));
    };
    if method.is_empty() || !method.iter().all(|b| is_tchar(*b)) {
        return Err(HeadError::Malformed("the method is not a token".into()));
    }
    if target.is_empty() || !target.iter().all(|b| (0x21..0x7f).contains(b)) {
        return Err(HeadError::Malformed(
            "the request target is empty or has a character outside visible ASCII".into(),
        ));
    }
    let minor = parse_version(version)?;
    let headers = read_headers(r, &mut budget)?;
    Ok(Some(Request {
        method: String::from_utf8_lossy(method).into_owned(),
        target: String::from_utf8_lossy(target).into_owned(),
        minor,
        headers,
    }))
}

/// Read a response head.
pub(crate) fn read_response<R: BufRead>(r: &mut R) -> Result<Response, HeadError> {
    let mut budget = MAX_HEAD;
    let mut line = Vec::new();
    if !read_line(r, &mut line, &mut budget)? {
        return Err(HeadError::Truncated);
    }
    let mut parts = line.splitn(3, |b| *b == b' ');
    let version = parts.next().unwrap_or_default();
    let status = parts.next().unwrap_or_default();
    let reason = parts.next().unwrap_or_default();
    let minor = parse_version(version)?;
    if status.len() != 3 || !status.iter().all(|b| b.is_ascii_digit()) {
        return Err(HeadError::Malformed(
            "the status code is not three digits".into(),
        ));
    }
    let status: u16 = String::from_utf8_lossy(status)
        .parse()
        .map_err(|_| HeadError::Malformed("the status code is not a number".into()))?;
    // `002` is three digits but no status: relayed, it would go out as `2` (fuzz/ found it).
    if status < 100 {
        return Err(HeadError::Malformed("the status code is below 100".into()));
    }
    if reason
        .iter()
        .any(|b| (*b < 0x20 && *b != b'\t') || *b == 0x7f)
    {
        return Err(HeadError::Malformed(
            "the reason has a control character".into(),
        ));
    }
    let headers = read_headers(r, &mut budget)?;
    Ok(Response {
        minor,
        status,
        reason: String::from_utf8_lossy(reason).into_owned(),
        headers,
    })
}

/// Copy exactly `n` bytes, writing each piece as soon as it is read.
fn copy_exact<R: BufRead, W: Write>(from: &mut R, to: &mut W, mut n: u64) -> io::Result<()> {
    while n > 0 {
        let avail = match from.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let take = avail.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        to.write_all(&avail[..take])?;
        to.flush()?;
        from.consume(take);
        n -= take as u64;
    }
    Ok(())
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// Read a chunk-size line: hex digits, optionally `;extensions` (dropped).
fn read_chunk_size<R: BufRead>(from: &mut R) -> io::Result<u64> {
    let mut line = Vec::new();
    let mut budget = MAX_CHUNK_LINE;
    match read_line(from, &mut line, &mut budget) {
        Ok(true) => {}
        Ok(false) | Err(HeadError::Truncated) => return Err(io::ErrorKind::UnexpectedEof.into()),
        Err(HeadError::Io(e)) => return Err(e),
        Err(_) => return Err(bad("a malformed chunk-size line")),
    }
    let digits = line.split(|b| *b == b';').next().unwrap_or_default();
    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("a chunk size is not 1-15 hex digits"));
    }
    u64::from_str_radix(&String::from_utf8_lossy(digits), 16).map_err(|_| bad("a chunk size"))
}

/// Relay a body in `framing` from `from` to `to`, streaming: every piece is written and flushed
/// as it arrives. Chunked bodies are re-framed canonically (extensions and trailers dropped).
pub(crate) fn relay_body<R: BufRead, W: Write>(
    framing: Body,
    from: &mut R,
    to: &mut W,
) -> io::Result<()> {
    match framing {
        Body::Empty => Ok(()),
        Body::Length(n) => copy_exact(from, to, n),
        Body::UntilClose => loop {
            let avail = match from.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if avail.is_empty() {
                return to.flush();
            }
            let n = avail.len();
            to.write_all(avail)?;
            to.flush()?;
            from.consume(n);
        },
        Body::Chunked => {
            let mut scratch = Vec::new();
            loop {
                let size = read_chunk_size(from)?;
                if size == 0 {
                    // Trailers are dropped: read header lines up to the blank one.
                    let mut budget = MAX_HEAD;
                    let mut line = Vec::new();
                    loop {
                        match read_line(from, &mut line, &mut budget) {
                            Ok(true) if line.is_empty() => break,
                            Ok(true) => continue,
                            Ok(false) | Err(HeadError::Truncated) => {
                                return Err(io::ErrorKind::UnexpectedEof.into())
                            }
                            Err(HeadError::Io(e)) => return Err(e),
                            Err(_) => return Err(bad("malformed chunked trailers")),
                        }
                    }
                    to.write_all(b"0\r\n\r\n")?;
                    return to.flush();
                }
                let head = format!("{size:x}\r\n");
                let avail = from.fill_buf()?;
                let whole = usize::try_from(size).is_ok_and(|s| avail.len() >= s + 2);
                if whole {
                    // The whole chunk is here: one write, so a small SSE event is one packet.
                    let s = size as usize;
                    if &avail[s..s + 2] != b"\r\n" {
                        return Err(bad("chunk data is not followed by CRLF"));
                    }
                    scratch.clear();
                    scratch.extend_from_slice(head.as_bytes());
                    scratch.extend_from_slice(&avail[..s + 2]);
                    from.consume(s + 2);
                    to.write_all(&scratch)?;
                    to.flush()?;
                } else {
                    to.write_all(head.as_bytes())?;
                    copy_exact(from, to, size)?;
                    let mut crlf = [0u8; 2];
                    std::io::Read::read_exact(from, &mut crlf)?;
                    if &crlf != b"\r\n" {
                        return Err(bad("chunk data is not followed by CRLF"));
                    }
                    to.write_all(b"\r\n")?;
                    to.flush()?;
                }
            }
        }
    }
}

/// A complete short response the proxy itself makes (a refusal or an error), as bytes.
pub(crate) fn simple_response(
    status: u16,
    reason: &str,
    content_type: &str,
    body: &str,
    close: bool,
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n",
        body.len()
    );
    if close {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}

/// Send a final response and close without a reset: half-close, then read and discard what the
/// peer still sends (a request body the refusal made moot), at most 1 MiB and 500 ms, so the
/// peer reads the response rather than `ECONNRESET`.
pub(crate) fn send_final(out: &mut std::net::TcpStream, bytes: &[u8]) {
    use std::io::Read;
    use std::time::{Duration, Instant};
    if out.write_all(bytes).is_err() {
        return;
    }
    let _ = out.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut buf = [0u8; 16 * 1024];
    let mut left: usize = 1 << 20;
    while left > 0 {
        let now = Instant::now();
        if now >= deadline || out.set_read_timeout(Some(deadline - now)).is_err() {
            break;
        }
        match out.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// A JSON error body both model APIs' clients surface: `{"type":"error","error":{...}}`.
pub(crate) fn json_error(kind: &str, message: &str) -> String {
    serde_json::json!({
        "type": "error",
        "error": { "type": kind, "message": message }
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_status_below_100_is_refused_not_relayed_as_two_digits() {
        for line in ["HTTP/1.1 002 OK", "HTTP/1.1 099 X", "HTTP/1.0 000 Z"] {
            let head = format!("{line}\r\nContent-Length: 0\r\n\r\n");
            let got = read_response(&mut io::BufReader::new(head.as_bytes()));
            assert!(
                matches!(got, Err(HeadError::Malformed(_))),
                "{line}: {got:?}"
            );
        }
        let ok = read_response(&mut io::BufReader::new(
            &b"HTTP/1.1 100 Continue\r\n\r\n"[..],
        ));
        assert!(matches!(ok, Ok(r) if r.status == 100));
    }

    use super::*;
    use std::io::BufReader;

    fn req(text: &str) -> Result<Option<Request>, HeadError> {
        read_request(&mut BufReader::new(text.as_bytes()))
    }

    #[test]
    fn a_request_head_parses_and_round_trips() {
        let r = req("POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            .unwrap()
            .unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.target, "/v1/messages");
        assert_eq!(r.body().unwrap(), Body::Length(3));
        assert_eq!(r.headers.single("host"), Ok(Some("x")));
        let bytes = r.to_bytes();
        assert!(bytes.starts_with(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n"));
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        for bad in [
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 3, 4\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
        ] {
            let r = req(bad).unwrap().unwrap();
            assert!(r.body().is_err(), "{bad:?}");
        }
        for malformed in [
            "POST / HTTP/1.1\r\nHost : x\r\n\r\n",
            "POST / HTTP/1.1\r\n folded\r\n\r\n",
            "POST / HTTP/1.1\nHost: x\n\n",
            "POST  / HTTP/1.1\r\n\r\n",
            "POST / HTTP/2\r\n\r\n",
            "POST / HTTP/1.1\r\nX: a\x01b\r\n\r\n",
        ] {
            assert!(req(malformed).is_err(), "{malformed:?}");
        }
        assert!(matches!(req(""), Ok(None)));
        assert!(matches!(
            req("GET / HTTP/1.1\r\nHost"),
            Err(HeadError::Truncated)
        ));
    }

    #[test]
    fn an_oversized_head_is_refused() {
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert!(matches!(req(&big), Err(HeadError::TooLarge)));
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "A: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(matches!(req(&many), Err(HeadError::TooLarge)));
    }

    #[test]
    fn chunked_bodies_are_reframed_and_stop_at_the_end() {
        let wire = b"5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let mut r = BufReader::new(&wire[..]);
        let mut out = Vec::new();
        relay_body(Body::Chunked, &mut r, &mut out).unwrap();
        assert_eq!(out, b"5\r\nhello\r\n0\r\n\r\n");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut r, &mut rest).unwrap();
        assert_eq!(rest, "NEXT");
        let mut bad = BufReader::new(&b"5\r\nhelloXX0\r\n\r\n"[..]);
        assert!(relay_body(Body::Chunked, &mut bad, &mut Vec::new()).is_err());
        let mut bad = BufReader::new(&b"zz\r\n"[..]);
        assert!(relay_body(Body::Chunked, &mut bad, &mut Vec::new()).is_err());
    }

    #[test]
    fn response_framing_follows_the_method_and_status() {
        let r = |t: &str| read_response(&mut BufReader::new(t.as_bytes())).unwrap();
        let ok = r("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");
        assert_eq!(ok.body("GET").unwrap(), Body::Length(10));
        assert_eq!(ok.body("HEAD").unwrap(), Body::Empty);
        let sse = r("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(sse.body("POST").unwrap(), Body::Chunked);
        let eof = r("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(eof.body("GET").unwrap(), Body::UntilClose);
        let nc = r("HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n");
        assert_eq!(nc.body("GET").unwrap(), Body::Empty);
    }

    #[test]
    fn hop_by_hop_headers_and_connection_listed_ones_are_dropped() {
        let mut h = Headers::default();
        h.push("Connection", "keep-alive, X-Secret-Hop");
        h.push("X-Secret-Hop", "1");
        h.push("Proxy-Authorization", "Basic x");
        h.push("Expect", "100-continue");
        h.push("Accept", "*/*");
        h.strip_hop_by_hop();
        assert_eq!(h.0.len(), 1);
        assert_eq!(h.0[0].name, "Accept");
    }
}
