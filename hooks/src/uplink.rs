//! The box's only way out: for a sentry that is real root and a table without IPv6 pins, a veth
//! pair and the host kernel's forwarding (`veth.rs`); otherwise pasta (passt) on a tap device
//! inside the box's network namespace. Chosen by measurement: the veth pair runs at the host's
//! own speed; unprivileged, pasta (passt 2023-03-09, Debian 12) reached 0.72x the host's rate
//! for 100 MB on a quiet machine against slirp4netns's 0.47x (BENCHMARKS.md), so slirp4netns is
//! gone. IPv6 pins take pasta even for root: the kernel has no per-device IPv6 forwarding switch
//! to scope.
//!
//! Owns starting and stopping the uplink, and for pasta: `pasta --foreground --quiet
//! --config-net --runas UID:GID -t none -u none -T none -U none --no-map-gw [-4] -I tap0
//! -a 10.0.2.100 -n 24 -g 10.0.2.2 [-a fd00::100 -g fd00::2] --no-netns-quit
//! --netns /proc/self/fd/4 [--userns /proc/self/fd/5] -P /proc/self/fd/3`, the namespace fds the
//! sentry holds and the write end of the ready pipe inherited at fixed numbers. pasta runs in
//! the sentry's network namespace and dials out as an ordinary host process, so the box reaches
//! exactly what the host reaches, filtered first by the box's own nftables table (its load runs
//! alongside the uplink's start, and the box is held until both are done: nothing in the box
//! sends before the table is in force). The flags, each measured here:
//! - `-t none -u none -T none -U none`: no port forwarding either way. pasta's defaults (`auto`)
//!   would bind, on the box's own loopback, every port the host listens on and splice it to the
//!   host's loopback, past the table (which accepts `lo`); and forward host ports into the box.
//! - `--no-map-gw`: a connection to the gateway is not turned into one to the host's loopback
//!   (pasta's default); the table refuses the gateway as well.
//! - `-a`/`-n`/`-g`: the box's network is 10.0.2.0/24 (and fd00::/64), the one `egress` refuses
//!   to pin, instead of a copy of the host's own addresses and routes.
//! - `--runas UID:GID` (the sentry's own ids): pasta started as uid 0 otherwise switches to
//!   `nobody`, which cannot enter a root-owned namespace ("Couldn't switch to pasta
//!   namespaces"); for an unprivileged sentry it names its own ids, which needs no privilege.
//! - `--no-netns-quit`: the namespace is given by an fd path, which pasta cannot watch; its end
//!   is the sentry's [`Pasta::stop`].
//!
//! Foreground, so pasta stays the sentry's own child: the sentry holds a pidfd on it, sees it
//! end ([`Uplink::alive`]), and ends it with `SIGKILL` through that pidfd and reaps it
//! (`waitpid`). Readiness is exact: pasta writes its pid to the `-P` file once the tap is
//! attached and configured (addresses, routes, link up), and that file is the ready pipe; the
//! sentry waits (bounded) for that line, and for the pid it names to be the child's. `EOF`
//! first means pasta exited. Ready in about 10 ms. pasta sandboxes itself (its own user and
//! mount namespaces, capabilities dropped, seccomp). Once it is ready the sentry gives the
//! default routes pasta made a receive-window clamp (`ip route change ... window`, one `ip`
//! run in the box's namespaces, before the box runs): [`WINDOW_CLAMP`] says why.
//!
//! `tap0` already exists when pasta starts: `net-inside` made it persistent (`tap.rs`). pasta
//! attaches to it by name (`TUNSETIFF` with the same flags) and configures it over netlink; on
//! exit it only detaches.
//!
//! The sandbox makes its own mount namespace but marks only `/` private before it pivots and
//! detaches the old root; every shared mount below `/` (here `/run`, which holds
//! `/run/netns/*`) then propagates that detach back to the host, and `ip netns` names on the host
//! stop working ("setting the network namespace ... failed: Invalid argument"). So when the
//! sentry holds `CAP_SYS_ADMIN` (root, rootless Podman's namespace), pasta is started in a mount
//! namespace of its own whose mounts are all private first; nothing it does there can reach the
//! host's mounts.
//!
//! Must never: carry a packet of the box's before the table is loaded (the sentry lets the box
//! run only once both are up), or outlive the sentry (`PR_SET_PDEATHSIG` with `SIGKILL`:
//! measured to survive pasta's own namespace switches, as root and unprivileged).

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::BoxNamespaces;
use crate::veth::{VethError, VethUplink};
use h5i_policy::receipt::PinnedRule;
use h5i_sys::{fds, pidfd};

