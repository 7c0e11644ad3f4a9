//! The host end of one guest-agent session: open a session on a free port, send the run, relay
//! the caller's stdin in and the command's stdout and stderr out, and take its exit.
//!
//! Owns the wall clock for a microvm run: when it fires the guest is told to kill the run's
//! cgroup, and if no exit comes within the grace the caller tears the VM down. Every frame
//! from the guest is checked against the session it opened ([`h5i_guest::proto`] parses it
//! strictly): the guest is the box, and nothing it sends is trusted beyond its shape.
//!
//! Must never: wait without a deadline for a guest that stopped answering, or pass on bytes
//! from another session.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use h5i_guest::proto::{ExitReport, Frame, FrameBuffer, Kind, RunSpec, PORTS, VERSION};

use super::vm::Vm;
use crate::error::BoxError;
use crate::file_lock::{FileLock, LockKind};

/// How long after a kill the guest has to report the exit before the VM is called stuck.
pub const KILL_GRACE: Duration = Duration::from_secs(30);

/// A fresh session number.
fn session_number() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom into a local 4-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 4 {
        return std::process::id() ^ crate::store::now_ms() as u32;
    }
    u32::from_le_bytes(b)
}

/// Wait for `fd` to turn readable until `deadline`; false at the deadline.
fn readable(fds: &mut [libc::pollfd], deadline: Option<Instant>) -> std::io::Result<usize> {
    let timeout = match deadline {
        None => -1,
        Some(d) => d
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32,
    };
    // SAFETY: poll over a caller's array of pollfds with its length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
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
    /// skipped unparsed.
    fn open(socket: &Path, qemu: Option<RawFd>, deadline: Instant) -> Result<Session, String> {
        let sock = UnixStream::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
        let id = session_number();
        let mut s = Session {
            sock,
            id,
            frames: FrameBuffer::default(),
        };
        s.send(Kind::Hello, &[]).map_err(|e| e.to_string())?;
        loop {
            if s.frames.skip_to(Kind::Ready, id) {
                if let Some(f) = s.frames.next_frame().map_err(|e| e.to_string())? {
                    if f.payload != VERSION.as_bytes() {
                        return Err(format!(
                            "the guest agent speaks {}, not {VERSION}",
                            String::from_utf8_lossy(&f.payload)
                        ));
                    }
                    return Ok(s);
                }
            }
            if !s.wait_fill(qemu, Some(deadline))? {
                return Err("no answer from the guest agent in time".into());
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
pub fn wait_ready(socket: &Path, pid: i32, deadline: Instant) -> Result<(), String> {
    // The QEMU this process just started (its child: no reuse yet).
    let pidfd = h5i_sys::pidfd::open(pid).map_err(|e| format!("pidfd_open: {e}"))?;
    Session::open(socket, Some(pidfd.as_raw_fd()), deadline).map(drop)
}

/// What the host saw of one run.
#[derive(Debug)]
pub struct Observed {
    /// The guest agent's exit report (`None`: the command could not start; `failed` says why).
    pub exit: Option<ExitReport>,
    /// Why it could not start.
    pub failed: Option<String>,
    /// The wall clock fired.
    pub timed_out: bool,
    /// From sending the run to its exit.
    pub wall: Duration,
}

/// Why a run's session broke: the guest stopped answering (the VM must go) or the session
/// could not be opened.
#[derive(Debug)]
pub enum SessionError {
    /// The guest did not report an exit within [`KILL_GRACE`] of a kill.
    Stuck,
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

/// Run `spec` in `vm`, relaying this process's standard descriptors.
pub fn run(
    vm: &Vm,
    spec: &RunSpec,
    wall: Option<Duration>,
) -> Result<Result<Observed, SessionError>, BoxError> {
    let (port, _port_lock) = take_port(vm)?;
    let opened = Session::open(
        &vm.port_socket(port),
        None,
        Instant::now() + Duration::from_secs(90),
    );
    let mut s = match opened {
        Ok(s) => s,
        Err(why) => return Ok(Err(SessionError::Broken(why))),
    };
    Ok(relay(&mut s, spec, wall))
}

fn relay(
    s: &mut Session,
    spec: &RunSpec,
    wall: Option<Duration>,
) -> Result<Observed, SessionError> {
    let broken = |e: std::io::Error| SessionError::Broken(e.to_string());
    let started = Instant::now();
    s.send(Kind::Run, &spec.encode()).map_err(broken)?;
    let mut stdin_open = stdin_usable();
    if !stdin_open {
        s.send(Kind::StdinEof, &[]).map_err(broken)?;
    }
    let wall_at = wall.map(|w| started + w);
    let mut kill_at: Option<Instant> = None;
    let mut timed_out = false;
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
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
                    let _ = out.write_all(&f.payload).and_then(|()| out.flush());
                }
                Kind::Stderr => {
                    let _ = err.write_all(&f.payload).and_then(|()| err.flush());
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
                        failed: Some(String::from_utf8_lossy(&f.payload).into_owned()),
                        timed_out,
                        wall: started.elapsed(),
                    })
                }
                _ => {}
            }
        }
        let deadline = match (kill_at, wall_at) {
            (Some(k), _) => Some(k),
            (None, w) => w,
        };
        let mut fds = vec![libc::pollfd {
            fd: s.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        if stdin_open {
            fds.push(libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            });
        }
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
        if fds[0].revents != 0 {
            s.fill().map_err(SessionError::Broken)?;
        }
        if fds.get(1).is_some_and(|p| p.revents != 0) {
            // SAFETY: read from descriptor 0 into a local buffer.
            let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                s.send(Kind::Stdin, &buf[..n as usize]).map_err(broken)?;
            } else {
                stdin_open = false;
                s.send(Kind::StdinEof, &[]).map_err(broken)?;
            }
        }
    }
}

/// Whether descriptor 0 is open for reading.
fn stdin_usable() -> bool {
    // SAFETY: fcntl(F_GETFL) only inspects descriptor 0.
    let fl = unsafe { libc::fcntl(0, libc::F_GETFL) };
    fl >= 0 && (fl & libc::O_ACCMODE) != libc::O_WRONLY
}
