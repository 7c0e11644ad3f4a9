//! The calling process's own user and group ids (real and effective), the one place h5i's
//! crates ask the kernel who they run as: a root caller and an unprivileged one take different
//! paths at every tier.
//!
//! On rustix, without unsafe. Must never: cache an answer (a process that drops privilege asks
//! again and sees the new ids).

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

#[cfg(test)]
mod tests {
    use super::*;

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
