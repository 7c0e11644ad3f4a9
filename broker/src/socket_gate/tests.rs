//! Unit tests: every rule of `decide`, `classify`'s refusals, and the listener against hostile
//! hand-offs and a real seccomp filter installed in a forked child.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use h5i_sys::fd_passing::send_with_fds;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use super::*;

const OFF: GateRules = GateRules {
    unix: false,
    granted: FamilySet::EMPTY,
};
const ON: GateRules = GateRules {
    unix: true,
    granted: FamilySet::EMPTY,
};

fn socket(family: i32, ty: i32, protocol: i32, rules: &GateRules) -> GateDecision {
    decide(
        GateSyscall::Socket,
        family as u32 as u64,
        ty as u32 as u64,
        protocol as u32 as u64,
        rules,
    )
}

fn allowed(family: &str) -> GateDecision {
    GateDecision {
        allow: true,
        family: family.into(),
    }
}

fn denied(family: &str) -> GateDecision {
    GateDecision {
        allow: false,
        family: family.into(),
    }
}

#[test]
fn inet_stream_and_dgram_are_allowed_with_any_flags() {
    let flags = [
        0,
        libc::SOCK_NONBLOCK,
        libc::SOCK_CLOEXEC,
        libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
    ];
    for (family, name) in [(libc::AF_INET, "inet"), (libc::AF_INET6, "inet6")] {
        for f in flags {
            for rules in [OFF, ON] {
                assert_eq!(
                    socket(family, libc::SOCK_STREAM | f, 0, &rules),
                    allowed(name)
                );
                assert_eq!(
                    socket(family, libc::SOCK_STREAM | f, libc::IPPROTO_TCP, &rules),
                    allowed(name)
                );
                assert_eq!(
                    socket(family, libc::SOCK_DGRAM | f, 0, &rules),
                    allowed(name)
                );
                assert_eq!(
                    socket(family, libc::SOCK_DGRAM | f, libc::IPPROTO_UDP, &rules),
                    allowed(name)
                );
            }
        }
    }
}

#[test]
fn raw_and_packet_types_in_inet_are_denied_as_raw() {
    for (family, name) in [(libc::AF_INET, "inet-raw"), (libc::AF_INET6, "inet6-raw")] {
        for protocol in [
            0,
            libc::IPPROTO_ICMP,
            libc::IPPROTO_TCP,
            libc::IPPROTO_RAW,
            255,
        ] {
            assert_eq!(socket(family, libc::SOCK_RAW, protocol, &ON), denied(name));
            assert_eq!(
                socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol, &ON),
                denied(name)
            );
        }
        assert_eq!(socket(family, SOCK_PACKET, 0, &ON), denied(name));
    }
}

#[test]
fn other_inet_types_and_protocols_are_denied() {
    const IPPROTO_MPTCP: i32 = 262;
    for (family, name) in [
        (libc::AF_INET, "inet-other"),
        (libc::AF_INET6, "inet6-other"),
    ] {
        let cases = [
            (libc::SOCK_SEQPACKET, 0),
            (libc::SOCK_SEQPACKET, libc::IPPROTO_SCTP),
            (libc::SOCK_STREAM, libc::IPPROTO_SCTP),
            (libc::SOCK_STREAM, IPPROTO_MPTCP),
            (libc::SOCK_STREAM, libc::IPPROTO_UDP),
            (libc::SOCK_DGRAM, libc::IPPROTO_TCP),
            (libc::SOCK_DGRAM, libc::IPPROTO_ICMP),
            (libc::SOCK_DGRAM, libc::IPPROTO_ICMPV6),
            (libc::SOCK_DGRAM, libc::IPPROTO_UDPLITE),
            (libc::SOCK_RDM, 0),
            (6, 0), // SOCK_DCCP
            (0, 0),
            (15, 0),
        ];
        for (ty, protocol) in cases {
            assert_eq!(
                socket(family, ty, protocol, &ON),
                denied(name),
                "type {ty} protocol {protocol}"
            );
        }
    }
}

#[test]
fn unix_sockets_follow_the_rule() {
    for ty in [
        libc::SOCK_STREAM,
        libc::SOCK_DGRAM,
        libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
    ] {
        assert_eq!(socket(libc::AF_UNIX, ty, 0, &OFF), denied("unix"));
        assert_eq!(socket(libc::AF_UNIX, ty, 0, &ON), allowed("unix"));
    }
}

