//! The box's only way out: for a sentry that is real root and a table without IPv6 pins, a veth
//! pair and the host kernel's forwarding (`veth.rs`); otherwise slirp4netns on a tap device
//! inside the box's network namespace. Chosen by measurement: the veth pair runs at the host's
//! own speed; unprivileged, pasta (passt 2023-03-09, Debian 12) measured within noise of
//! slirp4netns here (median 165 vs 198 ms for 100 MB, host 96 ms) and needs five more flags to
//! keep the host's ports and loopback out of the box, so slirp4netns stays (BENCHMARKS.md).
//! IPv6 stays on slirp4netns: the kernel has no per-device IPv6 forwarding switch to scope.
//!
//! Owns starting and stopping the uplink, and for slirp4netns: `slirp4netns --configure --mtu=65520
//! --disable-host-loopback --enable-seccomp [--enable-sandbox] [--enable-ipv6]
//! --ready-fd=3 --exit-fd=4 [--userns-path=/proc/self/fd/6] --netns-type=path /proc/self/fd/5
//! tap0`, with the namespace fds the sentry holds inherited at fixed numbers. slirp4netns runs in
//! the sentry's network namespace and dials out as an ordinary host process, so the box reaches
//! exactly what the host reaches, filtered first by the box's own nftables table (its load runs
//! alongside the uplink's start, and the box is held until both are done: nothing in the box
//! sends before the table is in force). `--disable-host-loopback` keeps the gateway 10.0.2.2
//! from reaching the host's 127.0.0.1 (the table refuses 10.0.2.2 as well).
//!
//! `tap0` already exists when slirp4netns starts: `net-inside` made it persistent (`tap.rs`).
//! slirp4netns attaches to it by name and configures it as it would a device of its own
//! (measured with 1.2.0: rootful, unprivileged through `--userns-path`, rootless Podman); on
//! exit it only detaches, which is what saves its teardown on the run's end.
//!
//! Measured here (slirp4netns 1.2.0): the fd paths work rootful and rootless; `--userns-path`
//! equal to the caller's own user namespace is accepted; `--enable-sandbox` needs
//! `CAP_SYS_ADMIN` in the uplink's own user namespace (it fails with "setegid(0)" for an
//! unprivileged caller outside any user namespace), so it is on exactly when the sentry holds
//! that capability (root, or rootless Podman's namespace); `--enable-seccomp` works everywhere.
//! Ready in 3–10 ms.
//!
//! The sandbox makes its own mount namespace but marks only `/` private before it pivots and
//! detaches the old root; every shared mount below `/` (here `/run`, which holds
//! `/run/netns/*`) then propagates that detach back to the host, and `ip netns` names on the host
//! stop working ("setting the network namespace ... failed: Invalid argument"). So a sandboxed
//! uplink is started in a mount namespace of its own whose mounts are all private first; nothing
//! it does there can reach the host's mounts.
//!
//! Must never: carry a packet of the box's before the table is loaded (the sentry lets the box
//! run only once both are up), or outlive the sentry (`--exit-fd` ends it when the sentry's end
//! of the pipe closes; `PR_SET_PDEATHSIG` too).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::netns::BoxNamespaces;
use crate::veth::{VethError, VethUplink};
use h5i_policy::receipt::PinnedRule;
use h5i_sys::{fds, pidfd};

/// Where slirp4netns is looked for (hooks run with a cleared environment).
const SLIRP_PATHS: &[&str] = &["/usr/bin/slirp4netns", "/usr/local/bin/slirp4netns"];
/// The tap device's name in the box.
pub const DEVICE: &str = "tap0";
/// How long slirp4netns may take to configure the device.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long it may take to exit once asked.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// `CAP_SYS_ADMIN`'s bit number (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;

const READY_FD: RawFd = 3;
const EXIT_FD: RawFd = 4;
const NETNS_FD: RawFd = 5;
const USERNS_FD: RawFd = 6;

/// Why the uplink could not be started.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// slirp4netns is not installed.
    #[error("refusing: slirp4netns is not installed (looked in {0}); to fix: apt-get install slirp4netns")]
    Missing(String),
    /// It could not be started.
    #[error("refusing: cannot start slirp4netns: {0}; to fix: report this as an h5i bug")]
    Spawn(io::Error),
    /// It exited or stalled before saying it was ready.
    #[error("refusing: slirp4netns did not bring up {DEVICE} in the box ({0}); to fix: check /dev/net/tun is usable by this user (mode 0666) and see the sentry log")]
    NotReady(String),
    /// The veth pair could not be made.
    #[error(transparent)]
    Veth(#[from] VethError),
}

