//! `h5i box probe`: what this host can enforce, per tier, measured rather than assumed.
//!
//! Owns the host-facing half of tier selection: it fills [`HostTiers`] for policy resolution
//! and prints the same facts for a human. Each fact is a question the kernel answered (a
//! syscall's return, a file under /proc or /sys), never the mere presence of a binary. Must
//! never: report a tier as available when any of its layers is missing, or cache an answer
//! across a kernel or binary change.

use h5i_log::Traced as _;
use std::path::Path;

use h5i_policy::{HostTiers, Tier};

/// One probed fact, for printing.
#[derive(Debug, Clone)]
pub struct ProbeLine {
    /// What was checked.
    pub what: String,
    /// What the host answered.
    pub answer: String,
}

/// The kernel facts the kernel tiers need.
#[derive(Debug, Clone)]
pub struct KernelFacts {
    /// Landlock ABI version, or the reason there is none.
    pub landlock_abi: Result<i32, String>,
    /// Whether seccomp filters (and user notification) are available.
    pub seccomp: Result<bool, String>,
    /// Whether this caller can create a user namespace.
    pub userns: Result<(), String>,
    /// `h5i-runc`, found beside h5i or on PATH.
    pub runc: Result<std::path::PathBuf, String>,
    /// The cgroup layout, and whether h5i can make groups under its own cgroup.
    pub cgroups: (String, Result<(), String>),
    /// What the supervised tier's network needs beyond the process tier: `h5i-hook`, a
    /// runnable `pasta` and `nft`, and a tun device this caller can open.
    pub supervised_net: Result<(), String>,
}

/// Ask the kernel.
pub fn kernel_facts() -> KernelFacts {
    KernelFacts {
        landlock_abi: landlock_abi(),
        seccomp: seccomp(),
        userns: userns(),
        runc: crate::tier_host::runc_binary()
            .ok_or_else(|| "h5i-runc is not beside h5i or on PATH (`cargo install --path .` installs it beside h5i)".to_string()),
        cgroups: cgroups(),
        supervised_net: supervised_net(),
    }
}

/// Runs `program --version` and says whether it answered.
fn runs(program: &str) -> Result<(), String> {
    match std::process::Command::new(program)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .traced()
        .status()
    {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("`{program} --version` failed ({s})")),
        Err(e) => Err(format!(
            "{program} cannot be run ({e}); to fix: make setup installs it"
        )),
    }
}

fn supervised_net() -> Result<(), String> {
    crate::tier_host::hook_binary()
        .ok_or_else(|| "h5i-hook is not beside h5i or on PATH (`cargo install --path .` installs it beside h5i)".to_string())?;
    runs("pasta")?;
    runs("nft")?;
    // The uplink opens the tun device as this caller, inside the box's user namespace.
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map(drop)
        .map_err(|e| {
            format!("/dev/net/tun cannot be opened by this user ({e}); to fix: make setup (chmod 0666 /dev/net/tun)")
        })
}

fn landlock_abi() -> Result<i32, String> {
    use h5i_runtime::confine::kernel::{ConfinementKernel, LinuxKernel};
    match LinuxKernel.landlock_abi() {
        v if v > 0 => Ok(v),
        e => Err(format!(
            "Landlock unavailable ({}); boot with lsm=...,landlock",
            std::io::Error::from_raw_os_error(-e)
        )),
    }
}

fn seccomp() -> Result<bool, String> {
    match std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail") {
        Ok(a) => Ok(a.split_whitespace().any(|w| w == "user_notif")),
        Err(e) => Err(format!("seccomp filters unavailable ({e})")),
    }
}

fn userns() -> Result<(), String> {
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .map_err(|e| format!("user namespaces unavailable ({e})"))?;
    if max.trim() == "0" {
        return Err(
            "user.max_user_namespaces is 0; to fix: sysctl -w user.max_user_namespaces=15000"
                .into(),
        );
    }
    let root = h5i_sys::ids::euid() == 0;
    if !root {
        if let Ok(v) = std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone") {
            if v.trim() == "0" {
                return Err("kernel.unprivileged_userns_clone is 0; to fix: sysctl -w kernel.unprivileged_userns_clone=1".into());
            }
        }
    }
    Ok(())
}

