//! The default-deny base of the `h5i-v2` seccomp profile: reviewed data, in one place.
//!
//! Owns *which syscalls a box may make at all*. `seccomp.rs` compiles it, per architecture,
//! into the first filter a box gets; `denylist.rs` (h5i-v1) stays the second layer and narrows
//! what this allows by argument (clone's namespace flags, set-id modes, socket families,
//! TIOCSTI). Firecracker's way: everything not named here is refused; unlike Firecracker's
//! per-thread lists it has to serve any developer workload (git, cargo, node, python,
//! Chromium, the agents), so it names what such programs call and leaves out what only
//! administration, other processes' insides, or dead interfaces need. Every group says why it
//! is in; every left-out call says why it is out; a registry test makes every syscall the
//! table (`syscalls.rs`) knows fall in exactly one of: allowed here, refused outright by the
//! deny list, or left out here.
//!
//! A call outside the list answers `ENOSYS`, never kill: that is what a kernel without the call
//! answers, so libc and runtimes take the fallback they already carry (glibc's `clone3` ->
//! `clone`, `openat2` -> `openat`, `statx` -> `fstatat`; libuv's `io_uring` -> thread pool),
//! and a tool that has none prints a readable error instead of dying with SIGSYS mid-write.
//! The deny list's own answers keep their errno (EPERM for ptrace, mount, ...): the kernel
//! returns the most recently installed filter's answer among equally strict ones, and the deny
//! list is installed after this base.
//!
//! Must never: allow a call the deny list refuses unconditionally (the registry test), allow
//! by number (names only: numbers come from `syscalls.rs`), or kill.

/// A group of allowed calls and the reason they are allowed.
#[derive(Debug, Clone, Copy)]
pub struct Allowed {
    /// Why a box needs these.
    pub why: &'static str,
    /// Syscall names (`syscalls::TABLE`); one missing on an architecture is skipped there.
    pub names: &'static [&'static str],
}

/// A group of calls deliberately left out (they answer `ENOSYS`), and why.
#[derive(Debug, Clone, Copy)]
pub struct LeftOut {
    /// Why a box does without them.
    pub why: &'static str,
    /// Syscall names.
    pub names: &'static [&'static str],
}

