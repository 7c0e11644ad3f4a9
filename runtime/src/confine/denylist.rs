//! The h5i-v1 seccomp deny list: reviewed data, in one place.
//!
//! Owns *what* h5i's own seccomp layer refuses; `seccomp.rs` owns turning it into BPF. Every
//! entry carries the reason it is here (`why`), and a unit test walks the whole registry (no
//! duplicates, every reason written, no syscall both unconditional and conditional).
//!
//! The default is *allow*: alone (profile `h5i-v1`) this list sits on top of the OCI spec's own
//! `linux.seccomp` profile (which libcontainer applies first) and removes kernel surface a
//! coding agent never needs; in `h5i-v2` it is the second layer over the default-deny base
//! (`allowlist.rs`), narrowing calls the base allows by their arguments. Entries name their
//! syscall; `syscalls.rs` gives its number on x86_64 and aarch64.
//! Denials answer `EPERM` (tools then print "Operation not permitted" and can fall back), never
//! kill, except `clone3`, which answers `ENOSYS` so libc falls back to `clone(2)`, whose flags
//! *can* be inspected (clone3's live in user memory, out of seccomp's reach).
//!
//! Every argument comparison is 32-bit (`Cond` has no 64-bit form): each compared argument is an
//! `int`/`unsigned int` (or, for `clone`, flags the kernel truncates with `lower_32_bits`), so the
//! kernel itself ignores the high half and a caller cannot dodge a rule by setting high bits.
//! Must never: kill on a denial, compare a 32-bit argument as 64 bits, or gain an entry without
//! a `why`.

/// Which annotation switches an entry on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Always part of `h5i-v1`.
    Base,
    /// Only with annotation `h5i.net.unix = "false"` (the policy's `net.unix = false`).
    NetUnixOff,
}

/// The errno a matching call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// `EPERM`: "Operation not permitted".
    Eperm,
    /// `ENOSYS`: "Function not implemented" (libc falls back to an older call).
    Enosys,
}

impl Denial {
    /// The errno value returned to the caller.
    pub fn errno(self) -> i32 {
        match self {
            Denial::Eperm => libc::EPERM,
            Denial::Enosys => libc::ENOSYS,
        }
    }
}

/// One 32-bit comparison on a syscall argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `(u32)arg == value`.
    Eq(u32),
    /// `(u32)arg != value`.
    Ne(u32),
    /// `((u32)arg & mask) == value`.
    MaskedEq {
        /// Bits looked at.
        mask: u32,
        /// Value those bits must have.
        value: u32,
    },
    /// `((u32)arg & O_TMPFILE) == O_TMPFILE` with the target architecture's `O_TMPFILE`, which
    /// includes `O_DIRECTORY`, whose bit differs between x86_64 and aarch64.
    HasOTmpfile,
}

/// A comparison on argument `arg` (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cond {
    /// Argument index, 0..=5.
    pub arg: u8,
    /// The comparison.
    pub op: Op,
}

/// When an entry matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Every call of the syscall.
    Always,
    /// Calls for which all conditions hold. Several entries for one syscall are OR-ed.
    AllOf(&'static [Cond]),
}

/// One reviewed deny-list entry.
#[derive(Debug, Clone, Copy)]
pub struct DenyEntry {
    /// Syscall name (`syscalls::TABLE`): the number comes from there, per architecture; an
    /// entry for a call an architecture lacks (x86_64's `open`, `chmod`, ... on aarch64) is
    /// skipped there, where the `*at` entries cover the same ground.
    pub name: &'static str,
    /// Which calls match.
    pub when: When,
    /// What a matching call gets.
    pub denial: Denial,
    /// Which annotation enables it.
    pub gate: Gate,
    /// Why it is denied (shown by `h5i-runc features`, checked non-empty by a test).
    pub why: &'static str,
}

const fn always(name: &'static str, why: &'static str) -> DenyEntry {
    DenyEntry {
        name,
        when: When::Always,
        denial: Denial::Eperm,
        gate: Gate::Base,
        why,
    }
}

