//! Compiling h5i's seccomp profiles into BPF programs, per architecture.
//!
//! Owns the translation only: which lists a profile selects, the arch/x32 guard, the
//! default-deny base (`allowlist.rs`) as one filter, and one `seccompiler` filter per errno of
//! the deny list (`denylist.rs`). Syscalls are named in the lists and numbered by
//! `syscalls.rs`, so the programs for x86_64 and aarch64 both compile on any host: the unit
//! tests compare them with the golden data in `golden/` and run them through a small
//! interpreter to assert decisions for concrete calls, high-bit tricks included. Pure: nothing
//! here talks to the kernel (installing is the `kernel` seam's job).
//!
//! Profiles (annotation `h5i.seccomp`):
//! - `h5i-v2`: the default-deny base, then h5i-v1 as the second layer. What h5i's own bundles
//!   ask for at every kernel tier.
//! - `h5i-v1`: the deny list alone over the spec's own profile (kept for bundles that name it).
//!
//! Programs, in install order:
//! 1. (`h5i-v2`) the base: the allowed calls pass, every other call answers `ENOSYS` (why
//!    ENOSYS and not kill: see `allowlist.rs`), a foreign audit arch kills;
//! 2. the guard: a foreign audit arch (e.g. `int 0x80` i386 calls) kills the process, and on
//!    x86_64 any x32 syscall number (bit 30 set) answers `ENOSYS`: lists keyed on x86_64
//!    numbers must not be sidestepped through the x32 table;
//! 3. one filter per `Denial` in use (ENOSYS for clone3 and openat2, EPERM for the rest),
//!    default allow. Installed after the base, so their errno is the one a caller sees (the
//!    kernel keeps the most recent filter's answer among equally strict ones).
//!
//! Must never: emit a 64-bit comparison for an entry (the lists are 32-bit by design), return
//! an empty program list for a non-empty profile, or number a syscall from the build host's
//! headers when compiling for another architecture.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use h5i_policy::families::{grant_problem, FamilySet};

use super::allowlist::allowed_names;
use super::denylist::{Cond, Denial, DenyEntry, Gate, Op, When, H5I_V1};
use super::syscalls::{number, Arch};

/// The calls a verified socket gate answers itself (an `ERRNO` rule would outrank its
/// `USER_NOTIF` and hide them from it).
fn is_gated(name: &str) -> bool {
    name == "socket" || name == "socketpair"
}

/// The deny list alone, over the spec's own profile.
pub const PROFILE_H5I_V1: &str = "h5i-v1";
/// The default-deny base, then the deny list: what h5i's own bundles ask for.
pub const PROFILE_H5I_V2: &str = "h5i-v2";

/// `__X32_SYSCALL_BIT`: x32 syscall numbers have it set.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Why a profile could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The annotation named a profile this binary does not ship.
    #[error("refusing: unknown seccomp profile {0:?} in annotation h5i.seccomp; to fix: use \"h5i-v2\" (or \"h5i-v1\", the deny list alone) or drop the annotation")]
    UnknownProfile(String),
    /// `h5i.net.families` names a family that cannot be granted.
    #[error("refusing: annotation h5i.net.families: {0}; to fix: name only families the policy's net.families accepts, e.g. \"vsock\"")]
    Families(String),
    /// seccompiler rejected the generated filter (a bug in the list or the translation).
    #[error("refusing: could not compile the h5i seccomp filter: {0}")]
    Compile(#[from] seccompiler::BackendError),
    /// The build architecture has no seccomp support in this crate.
    #[error("refusing: h5i seccomp filters are not built for architecture {0}")]
    Arch(&'static str),
}

/// What `h5i.seccomp` (+ `h5i.net.unix`, `h5i.net.gate`) asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeccompProfile {
    /// Whether the default-deny base comes first (`h5i-v2`).
    pub base: bool,
    /// Whether `socket(AF_UNIX)` stays allowed (`h5i.net.unix`, default true).
    pub net_unix: bool,
    /// Whether the spec's verified socket gate answers `socket()` (`h5i.net.gate`): the
    /// list's `socket` and `socketpair` entries are then left to the gate.
    pub socket_gate: bool,
    /// The address families `socket()` may open (`h5i_policy::families`, with the grants of
    /// `h5i.net.families`); every other family answers `EPERM`.
    pub families: FamilySet,
}

impl SeccompProfile {
    /// Parse the profile name from `h5i.seccomp`.
    pub fn named(name: &str, net_unix: bool, socket_gate: bool) -> Result<Self, SeccompError> {
        let base = match name {
            PROFILE_H5I_V2 => true,
            PROFILE_H5I_V1 => false,
            other => return Err(SeccompError::UnknownProfile(other.to_string())),
        };
        Ok(Self {
            base,
            net_unix,
            socket_gate,
            families: FamilySet::allowed(net_unix, &[]),
        })
    }

