//! Test stand-ins for the proxies' far ends: a test CA (made per test run, never trusted by
//! anything but the proxy under test), TLS upstreams on 127.0.0.1 speaking enough of the
//! Anthropic and OpenAI APIs to record what they were sent, plain echo servers, and a small raw
//! HTTP client. Loopback only; every server takes a bounded number of connections and every
//! socket has a read timeout, so nothing here can hang a test run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};

/// Every socket in these tests gives up after this long.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections a stand-in server accepts before it stops by itself.
pub const MAX_CONNS: usize = 64;

/// A CA made for this test, and a server config for `names` signed by it.
pub struct TestCa {
    pub ca_der: Vec<u8>,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl TestCa {
    pub fn new() -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "h5i broker test CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params.self_signed(&ca_key).unwrap();
        TestCa {
            ca_der: ca.der().to_vec(),
            ca,
            ca_key,
        }
    }

    pub fn server_config(&self, names: &[&str]) -> Arc<ServerConfig> {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let leaf = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(leaf.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        Arc::new(cfg)
    }
}

/// One request as a stand-in upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Everything the upstream received, as text, to search for a token anywhere.
    pub fn all_text(&self) -> String {
        let mut s = format!("{} {}\n", self.method, self.path);
        for (n, v) in &self.headers {
            s.push_str(&format!("{n}: {v}\n"));
        }
        s.push_str(&String::from_utf8_lossy(&self.body));
        s
    }
}

/// How a stand-in answers.
#[derive(Clone)]
pub enum Answer {
    /// `200` with a small JSON body naming the API.
    Json,
    /// An SSE stream: the head and first event, then wait for the gate, then the last event.
    Sse(
        Arc<Mutex<Option<Receiver<()>>>>,
        Arc<Mutex<Option<Sender<()>>>>,
    ),
}

/// A TLS stand-in upstream on 127.0.0.1.
pub struct TlsUpstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub connections: Arc<Mutex<usize>>,
}