const fn when(name: &'static str, conds: &'static [Cond], why: &'static str) -> DenyEntry {
    DenyEntry {
        name,
        when: When::AllOf(conds),
        denial: Denial::Eperm,
        gate: Gate::Base,
        why,
    }
}

const fn flag(bit: libc::c_int) -> [Cond; 1] {
    [Cond {
        arg: 0,
        op: Op::MaskedEq {
            mask: bit as u32,
            value: bit as u32,
        },
    }]
}

const fn arg0_is(value: libc::c_int) -> [Cond; 1] {
    [Cond {
        arg: 0,
        op: Op::Eq(value as u32),
    }]
}

/// `SOCK_TYPE_MASK` in the kernel: the low nibble of socket()'s `type` is the type proper; the
/// rest is `SOCK_NONBLOCK | SOCK_CLOEXEC`.
const SOCK_TYPE_MASK: u32 = 0xf;
/// `SOCK_PACKET` (10): the obsolete packet-socket type (libc deprecates the constant).
const SOCK_PACKET: libc::c_int = 10;

const fn family_and_type(family: libc::c_int, ty: libc::c_int) -> [Cond; 2] {
    [
        Cond {
            arg: 0,
            op: Op::Eq(family as u32),
        },
        Cond {
            arg: 1,
            op: Op::MaskedEq {
                mask: SOCK_TYPE_MASK,
                value: ty as u32,
            },
        },
    ]
}

/// `S_ISUID` and `S_ISGID`: the mode bits that make a file run as its owner or group.
const S_ISUID: u32 = libc::S_ISUID;
const S_ISGID: u32 = libc::S_ISGID;

/// Argument `arg` (a `mode_t`, an `unsigned int` in the kernel) has `bit` set.
const fn mode_has(arg: u8, bit: u32) -> Cond {
    Cond {
        arg,
        op: Op::MaskedEq {
            mask: bit,
            value: bit,
        },
    }
}

/// Argument `arg` (open's `int flags`) has every bit of `flags` set.
const fn flags_have(arg: u8, flags: libc::c_int) -> Cond {
    Cond {
        arg,
        op: Op::MaskedEq {
            mask: flags as u32,
            value: flags as u32,
        },
    }
}

/// Argument `arg` (open's `int flags`) asks for `O_TMPFILE`.
const fn has_o_tmpfile(arg: u8) -> Cond {
    Cond {
        arg,
        op: Op::HasOTmpfile,
    }
}

/// The mode argument (index 1 for chmod/fchmod/creat/mkdir/mknod, 2 for the `*at` forms).
const MODE1_SUID: [Cond; 1] = [mode_has(1, S_ISUID)];
const MODE1_SGID: [Cond; 1] = [mode_has(1, S_ISGID)];
const MODE2_SUID: [Cond; 1] = [mode_has(2, S_ISUID)];
const MODE2_SGID: [Cond; 1] = [mode_has(2, S_ISGID)];
/// open(path, flags, mode) / openat(dfd, path, flags, mode): the mode counts only when the call
/// creates a file (`O_CREAT`, or `O_TMPFILE`, whose nameless file `linkat` can later name).
const OPEN_CREAT_SUID: [Cond; 2] = [flags_have(1, libc::O_CREAT), mode_has(2, S_ISUID)];
const OPEN_CREAT_SGID: [Cond; 2] = [flags_have(1, libc::O_CREAT), mode_has(2, S_ISGID)];
const OPEN_TMPFILE_SUID: [Cond; 2] = [has_o_tmpfile(1), mode_has(2, S_ISUID)];
const OPEN_TMPFILE_SGID: [Cond; 2] = [has_o_tmpfile(1), mode_has(2, S_ISGID)];
const OPENAT_CREAT_SUID: [Cond; 2] = [flags_have(2, libc::O_CREAT), mode_has(3, S_ISUID)];
const OPENAT_CREAT_SGID: [Cond; 2] = [flags_have(2, libc::O_CREAT), mode_has(3, S_ISGID)];
const OPENAT_TMPFILE_SUID: [Cond; 2] = [has_o_tmpfile(2), mode_has(3, S_ISUID)];
const OPENAT_TMPFILE_SGID: [Cond; 2] = [has_o_tmpfile(2), mode_has(3, S_ISGID)];
/// socketpair(family, ...) of any family but AF_UNIX.
const SOCKETPAIR_NOT_UNIX: [Cond; 1] = [Cond {
    arg: 0,
    op: Op::Ne(libc::AF_UNIX as u32),
}];