    /// Grant the families named in `h5i.net.families` (comma-separated table names).
    pub fn with_granted_families(mut self, granted: &str) -> Result<Self, SeccompError> {
        let names: Vec<String> = granted
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        if let Some(problem) = names.iter().find_map(|n| grant_problem(n)) {
            return Err(SeccompError::Families(problem));
        }
        self.families = FamilySet::allowed(self.net_unix, &names);
        Ok(self)
    }

    /// The deny-list entries this profile enforces.
    pub fn entries(&self) -> impl Iterator<Item = &'static DenyEntry> + '_ {
        H5I_V1
            .iter()
            .filter(move |e| match e.gate {
                Gate::Base => true,
                Gate::NetUnixOff => !self.net_unix,
            })
            .filter(move |e| !(self.socket_gate && is_gated(e.name)))
    }

    /// The family allowlist as one rule: `socket(family, ...)` with `family` none of the
    /// allowed numbers. `None` when the gate answers `socket()` (it consults the same table).
    fn family_rule(&self) -> Result<Option<SeccompRule>, SeccompError> {
        if self.socket_gate {
            return Ok(None);
        }
        let conditions = self
            .families
            .numbers()
            .map(|n| {
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, u64::from(n))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The table always allows inet; should an edit ever empty the set, seccompiler refuses
        // the empty rule and the box does not start (never an allow-all).
        Ok(Some(SeccompRule::new(conditions)?))
    }

    /// Compile to BPF programs for the build architecture, in install order.
    pub fn compile(&self) -> Result<Vec<BpfProgram>, SeccompError> {
        let arch = Arch::host().ok_or(SeccompError::Arch(std::env::consts::ARCH))?;
        self.compile_for(arch)
    }

    /// Compile to BPF programs for `arch`, in install order.
    pub fn compile_for(&self, arch: Arch) -> Result<Vec<BpfProgram>, SeccompError> {
        let mut programs = Vec::new();
        if self.base {
            programs.push(base_program(arch)?);
        }
        programs.push(guard_program(arch));
        for denial in [Denial::Enosys, Denial::Eperm] {
            let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
            for entry in self.entries().filter(|e| e.denial == denial) {
                // A call the architecture lacks cannot be made there (its `*at` form is listed).
                let Some(nr) = number(entry.name, arch) else {
                    continue;
                };
                let chain = rules.entry(i64::from(nr)).or_default();
                if let When::AllOf(conds) = entry.when {
                    chain.push(rule(conds, arch)?);
                }
                // `When::Always` leaves the chain empty, which seccompiler reads as
                // "match unconditionally" (the registry test forbids mixing the two).
            }
            if denial == Denial::Eperm {
                if let (Some(rule), Some(nr)) = (self.family_rule()?, number("socket", arch)) {
                    rules.entry(i64::from(nr)).or_default().push(rule);
                }
            }
            if rules.is_empty() {
                continue;
            }
            let filter = SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::Errno(denial.errno() as u32),
                target(arch),
            )?;
            programs.push(BpfProgram::try_from(filter)?);
        }
        Ok(programs)
    }
}

/// The default-deny base: every allowed call (unconditionally: the argument checks are the
/// deny list's) passes, anything else answers `ENOSYS`.
fn base_program(arch: Arch) -> Result<BpfProgram, SeccompError> {
    let rules: BTreeMap<i64, Vec<SeccompRule>> = allowed_names()
        .filter_map(|name| number(name, arch))
        .map(|nr| (i64::from(nr), Vec::new()))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::ENOSYS as u32),
        SeccompAction::Allow,
        target(arch),
    )?;
    Ok(BpfProgram::try_from(filter)?)
}

