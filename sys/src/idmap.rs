//! Idmapped mounts: a user namespace made only to carry an id map ([`userns_with_maps`]), and
//! a detached clone of a tree with mount attributes set through it ([`clone_tree`]), attached
//! with [`attach`].
//!
//! Owns the calls only: which map a mount gets and where it is attached are the callers'
//! (`h5i-runc`'s staging of a root caller's overlay layers, h5i's container-tier attachments).
//! Must never: keep the helper child alive past [`userns_with_maps`], or allocate in
//! [`clone_tree`] and [`attach`] (both are called between `fork` and `_exit`).

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `MOUNT_ATTR_RDONLY`.
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// `MOUNT_ATTR_NOSUID`.
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// `MOUNT_ATTR_NODEV`.
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
/// `MOUNT_ATTR_IDMAP` (the map is the user namespace passed).
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// A user namespace whose `uid_map` and `gid_map` are `uid_map` and `gid_map` (the kernel's
/// text, one `inside outside count` line each), for an idmapped mount's map. Made by a forked
/// child that unshares a user namespace and waits; the caller (who must be allowed to write
/// those maps: root for any range) writes both and keeps a descriptor to the namespace; the
/// child is then released and reaped.
pub fn userns_with_maps(uid_map: &str, gid_map: &str) -> io::Result<OwnedFd> {
    let (ready_r, ready_w) = crate::fds::pipe()?;
    let (go_r, go_w) = crate::fds::pipe()?;
    // SAFETY: fork; the child only makes raw syscalls (no allocation, no locks) and _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let mut byte = [0u8; 1];
        // SAFETY: close, unshare, write, read and _exit on descriptors this child holds; all
        // async-signal-safe. The child's own copy of the write end is closed first, so the read
        // returns when the parent closes its end.
        unsafe {
            libc::close(go_w.as_raw_fd());
            libc::close(ready_r.as_raw_fd());
            byte[0] = u8::from(libc::unshare(libc::CLONE_NEWUSER) != 0);
            libc::write(ready_w.as_raw_fd(), byte.as_ptr().cast(), 1);
            libc::read(go_r.as_raw_fd(), byte.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        }
    }
    drop((ready_w, go_r));
    let made = (|| -> io::Result<OwnedFd> {
        let mut byte = [1u8; 1];
        File::from(ready_r).read_exact(&mut byte)?;
        if byte[0] != 0 {
            return Err(io::Error::other(
                "the helper could not unshare a user namespace",
            ));
        }
        std::fs::write(format!("/proc/{pid}/uid_map"), uid_map)?;
        std::fs::write(format!("/proc/{pid}/gid_map"), gid_map)?;
        Ok(File::open(format!("/proc/{pid}/ns/user"))?.into())
    })();
    drop(go_w);
    let mut status = 0;
    // SAFETY: waitpid on our own child, which exits once `go_w` is closed.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    made
}

/// Which step of [`clone_tree`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneStep {
    /// `open_tree(OPEN_TREE_CLONE)`.
    OpenTree,
    /// `mount_setattr`.
    SetAttr,
}

/// A detached clone of the mount at `source` (not recursive, its final symlink not followed)
/// with `attr_set` set, mapped through `userns` when `attr_set` holds [`MOUNT_ATTR_IDMAP`].
/// Makes raw syscalls only (callable in a forked child).
pub fn clone_tree(
    source: &CStr,
    attr_set: u64,
    userns: libc::c_int,
) -> Result<OwnedFd, (CloneStep, io::Error)> {
    // SAFETY: open_tree with a NUL-terminated path; returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source.as_ptr(),
            OPEN_TREE_CLONE
                | libc::O_CLOEXEC as libc::c_uint
                | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
        )
    } as libc::c_int;
    if fd < 0 {
        return Err((CloneStep::OpenTree, io::Error::last_os_error()));
    }
    // SAFETY: open_tree returned this fd, owned from here.
    let tree = unsafe { OwnedFd::from_raw_fd(fd) };
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns as u64,
    };
    // SAFETY: mount_setattr on the detached tree with an empty path and a mount_attr of the
    // size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err((CloneStep::SetAttr, io::Error::last_os_error()));
    }
    Ok(tree)
}

/// Attach the detached `tree` at `target` (in the caller's mount namespace). Makes raw
/// syscalls only (callable in a forked child).
pub fn attach(tree: libc::c_int, target: &CStr) -> io::Result<()> {
    // SAFETY: move_mount of a detached tree onto a NUL-terminated target path.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_source_fails_at_open_tree() {
        let err = clone_tree(c"/nonexistent/h5i-idmap-test", MOUNT_ATTR_RDONLY, -1)
            .err()
            .map(|(step, e)| (step, e.raw_os_error()));
        assert_eq!(err, Some((CloneStep::OpenTree, Some(libc::ENOENT))));
    }
}
