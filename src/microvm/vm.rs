//! The box's VM: one QEMU `-M microvm` process per box, booted by the first run and kept for
//! the box's life (until `abort`/`rm`, or until the guest powers itself off after
//! [`IDLE_SECS`] without a run), so a run pays a connection, not a boot.
//!
//! Owns the VM directory (`<runtime dir>/microvm-<hash of the box directory>`, 0700, the
//! caller's): `state.json` (QEMU's pid and start time, the digest of what it was booted from),
//! `lock` (exclusive to boot or tear down, shared while a run uses the VM), `port-N.sock` (the
//! listeners QEMU serves the guest agent's ports on; h5i binds them here and hands QEMU the
//! descriptors, so QEMU needs no path of its own), `port-N.lock` (one run per port),
//! `initramfs.cpio` and `console.log` (the guest kernel's console and QEMU's own stderr).
//!
//! QEMU runs as the box's identity (the caller, or `h5i-box`'s range when h5i is root), never
//! as root, with QEMU's own seccomp sandbox on, no network device, every host object it needs
//! (kernel, initramfs, root image, the workspace and spool directories, the current key's
//! directory of each warm cache, read-only, the listeners) passed
//! as an inherited descriptor, under a Landlock ruleset that lets it open nothing of the host
//! but its programs and those objects, in a cgroup of its own holding its memory and threads
//! ([`super::confine`]).
//!
//! Must never: serve a run from a VM booted from another configuration, let a VM outlive its
//! box's `rm`, or kill a process it did not start (a pid is checked against its start time).

use std::io::Write as _;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use h5i_guest::proto::PORTS;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::accel::Accel;
use crate::error::BoxError;
use crate::file_lock::{FileLock, LockKind};
use crate::store::StoredBox;

/// How long an idle guest waits for the next run before it powers off.
pub const IDLE_SECS: u64 = 600;

/// How long a boot may take before it is called failed (software emulation on a busy host is
/// slow; the measured boot is seconds).
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// What `state.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VmState {
    /// QEMU's pid.
    pub pid: i32,
    /// Its start time (field 22 of `/proc/<pid>/stat`), so a reused pid is never taken for it.
    pub start_time: u64,
    /// Digest of the configuration it was booted from.
    pub digest: String,
    /// How it runs (`kvm` or `tcg`).
    pub accel: String,
    /// When it booted (ms since the epoch).
    pub booted_ms: u64,
    /// How long the boot took, to the guest agent's first answer (ms).
    pub boot_ms: u64,
}

/// One warm cache the VM is booted with: the current key's data directory, shared read-only
/// (QEMU's `readonly=on`) with the tag `cache-<eco>` and mounted read-only by the guest at
/// `/.h5i/cache/<eco>` ([`h5i_guest::caches`]).
#[derive(Debug, Clone)]
pub struct CacheShare {
    /// The ecosystem (a plain name: [`h5i_guest::caches::is_name`]).
    pub eco: String,
    /// The cache's data directory on the host (its path names the key).
    pub data: PathBuf,
    /// The directory's device and inode when the plan was made: a refresh that replaced the
    /// entry under the same key makes another directory, and so another boot.
    pub identity: (u64, u64),
}

/// Everything a boot is made from.
pub struct BootPlan {
    /// The kernel QEMU loads (an uncompressed `vmlinux`, else the package's `vmlinuz`).
    pub kernel: PathBuf,
    /// The initramfs bytes (agent + modules).
    pub initramfs: Vec<u8>,
    /// The guest's root image.
    pub root_image: PathBuf,
    /// The box's workspace (`/work`) and spool (`/.h5i/spool`).
    pub work: PathBuf,
    /// The spool.
    pub spool: PathBuf,
    /// The box's warm caches for this boot, each shared read-only.
    pub caches: Vec<CacheShare>,
    /// Guest RAM, MiB.
    pub ram_mib: u64,
    /// Virtual CPUs.
    pub cpus: usize,
    /// KVM or software emulation.
    pub accel: Accel,
    /// The uid and gid QEMU runs as (`None`: the caller's own).
    pub run_as: Option<(u32, u32)>,
    /// Idle seconds before the guest powers off.
    pub idle_secs: u64,
}