const CLONE_NEWNS: [Cond; 1] = flag(libc::CLONE_NEWNS);
const CLONE_NEWCGROUP: [Cond; 1] = flag(libc::CLONE_NEWCGROUP);
const CLONE_NEWUTS: [Cond; 1] = flag(libc::CLONE_NEWUTS);
const CLONE_NEWIPC: [Cond; 1] = flag(libc::CLONE_NEWIPC);
const CLONE_NEWUSER: [Cond; 1] = flag(libc::CLONE_NEWUSER);
const CLONE_NEWPID: [Cond; 1] = flag(libc::CLONE_NEWPID);
const CLONE_NEWNET: [Cond; 1] = flag(libc::CLONE_NEWNET);
/// personality(2) takes an `unsigned int`: allowed are PER_LINUX (0) and the query 0xffffffff.
const PERSONALITY_NOT_LINUX_OR_QUERY: [Cond; 2] = [
    Cond {
        arg: 0,
        op: Op::Ne(0),
    },
    Cond {
        arg: 0,
        op: Op::Ne(0xffff_ffff),
    },
];
/// ioctl(2)'s request is an `unsigned int` in the kernel: compared on the low 32 bits only.
const IOCTL_TIOCSTI: [Cond; 1] = [Cond {
    arg: 1,
    op: Op::Eq(libc::TIOCSTI as u32),
}];
const IOCTL_TIOCLINUX: [Cond; 1] = [Cond {
    arg: 1,
    op: Op::Eq(libc::TIOCLINUX as u32),
}];
const SOCKET_PACKET: [Cond; 1] = arg0_is(libc::AF_PACKET);
const SOCKET_INET_RAW: [Cond; 2] = family_and_type(libc::AF_INET, libc::SOCK_RAW);
const SOCKET_INET6_RAW: [Cond; 2] = family_and_type(libc::AF_INET6, libc::SOCK_RAW);
const SOCKET_INET_PACKET: [Cond; 2] = family_and_type(libc::AF_INET, SOCK_PACKET);
const SOCKET_INET6_PACKET: [Cond; 2] = family_and_type(libc::AF_INET6, SOCK_PACKET);
const SOCKET_UNIX: [Cond; 1] = arg0_is(libc::AF_UNIX);

