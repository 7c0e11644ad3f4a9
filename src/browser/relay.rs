//! The relay between agent-browser's client (in the box's runs) and the box's browser daemon
//! (in the box's `browser` sidecar): the one place the control lock is enforced.
//!
//! Owns the listening socket the box's clients find where agent-browser looks for its daemon
//! (`~/.agent-browser/default.sock` in the box's HOME, with the `default.version` and
//! `default.config` files the client checks before it talks to a daemon rather than starting
//! one), served by threads of the sidecar's host-side supervisor; the judgement of every
//! request ([`judge`]); and connecting to the daemon's own socket, which sits in the sidecar's
//! private `/tmp` (no run's mount namespace shows it) and is reached through `/proc/PID/root`
//! with no symlink followed ([`daemon_socket`]).
//!
//! The wire is agent-browser's own: one JSON object per line each way, `{"action": ..., "id":
//! ...}` out, `{"success": ..., "id": ..., "data"|"error": ...}` back. Every request line is
//! hostile input: bounded in size, parsed whole, refused unless it is a JSON object with a
//! plain `action` name. While a human holds the browser only the read-only actions
//! ([`READ_ONLY`]) pass; after a human hands it back, a request naming an `@ref` is refused
//! until a snapshot succeeds; clearing the console, errors or request log is refused always (it
//! would empty what h5i's drain records); shutting the shared daemon down is refused always.
//!
//! Must never: follow a symlink the box planted (in its HOME or in the sidecar's `/tmp`), write
//! anything into the box's HOME but the socket and the version file (created fresh, never
//! through an existing name), forward a request it could not parse, or pass a refused one on.
//! The relay arbitrates agent-browser's channel; the box's other ways to the browser are closed
//! beside it: the daemon's socket is in a `/tmp` no run's mount namespace shows, and Chromium's
//! DevTools port and the daemon's stream port, on the loopback the runs share, are fenced off
//! from every process of the box by `super::fence`.
//!
//! Guarded by the unit tests below and `tests/browser.rs`.

use std::ffi::CString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::control::{self, Control, Holder};
use crate::beneath::Dir;
use crate::store::BoxPaths;

pub use crate::browser_box::CLIENT_DIR;
pub use crate::browser_box::{DAEMON_DIR, SESSION};
/// The agent-browser version h5i pins (images/agent-versions.env): what the relay tells the
/// client the daemon is, so the client talks to it instead of restarting it.
pub const PINNED_VERSION: &str = pinned_version();
/// The daemon options the client compares with its own before it talks to a daemon (it
/// restarts one whose record differs or is missing): the sidecar's daemon runs with the box's
/// defaults, none of them set.
const DAEMON_CONFIG: &str = r#"{"action_policy":null,"confirm_actions":null,"debug":false,"default_timeout":null,"idle_timeout":null,"no_auto_dialog":false}"#;
/// Longest request line the relay reads (a `setcontent` or an `upload` list can be long).
const MAX_REQUEST: usize = 8 << 20;
/// Longest response line the relay passes back (a screenshot as base64 when no path is given).
const MAX_RESPONSE: usize = 128 << 20;
/// How long a request may wait for the daemon's answer (agent-browser's own timeouts are
/// shorter; this only stops a wedged daemon from holding a relay thread forever).
const DAEMON_ANSWER: Duration = Duration::from_secs(300);

const fn pinned_version() -> &'static str {
    const PIN: &str = "AGENT_BROWSER_VERSION=";
    let file = include_str!("../../images/agent-versions.env").as_bytes();
    let pin = PIN.as_bytes();
    let mut i = 0;
    while i + pin.len() <= file.len() {
        let mut j = 0;
        while j < pin.len() && file[i + j] == pin[j] {
            j += 1;
        }
        if j == pin.len() && (i == 0 || file[i - 1] == b'\n') {
            let start = i + pin.len();
            let mut end = start;
            while end < file.len() && file[end] != b'\n' {
                end += 1;
            }
            let (_, rest) = file.split_at(start);
            let (value, _) = rest.split_at(end - start);
            return match std::str::from_utf8(value) {
                Ok(v) => v,
                Err(_) => panic!("agent-versions.env: the agent-browser pin is not UTF-8"),
            };
        }
        i += 1;
    }
    panic!("agent-versions.env pins no AGENT_BROWSER_VERSION")
}