impl TlsUpstream {
    pub fn start(cfg: Arc<ServerConfig>, answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(Mutex::new(0));
        let (s2, c2) = (Arc::clone(&seen), Arc::clone(&connections));
        std::thread::spawn(move || {
            for stream in listener.incoming().take(MAX_CONNS) {
                let Ok(stream) = stream else { continue };
                *c2.lock().unwrap() += 1;
                let (cfg, seen, answer) = (Arc::clone(&cfg), Arc::clone(&s2), answer.clone());
                std::thread::spawn(move || serve_tls(stream, cfg, seen, answer));
            }
        });
        TlsUpstream {
            addr,
            seen,
            connections,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn connections(&self) -> usize {
        *self.connections.lock().unwrap()
    }
}

fn serve_tls(
    stream: TcpStream,
    cfg: Arc<ServerConfig>,
    seen: Arc<Mutex<Vec<Seen>>>,
    answer: Answer,
) {
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let conn = ServerConnection::new(cfg).unwrap();
    let tls = StreamOwned::new(conn, stream);
    let mut r = BufReader::new(tls);
    for _ in 0..32 {
        let Some(req) = read_request(&mut r) else {
            return;
        };
        let api = if req.path.starts_with("/v1/messages") {
            "anthropic"
        } else {
            "openai"
        };
        seen.lock().unwrap().push(req);
        let w = r.get_mut();
        match &answer {
            Answer::Json => {
                let body = format!("{{\"ok\":true,\"api\":\"{api}\"}}");
                let _ = write!(
                    w,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = w.flush();
            }
            Answer::Sse(gate, done) => {
                let first = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
                let _ = write!(
                    w,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n",
                    first.len()
                );
                let _ = w.flush();
                let rx = gate.lock().unwrap().take();
                let released = rx
                    .map(|rx| rx.recv_timeout(IO_TIMEOUT).is_ok())
                    .unwrap_or(false);
                let last = if released {
                    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
                } else {
                    "event: error\ndata: gate never opened\n\n"
                };
                let _ = write!(w, "{:x}\r\n{last}\r\n0\r\n\r\n", last.len());
                let _ = w.flush();
                if let Some(tx) = done.lock().unwrap().take() {
                    let _ = tx.send(());
                }
            }
        }
    }
}

/// Read one request (head and body) the way a server would; `None` at EOF or on error.
pub fn read_request<R: BufRead>(r: &mut R) -> Option<Seen> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.trim_end().split(' ');
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let headers = read_headers(r)?;
    let body = read_body(r, &headers, false)?;
    Some(Seen {
        method,
        path,
        headers,
        body,
    })
}

fn read_headers<R: BufRead>(r: &mut R) -> Option<Vec<(String, String)>> {
    let mut headers = Vec::new();
    for _ in 0..200 {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            return Some(headers);
        }
        let (n, v) = line.split_once(':')?;
        headers.push((n.to_string(), v.trim().to_string()));
    }
    None
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn read_body<R: BufRead>(
    r: &mut R,
    headers: &[(String, String)],
    until_close: bool,
) -> Option<Vec<u8>> {
    if header(headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        let mut body = Vec::new();
        for _ in 0..100_000 {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            if n == 0 {
                let mut end = String::new();
                r.read_line(&mut end).ok()?;
                return Some(body);
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            body.extend_from_slice(&chunk[..n]);
        }
        return None;
    }
    if let Some(n) = header(headers, "content-length") {
        let mut body = vec![0; n.parse().ok()?];
        r.read_exact(&mut body).ok()?;
        return Some(body);
    }
    let mut body = Vec::new();
    if until_close {
        r.read_to_end(&mut body).ok()?;
    }
    Some(body)
}

/// A response as the test client read it.
#[derive(Debug, Clone)]
pub struct Got {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Got {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// Read one response from `r` (a request with method `method` was sent).
pub fn read_response<R: BufRead>(r: &mut R, method: &str) -> Option<Got> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
    let headers = read_headers(r)?;
    let body = if method == "HEAD" || status == 204 || status == 304 || (100..200).contains(&status)
    {
        Vec::new()
    } else {
        read_body(r, &headers, true)?
    };
    Some(Got {
        status,
        headers,
        body,
    })
}

/// Connect to `addr` with the test timeouts set.
pub fn dial(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Send `raw` on a fresh connection and read one response.
pub fn exchange(addr: SocketAddr, raw: &str) -> Got {
    let mut s = dial(addr);
    s.write_all(raw.as_bytes()).unwrap();
    let method = raw.split(' ').next().unwrap_or("GET").to_string();
    read_response(&mut BufReader::new(s), &method).expect("a response")
}

/// A plain TCP echo server on 127.0.0.1 that prefixes nothing and echoes until EOF. Returns its
/// address and a counter of connections it accepted.
pub fn echo_server(tag: &'static str) -> (SocketAddr, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(Mutex::new(0));
    let c2 = Arc::clone(&count);
    std::thread::spawn(move || {
        for stream in listener.incoming().take(MAX_CONNS) {
            let Ok(mut s) = stream else { continue };
            *c2.lock().unwrap() += 1;
            std::thread::spawn(move || {
                s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                let _ = s.write_all(tag.as_bytes());
                let mut buf = [0u8; 16384];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, count)
}

/// A plain HTTP/1.1 origin on 127.0.0.1 answering every request with its tag, the path and the
/// Host it was sent, keeping connections alive.
pub fn http_origin(tag: &'static str) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming().take(MAX_CONNS) {
            let Ok(s) = stream else { continue };
            let seen = Arc::clone(&s2);
            std::thread::spawn(move || {
                s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                for _ in 0..1000 {
                    let Some(req) = read_request(&mut r) else {
                        return;
                    };
                    let body = format!(
                        "{tag} {} host={}",
                        req.path,
                        req.header("host").unwrap_or("-")
                    );
                    seen.lock().unwrap().push(req);
                    if write!(
                        w,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// Send `CONNECT target` through the proxy at `proxy`; the status, and the stream (positioned
/// after the proxy's head) when it was accepted.
pub fn connect_via(proxy: SocketAddr, target: &str) -> (u16, String, Option<BufReader<TcpStream>>) {
    let mut s = dial(proxy);
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers = read_headers(&mut r).unwrap();
    if status == 200 {
        (status, String::new(), Some(r))
    } else {
        let body = read_body(&mut r, &headers, true).unwrap_or_default();
        (status, String::from_utf8_lossy(&body).into_owned(), None)
    }
}
