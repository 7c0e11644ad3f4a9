//! Ctrl-C (and SIGTERM, SIGHUP) for h5i's two servers, `h5i ui` and `h5i box view`: the signal
//! becomes a value the server's runtime can wait for, so each can end what it started (a
//! viewer's sessions get their `closed` record, a handoff file is removed) before the process
//! exits.
//!
//! Owns the process's mask of those three signals (blocked in the calling thread, and so in
//! every thread made after; a child h5i spawns starts with an empty mask, as the standard
//! library resets it) and the one thread that waits for them (`h5i_sys::signals`).
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
    h5i_sys::signals::block_for_life(&SIGNALS)?;
    let (tx, rx) = watch::channel(false);
    std::thread::Builder::new()
        .name("h5i-stop".into())
        .spawn(move || {
            let mut first = true;
            loop {
                let Ok(got) = h5i_sys::signals::wait_for(&SIGNALS) else {
                    return;
                };
                if !first {
                    std::process::exit(128 + got);
                }
                first = false;
                let _ = tx.send(true);
            }
        })?;
    Ok(rx)
}
