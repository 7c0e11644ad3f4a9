//! The calling process's own user and group ids (real and effective), the one place h5i's
//! crates ask the kernel who they run as: a root caller and an unprivileged one take different
//! paths at every tier.
//!
//! Also dropping a forked child to another identity before it execs ([`drop_to`]).
//!
//! On rustix, without unsafe, but [`drop_to`], which calls libc's `setgroups`/`setgid`/
//! `setuid` (rustix's set only the calling thread's ids, libc's every thread's: the same in a
//! forked child, and the libc calls are what such a child has always made). Must never: cache
//! an answer (a process that drops privilege asks again and sees the new ids), or leave a
//! supplementary group or the old gid behind when it drops the uid.

/// The effective uid (what the kernel checks permissions against).
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The real uid (the user who started the process).
pub fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// The effective gid.
pub fn egid() -> u32 {
    rustix::process::getegid().as_raw()
}

/// The real gid.
pub fn gid() -> u32 {
    rustix::process::getgid().as_raw()
}

/// Give up every supplementary group, then take `gid`, then `uid` (in that order: once the uid
/// is dropped the rest would be refused). Meant for a forked child before exec (a `pre_exec`
/// closure): async-signal-safe, no allocation. Needs the privilege to change ids (`EPERM`
/// otherwise).
pub fn drop_to(uid: u32, gid: u32) -> std::io::Result<()> {
    // SAFETY: setgroups with a count of 0 reads no memory; setgid and setuid take integers.
    let failed = unsafe {
        libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(gid) != 0
            || libc::setuid(uid) != 0
    };
    if failed {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child dropped to nobody (65534) runs as it with no supplementary group; as an
    /// unprivileged caller the drop is the kernel's EPERM.
    #[test]
    fn a_child_dropped_to_other_ids_runs_as_them_or_is_refused_without_privilege() {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("id");
        // SAFETY: the closure makes only setgroups/setgid/setuid calls (async-signal-safe).
        unsafe { cmd.pre_exec(|| drop_to(65534, 65534)) };
        match cmd.output() {
            Ok(out) => {
                assert_eq!(euid(), 0);
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                assert!(
                    text.starts_with("uid=65534") && text.contains("gid=65534"),
                    "{text}"
                );
                assert!(!text.contains("groups=0"), "{text}");
            }
            Err(e) => {
                assert_ne!(euid(), 0);
                assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
            }
        }
    }

    #[test]
    fn the_ids_are_the_ones_proc_reports() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let field = |name: &str| -> Vec<u32> {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            line[name.len()..]
                .split_whitespace()
                .map(|n| n.parse().unwrap())
                .collect()
        };
        let (uids, gids) = (field("Uid:"), field("Gid:"));
        assert_eq!((uid(), euid()), (uids[0], uids[1]));
        assert_eq!((gid(), egid()), (gids[0], gids[1]));
    }
}
