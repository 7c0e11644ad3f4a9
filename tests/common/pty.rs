//! A program on a real pseudo-terminal, driven as a person would: the test holds both ends
//! of a pty pair, runs the program with the slave as its stdin, stdout, stderr and controlling
//! terminal (the "user's terminal"), and types into / reads from the master with bounded,
//! poll-based waits. Used by `tests/box_shell.rs` and the agents' interactive tests.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A pty pair of the given size.
pub fn sized_pair(rows: u16, cols: u16) -> (OwnedFd, OwnedFd) {
    let (master, slave) = super::pty_pair();
    set_size(master.as_raw_fd(), rows, cols);
    (master, slave)
}

pub fn set_size(fd: RawFd, rows: u16, cols: u16) {
    set_pixel_size(fd, rows, cols, (0, 0));
}

/// Set the terminal's size in cells and in pixels (`(0, 0)`: unknown, as many terminals say).
pub fn set_pixel_size(fd: RawFd, rows: u16, cols: u16, pixels: (u16, u16)) {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: pixels.0,
        ws_ypixel: pixels.1,
    };
    // SAFETY: TIOCSWINSZ reads one winsize, live for the call.
    assert_eq!(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) }, 0);
}

pub fn termios(fd: RawFd) -> libc::termios {
    // SAFETY: tcgetattr fills a plain-data termios.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(fd, &mut t), 0);
        t
    }
}

/// Wait up to `ms` for `fd` to be readable.
pub fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 && p.revents & libc::POLLIN != 0 }
}

pub fn read_some(fd: RawFd) -> Vec<u8> {
    let mut buf = [0u8; 4096];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n > 0 {
        buf[..n as usize].to_vec()
    } else {
        Vec::new()
    }
}

