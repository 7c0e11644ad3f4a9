//! The renames the kernel offers beyond rename(2): one that never replaces what is at the
//! destination, and one that swaps two paths. Both are atomic, which is why callers use them to
//! claim a name or publish a directory.
//!
//! Must never: fall back to a check-then-rename where the kernel lacks `renameat2` without saying
//! so in the function's doc (the no-replace fallback is racy and documented as such).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let (f, t) = (cpath(from)?, cpath(to)?);
    // SAFETY: both are valid NUL-terminated strings that outlive the call; AT_FDCWD resolves
    // them like rename(2) would; no memory is shared with the kernel beyond the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// rename(2) that fails with `AlreadyExists` rather than replace anything at `to` (a directory
/// included, even an empty one). On a kernel without `renameat2` it checks, then renames.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    match renameat2(from, to, libc::RENAME_NOREPLACE) {
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
    renameat2(a, b, libc::RENAME_EXCHANGE)
}
