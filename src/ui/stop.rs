//! Ctrl-C (and SIGTERM, SIGHUP) for h5i's two servers, `h5i ui` and `h5i box view`: the signal
//! becomes a value the server's runtime can wait for, so each can end what it started (a
//! viewer's sessions get their `closed` record, a handoff file is removed) before the process
//! exits.
//!
//! Owns the process's mask of those three signals (blocked in the calling thread, and so in
//! every thread made after; a child h5i spawns starts with an empty mask, as the standard
//! library resets it) and the one thread that waits for them with `sigwait`.
//!
//! Must never: be called after a thread that should not see the signals was made (it would
//! keep the default action, and the process would die without cleaning up), or swallow a second
//! signal: a second Ctrl-C ends the process at once (exit status 128 + the signal).

use std::io;

use tokio::sync::watch;

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Block the signals and wait for them on a thread of their own: the receiver turns `true` when
/// the first arrives.
pub fn on_stop() -> io::Result<watch::Receiver<bool>> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
    }
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    let (tx, rx) = watch::channel(false);
    std::thread::Builder::new()
        .name("h5i-stop".into())
        .spawn(move || {
            let mut first = true;
            loop {
                let mut got: libc::c_int = 0;
                // SAFETY: `set` is initialised and `got` is a valid place for the signal number.
                if unsafe { libc::sigwait(&set, &mut got) } != 0 {
                    return;
                }
                if !first {
                    std::process::exit(128 + got);
                }
                first = false;
                let _ = tx.send(true);
            }
        })?;
    Ok(rx)
}
