//! The microVM guest's `/init`: boots the box's root, then serves runs for the host.
//!
//! Boot, in order: mount `/proc`, `/sys`, `/dev`; load the kernel modules the initramfs carries
//! (`/h5i/modules.order`); mount the image's root (`/dev/vda`, ext4, read-only) under a tmpfs
//! overlay; mount `/work` and `/.h5i/spool` (9p shares of the box's workspace and spool), the
//! box's warm caches the host shared read-only, each read-only at `/.h5i/cache/<eco>`
//! ([`h5i_guest::caches`]: the command line's `h5i.caches`), a private `/tmp` and cgroup2; move the new root over `/`; bring `lo` up. Then one thread per
//! virtio-serial port named `h5i.N` serves sessions ([`h5i_guest::proto`]), one run at a time
//! per port, each port with its egress forward on the guest's loopback ([`forward`]), open only
//! while a run that may reach egress is going on it.
//!
//! A run is on pipes, or on a pty of the guest's own (`box shell`): the agent opens it in the
//! guest's devpts, the command's stdio and controlling terminal are its slave (owned by the
//! run's user), the host's window changes set its size, and once the command has exited what
//! it wrote is taken and the master closed, so a process it left holding the slave keeps
//! nothing open.
//!
//! A run's command is never pid 1 and never root: it runs as the owner of `/work` (the box's
//! identity on the host), with no capabilities and `no_new_privs`, in a cgroup of its own that
//! holds the run's `mem` and `procs` and is killed whole when the run ends, the wall clock
//! fires, a new session's Hello arrives on its port, or the host end of its port goes away (a
//! close that stays [`HOST_GONE_AFTER`] with no byte arriving: the kernel's connection notices
//! are not ordered with the bytes, so a session is never ended by a notice alone).
//!
//! Must never: run a command as root, leave a process of a finished run alive, write a frame
//! for a session other than the port's current one, or keep the VM up past its idle time with
//! no run in flight (it powers off, and the host boots it again when next asked).

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use h5i_guest::proto::{
    ExitReport, Frame, FrameBuffer, Kind, RunSpec, WinSize, PORT_PREFIX, VERSION,
};

mod forward;

/// The realtime signal each port thread takes its host-connected notices on (plus the port).
fn port_signal(index: usize) -> libc::c_int {
    libc::SIGRTMIN() + 1 + index as libc::c_int
}

fn main() {
    if std::process::id() != 1 {
        eprintln!("h5i-guest: this is the h5i microVM guest's /init, not a program to run");
        std::process::exit(2);
    }
    let idle = match boot() {
        Ok(idle) => idle,
        Err(e) => {
            eprintln!("h5i-guest: boot failed: {e}");
            power_off();
        }
    };
    serve(idle);
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))
}

fn mount(
    src: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let (s, t, f, d) = (cstr(src)?, cstr(target)?, cstr(fstype)?, cstr(data)?);
    // SAFETY: every pointer is a NUL-terminated string that lives across the call.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, d.as_ptr().cast()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("mount {fstype} on {target}: {e}"),
        ));
    }
    Ok(())
}

fn mkdir(path: &str, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
    {
        Ok(()) => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), format!("mkdir {path}: {e}"))),
    }
}

/// Load the initramfs's modules in their dependency order.
fn load_modules() -> io::Result<()> {
    let order = fs::read_to_string("/h5i/modules.order")?;
    for name in order.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let file = fs::File::open(Path::new("/h5i/modules").join(name))?;
        let empty = cstr("")?;
        // SAFETY: finit_module on an open module file with an empty parameter string.
        let rc =
            unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), empty.as_ptr(), 0) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(io::Error::new(e.kind(), format!("load module {name}: {e}")));
            }
        }
    }
    Ok(())
}

