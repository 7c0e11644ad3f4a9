//! Signals taken as data: a set blocked on the calling thread and read from a `signalfd`, so a
//! supervisor's poll loop sees them among its other descriptors; a set blocked for good before
//! any thread exists and waited for on a thread of its own ([`block_for_life`],
//! [`wait_for`]); or every signal blocked on a thread that does nothing but wait for the next
//! one ([`block_all`], [`wait_any`]). A child
//! inherits the blocked set and ignored dispositions across fork and exec: [`unblock`] and
//! [`unblock_all`] undo the mask in the child, [`reset_to_default`] a disposition.
//!
//! On libc: rustix wraps neither `signalfd` nor the thread signal mask outside its runtime
//! feature. Must never: leave a set blocked after its [`SignalFd`] is gone (what it blocked is
//! unblocked on drop; a signal the thread had blocked before stays blocked), or accept a
//! number that is not a standard signal (1..=31).

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
/// non-blocking `signalfd`. Dropping it unblocks the signals of the set that were not blocked
/// before.
pub struct SignalFd {
    /// The signals of the set this thread did not block before: the ones unblocked on drop.
    newly_blocked: libc::sigset_t,
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
        let mut newly_blocked = set_of(&[])?;
        for &s in signals {
            // SAFETY: `old` was filled by pthread_sigmask and `s` is a standard signal.
            if unsafe { libc::sigismember(&old, s) } != 1 {
                // SAFETY: `newly_blocked` is initialised and `s` a standard signal.
                unsafe { libc::sigaddset(&mut newly_blocked, s) };
            }
        }
        if fd < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: unblocks what the call above blocked, nothing else.
            unsafe {
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &newly_blocked, std::ptr::null_mut())
            };
            return Err(e);
        }
        // SAFETY: `fd` was just returned by signalfd and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(SignalFd { newly_blocked, fd })
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

impl std::fmt::Debug for SignalFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalFd")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
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
        // Only what `block` blocked is unblocked: a set another SignalFd on this thread blocked
        // meanwhile stays blocked, whichever is dropped first.
        // SAFETY: `newly_blocked` is an initialised sigset_t; only this thread's mask changes.
        unsafe {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.newly_blocked, std::ptr::null_mut())
        };
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

