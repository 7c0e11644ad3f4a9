//! Mounts of the calling process's own mount namespace: leaving the one it shares for a
//! private copy (so nothing it mounts reaches the host), mounting, and detaching.
//!
//! [`private_namespace`] and [`detach`] are async-signal-safe (system calls on C strings the
//! caller made, no allocation), so a `pre_exec` closure or a forked child may call them.
//! Must never: mount into a namespace the caller has not made private first (the callers'
//! order; [`private_namespace`] does both steps at once), or follow a caller's path through a
//! NUL (a path with one is refused).

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Leave the mount namespace this process shares for a copy of its own (`unshare(CLONE_NEWNS)`)
/// and make every mount in the copy private (`MS_REC | MS_PRIVATE` on `/`), so no mount made
/// from here on propagates back. The process must not share its filesystem context with
/// another thread (the kernel refuses `EINVAL`).
pub fn private_namespace() -> io::Result<()> {
    // SAFETY: unsharing the mount namespace gives this process a copy of its mounts; it does
    // not touch the descriptor table (the invariant `unshare_unsafe` asks of FILES).
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }?;
    rustix::mount::mount_change(
        c"/",
        rustix::mount::MountPropagationFlags::PRIVATE | rustix::mount::MountPropagationFlags::REC,
    )?;
    Ok(())
}

/// `mount(2)` with its raw flags (`libc::MS_*`): `source` and `fstype` and `data` as the kernel
/// takes them, `None` for a null pointer.
pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let nul = |_| io::Error::from_raw_os_error(libc::EINVAL);
    let source = source
        .map(|p| CString::new(p.as_os_str().as_bytes()).map_err(nul))
        .transpose()?;
    let target = CString::new(target.as_os_str().as_bytes()).map_err(nul)?;
    let fstype = fstype.map(|s| CString::new(s).map_err(nul)).transpose()?;
    let data = data.map(|s| CString::new(s).map_err(nul)).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call; the
    // kernel only reads them.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Detach the mount at `target` lazily (`MNT_DETACH`: never blocks on a busy mount).
pub fn detach(target: &CStr) -> io::Result<()> {
    Ok(rustix::mount::unmount(
        target,
        rustix::mount::UnmountFlags::DETACH,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// A forked child (single-threaded, as `unshare(CLONE_NEWNS)` needs) goes private, mounts a
    /// tmpfs, detaches it and mounts it again; the shell it becomes sees that one mount once, and
    /// this process never sees it. Unprivileged, the kernel refuses the unshare with EPERM.
    #[test]
    fn a_private_namespace_keeps_its_mounts_from_the_host() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", r#"test "$(grep -c " $0 " /proc/self/mountinfo)" = 1"#])
            .arg(&dir);
        let tmpfs = Path::new("tmpfs");
        // SAFETY: the child makes system calls and allocates small strings (glibc's fork leaves
        // the allocator usable in the child); it touches no lock another thread could hold.
        unsafe {
            cmd.pre_exec(move || {
                private_namespace()?;
                mount(Some(tmpfs), &dir, Some("tmpfs"), 0, Some("size=64k"))?;
                detach(&target)?;
                mount(Some(tmpfs), &dir, Some("tmpfs"), 0, None)
            })
        };
        match cmd.status() {
            Ok(status) => assert!(status.success() && crate::ids::euid() == 0),
            Err(e) => {
                assert_ne!(crate::ids::euid(), 0, "{e}");
                assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(&d.path().display().to_string()),
            "{mounts}"
        );
    }

    #[test]
    fn a_path_with_a_nul_is_refused() {
        let err = mount(None, Path::new("/a\0b"), None, 0, None).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }
}
