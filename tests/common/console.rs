//! `h5i ui` run for one test (by root or the test user) and asked over raw HTTP/1.1 on
//! loopback: the path is sent exactly as given, so no client normalises a hostile one.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// A raw HTTP/1.1 request on loopback (the path sent exactly as given: no client normalises it).
pub fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Connection: close\r\nContent-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A running `h5i ui`; h5i itself (the test user's is `runuser`'s child), then what launched
/// it, are ended and reaped on drop.
pub struct Console {
    child: Child,
    /// The h5i process serving the console.
    pub pid: i32,
    pub port: u16,
    /// The URL it printed, token and all.
    pub url: String,
}

impl Drop for Console {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the h5i this test started, not yet reaped (its parent is the
        // child below, or this process, which reaps it next).
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Console {
    /// Spawn `cmd` (an `h5i ui --port 0 ...` command, run by whichever user) and read the URL
    /// it prints.
    pub fn spawn(mut cmd: Command) -> Console {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid = super::caller::h5i_pid(child.id());
        let url = line.trim().to_string();
        let rest = url
            .strip_prefix("http://127.0.0.1:")
            .unwrap_or_else(|| panic!("not a loopback URL: {url:?}"));
        let port = rest[..rest.find('/').unwrap()].parse().unwrap();
        assert!(url.contains("/?token="), "{url}");
        Console {
            child,
            pid,
            port,
            url,
        }
    }

    /// `h5i ui --port 0` run by `c` in its repository (the test user's through `runuser`).
    pub fn of(c: &super::Caller) -> Console {
        Console::spawn(c.h5i_in(&c.repo(), &["ui", "--port", "0"]))
    }

    pub fn token_path(&self) -> &str {
        &self.url[self.url.find("/?token=").unwrap()..]
    }

    /// Trade the token for the cookie: (the `Cookie` header to send, the session path).
    pub fn login(&self) -> (String, String) {
        let r = request(self.port, "GET", self.token_path(), &[]);
        assert_eq!(r.status, 303, "{r:?}");
        let set = r.header("set-cookie").unwrap().to_string();
        let location = r.header("location").unwrap().to_string();
        (set.split(';').next().unwrap().to_string(), location)
    }

    pub fn get(&self, cookie: &str, path: &str) -> Reply {
        request(self.port, "GET", path, &[("Cookie", cookie)])
    }

    /// The fleet document, logged in afresh.
    pub fn fleet(&self) -> serde_json::Value {
        let (cookie, base) = self.login();
        self.get(&cookie, &format!("{base}api/fleet")).json()
    }
}

/// Box `name`'s row in the fleet document `fleet`.
pub fn fleet_row<'a>(fleet: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    fleet["boxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {fleet}"))
}

/// Insist box `name`'s one signal in `fleet` is `colour`, its text beginning with `text`.
pub fn assert_signal(fleet: &serde_json::Value, name: &str, colour: &str, text: &str) {
    let signal = &fleet_row(fleet, name)["signal"];
    assert!(
        signal["colour"] == colour && signal["text"].as_str().is_some_and(|t| t.starts_with(text)),
        "{name}: not {colour} with `{text}...`: {fleet}"
    );
}
