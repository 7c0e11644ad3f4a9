//! The box's own terminal: a pseudo-terminal per `box shell` session, proxied by h5i to the
//! user's terminal, so the box never holds the user's tty.
//!
//! Owns, in the order a session uses them:
//! - [`PtyPair::open`]: a pty pair h5i opens itself (workspace tier), both ends close-on-exec;
//!   [`attach_slave`] makes the child a session leader whose controlling terminal and stdio
//!   are the slave (setsid + `TIOCSCTTY` in `pre_exec`);
//! - [`ConsoleSocket`]: the OCI console-socket protocol (process tier): a listening unix socket
//!   in a private 0700 directory, handed to `h5i-runc --console-socket`; the runtime sends the
//!   master it opened inside the box over `SCM_RIGHTS`. [`new_session`] detaches the runtime
//!   from the user's terminal (setsid, no controlling terminal);
//! - [`PtyProxy`]: the user's terminal in raw mode (a guard restores it on every exit path,
//!   including errors and unwinding), stdin -> master and master -> stdout with `poll(2)`, the
//!   window size at start and on `SIGWINCH` (signalfd), and a drain of the master once the child
//!   is gone. It runs inside the supervisor's poll loop as a [`Companion`], so there are no
//!   threads and no sleeps.
//!
//! Ctrl-C, Ctrl-Z and friends are bytes here: the box's own line discipline turns them into
//! signals for the box's foreground job, so job control works inside the box and never reaches
//! h5i or the user's shell.
//!
//! Must never: pass a descriptor of the user's terminal to a box process (every fd made here is
//! close-on-exec; the child's stdio is the slave), hand the box the user's terminal's
//! foreground, or leave the user's terminal in raw mode.
//!
//! Guarded by the unit tests below and by `tests/box_shell.rs` (sessions driven through a real
//! pty: output, exit status, full-screen programs, resize, Ctrl-C, TIOCSTI, leftover jobs).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use h5i_sys::fd_passing::Wait;
use h5i_sys::poll::{PollEntry, POLLERR, POLLHUP, POLLIN, POLLOUT};
pub use h5i_sys::pty::Winsize;
use h5i_sys::signals::SignalFd;

use crate::supervise::Companion;

/// Longest a unix socket path may be (`sun_path` is 108 bytes, NUL included).
const SUN_PATH_MAX: usize = 107;
/// Bytes moved per read.
const CHUNK: usize = 16 * 1024;
/// Most the final drain copies once the child is gone: a leftover writer in a workspace-tier
/// box cannot keep the session open.
const DRAIN_MAX: usize = 4 << 20;

/// Why a terminal for the box could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    /// A pseudo-terminal could not be opened.
    #[error("refusing: cannot open a pseudo-terminal for the box ({call}): {source}; to fix: mount devpts at /dev/pts (with /dev/ptmx) or raise the pty limit (sysctl kernel.pty.max)")]
    Open {
        /// Which call failed.
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The console socket could not be made.
    #[error("refusing: cannot make the console socket in {dir}: {source}; to fix: make {dir} writable, or set XDG_RUNTIME_DIR to a private directory with a short path")]
    ConsoleSocket {
        /// The directory it was to live in.
        dir: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The user's terminal could not be put in raw mode or read.
    #[error("refusing: cannot take the terminal on stdin into raw mode ({call}): {source}; to fix: run from a terminal, or pipe the commands in (`echo 'cmd' | h5i box shell NAME`)")]
    Terminal {
        /// Which call failed.
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// SIGWINCH could not be routed to a signalfd.
    #[error("refusing: cannot watch window-size changes ({call}): {source}; to fix: this kernel must support signalfd")]
    Signal {
        /// Which call failed.
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: RawFd) -> bool {
    h5i_sys::pty::is_terminal(fd)
}

/// The window size of the terminal on `fd`, when it is one.
pub fn window_size(fd: RawFd) -> Option<Winsize> {
    h5i_sys::pty::window_size(fd)
}

/// A pseudo-terminal pair h5i opened itself (the workspace tier's).
#[derive(Debug)]
pub struct PtyPair {
    /// h5i's end.
    pub master: OwnedFd,
    /// The box's end: its stdio and controlling terminal.
    pub slave: OwnedFd,
}

impl PtyPair {
    /// Open a pair (`/dev/ptmx`, then the peer through `TIOCGPTPEER`, so no path is looked up
    /// in between), both close-on-exec, the slave sized like `size`.
    pub fn open(size: Option<&Winsize>) -> Result<PtyPair, PtyError> {
        let (master, slave) = h5i_sys::pty::open_pair().map_err(|e| PtyError::Open {
            call: e.call,
            source: e.source,
        })?;
        if let Some(ws) = size {
            h5i_sys::pty::set_window_size(master.as_fd(), ws);
        }
        Ok(PtyPair { master, slave })
    }
}

/// Make `cmd` a session leader whose stdin, stdout, stderr and controlling terminal are
/// `slave`, with an empty signal mask (h5i blocks some signals for its own loop) and no other
/// inherited descriptor: whatever h5i itself inherited (a stray descriptor of the user's
/// terminal included) is closed at exec.
pub fn attach_slave(cmd: &mut Command, slave: &OwnedFd) -> io::Result<()> {
    cmd.stdin(slave.try_clone()?)
        .stdout(slave.try_clone()?)
        .stderr(slave.try_clone()?);
    // SAFETY: the closure calls only async-signal-safe functions (sigprocmask, setsid, ioctl,
    // close_range or fcntl, each one system call on stack data) between fork and exec, as
    // pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            h5i_sys::signals::unblock_all()?;
            h5i_sys::proc::new_session()?;
            // fd 0 is the slave by now (stdio is set up before pre_exec runs).
            h5i_sys::pty::take_as_controlling_terminal(0)?;
            // Marked rather than closed: std's own exec-error pipe keeps working.
            h5i_sys::fds::mark_inherited_cloexec()
        });
    }
    Ok(())
}