/// Everything waiting in the input queue of the terminal `slave` (what a shell reading that
/// terminal would read next), without blocking: non-canonical, VMIN=0.
pub fn pending_input(slave: RawFd) -> String {
    let mut t = termios(slave);
    t.c_lflag &= !(libc::ICANON | libc::ECHO);
    t.c_cc[libc::VMIN] = 0;
    t.c_cc[libc::VTIME] = 0;
    // SAFETY: tcsetattr reads the termios above.
    assert_eq!(unsafe { libc::tcsetattr(slave, libc::TCSANOW, &t) }, 0);
    let mut got = Vec::new();
    // Bounded: the queue holds at most 4 KiB, so a handful of reads empties it.
    for _ in 0..16 {
        if !readable(slave, 100) {
            break;
        }
        let chunk = read_some(slave);
        if chunk.is_empty() {
            break;
        }
        got.extend(chunk);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// `h5i` running on a pty the test holds both ends of.
/// What one bounded read of the terminal gave.
enum Pump {
    TimedOut,
    Read,
    Quiet,
}

pub struct Session {
    pub master: OwnedFd,
    /// The test's copy of the "user's terminal" (kept to inspect its input queue afterwards).
    pub slave: OwnedFd,
    pub child: Child,
    /// The terminal's settings before h5i started.
    pub before: libc::termios,
    /// Everything read from the terminal so far.
    pub seen: Vec<u8>,
    /// Where in [`Session::seen`] the next `expect` starts looking.
    pub cursor: usize,
    /// Where in [`screen_text`] of [`Session::seen`] the next `expect_screen` starts looking.
    pub screen_cursor: usize,
    /// How long [`Session::expect`] and [`Session::finish`] wait.
    wait: Duration,
}

impl Session {
    /// Run `cmd` with a new pty's slave as its stdin, stdout, stderr and controlling terminal
    /// (24 rows, 80 columns); `wait` bounds [`Session::expect`] and [`Session::finish`].
    pub fn spawn(mut cmd: Command, wait: Duration) -> Session {
        let (master, slave) = sized_pair(24, 80);
        let before = termios(slave.as_raw_fd());
        cmd.stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave.try_clone().unwrap());
        super::with_controlling_terminal(&mut cmd);
        let child = cmd.spawn().unwrap();
        Session {
            master,
            slave,
            child,
            before,
            seen: Vec::new(),
            cursor: 0,
            screen_cursor: 0,
            wait,
        }
    }

    pub fn send(&self, s: &str) {
        let mut f = std::fs::File::from(self.master.try_clone().unwrap());
        f.write_all(s.as_bytes()).unwrap();
    }

    pub fn transcript(&self) -> String {
        String::from_utf8_lossy(&self.seen)
            .escape_debug()
            .to_string()
    }

    /// Read for at most `within`; true once `needle` appears after the cursor.
    pub fn wait_for(&mut self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if let Some(at) = find(&self.seen[self.cursor..], needle.as_bytes()) {
                self.cursor += at + needle.len();
                return true;
            }
            match self.read_until(deadline) {
                Pump::TimedOut => return false,
                Pump::Read | Pump::Quiet => {}
            }
        }
    }

    /// Wait up to 200 ms (never past `deadline`) for output and keep what arrives.
    fn read_until(&mut self, deadline: Instant) -> Pump {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Pump::TimedOut;
        }
        if readable(
            self.master.as_raw_fd(),
            left.as_millis().min(200) as i32 + 1,
        ) {
            self.seen.extend(read_some(self.master.as_raw_fd()));
            Pump::Read
        } else {
            Pump::Quiet
        }
    }

    pub fn expect(&mut self, needle: &str) {
        assert!(
            self.wait_for(needle, self.wait),
            "never saw {needle:?}; transcript: {}",
            self.transcript()
        );
    }

    /// Read for at most `within`; true once `needle` is in the [`screen_text`] shown after the
    /// screen cursor (whitespace in `needle` is ignored, as it is on the screen).
    pub fn wait_for_screen(&mut self, needle: &str, within: Duration) -> bool {
        let needle: String = needle.chars().filter(|c| !c.is_whitespace()).collect();
        let deadline = Instant::now() + within;
        loop {
            let screen = screen_text(&self.seen);
            let from = self.screen_cursor.min(screen.len());
            if let Some(at) = screen.get(from..).and_then(|s| s.find(&needle)) {
                self.screen_cursor = from + at + needle.len();
                return true;
            }
            match self.read_until(deadline) {
                Pump::TimedOut => return false,
                Pump::Read => {}
                // The program ended and showed everything it will.
                Pump::Quiet if self.child.try_wait().ok().flatten().is_some() => return false,
                Pump::Quiet => {}
            }
        }
    }

    /// [`Session::wait_for_screen`] within the session's wait, or fail with the screen text.
    pub fn expect_screen(&mut self, needle: &str) {
        assert!(
            self.wait_for_screen(needle, self.wait),
            "never saw {needle:?} on the screen; it showed: {}",
            screen_text(&self.seen)
        );
    }

    /// Read everything shown for `dur` (bounded).
    pub fn read_for(&mut self, dur: Duration) {
        let _ = self.wait_for("\u{0}never\u{0}", dur);
    }

    /// Wait for h5i to exit (reading its output meanwhile); its exit code.
    pub fn finish(&mut self) -> i32 {
        let deadline = Instant::now() + self.wait;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                // Whatever it printed last.
                while readable(self.master.as_raw_fd(), 0) {
                    let chunk = read_some(self.master.as_raw_fd());
                    if chunk.is_empty() {
                        break;
                    }
                    self.seen.extend(chunk);
                }
                return st.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("h5i did not exit; transcript: {}", self.transcript());
            }
            if readable(self.master.as_raw_fd(), 50) {
                self.seen.extend(read_some(self.master.as_raw_fd()));
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// What a terminal shows of `raw`, for matching: escape sequences (CSI, OSC, and two-byte ESC
/// ones) and other control characters dropped, and all whitespace removed, so a TUI's cursor
/// moves and line wraps between words never split a match.
pub fn screen_text(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            if !c.is_whitespace() && !c.is_control() {
                out.push(c);
            }
            continue;
        }
        match chars.next() {
            // CSI: parameters and intermediates, then one final byte in @..~.
            Some('[') => {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            // OSC (and DCS, APC, PM, SOS): up to BEL or ST.
            Some(']' | 'P' | '_' | '^' | 'X') => {
                while let Some(c) = chars.next() {
                    if c == '\u{7}' {
                        break;
                    }
                    if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                        chars.next();
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}