#[test]
fn netlink_packet_vsock_and_unknown_families_are_denied() {
    let cases = [
        (libc::AF_NETLINK, "netlink"),
        (libc::AF_PACKET, "packet"),
        (libc::AF_VSOCK, "vsock"),
        (libc::AF_BLUETOOTH, "family-31"),
        (libc::AF_ALG, "family-38"),
        (0, "family-0"),
        (63, "family-63"),
        (64, "family-invalid"),
        (-1, "family-invalid"),
        (i32::MAX, "family-invalid"),
    ];
    for (family, name) in cases {
        for ty in [libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_RAW] {
            for rules in [OFF, ON] {
                assert_eq!(
                    socket(family, ty, 0, &rules),
                    denied(name),
                    "family {family}"
                );
            }
        }
    }
}

#[test]
fn every_family_the_policy_table_refuses_is_denied_and_a_grant_allows_exactly_it() {
    use h5i_policy::families::{FamilyVerdict, ADDRESS_FAMILIES};
    for f in ADDRESS_FAMILIES {
        if matches!(f.verdict, FamilyVerdict::Refused | FamilyVerdict::Never) {
            for rules in [OFF, ON] {
                let d = socket(f.number as i32, libc::SOCK_STREAM, 0, &rules);
                assert!(!d.allow, "{} allowed", f.name);
            }
        }
    }
    let vsock = GateRules::for_policy(false, &["vsock".to_owned()]);
    assert!(socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0, &vsock).allow);
    assert!(!socket(libc::AF_ALG, libc::SOCK_SEQPACKET, 0, &vsock).allow);
    assert!(!socket(libc::AF_UNIX, libc::SOCK_STREAM, 0, &vsock).allow);
    // A name no policy may grant stays refused even if it reaches the gate.
    let bad = GateRules::for_policy(false, &["packet".to_owned(), "netlink".to_owned()]);
    assert!(!socket(libc::AF_PACKET, libc::SOCK_RAW, 0, &bad).allow);
    assert!(!socket(libc::AF_NETLINK, libc::SOCK_RAW, 0, &bad).allow);
}

#[test]
fn socketpair_unix_is_always_allowed_and_nothing_else() {
    for rules in [OFF, ON] {
        for ty in [libc::SOCK_STREAM, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC] {
            let d = decide(
                GateSyscall::Socketpair,
                libc::AF_UNIX as u64,
                ty as u64,
                0,
                &rules,
            );
            assert_eq!(d, allowed("unix-pair"));
        }
        for (family, name) in [
            (libc::AF_INET, "inet-pair"),
            (libc::AF_INET6, "inet6-pair"),
            (libc::AF_NETLINK, "netlink-pair"),
            (libc::AF_TIPC, "family-30-pair"),
        ] {
            let d = decide(
                GateSyscall::Socketpair,
                family as u64,
                libc::SOCK_STREAM as u64,
                0,
                &rules,
            );
            assert_eq!(d, denied(name));
        }
    }
}

#[test]
fn high_argument_bits_are_ignored_like_the_kernel_does() {
    let high = 0xdead_beef_0000_0000u64;
    let d = decide(
        GateSyscall::Socket,
        high | libc::AF_INET as u64,
        high | libc::SOCK_STREAM as u64,
        high,
        &OFF,
    );
    assert_eq!(d, allowed("inet"));
    let d = decide(
        GateSyscall::Socket,
        high | libc::AF_PACKET as u64,
        libc::SOCK_RAW as u64,
        0,
        &ON,
    );
    assert_eq!(d, denied("packet"));
    let d = decide(
        GateSyscall::Socket,
        high | libc::AF_UNIX as u64,
        libc::SOCK_STREAM as u64,
        0,
        &OFF,
    );
    assert_eq!(d, denied("unix"));
    let d = decide(
        GateSyscall::Socket,
        libc::AF_INET as u64,
        high | libc::SOCK_RAW as u64,
        0,
        &ON,
    );
    assert_eq!(d, denied("inet-raw"));
}

#[test]
fn tally_names_are_bounded() {
    let mut names = std::collections::BTreeSet::new();
    for family in (0..=200u64).chain([u32::MAX as u64, u64::MAX, 1 << 40]) {
        for ty in 0..16u64 {
            for syscall in [GateSyscall::Socket, GateSyscall::Socketpair] {
                names.insert(decide(syscall, family, ty, 0, &ON).family);
            }
        }
    }
    assert!(names.len() <= 2 * 65 + 4, "{} names", names.len());
}

