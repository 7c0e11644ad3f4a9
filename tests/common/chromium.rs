//! A real headless Chromium on the host, driven over the DevTools protocol, for the tests that
//! load h5i's own loopback pages (`h5i ui`, `h5i box view`) the way a human's browser does.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Headless Chromium, or `None` (said) when this host has none.
pub fn chromium() -> Option<&'static str> {
    let path = "/usr/bin/chromium";
    if std::path::Path::new(path).exists() {
        return Some(path);
    }
    h5i_testsupport::skipped!("no Chromium at {path}");
    None
}

/// A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
/// commands on its fd 3, answers on its fd 4, each message ending in a NUL). Killed on drop; a
/// watchdog kills it after two minutes, which ends any read with EOF.
pub struct Browser {
    child: Child,
    to: std::process::ChildStdin,
    from: BufReader<std::process::ChildStdout>,
    next_id: u64,
    session: Option<String>,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    pub fn launch(path: &str, profile: &std::path::Path) -> Browser {
        let mut child = Command::new("sh")
            .args([
                "-c",
                r#"exec "$0" "$@" 3<&0 4>&1 </dev/null >/dev/null"#,
                path,
            ])
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--hide-scrollbars",
                "--window-size=1400,1000",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(120));
            // SAFETY: kill(2) on the browser's pid; if it was already reaped the pid is still
            // ours to name for this test's short life (no other process of ours took it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        Browser {
            to: child.stdin.take().unwrap(),
            from: BufReader::new(child.stdout.take().unwrap()),
            child,
            next_id: 0,
            session: None,
        }
    }

    pub fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.try_call(method, params)
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// [`Browser::call`], with the protocol's error as the `Err`.
    fn try_call(
        &mut self,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, serde_json::Value> {
        self.next_id += 1;
        let mut msg = serde_json::json!({"id": self.next_id, "method": method, "params": params});
        if let Some(s) = &self.session {
            msg["sessionId"] = s.clone().into();
        }
        self.to.write_all(msg.to_string().as_bytes()).unwrap();
        self.to.write_all(b"\0").unwrap();
        loop {
            let mut buf = Vec::new();
            self.from.read_until(0, &mut buf).unwrap();
            assert!(
                buf.pop() == Some(0),
                "the browser went away during {method}"
            );
            let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
            if v["id"] == self.next_id {
                return match v.get("error") {
                    Some(e) => Err(e.clone()),
                    None => Ok(v["result"].clone()),
                };
            }
        }
    }

    /// Open `url` in a new tab and talk to that tab from now on.
    pub fn open(&mut self, url: &str) {
        let target = self.call("Target.createTarget", serde_json::json!({ "url": url }));
        let attached = self.call(
            "Target.attachToTarget",
            serde_json::json!({"targetId": target["targetId"], "flatten": true}),
        );
        self.session = attached["sessionId"].as_str().map(String::from);
    }

    pub fn eval(&mut self, expression: &str) -> serde_json::Value {
        self.evaluate(expression)
            .unwrap_or_else(|e| panic!("Runtime.evaluate: {e}"))
    }

    /// `expression`'s value in the page, or the protocol's error.
    fn evaluate(&mut self, expression: &str) -> Result<serde_json::Value, serde_json::Value> {
        self.try_call(
            "Runtime.evaluate",
            serde_json::json!({"expression": expression, "returnByValue": true}),
        )
        .map(|r| r["result"]["value"].clone())
    }

    /// Wait (bounded: 60 s) until `expression` is true in the page. An evaluation the page's
    /// own navigation cut short (the console's login sends the browser on) is a "not yet".
    pub fn until(&mut self, expression: &str) {
        for _ in 0..600 {
            match self.evaluate(expression) {
                Ok(v) if v == true => return,
                Ok(_) => {}
                Err(e) if e["message"] == "Inspected target navigated or closed" => {}
                Err(e) => panic!("Runtime.evaluate: {e}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the page never got to {expression}");
    }

    /// The page as a PNG.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let shot = self.call(
            "Page.captureScreenshot",
            serde_json::json!({"format": "png"}),
        );
        base64_decode(shot["data"].as_str().unwrap())
    }

    /// A left click (press, then release) at CSS pixel (`x`, `y`) of the page, as the mouse
    /// makes it: the page's own handlers see real events.
    pub fn click_at(&mut self, x: f64, y: f64) {
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                serde_json::json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).unwrap() as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}