/// Where pasta is looked for (hooks run with a cleared environment).
const PASTA_PATHS: &[&str] = &["/usr/bin/pasta", "/usr/local/bin/pasta"];
/// The tap device's name in the box.
pub const DEVICE: &str = "tap0";
/// The box's IPv4 address, prefix length and gateway on the tap.
const BOX_V4: (&str, &str, &str) = ("10.0.2.100", "24", "10.0.2.2");
/// The box's IPv6 address and gateway, for a table with IPv6 pins.
const BOX_V6: (&str, &str) = ("fd00::100", "fd00::2");
/// The most the box advertises as its receive window on the uplink's routes (`ip route ...
/// window`), in bytes: four of pasta's 64 KiB frames. Why: this pasta (passt 2023-03-09) sends
/// one frame per socket read and, having no `SO_PEEK_OFF`, peeks everything it sent and the box
/// has not yet acknowledged before the new frame; with the box's own window (up to
/// `tcp_rmem`'s 32 MiB) it copied 7-12 times the bytes it forwarded (perf: 42% of its samples
/// in that copy, against 5.5% writing frames to the tap). At 256 KiB: 2.5 times, and 14% less
/// pasta CPU per 100 MB (61.7 -> 53.0 ms, 30 runs each, loaded 2-core host). The clamp is the
/// box <-> pasta leg only (pasta holds the host side's connection and buffers it), and
/// loopback's routes are not the uplink's: a box's own local connections keep their window.
pub const WINDOW_CLAMP: u32 = 256 * 1024;
/// How long pasta may take to configure the device.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest ready line read (a pid and a newline).
const MAX_READY_LINE: usize = 32;

/// `CAP_SYS_ADMIN`'s bit number (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;

const READY_FD: RawFd = 3;
const NETNS_FD: RawFd = 4;
const USERNS_FD: RawFd = 5;

/// Why the uplink could not be started.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// pasta is not installed.
    #[error("refusing: pasta is not installed (looked in {0}); to fix: apt-get install passt")]
    Missing(String),
    /// It could not be started.
    #[error("refusing: cannot start pasta: {0}; to fix: report this as an h5i bug")]
    Spawn(io::Error),
    /// It exited or stalled before saying it was ready.
    #[error("refusing: pasta did not bring up {DEVICE} in the box ({0}); to fix: check /dev/net/tun is usable by this user (mode 0666) and see the sentry log")]
    NotReady(String),
    /// The uplink's default route could not be given its window clamp.
    #[error("refusing: cannot clamp the window on the box's uplink route ({0}); to fix: check iproute2 is installed and see the sentry log")]
    Route(crate::netns::NetnsError),
    /// The veth pair could not be made.
    #[error(transparent)]
    Veth(#[from] VethError),
}

/// A running uplink.
#[derive(Debug)]
pub enum Uplink {
    /// pasta on the box's tap device.
    Pasta(Pasta),
    /// A veth pair and the host's forwarding.
    Veth(VethUplink),
}

impl Uplink {
    /// Start the uplink this sentry can give the box for `rules`: the veth pair for real root
    /// and IPv4-only pins, else pasta (its output to `log`, the sentry's own log).
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
        Ok(Uplink::Pasta(Pasta::start(ns, ipv6, log)?))
    }

    /// Make `rules` (a later run's pins) reachable: the veth uplink's reply devices; nothing
    /// for pasta, which dials out as a host process.
    pub fn route(&mut self, rules: &[PinnedRule]) -> Result<(), UplinkError> {
        match self {
            Uplink::Pasta(_) => Ok(()),
            Uplink::Veth(v) => Ok(v.route(rules)?),
        }
    }

    /// Whether it is still up.
    pub fn alive(&self) -> bool {
        match self {
            Uplink::Pasta(p) => p.alive(),
            Uplink::Veth(v) => v.alive(),
        }
    }

    /// End it.
    pub fn stop(&mut self) {
        match self {
            Uplink::Pasta(p) => p.stop(),
            Uplink::Veth(v) => v.stop(),
        }
    }
}

/// A running pasta, the sentry's child.
#[derive(Debug)]
pub struct Pasta {
    child: Child,
    pidfd: OwnedFd,
    reaped: bool,
}