/// The actions the agent may send while a human holds the browser: they read the page and
/// change nothing a human would see move. `launch` is the client's own preamble to every
/// command (the daemon answers it with the browser it already runs). Anything not listed is
/// treated as mutating: the set is closed.
pub const READ_ONLY: &[&str] = &[
    "launch",
    "snapshot",
    "screenshot",
    "title",
    "url",
    "gettext",
    "getattribute",
    "innertext",
    "innerhtml",
    "inputvalue",
    "isvisible",
    "isenabled",
    "ischecked",
    "count",
    "boundingbox",
    "styles",
    "console",
    "errors",
    "requests",
    "request_detail",
    "tab_list",
    "stream_status",
    "diff_snapshot",
];

/// What the relay does with one request line.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Pass it to the daemon; `action` is its action name.
    Forward {
        /// The request's action.
        action: String,
    },
    /// Answer it with this refusal instead (the request's `id`, when it had one).
    Refuse {
        /// The request's id, echoed so the client matches the answer.
        id: Option<Value>,
        /// `refusing: ...; to fix: ...`.
        error: String,
    },
}

fn plain_action(a: &str) -> bool {
    !a.is_empty()
        && a.len() <= 64
        && a.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The first `@ref` a request names, anywhere in it.
fn first_ref(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if s.starts_with('@') && s.len() > 1 => Some(s.clone()),
        Value::Array(a) => a.iter().find_map(first_ref),
        Value::Object(o) => o
            .iter()
            .filter(|(k, _)| k.as_str() != "action" && k.as_str() != "id")
            .find_map(|(_, v)| first_ref(v)),
        _ => None,
    }
}

/// Judge one request line from the agent against the control state of box `name`.
pub fn judge(line: &[u8], ctl: &Control, name: &str) -> Verdict {
    let refuse = |id: Option<Value>, error: String| Verdict::Refuse { id, error };
    let Ok(Value::Object(req)) = serde_json::from_slice::<Value>(line) else {
        return refuse(
            None,
            "refusing: the request to the box's browser is not one agent-browser JSON object; to fix: drive the browser with `agent-browser`".into(),
        );
    };
    let id = req.get("id").cloned();
    let Some(action) = req
        .get("action")
        .and_then(Value::as_str)
        .filter(|a| plain_action(a))
    else {
        return refuse(
            id,
            "refusing: the request to the box's browser names no plain action; to fix: drive the browser with `agent-browser`".into(),
        );
    };
    if action.starts_with("__") {
        return refuse(
            id,
            format!("refusing: `{action}` would stop box `{name}`'s shared browser daemon, which h5i runs for the box's life; to fix: `agent-browser close` closes the browser, `h5i box service stop {name} browser` on the host stops it"),
        );
    }
    if matches!(action, "console" | "errors" | "requests")
        && req.get("clear").and_then(Value::as_bool) == Some(true)
    {
        return refuse(
            id,
            format!("refusing: clearing the browser's {action} log is h5i's (it records what the page said after each run); to fix: read it without --clear"),
        );
    }
    if ctl.holder == Holder::Human && !READ_ONLY.contains(&action) {
        return refuse(
            id,
            format!("refusing: a human holds the browser of box `{name}` (since {}), so `{action}` is not the agent's to do; to fix: wait until they run `h5i browser release {name}`; read-only verbs (snapshot, screenshot, get ...) still work", control::ago(ctl.since_ms)),
        );
    }
    if ctl.refs_stale && action != "snapshot" {
        if let Some(r) = first_ref(&Value::Object(req.clone())) {
            return refuse(
                id,
                format!("refusing: {r} is from before a human drove the browser of box `{name}`, and the page may have moved under it; to fix: `agent-browser snapshot` and use its new refs"),
            );
        }
    }
    Verdict::Forward {
        action: action.to_string(),
    }
}

/// The daemon's socket in the sidecar whose container init is `pid`, opened as an `O_PATH`
/// descriptor beneath that process's root with no symlink followed, checked to be a socket.
fn daemon_socket(pid: i32) -> io::Result<OwnedFd> {
    let root = Dir::root_of(pid)?;
    let rel = format!("{}/{SESSION}.sock", DAEMON_DIR.trim_start_matches('/'));
    let fd = root.open_at(rel.as_bytes(), libc::O_PATH | libc::O_NOFOLLOW)?;
    let is_socket = rustix::fs::fstat(&fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket
    });
    if !is_socket {
        return Err(io::Error::other(format!(
            "{DAEMON_DIR}/{SESSION}.sock in the sidecar is not a socket"
        )));
    }
    Ok(fd)
}