/// Make the terminal `slave` the controlling terminal of the calling process, which must lead
/// a session that has none (a child just after `setsid`): its process group becomes the
/// terminal's foreground job.
pub fn take_as_controlling_terminal(slave: &OwnedFd) -> io::Result<()> {
    h5i_sys::pty::take_as_controlling_terminal(slave.as_raw_fd())
}

/// Make `cmd` a session leader with no controlling terminal and an empty signal mask (the
/// process tier's runtime: it gets the box's terminal from the console socket, never the
/// user's).
pub fn new_session(cmd: &mut Command) {
    // SAFETY: the closure calls only async-signal-safe functions (sigprocmask, setsid, one
    // system call each on stack data) between fork and exec, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            h5i_sys::signals::unblock_all()?;
            h5i_sys::proc::new_session()
        });
    }
}

/// The console socket: a listening unix socket in a private (0700) directory, removed on drop.
#[derive(Debug)]
pub struct ConsoleSocket {
    dir: PathBuf,
    path: PathBuf,
    listener: UnixListener,
}

impl ConsoleSocket {
    /// Listen in a fresh private directory under `$XDG_RUNTIME_DIR` when that is a directory
    /// and short enough, else under `/tmp`.
    pub fn bind() -> Result<ConsoleSocket, PtyError> {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute() && d.is_dir())
            .filter(|d| d.as_os_str().len() + "/h5i-cs-XXXXXX/s".len() <= SUN_PATH_MAX)
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        let dir = h5i_sys::fs::private_temp_dir(&base, "h5i-cs-").map_err(|source| {
            PtyError::ConsoleSocket {
                dir: base.clone(),
                source,
            }
        })?;
        let path = dir.join("s");
        let listener = UnixListener::bind(&path).and_then(|l| {
            l.set_nonblocking(true)?;
            Ok(l)
        });
        match listener {
            Ok(listener) => Ok(ConsoleSocket {
                dir,
                path,
                listener,
            }),
            Err(source) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(PtyError::ConsoleSocket { dir, source })
            }
        }
    }

    /// The path to pass as `--console-socket`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Receive the one descriptor the console-socket protocol sends over `conn` (close-on-exec).
/// Ok(None): the peer closed without sending one. A message with more is refused.
fn recv_fd(conn: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut data = [0u8; 256];
    let got = h5i_sys::fd_passing::recv_with_fds(conn, &mut data, 1, Wait::Block)?;
    Ok(got.fds.into_iter().next())
}

/// Whether `fd` is the master side of a pseudo-terminal (only a master answers `TIOCGPTN`).
pub fn is_pty_master(fd: impl AsFd) -> bool {
    h5i_sys::pty::is_master(fd)
}

/// The user's terminal in raw mode; dropping it restores the saved settings.
#[derive(Debug)]
pub struct RawTerminal {
    /// Held for its drop, which restores the terminal.
    _mode: h5i_sys::pty::RawMode,
}

