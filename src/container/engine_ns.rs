//! Root's container-tier runs: the box's host paths made reachable and writable for the
//! engine user, inside the engine's own mount namespace only.
//!
//! Rootless Podman does everything in the mount namespace of its long-lived pause process
//! (`<XDG_RUNTIME_DIR>/libpod/tmp/pause.pid`), a copy of the host's taken when that process
//! started; with the host's `/` private, a mount made on the host later never shows there. And
//! a box root created is owned by root, under directories the engine user may not even
//! traverse (a clone under `/root`). So for each run h5i (root), in a forked child, clones each
//! tree **in the host's mount namespace** (the engine user controls what its own namespace
//! mounts over any path, so no source path is ever resolved there), then enters the engine's
//! namespace and attaches the trees under the root-owned run directory:
//! - the workspace and the spool through **idmapped** bind mounts whose map is a user
//!   namespace of h5i's own with one line, the box range's first id (`h5i-box`, which owns the
//!   box's trees on disk) -> the engine user: files the range owns appear owned by the engine
//!   user (which `--userns=keep-id` makes the box's user), and what the box writes lands owned
//!   by the range on disk, never by root; a file root owns on disk is unmapped there, so owner
//!   bits refuse it to the box;
//! - the workspace's object store and h5i's two binaries (`h5i-runc`, `h5i-hook`) as plain
//!   read-only binds.
//!
//! The mount points are root's empty directories in the host namespace: should the pause
//! process be replaced mid-run, Podman's new namespace shows those instead, which the box cannot
//! write (fail closed), and the run reports it.
//!
//! Must never: mount anything in the host's own mount namespace, mount a path the plan did not
//! name, or remove a directory that may still hold a mount (teardown unmounts first, and only
//! removes the run directory's own empty entries, from the host namespace where nothing is
//! mounted).
//!
//! Guarded by the root-run tests in `tests/container_tier.rs`.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd};

