//! Entering a namespace by descriptor (`setns(2)`), the one call every h5i crate that steps
//! into a box's or an engine's namespace makes: on rustix, so no caller writes it raw; asking
//! which kind of namespace a descriptor names (`NS_GET_NSTYPE`, which rustix does not wrap);
//! and moving the calling thread to a network namespace of its own (`unshare(CLONE_NEWNET)`).
//!
//! Must never: unshare anything but the network namespace (unsharing the descriptor table or
//! the filesystem attributes under std's feet is what makes rustix call `unshare` unsafe).
//!
//! Async-signal-safe (one system call, no allocation: the error is the kernel's errno as an
//! `io::Error`), so a `pre_exec` closure or a forked child may call it. It does not set the
//! thread's `errno`: a caller that reports errno after a failure takes it from the error.

use std::io;
use std::os::fd::BorrowedFd;

pub use rustix::thread::LinkNameSpaceType as Namespace;

/// Move the calling thread into the namespace `ns` refers to, which must be of type `kind`
/// (the kernel refuses EINVAL otherwise, so a descriptor swapped for another kind of namespace
/// is never entered). Entering a user namespace needs a single-threaded process.
pub fn enter(ns: BorrowedFd<'_>, kind: Namespace) -> io::Result<()> {
    rustix::thread::move_into_link_name_space(ns, Some(kind)).map_err(io::Error::from)
}

/// The kind of namespace `ns` refers to, as its `CLONE_NEW*` value (`NS_GET_NSTYPE`); a
/// descriptor that is no namespace answers `ENOTTY`.
pub fn kind_of(ns: BorrowedFd<'_>) -> io::Result<i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the descriptor's namespace type.
    let t = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if t < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(t)
}

/// Move the calling thread (only it) to a new network namespace, which holds nothing but a
/// `lo` that is down. Needs `CAP_SYS_ADMIN` (in the caller's user namespace).
pub fn unshare_net() -> io::Result<()> {
    // SAFETY: CLONE_NEWNET alone changes only the thread's network namespace: no descriptor
    // table or filesystem attribute std relies on is unshared.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_namespace_of_another_kind_is_refused() {
        let net = std::fs::File::open("/proc/self/ns/net").unwrap();
        let err = enter(net.as_fd(), Namespace::Mount).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    }

    #[test]
    fn a_namespace_descriptor_names_its_kind_and_a_file_names_none() {
        let net = std::fs::File::open("/proc/self/ns/net").unwrap();
        assert_eq!(kind_of(net.as_fd()).unwrap(), libc::CLONE_NEWNET);
        let user = std::fs::File::open("/proc/self/ns/user").unwrap();
        assert_eq!(kind_of(user.as_fd()).unwrap(), libc::CLONE_NEWUSER);
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(
            kind_of(file.as_fd()).unwrap_err().raw_os_error(),
            Some(libc::ENOTTY)
        );
    }

    /// On a thread of its own (the namespace stays with it): a fresh network namespace, or the
    /// kernel's EPERM for a caller without CAP_SYS_ADMIN.
    #[test]
    fn a_thread_that_unshares_its_network_namespace_has_a_new_one() {
        let before = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        let after = std::thread::spawn(|| {
            unshare_net().map(|()| std::fs::read_link("/proc/thread-self/ns/net").unwrap())
        })
        .join()
        .unwrap();
        match after {
            Ok(after) => assert_ne!(after, before),
            Err(e) => {
                assert_ne!(crate::ids::euid(), 0);
                assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
            }
        }
        assert_eq!(
            std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
            before
        );
    }

    #[test]
    fn a_descriptor_that_is_no_namespace_is_refused() {
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let err = enter(file.as_fd(), Namespace::Network).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    }
}