impl RawTerminal {
    /// Put the terminal on `fd` in raw mode (no echo, no line editing, no signal keys, no
    /// output processing: the box's own pty does all of that).
    pub fn enter(fd: RawFd) -> Result<RawTerminal, PtyError> {
        h5i_sys::pty::RawMode::enter(fd)
            .map(|mode| RawTerminal { _mode: mode })
            .map_err(|e| PtyError::Terminal {
                call: e.call,
                source: e.source,
            })
    }
}

/// SIGWINCH, blocked on this thread and readable from a signalfd while it lives (the proxy's,
/// and the microvm tier's relay of a guest's terminal); unblocked again on drop unless it was
/// blocked before.
#[derive(Debug)]
pub struct WinchSignal(SignalFd);

impl WinchSignal {
    /// Block SIGWINCH on this thread and route it to a signalfd.
    pub fn new() -> Result<WinchSignal, PtyError> {
        SignalFd::block(&[libc::SIGWINCH])
            .map(WinchSignal)
            .map_err(|source| PtyError::Signal {
                call: "signalfd",
                source,
            })
    }

    /// The signalfd to poll for readability.
    pub fn fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }

    /// Consume every pending notification.
    pub fn drain(&self) {
        while self.0.read().is_some() {}
    }
}

/// Where the master comes from, and whether it has arrived.
#[derive(Debug)]
enum Master {
    /// Waiting for the runtime to connect to the console socket.
    Listening(ConsoleSocket),
    /// Connected; waiting for the `SCM_RIGHTS` message.
    Connected(UnixStream),
    /// Proxying.
    Open(OwnedFd),
    /// Every holder of the slave closed it (EIO) while the child may still be exiting: kept
    /// open, unpolled, because closing a master hangs its pty up and would SIGHUP a box
    /// process between its last close and its exit (turning its exit status into 129).
    Drained {
        /// Held, never read: dropped after the child exited.
        _held: OwnedFd,
    },
    /// Closed after the child exited, or no master ever arrived.
    Closed,
}

/// What one slot of the poll array was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Winch,
    Listener,
    Conn,
    Master,
    Stdin,
}

/// The proxy between the user's terminal (`stdin`, `stdout`) and the box's pty master.
#[derive(Debug)]
pub struct PtyProxy {
    master: Master,
    stdin: RawFd,
    stdout: RawFd,
    stdin_open: bool,
    stdout_open: bool,
    /// Typed bytes the master has not taken yet (stdin is not read while this is non-empty).
    pending: Vec<u8>,
    winch: WinchSignal,
    slots: Vec<Slot>,
    /// Why no master arrived, when none did.
    refused: Option<String>,
    // Dropped last: the terminal is restored after everything else is closed.
    _raw: RawTerminal,
}

impl PtyProxy {
    /// Proxy a master h5i already holds (the workspace tier's [`PtyPair`]).
    pub fn with_master(master: OwnedFd) -> Result<PtyProxy, PtyError> {
        h5i_sys::fds::set_nonblocking(&master, true).map_err(|source| PtyError::Open {
            call: "fcntl(O_NONBLOCK)",
            source,
        })?;
        let proxy = PtyProxy::new(Master::Open(master))?;
        proxy.propagate_size();
        Ok(proxy)
    }

    /// Proxy the master the runtime will send to `socket` (the process tier).
    pub fn with_console_socket(socket: ConsoleSocket) -> Result<PtyProxy, PtyError> {
        PtyProxy::new(Master::Listening(socket))
    }

    fn new(master: Master) -> Result<PtyProxy, PtyError> {
        let raw = RawTerminal::enter(0)?;
        Ok(PtyProxy {
            master,
            stdin: 0,
            stdout: 1,
            stdin_open: true,
            stdout_open: true,
            pending: Vec::new(),
            winch: WinchSignal::new()?,
            slots: Vec::new(),
            refused: None,
            _raw: raw,
        })
    }

    /// Why the runtime's master never arrived, when it did not (for the CLI to print once the
    /// terminal is restored).
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    fn propagate_size(&self) {
        if let (Master::Open(m), Some(ws)) = (&self.master, window_size(self.stdin)) {
            h5i_sys::pty::set_window_size(m.as_fd(), &ws);
        }
    }

