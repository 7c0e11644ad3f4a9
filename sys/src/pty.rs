//! Pseudo-terminals and the terminals h5i relays: opening a pair (`/dev/ptmx`, then the peer
//! through `TIOCGPTPEER`, so no path is looked up in between), the window size, taking a
//! terminal as the controlling one (`TIOCSCTTY`), telling a master from anything else
//! (`TIOCGPTN`), and a terminal in raw mode restored on drop.
//!
//! On rustix for the pair (`openpt`, `unlockpt`, `TIOCGPTPEER`); on libc where the caller
//! names a terminal by number (0, 1, a relay's tty), which may not be open (a `BorrowedFd` must
//! name an open descriptor): then the call answers `EBADF`, nothing else happens. Owns the
//! calls only: which terminal is the user's and what is relayed where are the callers'. Must
//! never: hand out a descriptor without close-on-exec, steal a terminal another session holds
//! (`TIOCSCTTY` with 0), or stop the caller while restoring a terminal (`SIGTTOU` is ignored
//! around it). Tested below on pairs it opens.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::pty::OpenptFlags;

pub use libc::winsize as Winsize;

/// A pseudo-terminal call that failed, named.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {source}")]
pub struct PtyCallError {
    /// Which call failed.
    pub call: &'static str,
    /// The kernel's error.
    pub source: io::Error,
}

fn failed(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> PtyCallError {
    move |e| PtyCallError {
        call,
        source: e.into(),
    }
}

/// A new pseudo-terminal pair, both ends close-on-exec and neither this process's controlling
/// terminal: (master, slave).
pub fn open_pair() -> Result<(OwnedFd, OwnedFd), PtyCallError> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags).map_err(failed("posix_openpt"))?;
    rustix::pty::unlockpt(&master).map_err(failed("unlockpt"))?;
    let slave = rustix::pty::ioctl_tiocgptpeer(&master, flags).map_err(failed("TIOCGPTPEER"))?;
    Ok((master, slave))
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor number (EBADF when it is not open).
    unsafe { libc::isatty(fd) == 1 }
}

/// The window size of the terminal on `fd`, when it is one and has a size.
pub fn window_size(fd: RawFd) -> Option<Winsize> {
    // SAFETY: winsize is plain data for the kernel to fill.
    let mut ws: Winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which lives for the call.
    let r = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some(ws)
}

/// Set the window size of the pty behind `master`, best effort (a failure leaves the old
/// size); the kernel signals the pty's foreground job with `SIGWINCH`.
pub fn set_window_size(master: BorrowedFd<'_>, ws: &Winsize) {
    // SAFETY: TIOCSWINSZ reads one winsize from `ws`, which lives for the call.
    unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, ws) };
}

/// Make the terminal on `fd` the controlling terminal of the calling process, which must lead
/// a session that has none (a child just after `setsid`): its process group becomes the
/// terminal's foreground job. Never steals one another session holds (argument 0).
/// Async-signal-safe (one system call), so a `pre_exec` closure may call it.
pub fn take_as_controlling_terminal(fd: RawFd) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument and changes only this process's session.
    if unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is the master side of a pseudo-terminal (only a master answers `TIOCGPTN`).
pub fn is_master(fd: impl AsFd) -> bool {
    let mut n: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int into `n`, which lives for the call.
    unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCGPTN, &mut n) == 0 }
}

/// The terminal on a descriptor in raw mode; dropping it restores the saved settings.
#[derive(Debug)]
pub struct RawMode {
    fd: RawFd,
    saved: libc::termios,
}

impl RawMode {
    /// Put the terminal on `fd` in raw mode (no echo, no line editing, no signal keys, no
    /// output processing), reads returning as soon as one byte is there.
    pub fn enter(fd: RawFd) -> Result<RawMode, PtyCallError> {
        let err = |call| move |source| PtyCallError { call, source };
        // SAFETY: termios is plain data for tcgetattr to fill.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes one termios into `saved`.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(err("tcgetattr")(io::Error::last_os_error()));
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw edits the termios value in place.
        unsafe { libc::cfmakeraw(&mut raw) };
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: tcsetattr reads one termios from `raw`.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(err("tcsetattr")(io::Error::last_os_error()));
        }
        Ok(RawMode { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: tcsetattr reads the termios saved in `enter`; SIGTTOU is ignored around it so
        // a caller moved to the background is not stopped while restoring, and its previous
        // disposition put back.
        unsafe {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetattr(self.fd, libc::TCSADRAIN, &self.saved);
            libc::signal(libc::SIGTTOU, old);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_close_on_exec_and_only_its_master_answers_as_one() {
        let (master, slave) = open_pair().unwrap();
        for fd in [&master, &slave] {
            let flags = rustix::io::fcntl_getfd(fd).unwrap();
            assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        }
        assert!(is_master(&master) && !is_master(&slave));
        assert!(is_terminal(slave.as_raw_fd()));
        let ws = Winsize {
            ws_row: 33,
            ws_col: 101,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        set_window_size(master.as_fd(), &ws);
        let got = window_size(slave.as_raw_fd()).unwrap();
        assert_eq!((got.ws_row, got.ws_col), (33, 101));
    }

    #[test]
    fn raw_mode_turns_echo_off_and_dropping_it_turns_it_back_on() {
        let (_master, slave) = open_pair().unwrap();
        let echo = |fd| rustix::termios::tcgetattr(fd).unwrap().local_modes;
        let before = echo(&slave);
        assert!(before.contains(rustix::termios::LocalModes::ECHO));
        let raw = RawMode::enter(slave.as_raw_fd()).unwrap();
        assert!(!echo(&slave).contains(rustix::termios::LocalModes::ECHO));
        drop(raw);
        assert_eq!(echo(&slave), before);
        let (r, _w) = crate::fds::pipe().unwrap();
        assert_eq!(RawMode::enter(r.as_raw_fd()).unwrap_err().call, "tcgetattr");
        assert!(!is_terminal(r.as_raw_fd()));
    }
}