fn rule(conds: &[Cond], arch: Arch) -> Result<SeccompRule, SeccompError> {
    let conditions = conds
        .iter()
        .map(|c| {
            let (op, value) = match c.op {
                Op::Eq(v) => (SeccompCmpOp::Eq, v),
                Op::Ne(v) => (SeccompCmpOp::Ne, v),
                Op::MaskedEq { mask, value } => (SeccompCmpOp::MaskedEq(u64::from(mask)), value),
                Op::HasOTmpfile => {
                    let bits = arch.o_tmpfile();
                    (SeccompCmpOp::MaskedEq(u64::from(bits)), bits)
                }
            };
            SeccompCondition::new(c.arg, SeccompCmpArgLen::Dword, op, u64::from(value))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SeccompRule::new(conditions)?)
}

fn target(arch: Arch) -> TargetArch {
    match arch {
        Arch::X86_64 => TargetArch::x86_64,
        Arch::Aarch64 => TargetArch::aarch64,
    }
}

/// BPF_LD | BPF_W | BPF_ABS (BPF_LD and BPF_W are 0).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_RET_K: u16 = 0x06;
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;

fn stmt(code: u16, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> seccompiler::sock_filter {
    seccompiler::sock_filter { code, jt, jf, k }
}

/// The arch/x32 guard (see the module doc).
fn guard_program(arch: Arch) -> BpfProgram {
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JMP_JEQ_K, arch.audit_arch(), 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
    ];
    if arch == Arch::X86_64 {
        p.extend([
            stmt(BPF_LD_W_ABS, OFFSET_NR),
            jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
            stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | (libc::ENOSYS as u32)),
        ]);
    }
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    p
}

/// A tiny classic-BPF interpreter for the subset seccompiler and the guard emit, so unit tests
/// can ask "what does the kernel answer for this call?" without installing anything.
#[cfg(test)]
pub(crate) mod eval {
    use seccompiler::sock_filter;

    /// `struct seccomp_data` as the kernel lays it out (little endian).
    pub struct Call {
        pub nr: i32,
        pub arch: u32,
        pub args: [u64; 6],
    }

    fn load(call: &Call, off: u32) -> u32 {
        match off {
            0 => call.nr as u32,
            4 => call.arch,
            o if (16..64).contains(&o) && o % 4 == 0 => {
                let arg = call.args[((o - 16) / 8) as usize];
                if (o - 16) % 8 == 0 {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            o => panic!("unexpected load offset {o}"),
        }
    }

    /// Run one program; returns the raw SECCOMP_RET_* value.
    pub fn run(prog: &[sock_filter], call: &Call) -> u32 {
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let ins = &prog[pc];
            pc += 1;
            match ins.code {
                0x20 => acc = load(call, ins.k),
                0x54 => acc &= ins.k,         // ALU AND K
                0x05 => pc += ins.k as usize, // JA
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let hit = match ins.code {
                        0x15 => acc == ins.k,
                        0x25 => acc > ins.k,
                        0x35 => acc >= ins.k,
                        _ => acc & ins.k != 0,
                    };
                    pc += usize::from(if hit { ins.jt } else { ins.jf });
                }
                0x06 => return ins.k,
                other => panic!("unsupported BPF opcode {other:#x}"),
            }
        }
    }

    /// The kernel's combination of stacked filters: the most restrictive action wins
    /// (KILL > TRAP > ERRNO > ... > ALLOW); ties go to the most recently installed filter.
    pub fn decide(progs: &[Vec<sock_filter>], call: &Call) -> u32 {
        let rank = |r: u32| match r & 0xffff_0000 {
            0x8000_0000 => 7, // KILL_PROCESS
            0x0000_0000 => 6, // KILL_THREAD
            0x0003_0000 => 5, // TRAP
            0x0005_0000 => 4, // ERRNO
            0x7fc0_0000 => 3, // USER_NOTIF
            0x7ff0_0000 => 2, // TRACE
            0x7ffc_0000 => 1, // LOG
            _ => 0,           // ALLOW
        };
        let mut best: Option<u32> = None;
        for prog in progs.iter().rev() {
            let r = run(prog, call);
            if best.is_none_or(|b| rank(r) > rank(b)) {
                best = Some(r);
            }
        }
        best.unwrap_or(libc::SECCOMP_RET_ALLOW)
    }
}

/// Golden data and per-architecture decisions: run on any build host, for both architectures.
#[cfg(test)]
mod per_arch_tests {
    use super::super::allowlist::LEFT_OUT;
    use super::eval::{decide, Call};
    use super::*;

    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    /// The default box's profile: h5i-v2 with `net.unix = false`, no gate, no grants.
    fn default_box() -> SeccompProfile {
        SeccompProfile::named(PROFILE_H5I_V2, false, false).unwrap()
    }

    /// One program per block, one instruction per line (`code jt jf k`, hex), so a change to
    /// a list shows up as a reviewable diff of the golden file.
    fn render(programs: &[BpfProgram]) -> String {
        let mut out = String::new();
        for (i, p) in programs.iter().enumerate() {
            out.push_str(&format!("# program {i}: {} instructions\n", p.len()));
            for ins in p {
                out.push_str(&format!(
                    "{:04x} {:02x} {:02x} {:08x}\n",
                    ins.code, ins.jt, ins.jf, ins.k
                ));
            }
        }
        out
    }