/// Whether this process holds `CAP_SYS_ADMIN` in its own user namespace (it may then give
/// pasta a mount namespace of its own).
fn holds_sys_admin() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// The argv after the program name, for a sentry running as `uid:gid`.
pub fn args(ipv6: bool, userns: bool, uid: u32, gid: u32) -> Vec<String> {
    let mut a: Vec<String> = [
        "--foreground",
        "--quiet",
        "--config-net",
        "-t",
        "none",
        "-u",
        "none",
        "-T",
        "none",
        "-U",
        "none",
        "--no-map-gw",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    a.push("--runas".into());
    a.push(format!("{uid}:{gid}"));
    if !ipv6 {
        a.push("-4".into());
    }
    let (v4, prefix, gw4) = BOX_V4;
    for x in ["-I", DEVICE, "-a", v4, "-n", prefix, "-g", gw4] {
        a.push(x.into());
    }
    if ipv6 {
        let (v6, gw6) = BOX_V6;
        for x in ["-a", v6, "-g", gw6] {
            a.push(x.into());
        }
    }
    a.push("--no-netns-quit".into());
    a.push("--netns".into());
    a.push(format!("/proc/self/fd/{NETNS_FD}"));
    if userns {
        a.push("--userns".into());
        a.push(format!("/proc/self/fd/{USERNS_FD}"));
    }
    a.push("-P".into());
    a.push(format!("/proc/self/fd/{READY_FD}"));
    a
}

impl Pasta {
    /// Start pasta for the box and wait (bounded) until it reports the device configured.
    /// Its output goes to `log` (the sentry's own log).
    pub fn start(
        ns: &BoxNamespaces,
        ipv6: bool,
        log: &std::fs::File,
    ) -> Result<Pasta, UplinkError> {
        let pasta = PASTA_PATHS
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
            .ok_or_else(|| UplinkError::Missing(PASTA_PATHS.join(", ")))?;
        let (ready_r, ready_w) = fds::pipe().map_err(UplinkError::Spawn)?;
        // Sources above every target number, so the child's dup2s cannot clobber one another.
        let high = |fd: BorrowedFd<'_>| fds::dup_at_least(fd, 16).map_err(UplinkError::Spawn);
        let ready_src = high(ready_w.as_fd())?;
        let net_src = high(ns.net().as_fd())?;
        let user_src = ns.user().map(|u| high(u.as_fd())).transpose()?;
        drop(ready_w);
        let plan: Vec<(RawFd, RawFd)> = [
            Some((ready_src.as_raw_fd(), READY_FD)),
            Some((net_src.as_raw_fd(), NETNS_FD)),
            user_src.as_ref().map(|u| (u.as_raw_fd(), USERNS_FD)),
        ]
        .into_iter()
        .flatten()
        .collect();
        let out = log.try_clone().map_err(UplinkError::Spawn)?;
        let err = log.try_clone().map_err(UplinkError::Spawn)?;
        let private_mounts = holds_sys_admin();
        let (uid, gid) = (h5i_sys::ids::euid(), h5i_sys::ids::egid());
        let argv = args(ipv6, user_src.is_some(), uid, gid);
        eprintln!("h5i sentry: uplink: {} {}", pasta.display(), argv.join(" "));
        let mut cmd = Command::new(pasta);
        cmd.args(&argv)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let parent = std::process::id();
        // SAFETY: runs in the forked child before exec, making only system calls (fcntl, dup2,
        // unshare, mount, prctl, getppid: async-signal-safe, no allocation); `plan` was built
        // before the fork and is only read.
        unsafe {
            cmd.pre_exec(move || {
                h5i_sys::fds::place_for_exec(&plan)?;
                if private_mounts {
                    h5i_sys::mount::private_namespace()?;
                }
                h5i_sys::proc::die_with_parent(parent)
            });
        }
        let child = cmd.spawn().map_err(UplinkError::Spawn)?;
        h5i_log::spawned(&cmd, Some(child.id()));
        drop((ready_src, net_src, user_src));
        let pidfd = match pidfd::open(child.id() as i32) {
            Ok(fd) => fd,
            Err(e) => {
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                return Err(UplinkError::Spawn(e));
            }
        };
        let mut uplink = Pasta {
            child,
            pidfd,
            reaped: false,
        };
        let configured = wait_ready(ready_r, uplink.child.id()).and_then(|()| {
            ns.ip(&["-batch", "-"], route_window_batch(ipv6).as_bytes())
                .map(drop)
                .map_err(UplinkError::Route)
        });
        match configured {
            Ok(()) => Ok(uplink),
            Err(e) => {
                uplink.stop();
                Err(e)
            }
        }
    }

    /// Whether pasta is still running.
    pub fn alive(&self) -> bool {
        !self.reaped && matches!(pidfd::wait_exited(&self.pidfd, Duration::ZERO), Ok(false))
    }

    /// End the uplink: `SIGKILL` through the pidfd (pasta keeps no state the box needs: the
    /// persistent tap stays), then reap it.
    pub fn stop(&mut self) {
        if self.reaped {
            return;
        }
        let _ = pidfd::kill(&self.pidfd);
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for Pasta {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `ip -batch` input giving the default routes pasta made (`--config-net`) the box's receive
/// window clamp ([`WINDOW_CLAMP`]); the same gateways and device, so nothing else changes.
pub fn route_window_batch(ipv6: bool) -> String {
    let (_, _, gw4) = BOX_V4;
    let mut batch = format!("route change default via {gw4} dev {DEVICE} window {WINDOW_CLAMP}\n");
    if ipv6 {
        let (_, gw6) = BOX_V6;
        batch.push_str(&format!(
            "route change default via {gw6} dev {DEVICE} window {WINDOW_CLAMP}\n"
        ));
    }
    batch
}

/// Wait (bounded) for pasta's pid file line on the ready pipe: pasta writes it once the tap is
/// attached and configured. It must name `pid`, the child the sentry started.
fn wait_ready(ready_r: OwnedFd, pid: u32) -> Result<(), UplinkError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut pipe = std::fs::File::from(ready_r);
    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        let ready = h5i_sys::poll::readable(&[pipe.as_fd()], Some(left))
            .map_err(|e| UplinkError::NotReady(e.to_string()))?;
        if ready.is_empty() {
            return Err(UplinkError::NotReady(format!(
                "no word within {}s",
                READY_TIMEOUT.as_secs()
            )));
        }
        let mut buf = [0u8; MAX_READY_LINE];
        let n = pipe
            .read(&mut buf)
            .map_err(|e| UplinkError::NotReady(e.to_string()))?;
        if n == 0 {
            return Err(UplinkError::NotReady("it exited".into()));
        }
        line.extend_from_slice(&buf[..n]);
        if line.len() > MAX_READY_LINE {
            return Err(UplinkError::NotReady("an overlong ready line".into()));
        }
    }
    ready_line_names(&line, pid)
}

/// Whether `line` (the pid file's contents) names `pid`.
fn ready_line_names(line: &[u8], pid: u32) -> Result<(), UplinkError> {
    let text = String::from_utf8_lossy(line);
    match text.trim_end_matches('\n').parse::<u32>() {
        Ok(p) if p == pid => Ok(()),
        _ => Err(UplinkError::NotReady(format!(
            "its pid file said {:?}, not {pid}",
            text.trim_end()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_forward_no_port_keep_the_gateway_off_the_host_and_name_the_inherited_fds() {
        let a = args(false, true, 1001, 1002);
        let joined = a.join(" ");
        for want in [
            "--foreground",
            "--config-net",
            "-t none -u none -T none -U none",
            "--no-map-gw",
            "--runas 1001:1002",
            "-I tap0 -a 10.0.2.100 -n 24 -g 10.0.2.2",
            "--no-netns-quit",
        ] {
            assert!(joined.contains(want), "{want}: {joined}");
        }
        assert!(a.contains(&"-4".to_string()), "{joined}");
        assert!(!joined.contains("fd00::"), "{joined}");
        assert_eq!(
            &a[a.len() - 6..],
            &[
                "--netns",
                "/proc/self/fd/4",
                "--userns",
                "/proc/self/fd/5",
                "-P",
                "/proc/self/fd/3"
            ]
        );
        let b = args(true, false, 0, 0);
        let joined = b.join(" ");
        assert!(!b.contains(&"-4".to_string()), "{joined}");
        assert!(joined.contains("-a fd00::100 -g fd00::2"), "{joined}");
        assert!(joined.contains("--runas 0:0"), "{joined}");
        assert!(!joined.contains("--userns"), "{joined}");
    }

    #[test]
    fn the_window_clamp_changes_only_the_default_routes_pasta_made() {
        assert_eq!(
            route_window_batch(false),
            "route change default via 10.0.2.2 dev tap0 window 262144\n"
        );
        assert_eq!(
            route_window_batch(true),
            "route change default via 10.0.2.2 dev tap0 window 262144\n\
             route change default via fd00::2 dev tap0 window 262144\n"
        );
    }

    #[test]
    fn only_a_ready_line_naming_the_child_is_ready() {
        assert!(ready_line_names(b"4242\n", 4242).is_ok());
        for bad in [&b"4243\n"[..], b"\n", b"x4242\n", b"-1\n", b"4242 1\n"] {
            assert!(
                matches!(ready_line_names(bad, 4242), Err(UplinkError::NotReady(_))),
                "{bad:?}"
            );
        }
    }
}
