//! QEMU itself, confined on the host: the hypervisor is the boundary of the microvm tier, so a
//! guest that breaks out into QEMU must meet a process that can do little.
//!
//! Owns two layers added to QEMU's own seccomp sandbox (`-sandbox on`) and its unprivileged
//! identity:
//! - a Landlock ruleset (made before the fork, enforced in the child before `exec`, with
//!   `no_new_privs`): QEMU may read and execute the host's programs and libraries (`/usr`,
//!   `/lib`, `/lib64`, `/etc/ld.so.cache`), read its kernel, initramfs and root image, use
//!   `/dev/kvm` when it runs KVM, read and write beneath the box's workspace and spool, and
//!   read (never write) beneath the current key's directory of each warm cache the box gets;
//!   nothing else of the host can be opened, listed, written or made;
//! - a cgroup of its own (`<h5i's cgroup>/h5i/<VM directory name>`), holding QEMU to the
//!   guest's RAM plus [`QEMU_OVERHEAD_MIB`] and to [`QEMU_TASKS`] threads, made before QEMU
//!   starts and entered by the child before it drops root and execs QEMU (so nothing QEMU
//!   allocates is charged anywhere else), kept for the VM's life and removed by teardown.
//!
//! Must never: start QEMU with less than the whole ruleset enforced (a kernel without Landlock
//! refuses the boot), or grant a path beyond the ones above.
//!
//! Guarded by `tests/microvm.rs` (a host file QEMU opens, asked from outside through gdb).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, ABI,
};

use super::accel::Accel;
use crate::error::BoxError;

/// What QEMU needs beyond the guest's RAM (its own heap, TCG's translation cache, 9p buffers).
pub const QEMU_OVERHEAD_MIB: u64 = 512;
/// The most tasks (threads) QEMU may have: vCPUs, I/O and 9p workers.
pub const QEMU_TASKS: u64 = 512;

fn refuse(what: String) -> BoxError {
    BoxError::BadRequest {
        what: format!("cannot confine the microVM's QEMU: {what}"),
        mend: "the microvm tier needs Landlock (Linux 5.13 or later, `lsm=...,landlock` on the kernel command line) and cgroup v2 or v1 memory and pids controllers; `h5i box probe` says which".into(),
    }
}

/// The paths QEMU is granted, and how.
#[derive(Debug, Clone)]
pub struct Grants {
    /// Read and execute beneath each (programs and libraries).
    pub programs: Vec<PathBuf>,
    /// Read only (the kernel, the initramfs, the root image, the loader cache).
    pub read: Vec<PathBuf>,
    /// Read and write (`/dev/kvm` when KVM runs).
    pub devices: Vec<PathBuf>,
    /// Every file access beneath each (the workspace and the spool).
    pub shares: Vec<PathBuf>,
    /// Read files and list directories beneath each (the warm caches, shared read-only).
    pub read_shares: Vec<PathBuf>,
}

impl Grants {
    /// The grants for a QEMU booting `kernel`, `initramfs` and `root` with `accel`, sharing
    /// `shares` and, read-only, `read_shares`.
    pub fn for_boot(
        kernel: &Path,
        initramfs: &Path,
        root: &Path,
        accel: Accel,
        shares: &[&Path],
        read_shares: &[&Path],
    ) -> Grants {
        Grants {
            programs: ["/usr", "/lib", "/lib64"]
                .into_iter()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .collect(),
            read: vec![
                kernel.to_path_buf(),
                initramfs.to_path_buf(),
                root.to_path_buf(),
                PathBuf::from("/etc/ld.so.cache"),
            ],
            devices: match accel {
                Accel::Kvm => vec![PathBuf::from("/dev/kvm")],
                Accel::Tcg => Vec::new(),
            },
            shares: shares.iter().map(|p| p.to_path_buf()).collect(),
            read_shares: read_shares.iter().map(|p| p.to_path_buf()).collect(),
        }
    }

    /// The enforced-in-the-child ruleset: a descriptor for `landlock_restrict_self`.
    pub fn ruleset(&self) -> Result<OwnedFd, BoxError> {
        let abi = ABI::V3;
        let ll = |e: landlock::RulesetError| refuse(e.to_string());
        let all = AccessFs::from_all(abi);
        let read_file = AccessFs::ReadFile;
        let read_dir = AccessFs::ReadFile | AccessFs::ReadDir;
        let program = read_dir | AccessFs::Execute;
        let mut created = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(all)
            .map_err(ll)?
            .create()
            .map_err(ll)?;
        let mut add = |path: &Path, access: landlock::BitFlags<AccessFs>| {
            let fd = PathFd::new(path).map_err(|e| refuse(format!("{}: {e}", path.display())))?;
            let access = match path.is_dir() {
                true => access,
                false => access & AccessFs::from_file(abi),
            };
            created
                .as_mut()
                .add_rule(PathBeneath::new(fd, access))
                .map(drop)
                .map_err(ll)
        };
        for p in &self.programs {
            add(p, program)?;
        }
        for p in &self.read {
            add(p, read_file.into())?;
        }
        for p in &self.devices {
            add(p, AccessFs::ReadFile | AccessFs::WriteFile)?;
        }
        for p in &self.shares {
            add(p, all)?;
        }
        for p in &self.read_shares {
            add(p, read_dir)?;
        }
        Option::<OwnedFd>::from(created).ok_or_else(|| refuse("Landlock made no ruleset".into()))
    }
}

/// In the forked child, before `exec`: `no_new_privs`, then the ruleset. Async-signal-safe
/// (two system calls, through `h5i_sys::landlock`), so a `pre_exec` closure may call it.
pub fn enforce_in_child(ruleset: &OwnedFd) -> std::io::Result<()> {
    h5i_sys::landlock::set_no_new_privs()?;
    h5i_sys::landlock::restrict_self(ruleset.as_fd())
}

/// QEMU's cgroup for a VM with `ram_mib` of RAM, made and its limits written before QEMU
/// starts, and the way in for the child that execs QEMU ([`h5i_runtime::cage::Entry`]: QEMU is
/// in the group from its first instruction, so its every allocation is charged there). The
/// group is kept past this process once [`QemuCage::keep`] is called (teardown removes it with
/// [`remove`]); dropped before that (QEMU never started), it is removed.
pub fn cage(id: &str, ram_mib: u64) -> Result<(QemuCage, h5i_runtime::cage::Entry), BoxError> {
    let mem = (ram_mib + QEMU_OVERHEAD_MIB) << 20;
    let cage = h5i_runtime::cage::ResourceCage::create(id, Some(mem), Some(QEMU_TASKS))
        .map_err(|e| refuse(e.to_string()))?;
    let entry = cage
        .entry()
        .map_err(|(path, e)| refuse(format!("{}: {e}", path.display())))?;
    Ok((QemuCage(cage), entry))
}

/// QEMU's cgroup, until QEMU is running in it.
pub struct QemuCage(h5i_runtime::cage::ResourceCage);

impl QemuCage {
    /// Keep the group for the VM's life.
    pub fn keep(self) {
        self.0.keep();
    }
}

/// Remove VM `id`'s cgroup (killing anything still in it).
pub fn remove(id: &str) {
    let _ = h5i_runtime::cage::remove_tree(id);
}