    fn golden_path(arch: Arch) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/confine/golden")
            .join(format!("h5i-v2.{}.bpf", arch.name()))
    }

    /// The generator's output is checked in; a list change must come with new golden data
    /// (`H5I_BLESS_SECCOMP=1 cargo test -p h5i-runtime golden` rewrites it, for review).
    #[test]
    fn the_compiled_filters_match_the_golden_data_for_each_architecture() {
        for arch in Arch::ALL {
            let got = render(&default_box().compile_for(arch).unwrap());
            let path = golden_path(arch);
            if std::env::var_os("H5I_BLESS_SECCOMP").is_some() {
                std::fs::write(&path, &got).unwrap();
            }
            let want = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                got == want,
                "{}: compiled BPF differs from the golden data; review the list change and bless it",
                path.display()
            );
        }
    }

    fn call(arch: Arch, name: &str, args: &[u64]) -> Call {
        let nr = number(name, arch).unwrap_or_else(|| panic!("{name} on {arch:?}"));
        raw(arch, nr as i32, args)
    }

    fn raw(arch: Arch, nr: i32, args: &[u64]) -> Call {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        Call {
            nr,
            arch: arch.audit_arch(),
            args: a,
        }
    }

    #[test]
    fn on_both_architectures_the_base_allows_its_list_and_answers_enosys_for_the_rest() {
        for arch in Arch::ALL {
            let progs = default_box().compile_for(arch).unwrap();
            let filtered = |name: &str| H5I_V1.iter().any(|e| e.name == name);
            for name in allowed_names().filter(|n| !filtered(n)) {
                if number(name, arch).is_some() {
                    assert_eq!(decide(&progs, &call(arch, name, &[])), ALLOW, "{name}");
                }
            }
            for name in LEFT_OUT.iter().flat_map(|g| g.names.iter()) {
                if number(name, arch).is_some() {
                    assert_eq!(decide(&progs, &call(arch, name, &[])), ENOSYS, "{name}");
                }
            }
            // Numbers no table holds (a future syscall) are unknown, not allowed.
            for nr in [470, 999, 0x3fff_ffff] {
                assert_eq!(decide(&progs, &raw(arch, nr, &[])), ENOSYS, "{nr}");
            }
            // h5i-v1 alone allows what the base would refuse.
            let v1 = SeccompProfile::named(PROFILE_H5I_V1, false, false)
                .unwrap()
                .compile_for(arch)
                .unwrap();
            assert_eq!(decide(&v1, &call(arch, "syslog", &[])), ALLOW);
            assert_eq!(decide(&progs, &call(arch, "syslog", &[])), ENOSYS);
        }
    }

    #[test]
    fn on_both_architectures_the_deny_lists_errno_outranks_the_bases_enosys() {
        for arch in Arch::ALL {
            let progs = default_box().compile_for(arch).unwrap();
            for e in H5I_V1.iter().filter(|e| e.when == When::Always) {
                let want = libc::SECCOMP_RET_ERRNO | e.denial.errno() as u32;
                assert_eq!(decide(&progs, &call(arch, e.name, &[])), want, "{}", e.name);
            }
        }
    }

    /// Issue 12's remainder: the set-id argument filters, numbered for aarch64 too.
    #[test]
    fn on_both_architectures_every_setid_mode_is_refused_and_plain_modes_are_not() {
        for arch in Arch::ALL {
            let progs = default_box().compile_for(arch).unwrap();
            let d = |name: &str, args: &[u64]| decide(&progs, &call(arch, name, args));
            let creat = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
            let tmpfile = u64::from(arch.o_tmpfile()) | libc::O_RDWR as u64;
            for mode in [0o4755u64, 0o2755, 0o6755, 0o6755 | (1 << 32)] {
                assert_eq!(d("fchmod", &[3, mode]), EPERM, "{arch:?} fchmod {mode:o}");
                assert_eq!(d("fchmodat", &[3, 0, mode]), EPERM, "{arch:?} {mode:o}");
                assert_eq!(d("fchmodat2", &[3, 0, mode, 0]), EPERM, "{arch:?} {mode:o}");
                assert_eq!(d("mkdirat", &[3, 0, mode]), EPERM, "{arch:?} {mode:o}");
                assert_eq!(d("mknodat", &[3, 0, mode, 0]), EPERM, "{arch:?} {mode:o}");
                assert_eq!(
                    d("openat", &[3, 0, creat, mode]),
                    EPERM,
                    "{arch:?} {mode:o}"
                );
                assert_eq!(
                    d("openat", &[3, 0, tmpfile, mode]),
                    EPERM,
                    "{arch:?} {mode:o}"
                );
                // Without O_CREAT/O_TMPFILE the mode is ignored by the kernel and the filter.
                assert_eq!(d("openat", &[3, 0, 0, mode]), ALLOW, "{arch:?} {mode:o}");
            }
            for mode in [0o755u64, 0o644, 0o1777] {
                assert_eq!(d("fchmodat", &[3, 0, mode]), ALLOW, "{arch:?} {mode:o}");
                assert_eq!(
                    d("openat", &[3, 0, creat, mode]),
                    ALLOW,
                    "{arch:?} {mode:o}"
                );
                assert_eq!(d("mkdirat", &[3, 0, mode]), ALLOW, "{arch:?} {mode:o}");
            }
            assert_eq!(d("openat2", &[3, 0, 0, 24]), ENOSYS, "{arch:?}");
        }
        // aarch64 has no open/creat/chmod/mkdir/mknod: the `*at` entries are the whole story.
        assert_eq!(number("chmod", Arch::Aarch64), None);
        assert_eq!(number("fchmodat", Arch::Aarch64), Some(53));
    }

    #[test]
    fn on_both_architectures_a_foreign_arch_is_killed() {
        for arch in Arch::ALL {
            let progs = default_box().compile_for(arch).unwrap();
            let other = Arch::ALL.into_iter().find(|a| *a != arch).unwrap();
            let mut c = call(arch, "read", &[]);
            c.arch = other.audit_arch();
            assert_eq!(
                decide(&progs, &c),
                libc::SECCOMP_RET_KILL_PROCESS,
                "{arch:?}"
            );
        }
    }
}

