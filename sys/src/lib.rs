//! h5i-sys: the raw kernel calls h5i's crates share, each written once behind a small safe
//! function: pidfds ([`pidfd`]), descriptors passed over unix sockets ([`fd_passing`]),
//! descriptor hygiene and probes by number ([`fds`]), forking, `_exit` and exec'ing prepared
//! arguments ([`fork_exec`]), idmapped mounts ([`idmap`]), sockets made inside another
//! process's namespaces ([`ns_socket`]), entering a namespace, its kind, and a thread's own
//! network namespace ([`ns`]), netfilter netlink ([`netlink`]), Landlock's ABI probe,
//! `no_new_privs` and enforcing a built ruleset ([`landlock`]), giving up every capability for
//! good and the dumpable flag ([`caps`]), every wait on descriptors, `poll(2)` ([`poll`]),
//! pseudo-terminals, window sizes and raw mode ([`pty`]), random bytes ([`random`]), seccomp's
//! filter-with-listener and notification ioctls ([`seccomp`]), the box sandbox's
//! `SOCK_SEQPACKET` init socket ([`seqpacket`]), a TCP listener made inside a box's network
//! namespace ([`tcp_in_ns`]), a directory worked in by name through a held descriptor, never
//! through a symlink ([`dir_at`]), the caller's own ids and dropping a child to others
//! ([`ids`]), the password database ([`users`]), dying with the parent, sessions, liveness
//! probes, process-group signals and reaping ([`proc`]), re-owning, stat'ing and opening an
//! entry without following a symlink, private temporary directories and `flock` ([`fs`]), a
//! private mount namespace and its mounts ([`mount`]), interfaces: up, tap devices, addresses
//! ([`netif`]), signals read from a descriptor, waited for, handled and reset ([`signals`]) and
//! the terminal's foreground group ([`tty`]).
//!
//! The workspace's raw calls outside this crate are each named, with the reason they stay, in
//! `sys/raw-calls-allowed.txt`; `tests/module_layers.rs` refuses any other `libc::` call or
//! `nix::` use in production code, and any entry of that list that no longer matches.
//!
//! On rustix wherever rustix covers a call soundly (pidfd_open, pidfd_send_signal, sendmsg
//! with `SCM_RIGHTS`, poll, dup, setns, unshare, `PR_SET_NO_NEW_PRIVS`, `PR_SET_DUMPABLE`,
//! capset, openpt/unlockpt/`TIOCGPTPEER`, flock, fcntl flags, getrandom); on libc, with a
//! `// SAFETY:` line per block, where it does not: `recvmsg` and `SO_PEERCRED`, whose `ucred`
//! rustix reads into a non-zero `Pid` although the kernel writes pid 0 for a process outside
//! the reader's pid namespace (a box can hand its end of a socket to such a process);
//! `close_range`, the Landlock calls, seccomp, `signalfd`, the signal mask and dispositions,
//! fork/execve/fexecve, the tun and `NS_GET_NSTYPE` ioctls, `getifaddrs` and `mkdtemp`, which
//! rustix does not wrap (or only in its unstable runtime feature); and calls on a descriptor
//! number that may not be open (a standard one a process was handed), which no `BorrowedFd`
//! may name.
//!
//! Owns the calls only: what a message means, which descriptors a protocol expects and what a
//! refusal is called are the callers'. Must never: block without a bound the caller chose,
//! keep a descriptor the kernel handed over in a refused message (each is closed), or hand out
//! a descriptor without close-on-exec. Its own tests (unit, below each module) pass descriptors
//! over socketpairs and open pidfds of real children; every caller's tests exercise it too.
//! The lowest crate of the workspace: it depends on no h5i crate, so `h5i-policy` stays pure.

pub mod caps;
pub mod dir_at;
pub mod fd_passing;
pub mod fds;
pub mod fork_exec;
pub mod fs;
pub mod idmap;
pub mod ids;
pub mod landlock;
pub mod mount;
pub mod netif;
pub mod netlink;
pub mod ns;
pub mod ns_socket;
pub mod pidfd;
pub mod poll;
pub mod proc;
pub mod pty;
pub mod random;
pub mod seccomp;
pub mod seqpacket;
pub mod signals;
pub mod tcp_in_ns;
pub mod tty;
pub mod users;