/// A running uplink.
#[derive(Debug)]
pub enum Uplink {
    /// slirp4netns on the box's tap device.
    Slirp(Slirp),
    /// A veth pair and the host's forwarding.
    Veth(VethUplink),
}

impl Uplink {
    /// Start the uplink this sentry can give the box for `rules`: the veth pair for real root
    /// and IPv4-only pins, else slirp4netns (its output to `log`, the sentry's own log).
    pub fn start(
        ns: &BoxNamespaces,
        rules: &[PinnedRule],
        log: &std::fs::File,
    ) -> Result<Uplink, UplinkError> {
        let ipv6 = crate::nft::needs_ipv6(rules);
        if crate::netns::real_root() && !ipv6 {
            eprintln!("h5i sentry: uplink: veth pair, host forwarding");
            return Ok(Uplink::Veth(VethUplink::start(ns, rules)?));
        }
        Ok(Uplink::Slirp(Slirp::start(ns, ipv6, log)?))
    }

    /// Make `rules` (a later run's pins) reachable: the veth uplink's reply devices; nothing
    /// for slirp4netns, which dials out as a host process.
    pub fn route(&mut self, rules: &[PinnedRule]) -> Result<(), UplinkError> {
        match self {
            Uplink::Slirp(_) => Ok(()),
            Uplink::Veth(v) => Ok(v.route(rules)?),
        }
    }

    /// Whether it is still up.
    pub fn alive(&self) -> bool {
        match self {
            Uplink::Slirp(s) => s.alive(),
            Uplink::Veth(v) => v.alive(),
        }
    }

    /// End it.
    pub fn stop(&mut self) {
        match self {
            Uplink::Slirp(s) => s.stop(),
            Uplink::Veth(v) => v.stop(),
        }
    }
}

