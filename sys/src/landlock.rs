//! Landlock's kernel calls that h5i makes itself: asking the kernel for its Landlock ABI
//! (`landlock_create_ruleset` with the VERSION flag), setting `no_new_privs` (the precondition
//! of enforcing a ruleset without `CAP_SYS_ADMIN`), and enforcing a ruleset already built
//! (`landlock_restrict_self`). Building and filling a ruleset is the `landlock` crate's (it
//! checks each access right against the ABI); these are the calls h5i's confinement makes
//! around it, in a forked child before `exec` among other places.
//!
//! rustix covers `no_new_privs` (`prctl`); it wraps no Landlock call, so the two Landlock
//! calls are libc's `syscall`, one `// SAFETY:` each.
//!
//! Async-signal-safe (one system call each, no allocation: an error is the kernel's errno as
//! an `io::Error`), so a `pre_exec` closure may call them.
//!
//! Must never: pass a flag the caller did not choose (every call here passes flags 0, the only
//! value the kernel accepts for `landlock_restrict_self`), or report an enforced ruleset the
//! kernel refused. Tests (below): a descriptor that is no ruleset is refused; a ruleset
//! enforced in a child refuses that child what it does not grant.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `LANDLOCK_CREATE_RULESET_VERSION` (linux/landlock.h).
const CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The kernel's Landlock ABI version (1 for Linux 5.13, higher for later kernels). An error
/// means no Landlock: `EOPNOTSUPP` when it is built but not enabled (`lsm=`), `ENOSYS` when the
/// kernel has none or a seccomp filter refuses the call.
pub fn abi_version() -> io::Result<u32> {
    // SAFETY: landlock_create_ruleset with a NULL attribute, size 0 and only the VERSION flag
    // makes no ruleset and reads or writes no memory of ours: it returns the ABI or -1/errno.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)` for the calling thread (and what it execs): no exec gains a
/// privilege from here on. The kernel refuses `landlock_restrict_self` (and an unprivileged
/// seccomp filter) without it.
pub fn set_no_new_privs() -> io::Result<()> {
    rustix::thread::set_no_new_privs(true).map_err(io::Error::from)
}

/// Enforce the Landlock ruleset `ruleset` (a descriptor `landlock_create_ruleset` returned) on
/// the calling thread, and on every process it execs or forks from here on. The kernel refuses
/// (and nothing is enforced) with `EBADFD` for a descriptor that is no ruleset, and `EPERM`
/// without `no_new_privs` or `CAP_SYS_ADMIN` ([`set_no_new_privs`] first).
pub fn restrict_self(ruleset: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: landlock_restrict_self takes a descriptor (borrowed: open for the call) and flags
    // 0, integers only; it reads and writes no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_restrict_self,
            ruleset.as_raw_fd(),
            0 as libc::c_uint,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// `landlock_create_ruleset` for a ruleset handling only `LANDLOCK_ACCESS_FS_READ_FILE`
    /// (the test's own raw call: the product builds rulesets with the `landlock` crate).
    fn read_file_ruleset() -> OwnedFd {
        #[repr(C)]
        struct Attr {
            handled_access_fs: u64,
        }
        const ACCESS_FS_READ_FILE: u64 = 1 << 2;
        let attr = Attr {
            handled_access_fs: ACCESS_FS_READ_FILE,
        };
        // SAFETY: `attr` is a live landlock_ruleset_attr of the size passed (its first field,
        // which every ABI accepts alone); the kernel returns a new descriptor or -1.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const Attr,
                std::mem::size_of::<Attr>(),
                0 as libc::c_uint,
            )
        };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: the kernel just made this descriptor; nothing else owns it.
        unsafe { OwnedFd::from_raw_fd(fd as i32) }
    }

    #[test]
    fn this_kernel_reports_an_abi() {
        let abi = abi_version().expect("this host has Landlock (HOST.md)");
        assert!(abi >= 1, "{abi}");
    }

    #[test]
    fn a_descriptor_that_is_no_ruleset_is_refused() {
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let err = restrict_self(file.as_fd()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADFD), "{err}");
    }

    /// In a forked child without `CAP_SYS_ADMIN` (root's child first becomes `nobody`) and
    /// without no_new_privs: the kernel refuses the ruleset.
    #[test]
    fn without_no_new_privs_an_unprivileged_child_is_refused() {
        let ruleset = read_file_ruleset();
        let raw = ruleset.as_raw_fd();
        let mut cmd = Command::new("/bin/true");
        // SAFETY: the closure makes only async-signal-safe calls (geteuid, setgroups, setgid,
        // setuid, landlock_restrict_self) in the forked child.
        unsafe {
            cmd.pre_exec(move || {
                if libc::geteuid() == 0
                    && (libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(65534) != 0
                        || libc::setuid(65534) != 0)
                {
                    return Err(io::Error::last_os_error());
                }
                restrict_self(BorrowedFd::borrow_raw(raw))
            });
        }
        let err = cmd.spawn().map(|mut c| c.wait()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    }

    /// In a forked child: no_new_privs, the ruleset (granting no file to read), then an open
    /// for reading that must be refused with EACCES. The child reports the open's errno as
    /// its `pre_exec` error; a child that could read execs `true` and the spawn succeeds.
    #[test]
    fn an_enforced_ruleset_refuses_the_child_what_it_does_not_grant() {
        let ruleset = read_file_ruleset();
        let mut cmd = Command::new("/bin/true");
        let raw = ruleset.as_raw_fd();
        // SAFETY: the closure makes only async-signal-safe calls (prctl, landlock_restrict_self,
        // open and close with a static path) in the forked child.
        unsafe {
            cmd.pre_exec(move || {
                set_no_new_privs()?;
                restrict_self(BorrowedFd::borrow_raw(raw))?;
                let fd = libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
        let err = cmd.spawn().map(|mut c| c.wait()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
        // The same child without the ruleset reads the file: the refusal was the ruleset's.
        let mut plain = Command::new("/bin/true");
        // SAFETY: as above, without the Landlock calls.
        unsafe {
            plain.pre_exec(|| {
                let fd = libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
        assert!(plain.status().unwrap().success());
    }
}
