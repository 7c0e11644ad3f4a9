//! The box's namespaces as the sentry holds them, and the one way it acts inside them: a forked
//! child that enters them and execs `nft`.
//!
//! Owns [`BoxNamespaces`] (the network namespace fd the box's inside hook sent, and its user
//! namespace fd unless that is the sentry's own), their validation (each fd really is a
//! namespace of the claimed type; the network namespace is not the sentry's own), and
//! [`BoxNamespaces::nft`], or [`BoxNamespaces::spawn_nft`] for an [`NsRun`] waited for later
//! (the table's load runs while the uplink starts; a sandbox's table refresh runs between
//! runs). The counters are read without a program: `nft_counters`. Entering a user namespace needs a
//! single-threaded process: the sentry is not (the socket gate runs on a thread), so the child
//! is forked and enters the namespaces between fork and exec, where only async-signal-safe
//! calls are made.
//!
//! Must never: run `nft` in the sentry's own network namespace, or accept an fd that is not a
//! namespace. Guarded by the unit tests below and `hooks/tests/supervised_net.rs`.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};

/// Where `nft` is looked for (hooks run with a cleared environment: no `PATH`).
const NFT_PATHS: &[&str] = &["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"];
/// Where `ip` is looked for.
const IP_PATHS: &[&str] = &["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"];
/// How long one `nft` run may take.
const NFT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the namespaces could not be held or used.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// An fd is not a namespace of the expected kind.
    #[error("refusing: the {what} fd the box sent is not a {what} namespace{detail}; to fix: run `h5i-hook net-inside` as the box's createContainer hook")]
    NotNamespace {
        /// `network` or `user`.
        what: &'static str,
        /// The kernel's answer, when there was one.
        detail: String,
    },
    /// The box's network namespace is the sentry's own.
    #[error("refusing: the box's network namespace is the host's; to fix: give the box its own network namespace (podman: --network none)")]
    HostNetwork,
    /// A program the network needs is not installed.
    #[error("refusing: {package} is not installed (looked in {looked}); to fix: apt-get install {package}")]
    Missing {
        /// Where it was looked for.
        looked: String,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// `nft` or `ip` could not be run.
    #[error("refusing: cannot run nft or ip for the box's network: {0}; to fix: report this as an h5i bug")]
    Spawn(io::Error),
    /// `nft` or `ip` ran and failed.
    #[error("refusing: `{args}` failed for the box's network (exit {code:?}): {stderr}; to fix: check nftables and iproute2 work here (`unshare -rn nft list ruleset`)")]
    Failed {
        /// The program and its arguments.
        args: String,
        /// Its exit code.
        code: Option<i32>,
        /// What it said.
        stderr: String,
    },
}

/// The box's network namespace and, when it is not the sentry's own, its user namespace.
#[derive(Debug)]
pub struct BoxNamespaces {
    net: OwnedFd,
    user: Option<OwnedFd>,
}

/// `(dev, ino)` of a namespace, as `stat` of its fd or `/proc/self/ns/*` gives it.
fn ns_id_of_path(path: &Path) -> io::Result<(u64, u64)> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

fn ns_id_of_fd(fd: RawFd) -> io::Result<(u64, u64)> {
    ns_id_of_path(&PathBuf::from(format!("/proc/self/fd/{fd}")))
}

fn expect_type(fd: &OwnedFd, want: libc::c_int, what: &'static str) -> Result<(), NetnsError> {
    match h5i_sys::ns::kind_of(fd.as_fd()) {
        Ok(t) if t == want => Ok(()),
        Ok(t) => Err(NetnsError::NotNamespace {
            what,
            detail: format!(" (namespace type {t:#x})"),
        }),
        Err(e) => Err(NetnsError::NotNamespace {
            what,
            detail: format!(" ({e})"),
        }),
    }
}

/// Effective uid 0 in the initial user namespace.
pub fn real_root() -> bool {
    let euid = h5i_sys::ids::euid();
    euid == 0
        && std::fs::read_to_string("/proc/self/uid_map")
            .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}