    /// Accept the runtime's connection (the listener is closed and its directory removed).
    fn accept(&mut self) {
        let Master::Listening(sock) = &self.master else {
            return;
        };
        match sock.listener.accept() {
            Ok((conn, _)) => {
                self.master = match conn.set_nonblocking(true) {
                    Ok(()) => Master::Connected(conn),
                    Err(e) => self.refuse(format!("console socket: {e}")),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => self.master = self.refuse(format!("console socket accept: {e}")),
        }
    }

    /// Take the master from the runtime's message.
    fn receive(&mut self) {
        let Master::Connected(conn) = &self.master else {
            return;
        };
        self.master = match recv_fd(conn) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => self.refuse(format!("console socket receive: {e}")),
            Ok(None) => self.refuse("the runtime closed the console socket without a pty".into()),
            Ok(Some(fd)) if !is_pty_master(&fd) => self
                .refuse("the console socket received a descriptor that is not a pty master".into()),
            Ok(Some(fd)) => match h5i_sys::fds::set_nonblocking(&fd, true) {
                Ok(()) => Master::Open(fd),
                Err(e) => self.refuse(format!("pty master: {e}")),
            },
        };
        self.propagate_size();
    }

    fn refuse(&mut self, why: String) -> Master {
        self.refused = Some(why);
        Master::Closed
    }

    /// master -> stdout, one read. False when the master has nothing more to give now.
    fn pump_master(&mut self) -> bool {
        let Master::Open(m) = &self.master else {
            return false;
        };
        let mut buf = [0u8; CHUNK];
        match h5i_sys::fds::read_raw(m.as_raw_fd(), &mut buf) {
            Ok(n) if n > 0 => {
                self.write_out(&buf[..n]);
                return true;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                return false;
            }
            _ => {}
        }
        // EIO (or 0): every holder of the slave is gone.
        if let Master::Open(m) = std::mem::replace(&mut self.master, Master::Closed) {
            self.master = Master::Drained { _held: m };
        }
        false
    }

    fn write_out(&mut self, mut data: &[u8]) {
        while self.stdout_open && !data.is_empty() {
            let kind = match h5i_sys::fds::write_raw(self.stdout, data) {
                Ok(n) if n > 0 => {
                    data = &data[n..];
                    continue;
                }
                // A write of 0 bytes (never for a non-empty buffer): taken as the terminal gone.
                Ok(_) => io::ErrorKind::Other,
                Err(e) => e.kind(),
            };
            match kind {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => {
                    let mut p = [h5i_sys::poll::entry(self.stdout, POLLOUT)];
                    let _ = h5i_sys::poll::wait(&mut p, None);
                }
                // The user's terminal is gone: keep draining the box, show nothing.
                _ => self.stdout_open = false,
            }
        }
    }

    /// stdin -> pending, one read.
    fn pump_stdin(&mut self) {
        let mut buf = [0u8; CHUNK];
        match h5i_sys::fds::read_raw(self.stdin, &mut buf) {
            Ok(n) if n > 0 => {
                self.pending.extend_from_slice(&buf[..n]);
                self.flush_pending();
                return;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                return;
            }
            _ => {}
        }
        // End of input or a hung-up terminal: nothing more will be typed.
        self.stdin_open = false;
    }

    /// pending -> master, as much as it takes without blocking.
    fn flush_pending(&mut self) {
        let Master::Open(m) = &self.master else {
            self.pending.clear();
            return;
        };
        while !self.pending.is_empty() {
            let kind = match h5i_sys::fds::write_raw(m.as_raw_fd(), &self.pending) {
                Ok(n) if n > 0 => {
                    self.pending.drain(..n);
                    continue;
                }
                Ok(_) => io::ErrorKind::Other,
                Err(e) => e.kind(),
            };
            match kind {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => return,
                _ => {
                    self.pending.clear();
                    return;
                }
            }
        }
    }
}

impl Companion for PtyProxy {
    fn interest(&mut self, fds: &mut Vec<PollEntry>) {
        self.slots.clear();
        let mut add = |slots: &mut Vec<Slot>, slot, fd, events| {
            slots.push(slot);
            fds.push(h5i_sys::poll::entry(fd, events));
        };
        // Window changes first: a resize is applied before input typed after it.
        add(&mut self.slots, Slot::Winch, self.winch.fd(), POLLIN);
        match &self.master {
            Master::Listening(s) => add(
                &mut self.slots,
                Slot::Listener,
                s.listener.as_raw_fd(),
                POLLIN,
            ),
            Master::Connected(c) => add(&mut self.slots, Slot::Conn, c.as_raw_fd(), POLLIN),
            Master::Open(m) => {
                let mut events = POLLIN;
                if !self.pending.is_empty() {
                    events |= POLLOUT;
                }
                add(&mut self.slots, Slot::Master, m.as_raw_fd(), events);
                if self.stdin_open && self.pending.is_empty() {
                    add(&mut self.slots, Slot::Stdin, self.stdin, POLLIN);
                }
            }
            Master::Drained { .. } | Master::Closed => {}
        }
    }