#[cfg(test)]
#[cfg(target_arch = "x86_64")]
// ioctl request constants are u64 on x86_64 glibc but not everywhere.
#[allow(clippy::unnecessary_cast)]
mod tests {
    use super::eval::{decide, Call};
    use super::*;

    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    const AUDIT_ARCH_NATIVE: u32 = 0xC000_003E;

    /// h5i-v2: every deny-list assertion below is made through the base too, so each also
    /// proves the deny list's errno survives the layering.
    fn programs(net_unix: bool) -> Vec<BpfProgram> {
        SeccompProfile::named(PROFILE_H5I_V2, net_unix, false)
            .unwrap()
            .compile()
            .unwrap()
    }

    fn call(nr: libc::c_long, args: &[u64]) -> Call {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        Call {
            nr: nr as i32,
            arch: AUDIT_ARCH_NATIVE,
            args: a,
        }
    }

    fn verdict(net_unix: bool, nr: libc::c_long, args: &[u64]) -> u32 {
        decide(&programs(net_unix), &call(nr, args))
    }

    fn gated_verdict(net_unix: bool, nr: libc::c_long, args: &[u64]) -> u32 {
        let programs = SeccompProfile::named(PROFILE_H5I_V2, net_unix, true)
            .unwrap()
            .compile()
            .unwrap();
        decide(&programs, &call(nr, args))
    }

    #[test]
    fn unknown_profile_is_refused() {
        assert!(matches!(
            SeccompProfile::named("h5i-v0", true, false),
            Err(SeccompError::UnknownProfile(_))
        ));
        assert!(SeccompProfile::named(PROFILE_H5I_V1, true, false).is_ok());
    }

    #[test]
    fn every_unconditional_entry_answers_its_errno() {
        for e in H5I_V1.iter().filter(|e| e.when == When::Always) {
            let want = libc::SECCOMP_RET_ERRNO | e.denial.errno() as u32;
            let nr = number(e.name, Arch::X86_64).unwrap();
            assert_eq!(verdict(true, nr.into(), &[]), want, "{}", e.name);
        }
    }