/// The first `h5i.<key>=` value on the kernel command line.
fn cmdline_value(cmdline: &str, key: &str) -> Option<u64> {
    let prefix = format!("h5i.{key}=");
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

/// Wait (bounded) for a device node the kernel is still probing.
fn wait_for(path: &str) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Path::new(path).exists() {
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{path} never appeared"),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Boot the box's root; the idle time after which the VM powers off.
fn boot() -> io::Result<Duration> {
    mount("proc", "/proc", "proc", 0, "")?;
    mount("sysfs", "/sys", "sysfs", 0, "")?;
    mount("devtmpfs", "/dev", "devtmpfs", 0, "")?;
    load_modules()?;
    let cmdline = fs::read_to_string("/proc/cmdline")?;
    let idle = Duration::from_secs(cmdline_value(&cmdline, "idle").unwrap_or(600));
    wait_for("/dev/vda")?;
    for d in ["/lower", "/rw", "/newroot"] {
        mkdir(d, 0o755)?;
    }
    mount("/dev/vda", "/lower", "ext4", libc::MS_RDONLY, "")?;
    mount(
        "rw",
        "/rw",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        "mode=0755",
    )?;
    mkdir("/rw/upper", 0o755)?;
    mkdir("/rw/work", 0o755)?;
    mount(
        "overlay",
        "/newroot",
        "overlay",
        0,
        "lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work",
    )?;
    for d in ["proc", "sys", "dev", "work", ".h5i/spool"] {
        mkdir(&format!("/newroot/{d}"), 0o755)?;
    }
    mkdir("/newroot/tmp", 0o1777)?;
    let nosuid = libc::MS_NOSUID | libc::MS_NODEV;
    mount(
        "proc",
        "/newroot/proc",
        "proc",
        nosuid | libc::MS_NOEXEC,
        "",
    )?;
    mount(
        "sysfs",
        "/newroot/sys",
        "sysfs",
        nosuid | libc::MS_NOEXEC,
        "",
    )?;
    mount("devtmpfs", "/newroot/dev", "devtmpfs", libc::MS_NOSUID, "")?;
    // The ptys of runs on a terminal: a devpts instance of the guest's own.
    mkdir("/newroot/dev/pts", 0o755)?;
    mount(
        "devpts",
        "/newroot/dev/pts",
        "devpts",
        // Not nodev: its ptmx and slaves are the devices it exists for.
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    )?;
    mount("tmp", "/newroot/tmp", "tmpfs", nosuid, "mode=1777")?;
    let ninep = "trans=virtio,version=9p2000.L,msize=262144,cache=none";
    mount("work", "/newroot/work", "9p", nosuid, ninep)?;
    mount("spool", "/newroot/.h5i/spool", "9p", nosuid, ninep)?;
    // Read-only in the guest's kernel too (QEMU already refuses a write to the share), so a
    // write fails here with EROFS before it reaches the host.
    for eco in h5i_guest::caches::from_cmdline(&cmdline)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
    {
        let at = format!("/newroot{}", h5i_guest::caches::inside(&eco));
        mkdir(&at, 0o755)?;
        mount(
            &h5i_guest::caches::tag(&eco),
            &at,
            "9p",
            nosuid | libc::MS_RDONLY,
            ninep,
        )?;
    }
    mount(
        "cgroup2",
        "/newroot/sys/fs/cgroup",
        "cgroup2",
        nosuid | libc::MS_NOEXEC,
        "",
    )?;
    std::env::set_current_dir("/newroot")?;
    mount(".", "/", "", libc::MS_MOVE, "")?;
    let dot = cstr(".")?;
    // SAFETY: chroot(2) to the current directory, a NUL-terminated string.
    if unsafe { libc::chroot(dot.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    std::env::set_current_dir("/")?;
    fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+memory +pids")?;
    // The guest has no network device; its loopback carries the runs' egress forwards.
    h5i_guest::loopback::up()?;
    let name = b"h5i-box";
    // SAFETY: sethostname with a buffer and its length.
    unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    Ok(idle)
}

fn power_off() -> ! {
    // SAFETY: sync and reboot(2) take no pointers. QEMU runs with -no-reboot, so a restart
    // ends the VM, which is what the host expects of a guest that is done.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_AUTOBOOT);
    }
    std::process::exit(1)
}

/// What the reaper knows: exits of children not yet claimed, and who waits for which pid.
#[derive(Default)]
struct Reaped {
    exits: HashMap<i32, i32>,
    watchers: HashMap<i32, RawFd>,
}

/// State shared by the port threads, the reaper and the idle watchdog.
struct Shared {
    reaped: Mutex<Reaped>,
    /// Runs in flight, and when the last one ended.
    busy: Mutex<(usize, Instant)>,
    idle_changed: Condvar,
    /// The uid and gid commands run as: the owner of `/work`.
    owner: (u32, u32),
}

fn serve(idle: Duration) -> ! {
    // SIGCHLD and every port's signal are taken synchronously, by the threads that wait for
    // them: blocked here, before any thread exists, so every thread inherits the mask.
    let mut ports = find_ports();
    ports.sort();
    // SAFETY: sigset manipulation on a local set, then sigprocmask of this (only) thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for (i, _) in ports.iter().enumerate() {
            libc::sigaddset(&mut set, port_signal(i));
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let owner = match fs::metadata("/work") {
        Ok(m) if m.uid() != 0 => (m.uid(), m.gid()),
        Ok(_) => {
            eprintln!("h5i-guest: /work is owned by uid 0; refusing to run commands as root");
            power_off();
        }
        Err(e) => {
            eprintln!("h5i-guest: /work: {e}");
            power_off();
        }
    };
    let shared = Arc::new(Shared {
        reaped: Mutex::new(Reaped::default()),
        busy: Mutex::new((0, Instant::now())),
        idle_changed: Condvar::new(),
        owner,
    });
    {
        let shared = shared.clone();
        std::thread::spawn(move || reap(&shared));
    }
    for (i, (_, dev)) in ports.into_iter().enumerate() {
        let shared = shared.clone();
        std::thread::spawn(move || {
            if let Err(e) = serve_port(i, &dev, &shared) {
                eprintln!("h5i-guest: port {}: {e}", dev.display());
            }
        });
    }
    let mut busy = shared.busy.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let (runs, since) = *busy;
        if runs == 0 && since.elapsed() >= idle {
            drop(busy);
            power_off();
        }
        let left = idle
            .saturating_sub(since.elapsed())
            .max(Duration::from_millis(100));
        busy = match shared.idle_changed.wait_timeout(busy, left) {
            Ok((b, _)) => b,
            Err(p) => p.into_inner().0,
        };
    }
}

/// The ports named `h5i.N`: (N, device node).
fn find_ports() -> Vec<(usize, PathBuf)> {
    let Ok(entries) = fs::read_dir("/sys/class/virtio-ports") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = fs::read_to_string(e.path().join("name")).ok()?;
            let n = name.trim().strip_prefix(PORT_PREFIX)?.parse().ok()?;
            Some((n, Path::new("/dev").join(e.file_name())))
        })
        .collect()
}

