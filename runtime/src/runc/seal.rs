//! Running from a sealed copy of ourselves before touching any container (CVE-2019-5736 class).
//!
//! A process inside a container can reach the runtime's binary through `/proc/<pid>/exe` while
//! the runtime joins the container (`exec`) and overwrite it on the host. So before any verb
//! that touches a container, h5i-runc copies `/proc/self/exe` into a
//! `memfd_create(MFD_CLOEXEC | MFD_ALLOW_SEALING)`, seals it (`F_SEAL_SEAL | F_SEAL_SHRINK |
//! F_SEAL_GROW | F_SEAL_WRITE`) and `fexecve`s it with the same argv and environment. The copy
//! knows it is sealed by asking the kernel for the seals of `/proc/self/exe`; an environment
//! marker only guards against an exec loop if that check ever failed after the re-exec.
//!
//! Cost: one copy of the binary (`copy_file_range`/`sendfile` in the kernel) and one exec;
//! measured in the issue report. Must never: run a container verb from an unsealed binary.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;

/// Set in the re-exec'd copy's environment; removed again once the seal is verified.
pub const MARKER_ENV: &str = "_H5I_RUNC_SEALED";

/// The seals the copy must carry.
pub const REQUIRED_SEALS: libc::c_int =
    libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// Why the sealed re-exec failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// A step of copying, sealing or exec'ing failed.
    #[error("refusing: cannot re-exec from a sealed copy of h5i-runc ({step}): {source}; to fix: the kernel needs memfd_create with sealing (Linux 3.17+) and /proc mounted")]
    Step {
        /// Which step.
        step: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The re-exec'd copy does not see its own seals.
    #[error("refusing: re-exec'd h5i-runc is not running from a sealed memfd (seals {0:#x}); refusing to touch containers")]
    NotSealed(libc::c_int),
}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> SealError {
    move |source| SealError::Step { step, source }
}

/// The seals on the file behind `/proc/self/exe` (0 for a file that cannot carry seals).
pub fn exe_seals() -> Result<libc::c_int, SealError> {
    let exe = File::open("/proc/self/exe").map_err(step("open /proc/self/exe"))?;
    Ok(seals_of(&exe))
}

fn seals_of(file: &File) -> libc::c_int {
    // SAFETY: F_GET_SEALS only reads the seal set of a valid open fd; it returns -1 (EINVAL)
    // for files that do not support sealing.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals.max(0)
}

/// Return if already running sealed; otherwise re-exec from a sealed copy (does not return on
/// success).
pub fn ensure_sealed() -> Result<(), SealError> {
    let seals = exe_seals()?;
    if seals & REQUIRED_SEALS == REQUIRED_SEALS {
        if std::env::var_os(MARKER_ENV).is_some() {
            // SAFETY (of the env mutation): called at the top of main, before any thread.
            std::env::remove_var(MARKER_ENV);
        }
        return Ok(());
    }
    if std::env::var_os(MARKER_ENV).is_some() {
        return Err(SealError::NotSealed(seals));
    }
    let memfd = sealed_copy()?;
    reexec(&memfd)
}

/// Copy `/proc/self/exe` into a new memfd and seal it.
pub fn sealed_copy() -> Result<File, SealError> {
    let name = c"h5i-runc";
    // SAFETY: `name` is a valid NUL-terminated string; memfd_create returns a new fd or -1.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(step("memfd_create")(io::Error::last_os_error()));
    }
    // SAFETY: fd was just returned by memfd_create and is owned by nothing else.
    let mut memfd = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut exe = File::open("/proc/self/exe").map_err(step("open /proc/self/exe"))?;
    let len = exe.metadata().map_err(step("stat /proc/self/exe"))?.len();
    let copied = io::copy(&mut exe, &mut memfd).map_err(step("copy binary"))?;
    if copied != len {
        return Err(step("copy binary")(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short copy",
        )));
    }
    // SAFETY: F_ADD_SEALS on a valid memfd created with MFD_ALLOW_SEALING; integer argument.
    let rc = unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, REQUIRED_SEALS) };
    if rc != 0 {
        return Err(step("F_ADD_SEALS")(io::Error::last_os_error()));
    }
    Ok(memfd)
}

fn cstrings(items: impl Iterator<Item = OsString>) -> Result<Vec<CString>, SealError> {
    items
        .map(|s| CString::new(s.into_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| step("argv/env contains NUL")(io::Error::new(io::ErrorKind::InvalidInput, e)))
}

fn reexec(memfd: &File) -> Result<(), SealError> {
    let argv = cstrings(std::env::args_os())?;
    let mut env: Vec<OsString> = std::env::vars_os()
        .filter(|(k, _)| k != MARKER_ENV)
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            kv
        })
        .collect();
    env.push(OsString::from(format!("{MARKER_ENV}=1")));
    let envp = cstrings(env.into_iter())?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|s| s.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|s| s.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // SAFETY: argv/envp are NULL-terminated arrays of pointers into CStrings that outlive the
    // call; memfd is a valid fd of a sealed ELF copy. fexecve only returns on failure.
    unsafe { libc::fexecve(memfd.as_raw_fd(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    Err(step("fexecve")(io::Error::last_os_error()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn sealed_copy_carries_all_seals_and_refuses_writes() {
        let mut copy = sealed_copy().unwrap();
        assert_eq!(seals_of(&copy) & REQUIRED_SEALS, REQUIRED_SEALS);
        let err = copy.write_all(b"overwrite").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        assert!(
            copy.set_len(1).is_err(),
            "shrinking a sealed copy must fail"
        );
    }

    #[test]
    fn a_plain_file_has_no_seals() {
        let f = File::open("/proc/self/exe").unwrap();
        assert_eq!(seals_of(&f), 0);
    }
}