fn cgroups() -> (String, Result<(), String>) {
    let layout = match h5i_runtime::runc::cgroup::detect_layout() {
        Ok(h5i_runtime::runc::cgroup::Layout::V2) => "v2",
        Ok(h5i_runtime::runc::cgroup::Layout::V1) => "v1",
        Err(e) => return ("unknown".into(), Err(e.to_string())),
    };
    sweep_dead_probe_cages();
    let held =
        h5i_runtime::cage::ResourceCage::create(&probe_cage_name(), Some(64 << 20), Some(64))
            .map(drop)
            .map_err(|e| e.to_string());
    (layout.into(), held)
}

/// The probe's trial cage: named by this process's pid and start time. A probe killed before
/// it removed its group leaves the group behind; named by pid alone, a later h5i given the same
/// pid (pid_max is 32768 on hosts like this one) found that group already made, by root
/// perhaps, could not write its limits, and refused the tier. The leading `_` keeps the name
/// out of every box's: a box's cages are named after the box (`<box>-<pid>-<ms>` for a run),
/// and a box name starts with a letter or digit, so a box named `probe` owns no probe's name.
fn probe_cage_name() -> String {
    let me = std::process::id() as i32;
    let start = crate::service_state::ProcId::of(me).map_or(0, |p| p.start);
    format!("{PROBE_CAGE_PREFIX}{me}-{start}")
}

const PROBE_CAGE_PREFIX: &str = "_probe-";

/// Remove the trial cages of probes that are gone (`_probe-<pid>-<start>` whose process no
/// longer runs), by rmdir alone: a group that holds a process is never emptied by a sweep.
fn sweep_dead_probe_cages() {
    for name in h5i_runtime::cage::cages() {
        let Some((pid, start)) = name
            .strip_prefix(PROBE_CAGE_PREFIX)
            .and_then(|rest| rest.split_once('-'))
        else {
            continue;
        };
        if let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) {
            if !(crate::service_state::ProcId { pid, start }).alive() {
                h5i_runtime::cage::remove_empty_tree(&name);
            }
        }
    }
}

/// What this host can run, tier by tier, with the reason where it cannot.
pub fn host_tiers() -> HostTiers {
    let f = kernel_facts();
    let mut t = tiers_from(&f);
    let container = crate::container::probe::set_availability(&mut t, &f.cgroups.1);
    crate::microvm::set_availability(&mut t, &crate::microvm::qemu_facts(), &container);
    if let Some(bytes) = memory_total() {
        t.set_memory_bytes(bytes);
    }
    t
}

/// The host's physical memory (`MemTotal` in /proc/meminfo), which sizes the protective memory
/// ceiling (`h5i_policy::builtin::protective_ceilings`). `None` when unreadable: resolution
/// then uses its fixed fallback.
fn memory_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

fn tiers_from(f: &KernelFacts) -> HostTiers {
    let mut t = HostTiers::new();
    t.set_available(Tier::Workspace);
    let process = (|| -> Result<(), String> {
        f.runc.as_ref().map_err(String::clone)?;
        f.userns.clone()?;
        let abi = f.landlock_abi.clone()?;
        if abi < 3 {
            return Err(format!(
                "Landlock ABI {abi} cannot confine truncate(2); needs 3+ (Linux 6.2)"
            ));
        }
        f.seccomp.clone()?;
        // The runtime places every container in a cgroup: an unprivileged caller can run one
        // only inside a group root has delegated to it.
        if h5i_sys::ids::euid() != 0 {
            if let (_, Err(e)) = &f.cgroups {
                return Err(format!(
                    "an unprivileged caller needs a cgroup root has delegated to it (make setup delegates one to h5i-test): {e}"
                ));
            }
        }
        Ok(())
    })();
    let supervised = process.clone().and_then(|()| {
        match &f.seccomp {
            Ok(true) => {}
            _ => {
                return Err(
                    "seccomp user notification is unavailable, so the socket() gate cannot run"
                        .to_string(),
                )
            }
        }
        f.supervised_net.clone()
    });
    match process {
        Ok(()) => t.set_available(Tier::Process),
        Err(why) => t.set_unavailable(Tier::Process, why),
    };
    match supervised {
        Ok(()) => t.set_available(Tier::Supervised),
        Err(why) => t.set_unavailable(Tier::Supervised, why),
    };
    t.set_unavailable(
        Tier::Microvm,
        "the microvm tier's backend has not been probed",
    );
    t
}