/// A running slirp4netns.
#[derive(Debug)]
pub struct Slirp {
    child: Child,
    pidfd: OwnedFd,
    exit_w: Option<OwnedFd>,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new fds into the array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just returned by pipe2 and nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether this process holds `CAP_SYS_ADMIN` in its own user namespace (slirp4netns's sandbox
/// needs it).
pub fn can_sandbox() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// The argv after the program name.
pub fn args(ipv6: bool, sandbox: bool, userns: bool) -> Vec<String> {
    let mut a: Vec<String> = [
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-seccomp",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    if sandbox {
        a.push("--enable-sandbox".into());
    }
    if ipv6 {
        a.push("--enable-ipv6".into());
    }
    a.push(format!("--ready-fd={READY_FD}"));
    a.push(format!("--exit-fd={EXIT_FD}"));
    if userns {
        a.push(format!("--userns-path=/proc/self/fd/{USERNS_FD}"));
    }
    a.push("--netns-type=path".into());
    a.push(format!("/proc/self/fd/{NETNS_FD}"));
    a.push(DEVICE.into());
    a
}

impl Slirp {
    /// Start slirp4netns for the box and wait (bounded) until it reports the device ready.
    /// Its output goes to `log` (the sentry's own log).
    pub fn start(
        ns: &BoxNamespaces,
        ipv6: bool,
        log: &std::fs::File,
    ) -> Result<Slirp, UplinkError> {
        let slirp = SLIRP_PATHS
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
            .ok_or_else(|| UplinkError::Missing(SLIRP_PATHS.join(", ")))?;
        let (ready_r, ready_w) = pipe().map_err(UplinkError::Spawn)?;
        let (exit_r, exit_w) = pipe().map_err(UplinkError::Spawn)?;
        // Sources above every target number, so the child's dup2s cannot clobber one another.
        let high = |fd: BorrowedFd<'_>| fds::dup_at_least(fd, 16).map_err(UplinkError::Spawn);
        let ready_src = high(ready_w.as_fd())?;
        let exit_src = high(exit_r.as_fd())?;
        let net_src = high(ns.net().as_fd())?;
        let user_src = ns.user().map(|u| high(u.as_fd())).transpose()?;
        drop((ready_w, exit_r));
        let plan: Vec<(RawFd, RawFd)> = [
            Some((ready_src.as_raw_fd(), READY_FD)),
            Some((exit_src.as_raw_fd(), EXIT_FD)),
            Some((net_src.as_raw_fd(), NETNS_FD)),
            user_src.as_ref().map(|u| (u.as_raw_fd(), USERNS_FD)),
        ]
        .into_iter()
        .flatten()
        .collect();
        let out = log.try_clone().map_err(UplinkError::Spawn)?;
        let err = log.try_clone().map_err(UplinkError::Spawn)?;
        let sandbox = can_sandbox();
        let argv = args(ipv6, sandbox, user_src.is_some());
        eprintln!("h5i sentry: uplink: {} {}", slirp.display(), argv.join(" "));
        let mut cmd = Command::new(slirp);
        cmd.args(&argv)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // SAFETY: runs in the forked child before exec, calling only dup2, unshare, mount and
        // prctl (async-signal-safe system calls); `plan` was built before the fork and is only
        // read, and the mount arguments are static C strings or null.
        unsafe {
            cmd.pre_exec(move || {
                for (src, dst) in &plan {
                    if libc::dup2(*src, *dst) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if sandbox {
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let root = c"/";
                    if libc::mount(
                        std::ptr::null(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(UplinkError::Spawn)?;
        h5i_log::spawned(&cmd, Some(child.id()));
        drop((ready_src, exit_src, net_src, user_src));
        let pidfd = pidfd::open(child.id() as i32).map_err(UplinkError::Spawn)?;
        let mut uplink = Slirp {
            child,
            pidfd,
            exit_w: Some(exit_w),
        };
        match wait_ready(&ready_r) {
            Ok(()) => Ok(uplink),
            Err(e) => {
                uplink.stop();
                Err(e)
            }
        }
    }

    /// Whether slirp4netns is still running.
    pub fn alive(&self) -> bool {
        matches!(pidfd::wait_exited(&self.pidfd, Duration::ZERO), Ok(false))
    }

    /// End the uplink: close the exit fd, wait (bounded), then kill; reap it.
    pub fn stop(&mut self) {
        self.exit_w.take();
        if !matches!(pidfd::wait_exited(&self.pidfd, EXIT_TIMEOUT), Ok(true)) {
            let _ = pidfd::kill(&self.pidfd);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Slirp {
    fn drop(&mut self) {
        if self.exit_w.is_some() {
            self.stop();
        }
    }
}

fn wait_ready(ready_r: &OwnedFd) -> Result<(), UplinkError> {
    let ready = fds::poll_readable(&[ready_r.as_fd()], Some(READY_TIMEOUT))
        .map_err(|e| UplinkError::NotReady(e.to_string()))?;
    if ready.is_empty() {
        return Err(UplinkError::NotReady(format!(
            "no word within {}s",
            READY_TIMEOUT.as_secs()
        )));
    }
    let mut byte = [0u8; 1];
    // SAFETY: reading one byte into a valid one-byte buffer from an owned fd.
    let n = unsafe { libc::read(ready_r.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
    match (n, byte[0]) {
        (1, b'1') => Ok(()),
        (0, _) => Err(UplinkError::NotReady("it exited".into())),
        (n, b) => Err(UplinkError::NotReady(format!(
            "unexpected answer {n} bytes {b:#x}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_hold_the_host_loopback_shut_and_name_the_inherited_fds() {
        let a = args(false, false, true);
        assert!(a.contains(&"--disable-host-loopback".to_string()));
        assert!(a.contains(&"--enable-seccomp".to_string()));
        assert!(!a.contains(&"--enable-sandbox".to_string()));
        assert!(!a.contains(&"--enable-ipv6".to_string()));
        assert_eq!(
            &a[a.len() - 4..],
            &[
                "--userns-path=/proc/self/fd/6",
                "--netns-type=path",
                "/proc/self/fd/5",
                "tap0"
            ]
        );
        let b = args(true, true, false);
        assert!(
            b.contains(&"--enable-sandbox".to_string()) && b.contains(&"--enable-ipv6".to_string())
        );
        assert!(!b.iter().any(|x| x.starts_with("--userns-path")));
    }
}