/// Connect to the daemon of the sidecar whose container init is `pid`.
pub fn connect_daemon(pid: i32) -> io::Result<UnixStream> {
    let fd = daemon_socket(pid)?;
    // Through the descriptor's own magic link: the inode just checked, whatever its name is now.
    let s = UnixStream::connect(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    s.set_read_timeout(Some(DAEMON_ANSWER))?;
    Ok(s)
}

/// Wait until the daemon of the sidecar whose container init is `pid` accepts a connection:
/// its readiness, since the service's own marker is printed before the daemon runs. Bounded by
/// `within`; a daemon that binds nothing by then is an error, never a relay to nowhere.
pub fn wait_for_daemon(pid: i32, within: Duration) -> io::Result<()> {
    let deadline = std::time::Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        match connect_daemon(pid) {
            Ok(_) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// Read one line of at most `max` bytes (without its newline); `None` at end of stream.
fn read_line(r: &mut impl BufRead, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = r.take(max as u64 + 1).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > max {
        return Err(io::Error::other(format!("a line longer than {max} bytes")));
    }
    Ok(Some(line))
}

/// Send one request to the daemon and read its answer (one line each way).
pub fn ask(pid: i32, request: &Value) -> io::Result<Value> {
    let mut s = connect_daemon(pid)?;
    let mut line = serde_json::to_vec(request).map_err(io::Error::other)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let answer = read_line(&mut BufReader::new(s), MAX_RESPONSE)?
        .ok_or_else(|| io::Error::other("the daemon closed without answering"))?;
    serde_json::from_slice(&answer).map_err(io::Error::other)
}

/// `<box>/browser/relay.bound`: the device and inode of the socket the relay bound (host-only).
fn bound_path(paths: &BoxPaths) -> PathBuf {
    paths.dir.join("browser").join("relay.bound")
}

/// Whether the socket the box's clients find in its HOME is still the one the relay bound: the
/// box can remove it (the directory is its own) and start a daemon of its own there, which
/// would leave later runs with a browser of their own rather than the box's.
pub fn still_bound(paths: &BoxPaths, home: &Path) -> bool {
    let Ok(recorded) = std::fs::read_to_string(bound_path(paths)) else {
        return false;
    };
    let found = Dir::open(home)
        .and_then(|home| home.subdir(CLIENT_DIR.as_bytes()))
        .and_then(|dir| dir.stat_at(format!("{SESSION}.sock").as_bytes()));
    matches!(found, Ok(f) if format!("{} {}", f.dev_ino.0, f.dev_ino.1) == recorded)
}

/// The relay of one box, ready to serve.
pub struct Relay {
    listener: UnixListener,
    paths: BoxPaths,
    name: String,
    daemon_pid: i32,
    /// Whether the daemon has started a browser in this sidecar's life: a later fresh start
    /// means the one before it was gone.
    started: Arc<AtomicBool>,
}

/// `mkdirat`, tolerating an existing entry (checked by the no-follow open that follows).
fn mkdir_at(dir: &Dir, name: &str) -> io::Result<()> {
    match rustix::fs::mkdirat(dir, name, rustix::fs::Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Remove `name` from `dir` if it is there (never a directory).
fn unlink_at(dir: &Dir, name: &str) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Hand `name` in `dir` to the box's owner (never following a symlink).
fn chown_at(dir: &Dir, name: &str, ids: Option<(u32, u32)>) -> io::Result<()> {
    let Some((uid, gid)) = ids else {
        return Ok(());
    };
    let c = CString::new(name).map_err(io::Error::other)?;
    h5i_sys::fs::chown_nofollow(dir, &c, uid, gid)
}

/// Write `bytes` as a new file `name` in `dir` (any old entry removed first, so a name the box
/// linked elsewhere is never written through).
fn create_at(dir: &Dir, name: &str, bytes: &[u8]) -> io::Result<()> {
    unlink_at(dir, name)?;
    // O_EXCL|O_NOFOLLOW: a new file or a refusal, never an entry the box linked elsewhere.
    use rustix::fs::OFlags;
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o644),
    )?;
    std::fs::File::from(fd).write_all(bytes)
}

impl Relay {
    /// Bind the relay in the box's HOME (`home` on the host) for the sidecar whose container
    /// init is `daemon_pid`; `ids` is the box's owner when it is not the caller (a root
    /// caller's box range), who must be able to connect.
    pub fn bind(
        paths: &BoxPaths,
        name: &str,
        home: &Path,
        daemon_pid: i32,
        ids: Option<(u32, u32)>,
    ) -> io::Result<Relay> {
        let home = Dir::open(home)?;
        mkdir_at(&home, CLIENT_DIR)?;
        chown_at(&home, CLIENT_DIR, ids)?;
        let dir = home.subdir(CLIENT_DIR.as_bytes())?;
        let sock = format!("{SESSION}.sock");
        let version = format!("{SESSION}.version");
        create_at(&dir, &version, PINNED_VERSION.as_bytes())?;
        chown_at(&dir, &version, ids)?;
        let config = format!("{SESSION}.config");
        create_at(&dir, &config, DAEMON_CONFIG.as_bytes())?;
        chown_at(&dir, &config, ids)?;
        unlink_at(&dir, &sock)?;
        let at: PathBuf = format!("/proc/self/fd/{}/{sock}", dir.as_raw_fd()).into();
        let listener = UnixListener::bind(&at)?;
        chown_at(&dir, &sock, ids)?;
        let bound = dir.stat_at(sock.as_bytes())?.dev_ino;
        let mine = paths.dir.join("browser");
        if let Err(e) =
            std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
                .create(&mine)
        {
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(e);
            }
        }
        crate::store::write_atomic(
            &bound_path(paths),
            format!("{} {}", bound.0, bound.1).as_bytes(),
        )
        .map_err(io::Error::other)?;
        Ok(Relay {
            listener,
            paths: paths.clone(),
            name: name.to_string(),
            daemon_pid,
            started: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Serve every client connection on a thread of its own, until the process ends.
    pub fn serve(self) {
        for conn in self.listener.incoming() {
            let Ok(client) = conn else {
                continue;
            };
            let paths = self.paths.clone();
            let name = self.name.clone();
            let pid = self.daemon_pid;
            let started = Arc::clone(&self.started);
            std::thread::spawn(move || {
                if let Err(e) = serve_client(client, &paths, &name, pid, &started) {
                    eprintln!("h5i: browser relay of box {name}: {e}");
                }
            });
        }
    }
}

/// Answer `client` with a refusal line.
fn refuse(client: &mut UnixStream, id: Option<Value>, error: &str) -> io::Result<()> {
    let mut line = serde_json::to_vec(&json!({"id": id, "success": false, "error": error}))
        .map_err(io::Error::other)?;
    line.push(b'\n');
    client.write_all(&line)
}

fn serve_client(
    client: UnixStream,
    paths: &BoxPaths,
    name: &str,
    pid: i32,
    started: &AtomicBool,
) -> io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    let mut daemon: Option<(UnixStream, BufReader<UnixStream>)> = None;
    while let Some(line) = read_line(&mut reader, MAX_REQUEST)? {
        super::drain::touched(paths, false);
        match judge(&line, &control::read_for_agent(paths), name) {
            Verdict::Refuse { id, error } => refuse(&mut client, id, &error)?,
            Verdict::Forward { action } => {
                if daemon.is_none() {
                    let s = match connect_daemon(pid) {
                        Ok(s) => s,
                        Err(e) => {
                            let error = format!("refusing: box `{name}`'s browser does not answer ({e}); to fix: run the command again (h5i restarts the browser), or read `h5i box service logs {name} browser`");
                            return refuse(&mut client, None, &error);
                        }
                    };
                    let r = BufReader::new(s.try_clone()?);
                    daemon = Some((s, r));
                }
                let Some((up, up_reader)) = daemon.as_mut() else {
                    continue;
                };
                up.write_all(&line)?;
                up.write_all(b"\n")?;
                let answer = read_line(up_reader, MAX_RESPONSE)?
                    .ok_or_else(|| io::Error::other("the daemon closed without answering"))?;
                // Before the client has the answer: its next request (on a new connection,
                // judged by another thread) must find the refs fresh.
                if action == "snapshot" && answered_ok(&answer) {
                    if let Err(e) = control::refs_refreshed(paths) {
                        eprintln!("h5i: browser relay of box {name}: {e}");
                    }
                }
                client.write_all(&answer)?;
                client.write_all(b"\n")?;
                let fresh = serde_json::from_slice::<Value>(&answer)
                    .is_ok_and(|v| super::drain::launched_afresh(&v));
                if fresh && started.swap(true, Ordering::SeqCst) {
                    super::drain::touched(paths, true);
                }
                if action == "close" && answered_ok(&answer) {
                    // The box closed its browser itself: the next one starts fresh, not lost.
                    started.store(false, Ordering::SeqCst);
                }
            }
        }
    }
    Ok(())
}

fn answered_ok(answer: &[u8]) -> bool {
    serde_json::from_slice::<Value>(answer)
        .ok()
        .and_then(|v| v.get("success").and_then(Value::as_bool))
        == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn human() -> Control {
        Control {
            holder: Holder::Human,
            since_ms: 1,
            taken_by_uid: Some(0),
            viewer: None,
            refs_stale: false,
        }
    }

    fn refused(v: &Verdict) -> &str {
        match v {
            Verdict::Refuse { error, .. } => error,
            Verdict::Forward { action } => panic!("{action} was forwarded"),
        }
    }

    #[test]
    fn the_pin_is_read_from_the_versions_file() {
        assert!(PINNED_VERSION.split('.').count() == 3, "{PINNED_VERSION}");
    }

    #[test]
    fn while_a_human_holds_it_a_click_is_refused_and_a_snapshot_passes() {
        let click = br#"{"action":"click","id":"r1","selector":"@e2"}"#;
        let v = judge(click, &human(), "web");
        assert!(refused(&v).starts_with("refusing: a human holds the browser of box `web`"));
        assert!(refused(&v).contains("to fix: wait until they run `h5i browser release web`"));
        let Verdict::Refuse { id, .. } = v else {
            unreachable!()
        };
        assert_eq!(id, Some(json!("r1")));
        for read in [
            br#"{"action":"snapshot","id":"r2","interactive":true}"#.as_slice(),
            br#"{"action":"launch","id":"r3"}"#,
            br#"{"action":"gettext","id":"r4","selector":"@e2"}"#,
        ] {
            assert!(matches!(
                judge(read, &human(), "web"),
                Verdict::Forward { .. }
            ));
        }
        let agent = Control::default();
        assert!(matches!(
            judge(click, &agent, "web"),
            Verdict::Forward { .. }
        ));
    }

    #[test]
    fn an_action_outside_the_read_only_set_counts_as_mutating() {
        for a in [
            "open", "navigate", "fill", "press", "evaluate", "close", "cdp_url", "zzz",
        ] {
            let line = format!(r#"{{"action":"{a}","id":"x"}}"#);
            assert!(
                matches!(
                    judge(line.as_bytes(), &human(), "web"),
                    Verdict::Refuse { .. }
                ),
                "{a}"
            );
        }
    }

    #[test]
    fn after_a_release_a_stale_ref_is_refused_until_a_snapshot() {
        let stale = Control {
            refs_stale: true,
            ..Control::default()
        };
        let nested = br##"{"action":"drag","id":"d","src":"#a","dst":["x",{"to":"@e9"}]}"##;
        assert!(refused(&judge(nested, &stale, "web")).starts_with("refusing: @e9 is from before"));
        let by_css = br#"{"action":"click","id":"c","selector":"button"}"#;
        assert!(matches!(
            judge(by_css, &stale, "web"),
            Verdict::Forward { .. }
        ));
        let snap = br#"{"action":"snapshot","id":"s"}"#;
        assert!(matches!(
            judge(snap, &stale, "web"),
            Verdict::Forward { .. }
        ));
    }

    #[test]
    fn hostile_lines_are_refused_not_forwarded() {
        let agent = Control::default();
        for line in [
            b"not json".as_slice(),
            b"[1,2]",
            br#"{"id":"x"}"#,
            br#"{"action":"CLICK","id":"x"}"#,
            br#"{"action":"a\u001b]0;pwn\u0007","id":"x"}"#,
            br#"{"action":"__agent_browser_internal_shutdown","id":"x"}"#,
            br#"{"action":"console","clear":true,"id":"x"}"#,
            br#"{"action":"requests","clear":true,"id":"x"}"#,
        ] {
            let v = judge(line, &agent, "web");
            let e = refused(&v);
            assert!(
                e.starts_with("refusing: ") && e.contains("; to fix: "),
                "{e}"
            );
            assert!(!e.contains('\u{1b}'), "{e:?}");
        }
    }

    #[test]
    fn an_oversized_line_is_an_error_not_a_truncated_request() {
        let mut r = io::Cursor::new(vec![b'x'; 100]);
        assert!(read_line(&mut r, 10).is_err());
        let mut r = io::Cursor::new(b"ab\ncd".to_vec());
        assert_eq!(read_line(&mut r, 10).unwrap(), Some(b"ab".to_vec()));
        assert_eq!(read_line(&mut r, 10).unwrap(), Some(b"cd".to_vec()));
        assert_eq!(read_line(&mut r, 10).unwrap(), None);
    }
}