    #[test]
    fn ordinary_calls_are_allowed() {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
        ] {
            assert_eq!(verdict(false, nr, &[3, 0, 0]), ALLOW);
        }
        assert_eq!(
            verdict(false, libc::SYS_socketpair, &[libc::AF_UNIX as u64, 1, 0]),
            ALLOW
        );
    }

    #[test]
    fn clone3_answers_enosys_so_libc_falls_back() {
        assert_eq!(verdict(true, libc::SYS_clone3, &[0, 88]), ENOSYS);
    }

    #[test]
    fn clone_with_namespace_flags_is_denied_plain_fork_is_not() {
        let fork_flags = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID) as u64 | 17;
        let thread_flags = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        assert_eq!(verdict(true, libc::SYS_clone, &[fork_flags]), ALLOW);
        assert_eq!(verdict(true, libc::SYS_clone, &[thread_flags]), ALLOW);
        for ns in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWCGROUP,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
        ] {
            let flags = fork_flags | ns as u64;
            assert_eq!(verdict(true, libc::SYS_clone, &[flags]), EPERM, "{ns:#x}");
            // High bits set do not hide the namespace bit.
            assert_eq!(
                verdict(true, libc::SYS_clone, &[flags | (0xdead << 32)]),
                EPERM
            );
        }
    }

    #[test]
    fn tiocsti_with_high_bits_set_is_still_denied() {
        let tiocsti = libc::TIOCSTI as u64;
        assert_eq!(verdict(true, libc::SYS_ioctl, &[0, tiocsti]), EPERM);
        assert_eq!(
            verdict(true, libc::SYS_ioctl, &[0, tiocsti | (1 << 32)]),
            EPERM
        );
        assert_eq!(
            verdict(true, libc::SYS_ioctl, &[0, tiocsti | (0xffff_ffff << 32)]),
            EPERM
        );
        let tioclinux = libc::TIOCLINUX as u64;
        assert_eq!(
            verdict(true, libc::SYS_ioctl, &[0, tioclinux | (7 << 40)]),
            EPERM
        );
        // Other terminal ioctls (isatty's TCGETS, window size) stay allowed.
        assert_eq!(
            verdict(true, libc::SYS_ioctl, &[0, libc::TCGETS as u64]),
            ALLOW
        );
        assert_eq!(
            verdict(true, libc::SYS_ioctl, &[0, libc::TIOCGWINSZ as u64]),
            ALLOW
        );
    }

    #[test]
    fn personality_allows_only_linux_and_query() {
        assert_eq!(verdict(true, libc::SYS_personality, &[0]), ALLOW);
        assert_eq!(verdict(true, libc::SYS_personality, &[0xffff_ffff]), ALLOW);
        // The kernel reads an unsigned int: high bits are ignored by it and by the filter.
        assert_eq!(verdict(true, libc::SYS_personality, &[1 << 32]), ALLOW);
        assert_eq!(verdict(true, libc::SYS_personality, &[0x0040_0000]), EPERM); // READ_IMPLIES_EXEC
        assert_eq!(verdict(true, libc::SYS_personality, &[0x0004_0000]), EPERM); // ADDR_NO_RANDOMIZE
        assert_eq!(verdict(true, libc::SYS_personality, &[0x0008]), EPERM); // PER_BSD
    }

    #[test]
    fn raw_and_packet_sockets_are_denied() {
        let s = libc::SYS_socket;
        let nb = (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64;
        assert_eq!(
            verdict(true, s, &[libc::AF_PACKET as u64, libc::SOCK_RAW as u64]),
            EPERM
        );
        assert_eq!(
            verdict(true, s, &[libc::AF_PACKET as u64, libc::SOCK_DGRAM as u64]),
            EPERM
        );
        for fam in [libc::AF_INET, libc::AF_INET6] {
            let fam = fam as u64;
            assert_eq!(verdict(true, s, &[fam, libc::SOCK_RAW as u64, 1]), EPERM);
            assert_eq!(
                verdict(true, s, &[fam, libc::SOCK_RAW as u64 | nb, 1]),
                EPERM
            );
            assert_eq!(
                verdict(true, s, &[fam | (1 << 32), libc::SOCK_RAW as u64]),
                EPERM
            );
            assert_eq!(
                verdict(true, s, &[fam, libc::SOCK_STREAM as u64 | nb]),
                ALLOW
            );
            assert_eq!(verdict(true, s, &[fam, libc::SOCK_DGRAM as u64]), ALLOW);
        }
    }

    #[test]
    fn net_unix_off_denies_unix_sockets_but_not_socketpair() {
        let unix = libc::AF_UNIX as u64;
        let stream = libc::SOCK_STREAM as u64;
        assert_eq!(verdict(true, libc::SYS_socket, &[unix, stream]), ALLOW);
        assert_eq!(verdict(false, libc::SYS_socket, &[unix, stream]), EPERM);
        assert_eq!(
            verdict(false, libc::SYS_socket, &[unix | (1 << 32), stream]),
            EPERM
        );
        assert_eq!(verdict(false, libc::SYS_socketpair, &[unix, stream]), ALLOW);
        assert_eq!(
            verdict(false, libc::SYS_socket, &[libc::AF_INET as u64, stream]),
            ALLOW
        );
    }

    #[test]
    fn x32_numbers_cannot_sidestep_the_list() {
        let x32_unshare = (libc::SYS_unshare as u64 | u64::from(X32_SYSCALL_BIT)) as libc::c_long;
        assert_eq!(verdict(true, x32_unshare, &[0]), ENOSYS);
        let x32_read = (libc::SYS_read as u64 | u64::from(X32_SYSCALL_BIT)) as libc::c_long;
        assert_eq!(verdict(true, x32_read, &[0]), ENOSYS);
    }

    #[test]
    fn foreign_arch_is_killed() {
        let mut c = call(libc::SYS_read, &[]);
        c.arch = 0x4000_0003; // AUDIT_ARCH_I386
        let r = decide(&programs(true), &c);
        assert_eq!(r, libc::SECCOMP_RET_KILL_PROCESS);
    }
    #[test]
    fn with_a_verified_gate_socket_calls_are_left_to_it_and_nothing_else_changes() {
        let s = libc::SYS_socket;
        for net_unix in [true, false] {
            for (fam, ty) in [
                (libc::AF_PACKET, libc::SOCK_RAW),
                (libc::AF_INET, libc::SOCK_RAW),
                (libc::AF_INET6, libc::SOCK_RAW),
                (libc::AF_INET, 10), // SOCK_PACKET
                (libc::AF_UNIX, libc::SOCK_STREAM),
            ] {
                // The static list no longer answers ERRNO, which would outrank the gate's
                // USER_NOTIF: the call reaches the gate, which refuses it itself.
                assert_eq!(
                    gated_verdict(net_unix, s, &[fam as u64, ty as u64]),
                    ALLOW,
                    "{fam}/{ty}"
                );
            }
        }
        let gated: Vec<_> = SeccompProfile::named(PROFILE_H5I_V2, false, true)
            .unwrap()
            .entries()
            .map(|e| (e.name, e.when))
            .collect();
        let plain: Vec<_> = SeccompProfile::named(PROFILE_H5I_V2, false, false)
            .unwrap()
            .entries()
            .filter(|e| !is_gated(e.name))
            .map(|e| (e.name, e.when))
            .collect();
        assert_eq!(
            gated, plain,
            "only the socket and socketpair entries differ"
        );
        // The family allowlist is the gate's too: no ERRNO for vsock, the gate answers it.
        assert_eq!(
            gated_verdict(true, s, &[libc::AF_VSOCK as u64, libc::SOCK_STREAM as u64]),
            ALLOW
        );
        assert_eq!(gated_verdict(true, libc::SYS_unshare, &[0]), EPERM);
        assert_eq!(
            gated_verdict(true, libc::SYS_io_uring_setup, &[1, 0]),
            EPERM
        );
    }

    /// (syscall, index of the mode argument) for every call that sets a mode outright.
    const MODE_SETTERS: [(libc::c_long, usize); 8] = [
        (libc::SYS_chmod, 1),
        (libc::SYS_fchmod, 1),
        (libc::SYS_fchmodat, 2),
        (libc::SYS_fchmodat2, 2),
        (libc::SYS_creat, 1),
        (libc::SYS_mkdir, 1),
        (libc::SYS_mkdirat, 2),
        (libc::SYS_mknodat, 2),
    ];

    fn with_mode(index: usize, mode: u64) -> Vec<u64> {
        let mut args = vec![3u64; 4];
        args[index] = mode;
        args
    }

    #[test]
    fn setting_a_setuid_or_setgid_mode_is_refused_by_every_mode_setter() {
        let mut setters = MODE_SETTERS.to_vec();
        setters.push((libc::SYS_mknod, 1));
        for (nr, index) in setters {
            for mode in [
                0o4755,
                0o2755,
                0o6755,
                0o4000,
                0o2000,
                0o104755,
                0o6755 | (1 << 32),
            ] {
                assert_eq!(
                    verdict(true, nr, &with_mode(index, mode)),
                    EPERM,
                    "{nr} {mode:o}"
                );
            }
            for mode in [0o755, 0o644, 0o1777, 0o777, 0o100644, 0] {
                assert_eq!(
                    verdict(true, nr, &with_mode(index, mode)),
                    ALLOW,
                    "{nr} {mode:o}"
                );
            }
            // The other arguments never decide: a set-id bit in a path pointer or dirfd is not
            // a mode.
            let mut args = vec![0o6755u64; 4];
            args[index] = 0o755;
            assert_eq!(
                verdict(true, nr, &args),
                ALLOW,
                "{nr}: wrong argument tested"
            );
        }
    }

    #[test]
    fn open_with_a_setid_mode_is_refused_only_when_it_creates() {
        let creat = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
        let tmpfile = libc::O_TMPFILE as u64 | libc::O_RDWR as u64;
        for (nr, flags_at, mode_at) in [(libc::SYS_open, 1, 2), (libc::SYS_openat, 2, 3)] {
            let call = |flags: u64, mode: u64| {
                let mut args = vec![3u64; 4];
                args[flags_at] = flags;
                args[mode_at] = mode;
                verdict(true, nr, &args)
            };
            for mode in [0o4755, 0o2755, 0o6755] {
                assert_eq!(call(creat, mode), EPERM, "{nr} creat {mode:o}");
                assert_eq!(call(tmpfile, mode), EPERM, "{nr} tmpfile {mode:o}");
                // Without O_CREAT/O_TMPFILE the kernel ignores the mode.
                assert_eq!(
                    call(libc::O_RDONLY as u64, mode),
                    ALLOW,
                    "{nr} read {mode:o}"
                );
            }
            assert_eq!(call(creat, 0o644), ALLOW);
            assert_eq!(call(creat | libc::O_EXCL as u64, 0o755), ALLOW);
        }
    }

    #[test]
    fn openat2_answers_enosys_so_callers_fall_back() {
        assert_eq!(verdict(true, libc::SYS_openat2, &[3, 0, 0, 24]), ENOSYS);
    }

    #[test]
    fn every_family_the_table_refuses_is_refused_and_a_grant_opens_exactly_it() {
        use h5i_policy::families::{FamilyVerdict, ADDRESS_FAMILIES};
        let stream = libc::SOCK_STREAM as u64;
        for net_unix in [true, false] {
            for f in ADDRESS_FAMILIES {
                let want = match f.verdict {
                    FamilyVerdict::Allowed => ALLOW,
                    FamilyVerdict::NetUnix if net_unix => ALLOW,
                    _ => EPERM,
                };
                let got = verdict(net_unix, libc::SYS_socket, &[u64::from(f.number), stream]);
                assert_eq!(got, want, "{} (net.unix {net_unix})", f.name);
                // High bits never turn a refused family into an allowed one, or back.
                let high = u64::from(f.number) | (0x7fff_0000 << 32);
                assert_eq!(verdict(net_unix, libc::SYS_socket, &[high, stream]), want);
            }
            // Numbers beyond the table (future families) are refused too.
            for n in [46u64, 63, 64, 0xffff_ffff] {
                assert_eq!(verdict(net_unix, libc::SYS_socket, &[n, stream]), EPERM);
            }
        }
        let granted = SeccompProfile::named(PROFILE_H5I_V1, false, false)
            .unwrap()
            .with_granted_families("vsock")
            .unwrap()
            .compile()
            .unwrap();
        let vsock = call(libc::SYS_socket, &[libc::AF_VSOCK as u64, stream]);
        assert_eq!(decide(&granted, &vsock), ALLOW);
        let alg = call(libc::SYS_socket, &[libc::AF_ALG as u64, 5]);
        assert_eq!(decide(&granted, &alg), EPERM);
        for bad in ["packet", "unix", "inet", "nope"] {
            assert!(matches!(
                SeccompProfile::named(PROFILE_H5I_V1, false, false)
                    .unwrap()
                    .with_granted_families(bad),
                Err(SeccompError::Families(_))
            ));
        }
    }

    #[test]
    fn the_family_table_numbers_are_the_kernels() {
        use h5i_policy::families::by_name;
        for (name, af) in [
            ("unix", libc::AF_UNIX),
            ("inet", libc::AF_INET),
            ("inet6", libc::AF_INET6),
            ("netlink", libc::AF_NETLINK),
            ("packet", libc::AF_PACKET),
            ("can", libc::AF_CAN),
            ("tipc", libc::AF_TIPC),
            ("bluetooth", libc::AF_BLUETOOTH),
            ("alg", libc::AF_ALG),
            ("vsock", libc::AF_VSOCK),
            ("xdp", libc::AF_XDP),
            ("key", libc::AF_KEY),
            ("rds", libc::AF_RDS),
            ("rxrpc", libc::AF_RXRPC),
            ("nfc", libc::AF_NFC),
        ] {
            assert_eq!(by_name(name).unwrap().number, af as u32, "{name}");
        }
    }

    #[test]
    fn socketpair_is_refused_for_every_family_but_unix() {
        let stream = libc::SOCK_STREAM as u64;
        for net_unix in [true, false] {
            let unix = libc::AF_UNIX as u64;
            assert_eq!(
                verdict(net_unix, libc::SYS_socketpair, &[unix, stream]),
                ALLOW
            );
            for fam in [libc::AF_TIPC, libc::AF_VSOCK, libc::AF_INET] {
                assert_eq!(
                    verdict(net_unix, libc::SYS_socketpair, &[fam as u64, stream]),
                    EPERM
                );
            }
        }
    }
}