/// The `h5i-v2` base. Review every change; the second layer's argument filters apply on top.
#[rustfmt::skip]
pub const BASE: &[Allowed] = &[
    Allowed {
        why: "reading and writing files and descriptors (open/openat/creat: set-id modes refused by the deny list)",
        names: &[
            "read", "write", "open", "openat", "creat", "close", "close_range", "lseek",
            "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2",
            "dup", "dup2", "dup3", "fcntl", "flock", "readahead", "fadvise64", "sendfile",
            "copy_file_range", "splice", "tee", "vmsplice", "cachestat",
        ],
    },
    Allowed {
        why: "file metadata, ownership and extended attributes (chmod family: set-id modes refused by the deny list)",
        names: &[
            "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access",
            "faccessat", "faccessat2", "readlink", "readlinkat", "getdents", "getdents64",
            "utime", "utimes", "futimesat", "utimensat", "chmod", "fchmod", "fchmodat",
            "fchmodat2", "chown", "fchown", "lchown", "fchownat", "umask", "truncate",
            "ftruncate", "fallocate", "setxattr", "lsetxattr", "fsetxattr", "getxattr",
            "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr", "removexattr",
            "lremovexattr", "fremovexattr",
        ],
    },
    Allowed {
        why: "the directory tree: make, link, rename, remove, move around (mknod: set-id modes refused by the deny list; device nodes need CAP_MKNOD the box lacks)",
        names: &[
            "mkdir", "mkdirat", "rmdir", "rename", "renameat", "renameat2", "link", "linkat",
            "symlink", "symlinkat", "unlink", "unlinkat", "mknod", "mknodat", "chdir", "fchdir",
            "getcwd",
        ],
    },
    Allowed {
        why: "durability: build tools and git fsync what they write",
        names: &["fsync", "fdatasync", "sync", "syncfs", "sync_file_range"],
    },
    Allowed {
        why: "memory: allocators, JITs (V8, Python, the JVM) and their protection keys and barriers; locking is bounded by RLIMIT_MEMLOCK, NUMA policy is the process's own",
        names: &[
            "brk", "mmap", "munmap", "mprotect", "mremap", "msync", "mincore", "madvise",
            "mlock", "mlock2", "munlock", "mlockall", "munlockall", "membarrier",
            "memfd_create", "pkey_mprotect", "pkey_alloc", "pkey_free", "mbind",
            "set_mempolicy", "get_mempolicy", "mseal", "map_shadow_stack",
        ],
    },
    Allowed {
        why: "processes and threads (clone: namespace flags refused by the deny list; personality: only PER_LINUX and the query)",
        names: &[
            "clone", "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4",
            "waitid", "set_tid_address", "set_robust_list", "get_robust_list", "rseq",
            "arch_prctl", "prctl", "personality", "getpid", "getppid", "gettid", "getpgid",
            "setpgid", "getpgrp", "getsid", "setsid", "uname", "sysinfo", "getrusage", "times",
            "getrlimit", "setrlimit", "prlimit64", "getcpu", "pidfd_open", "pidfd_send_signal",
        ],
    },
    Allowed {
        why: "scheduling: priorities, affinity and I/O priority, within the box's rlimits and cgroup",
        names: &[
            "sched_yield", "sched_setparam", "sched_getparam", "sched_setscheduler",
            "sched_getscheduler", "sched_get_priority_max", "sched_get_priority_min",
            "sched_rr_get_interval", "sched_setaffinity", "sched_getaffinity", "sched_setattr",
            "sched_getattr", "getpriority", "setpriority", "ioprio_set", "ioprio_get",
        ],
    },
    Allowed {
        why: "identity inside the box's user namespace: switching among its mapped users and dropping capabilities never reaches a host identity",
        names: &[
            "getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid", "getresgid",
            "setuid", "setgid", "setreuid", "setregid", "setgroups", "setresuid", "setresgid",
            "setfsuid", "setfsgid", "capget", "capset",
        ],
    },
    Allowed {
        why: "signals (kill reaches only the box's own pid namespace)",
        names: &[
            "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending",
            "rt_sigtimedwait", "rt_sigqueueinfo", "rt_sigsuspend", "rt_tgsigqueueinfo",
            "sigaltstack", "kill", "tkill", "tgkill", "pause", "restart_syscall", "signalfd",
            "signalfd4",
        ],
    },
    Allowed {
        why: "clocks, sleeping and timers (adjtimex/clock_adjtime read; setting the clock needs CAP_SYS_TIME)",
        names: &[
            "nanosleep", "clock_nanosleep", "gettimeofday", "time", "clock_gettime",
            "clock_getres", "adjtimex", "clock_adjtime", "getitimer", "setitimer", "alarm",
            "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun",
            "timer_delete", "timerfd_create", "timerfd_settime", "timerfd_gettime",
        ],
    },
    Allowed {
        why: "waiting: event loops (libuv, tokio, asyncio), futexes, pipes, file watchers",
        names: &[
            "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1",
            "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2",
            "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "futex",
            "futex_waitv", "futex_wake", "futex_wait", "futex_requeue", "pipe", "pipe2",
        ],
    },
    Allowed {
        why: "sockets (socket/socketpair: families, raw and packet types refused by the deny list or the socket gate)",
        names: &[
            "socket", "socketpair", "bind", "connect", "listen", "accept", "accept4",
            "getsockname", "getpeername", "sendto", "recvfrom", "sendmsg", "recvmsg",
            "sendmmsg", "recvmmsg", "shutdown", "setsockopt", "getsockopt",
        ],
    },
    Allowed {
        why: "System V and POSIX IPC: scoped by the box's own IPC namespace",
        names: &[
            "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop",
            "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
            "mq_timedreceive", "mq_notify", "mq_getsetattr",
        ],
    },
    Allowed {
        why: "Linux AIO (databases, QEMU); unlike io_uring each operation is its own syscall",
        names: &[
            "io_setup", "io_destroy", "io_getevents", "io_submit", "io_cancel", "io_pgetevents",
        ],
    },
    Allowed {
        why: "device and terminal control (TIOCSTI and TIOCLINUX refused by the deny list)",
        names: &["ioctl"],
    },
    Allowed {
        why: "randomness",
        names: &["getrandom"],
    },
    Allowed {
        why: "sandboxes inside the box (Codex's Landlock + seccomp, Chromium's seccomp): a filter or ruleset only ever narrows",
        names: &[
            "seccomp", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
        ],
    },
    Allowed {
        why: "only the kernel's uretprobe trampoline calls it (elsewhere it raises SIGILL); refusing it would crash a process a host tool is tracing",
        names: &["uretprobe"],
    },
];