#[test]
fn foreign_architectures_and_other_syscalls_are_refused_uncounted() {
    let args = [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
    let native = classify(libc::SYS_socket as i32, AUDIT_ARCH_NATIVE, &args, &ON);
    assert_eq!(native, Classified::Decided(allowed("inet")));
    // i386 (socketcall or its own socket number) and any other architecture.
    assert!(matches!(
        classify(102, 0x4000_0003, &args, &ON),
        Classified::Foreign(_)
    ));
    assert!(matches!(
        classify(libc::SYS_socket as i32, 0x4000_0003, &args, &ON),
        Classified::Foreign(_)
    ));
    // x32 numbers carry the x86_64 audit arch with bit 30 set.
    let x32_socket = (libc::SYS_socket as i32) | 0x4000_0000;
    assert!(matches!(
        classify(x32_socket, AUDIT_ARCH_NATIVE, &args, &ON),
        Classified::Foreign(_)
    ));
    assert!(matches!(
        classify(libc::SYS_connect as i32, AUDIT_ARCH_NATIVE, &args, &ON),
        Classified::Foreign(_)
    ));
}

// --- the listener ---------------------------------------------------------------------------

/// A gate serving a fresh listener in a private temporary directory.
struct TestGate {
    dir: tempfile::TempDir,
    handle: GateHandle,
}

impl TestGate {
    fn start(rules: GateRules) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("gate.sock")).unwrap();
        let handle = serve(listener, rules).unwrap();
        Self { dir, handle }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("gate.sock")
    }
}

fn state_json(fds: &[&str]) -> Vec<u8> {
    serde_json::json!({
        "ociVersion": "1.0.2",
        "fds": fds,
        "pid": 4242,
        "metadata": "",
        "state": {"ociVersion": "1.0.2", "id": "test-box", "status": "creating", "pid": 4242,
                  "bundle": "/nonexistent", "annotations": {}}
    })
    .to_string()
    .into_bytes()
}

fn unsafe_zeroed_sockaddr() -> libc::sockaddr_un {
    // SAFETY: plain old data; all-zero is a valid (empty) address.
    unsafe { std::mem::zeroed() }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0);
    // SAFETY: pipe2 just created both; we are their only owner.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Wait (bounded, in poll) until every write end of the pipe is closed: the read end then