impl BoxNamespaces {
    /// Hold the fds the box sent, after checking what they are. A user namespace equal to the
    /// sentry's own is dropped (entering it again is `EINVAL`; rootful Podman boxes have none
    /// of their own, rootless Podman boxes share Podman's, where the sentry also runs), and so
    /// is any for a sentry that is real root: root's capabilities over the box's network
    /// namespace are its own already, and in a box whose root is an unprivileged range
    /// (h5i as root) root is unmapped, so what it ran there would lose them at exec.
    pub fn new(net: OwnedFd, user: OwnedFd) -> Result<BoxNamespaces, NetnsError> {
        expect_type(&net, libc::CLONE_NEWNET, "network")?;
        expect_type(&user, libc::CLONE_NEWUSER, "user")?;
        let own_net = ns_id_of_path(Path::new("/proc/self/ns/net"));
        let box_net = ns_id_of_fd(net.as_raw_fd());
        match (own_net, box_net) {
            (Ok(a), Ok(b)) if a != b => {}
            (Ok(_), Ok(_)) => return Err(NetnsError::HostNetwork),
            (Err(e), _) | (_, Err(e)) => {
                return Err(NetnsError::NotNamespace {
                    what: "network",
                    detail: format!(" ({e})"),
                })
            }
        }
        let same_user = match (
            ns_id_of_path(Path::new("/proc/self/ns/user")),
            ns_id_of_fd(user.as_raw_fd()),
        ) {
            (Ok(a), Ok(b)) => a == b,
            (Err(e), _) | (_, Err(e)) => {
                return Err(NetnsError::NotNamespace {
                    what: "user",
                    detail: format!(" ({e})"),
                })
            }
        };
        Ok(BoxNamespaces {
            net,
            user: (!same_user && !real_root()).then_some(user),
        })
    }

    /// The network namespace fd.
    pub fn net(&self) -> &OwnedFd {
        &self.net
    }

    /// The user namespace fd, when it is not the sentry's own.
    pub fn user(&self) -> Option<&OwnedFd> {
        self.user.as_ref()
    }

    /// Run `nft ARGS` inside the box's namespaces with `stdin` as its input; its stdout.
    pub fn nft(&self, args: &[&str], stdin: &[u8]) -> Result<Vec<u8>, NetnsError> {
        self.spawn_nft(args, stdin.to_vec())?.wait()
    }

    /// Start `nft ARGS` inside the box's namespaces without waiting for it, its whole `input`
    /// written (and stdin closed) on a thread. Its output is read on a thread as it comes, so
    /// [`NsRun::wait`] is bounded. Killed if dropped before it was waited for.
    pub fn spawn_nft(&self, args: &[&str], input: Vec<u8>) -> Result<NsRun, NetnsError> {
        let nft = find_program(NFT_PATHS, "nftables")?;
        let user = self.user.as_ref().map(AsRawFd::as_raw_fd);
        spawn(nft, args, input, Some((self.net.as_raw_fd(), user)))
    }

    /// Run `ip ARGS` inside the box's namespaces with `stdin` as its input; its stdout.
    pub fn ip(&self, args: &[&str], stdin: &[u8]) -> Result<Vec<u8>, NetnsError> {
        let ip = find_program(IP_PATHS, "iproute2")?;
        let user = self.user.as_ref().map(AsRawFd::as_raw_fd);
        spawn(ip, args, stdin.to_vec(), Some((self.net.as_raw_fd(), user)))?.wait()
    }
}

/// Run `ip ARGS` in the caller's own namespaces (the host's, for the rootful uplink's host
/// side) with `stdin` as its input, bounded like every run here; its stdout.
pub fn host_ip(args: &[&str], stdin: &[u8]) -> Result<Vec<u8>, NetnsError> {
    let ip = find_program(IP_PATHS, "iproute2")?;
    spawn(ip, args, stdin.to_vec(), None)?.wait()
}

/// Run `nft ARGS` in the caller's own namespaces with `stdin` as its input; its stdout.
pub fn host_nft(args: &[&str], stdin: &[u8]) -> Result<Vec<u8>, NetnsError> {
    let nft = find_program(NFT_PATHS, "nftables")?;
    spawn(nft, args, stdin.to_vec(), None)?.wait()
}

/// The first of `paths` that exists (hooks run with a cleared environment: no `PATH`).
fn find_program(
    paths: &'static [&'static str],
    package: &'static str,
) -> Result<&'static Path, NetnsError> {
    paths
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .ok_or_else(|| NetnsError::Missing {
            looked: paths.join(", "),
            package,
        })
}