use h5i_sys::idmap::{
    CloneStep, MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::engine::Engine;

/// Why the engine's namespace could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum EngineNsError {
    /// No live pause process of the engine user.
    #[error("refusing: cannot find the rootless Podman pause process of `{user}` ({detail}); to fix: run `runuser -u {user} -- podman info` once, and keep Podman's tmp_dir at its default ($XDG_RUNTIME_DIR/libpod/tmp)")]
    NoPause {
        /// The engine user.
        user: String,
        /// What was found.
        detail: String,
    },
    /// A mount step failed.
    #[error("refusing: cannot attach {what} for the engine user ({step}: {source}); to fix: this needs a kernel with idmapped mounts (Linux 5.12+) on the filesystem holding the box (ext4, xfs, btrfs)")]
    Mount {
        /// Which path.
        what: String,
        /// Which syscall.
        step: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// A run-directory entry could not be made.
    #[error("refusing: {path}: {source}; to fix: check the engine user's runtime directory")]
    Io {
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// The engine's pause process, held open by descriptor.
#[derive(Debug)]
pub struct EngineNamespace {
    /// Its pid (checked again after the run).
    pub pid: i32,
    mnt: OwnedFd,
    user: OwnedFd,
}

/// One attachment in the engine's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attach {
    /// The host path.
    pub source: PathBuf,
    /// The mount point (under the run directory).
    pub target: PathBuf,
    /// Idmapped so the engine user writes it as the box range (see `map_disk_owner`).
    pub idmapped: bool,
    /// Read-only.
    pub readonly: bool,
}

/// `<runtime_dir>/libpod/tmp/pause.pid`, started first when missing.
pub fn engine_namespace(engine: &Engine) -> Result<EngineNamespace, EngineNsError> {
    let pid_file = engine.runtime_dir.join("libpod/tmp/pause.pid");
    let read = || -> Option<i32> {
        std::fs::read_to_string(&pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()
            .filter(|p| *p > 1 && owned_by(*p, engine.uid))
    };
    let pid = match read() {
        Some(p) => p,
        None => {
            // Any rootless Podman command starts the pause process.
            engine.podman_quiet(&["unshare", "true"]);
            read().ok_or_else(|| EngineNsError::NoPause {
                user: engine.user.clone(),
                detail: format!("{} names no live process of that user", pid_file.display()),
            })?
        }
    };
    let open = |ns: &str| {
        let p = format!("/proc/{pid}/ns/{ns}");
        File::open(&p)
            .map(OwnedFd::from)
            .map_err(|e| EngineNsError::NoPause {
                user: engine.user.clone(),
                detail: format!("{p}: {e}"),
            })
    };
    let ns = EngineNamespace {
        pid,
        mnt: open("mnt")?,
        user: open("user")?,
    };
    // The descriptors now pin the namespaces; the pid must still be the engine's process.
    if !owned_by(pid, engine.uid) {
        return Err(EngineNsError::NoPause {
            user: engine.user.clone(),
            detail: format!("pid {pid} changed owner while opening its namespaces"),
        });
    }
    Ok(ns)
}

fn owned_by(pid: i32, uid: u32) -> bool {
    std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == uid)
}

impl EngineNamespace {
    /// Whether the same pause process still runs (so the run saw these mounts).
    pub fn still_current(&self, engine: &Engine) -> bool {
        std::fs::read_to_string(engine.runtime_dir.join("libpod/tmp/pause.pid"))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            == Some(self.pid)
            && owned_by(self.pid, engine.uid)
    }
}

impl EngineNamespace {
    /// Idmap the writable attachments so that on-disk `disk` (the box range's first uid/gid,
    /// which owns the box's workspace and spool) is seen as the engine user `engine`, and what
    /// the engine user writes lands owned by `disk`, never by root. Replaces the pause
    /// process's user namespace (whose map would store the engine user's writes as root).
    /// `group`: one more gid line (on-disk gid, host gid), a browser box's sidecar's group.
    pub fn map_disk_owner(
        &mut self,
        disk: (u32, u32),
        engine: (u32, u32),
        group: Option<(u32, u32)>,
    ) -> Result<(), EngineNsError> {
        self.user =
            owner_namespace(disk, engine, group).map_err(|source| EngineNsError::Mount {
                what: format!("the box's ids {}:{}", disk.0, disk.1),
                step: "make an idmap user namespace",
                source,
            })?;
        Ok(())
    }
}

/// A user namespace whose only mapping is namespace id `disk` -> host id `engine` (uid and
/// gid), plus the gid line `group` when given: as an idmapped mount's map it shows on-disk
/// `disk` as `engine` and stores `engine`'s writes as `disk`.
fn owner_namespace(
    disk: (u32, u32),
    engine: (u32, u32),
    group: Option<(u32, u32)>,
) -> io::Result<OwnedFd> {
    let mut gids = format!("{} {} 1\n", disk.1, engine.1);
    if let Some((on_disk, host)) = group {
        gids.push_str(&format!("{on_disk} {host} 1\n"));
    }
    h5i_sys::idmap::userns_with_maps(&format!("{} {} 1\n", disk.0, engine.0), &gids)
}

/// The steps a child reports by index when one fails.
const STEPS: [&str; 5] = [
    "setns",
    "open_tree",
    "mount_setattr",
    "move_mount",
    "umount2",
];

struct Prepared {
    source: CString,
    target: CString,
    attr_set: u64,
}

/// Attach every entry of `plan` in the engine's namespace (none on any failure: what was
/// attached before the failing step is detached again).
pub fn attach_all(ns: &EngineNamespace, plan: &[Attach]) -> Result<(), EngineNsError> {
    let mut prepared = Vec::new();
    for a in plan {
        let cstr = |p: &Path| {
            CString::new(p.as_os_str().as_bytes()).map_err(|_| EngineNsError::Io {
                path: p.to_path_buf(),
                source: io::Error::other("path holds a NUL byte"),
            })
        };
        let mut set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        if a.readonly {
            set |= MOUNT_ATTR_RDONLY;
        }
        if a.idmapped {
            set |= MOUNT_ATTR_IDMAP;
        }
        prepared.push(Prepared {
            source: cstr(&a.source)?,
            target: cstr(&a.target)?,
            attr_set: set,
        });
    }
    let user = ns.user.as_raw_fd();
    // One slot per entry for the detached trees, allocated before the fork (the child makes no
    // allocation).
    let mut trees: Vec<libc::c_int> = vec![-1; prepared.len()];
    let result = in_child(|report| {
        // Every source is resolved and cloned here, in the host's mount namespace, before
        // entering the engine's: the engine user controls what its own namespace mounts over a
        // path, so a path resolved there could name any tree it chose.
        for (i, p) in prepared.iter().enumerate() {
            match h5i_sys::idmap::clone_tree(&p.source, p.attr_set, user) {
                Ok(tree) => trees[i] = tree.into_raw_fd(),
                Err((step, e)) => {
                    return report(1 + usize::from(step == CloneStep::SetAttr), i, &e);
                }
            }
        }
        if let Err(e) = h5i_sys::ns::enter(ns.mnt.as_fd(), h5i_sys::ns::Namespace::Mount) {
            return report(0, usize::MAX, &e);
        }
        for (i, p) in prepared.iter().enumerate() {
            // In the namespace just entered, where the engine user may only redirect the tree
            // within its own namespace.
            if let Err(e) = h5i_sys::idmap::attach(trees[i], &p.target) {
                return report(3, i, &e);
            }
        }
        0
    });
    match result {
        Ok(()) => Ok(()),
        Err((step, index, source)) => {
            let targets: Vec<PathBuf> = plan.iter().take(index).map(|a| a.target.clone()).collect();
            detach_all(ns, &targets);
            Err(EngineNsError::Mount {
                what: plan.get(index).map_or_else(
                    || "the engine namespace".into(),
                    |a| a.source.display().to_string(),
                ),
                step: STEPS.get(step).copied().unwrap_or("?"),
                source,
            })
        }
    }
}

/// Detach `targets` in the engine's namespace (best effort: a target already gone is fine).
pub fn detach_all(ns: &EngineNamespace, targets: &[PathBuf]) {
    let targets: Vec<CString> = targets
        .iter()
        .filter_map(|t| CString::new(t.as_os_str().as_bytes()).ok())
        .collect();
    let _ = in_child(|report| {
        if let Err(e) = h5i_sys::ns::enter(ns.mnt.as_fd(), h5i_sys::ns::Namespace::Mount) {
            return report(0, usize::MAX, &e);
        }
        for t in targets.iter().rev() {
            // MNT_DETACH never blocks; async-signal-safe, as the forked child needs.
            let _ = h5i_sys::mount::detach(t);
        }
        0
    });
}

/// Run `body` in a forked child (a mount namespace can only be entered by a single-threaded
/// process, and h5i has threads). `body` reports a failure with `report(step, index, error)`,
/// which sends (step, index, the error's errno) to the parent over a pipe and yields the
/// child's exit code.
fn in_child(
    body: impl FnOnce(&dyn Fn(usize, usize, &io::Error) -> libc::c_int) -> libc::c_int,
) -> Result<(), (usize, usize, io::Error)> {
    let (rd, wr) = h5i_sys::fds::pipe().map_err(|e| (0, usize::MAX, e))?;
    let w = wr.as_raw_fd();
    // SAFETY: the child only makes raw syscalls (no allocation, no locks: the report is 24
    // bytes on its stack, written with one write(2), which a pipe's buffer always takes).
    let status = unsafe {
        h5i_sys::fork_exec::in_forked_child(|| {
            let report = move |step: usize, index: usize, e: &io::Error| -> libc::c_int {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                let msg: [u64; 3] = [step as u64, index as u64, errno as u64];
                let bytes: [u8; 24] = std::array::from_fn(|i| msg[i / 8].to_ne_bytes()[i % 8]);
                let _ = h5i_sys::fds::write_raw(w, &bytes);
                1
            };
            body(&report)
        })
    }
    .map_err(|e| (0, usize::MAX, e))?;
    drop(wr);
    let mut buf = Vec::new();
    let read = File::from(rd).read_to_end(&mut buf);
    if let (Ok(24), true) = (read, buf.len() == 24) {
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(b)
        };
        return Err((
            word(0) as usize,
            word(1) as usize,
            io::Error::from_raw_os_error(word(2) as i32),
        ));
    }
    if h5i_sys::proc::Ended::from_wait_status(status).code == Some(0) {
        Ok(())
    } else {
        Err((
            0,
            usize::MAX,
            io::Error::other(format!("helper ended with status {status}")),
        ))
    }
}

/// Make the empty mount point `target` (a directory, or a file when `file`), owned by root.
pub fn mount_point(target: &Path, file: bool) -> Result<(), EngineNsError> {
    let res = if file {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .and_then(|mut f| f.flush())
    } else {
        std::fs::create_dir(target)
    };
    res.map_err(|source| EngineNsError::Io {
        path: target.to_path_buf(),
        source,
    })
}
