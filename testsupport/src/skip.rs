//! Loud skips. A row that cannot run on this host prints `skipped: <test>: <why>` — but libtest
//! shows a passing test's stderr to no one, so every skip is also appended to the file named by
//! `H5I_TEST_SKIPS` (one line each, `O_APPEND`: the rows of one binary run on several threads).
//! `make test` sets it, prints the list when the run ends, and refuses a skip the host should
//! not need (tests/skips-allowed.txt), so a test for a capability this machine has runs or fails.

use std::io::Write;

/// Print `skipped: <what>` and append it to `$H5I_TEST_SKIPS` when that is set.
pub fn record(what: &str) {
    let line = format!("skipped: {}\n", what.replace('\n', " "));
    eprint!("{line}");
    let Some(path) = std::env::var_os("H5I_TEST_SKIPS") else {
        return;
    };
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!(
            "refusing to skip quietly: could not append to H5I_TEST_SKIPS ({}): {e}",
            std::path::Path::new(&path).display()
        );
    }
}

/// `skipped!("{test}: needs root ({why})")`: [`record`] with `format!` arguments.
#[macro_export]
macro_rules! skipped {
    ($($arg:tt)*) => {
        $crate::skip::record(&format!($($arg)*))
    };
}