/// Start `program ARGS`, in the namespaces `enter` names (network fd, and user fd when it is
/// not the caller's own) or in the caller's own, without waiting for it (see
/// [`BoxNamespaces::spawn_nft`]).
fn spawn(
    program: &Path,
    args: &[&str],
    input: Vec<u8>,
    enter: Option<(RawFd, Option<RawFd>)>,
) -> Result<NsRun, NetnsError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((net, user)) = enter {
        // SAFETY: the closure runs in the forked child before exec and calls only setns (one
        // system call, no allocation: async-signal-safe); the fds it names are the caller's,
        // open across the spawn, so open in the child (fork copies them).
        unsafe {
            cmd.pre_exec(move || {
                use h5i_sys::ns::{enter, Namespace};
                if let Some(user) = user {
                    enter(BorrowedFd::borrow_raw(user), Namespace::User)?;
                }
                enter(BorrowedFd::borrow_raw(net), Namespace::Network)
            });
        }
    }
    let mut child = cmd.spawn().map_err(NetnsError::Spawn)?;
    h5i_log::spawned(&cmd, Some(child.id()));
    let pidfd = match h5i_sys::pidfd::open(child.id() as i32) {
        Ok(p) => p,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(NetnsError::Spawn(e));
        }
    };
    let stdin = child.stdin.take();
    // The input is written on the thread too, so a script larger than a pipe cannot block
    // the caller; a failed write (the program gone) fails the run even if it exited 0.
    let (tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let written = stdin.map_or(Ok(()), |mut s| s.write_all(&input));
        let out = child.wait_with_output();
        let _ = tx.send(written.and(out));
    });
    let name = program
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    Ok(NsRun {
        args: format!("{name} {}", args.join(" ")),
        pidfd,
        done: Some(done),
    })
}

/// An `nft` started in the box's namespaces by [`BoxNamespaces::spawn_nft`].
#[derive(Debug)]
pub struct NsRun {
    args: String,
    pidfd: OwnedFd,
    /// The thread's result; taken when waited for.
    done: Option<Receiver<io::Result<Output>>>,
}

impl NsRun {
    /// Wait, at most [`NFT_TIMEOUT`], for it to end; its stdout when it succeeded.
    pub fn wait(mut self) -> Result<Vec<u8>, NetnsError> {
        let Some(done) = self.done.take() else {
            return Err(NetnsError::Spawn(io::Error::other(
                "nft was already waited for",
            )));
        };
        let out = match done.recv_timeout(NFT_TIMEOUT) {
            Ok(out) => out.map_err(NetnsError::Spawn)?,
            Err(e) => {
                let _ = h5i_sys::pidfd::kill(&self.pidfd);
                let why = match e {
                    RecvTimeoutError::Timeout => {
                        format!("no answer within {}s; killed", NFT_TIMEOUT.as_secs())
                    }
                    RecvTimeoutError::Disconnected => "its reader thread failed; killed".into(),
                };
                return Err(NetnsError::Failed {
                    args: self.args.clone(),
                    code: None,
                    stderr: why,
                });
            }
        };
        if !out.status.success() {
            return Err(NetnsError::Failed {
                args: self.args.clone(),
                code: out.status.code(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out.stdout)
    }
}

impl Drop for NsRun {
    /// One never waited for is killed, so a refused attach leaves no nft running in the box's
    /// namespaces (a load it cut short never applied: nft loads a script as one transaction);
    /// the thread reaps it.
    fn drop(&mut self) {
        if self.done.is_some() {
            let _ = h5i_sys::pidfd::kill(&self.pidfd);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn open(path: &str) -> OwnedFd {
        std::fs::File::open(path).unwrap().into()
    }

    #[test]
    fn the_sentrys_own_network_namespace_is_refused() {
        let r = BoxNamespaces::new(open("/proc/self/ns/net"), open("/proc/self/ns/user"));
        assert!(matches!(r, Err(NetnsError::HostNetwork)), "{r:?}");
    }

    #[test]
    fn fds_that_are_not_the_claimed_namespace_are_refused() {
        let r = BoxNamespaces::new(open("/proc/self/ns/user"), open("/proc/self/ns/user"));
        assert!(
            matches!(
                r,
                Err(NetnsError::NotNamespace {
                    what: "network",
                    ..
                })
            ),
            "{r:?}"
        );
        let r = BoxNamespaces::new(open("/dev/null"), open("/proc/self/ns/user"));
        assert!(matches!(r, Err(NetnsError::NotNamespace { .. })), "{r:?}");
        let r = BoxNamespaces::new(open("/proc/self/ns/net"), open("/proc/self/ns/net"));
        assert!(
            matches!(r, Err(NetnsError::NotNamespace { what: "user", .. })),
            "{r:?}"
        );
    }
}