/// The facts `h5i box probe` prints.
pub fn probe_lines() -> Vec<ProbeLine> {
    let f = kernel_facts();
    let mut tiers = tiers_from(&f);
    let container = crate::container::probe::set_availability(&mut tiers, &f.cgroups.1);
    let qemu = crate::microvm::qemu_facts();
    crate::microvm::set_availability(&mut tiers, &qemu, &container);
    let mut out = Vec::new();
    let line = |what: &str, answer: String| ProbeLine {
        what: what.into(),
        answer,
    };
    for tier in Tier::ALL_STRONGEST_FIRST {
        out.push(line(
            &format!("tier {}", tier.as_str()),
            match tiers.availability(tier) {
                h5i_policy::TierAvailability::Available => "available".into(),
                h5i_policy::TierAvailability::Unavailable(why) => format!("unavailable: {why}"),
                h5i_policy::TierAvailability::OnRequest(why) => {
                    format!(
                        "available with --isolation {}; auto passes over it: {why}",
                        tier.as_str()
                    )
                }
            },
        ));
    }
    out.push(line(
        "landlock",
        match &f.landlock_abi {
            Ok(v) => format!(
                "ABI {v}{}",
                if *v >= 4 {
                    " (fs + TCP bind/connect)"
                } else {
                    " (fs)"
                }
            ),
            Err(e) => e.clone(),
        },
    ));
    out.push(line(
        "seccomp",
        match &f.seccomp {
            Ok(true) => "filters + user notification".into(),
            Ok(false) => {
                "filters (no user notification: the supervised tier's socket gate cannot run)"
                    .into()
            }
            Err(e) => e.clone(),
        },
    ));
    out.push(line(
        "user namespaces",
        match &f.userns {
            Ok(()) => "available".into(),
            Err(e) => e.clone(),
        },
    ));
    out.push(line(
        "h5i-runc",
        match &f.runc {
            Ok(p) => p.display().to_string(),
            Err(e) => e.clone(),
        },
    ));
    out.push(line(
        "cgroups",
        match &f.cgroups {
            (layout, Ok(())) => format!(
                "{layout}; mem and procs can be held (h5i made and removed a group under its own)"
            ),
            (layout, Err(e)) => format!("{layout}; mem and procs cannot be held here: {e}"),
        },
    ));
    out.push(line(
        "cgroup migrations",
        migrations_line(
            &std::fs::read_to_string("/sys/kernel/cgroup/features").unwrap_or_default(),
            &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
        ),
    ));
    out.extend(
        crate::container::probe::lines(&container, &f.cgroups.1)
            .into_iter()
            .map(|(what, answer)| line(&what, answer)),
    );
    out.extend(
        qemu.lines()
            .into_iter()
            .map(|(what, answer)| line(&what, answer)),
    );
    out.push(line(
        "supervised network",
        match &f.supervised_net {
            Ok(()) => {
                "pasta uplink (veth pair when rootful) + nftables table in the box's namespace + tun available".into()
            }
            Err(e) => e.clone(),
        },
    ));
    out.push(line(
        "tty-injection",
        tty_injection_line(Path::new("/proc/sys/dev/tty/legacy_tiocsti")),
    ));
    out
}