/// Unblock every signal in this (forked, not yet exec'd) process: the mask a program starts
/// with. Async-signal-safe: stack data and `sigprocmask` only.
pub fn unblock_all() -> io::Result<()> {
    let set = set_of(&[])?;
    // SAFETY: `set` is an initialised, empty sigset_t; the old mask is not asked for.
    if unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Put `signal` (a standard one, else `EINVAL`) back to its default action (`SIG_DFL`), as a
/// program expects to find it: an ignored `SIGPIPE` (Rust's runtime ignores it) is inherited
/// across exec. Async-signal-safe.
pub fn reset_to_default(signal: i32) -> io::Result<()> {
    if !STANDARD.contains(&signal) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: setting a standard signal's disposition to the default; no handler involved.
    if unsafe { libc::signal(signal, libc::SIG_DFL) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Block `signals` (standard ones, else `EINVAL`) on the calling thread for good: called
/// before any thread is spawned, every thread inherits the mask, so the signals queue for a
/// [`SignalFd`] or [`wait_for`] instead of acting on whichever thread the kernel picks.
pub fn block_for_life(signals: &[i32]) -> io::Result<()> {
    let set = set_of(signals)?;
    // SAFETY: `set` is initialised; the old mask is not asked for; only this thread's mask
    // changes.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Sleep until one of `signals` (blocked on this thread, [`block_for_life`]) is pending, and
/// take it (a wait a handled signal interrupts is resumed).
pub fn wait_for(signals: &[i32]) -> io::Result<i32> {
    let set = set_of(signals)?;
    wait_in(&set)
}

fn wait_in(set: &libc::sigset_t) -> io::Result<i32> {
    loop {
        // SAFETY: `set` is initialised; a null siginfo pointer asks for the number only.
        let sig = unsafe { libc::sigwaitinfo(set, std::ptr::null_mut()) };
        if sig > 0 {
            return Ok(sig);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Handle `signal` (a standard one, else `EINVAL`) with `handler` from now on (`signal(2)`,
/// whose glibc form restarts an interrupted system call). The handler runs in signal context:
/// it must make only async-signal-safe calls (storing to an atomic, say).
pub fn handle_with(signal: i32, handler: extern "C" fn(libc::c_int)) -> io::Result<()> {
    if !STANDARD.contains(&signal) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: installs a handler the caller vouches is async-signal-safe (this function's
    // contract) for a standard signal.
    if unsafe { libc::signal(signal, handler as *const () as libc::sighandler_t) } == libc::SIG_ERR
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// End this process by `signal` as if it had never been handled: its action back to the
/// default, then raised. Returns only if the default action does not end the process (a
/// signal that is ignored or stops by default), or when `signal` is not standard (`EINVAL`).
pub fn reraise_with_default(signal: i32) -> io::Result<()> {
    reset_to_default(signal)?;
    // SAFETY: raise sends a standard signal to the calling thread; no memory is involved.
    if unsafe { libc::raise(signal) } != 0 {
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
    wait_in(&full_set())
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

    /// On a thread of its own: two signals blocked for good, the one sent is the one taken, and
    /// a third signal is no part of the wait (refused as a set member when not standard).
    #[test]
    fn a_signal_blocked_for_life_is_taken_by_a_wait_for_its_set() {
        let got = std::thread::spawn(|| {
            block_for_life(&[libc::SIGUSR1, libc::SIGUSR2]).unwrap();
            // SAFETY: signals this very thread, which blocks SIGUSR2 now.
            unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2) };
            wait_for(&[libc::SIGUSR1, libc::SIGUSR2]).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(got, libc::SIGUSR2);
        assert_eq!(
            wait_for(&[40]).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }

    /// A child whose mask is emptied and whose SIGPIPE is back to its default: `grep` reads
    /// both from its own status (SigBlk all clear, SigIgn without SIGPIPE).
    #[test]
    fn a_child_unblocks_everything_and_takes_sigpipe_back_to_default() {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("grep");
        cmd.args(["-E", "^Sig(Blk|Ign):", "/proc/self/status"]);
        // SAFETY: the closure makes only sigprocmask and signal calls on stack data.
        unsafe {
            cmd.pre_exec(|| {
                let set = set_of(&[libc::SIGUSR2, libc::SIGTERM])?;
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
                unblock_all()?;
                reset_to_default(libc::SIGPIPE)
            })
        };
        let out = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
        let field = |name: &str| {
            let line = out.lines().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(line[name.len()..].trim(), 16).unwrap()
        };
        assert_eq!(field("SigBlk:"), 0, "{out}");
        assert_eq!(field("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
        assert_eq!(
            reset_to_default(0).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }

    static NOTED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

    extern "C" fn note(sig: libc::c_int) {
        NOTED.store(sig, std::sync::atomic::Ordering::SeqCst);
    }

    /// A child (this test binary, re-entered) notes SIGUSR1 with its handler instead of dying,
    /// then re-raises SIGTERM with the default action and is ended by it.
    #[test]
    fn a_handled_signal_is_noted_and_a_reraised_one_ends_the_process() {
        use std::os::unix::process::ExitStatusExt;
        if std::env::var_os("H5I_SYS_SIGNAL_CHILD").is_some() {
            handle_with(libc::SIGUSR1, note).unwrap();
            handle_with(libc::SIGTERM, note).unwrap();
            // SAFETY: raise sends SIGUSR1, handled above, to this thread.
            unsafe { libc::raise(libc::SIGUSR1) };
            assert_eq!(
                NOTED.load(std::sync::atomic::Ordering::SeqCst),
                libc::SIGUSR1
            );
            reraise_with_default(libc::SIGTERM).unwrap();
            unreachable!("the default action of SIGTERM ends the process");
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "signals::tests::a_handled_signal_is_noted_and_a_reraised_one_ends_the_process",
                "--test-threads=1",
            ])
            .env("H5I_SYS_SIGNAL_CHILD", "1")
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGTERM),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(
            handle_with(0, note).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
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
