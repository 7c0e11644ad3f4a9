//! Standard output for every verb: a reader that goes away (`h5i box log b | head`) ends the
//! output quietly instead of panicking mid-verb, and any other write failure (a full disk under
//! `> file`) is said once, after the verb has finished and cleaned up, with exit 1 — never a
//! silently short output with exit 0.
//!
//! Must never: print a byte that did not already pass through the escaper (callers escape), or
//! end the process itself (a verb may hold a freeze or a lock that its own drop releases).

use std::io::{self, Write};
use std::sync::OnceLock;

/// The first write failure, when there was one.
static FAILED: OnceLock<io::Error> = OnceLock::new();

/// Write `text` and a newline to stdout; after a failure, writes nothing more.
pub fn line(text: &str) {
    if FAILED.get().is_some() {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(e) = writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        let _ = FAILED.set(e);
    }
}

/// Write `data` as it is to stdout (a generated script or page, no newline added); after a
/// failure, writes nothing more.
pub fn bytes(data: &[u8]) {
    if FAILED.get().is_some() {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(e) = stdout.write_all(data).and_then(|()| stdout.flush()) {
        let _ = FAILED.set(e);
    }
}

/// The exit code once the verb is done: its own, unless a write failed for a reason other than
/// the reader leaving (then 1, and the failure is said on stderr).
pub fn finish(code: i32) -> i32 {
    match FAILED.get() {
        Some(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            eprintln!("h5i: refusing: the output was cut short: cannot write to standard output: {e}; to fix: free the space or point the output somewhere writable, and run the command again");
            1
        }
        _ => code,
    }
}