/// reports end of file. Returns false on timeout.
fn closed_everywhere(read_end: &OwnedFd) -> bool {
    let mut p = [libc::pollfd {
        fd: read_end.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(p.as_mut_ptr(), 1, 30_000) };
    rc == 1 && p[0].revents & libc::POLLHUP != 0
}

/// Hand the gate `message` with write ends of fresh pipes; true when the gate closed every one
/// of them (it refused and kept nothing).
fn handoff_is_refused(gate: &TestGate, message: &[u8], n_fds: usize) -> bool {
    let pipes: Vec<(OwnedFd, OwnedFd)> = (0..n_fds).map(|_| pipe()).collect();
    let ends: Vec<BorrowedFd<'_>> = pipes.iter().map(|(_, w)| w.as_fd()).collect();
    let sock = UnixStream::connect(gate.path()).unwrap();
    send_with_fds(&sock, message, &ends).unwrap();
    drop(sock);
    pipes.into_iter().all(|(read_end, write_end)| {
        drop(write_end);
        closed_everywhere(&read_end)
    })
}

#[test]
fn garbage_message_is_refused_and_its_descriptor_closed() {
    let gate = TestGate::start(OFF);
    assert!(handoff_is_refused(&gate, b"\x00\xffnot json at all{{{", 1));
    assert!(handoff_is_refused(&gate, b"{\"fds\": 7}", 1));
    // A descriptor with no data byte never leaves the sender (a stream socket would drop it):
    // h5i-sys refuses the send; the gate sees a connection that closes empty.
    let (_read_end, write_end) = pipe();
    let sock = UnixStream::connect(gate.path()).unwrap();
    assert!(matches!(
        send_with_fds(&sock, b"", &[write_end.as_fd()]),
        Err(h5i_sys::fd_passing::FdPassError::NoData)
    ));
    drop(sock);
    assert_eq!(gate.handle.tally(), SocketGateTally::default());
}

#[test]
fn a_descriptor_that_is_not_a_seccomp_listener_is_refused() {
    let gate = TestGate::start(OFF);
    assert!(handoff_is_refused(&gate, &state_json(&["seccompFd"]), 1));
}

#[test]
fn wrong_descriptor_names_or_counts_are_refused() {
    let gate = TestGate::start(OFF);
    assert!(handoff_is_refused(&gate, &state_json(&["other"]), 1));
    assert!(handoff_is_refused(&gate, &state_json(&[]), 1));
    assert!(handoff_is_refused(
        &gate,
        &state_json(&["seccompFd", "seccompFd"]),
        2
    ));
    assert!(handoff_is_refused(&gate, &state_json(&["seccompFd"]), 2));
    // More descriptors than the gate makes room for: truncated by the kernel, refused.
    assert!(handoff_is_refused(&gate, &state_json(&["seccompFd"]), 6));
}

#[test]
fn a_handoff_without_a_descriptor_is_refused_and_the_gate_keeps_serving() {
    let gate = TestGate::start(OFF);
    assert!(handoff_is_refused(&gate, &state_json(&["seccompFd"]), 0));
    // Still serving: a real filter handed over afterwards is answered.
    let out = run_filtered_child(
        &gate.path(),
        &[Probe::Socket(libc::AF_INET, libc::SOCK_STREAM)],
    );
    assert_eq!(out, vec![0]);
}

#[test]
fn an_oversized_message_is_refused() {
    let gate = TestGate::start(OFF);
    let mut big = state_json(&["seccompFd"]);
    big.truncate(big.len() - 1);
    big.extend_from_slice(b", \"pad\": \"");
    big.extend(std::iter::repeat_n(b'a', MAX_MESSAGE_BYTES));
    big.extend_from_slice(b"\"}");
    let (read_end, write_end) = pipe();
    let sock = UnixStream::connect(gate.path()).unwrap();
    // The gate may close the connection before the sender is done: a failed send is fine.
    let _ = send_with_fds(&sock, &big[..64 * 1024], &[write_end.as_fd()]);
    let mut rest = &sock;
    let _ = rest.write_all(&big[64 * 1024..]);
    drop(sock);
    drop(write_end);
    assert!(closed_everywhere(&read_end));
}

#[test]
fn a_stalled_sender_is_dropped_after_the_timeout() {
    let gate = TestGate::start(OFF);
    let (read_end, write_end) = pipe();
    let mut sock = UnixStream::connect(gate.path()).unwrap();
    // Half a message and a descriptor, then silence (the connection stays open).
    send_with_fds(&sock, b"{\"fds\": [", &[write_end.as_fd()]).unwrap();
    drop(write_end);
    assert!(closed_everywhere(&read_end));
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(sock.read(&mut buf).unwrap(), 0, "the gate hung up");
}

#[test]
fn stop_is_prompt_and_idempotent_with_nothing_served() {
    let mut gate = TestGate::start(ON);
    gate.handle.stop();
    gate.handle.stop();
    assert!(gate.handle.wait_ended(Duration::ZERO));
    assert!(UnixStream::connect(gate.path()).is_err(), "listener closed");
}

// --- a real filter --------------------------------------------------------------------------

/// One call the filtered child makes.
#[derive(Clone, Copy)]
enum Probe {
    Socket(i32, i32),
    SocketWithProtocol(i32, i32, i32),
    Socketpair(i32, i32),
    /// Ask the parent to stop the gate (write 1 byte on the control pipe, wait for its answer).
    Pause,
}

#[cfg(target_arch = "x86_64")]
const RAW_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const RAW_ARCH: u32 = 0xC000_00B7;

/// arch == native && (nr == socket || nr == socketpair) -> USER_NOTIF, else ALLOW.
fn notify_program() -> Vec<libc::sock_filter> {
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: 0x15,
        jt,
        jf,
        k,
    };
    vec![
        stmt(0x20, 4),                            // 0: A = arch
        jeq(RAW_ARCH, 0, 3),                      // 1: foreign -> 5
        stmt(0x20, 0),                            // 2: A = nr
        jeq(libc::SYS_socket as u32, 2, 0),       // 3: -> 6
        jeq(libc::SYS_socketpair as u32, 1, 0),   // 4: -> 6
        stmt(0x06, libc::SECCOMP_RET_ALLOW),      // 5
        stmt(0x06, libc::SECCOMP_RET_USER_NOTIF), // 6
    ]
}

/// Fork a child that connects to the gate, installs a notify filter on socket/socketpair,
/// hands the listener over like an OCI runtime does, then runs `probes` and reports each
/// result (0 or the errno) as an i32. Everything the child does after `fork` is a raw syscall
/// on memory prepared before it (the test process has other threads).
fn run_filtered_child(gate_path: &Path, probes: &[Probe]) -> Vec<i32> {
    run_filtered_child_with(gate_path, probes, None, |_| {})
}