/// Reap every child (run commands and the orphans they leave to pid 1), handing each exit to
/// the port thread watching that pid.
fn reap(shared: &Shared) {
    loop {
        // SAFETY: sigwaitinfo on a set holding SIGCHLD, blocked in every thread.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            libc::sigwaitinfo(&set, std::ptr::null_mut());
        }
        // The table is held across the waits: a spawn holds it too, so a child whose exec
        // failed is waited for by the spawn itself (std reads the error, then waits for that
        // pid, and must find it), never reaped here first.
        let mut r = shared.reaped.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let mut status = 0;
            // SAFETY: waitpid on any child, without blocking, into a local.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if let Some(fd) = r.watchers.remove(&pid) {
                r.exits.insert(pid, status);
                let one = 1u64.to_ne_bytes();
                // SAFETY: write of 8 bytes to the watcher's eventfd, which it keeps open until
                // it has claimed this exit.
                unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
            }
        }
    }
}

/// One run in flight on a port.
struct Running {
    pid: i32,
    cgroup: PathBuf,
    exited: OwnedFd,
    status: Option<i32>,
    stdin: Option<OwnedFd>,
    stdin_pending: Vec<u8>,
    stdin_eof: bool,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    /// The master of the run's pty (a run on a terminal): its stdout and stdin are copies.
    pty: Option<OwnedFd>,
    mem_limit: u64,
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl flag changes on a descriptor the caller owns.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// Ask the kernel to signal this thread with `sig` when the host end of `port` opens or closes.
fn notify_on_host_change(port: RawFd, sig: libc::c_int) -> io::Result<()> {
    #[repr(C)]
    struct FOwnerEx {
        kind: libc::c_int,
        pid: libc::pid_t,
    }
    // <asm-generic/fcntl.h>; libc does not name these for musl.
    const F_OWNER_TID: libc::c_int = 0;
    const F_SETSIG: libc::c_int = 10;
    const F_SETOWN_EX: libc::c_int = 15;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
    let owner = FOwnerEx {
        kind: F_OWNER_TID,
        pid: tid,
    };
    // SAFETY: fcntl on the port with a pointer to a local f_owner_ex that outlives the call.
    let ok = unsafe {
        libc::fcntl(port, F_SETOWN_EX, &owner as *const FOwnerEx) == 0
            && libc::fcntl(port, F_SETSIG, sig) == 0
            && libc::fcntl(port, libc::F_SETFL, libc::O_NONBLOCK | libc::O_ASYNC) == 0
    };
    match ok {
        true => Ok(()),
        false => Err(io::Error::last_os_error()),
    }
}

/// How long the host end of a port must stay closed, with no byte arriving, before its session
/// is over (its run killed, its queued output and any partial frame dropped).
///
/// The guest kernel learns of a connection's open and close on virtio-serial's control queue,
/// apart from the data queue, and handles the two at different times: the close of the previous
/// connection, or the open of the next one, can be seen after the next connection's first bytes
/// arrived. So "the host end is closed" is a fact about the notices handled so far, not about
/// the stream: it never ends a session by itself, and output for a host the port calls closed
/// is held, never dropped. A close that is the previous connection's is followed by the next
/// one's open, which the kernel already holds (QEMU sends it before that connection's bytes):
/// it is undone as soon as the kernel's control work runs. Only a close that stays, with no
/// byte arriving, is a host gone.
const HOST_GONE_AFTER: Duration = Duration::from_secs(5);

/// How many bytes of output a port holds for its host before the run's pipes are left unread
/// (the run then blocks on its own writes, as it would on a slow terminal).
const OUTBOX_HIGH: usize = 1 << 20;

/// A signalfd of this thread's port signal (blocked in every thread since `serve`).
fn port_notices(sig: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: sigset manipulation on a local set, then signalfd(2) making a new descriptor
    // that is owned right away.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Take every queued notice off `notices` (each only says "look at the port again").
fn drain_notices(notices: &OwnedFd) {
    let mut sink = [0u8; 128 * 16];
    // SAFETY: read into a local buffer from a non-blocking signalfd this thread owns.
    while unsafe { libc::read(notices.as_raw_fd(), sink.as_mut_ptr().cast(), sink.len()) } > 0 {}
}

/// What the port says right now: readable, and whether its host end is closed (as far as the
/// notices the kernel has handled go).
struct PortState {
    readable: bool,
    closed: bool,
}

fn port_state(port: &fs::File) -> PortState {
    let mut p = libc::pollfd {
        fd: port.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: a zero-timeout poll on one local pollfd.
    unsafe { libc::poll(&mut p, 1, 0) };
    PortState {
        readable: p.revents & libc::POLLIN != 0,
        closed: p.revents & libc::POLLHUP != 0,
    }
}

/// Whole frames for the host, written as the port takes them.
#[derive(Default)]
pub(crate) struct Outbox {
    bytes: Vec<u8>,
}

impl Outbox {
    /// Queue `payload` as frames of `kind` in `session` (an empty payload is still one frame).
    pub(crate) fn push(&mut self, kind: Kind, session: u32, payload: &[u8]) {
        for chunk in payload
            .chunks(h5i_guest::proto::MAX_PAYLOAD)
            .chain(payload.is_empty().then_some(&[][..]))
        {
            self.bytes
                .extend(Frame::new(kind, session, chunk.to_vec()).encode());
        }
    }

    /// Drop everything queued (a new session began, or the host is gone). A frame cut short
    /// here leaves the host a tail it skips: it reads nothing before its own session's Ready.
    fn clear(&mut self) {
        self.bytes.clear();
    }

    /// Write what the port takes now, without blocking.
    fn flush(&mut self, mut port: &fs::File) {
        while !self.bytes.is_empty() {
            match port.write(&self.bytes) {
                Ok(0) => return,
                Ok(n) => {
                    self.bytes.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

fn serve_port(index: usize, dev: &Path, shared: &Shared) -> io::Result<()> {
    let mut port = fs::OpenOptions::new().read(true).write(true).open(dev)?;
    let sig = port_signal(index);
    let notices = port_notices(sig)?;
    notify_on_host_change(port.as_raw_fd(), sig)?;
    let mut forward = forward::Forward::bind(index)?;
    let mut frames = FrameBuffer::default();
    let mut session: Option<u32> = None;
    let mut run: Option<Running> = None;
    let mut outbox = Outbox::default();
    // Since when the port has said its host end is closed with no byte arriving.
    let mut closed_since: Option<Instant> = None;
    let mut buf = vec![0u8; 64 << 10];
    let mut runs = 0u64;
    loop {
        drain_notices(&notices);
        let state = port_state(&port);
        if !state.closed {
            closed_since = None;
        } else if closed_since.is_none() {
            closed_since = Some(Instant::now());
        }
        if state.readable {
            match port.read(&mut buf) {
                // Bytes are a host's, whatever the notices say so far.
                Ok(n) if n > 0 => {
                    frames.extend(&buf[..n]);
                    if closed_since.is_some() {
                        closed_since = Some(Instant::now());
                    }
                }
                // 0: nothing to read and the host end closed, which the state already says.
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
            loop {
                let frame = match frames.next_frame() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(_) => {
                        // A stream the agent cannot parse: drop it and wait for a Hello.
                        frames = FrameBuffer::default();
                        session = None;
                        break;
                    }
                };
                if frame.kind == Kind::Hello {
                    if let Some(r) = run.take() {
                        finish(r, shared, None);
                    }
                    outbox.clear();
                    session = Some(frame.session);
                    outbox.push(Kind::Ready, frame.session, VERSION.as_bytes());
                    continue;
                }
                let Some(s) = session.filter(|s| *s == frame.session) else {
                    continue;
                };
                match frame.kind {
                    Kind::Run if run.is_none() => {
                        runs += 1;
                        let spec = RunSpec::decode(&frame.payload);
                        let egress = spec.as_ref().is_ok_and(|spec| spec.egress);
                        match spec.and_then(|spec| start(&spec, shared, index, runs)) {
                            Ok(r) => {
                                let mut b = shared.busy.lock().unwrap_or_else(|p| p.into_inner());
                                b.0 += 1;
                                run = Some(r);
                                if egress {
                                    forward.open();
                                }
                            }
                            Err(e) => outbox.push(Kind::Failed, s, e.to_string().as_bytes()),
                        }
                    }
                    Kind::Run => {
                        outbox.push(Kind::Failed, s, b"a run is already going on this port")
                    }
                    Kind::Stdin => {
                        if let Some(r) = run.as_mut() {
                            r.stdin_pending.extend_from_slice(&frame.payload);
                        }
                    }
                    Kind::StdinEof => {
                        if let Some(r) = run.as_mut() {
                            r.stdin_eof = true;
                        }
                    }
                    Kind::Resize => {
                        let size = WinSize::decode(&frame.payload);
                        if let (Some(m), Ok(w)) = (run.as_ref().and_then(|r| r.pty.as_ref()), size)
                        {
                            set_window(m.as_raw_fd(), w);
                        }
                    }
                    Kind::Kill => {
                        if let Some(r) = &run {
                            let _ = fs::write(r.cgroup.join("cgroup.kill"), "1");
                        }
                    }
                    Kind::NetToGuest | Kind::NetCloseToGuest => forward.take_host_frame(&frame),
                    _ => {}
                }
            }
        }
        if let Some(r) = run.as_mut() {
            let s = session.unwrap_or(0);
            for (i, kind) in [(0, Kind::Stdout), (1, Kind::Stderr)] {
                if outbox.bytes.len() >= OUTBOX_HIGH {
                    break;
                }
                let pipe = if i == 0 { &mut r.stdout } else { &mut r.stderr };
                if let Some(fd) = pipe {
                    // SAFETY: read into a local buffer from the run's own non-blocking pipe.
                    let got =
                        unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    let err = io::Error::last_os_error().kind();
                    if got > 0 {
                        outbox.push(kind, s, &buf[..got as usize]);
                    } else if got == 0
                        || !matches!(err, io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
                    {
                        // The end of a pipe, or EIO from a pty whose slave every holder closed.
                        *pipe = None;
                    }
                }
            }
            if let Some(fd) = r.stdin.as_ref().filter(|_| !r.stdin_pending.is_empty()) {
                // SAFETY: write from the pending buffer to the run's stdin pipe (non-blocking).
                let put = unsafe {
                    libc::write(
                        fd.as_raw_fd(),
                        r.stdin_pending.as_ptr().cast(),
                        r.stdin_pending.len(),
                    )
                };
                if put > 0 {
                    r.stdin_pending.drain(..put as usize);
                } else if put < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EPIPE)
                {
                    r.stdin = None;
                    r.stdin_pending.clear();
                }
            }
            if r.stdin_eof && r.stdin_pending.is_empty() {
                r.stdin = None;
            }
            if r.status.is_none() {
                let mut r8 = [0u8; 8];
                // SAFETY: read of the non-blocking eventfd's 8-byte counter into a local.
                if unsafe { libc::read(r.exited.as_raw_fd(), r8.as_mut_ptr().cast(), 8) } == 8 {
                    let mut reaped = shared.reaped.lock().unwrap_or_else(|p| p.into_inner());
                    r.status = reaped.exits.remove(&r.pid);
                }
            }
            // On a pty the run is over when its command is: what it wrote is taken now, and a
            // process it left holding the slave keeps nothing open (its cgroup is killed next).
            if r.status.is_some() && r.pty.is_some() {
                if let Some(m) = r.stdout.take() {
                    drain_pty(&m, s, &mut outbox, &mut buf);
                }
            }
            if r.status.is_some() && r.stdout.is_none() && r.stderr.is_none() {
                if let Some(r) = run.take() {
                    finish(r, shared, Some((s, &mut outbox, &port)));
                }
            }
        }
        if run.is_none() {
            forward.close();
        }
        let reading = outbox.bytes.len() < OUTBOX_HIGH;
        forward.pump(session, &mut outbox, reading, &mut buf);
        outbox.flush(&port);
        // The host end has stayed closed with nothing arriving: its session is over.
        let live =
            run.is_some() || session.is_some() || !outbox.bytes.is_empty() || !frames.is_empty();
        let gone_at = closed_since.filter(|_| live).map(|t| t + HOST_GONE_AFTER);
        if gone_at.is_some_and(|at| Instant::now() >= at) {
            if let Some(r) = run.take() {
                finish(r, shared, None);
            }
            session = None;
            frames = FrameBuffer::default();
            outbox.clear();
            continue;
        }
        wait(
            &port,
            &notices,
            run.as_ref(),
            &outbox,
            &forward,
            closed_since.is_some(),
            gone_at,
        );
    }
}

/// Sleep until something on the port or the run may have changed: the port turns readable or
/// writable (while its host end is open: a closed one would wake `poll` at once, so then only
/// its notices count), a notice arrives, a run's pipe or exit is ready, the forward has a
/// connection or bytes to move, or `gone_at` (when a session's host end has stayed closed for
/// [`HOST_GONE_AFTER`]) comes.
fn wait(
    port: &fs::File,
    notices: &OwnedFd,
    run: Option<&Running>,
    outbox: &Outbox,
    forward: &forward::Forward,
    closed: bool,
    gone_at: Option<Instant>,
) {
    let mut fds = vec![libc::pollfd {
        fd: notices.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    if !closed {
        let write = if outbox.bytes.is_empty() {
            0
        } else {
            libc::POLLOUT
        };
        fds.push(libc::pollfd {
            fd: port.as_raw_fd(),
            events: libc::POLLIN | write,
            revents: 0,
        });
    }
    if let Some(r) = run {
        let reading = outbox.bytes.len() < OUTBOX_HIGH;
        let pipes = [&r.stdout, &r.stderr]
            .into_iter()
            .filter(|_| reading)
            .flatten()
            .map(|fd| (fd.as_raw_fd(), libc::POLLIN));
        let exit = (r.status.is_none()).then_some((r.exited.as_raw_fd(), libc::POLLIN));
        let stdin = r
            .stdin
            .as_ref()
            .filter(|_| !r.stdin_pending.is_empty())
            .map(|fd| (fd.as_raw_fd(), libc::POLLOUT));
        for (fd, events) in pipes.chain(exit).chain(stdin) {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    for (fd, events) in forward.poll_fds(outbox.bytes.len() < OUTBOX_HIGH) {
        fds.push(libc::pollfd {
            fd,
            events,
            revents: 0,
        });
    }
    let timeout = match gone_at {
        Some(at) => at
            .saturating_duration_since(Instant::now())
            .as_millis()
            .clamp(1, i32::MAX as u128) as libc::c_int,
        None => -1,
    };
    // SAFETY: poll over a local array of pollfds with its length.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
}

/// Start `spec` as the owner of `/work`, in a cgroup of its own.
fn start(spec: &RunSpec, shared: &Shared, port: usize, n: u64) -> io::Result<Running> {
    let cgroup = PathBuf::from(format!("/sys/fs/cgroup/run-{port}-{n}"));
    match fs::create_dir(&cgroup) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if spec.mem_bytes > 0 {
        fs::write(cgroup.join("memory.max"), spec.mem_bytes.to_string())?;
        fs::write(cgroup.join("memory.swap.max"), "0").ok();
    }
    if spec.procs > 0 {
        fs::write(cgroup.join("pids.max"), spec.procs.to_string())?;
    }
    let procs = fs::OpenOptions::new()
        .write(true)
        .open(cgroup.join("cgroup.procs"))?;
    let procs_fd = procs.as_raw_fd();
    let (uid, gid) = shared.owner;
    let pty = spec.pty.map(|w| open_pty(w, (uid, gid))).transpose()?;
    let mut cmd = Command::new(OsStr::from_bytes(&spec.argv[0]));
    cmd.args(spec.argv[1..].iter().map(|a| OsStr::from_bytes(a)))
        .env_clear()
        .current_dir(OsStr::from_bytes(&spec.cwd));
    match &pty {
        Some((_, slave)) => {
            cmd.stdin(slave.try_clone()?)
                .stdout(slave.try_clone()?)
                .stderr(slave.try_clone()?);
        }
        None => {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
        }
    }
    let on_pty = pty.is_some();
    for kv in &spec.env {
        if let Some(i) = kv.iter().position(|&c| c == b'=') {
            cmd.env(OsStr::from_bytes(&kv[..i]), OsStr::from_bytes(&kv[i + 1..]));
        }
    }
    // SAFETY: the closure only makes async-signal-safe syscalls (setsid, ioctl, write,
    // setgroups, setgid, setuid, prctl, sigprocmask) in the forked child before exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::setsid();
            // On a pty, its slave (already the child's stdio) becomes the session's terminal.
            if on_pty && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::write(procs_fd, b"0\n".as_ptr().cast(), 2) != 2
                || libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
                || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // SAFETY: eventfd(2) makes a new descriptor, owned right away.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if efd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: efd is a fresh descriptor nothing else owns.
    let exited = unsafe { OwnedFd::from_raw_fd(efd) };
    // Spawned with the reaper's table held, so the exit cannot be reaped before it is watched.
    let mut reaped = shared.reaped.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            drop(reaped);
            let _ = fs::remove_dir(&cgroup);
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot start `{}`: {e}",
                    String::from_utf8_lossy(&spec.argv[0])
                ),
            ));
        }
    };
    let pid = child.id() as i32;
    reaped.watchers.insert(pid, exited.as_raw_fd());
    drop(reaped);
    drop(procs);
    drop(cmd);
    let take = |fd: Option<OwnedFd>| fd.inspect(|f| set_nonblocking(f.as_raw_fd()));
    let (stdin, stdout, stderr, master) = match pty {
        // The slave's last copy in the agent closes here: only the run holds it now, so the
        // master reads EIO once every process of the run let go of it.
        Some((master, _slave)) => {
            set_nonblocking(master.as_raw_fd());
            (
                Some(master.try_clone()?),
                Some(master.try_clone()?),
                None,
                Some(master),
            )
        }
        None => (
            take(child.stdin.take().map(OwnedFd::from)),
            take(child.stdout.take().map(OwnedFd::from)),
            take(child.stderr.take().map(OwnedFd::from)),
            None,
        ),
    };
    Ok(Running {
        pid,
        cgroup,
        exited,
        status: None,
        stdin,
        stdin_pending: Vec::new(),
        stdin_eof: false,
        stdout,
        stderr,
        pty: master,
        mem_limit: spec.mem_bytes,
    })
}

/// A pty pair in the guest's devpts for a run on a terminal of `size`: the master (the
/// agent's, close-on-exec) and its slave, owned by `owner` (the run's user), both opened
/// without making either the agent's controlling terminal.
fn open_pty(size: WinSize, owner: (u32, u32)) -> io::Result<(OwnedFd, OwnedFd)> {
    let ptmx = cstr("/dev/pts/ptmx")?;
    // SAFETY: open(2) of a NUL-terminated path; the descriptor is owned right away.
    let fd = unsafe {
        libc::open(
            ptmx.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("open /dev/pts/ptmx: {e}")));
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int that lives for the call; TIOCGPTPEER opens the slave
    // of this very master (no path lookup) and returns a new descriptor, owned right away.
    let slave = unsafe {
        if libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) != 0 {
            return Err(io::Error::last_os_error());
        }
        let peer = libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if peer < 0 {
            return Err(io::Error::last_os_error());
        }
        OwnedFd::from_raw_fd(peer)
    };
    // SAFETY: fchown of a descriptor this function owns.
    if unsafe { libc::fchown(slave.as_raw_fd(), owner.0, owner.1) } != 0 {
        return Err(io::Error::last_os_error());
    }
    set_window(master.as_raw_fd(), size);
    Ok((master, slave))
}

/// Set the window of the pty behind `master`; the kernel signals the run's foreground job.
fn set_window(master: RawFd, size: WinSize) {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize that lives for the call; a failure leaves the old
    // size.
    unsafe { libc::ioctl(master, libc::TIOCSWINSZ, &ws) };
}

/// The most a finished run's pty gives up once its command has exited.
const DRAIN_MAX: usize = 4 << 20;

/// Take what a finished run wrote to its pty (bounded by [`DRAIN_MAX`]) as output of session
/// `s`.
fn drain_pty(master: &OwnedFd, s: u32, outbox: &mut Outbox, buf: &mut [u8]) {
    let mut taken = 0;
    while taken < DRAIN_MAX {
        // SAFETY: read into the caller's buffer from the non-blocking master.
        let got = unsafe { libc::read(master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if got <= 0 {
            return;
        }
        outbox.push(Kind::Stdout, s, &buf[..got as usize]);
        taken += got as usize;
    }
}

/// A number from a cgroup file's `key value` line (or the whole file when `key` is empty).
fn cgroup_value(cgroup: &Path, file: &str, key: &str) -> u64 {
    let text = fs::read_to_string(cgroup.join(file)).unwrap_or_default();
    if key.is_empty() {
        return text.trim().parse().unwrap_or(0);
    }
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// End a run: kill what is left of it, wait for its main process, report its exit to its
/// session (`to`: the session, its outbox and port; none when the host went away or a new
/// session replaced it), and remove its cgroup.
fn finish(mut r: Running, shared: &Shared, to: Option<(u32, &mut Outbox, &fs::File)>) {
    let _ = fs::write(r.cgroup.join("cgroup.kill"), "1");
    r.stdin = None;
    r.stdout = None;
    r.stderr = None;
    while r.status.is_none() {
        let mut p = libc::pollfd {
            fd: r.exited.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one local pollfd (the run's exit eventfd).
        unsafe { libc::poll(&mut p, 1, 1000) };
        let mut reaped = shared.reaped.lock().unwrap_or_else(|p| p.into_inner());
        r.status = reaped.exits.remove(&r.pid);
    }
    let status = r.status.unwrap_or(0);
    let oom_kills = cgroup_value(&r.cgroup, "memory.events", "oom_kill");
    let report = ExitReport {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        oom_kills,
        mem_limit: r.mem_limit,
        mem_peak: cgroup_value(&r.cgroup, "memory.peak", ""),
        user_us: cgroup_value(&r.cgroup, "cpu.stat", "user_usec"),
        sys_us: cgroup_value(&r.cgroup, "cpu.stat", "system_usec"),
    };
    if let Some((s, outbox, port)) = to {
        outbox.push(Kind::Exit, s, &report.encode());
        outbox.flush(port);
    }
    // The killed processes leave the group as the reaper collects them: wait (bounded) for
    // `populated 0`, then remove it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while cgroup_value(&r.cgroup, "cgroup.events", "populated") != 0 && Instant::now() < deadline {
        if let Ok(mut events) = fs::File::open(r.cgroup.join("cgroup.events")) {
            let mut sink = String::new();
            let _ = events.read_to_string(&mut sink);
            let mut p = libc::pollfd {
                fd: events.as_raw_fd(),
                events: libc::POLLPRI,
                revents: 0,
            };
            // SAFETY: poll on one local pollfd: cgroup.events signals POLLPRI on a change.
            unsafe { libc::poll(&mut p, 1, 200) };
        }
    }
    let _ = fs::remove_dir(&r.cgroup);
    let mut b = shared.busy.lock().unwrap_or_else(|p| p.into_inner());
    b.0 = b.0.saturating_sub(1);
    b.1 = Instant::now();
    shared.idle_changed.notify_all();
}