    fn ready(&mut self, fds: &[PollEntry]) {
        let slots = std::mem::take(&mut self.slots);
        for (slot, p) in slots.iter().zip(fds) {
            if p.revents == 0 {
                continue;
            }
            match slot {
                Slot::Winch => {
                    self.winch.drain();
                    self.propagate_size();
                }
                Slot::Listener => self.accept(),
                Slot::Conn => self.receive(),
                Slot::Master => {
                    if p.revents & POLLOUT != 0 {
                        self.flush_pending();
                    }
                    if p.revents & (POLLIN | POLLHUP | POLLERR) != 0 {
                        self.pump_master();
                    }
                }
                Slot::Stdin => {
                    if p.revents & POLLIN != 0 {
                        self.pump_stdin();
                    } else {
                        // POLLHUP/POLLERR/POLLNVAL without data: the terminal is gone.
                        self.stdin_open = false;
                    }
                }
            }
        }
    }

    fn child_exited(&mut self) {
        // Everything the box wrote before it exited is readable now: polling a pty master
        // flushes the kernel's pending input work before it answers, so a zero-timeout poll
        // that says "nothing" means nothing is left (or only a leftover background job is
        // still writing, which is capped).
        let mut copied = 0;
        while copied < DRAIN_MAX {
            let Master::Open(m) = &self.master else {
                break;
            };
            let mut p = [h5i_sys::poll::entry(m.as_raw_fd(), POLLIN)];
            let n = h5i_sys::poll::wait(&mut p, Some(std::time::Duration::ZERO)).unwrap_or(0);
            if n == 0 || p[0].revents == 0 {
                break;
            }
            if !self.pump_master() {
                break;
            }
            copied += CHUNK;
        }
        // The child is gone: closing the master now hangs the box's pty up, so anything left in
        // a workspace-tier box gets SIGHUP/EIO there, never the user's terminal.
        self.master = Master::Closed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_pair_is_close_on_exec_at_both_ends() {
        let pair = PtyPair::open(None).unwrap();
        for fd in [pair.master.as_raw_fd(), pair.slave.as_raw_fd()] {
            // SAFETY: F_GETFD only reads the descriptor flags.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            assert!(flags & libc::FD_CLOEXEC != 0);
        }
        assert!(is_pty_master(&pair.master));
        assert!(!is_pty_master(&pair.slave));
    }

    #[test]
    fn a_pair_takes_the_size_it_is_given() {
        let ws = Winsize {
            ws_row: 33,
            ws_col: 101,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pair = PtyPair::open(Some(&ws)).unwrap();
        let got = window_size(pair.slave.as_raw_fd()).unwrap();
        assert_eq!((got.ws_row, got.ws_col), (33, 101));
    }

    #[test]
    fn the_console_socket_lives_in_a_private_short_directory_and_is_removed() {
        let s = ConsoleSocket::bind().unwrap();
        assert!(s.path().as_os_str().len() <= SUN_PATH_MAX);
        let dir = s.path().parent().unwrap().to_path_buf();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        drop(s);
        assert!(!dir.exists());
    }

    #[test]
    fn a_master_sent_over_the_console_socket_is_received_and_checked() {
        let s = ConsoleSocket::bind().unwrap();
        let pair = PtyPair::open(None).unwrap();
        let client = UnixStream::connect(s.path()).unwrap();
        let (conn, _) = s.listener.accept().unwrap();
        send_fd(&client, pair.master.as_fd());
        let got = recv_fd(&conn).unwrap().unwrap();
        assert!(is_pty_master(&got));
        // A descriptor that is not a pty master is recognised as such.
        let f = std::fs::File::open("/dev/null").unwrap();
        send_fd(&client, f.as_fd());
        let got = recv_fd(&conn).unwrap().unwrap();
        assert!(!is_pty_master(&got));
        drop(client);
        assert!(recv_fd(&conn).unwrap().is_none());
    }

    fn send_fd(conn: &UnixStream, fd: std::os::fd::BorrowedFd<'_>) {
        h5i_sys::fd_passing::send_with_fds(conn, b"/dev/ptmx", &[fd]).unwrap();
    }
}
