//! Signals taken as data: a set blocked on the calling thread and read from a `signalfd`, so a
//! supervisor's poll loop sees them among its other descriptors; or every signal blocked on a
//! thread that does nothing but wait for the next one ([`block_all`], [`wait_any`]). A child
//! inherits the blocked set across fork and exec: [`unblock`] undoes it in the child.
//!
//! On libc: rustix wraps neither `signalfd` nor the thread signal mask outside its runtime
//! feature. Must never: leave a set blocked after its [`SignalFd`] is gone (the thread's old
//! mask comes back on drop), or accept a number that is not a standard signal (1..=31).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The most signals one set takes (every standard signal).
const STANDARD: std::ops::RangeInclusive<i32> = 1..=31;

fn set_of(signals: &[i32]) -> io::Result<libc::sigset_t> {
    if signals.iter().any(|s| !STANDARD.contains(s)) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before any use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t of this frame.
    unsafe { libc::sigemptyset(&mut set) };
    for &s in signals {
        // SAFETY: `set` is initialised and `s` a standard signal (checked above).
        unsafe { libc::sigaddset(&mut set, s) };
    }
    Ok(set)
}

/// `signals` blocked on the calling thread and readable, one at a time, from a close-on-exec,
/// non-blocking `signalfd`. Dropping it restores the thread's mask as it was.
pub struct SignalFd {
    old: libc::sigset_t,
    fd: OwnedFd,
}

impl SignalFd {
    /// Block `signals` (standard ones, else `EINVAL`) on this thread and open the descriptor
    /// that reports them.
    pub fn block(signals: &[i32]) -> io::Result<SignalFd> {
        let set = set_of(signals)?;
        // SAFETY: sigset_t is plain data; pthread_sigmask writes the old mask into it.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid sigset_t values of this frame; only this thread's
        // mask changes.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // SAFETY: `set` is initialised; -1 asks for a new descriptor.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: restores the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
            return Err(e);
        }
        // SAFETY: `fd` was just returned by signalfd and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(SignalFd { old, fd })
    }

    /// The next pending signal of the set, if one is (never blocks).
    pub fn read(&self) -> Option<i32> {
        // SAFETY: signalfd_siginfo is plain data.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is a writable buffer of exactly `size` bytes for the call.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        (n >= 0 && n as usize == size).then_some(info.ssi_signo as i32)
    }
}

/// The descriptor to poll: readable while a signal of the set is pending.
impl AsFd for SignalFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for SignalFd {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `block`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// Unblock `signals` in this (forked, not yet exec'd) process. Async-signal-safe: stack data
/// and `sigprocmask` only.
pub fn unblock(signals: &[i32]) -> io::Result<()> {
    let set = set_of(signals)?;
    // SAFETY: `set` is initialised; the old mask is not asked for.
    if unsafe { libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn full_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigfillset initialises it before any use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t of this frame.
    unsafe { libc::sigfillset(&mut set) };
    set
}

/// Block every signal on the calling thread, for good: they queue for [`wait_any`] instead of
/// acting (a foreground runtime forwards each to its payload). A child spawned afterwards
/// through std starts with an empty mask all the same.
pub fn block_all() -> io::Result<()> {
    let set = full_set();
    // SAFETY: `set` is initialised; the old mask is not asked for; only this thread's mask
    // changes.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Sleep until a signal blocked on this thread ([`block_all`]) is pending, and take it.
pub fn wait_any() -> io::Result<i32> {
    let set = full_set();
    loop {
        // SAFETY: `set` is initialised; a null siginfo pointer asks for the number only.
        let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        if sig > 0 {
            return Ok(sig);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocked SIGUSR1 sent to this very thread waits in the descriptor; once dropped the mask
    /// is as before (a child's pending set shows it unblocked again: SigBlk of this thread).
    #[test]
    fn a_blocked_signal_is_read_from_the_descriptor_and_the_mask_comes_back() {
        let blk = || {
            std::fs::read_to_string("/proc/thread-self/status")
                .unwrap()
                .lines()
                .find(|l| l.starts_with("SigBlk:"))
                .unwrap()
                .to_string()
        };
        let before = blk();
        let fd = SignalFd::block(&[libc::SIGUSR1]).unwrap();
        assert_ne!(blk(), before);
        assert_eq!(fd.read(), None);
        // SAFETY: pthread_self/pthread_kill signal this thread, which blocks SIGUSR1 now.
        unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR1) };
        assert!(
            !crate::poll::readable(&[fd.as_fd()], Some(std::time::Duration::from_secs(5)))
                .unwrap()
                .is_empty()
        );
        assert_eq!(fd.read(), Some(libc::SIGUSR1));
        drop(fd);
        assert_eq!(blk(), before);
        assert_eq!(
            SignalFd::block(&[0]).err().and_then(|e| e.raw_os_error()),
            Some(libc::EINVAL)
        );
    }

    /// On a thread of its own (the mask stays there): everything blocked, a signal sent to the
    /// thread is taken by `wait_any` instead of acting.
    #[test]
    fn a_thread_that_blocks_everything_takes_its_signals_as_data() {
        let got = std::thread::spawn(|| {
            block_all().unwrap();
            // SAFETY: signals this very thread, which blocks SIGUSR1 now.
            unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR1) };
            wait_any().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(got, libc::SIGUSR1);
    }

    /// A child that blocked SIGUSR2 keeps it blocked across exec unless it unblocks it.
    #[test]
    fn a_child_unblocks_what_is_blocked_in_it() {
        use std::os::unix::process::CommandExt;
        let bit = 1u64 << (libc::SIGUSR2 - 1);
        let blocked_in = |unblock_after: bool| {
            // grep itself (a shell may clear its mask when it starts).
            let mut cmd = std::process::Command::new("grep");
            cmd.args(["SigBlk:", "/proc/self/status"]);
            // SAFETY: the closure makes only sigprocmask calls on stack data.
            unsafe {
                cmd.pre_exec(move || {
                    let set = set_of(&[libc::SIGUSR2])?;
                    libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                    if unblock_after {
                        unblock(&[libc::SIGUSR2])?;
                    }
                    Ok(())
                })
            };
            let out = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
            let hex = out.trim().trim_start_matches("SigBlk:").trim();
            u64::from_str_radix(hex, 16).unwrap() & bit != 0
        };
        assert!(blocked_in(false));
        assert!(!blocked_in(true));
    }
}
