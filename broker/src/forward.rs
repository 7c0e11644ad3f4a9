//! One HTTP exchange forwarded to an upstream the caller already chose and checked: the request
//! head and body out, the response head and body back, streaming both ways.
//!
//! Owns the order of an exchange (a proxy-made `100 Continue`, request, body, response) and the
//! keep-alive bookkeeping of both connections. Must never: choose or check a destination (the
//! caller did, before calling), or send the client a `502` after the response head went out.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

use crate::http1::{self, Body, Request};

/// Why an exchange ended early.
#[derive(Debug)]
pub(crate) enum ExchangeError {
    /// The upstream failed before anything of the response reached the client: the caller may
    /// still answer `502` with this text.
    Upstream(String),
    /// The client went away, or the response was cut after its head went out: close.
    Abort,
}

/// How an exchange ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exchange {
    /// The upstream status.
    pub status: u16,
    /// The upstream connection can carry another request.
    pub upstream_reusable: bool,
    /// The client connection can carry another request.
    pub client_keep: bool,
}

/// A writer that remembers whether a write failed, to tell an upstream failure from a client one
/// while relaying a request body.
struct Tracked<'a, W: Write> {
    inner: &'a mut W,
    failed: bool,
}

impl<W: Write> Write for Tracked<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf).inspect_err(|_| self.failed = true)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().inspect_err(|_| self.failed = true)
    }
}

/// Forward `req` (already rewritten: target, headers, canonical framing `req_body`) to
/// `upstream`, and its response back to the client.
pub(crate) fn exchange<C: BufRead, W: Write, U: Read + Write>(
    client_in: &mut C,
    client_out: &mut W,
    req: &Request,
    req_body: Body,
    client_wants_close: bool,
    expect_continue: bool,
    upstream: &mut BufReader<U>,
) -> Result<Exchange, ExchangeError> {
    if expect_continue {
        client_out
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .map_err(|_| ExchangeError::Abort)?;
    }
    let up = upstream.get_mut();
    up.write_all(&req.to_bytes())
        .and_then(|()| up.flush())
        .map_err(|e| ExchangeError::Upstream(format!("sending the request failed: {e}")))?;
    let mut tracked = Tracked {
        inner: up,
        failed: false,
    };
    if let Err(e) = http1::relay_body(req_body, client_in, &mut tracked) {
        return Err(if tracked.failed {
            ExchangeError::Upstream(format!("sending the request body failed: {e}"))
        } else {
            ExchangeError::Abort
        });
    }
    let mut resp = loop {
        let r = http1::read_response(upstream)
            .map_err(|e| ExchangeError::Upstream(format!("reading the response failed: {e}")))?;
        match r.status {
            101 => {
                return Err(ExchangeError::Upstream(
                    "the upstream switched protocols, which this proxy does not carry".into(),
                ))
            }
            // Informational answers (a `100` we did not ask for, `103` hints) are dropped: the
            // proxy answered `Expect` itself.
            100..=199 => continue,
            _ => break r,
        }
    };
    let framing = resp
        .body(&req.method)
        .map_err(|e| ExchangeError::Upstream(format!("the response framing is refused: {e}")))?;
    let upstream_closes = resp.closes() || framing == Body::UntilClose;
    resp.headers.strip_hop_by_hop();
    resp.headers.set_framing(framing);
    let client_keep = !client_wants_close && framing != Body::UntilClose;
    if !client_keep {
        resp.headers.push("Connection", "close");
    }
    client_out
        .write_all(&resp.to_bytes())
        .and_then(|()| client_out.flush())
        .map_err(|_| ExchangeError::Abort)?;
    http1::relay_body(framing, upstream, client_out).map_err(|_| ExchangeError::Abort)?;
    Ok(Exchange {
        status: resp.status,
        upstream_reusable: !upstream_closes,
        client_keep,
    })
}

/// Whether a kept-alive upstream socket has gone stale: the peer closed it, or sent bytes no
/// request asked for. Either way it must not carry the next request.
pub(crate) fn is_stale(sock: &TcpStream) -> bool {
    let mut fds = [libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    }];
    // A zero timeout never blocks; a failed poll counts as stale (the socket is not reused).
    h5i_sys::poll::wait(&mut fds, Some(std::time::Duration::ZERO)).map_or(true, |n| n != 0)
}
