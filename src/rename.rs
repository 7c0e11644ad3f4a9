//! The renames the kernel offers beyond rename(2): one that never replaces what is at the
//! destination, and one that swaps two paths. Both are atomic, which is why callers use them to
//! claim a name or publish a directory.
//!
//! Must never: fall back to a check-then-rename where the kernel lacks `renameat2` without saying
//! so in the function's doc (the no-replace fallback is racy and documented as such).

use std::fs;
use std::io;
use std::path::Path;

use rustix::fs::{RenameFlags, CWD};

fn renameat2(from: &Path, to: &Path, flags: RenameFlags) -> io::Result<()> {
    // Relative to the working directory, like rename(2).
    Ok(rustix::fs::renameat_with(CWD, from, CWD, to, flags)?)
}

/// rename(2) that fails with `AlreadyExists` rather than replace anything at `to` (a directory
/// included, even an empty one). On a kernel without `renameat2` it checks, then renames.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    match renameat2(from, to, RenameFlags::NOREPLACE) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(io::Error::from(io::ErrorKind::AlreadyExists));
            }
            fs::rename(from, to)
        }
        other => other,
    }
}

/// Swap `a` and `b` atomically.
pub fn rename_exchange(a: &Path, b: &Path) -> io::Result<()> {
    renameat2(a, b, RenameFlags::EXCHANGE)
}
