//! The caller's standard descriptors (0, 1, 2), carried into a box as the caller had them.
//!
//! Owns two facts that are otherwise lost on the way in:
//! - **Which were closed** when this process started (`cmd 2>&-`). Rust's runtime opens
//!   `/dev/null` on a closed standard descriptor before `main`, so only a constructor sees it:
//!   each binary registers [`record_closed_at_start`] in `.init_array`; a launcher closes those
//!   descriptors again in its child ([`close_in_child`]) and `h5i-runc`'s executor closes them
//!   just before the payload's exec ([`StdioSnapshot::restore`]).
//! - **The access mode of a descriptor that is `/dev/null`.** libcontainer 0.7's container
//!   init (`reopen_dev_null`, after pivot_root) replaces every standard descriptor that is the
//!   host's `/dev/null` with the container's `/dev/null` opened with `File::open`, i.e.
//!   read-only: `box run ... >/dev/null` then met EBADF on every write. `h5i-runc` records
//!   the caller's mode before libcontainer forks ([`StdioSnapshot::take`]) and its executor
//!   reopens `/dev/null` with that mode. The defect is libcontainer's (runc reopens read-write);
//!   this is the workaround in h5i-runc, not a fork of libcontainer.
//! - **Which were closed, across an engine** (the container tier): Podman's client cannot be
//!   started with a standard descriptor closed (it would open some file there and hand that
//!   on), so h5i passes its placeholder `/dev/null` and names the closed ones in the
//!   [`ANNOTATION_CLOSED`] annotation; `h5i-runc`'s executor closes them before the exec too.
//!
//! Must never: touch a descriptor above 2, or change a standard descriptor that is not
//! `/dev/null` (ttys, pipes, sockets, files and `/dev/full` pass through untouched), or act when
//! the process has a terminal of the runtime's making (`process.terminal`).
//! Guarded by the unit tests below and `tests/box_stdio.rs` (stdio x tier against the host).

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

/// The annotation naming the standard descriptors the caller had closed (`"2"`, `"0,2"`), for a
/// runtime started through an engine that could not be handed them closed.
pub use h5i_policy::spec_names::annotation::STDIO_CLOSED as ANNOTATION_CLOSED;

/// Why an [`ANNOTATION_CLOSED`] value was refused.
#[derive(Debug, thiserror::Error)]
#[error("refusing: annotation {ANNOTATION_CLOSED}={0:?} names something other than the standard descriptors 0, 1, 2; to fix: give a comma-separated list of 0, 1 and 2 (or leave the annotation out)")]
pub struct BadClosedAnnotation(String);

/// Bit `fd` set: standard descriptor `fd` was closed when this process started.
static CLOSED_AT_START: AtomicU8 = AtomicU8::new(0);

/// Which standard descriptors are closed now. For the `.init_array` constructor each binary
/// registers (see the module doc); it runs before Rust's runtime opens `/dev/null` on them.
pub extern "C" fn record_closed_at_start() {
    let mut mask = 0u8;
    for fd in 0..3 {
        if !h5i_sys::fds::is_open(fd) {
            mask |= 1 << fd;
        }
    }
    CLOSED_AT_START.store(mask, Ordering::Relaxed);
}

/// The standard descriptors that were closed when this process started.
pub fn closed_at_start() -> ClosedStdio {
    ClosedStdio(CLOSED_AT_START.load(Ordering::Relaxed))
}

/// A set of standard descriptors (bit `fd`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClosedStdio(u8);

impl ClosedStdio {
    /// The descriptors in the set.
    pub fn fds(self) -> impl Iterator<Item = RawFd> {
        (0..3).filter(move |fd| self.0 & (1 << fd) != 0)
    }

    /// The set as [`ANNOTATION_CLOSED`]'s value (`None` when empty).
    pub fn annotation(self) -> Option<String> {
        let list: Vec<String> = self.fds().map(|fd| fd.to_string()).collect();
        (!list.is_empty()).then(|| list.join(","))
    }

    /// Parse [`ANNOTATION_CLOSED`]'s value: a comma-separated list of 0, 1 and 2.
    pub fn from_annotation(value: &str) -> Result<ClosedStdio, BadClosedAnnotation> {
        let mut mask = 0u8;
        for part in value.split(',') {
            match part.trim() {
                "0" => mask |= 1,
                "1" => mask |= 2,
                "2" => mask |= 4,
                _ => return Err(BadClosedAnnotation(value.to_owned())),
            }
        }
        Ok(ClosedStdio(mask))
    }

    /// Close every descriptor in the set (async-signal-safe: only close(2)).
    pub fn close_all(self) {
        for fd in self.fds() {
            // A standard descriptor closed when the process started, holding only the runtime's
            // placeholder `/dev/null` since.
            let _ = h5i_sys::fds::close_std(fd);
        }
    }
}