impl BootPlan {
    /// The digest a running VM is compared against.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(&self.initramfs);
        h.update(
            format!(
                "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{:?}\n{}",
                self.kernel.display(),
                self.root_image.display(),
                self.work.display(),
                self.spool.display(),
                self.ram_mib,
                self.cpus,
                self.accel.name(),
                self.run_as,
                self.idle_secs
            )
            .as_bytes(),
        );
        // The caches' keys (in their paths) and directories: a lockfile change, a refresh or a
        // `cache rm` boots the VM again, so a share the guest holds is always the current key's.
        for c in &self.caches {
            h.update(
                format!(
                    "\ncache {} {} {}:{}",
                    c.eco,
                    c.data.display(),
                    c.identity.0,
                    c.identity.1
                )
                .as_bytes(),
            );
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The VM directory of `sb` (not created).
pub fn dir_for(sb: &StoredBox) -> Result<PathBuf, BoxError> {
    let hash = Sha256::digest(sb.paths.dir.as_os_str().as_encoded_bytes());
    let short: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Ok(crate::tier_host::runtime_dir()?.join(format!("microvm-{short}")))
}

/// The name of the cgroup QEMU of the VM in `dir` runs in (the directory's own name).
fn cage_id(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The exclusive lock of the VM directory `dir`.
fn take_lock(dir: &Path) -> Result<FileLock, BoxError> {
    let path = dir.join("lock");
    FileLock::wait(&path, LockKind::Exclusive).map_err(|e| BoxError::io(&path, e))
}

/// A VM that is up, held shared for one run.
pub struct Vm {
    /// Its directory.
    pub dir: PathBuf,
    /// Its state.
    pub state: VmState,
    /// Whether this run booted it.
    pub booted_now: bool,
    _lock: FileLock,
}

impl Vm {
    /// The listener path of port `i`.
    pub fn port_socket(&self, i: usize) -> PathBuf {
        self.dir.join(format!("port-{i}.sock"))
    }

    /// The guest console log.
    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }
}

fn read_state(dir: &Path) -> Option<VmState> {
    serde_json::from_slice(&std::fs::read(dir.join("state.json")).ok()?).ok()
}

/// Field 22 of `/proc/<pid>/stat`: the start time of a process that is still running (`None`
/// for a zombie or a dead one: a killed QEMU nobody has reaped yet serves nothing).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let mut fields = after.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the QEMU `state` names is still the process h5i started.
fn alive(state: &VmState) -> bool {
    state.pid > 0 && start_time(state.pid) == Some(state.start_time)
}

/// The state of the box's VM, when one is up.
pub fn status(sb: &StoredBox) -> Option<VmState> {
    let dir = dir_for(sb).ok()?;
    read_state(&dir).filter(alive)
}

/// The box's VM, booted from `plan` (when it is down, or was booted from another plan).
pub fn ensure(
    sb: &StoredBox,
    plan: impl FnOnce() -> Result<BootPlan, BoxError>,
) -> Result<Vm, BoxError> {
    let dir = dir_for(sb)?;
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(BoxError::io(&dir, e)),
    }
    let lock = take_lock(&dir)?;
    let plan = plan()?;
    let digest = plan.digest();
    let current = read_state(&dir).filter(alive);
    let (state, booted_now) = match current {
        Some(s) if s.digest == digest => (s, false),
        other => {
            if let Some(old) = other {
                kill(&old);
            }
            (boot(&dir, &plan, digest)?, true)
        }
    };
    lock.downgrade().map_err(|e| BoxError::io(&dir, e))?;
    Ok(Vm {
        dir,
        state,
        booted_now,
        _lock: lock,
    })
}

/// Kill the QEMU `state` names (when it is still that process) and wait for it to go.
fn kill(state: &VmState) {
    if !alive(state) {
        return;
    }
    let Ok(pidfd) = h5i_sys::pidfd::open(state.pid) else {
        return;
    };
    // Re-identified after opening: the pidfd is the checked process's, never a reused pid's.
    if start_time(state.pid) != Some(state.start_time) {
        return;
    }
    let _ = h5i_sys::pidfd::kill(&pidfd);
    let _ = h5i_sys::pidfd::wait_exited(&pidfd, Duration::from_secs(10));
}

/// Stop the box's VM and remove its directory (`abort`, `rm`). Waits for runs in flight.
pub fn teardown(sb: &StoredBox) -> Result<(), BoxError> {
    let dir = dir_for(sb)?;
    if !dir.is_dir() {
        return Ok(());
    }
    let lock = take_lock(&dir)?;
    if let Some(state) = read_state(&dir) {
        kill(&state);
    }
    super::confine::remove(&cage_id(&dir));
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    drop(lock);
    let _ = std::fs::remove_file(dir.join("lock"));
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

/// Open `path` read-only (a directory too) for QEMU to inherit.
fn open_for_qemu(path: &Path, dir: bool) -> Result<OwnedFd, BoxError> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if dir {
        o.custom_flags(libc::O_DIRECTORY);
    }
    o.open(path)
        .map(OwnedFd::from)
        .map_err(|e| BoxError::io(path, e))
}

fn boot_failed(what: String, console: &Path) -> BoxError {
    let tail = std::fs::read_to_string(console)
        .map(|t| {
            // The guest wrote it: shown with its control characters escaped.
            let lines: Vec<String> = t
                .lines()
                .rev()
                .take(8)
                .map(crate::escape::escape_controls)
                .collect();
            lines.into_iter().rev().collect::<Vec<_>>().join("\n  ")
        })
        .unwrap_or_default();
    BoxError::BadRequest {
        what: format!("{what}; the guest console ({}) ends:\n  {tail}", console.display()),
        mend: "check `h5i box probe` (qemu-system-x86, the guest kernel and h5i-guest), then run again".into(),
    }
}

/// Boot a VM from `plan` in `dir` and wait for its guest agent's first answer.
fn boot(dir: &Path, plan: &BootPlan, digest: String) -> Result<VmState, BoxError> {
    for i in 0..PORTS {
        let _ = std::fs::remove_file(dir.join(format!("port-{i}.sock")));
    }
    let _ = std::fs::remove_file(dir.join("state.json"));
    let initramfs = dir.join("initramfs.cpio");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&initramfs)
            .map_err(|e| BoxError::io(&initramfs, e))?;
        f.write_all(&plan.initramfs)
            .map_err(|e| BoxError::io(&initramfs, e))?;
    }
    let console = dir.join("console.log");
    let log = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&console)
        .map_err(|e| BoxError::io(&console, e))?;
    let mut inherited: Vec<OwnedFd> = Vec::new();
    let mut pass = |fd: OwnedFd| -> String {
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        inherited.push(fd);
        path
    };
    let kernel = pass(open_for_qemu(&plan.kernel, false)?);
    let initrd = pass(open_for_qemu(&initramfs, false)?);
    let root = pass(open_for_qemu(&plan.root_image, false)?);
    let work = pass(open_for_qemu(&plan.work, true)?);
    let spool = pass(open_for_qemu(&plan.spool, true)?);
    let mut cache_paths = Vec::with_capacity(plan.caches.len());
    for c in &plan.caches {
        let fd = open_for_qemu(&c.data, true)?;
        let meta = std::fs::File::from(fd.try_clone().map_err(|e| BoxError::io(&c.data, e))?)
            .metadata()
            .map_err(|e| BoxError::io(&c.data, e))?;
        // The directory opened is the one the plan (and its digest) was made from.
        if (meta.dev(), meta.ino()) != c.identity {
            return Err(BoxError::BadRequest {
                what: format!(
                    "the {} cache at {} changed while the microVM was being planned",
                    c.eco,
                    c.data.display()
                ),
                mend: "run again (a `h5i box cache refresh` or `rm` was in flight)".into(),
            });
        }
        cache_paths.push((c.eco.as_str(), pass(fd)));
    }
    let mut listeners = Vec::new();
    for i in 0..PORTS {
        let path = dir.join(format!("port-{i}.sock"));
        let l = UnixListener::bind(&path).map_err(|e| BoxError::io(&path, e))?;
        listeners.push(OwnedFd::from(l));
    }
    let listener_fds: Vec<RawFd> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
    let mut cmdline = format!(
        "console=ttyS0 quiet panic=-1 rdinit=/init h5i.idle={}",
        plan.idle_secs
    );
    let ecos: Vec<&str> = cache_paths.iter().map(|(eco, _)| *eco).collect();
    if let Some(word) = h5i_guest::caches::cmdline_word(&ecos) {
        cmdline.push(' ');
        cmdline.push_str(&word);
    }
    if plan.accel == Accel::Tcg {
        // Without these the guest spends seconds calibrating its clock under emulation.
        cmdline.push_str(" tsc_early_khz=2000000 lpj=4000000");
    }
    let mut args: Vec<String> = vec![
        "-M".into(),
        "microvm,isa-serial=on,rtc=on".into(),
        "-accel".into(),
        plan.accel.qemu_arg().into(),
        "-cpu".into(),
        plan.accel.cpu().into(),
        "-m".into(),
        format!("{}M", plan.ram_mib),
        "-smp".into(),
        plan.cpus.to_string(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
        "-sandbox".into(),
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
        "-chardev".into(),
        "stdio,id=con,signal=off".into(),
        "-serial".into(),
        "chardev:con".into(),
        "-kernel".into(),
        kernel,
        "-initrd".into(),
        initrd,
        "-append".into(),
        cmdline,
        "-drive".into(),
        format!("file={root},format=raw,if=none,id=root,readonly=on,file.locking=off"),
        "-device".into(),
        "virtio-blk-device,drive=root".into(),
        "-fsdev".into(),
        format!("local,id=work,path={work},security_model=none"),
        "-device".into(),
        "virtio-9p-device,fsdev=work,mount_tag=work".into(),
        "-fsdev".into(),
        format!("local,id=spool,path={spool},security_model=none"),
        "-device".into(),
        "virtio-9p-device,fsdev=spool,mount_tag=spool".into(),
    ];
    for (i, (eco, path)) in cache_paths.iter().enumerate() {
        args.push("-fsdev".into());
        args.push(format!(
            "local,id=cache{i},path={path},security_model=none,readonly=on"
        ));
        args.push("-device".into());
        args.push(format!(
            "virtio-9p-device,fsdev=cache{i},mount_tag={}",
            h5i_guest::caches::tag(eco)
        ));
    }
    args.extend(["-device".into(), "virtio-serial-device,max_ports=8".into()]);
    for (i, fd) in listener_fds.iter().enumerate() {
        args.push("-chardev".into());
        args.push(format!("socket,id=port{i},fd={fd},server=on,wait=off"));
        args.push("-device".into());
        args.push(format!(
            "virtserialport,chardev=port{i},name={}{i}",
            h5i_guest::proto::PORT_PREFIX
        ));
    }
    let grants = super::confine::Grants::for_boot(
        &plan.kernel,
        &initramfs,
        &plan.root_image,
        plan.accel,
        &[&plan.work, &plan.spool],
        &plan
            .caches
            .iter()
            .map(|c| c.data.as_path())
            .collect::<Vec<_>>(),
    );
    let ruleset = grants.ruleset()?;
    let keep: Vec<RawFd> = inherited
        .iter()
        .map(AsRawFd::as_raw_fd)
        .chain(listener_fds.iter().copied())
        .collect();
    let stderr = log.try_clone().map_err(|e| BoxError::io(&console, e))?;
    let (cage, entry) = super::confine::cage(&cage_id(dir), plan.ram_mib)?;
    let mut cmd = std::process::Command::new(super::accel::QEMU);
    cmd.args(&args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(stderr);
    let run_as = plan.run_as;
    // SAFETY: the closure makes only async-signal-safe calls (write, setgroups, setgid,
    // setuid, setsid, fcntl, prctl, landlock_restrict_self) in the child.
    unsafe {
        cmd.pre_exec(move || {
            // Into QEMU's cgroup while still root (the descriptors were opened before the
            // fork), then down to the box's identity.
            entry.enter_in_child()?;
            if let Some((uid, gid)) = run_as {
                h5i_sys::ids::drop_to(uid, gid)?;
            }
            // Already a group leader is the one refusal, and harmless.
            let _ = h5i_sys::proc::new_session();
            for fd in &keep {
                h5i_sys::fds::keep_across_exec(*fd)?;
            }
            super::confine::enforce_in_child(&ruleset)
        });
    }
    let started = Instant::now();
    let child = cmd.spawn().map_err(|e| BoxError::BadRequest {
        what: format!("cannot start {} ({e})", super::accel::QEMU),
        mend: "install it: apt-get install qemu-system-x86 (`make setup` does)".into(),
    })?;
    h5i_log::spawned(&cmd, Some(child.id()));
    let pid = child.id() as i32;
    cage.keep();
    drop(cmd);
    drop(inherited);
    drop(listeners);
    let start = start_time(pid).unwrap_or(0);
    let mut state = VmState {
        pid,
        start_time: start,
        digest,
        accel: plan.accel.name().into(),
        booted_ms: crate::store::now_ms(),
        boot_ms: 0,
    };
    // The state is written before the wait, so a kill of this h5i leaves a VM teardown finds.
    write_state(dir, &state)?;
    let deadline = started + BOOT_TIMEOUT;
    // Readiness is a session on port 0, the port the first run then reopens right behind it:
    // the agent delimits sessions by their Hello, never by the port's connection notices.
    let ready = super::client::wait_ready(&dir.join("port-0.sock"), pid, deadline);
    if let Err(e) = ready {
        kill(&state);
        drop(child);
        return Err(match e {
            super::client::SessionError::Mismatch(speaks) => {
                super::client::mismatch_refused(&speaks)
            }
            super::client::SessionError::Broken(why) => {
                boot_failed(format!("the microVM did not come up: {why}"), &console)
            }
            super::client::SessionError::Stuck => {
                boot_failed("the microVM did not come up".into(), &console)
            }
        });
    }
    drop(child);
    state.boot_ms = started.elapsed().as_millis() as u64;
    write_state(dir, &state)?;
    Ok(state)
}

fn write_state(dir: &Path, state: &VmState) -> Result<(), BoxError> {
    let path = dir.join("state.json");
    let text = serde_json::to_vec(state).map_err(|e| BoxError::Corrupt {
        path: path.clone(),
        what: e.to_string(),
    })?;
    crate::store::write_atomic(&path, &text)
}
