//! Entering a namespace by descriptor (`setns(2)`), the one call every h5i crate that steps
//! into a box's or an engine's namespace makes: on rustix, so no caller writes it raw.
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
    fn a_descriptor_that_is_no_namespace_is_refused() {
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let err = enter(file.as_fd(), Namespace::Network).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    }
}
