//! The host end of one guest-agent session: open a session on a free port, send the run, relay
//! the caller's stdin in and the command's stdout and stderr out, and take its exit.
//!
//! Owns the wall clock for a microvm run: when it fires the guest is told to kill the run's
//! cgroup, and if no exit comes within the grace the caller tears the VM down. Owns the host
//! side of the run's forwarded connections too: each one the guest opens gets a connection to
//! the run's egress proxy ([`super::forward`]), at most [`MAX_CONNS`] at once, each holding at
//! most [`MAX_PENDING`] bytes the proxy has not taken. Every frame
//! from the guest is checked against the session it opened ([`h5i_guest::proto`] parses it
//! strictly): the guest is the box, and nothing it sends is trusted beyond its shape.
//!
//! On `box shell` the caller's terminal is proxied to a pty of the guest's own: raw mode for
//! the relay's life (restored on every path before h5i prints anything), the window size at
//! start and on each SIGWINCH. Only the bytes of the session's output frames reach the caller's
//! terminal; any text of the guest's that h5i prints in a line of its own (a reason a command
//! could not start, the version an agent announces) is escaped first.
//!
//! Must never: wait without a deadline for a guest that stopped answering, pass on bytes from
//! another session, or write a guest's words raw into a line of h5i's own.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use h5i_guest::proto::{
    conn_id, proxy_port, write_pending, ExitReport, Frame, FrameBuffer, Kind, NetData, RunSpec,
    WinSize, MAX_CONNS, PORTS, VERSION,
};

use super::forward::Forward;
use super::vm::Vm;
use crate::error::BoxError;
use crate::file_lock::{FileLock, LockKind};

/// How long after a kill the guest has to report the exit before the VM is called stuck.
pub const KILL_GRACE: Duration = Duration::from_secs(30);

/// The most bytes one forwarded connection holds for a proxy that is not taking them; past it
/// the connection is closed.
pub const MAX_PENDING: usize = 8 << 20;

/// A fresh session number.
fn session_number() -> u32 {
    let mut b = [0u8; 4];
    if h5i_sys::random::fill(&mut b).is_err() {
        return std::process::id() ^ crate::store::now_ms() as u32;
    }
    u32::from_le_bytes(b)
}

/// Wait for `fd` to turn readable until `deadline`; false at the deadline.
fn readable(fds: &mut [libc::pollfd], deadline: Option<Instant>) -> std::io::Result<usize> {
    // The time left is rounded up to the next millisecond: the wait never ends just before
    // the deadline.
    let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    match h5i_sys::poll::wait(fds, timeout) {
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(0),
        other => other,
    }
}

/// An open session.
struct Session {
    sock: UnixStream,
    id: u32,
    frames: FrameBuffer,
}

impl Session {
    /// Connect to `socket` and open a session: one Hello, then a blocking read for the agent's
    /// Ready of this session until `deadline`, watching `qemu` (a pidfd) so a VM that died is
    /// not waited for. Nothing is sent again and nothing reconnects: QEMU holds the Hello in
    /// the socket until the guest has the port open, and the agent answers every Hello it
    /// reads. Bytes before the Ready (the cut-off rest of an earlier session's output) are
    /// skipped unparsed. An agent that announces another protocol version is refused.
    fn open(
        socket: &Path,
        qemu: Option<RawFd>,
        deadline: Instant,
    ) -> Result<Session, SessionError> {
        let broken = SessionError::Broken;
        let sock = UnixStream::connect(socket)
            .map_err(|e| broken(format!("{}: {e}", socket.display())))?;
        let id = session_number();
        let mut s = Session {
            sock,
            id,
            frames: FrameBuffer::default(),
        };
        s.send(Kind::Hello, &[])
            .map_err(|e| broken(e.to_string()))?;
        loop {
            if s.frames.skip_to(Kind::Ready, id) {
                if let Some(f) = s.frames.next_frame().map_err(|e| broken(e.to_string()))? {
                    if f.payload != VERSION.as_bytes() {
                        return Err(SessionError::Mismatch(crate::escape::bytes(&f.payload)));
                    }
                    return Ok(s);
                }
            }
            if !s.wait_fill(qemu, Some(deadline)).map_err(broken)? {
                return Err(broken("no answer from the guest agent in time".into()));
            }
        }
    }