/// As [`run_filtered_child`]; the child first becomes `as_uid` (uid and gid) when given, and
/// `on_pause` runs at each [`Probe::Pause`].
fn run_filtered_child_with(
    gate_path: &Path,
    probes: &[Probe],
    as_uid: Option<u32>,
    mut on_pause: impl FnMut(usize),
) -> Vec<i32> {
    let program = notify_program();
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    let message = state_json(&["seccompFd"]);
    let (results_read, results_write) = pipe();
    let (control_read, control_write) = pipe();
    let (resume_read, resume_write) = pipe();
    // Connected before the filter: a socket() after it would wait on a gate that has no
    // listener yet. SO_PEERCRED records the credentials at connect time, so a child that is to
    // connect as another uid connects itself, after switching.
    let sock = match as_uid {
        None => Some(UnixStream::connect(gate_path).unwrap()),
        Some(_) => None,
    };
    let sock_fd = sock.as_ref().map_or(-1, |s| s.as_raw_fd());
    let mut addr: libc::sockaddr_un = unsafe_zeroed_sockaddr();
    let path_bytes = gate_path.as_os_str().as_encoded_bytes();
    assert!(path_bytes.len() < addr.sun_path.len());
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(path_bytes) {
        *d = *s as libc::c_char;
    }
    let (rw, cw, rr) = (
        results_write.as_raw_fd(),
        control_write.as_raw_fd(),
        resume_read.as_raw_fd(),
    );
    let probes = probes.to_vec();
    // SAFETY: fork in a test; the child only makes raw syscalls on memory prepared above and
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: (child) raw syscalls on live memory; every path ends in _exit.
        unsafe {
            let fail = |code: i32| -> ! { libc::_exit(code) };
            if let Some(uid) = as_uid {
                if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                    || libc::syscall(libc::SYS_setresgid, uid, uid, uid) != 0
                    || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
                {
                    fail(9);
                }
            }
            let mut sock_fd = sock_fd;
            if sock_fd < 0 {
                sock_fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                let sa = (&addr as *const libc::sockaddr_un).cast::<libc::sockaddr>();
                if sock_fd < 0 || libc::connect(sock_fd, sa, len) != 0 {
                    fail(8);
                }
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                fail(10);
            }
            let notify = libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                &fprog as *const libc::sock_fprog,
            ) as i32;
            if notify < 0 {
                fail(11);
            }
            // A gate that refuses this peer may close the connection before the message is
            // sent (it checks the peer's uid at accept): then the send fails, which is the
            // refusal this caller is testing, not a broken child. The send allocates nothing.
            let sent = send_with_fds(
                BorrowedFd::borrow_raw(sock_fd),
                &message,
                &[BorrowedFd::borrow_raw(notify)],
            );
            if sent.is_err() && as_uid.is_none() {
                fail(12);
            }
            libc::close(sock_fd);
            libc::close(notify);
            for probe in &probes {
                let mut pair = [-1i32; 2];
                let rc = match *probe {
                    Probe::Socket(f, t) => libc::socket(f, t, 0),
                    Probe::SocketWithProtocol(f, t, p) => libc::socket(f, t, p),
                    Probe::Socketpair(f, t) => libc::socketpair(f, t, 0, pair.as_mut_ptr()),
                    Probe::Pause => {
                        let b = 0u8;
                        libc::write(cw, (&b as *const u8).cast(), 1);
                        let mut r = 0u8;
                        libc::read(rr, (&mut r as *mut u8).cast(), 1);
                        continue;
                    }
                };
                let result: i32 = if rc < 0 { *libc::__errno_location() } else { 0 };
                if rc > 0 {
                    libc::close(rc);
                }
                for fd in pair {
                    if fd >= 0 {
                        libc::close(fd);
                    }
                }
                libc::write(rw, (&result as *const i32).cast(), 4);
            }
            libc::_exit(0);
        }
    }
    drop(sock);
    drop(results_write);
    drop(control_write);
    drop(resume_read);
    let mut results = std::fs::File::from(results_read);
    let mut control_in = std::fs::File::from(control_read);
    let mut resume_out = std::fs::File::from(resume_write);
    let mut out = Vec::new();
    let mut pauses = 0;
    for probe in &probes {
        if matches!(probe, Probe::Pause) {
            let mut b = [0u8; 1];
            control_in.read_exact(&mut b).unwrap();
            on_pause(pauses);
            pauses += 1;
            resume_out.write_all(&[1]).unwrap();
            continue;
        }
        let mut p = [libc::pollfd {
            fd: results.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd; bounded wait for the child's next answer.
        let ready = unsafe { libc::poll(p.as_mut_ptr(), 1, 30_000) };
        if ready != 1 {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let mut b = [0u8; 4];
        if results.read_exact(&mut b).is_err() {
            break;
        }
        out.push(i32::from_ne_bytes(b));
    }
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "filtered child failed: status {status:#x}"
    );
    out
}

#[test]
fn a_real_filter_is_answered_by_the_rules_and_counted_exactly() {
    let gate = TestGate::start(OFF);
    let probes = [
        Probe::Socket(libc::AF_INET, libc::SOCK_STREAM),
        Probe::Socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC),
        Probe::Socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_NONBLOCK),
        Probe::Socket(libc::AF_INET, libc::SOCK_RAW),
        Probe::SocketWithProtocol(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_ICMP),
        Probe::Socket(libc::AF_PACKET, libc::SOCK_RAW),
        Probe::Socket(libc::AF_NETLINK, libc::SOCK_RAW),
        Probe::Socket(libc::AF_VSOCK, libc::SOCK_STREAM),
        Probe::Socket(45, libc::SOCK_STREAM),
        Probe::Socket(libc::AF_UNIX, libc::SOCK_STREAM),
        Probe::Socketpair(libc::AF_UNIX, libc::SOCK_STREAM),
        Probe::Socket(libc::AF_INET, libc::SOCK_STREAM),
    ];
    let out = run_filtered_child(&gate.path(), &probes);
    let e = libc::EPERM;
    assert_eq!(out, vec![0, 0, 0, e, e, e, e, e, e, e, 0, 0]);
    let tally = gate.handle.tally();
    let want = |pairs: &[(&str, u64)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(
        tally.allowed,
        want(&[("inet", 3), ("inet6", 1), ("unix-pair", 1)])
    );
    assert_eq!(
        tally.denied,
        want(&[
            ("inet-raw", 1),
            ("inet-other", 1),
            ("packet", 1),
            ("netlink", 1),
            ("vsock", 1),
            ("family-45", 1),
            ("unix", 1),
        ])
    );
    // The child is gone and reaped: its filter reports POLLHUP and the gate ends by itself.
    assert!(gate.handle.wait_ended(Duration::from_secs(30)));
}