/// Make `cmd`'s child start with the standard descriptors this process was started without.
pub fn close_in_child(cmd: &mut Command) {
    let closed = closed_at_start();
    if closed == ClosedStdio::default() {
        return;
    }
    // SAFETY: the closure only calls close(2), which is async-signal-safe, between fork and
    // exec as pre_exec requires.
    unsafe {
        cmd.pre_exec(move || {
            closed.close_all();
            Ok(())
        });
    }
}

/// Open-file flags of a descriptor that survive a reopen: access mode, append, non-blocking.
const KEPT_FLAGS: libc::c_int = libc::O_ACCMODE | libc::O_APPEND | libc::O_NONBLOCK;

/// The standard descriptors as `h5i-runc` received them: for each that is `/dev/null`, its
/// flags; and which were closed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StdioSnapshot {
    /// `Some(flags)` for a descriptor that is the character device `/dev/null`.
    dev_null: [Option<libc::c_int>; 3],
    /// Closed when `h5i-runc` started.
    closed: ClosedStdio,
}

impl StdioSnapshot {
    /// Record the standard descriptors now (in `h5i-runc`, before libcontainer forks).
    pub fn take() -> Self {
        let null_rdev = char_rdev_of_path(c"/dev/null");
        let mut dev_null = [None; 3];
        let closed = closed_at_start();
        for fd in 0..3 {
            if closed.0 & (1 << fd) != 0 {
                continue;
            }
            if null_rdev.is_some() && char_rdev_of_fd(fd) == null_rdev {
                dev_null[fd as usize] = get_flags(fd).map(|f| f & KEPT_FLAGS);
            }
        }
        Self { dev_null, closed }
    }

    /// The same snapshot, with `more` closed too (the caller's, named by annotation).
    pub fn also_closed(self, more: ClosedStdio) -> Self {
        Self {
            closed: ClosedStdio(self.closed.0 | more.0),
            ..self
        }
    }

    /// Inside the container, just before the payload's exec: give every recorded `/dev/null`
    /// descriptor back its mode (reopening the container's `/dev/null` where libcontainer
    /// replaced it) and close what was closed. Nothing is done when the process got a terminal.
    pub fn restore(&self, terminal: bool) -> io::Result<()> {
        if terminal {
            return Ok(());
        }
        let null_rdev = char_rdev_of_path(c"/dev/null");
        for (fd, flags) in (0..3).zip(self.dev_null) {
            let Some(want) = flags else { continue };
            if null_rdev.is_none() || char_rdev_of_fd(fd) != null_rdev {
                continue;
            }
            if get_flags(fd).map(|f| f & KEPT_FLAGS) == Some(want) {
                continue;
            }
            reopen_dev_null(fd, want)?;
        }
        self.closed.close_all();
        Ok(())
    }
}

/// `st_rdev` of the character device at `path`.
fn char_rdev_of_path(path: &std::ffi::CStr) -> Option<libc::dev_t> {
    h5i_sys::fds::char_device_at(path)
}

/// `st_rdev` of `fd` when it is a character device.
fn char_rdev_of_fd(fd: RawFd) -> Option<libc::dev_t> {
    h5i_sys::fds::char_device_of(fd)
}

fn get_flags(fd: RawFd) -> Option<libc::c_int> {
    h5i_sys::fds::status_flags(fd)
}

/// Point `fd` at a fresh open of `/dev/null` with `flags`.
fn reopen_dev_null(fd: RawFd, flags: libc::c_int) -> io::Result<()> {
    h5i_sys::fds::point_std_at_dev_null(fd, flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closed_set_lists_its_descriptors() {
        assert_eq!(ClosedStdio(0b101).fds().collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(ClosedStdio::default().fds().count(), 0);
    }

    #[test]
    fn the_closed_annotation_round_trips_and_names_only_0_1_2() {
        assert_eq!(ClosedStdio(0b101).annotation().as_deref(), Some("0,2"));
        assert_eq!(ClosedStdio::default().annotation(), None);
        assert_eq!(
            ClosedStdio::from_annotation("0,2").unwrap(),
            ClosedStdio(0b101)
        );
        for bad in ["", "3", "0,,2", "-1", "1;2", "x"] {
            assert!(ClosedStdio::from_annotation(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_read_only_dev_null_gets_its_write_mode_back() {
        // In a forked child, so the harness's own descriptors stay untouched: fd 1 becomes a
        // write-only /dev/null, is snapshotted, then replaced read-only (what libcontainer's
        // init does), and restore must make writes work again.
        // SAFETY: fork in a test; the child only makes syscalls and _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = (|| -> Option<i32> {
                reopen_dev_null(1, libc::O_WRONLY).ok()?;
                let snap = StdioSnapshot::take();
                reopen_dev_null(1, libc::O_RDONLY).ok()?;
                // SAFETY: write of one byte from a static buffer.
                let before = unsafe { libc::write(1, b"x".as_ptr().cast(), 1) };
                snap.restore(false).ok()?;
                // SAFETY: as above.
                let after = unsafe { libc::write(1, b"x".as_ptr().cast(), 1) };
                Some(if before < 0 && after == 1 { 0 } else { 1 })
            })()
            .unwrap_or(2);
            // SAFETY: _exit in the forked child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