    fn send(&mut self, kind: Kind, payload: &[u8]) -> std::io::Result<()> {
        Frame::new(kind, self.id, payload.to_vec()).write_to(&mut self.sock)
    }

    /// Wait for bytes (until `deadline`, or `qemu` exits) and buffer them; false at the
    /// deadline.
    fn wait_fill(
        &mut self,
        qemu: Option<RawFd>,
        deadline: Option<Instant>,
    ) -> Result<bool, String> {
        loop {
            let mut fds = vec![libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            if let Some(q) = qemu {
                fds.push(libc::pollfd {
                    fd: q,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            if readable(&mut fds, deadline).map_err(|e| e.to_string())? == 0 {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(false);
                }
                continue;
            }
            if fds.get(1).is_some_and(|p| p.revents != 0) {
                return Err("the VM's QEMU process exited".into());
            }
            self.fill()?;
            return Ok(true);
        }
    }

    fn fill(&mut self) -> Result<(), String> {
        let mut buf = [0u8; 64 << 10];
        match self.sock.read(&mut buf) {
            Ok(0) => Err("the VM closed the session (its QEMU or guest went away)".into()),
            Ok(n) => {
                self.frames.extend(&buf[..n]);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Wait until the guest agent behind `socket` answers a session, QEMU (`pid`) is gone, or
/// `deadline` passes.
pub fn wait_ready(socket: &Path, pid: i32, deadline: Instant) -> Result<(), SessionError> {
    // The QEMU this process just started (its child: no reuse yet).
    let pidfd =
        h5i_sys::pidfd::open(pid).map_err(|e| SessionError::Broken(format!("pidfd_open: {e}")))?;
    Session::open(socket, Some(pidfd.as_raw_fd()), deadline).map(drop)
}

/// The refusal for a guest agent that speaks `speaks` (escaped), not this h5i's [`VERSION`].
pub fn mismatch_refused(speaks: &str) -> BoxError {
    BoxError::BadRequest {
        what: format!(
            "the microVM's guest agent speaks `{speaks}`, and this h5i speaks `{VERSION}`"
        ),
        mend: "install the h5i-guest built with this h5i beside it (`make build`, or `make install`); the next run boots the VM with it".into(),
    }
}

/// What the host saw of one run.
#[derive(Debug)]
pub struct Observed {
    /// The guest agent's exit report (`None`: the command could not start; `failed` says why).
    pub exit: Option<ExitReport>,
    /// Why it could not start (the guest's words, escaped: fit to print).
    pub failed: Option<String>,
    /// The wall clock fired.
    pub timed_out: bool,
    /// From sending the run to its exit.
    pub wall: Duration,
}

/// Why a run's session broke: the guest stopped answering (the VM must go), its agent speaks
/// another protocol, or the session could not be opened.
#[derive(Debug)]
pub enum SessionError {
    /// The guest did not report an exit within [`KILL_GRACE`] of a kill.
    Stuck,
    /// The agent announced this version (escaped), not [`VERSION`].
    Mismatch(String),
    /// Anything else, with a reason.
    Broken(String),
}

/// A port of `vm` no other run holds (waits for port 0's when all are busy).
fn take_port(vm: &Vm) -> Result<(usize, FileLock), BoxError> {
    let path = |i: usize| vm.dir.join(format!("port-{i}.lock"));
    for i in 0..PORTS {
        let p = path(i);
        if let Some(l) =
            FileLock::try_take(&p, LockKind::Exclusive).map_err(|e| BoxError::io(&p, e))?
        {
            return Ok((i, l));
        }
    }
    let i = std::process::id() as usize % PORTS;
    let p = path(i);
    let l = FileLock::wait(&p, LockKind::Exclusive).map_err(|e| BoxError::io(&p, e))?;
    Ok((i, l))
}

/// How the caller's standard descriptors meet the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerStdio {
    /// Passed through as pipes: stdin to the command's, its stdout and stderr to h5i's.
    Piped,
    /// The caller's terminal (descriptor 0) proxied to a pty of the guest's own: raw mode for
    /// the session's life, the window size at start and on every SIGWINCH.
    Terminal,
}

/// The size of the caller's terminal, or 24x80 when it does not say.
fn caller_window() -> WinSize {
    h5i_runtime::pty::window_size(0)
        .map(|w| WinSize {
            rows: w.ws_row,
            cols: w.ws_col,
        })
        .unwrap_or(WinSize { rows: 24, cols: 80 })
}

/// Run `spec` in `vm`, relaying this process's standard descriptors as `stdio` says; with
/// `forward`, the run may reach its egress proxy through its port's forward, named in its
/// proxy variables.
pub fn run(
    vm: &Vm,
    spec: &RunSpec,
    wall: Option<Duration>,
    forward: Option<&Forward>,
    stdio: CallerStdio,
) -> Result<Result<Observed, SessionError>, BoxError> {
    let (port, _port_lock) = take_port(vm)?;
    let mut spec = spec.clone();
    if forward.is_some() {
        spec.egress = true;
        let url = format!("http://127.0.0.1:{}", proxy_port(port));
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            spec.env.push(format!("{k}={url}").into_bytes());
        }
        for k in ["NO_PROXY", "no_proxy"] {
            spec.env
                .push(format!("{k}=127.0.0.1,localhost,::1").into_bytes());
        }
    }
    if stdio == CallerStdio::Terminal {
        spec.pty = Some(caller_window());
    }
    let opened = Session::open(
        &vm.port_socket(port),
        None,
        Instant::now() + Duration::from_secs(90),
    );
    let mut s = match opened {
        Ok(s) => s,
        Err(e) => return Ok(Err(e)),
    };
    let mut net = Connections {
        forward,
        conns: HashMap::new(),
    };
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    // Raw from here to the end of the relay (the guard restores the terminal on every path,
    // before h5i prints anything of its own); SIGWINCH read from a signalfd meanwhile.
    let terminal = match stdio {
        CallerStdio::Terminal => Some((
            h5i_runtime::pty::RawTerminal::enter(0)?,
            h5i_runtime::pty::WinchSignal::new()?,
        )),
        CallerStdio::Piped => None,
    };
    let argv: Vec<String> = spec
        .argv
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    h5i_log::spawned_argv(&argv, None, "microvm guest agent");
    let mut io = CallerIo {
        stdin: stdin_usable().then_some(0),
        out: &mut out,
        err: &mut err,
        winch: terminal.as_ref().map(|(_, w)| w),
    };
    Ok(relay(&mut s, &spec, wall, &mut net, &mut io))
}

/// The caller's side of a relay: where the command's input comes from and its output goes.
struct CallerIo<'a> {
    /// The descriptor typed or piped input is read from (`None`: closed).
    stdin: Option<RawFd>,
    /// Where the command's stdout (on a pty: everything it writes) goes, byte for byte.
    out: &'a mut dyn Write,
    /// Where its stderr goes.
    err: &'a mut dyn Write,
    /// SIGWINCH of the caller's terminal (a run on a pty): each one sends the new size.
    winch: Option<&'a h5i_runtime::pty::WinchSignal>,
}

/// One forwarded connection, host side.
struct HostConn {
    stream: TcpStream,
    /// Bytes from the guest the proxy has not taken yet.
    to_proxy: Vec<u8>,
    /// The guest's command ended its side.
    guest_done: bool,
    /// The proxy ended its side (told to the guest).
    proxy_done: bool,
}

/// The run's forwarded connections.
struct Connections<'a> {
    forward: Option<&'a Forward>,
    conns: HashMap<u32, HostConn>,
}

impl Connections<'_> {
    /// A forwarding frame from the guest (hostile: ids are checked, sizes bounded).
    fn take_guest_frame(&mut self, s: &mut Session, f: &Frame) -> std::io::Result<()> {
        match f.kind {
            Kind::NetOpen => {
                let id = conn_id(&f.payload)?;
                let opened = match self.forward {
                    Some(fw) if self.conns.len() < MAX_CONNS && !self.conns.contains_key(&id) => fw
                        .connect()
                        .and_then(|c| c.set_nonblocking(true).map(|()| c)),
                    _ => Err(std::io::Error::other("not forwarded")),
                };
                match opened {
                    Ok(stream) => {
                        self.conns.insert(
                            id,
                            HostConn {
                                stream,
                                to_proxy: Vec::new(),
                                guest_done: false,
                                proxy_done: false,
                            },
                        );
                    }
                    Err(_) => s.send(Kind::NetCloseToGuest, &id.to_le_bytes())?,
                }
            }
            Kind::NetFromGuest => {
                let d = NetData::decode(&f.payload)?;
                if let Some(c) = self.conns.get_mut(&d.id) {
                    c.to_proxy.extend_from_slice(d.bytes);
                    if c.to_proxy.len() > MAX_PENDING {
                        self.conns.remove(&d.id);
                        s.send(Kind::NetCloseToGuest, &d.id.to_le_bytes())?;
                    }
                }
            }
            Kind::NetCloseFromGuest => {
                if let Some(c) = self.conns.get_mut(&conn_id(&f.payload)?) {
                    c.guest_done = true;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Move bytes both ways without blocking on a proxy connection.
    fn pump(&mut self, s: &mut Session, buf: &mut [u8]) -> std::io::Result<()> {
        let mut gone = Vec::new();
        for (id, c) in &mut self.conns {
            if write_pending(&mut c.stream, &mut c.to_proxy).is_err() {
                c.to_proxy.clear();
                c.guest_done = true;
            }
            if c.guest_done && c.to_proxy.is_empty() {
                let _ = c.stream.shutdown(Shutdown::Write);
            }
            if !c.proxy_done {
                match c.stream.read(buf) {
                    Ok(n) if n > 0 => s.send(Kind::NetToGuest, &NetData::encode(*id, &buf[..n]))?,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                        ) => {}
                    _ => {
                        c.proxy_done = true;
                        s.send(Kind::NetCloseToGuest, &id.to_le_bytes())?;
                    }
                }
            }
            if c.proxy_done && c.guest_done && c.to_proxy.is_empty() {
                gone.push(*id);
            }
        }
        for id in gone {
            self.conns.remove(&id);
        }
        Ok(())
    }

    /// The proxy connections to wake for.
    fn poll_fds(&self) -> impl Iterator<Item = libc::pollfd> + '_ {
        self.conns.values().map(|c| libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: if c.proxy_done { 0 } else { libc::POLLIN }
                | if c.to_proxy.is_empty() {
                    0
                } else {
                    libc::POLLOUT
                },
            revents: 0,
        })
    }
}

/// Relay one run: send it, pass the caller's input in and the guest's output out (only the
/// bytes of this session's output frames; nothing else the guest sends reaches `io.out` or
/// `io.err`), and take its exit.
fn relay(
    s: &mut Session,
    spec: &RunSpec,
    wall: Option<Duration>,
    net: &mut Connections<'_>,
    io: &mut CallerIo<'_>,
) -> Result<Observed, SessionError> {
    let broken = |e: std::io::Error| SessionError::Broken(e.to_string());
    let started = Instant::now();
    s.send(Kind::Run, &spec.encode()).map_err(broken)?;
    let mut stdin_open = io.stdin.is_some();
    if !stdin_open {
        s.send(Kind::StdinEof, &[]).map_err(broken)?;
    }
    let wall_at = wall.map(|w| started + w);
    let mut kill_at: Option<Instant> = None;
    let mut timed_out = false;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        while let Some(f) = s
            .frames
            .next_frame()
            .map_err(|e| SessionError::Broken(e.to_string()))?
        {
            if f.session != s.id {
                continue;
            }
            match f.kind {
                Kind::Stdout => {
                    let _ = io.out.write_all(&f.payload).and_then(|()| io.out.flush());
                }
                Kind::Stderr => {
                    let _ = io.err.write_all(&f.payload).and_then(|()| io.err.flush());
                }
                Kind::Exit => {
                    let exit = ExitReport::decode(&f.payload).map_err(broken)?;
                    return Ok(Observed {
                        exit: Some(exit),
                        failed: None,
                        timed_out,
                        wall: started.elapsed(),
                    });
                }
                Kind::Failed => {
                    return Ok(Observed {
                        exit: None,
                        failed: Some(crate::escape::bytes(&f.payload)),
                        timed_out,
                        wall: started.elapsed(),
                    })
                }
                Kind::NetOpen | Kind::NetFromGuest | Kind::NetCloseFromGuest => {
                    net.take_guest_frame(s, &f).map_err(broken)?;
                }
                _ => {}
            }
        }
        net.pump(s, &mut buf).map_err(broken)?;
        let deadline = match (kill_at, wall_at) {
            (Some(k), _) => Some(k),
            (None, w) => w,
        };
        let mut fds = vec![libc::pollfd {
            fd: s.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let slot = |fds: &mut Vec<libc::pollfd>, fd: RawFd| {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            fds.len() - 1
        };
        let stdin_slot = io.stdin.filter(|_| stdin_open).map(|fd| slot(&mut fds, fd));
        let winch_slot = io.winch.map(|w| slot(&mut fds, w.fd()));
        fds.extend(net.poll_fds());
        readable(&mut fds, deadline).map_err(broken)?;
        let now = Instant::now();
        if kill_at.is_some_and(|k| now >= k) {
            return Err(SessionError::Stuck);
        }
        if kill_at.is_none() && wall_at.is_some_and(|w| now >= w) {
            timed_out = true;
            s.send(Kind::Kill, &[]).map_err(broken)?;
            kill_at = Some(now + KILL_GRACE);
            continue;
        }
        // A resize first: it applies before input typed after it.
        if let (Some(i), Some(w)) = (winch_slot, io.winch) {
            if fds[i].revents != 0 {
                w.drain();
                s.send(Kind::Resize, &caller_window().encode())
                    .map_err(broken)?;
            }
        }
        if fds[0].revents != 0 {
            s.fill().map_err(SessionError::Broken)?;
        }
        if let (Some(i), Some(fd)) = (stdin_slot, io.stdin) {
            if fds[i].revents != 0 {
                let n = h5i_sys::fds::read_raw(fd, &mut buf);
                let ended = match &n {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) => e.kind() != std::io::ErrorKind::Interrupted,
                };
                if let Ok(n @ 1..) = n {
                    s.send(Kind::Stdin, &buf[..n]).map_err(broken)?;
                } else if ended {
                    stdin_open = false;
                    s.send(Kind::StdinEof, &[]).map_err(broken)?;
                }
            }
        }
    }
}

/// Whether descriptor 0 is open for reading.
fn stdin_usable() -> bool {
    h5i_sys::fds::is_open_for_reading(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A hostile guest agent on a socket: it reads the Hello, answers with `answer(session)`
    /// (the frames it chooses), then keeps reading until the host goes.
    fn fake_agent(
        dir: &Path,
        answer: impl FnOnce(u32) -> Vec<Frame> + Send + 'static,
    ) -> (std::path::PathBuf, std::thread::JoinHandle<()>) {
        let path = dir.join("port.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let agent = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let hello = Frame::read_from(&mut conn).unwrap().unwrap();
            assert_eq!(hello.kind, Kind::Hello);
            for f in answer(hello.session) {
                f.write_to(&mut conn).unwrap();
            }
            let mut sink = Vec::new();
            let _ = conn.read_to_end(&mut sink);
        });
        (path, agent)
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[test]
    fn an_agent_speaking_another_version_is_refused_with_its_words_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let (path, agent) = fake_agent(dir.path(), |id| {
            vec![Frame::new(
                Kind::Ready,
                id,
                b"h5i-guest/2\x1b]0;pwned\x07".to_vec(),
            )]
        });
        let e = match Session::open(&path, None, deadline()) {
            Err(SessionError::Mismatch(v)) => v,
            other => panic!("{:?}", other.map(|_| ())),
        };
        drop(agent);
        assert!(!e.contains('\x1b') && e.contains("h5i-guest/2"), "{e:?}");
        let refusal = mismatch_refused(&e).to_string();
        assert!(
            refusal.contains(VERSION) && refusal.contains("to fix:") && !refusal.contains('\x1b'),
            "{refusal}"
        );
    }

    /// Only this session's output frames reach the caller's outputs, byte for byte (escape
    /// sequences included: the guest's terminal is its own to drive); a frame of another
    /// session, a second Ready and a forwarding frame of a run with no forward reach nothing.
    #[test]
    fn only_the_sessions_output_reaches_the_caller_and_a_refusal_is_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let (path, agent) = fake_agent(dir.path(), |id| {
            let exit = ExitReport {
                code: Some(3),
                ..ExitReport::default()
            };
            vec![
                Frame::new(Kind::Ready, id, VERSION.as_bytes().to_vec()),
                Frame::new(Kind::Stdout, id ^ 1, b"OTHER-SESSION".to_vec()),
                Frame::new(Kind::Ready, id, b"READY-AGAIN".to_vec()),
                Frame::new(Kind::NetOpen, id, 7u32.to_le_bytes().to_vec()),
                Frame::new(Kind::Stdout, id, b"\x1b]0;title\x07\x1b[2Jout".to_vec()),
                Frame::new(Kind::Stderr, id, b"err".to_vec()),
                Frame::new(Kind::Exit, id, exit.encode()),
            ]
        });
        let mut s = Session::open(&path, None, deadline()).unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut io = CallerIo {
            stdin: None,
            out: &mut out,
            err: &mut err,
            winch: None,
        };
        let mut net = Connections {
            forward: None,
            conns: HashMap::new(),
        };
        let spec = RunSpec {
            argv: vec![b"true".to_vec()],
            ..RunSpec::default()
        };
        let seen = relay(&mut s, &spec, None, &mut net, &mut io).unwrap();
        drop(s);
        agent.join().unwrap();
        assert_eq!(seen.exit.unwrap().code, Some(3));
        assert_eq!(out, b"\x1b]0;title\x07\x1b[2Jout");
        assert_eq!(err, b"err");

        // The guest's reason for not starting a command is printed by h5i: escaped here.
        let dir = tempfile::tempdir().unwrap();
        let (path, agent) = fake_agent(dir.path(), |id| {
            vec![
                Frame::new(Kind::Ready, id, VERSION.as_bytes().to_vec()),
                Frame::new(
                    Kind::Failed,
                    id,
                    b"cannot start \x1b[2J\xc2\x9b31m`x`".to_vec(),
                ),
            ]
        });
        let mut s = Session::open(&path, None, deadline()).unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut io = CallerIo {
            stdin: None,
            out: &mut out,
            err: &mut err,
            winch: None,
        };
        let seen = relay(&mut s, &spec, None, &mut net, &mut io).unwrap();
        drop(s);
        agent.join().unwrap();
        let failed = seen.failed.unwrap();
        assert!(
            failed.contains("cannot start") && !failed.chars().any(crate::escape::is_control),
            "{failed:?}"
        );
        assert!(out.is_empty() && err.is_empty());
    }
}