/// Calls the base leaves out on purpose (besides the deny list's unconditional entries).
#[rustfmt::skip]
pub const LEFT_OUT: &[LeftOut] = &[
    LeftOut {
        why: "machine administration: needs capabilities a box never holds in the host's namespaces",
        names: &[
            "syslog", "vhangup", "chroot", "acct", "settimeofday", "clock_settime", "swapon",
            "swapoff", "reboot", "sethostname", "setdomainname", "quotactl", "quotactl_fd",
            "iopl", "ioperm",
        ],
    },
    LeftOut {
        why: "removed from the kernel, never implemented on 64-bit, or 32-bit-only segment and TLS calls: nothing current calls them",
        names: &[
            "uselib", "ustat", "sysfs", "_sysctl", "create_module", "get_kernel_syms",
            "query_module", "nfsservctl", "getpmsg", "putpmsg", "afs_syscall", "tuxcall",
            "security", "vserver", "epoll_ctl_old", "epoll_wait_old", "lookup_dcookie",
            "remap_file_pages", "set_thread_area", "get_thread_area", "modify_ldt",
        ],
    },
    LeftOut {
        why: "reach into another process (its descriptors, memory advice, pages, kernel objects): the ptrace family the deny list refuses",
        names: &[
            "kcmp", "pidfd_getfd", "process_madvise", "process_mrelease", "migrate_pages",
            "move_pages",
        ],
    },
    LeftOut {
        why: "file handles and whole-filesystem watching: the handle is only useful to open_by_handle_at (refused), fanotify needs CAP_SYS_ADMIN",
        names: &["name_to_handle_at", "fanotify_init", "fanotify_mark"],
    },
    LeftOut {
        why: "newer than the tools a box runs, each with an older interface they use instead (mount info from /proc, xattrs by path or fd, LSM attributes from /proc/self/attr)",
        names: &[
            "statmount", "listmount", "lsm_get_self_attr", "lsm_set_self_attr",
            "lsm_list_modules", "setxattrat", "getxattrat", "listxattrat", "removexattrat",
            "open_tree_attr", "file_getattr", "file_setattr", "set_mempolicy_home_node",
        ],
    },
    LeftOut {
        why: "secret memory unmapped from the kernel: no developer tool needs it, and it pins memory outside the usual accounting",
        names: &["memfd_secret"],
    },
];

/// Every allowed name, in list order.
pub fn allowed_names() -> impl Iterator<Item = &'static str> {
    BASE.iter().flat_map(|g| g.names.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::super::denylist::{When, H5I_V1};
    use super::super::syscalls::{lookup, TABLE};
    use super::*;

    fn left_out_names() -> impl Iterator<Item = &'static str> {
        LEFT_OUT.iter().flat_map(|g| g.names.iter().copied())
    }

    fn refused_outright(name: &str) -> bool {
        H5I_V1
            .iter()
            .any(|e| e.name == name && e.when == When::Always)
    }

    #[test]
    fn every_name_is_a_known_syscall_and_every_group_says_why() {
        for g in BASE {
            assert!(!g.why.trim().is_empty());
            for n in g.names {
                assert!(
                    lookup(n).is_some(),
                    "allowed {n} is not in the syscall table"
                );
            }
        }
        for g in LEFT_OUT {
            assert!(!g.why.trim().is_empty());
            for n in g.names {
                assert!(
                    lookup(n).is_some(),
                    "left-out {n} is not in the syscall table"
                );
            }
        }
    }

    #[test]
    fn every_known_syscall_is_allowed_refused_or_left_out_exactly_once() {
        for s in TABLE {
            let allowed = allowed_names().filter(|n| *n == s.name).count();
            let left = left_out_names().filter(|n| *n == s.name).count();
            let refused = usize::from(refused_outright(s.name));
            assert_eq!(
                allowed + left + refused,
                1,
                "{}: allowed {allowed}, left out {left}, refused by h5i-v1 {refused}",
                s.name
            );
        }
    }

    #[test]
    fn the_deny_lists_argument_filters_sit_on_allowed_calls() {
        // A conditional deny entry on a call the base refuses anyway would be dead data.
        for e in H5I_V1.iter().filter(|e| e.when != When::Always) {
            assert!(
                allowed_names().any(|n| n == e.name),
                "{} is filtered by argument but not allowed by the base",
                e.name
            );
        }
    }

    #[test]
    fn what_the_executor_needs_after_the_base_is_installed_is_allowed() {
        // The deny list's own filters, then execve: installed after this base.
        for n in ["seccomp", "prctl", "execve", "exit_group", "write", "close"] {
            assert!(allowed_names().any(|a| a == n), "{n}");
        }
    }
}