/// The `h5i-v1` deny list. Review every change; each entry says why it is here. A `static`,
/// not a `const`: callers tell entries apart by address (`h5i-runc features` marks the ones
/// the socket gate takes over), and each use of a `const` may be a copy of its own.
pub static H5I_V1: &[DenyEntry] = &[
    // --- other processes' memory -------------------------------------------------------------
    // Reads/writes another process's registers and memory: the classic way to hijack a sibling
    // (or a host helper that entered the box) and to step around every other layer.
    always("ptrace", "attach to and rewrite another process"),
    // Cross-process memory copy without ptrace-attach: same reach as ptrace for data.
    always("process_vm_readv", "read another process's memory"),
    // Same, writing.
    always("process_vm_writev", "write another process's memory"),
    // --- namespaces ------------------------------------------------------------------------
    // A new user namespace hands out a full capability set over fresh namespaces: a large slice
    // of kernel attack surface (and a way to remount what the box made read-only).
    always("unshare", "create new namespaces (user ns => capabilities)"),
    // Joining a namespace through an inherited or /proc fd would leave the box's namespaces.
    always("setns", "join another namespace"),
    // clone(2) with any namespace flag is unshare by another name; plain fork/thread clones
    // (no namespace bits) stay allowed. One entry per flag: entries are OR-ed.
    when("clone", &CLONE_NEWNS, "clone into a new mount namespace"),
    when(
        "clone",
        &CLONE_NEWCGROUP,
        "clone into a new cgroup namespace",
    ),
    when("clone", &CLONE_NEWUTS, "clone into a new UTS namespace"),
    when("clone", &CLONE_NEWIPC, "clone into a new IPC namespace"),
    when("clone", &CLONE_NEWUSER, "clone into a new user namespace"),
    when("clone", &CLONE_NEWPID, "clone into a new PID namespace"),
    when("clone", &CLONE_NEWNET, "clone into a new network namespace"),
    // clone3's flags live in a struct in user memory, which seccomp cannot read. ENOSYS (not
    // EPERM) makes glibc and musl fall back to clone(2), whose flags the entries above check.
    DenyEntry {
        name: "clone3",
        when: When::Always,
        denial: Denial::Enosys,
        gate: Gate::Base,
        why: "flags unreadable by seccomp; ENOSYS makes libc fall back to clone(2)",
    },
    // --- the mount table ---------------------------------------------------------------------
    // The box's filesystem view is set up once by the runtime; changing it from inside could
    // reveal or unhide host paths, or shadow what Landlock and read-only mounts promise.
    always("mount", "change the mount table"),
    always("umount2", "unmount (could reveal what a mount hides)"),
    always("pivot_root", "change the root filesystem"),
    always("move_mount", "new mount API: attach or move a mount"),
    always("open_tree", "new mount API: clone a mount tree"),
    always("fsopen", "new mount API: open a filesystem context"),
    always("fsconfig", "new mount API: configure a filesystem context"),
    always("fsmount", "new mount API: create a mount"),
    always("fspick", "new mount API: reconfigure an existing mount"),
    always("mount_setattr", "change mount flags (e.g. drop read-only)"),
    // Opens any file by handle, bypassing path walks (the "shocker" container escape).
    always("open_by_handle_at", "open files by handle, around paths"),
    // --- kernel keyrings ---------------------------------------------------------------------
    // Keyrings are not namespaced: keys can leak between boxes and the host user's sessions.
    always("keyctl", "kernel keyrings are not namespaced"),
    always("add_key", "kernel keyrings are not namespaced"),
    always("request_key", "kernel keyrings are not namespaced"),
    // --- large, frequently exploited kernel surface ---------------------------------------------
    always("bpf", "eBPF: large verifier attack surface"),
    always("perf_event_open", "perf: side channels, kernel bugs"),
    always("userfaultfd", "stalls kernel copies: exploit timing aid"),
    always("io_uring_setup", "io_uring: bypasses seccomp per-op"),
    always("io_uring_enter", "io_uring: bypasses seccomp per-op"),
    always("io_uring_register", "io_uring: bypasses seccomp"),
    // --- loading code into the kernel ----------------------------------------------------------
    always("kexec_load", "replace the running kernel"),
    always("kexec_file_load", "replace the running kernel"),
    always("init_module", "load a kernel module"),
    always("finit_module", "load a kernel module"),
    always("delete_module", "unload a kernel module"),
    // --- execution domain --------------------------------------------------------------------
    // Personas such as READ_IMPLIES_EXEC or ADDR_NO_RANDOMIZE weaken NX and ASLR for what runs
    // next; only PER_LINUX (0) and the query (0xffffffff) are allowed.
    when(
        "personality",
        &PERSONALITY_NOT_LINUX_OR_QUERY,
        "only PER_LINUX and the query are allowed",
    ),
    // --- terminal injection --------------------------------------------------------------------
    // TIOCSTI pushes bytes into a terminal's input queue: typed commands in the user's shell
    // when the box shares its terminal (legacy_tiocsti is on here).
    when(
        "ioctl",
        &IOCTL_TIOCSTI,
        "TIOCSTI: inject input into a terminal",
    ),
    // TIOCLINUX subcommands paste the console selection into input (same injection).
    when(
        "ioctl",
        &IOCTL_TIOCLINUX,
        "TIOCLINUX: console paste/injection",
    ),
    // --- raw networking ----------------------------------------------------------------------
    // Packet sockets see and forge link-layer frames: sniffing and spoofing around the egress
    // proxy and nftables rules.
    when(
        "socket",
        &SOCKET_PACKET,
        "AF_PACKET: sniff and forge frames",
    ),
    // Raw IP sockets forge headers (spoofing, crafted packets past the proxy).
    when("socket", &SOCKET_INET_RAW, "raw IPv4 socket: forge packets"),
    when(
        "socket",
        &SOCKET_INET6_RAW,
        "raw IPv6 socket: forge packets",
    ),
    // SOCK_PACKET is the obsolete spelling of a packet socket on AF_INET/AF_INET6.
    when(
        "socket",
        &SOCKET_INET_PACKET,
        "obsolete SOCK_PACKET on AF_INET",
    ),
    when(
        "socket",
        &SOCKET_INET6_PACKET,
        "obsolete SOCK_PACKET on AF_INET6",
    ),
    // --- set-id files ------------------------------------------------------------------------
    // A file the box makes in its workspace is owned on the host by the box's identity, and an
    // owner may set S_ISUID/S_ISGID without any capability: a set-id program planted there runs
    // as that identity for any host user who executes it. Every call that sets a mode is
    // refused when the mode carries either bit (one entry per bit: entries are OR-ed). Plain
    // modes (755, 644, sticky 1777) stay allowed.
    when("chmod", &MODE1_SUID, "chmod to a setuid mode"),
    when("chmod", &MODE1_SGID, "chmod to a setgid mode"),
    when("fchmod", &MODE1_SUID, "fchmod to a setuid mode"),
    when("fchmod", &MODE1_SGID, "fchmod to a setgid mode"),
    when("fchmodat", &MODE2_SUID, "fchmodat to a setuid mode"),
    when("fchmodat", &MODE2_SGID, "fchmodat to a setgid mode"),
    // fchmodat2 (Linux 6.6, syscall 452 on x86_64 and the generic table): same mode argument.
    when("fchmodat2", &MODE2_SUID, "fchmodat2 to a setuid mode"),
    when("fchmodat2", &MODE2_SGID, "fchmodat2 to a setgid mode"),
    when("open", &OPEN_CREAT_SUID, "create a file with a setuid mode"),
    when("open", &OPEN_CREAT_SGID, "create a file with a setgid mode"),
    when("open", &OPEN_TMPFILE_SUID, "O_TMPFILE with a setuid mode"),
    when("open", &OPEN_TMPFILE_SGID, "O_TMPFILE with a setgid mode"),
    when(
        "openat",
        &OPENAT_CREAT_SUID,
        "create a file with a setuid mode",
    ),
    when(
        "openat",
        &OPENAT_CREAT_SGID,
        "create a file with a setgid mode",
    ),
    when(
        "openat",
        &OPENAT_TMPFILE_SUID,
        "O_TMPFILE with a setuid mode",
    ),
    when(
        "openat",
        &OPENAT_TMPFILE_SGID,
        "O_TMPFILE with a setgid mode",
    ),
    when("creat", &MODE1_SUID, "create a file with a setuid mode"),
    when("creat", &MODE1_SGID, "create a file with a setgid mode"),
    // mkdir strips both bits itself today; refused anyway so no kernel change can reopen it.
    when("mkdir", &MODE1_SUID, "mkdir with a setuid mode"),
    when("mkdir", &MODE1_SGID, "mkdir with a setgid mode"),
    when("mkdirat", &MODE2_SUID, "mkdirat with a setuid mode"),
    when("mkdirat", &MODE2_SGID, "mkdirat with a setgid mode"),
    when("mknod", &MODE1_SUID, "mknod of a setuid file"),
    when("mknod", &MODE1_SGID, "mknod of a setgid file"),
    when("mknodat", &MODE2_SUID, "mknodat of a setuid file"),
    when("mknodat", &MODE2_SGID, "mknodat of a setgid file"),
    // openat2's mode lives in a struct in user memory, which seccomp cannot read. ENOSYS (not
    // EPERM) makes callers fall back to openat(2), whose mode the entries above check.
    DenyEntry {
        name: "openat2",
        when: When::Always,
        denial: Denial::Enosys,
        gate: Gate::Base,
        why: "mode unreadable by seccomp; ENOSYS makes callers fall back to openat(2)",
    },
    // --- address families ------------------------------------------------------------------
    // socket() of a family outside h5i_policy::families' allowlist is refused by a rule
    // `seccomp.rs` builds from that table (the grants are per box). socketpair only makes
    // sense for AF_UNIX (a private pair); any other family would load and exercise a protocol
    // module the table refuses.
    when(
        "socketpair",
        &SOCKETPAIR_NOT_UNIX,
        "socketpair of a family other than AF_UNIX",
    ),
    // --- net.unix = false ----------------------------------------------------------------------
    // socket(AF_UNIX) can reach listeners outside the box (Docker's socket, an agent's) and
    // receive descriptors from them. socketpair(AF_UNIX) only makes a private pair and is not
    // listed: Node's child_process and Python's multiprocessing need it.
    DenyEntry {
        name: "socket",
        when: When::AllOf(&SOCKET_UNIX),
        denial: Denial::Eperm,
        gate: Gate::NetUnixOff,
        why: "AF_UNIX sockets reach listeners outside the box (net.unix = false)",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_says_why_and_is_well_formed() {
        for entry in H5I_V1 {
            assert!(!entry.why.trim().is_empty(), "{} has no reason", entry.name);
            assert!(
                super::super::syscalls::lookup(entry.name).is_some(),
                "{} is not in the syscall table",
                entry.name
            );
            if let When::AllOf(conds) = entry.when {
                assert!(!conds.is_empty(), "{}: AllOf with no condition", entry.name);
                for cond in conds {
                    assert!(cond.arg <= 5, "{}: argument index {}", entry.name, cond.arg);
                }
            }
        }
    }

    #[test]
    fn no_syscall_is_both_unconditional_and_conditional() {
        for entry in H5I_V1 {
            let same: Vec<_> = H5I_V1.iter().filter(|e| e.name == entry.name).collect();
            if entry.when == When::Always {
                assert_eq!(
                    same.len(),
                    1,
                    "{} is listed unconditionally and again",
                    entry.name
                );
            }
            assert!(
                same.iter().all(|e| e.denial == entry.denial),
                "{}: one syscall, two different errnos",
                entry.name
            );
        }
    }

    #[test]
    fn no_duplicate_entries() {
        for (i, a) in H5I_V1.iter().enumerate() {
            for b in &H5I_V1[i + 1..] {
                assert!(
                    !(a.name == b.name && a.when == b.when && a.gate == b.gate),
                    "duplicate entry for {}",
                    a.name
                );
            }
        }
    }

    #[test]
    fn the_issue_minimum_is_listed() {
        let required = [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "unshare",
            "setns",
            "clone",
            "clone3",
            "mount",
            "umount2",
            "pivot_root",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "personality",
            "ioctl",
            "socket",
        ];
        for name in required {
            assert!(
                H5I_V1.iter().any(|e| e.name == name),
                "{name} missing from h5i-v1"
            );
        }
    }

    #[test]
    fn socketpair_of_af_unix_is_never_listed() {
        for e in H5I_V1.iter().filter(|e| e.name == "socketpair") {
            let When::AllOf(conds) = e.when else {
                panic!("socketpair listed unconditionally");
            };
            assert_eq!(
                conds,
                &[Cond {
                    arg: 0,
                    op: Op::Ne(libc::AF_UNIX as u32)
                }],
                "only the not-AF_UNIX entry"
            );
        }
    }

    #[test]
    fn every_mode_setting_call_is_listed_for_both_setid_bits() {
        for name in [
            "chmod",
            "fchmod",
            "fchmodat",
            "fchmodat2",
            "open",
            "openat",
            "creat",
            "mkdir",
            "mkdirat",
            "mknod",
            "mknodat",
        ] {
            for bit in [libc::S_ISUID, libc::S_ISGID] {
                let listed = H5I_V1.iter().any(|e| {
                    e.name == name
                        && matches!(e.when, When::AllOf(c) if c.iter().any(|c| c.op
                            == Op::MaskedEq { mask: bit, value: bit }))
                });
                assert!(listed, "{name} with {bit:o} missing");
            }
        }
        assert!(H5I_V1
            .iter()
            .any(|e| e.name == "openat2" && e.denial == Denial::Enosys));
    }
}
