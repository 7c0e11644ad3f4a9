//! Forking and exec'ing by hand, for the processes that cannot use std's `Command`: the box
//! sandbox's init, single-threaded, which forks each run and runs ordinary code in the child
//! (a terminal opened, a handshake with the host) before it execs; a forked child that joins
//! a namespace (a threaded process cannot) and reports back ([`in_forked_child`]); the shell
//! shim's copy of itself that keeps passing output on; and h5i-runc replacing itself with its
//! sealed copy (`fexecve`, an exec of a descriptor, which rustix wraps only in its unstable
//! runtime feature). Owns `fork`, `_exit`, reaping such a child, and `execve`/`fexecve` of
//! argument arrays prepared beforehand ([`ExecArgs`]).
//!
//! Must never: fork a process that has more than one thread through [`fork_single_threaded`]
//! (its contract), allocate in [`ExecArgs::exec`] (its pointer arrays are made with it), or
//! return from [`exit_now`] (no destructor of the parent's state runs in the child). Tested
//! below: a forked child whose first exec is refused (`ENOENT`) and whose second runs a
//! prepared `sh` with its environment.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Which side of a fork this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The new process.
    Child,
    /// The parent, with the child's pid.
    Parent(i32),
}

/// `fork(2)`.
///
/// # Safety
///
/// The calling process must have exactly one thread: the child then may run ordinary code
/// (allocate, take locks) until it execs or calls [`exit_now`]. A process with more threads
/// would hand the child locks another thread held at the fork.
pub unsafe fn fork_single_threaded() -> io::Result<Forked> {
    // SAFETY: the caller guarantees a single-threaded process (this function's contract).
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// Run `body` in a forked child and reap it: the child's raw wait status
/// ([`crate::proc::Ended::from_wait_status`] decodes it; `body`'s return value is its exit
/// code). The wait is resumed when a signal interrupts it.
///
/// # Safety
///
/// Either the calling process has exactly one thread, or `body` makes only async-signal-safe
/// calls (no allocation, no lock, no std I/O): a child of a threaded process holds copies of
/// locks other threads held at the fork, never to be released.
pub unsafe fn in_forked_child(body: impl FnOnce() -> i32) -> io::Result<i32> {
    // SAFETY: the caller's contract above is fork_single_threaded's, widened to a body that
    // makes only async-signal-safe calls, which no lock held elsewhere can block.
    let pid = match unsafe { fork_single_threaded() }? {
        Forked::Child => exit_now(body()),
        Forked::Parent(pid) => pid,
    };
    let mut status = 0;
    loop {
        // SAFETY: waitpid on this process's own child, writing into `status` on this stack.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(status);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// End this process at once with `code` (`_exit(2)`): no destructor, no atexit handler, no
/// flush of the parent's buffered output copied into a forked child.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process; nothing of it is used afterwards.
    unsafe { libc::_exit(code) }
}

/// An argument vector and environment for `execve`, with their null-terminated pointer arrays
/// made once, so exec'ing allocates nothing.
pub struct ExecArgs {
    // The strings the pointers point into (each CString's bytes live on the heap, so moving
    // this struct does not move them).
    _argv: Vec<CString>,
    _env: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    env_ptrs: Vec<*const libc::c_char>,
}

impl ExecArgs {
    /// The arrays for `argv` and `env` (`NAME=value` each).
    pub fn new(argv: Vec<CString>, env: Vec<CString>) -> ExecArgs {
        let ptrs = |v: &[CString]| -> Vec<*const libc::c_char> {
            v.iter()
                .map(|a| a.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        ExecArgs {
            argv_ptrs: ptrs(&argv),
            env_ptrs: ptrs(&env),
            _argv: argv,
            _env: env,
        }
    }

    /// Replace this process with the program at `path`; returns only when the kernel refused,
    /// with its error. Every descriptor without close-on-exec is passed on.
    pub fn exec(&self, path: &CStr) -> io::Error {
        // SAFETY: a NUL-terminated path, and argv and envp arrays ending in a null pointer whose
        // entries point into CStrings this struct owns, all alive for the call.
        unsafe {
            libc::execve(
                path.as_ptr(),
                self.argv_ptrs.as_ptr(),
                self.env_ptrs.as_ptr(),
            )
        };
        io::Error::last_os_error()
    }

    /// Replace this process with the program `fd` refers to (`fexecve`: an open executable,
    /// a sealed memfd for one); returns only when the kernel refused, with its error.
    pub fn exec_fd(&self, fd: BorrowedFd<'_>) -> io::Error {
        // SAFETY: a live descriptor, and argv and envp arrays ending in a null pointer whose
        // entries point into CStrings this struct owns, all alive for the call.
        unsafe {
            libc::fexecve(
                fd.as_raw_fd(),
                self.argv_ptrs.as_ptr(),
                self.env_ptrs.as_ptr(),
            )
        };
        io::Error::last_os_error()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn c(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    /// The test harness has threads, so the child only calls exec (async-signal-safe) or
    /// exit_now before it is gone.
    #[test]
    fn a_forked_child_execs_its_prepared_program_or_reports_why_not() {
        let args = ExecArgs::new(vec![c("sh"), c("-c"), c("exit $((X + 4))")], vec![c("X=3")]);
        let missing = c("/nonexistent/h5i-no-such-program");
        // SAFETY: the child makes only execve and _exit calls (async-signal-safe), so the
        // test harness's other threads hold nothing it needs.
        let pid = match unsafe { fork_single_threaded() }.unwrap() {
            Forked::Child => {
                let e = args.exec(&missing);
                let code = if e.raw_os_error() == Some(libc::ENOENT) {
                    args.exec(c"/bin/sh");
                    126
                } else {
                    125
                };
                exit_now(code)
            }
            Forked::Parent(pid) => pid,
        };
        let (ended, _) = crate::proc::reap_with_usage(pid).unwrap();
        assert_eq!(ended.code, Some(7));
        // SAFETY: the child's body makes no call at all.
        let status = unsafe { in_forked_child(|| 3) }.unwrap();
        assert_eq!(crate::proc::Ended::from_wait_status(status).code, Some(3));
        // A descriptor that is no executable (a pipe) is refused, and this process goes on.
        let (r, _w) = crate::fds::pipe().unwrap();
        let e = args.exec_fd(std::os::fd::AsFd::as_fd(&r));
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    }
}