/// What joining a box run's cgroup costs here. Every run moves its first process into its
/// cgroup, which takes the kernel's global threadgroup lock for writing; unless the cgroup2 mount
/// has `favordynmods`, that write first waits out an RCU grace period (10-15 ms measured on the
/// reference host, and most of the process tier's run-to-run spread). From the kernel's cgroup
/// `features` file and `mountinfo`.
fn migrations_line(features: &str, mountinfo: &str) -> String {
    if !features.lines().any(|l| l.trim() == "favordynmods") {
        return "each box run waits out an RCU grace period to join its cgroup (this kernel has no favordynmods option)".into();
    }
    let cgroup2 = mountinfo.lines().find_map(|l| {
        let (mount, fs) = l.split_once(" - ")?;
        let mut fs = fs.split_whitespace();
        (fs.next()? == "cgroup2").then(|| {
            let point = mount.split_whitespace().nth(4).unwrap_or("?").to_string();
            let opts = fs.nth(1).unwrap_or("").to_string();
            (point, opts)
        })
    });
    match cgroup2 {
        Some((_, opts)) if opts.split(',').any(|o| o == "favordynmods") => {
            "fast (cgroup2 is mounted with favordynmods)".into()
        }
        Some((point, _)) => format!("each box run waits out an RCU grace period to join its cgroup; to speed up: mount -o remount,favordynmods {point} (as root; `make setup` does it, keeping the mount's other options)"),
        None => "each box run waits out an RCU grace period to join its cgroup (no cgroup2 mount to set favordynmods on)".into(),
    }
}

/// The manual's tty-injection line. `box shell` never shares the user's terminal: the box gets
/// a pty of its own at every tier, so TIOCSTI from the box reaches only that pty. `box run`
/// passes the caller's terminal through as stdio: there h5i's seccomp filter refuses
/// `ioctl(TIOCSTI)` at the kernel tiers, and at the workspace tier it is this kernel's
/// `dev.tty.legacy_tiocsti` that decides (a kernel without the knob cannot close it).
fn tty_injection_line(sysctl: &Path) -> String {
    match std::fs::read_to_string(sysctl) {
        Ok(v) if v.trim() == "0" => "blocked at every tier (this kernel refuses TIOCSTI: dev.tty.legacy_tiocsti=0; box shell also gives the box its own pty)".into(),
        _ => "box shell: contained at every tier (the box gets its own pty, so TIOCSTI reaches only that); box run on your terminal: blocked at the kernel tiers (h5i's seccomp filter refuses TIOCSTI), possible at isolation=workspace; to close it there: sysctl -w dev.tty.legacy_tiocsti=0".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 OPTS\n";

    #[test]
    fn the_migrations_line_follows_the_cgroup2_mount_options() {
        let features = "nsdelegate\nfavordynmods\nmemory_localevents\n";
        let fast = migrations_line(features, &MOUNTINFO.replace("OPTS", "rw,favordynmods"));
        assert!(fast.starts_with("fast"), "{fast}");
        let slow = migrations_line(features, &MOUNTINFO.replace("OPTS", "rw,nsdelegate"));
        assert!(
            slow.contains("mount -o remount,favordynmods /sys/fs/cgroup/unified"),
            "{slow}"
        );
        let old_kernel = migrations_line("nsdelegate\n", &MOUNTINFO.replace("OPTS", "rw"));
        assert!(old_kernel.contains("no favordynmods"), "{old_kernel}");
        let v1_only = migrations_line(features, MOUNTINFO.lines().next().unwrap());
        assert!(v1_only.contains("no cgroup2 mount"), "{v1_only}");
    }

    #[test]
    fn the_tty_injection_line_follows_the_kernel_setting() {
        let dir = tempfile::tempdir().unwrap();
        let knob = dir.path().join("legacy_tiocsti");
        std::fs::write(&knob, "0\n").unwrap();
        assert!(tty_injection_line(&knob).starts_with("blocked at every tier"));
        std::fs::write(&knob, "1\n").unwrap();
        let open = tty_injection_line(&knob);
        assert!(
            open.contains("box shell: contained at every tier"),
            "{open}"
        );
        assert!(open.contains("possible at isolation=workspace"), "{open}");
        // No knob (a kernel before 6.2): nothing closes it there.
        assert_eq!(tty_injection_line(&dir.path().join("missing")), open);
    }
}