#[test]
fn unix_sockets_pass_when_the_rules_allow_them() {
    let gate = TestGate::start(ON);
    let out = run_filtered_child(
        &gate.path(),
        &[Probe::Socket(libc::AF_UNIX, libc::SOCK_STREAM)],
    );
    assert_eq!(out, vec![0]);
    assert_eq!(gate.handle.tally().allowed.get("unix"), Some(&1));
}

#[test]
fn a_stopped_gate_fails_the_callers_socket_calls_closed() {
    let mut gate = TestGate::start(ON);
    let path = gate.path();
    let probes = [
        Probe::Socket(libc::AF_INET, libc::SOCK_STREAM),
        Probe::Pause,
        Probe::Socket(libc::AF_INET, libc::SOCK_STREAM),
        Probe::Socketpair(libc::AF_UNIX, libc::SOCK_STREAM),
    ];
    let out = run_filtered_child_with(&path, &probes, None, |_| gate.handle.stop());
    // With no listener left the kernel answers ENOSYS: nothing gets through.
    assert_eq!(out, vec![0, libc::ENOSYS, libc::ENOSYS]);
    assert_eq!(gate.handle.tally().allowed.get("inet"), Some(&1));
}

#[test]
fn a_handoff_from_another_uid_is_refused_and_its_callers_sockets_fail_closed() {
    if h5i_sys::ids::euid() != 0 {
        h5i_testsupport::skipped!(
            "a_handoff_from_another_uid_is_refused...: needs root to switch uid"
        );
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let gate = TestGate::start(OFF);
    // Let the other uid reach the socket: only the gate's own check stands in its way.
    std::fs::set_permissions(gate.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(gate.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let probes = [
        Probe::Socket(libc::AF_INET, libc::SOCK_STREAM),
        Probe::Socket(libc::AF_PACKET, libc::SOCK_RAW),
    ];
    let out = run_filtered_child_with(&gate.path(), &probes, Some(65_534), |_| {});
    assert_eq!(out, vec![libc::ENOSYS, libc::ENOSYS]);
    assert_eq!(gate.handle.tally(), SocketGateTally::default());
}
