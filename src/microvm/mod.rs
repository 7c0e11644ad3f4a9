//! The microvm tier: the box is a virtual machine with its own kernel, so a kernel exploit in
//! the box meets a hypervisor, not the host kernel.
//!
//! Two backends behind one tier. This build runs the **QEMU** backend (Debian's
//! `qemu-system-x86`, `-M microvm`):
//! 1. the guest kernel is a Debian kernel package's ([`kernel`]), with the few modules the
//!    guest needs in an initramfs whose `/init` is h5i's static guest agent ([`initramfs`],
//!    the `h5i-guest` crate);
//! 2. the guest root is the box's pinned OCI image, converted once into a read-only ext4 disk
//!    ([`rootfs`]); `/work` and the spool are 9p shares of the box's workspace and spool (this
//!    host's QEMU has no virtiofsd); each warm cache the box gets ([`CacheShares`]: the current
//!    key's data directory, as at the container tier) is a 9p share QEMU serves read-only
//!    (`readonly=on`), mounted read-only by the guest at `/.h5i/cache/<eco>` with the package
//!    manager's variables set for the run;
//! 3. the VM boots at the box's first run and stays up for the box's life ([`vm`]), booted
//!    again only when what it was booted from changes, which includes the caches' keys: a
//!    lockfile change, a `box cache refresh` or a `box cache rm` between two runs means the
//!    next run gets a VM that has never had the stale key's share; each run
//!    is a session with the guest agent over a virtio-serial port ([`client`]), its exit code,
//!    stdout and stderr passed through (or, for `box shell`, a pty in the guest proxied to the
//!    caller's terminal), `mem`/`procs` held by a cgroup in the guest and the
//!    VM's size, `wall` by the host;
//! 4. KVM when this host's KVM can run a stock guest, software emulation (TCG) otherwise,
//!    said plainly by `probe` and `status` ([`accel`]);
//! 5. the guest has no network device: a run whose policy allows egress reaches the broker's
//!    egress proxy (pinned allowlist, per-request tally in the receipt) through a forward on
//!    the guest's loopback carried over its session ([`forward`]), and nothing else.
//!
//! The **msb** backend (microsandbox) serves a box instead when the host has all three of msb's
//! requirements for its image ([`msb`]: h5i's contract with `msb`, tested against a recording
//! fake, since msb cannot run on this kind of host).
//!
//! Must never: give the guest a network device (its only way out is the forward to the
//! egress proxy, and only for a run whose policy allows egress; `net.mode = "host"` is
//! refused), share a host path beyond the box's workspace and spool (read-write) and the current
//! key's data directory of each warm cache the run's grant names (read-only: QEMU's
//! `readonly=on`, a read-only mount in the guest, and a read-only Landlock rule on QEMU; never a
//! stale key's, another entry's `refresh.json` or built tree, or the cache root), run QEMU as
//! root, or call an emulated guest accelerated.
//!
//! Guarded by `tests/microvm.rs` (real guests under QEMU) and the unit tests of each module.

pub mod accel;
pub mod client;
pub mod confine;
pub mod forward;
pub mod initramfs;
pub mod kernel;
pub mod msb;
pub mod rootfs;
pub mod vm;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use h5i_guest::proto::RunSpec;
use h5i_policy::receipt::{CgroupUsage, EgressTally, ExitOutcome, OomReport, Rusage};
use h5i_policy::{NetMode, ResolvedPolicy};
use h5i_runtime::supervise::ChildReport;

use crate::error::BoxError;
use crate::store::StoredBox;

/// Where the guest sees the box's workspace.
pub const GUEST_WORK: &str = "/work";
/// Where the guest sees the box's spool.
pub const GUEST_SPOOL: &str = "/.h5i/spool";
/// RAM the guest kernel, its tmpfs root overlay and the agent need beyond the run's `mem`.
pub const OVERHEAD_MIB: u64 = 192;
/// The guest's RAM when the policy sets no `mem`.
pub const DEFAULT_RAM_MIB: u64 = 1024;

fn refuse(what: impl Into<String>, mend: impl Into<String>) -> BoxError {
    BoxError::BadRequest {
        what: what.into(),
        mend: mend.into(),
    }
}

/// Where the static guest agent is: beside h5i (an install), else the musl build of this
/// workspace (`target/x86_64-unknown-linux-musl/release/h5i-guest` beside `target/release`).
pub fn agent_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let mut candidates = vec![dir.join("h5i-guest")];
    if let Some(target) = dir.parent() {
        candidates.push(target.join("x86_64-unknown-linux-musl/release/h5i-guest"));
        if let Some(up) = target.parent() {
            candidates.push(up.join("x86_64-unknown-linux-musl/release/h5i-guest"));
        }
    }
    candidates
        .into_iter()
        .find(|p| p.is_file() && initramfs::is_static_elf(p))
}

/// The facts the QEMU backend needs, each with its mend.
#[derive(Debug, Clone)]
pub struct QemuFacts {
    /// `qemu-system-x86_64 --version`'s first line.
    pub qemu: Result<String, String>,
    /// The guest kernel.
    pub kernel: Result<kernel::GuestKernel, String>,
    /// The static guest agent.
    pub agent: Result<PathBuf, String>,
    /// `mke2fs` (the image-to-root conversion).
    pub mke2fs: Result<(), String>,
    /// KVM or emulation, and the sentence for it.
    pub accel: (accel::Accel, String),
}

/// Ask the host.
pub fn qemu_facts() -> QemuFacts {
    let qemu = std::process::Command::new(accel::QEMU)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{} cannot be run ({e}); to fix: apt-get install qemu-system-x86 (`make setup` does)", accel::QEMU))
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout);
            match o.status.success() {
                true => Ok(text.lines().next().unwrap_or("").to_owned()),
                false => Err(format!("`{} --version` failed", accel::QEMU)),
            }
        });
    let kernel = kernel::find(Path::new("/boot"), Path::new("/lib/modules"))
        .map_err(|e| format!("{e}; to fix: apt-get install linux-image-amd64 (`make setup` does)"));
    let agent = agent_binary().ok_or_else(|| {
        "the static guest agent h5i-guest is not beside h5i; to fix: `make build` (cargo build --release -p h5i-guest --target x86_64-unknown-linux-musl) or `make install`".to_string()
    });
    let mke2fs = std::process::Command::new("mke2fs")
        .arg("-V")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("mke2fs cannot be run ({e}); to fix: apt-get install e2fsprogs"))
        .map(drop);
    QemuFacts {
        qemu,
        kernel,
        agent,
        mke2fs,
        accel: accel::choose(&accel::kvm_facts()),
    }
}

impl QemuFacts {
    /// Whether the QEMU backend can run here, or the first thing missing.
    pub fn ready(&self) -> Result<(), String> {
        self.qemu.as_ref().map(drop).map_err(String::clone)?;
        self.kernel.as_ref().map(drop).map_err(String::clone)?;
        self.agent.as_ref().map(drop).map_err(String::clone)?;
        self.mke2fs.clone()
    }

    /// `box probe`'s lines.
    pub fn lines(&self) -> Vec<(String, String)> {
        let show = |r: Result<String, String>| r.unwrap_or_else(|e| e);
        vec![
            (
                "microvm qemu".into(),
                show(self.qemu.clone().map(|v| format!("{v} (-M microvm)"))),
            ),
            (
                "microvm kernel".into(),
                show(
                    self.kernel
                        .as_ref()
                        .map(|k| {
                            format!(
                                "{} ({} modules in the initramfs)",
                                k.vmlinuz.display(),
                                k.modules.len()
                            )
                        })
                        .map_err(String::clone),
                ),
            ),
            (
                "microvm agent".into(),
                show(
                    self.agent
                        .as_ref()
                        .map(|p| format!("{} (static)", p.display()))
                        .map_err(String::clone),
                ),
            ),
            ("microvm acceleration".into(), self.accel.1.clone()),
            (
                "microvm msb".into(),
                msb::probe_line(&msb::MsbFacts::gather()),
            ),
        ]
    }
}

/// Mark the microvm tier available when a backend can run here and the container engine
/// (which holds the images it boots) answered; else unavailable with the first reason.
pub fn set_availability<T>(
    tiers: &mut h5i_policy::HostTiers,
    qemu: &QemuFacts,
    container: &Result<T, String>,
) {
    let why = qemu.ready().err().or_else(|| {
        container.as_ref().err().map(|e| {
            format!(
                "the container engine, which holds the images a microVM boots, is unavailable: {e}"
            )
        })
    });
    let msb_runs = msb::MsbFacts::gather().missing(None).is_empty();
    let root = h5i_sys::ids::euid() == 0;
    match for_auto(why, msb_runs, qemu.accel.0, root) {
        AutoChoice::Available => tiers.set_available(h5i_policy::Tier::Microvm),
        AutoChoice::OnRequest(r) => tiers.set_on_request(h5i_policy::Tier::Microvm, r),
        AutoChoice::Unavailable(r) => tiers.set_unavailable(h5i_policy::Tier::Microvm, r),
    };
}

/// How `auto` may treat the microvm tier.
#[derive(Debug, PartialEq, Eq)]
enum AutoChoice {
    Available,
    OnRequest(&'static str),
    Unavailable(String),
}

/// `auto`, which picks the strongest tier that runs, lands a box on the QEMU backend only where
/// a person uses it as they use every other tier: KVM (a run pays no emulation; its guest
/// terminal serves `box shell`), and root (a policy's egress allowlist needs the forward's
/// network namespace, which only root makes here). Under TCG every run pays for the emulation,
/// so it runs on request only.
fn for_auto(
    qemu_missing: Option<String>,
    msb_runs: bool,
    accel: accel::Accel,
    root: bool,
) -> AutoChoice {
    match (qemu_missing, msb_runs, accel, root) {
        (_, true, _, _) => AutoChoice::Available,
        (Some(why), false, _, _) => AutoChoice::Unavailable(why),
        (None, false, accel::Accel::Tcg, _) => {
            AutoChoice::OnRequest("its QEMU backend is software-emulated (TCG) here")
        }
        (None, false, accel::Accel::Kvm, false) => AutoChoice::OnRequest(
            "its QEMU backend's egress forward needs root here, and h5i is not running as root",
        ),
        (None, false, accel::Accel::Kvm, true) => AutoChoice::Available,
    }
}

/// What one microvm run observed.
#[derive(Debug)]
pub struct MicrovmRun {
    /// The host's report of the run (exit, the guest cgroup's CPU time, wall).
    pub child: ChildReport,
    /// OOM evidence from the run's guest cgroup.
    pub oom: Option<OomReport>,
    /// The guest cgroup's figures (`None` on msb, whose client is all h5i reaps).
    pub usage: Option<CgroupUsage>,
    /// The egress proxy's tally (`None` when the run could reach nothing, and on msb).
    pub egress: Option<EgressTally>,
}

/// Everything a run needs beyond the box and its policy.
pub struct RunInputs<'a> {
    /// Command and arguments.
    pub argv: &'a [OsString],
    /// The wall clock.
    pub wall: Option<Duration>,
    /// Resolved secrets (injected as environment, through the session, never argv).
    pub secrets: &'a [h5i_broker::secrets::ResolvedSecret],
    /// Pipes, or the caller's terminal proxied to a pty in the guest (`box shell`).
    pub stdio: client::CallerStdio,
    /// What the box's warm caches grant the run (`crate::cache::run_grant`): read-only binds
    /// of the current keys' data directories at `/.h5i/cache/<eco>`, and their variables.
    pub caches: &'a crate::process::CacheGrant,
}

/// The run's cache grant as the VM's read-only shares, or a refusal (fail closed) for a bind
/// this backend cannot carry as one: writable, or anywhere but `/.h5i/cache/<eco>`, or more
/// than [`h5i_guest::caches::MAX`].
struct CacheShares(Vec<vm::CacheShare>);

impl CacheShares {
    fn of(grant: &crate::process::CacheGrant) -> Result<CacheShares, BoxError> {
        let unfit = |what: String| {
            refuse(
                format!("the microvm tier cannot carry the box's cache grant: {what}"),
                "report this as an h5i bug; `h5i box cache mounts NAME` shows the grant",
            )
        };
        if !grant.overlays.is_empty() {
            return Err(unfit("it overlays a built tree".into()));
        }
        if grant.binds.len() > h5i_guest::caches::MAX {
            return Err(unfit(format!(
                "it names more than {} caches",
                h5i_guest::caches::MAX
            )));
        }
        let mut out = Vec::with_capacity(grant.binds.len());
        for b in &grant.binds {
            let eco = b
                .dest
                .strip_prefix(h5i_guest::caches::ROOT)
                .ok()
                .and_then(|rest| rest.to_str())
                .filter(|e| h5i_guest::caches::is_name(e))
                .ok_or_else(|| unfit(format!("{} is not a cache's place", b.dest.display())))?;
            if b.writable {
                return Err(unfit(format!("{} is writable", b.dest.display())));
            }
            let meta = std::fs::metadata(&b.source).map_err(|e| BoxError::io(&b.source, e))?;
            out.push(vm::CacheShare {
                eco: eco.to_owned(),
                data: b.source.clone(),
                identity: (
                    std::os::unix::fs::MetadataExt::dev(&meta),
                    std::os::unix::fs::MetadataExt::ino(&meta),
                ),
            });
        }
        Ok(CacheShares(out))
    }
}

/// Refuse what this backend cannot hold.
fn check_policy(sb: &StoredBox, policy: &ResolvedPolicy) -> Result<(), BoxError> {
    if policy.net.mode == NetMode::Host {
        return Err(crate::container::host_network_refused(
            sb,
            "the QEMU microvm backend gives its guest no network device: its only way out is the egress forward",
        ));
    }
    if !policy.net.egress.is_empty() && h5i_sys::ids::euid() != 0 {
        return Err(refuse(
            format!(
                "box `{}` allows egress, and the microvm run's egress forward listens in a network namespace of its own, which only root can make here",
                sb.manifest.name
            ),
            "run h5i as root for this box, or use isolation supervised for an egress allowlist",
        ));
    }
    Ok(())
}

/// The boot plan for `sb`: kernel, initramfs, the pinned image's root, shares, size.
fn boot_plan(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    caches: CacheShares,
) -> Result<vm::BootPlan, BoxError> {
    let facts = qemu_facts();
    facts.ready().map_err(|e| split_refusal(&e))?;
    let (kernel, agent) = match (facts.kernel, facts.agent) {
        (Ok(k), Ok(a)) => (k, a),
        _ => {
            return Err(refuse(
                "the microvm backend is not ready",
                "see h5i box probe",
            ))
        }
    };
    let image_name = policy.image.clone().ok_or_else(|| {
        refuse(
            format!(
                "box `{}` is a microvm box without an image",
                sb.manifest.name
            ),
            "recreate it with --image",
        )
    })?;
    let engine = crate::container::engine::Engine::for_caller()
        .map_err(|e| split_refusal(&e.to_string()))?;
    let image = crate::container::image::pinned(&engine, sb, &image_name)?;
    let root_image = rootfs::for_box(&engine, sb, &image)?;
    let cache = cache_dir()?;
    let kernel_file = kernel::vmlinux(&kernel, &cache).unwrap_or_else(|_| kernel.vmlinuz.clone());
    let initramfs =
        initramfs::build(&agent, &kernel.modules).map_err(|e| refuse(e, "see h5i box probe"))?;
    let ids = crate::identity::Mapping::for_caller()?;
    ids.hold(&sb.paths.dir, &[sb.paths.workspace(), sb.paths.spool()])?;
    let root = h5i_sys::ids::euid() == 0;
    let ram_mib = policy
        .resources
        .mem_bytes
        .map(|b| (b >> 20) + OVERHEAD_MIB)
        .unwrap_or(DEFAULT_RAM_MIB);
    let cpus = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(2);
    Ok(vm::BootPlan {
        kernel: kernel_file,
        initramfs,
        root_image,
        work: sb.paths.workspace(),
        spool: sb.paths.spool(),
        caches: caches.0,
        ram_mib,
        cpus,
        accel: facts.accel.0,
        run_as: root.then_some((ids.uid, ids.gid)),
        idle_secs: vm::IDLE_SECS,
    })
}

/// `refusing: X; to fix: Y` text (from another module's error) as a refusal.
fn split_refusal(text: &str) -> BoxError {
    let text = text.strip_prefix("refusing: ").unwrap_or(text);
    let (what, mend) = text
        .split_once("; to fix: ")
        .unwrap_or((text, "see h5i box probe"));
    refuse(what, mend)
}

/// Where extracted guest kernels are cached: `$XDG_CACHE_HOME/h5i/microvm`, else
/// `~/.cache/h5i/microvm`, else h5i's runtime directory.
fn cache_dir() -> Result<PathBuf, BoxError> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    let dir = match base {
        Some(b) => b.join("h5i/microvm"),
        None => crate::tier_host::runtime_dir()?.join("microvm-cache"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| BoxError::io(&dir, e))?;
    Ok(dir)
}

/// The run's environment: plain box variables, then the secrets (which travel in the session
/// to the guest, never on a command line).
fn run_env(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    secrets: &[h5i_broker::secrets::ResolvedSecret],
) -> Result<Vec<(String, String)>, BoxError> {
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOME".into(), "/tmp".into()),
        ("TMPDIR".into(), "/tmp".into()),
        ("H5I_ENV_ID".into(), sb.manifest.name.clone()),
        (
            "H5I_ENV_POLICY_DIGEST".into(),
            sb.manifest.policy_digest.clone(),
        ),
        ("H5I_ENV_CAPTURE_SPOOL".into(), GUEST_SPOOL.into()),
    ];
    for k in ["TERM", "LANG", "LC_ALL", "NO_COLOR"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.into(), v));
        }
    }
    env.extend(
        crate::agent::runtime_env(policy.agent)
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    for s in secrets {
        if s.inject != h5i_policy::SecretInject::Env {
            return Err(refuse(
                format!(
                    "secret `{}` asks for inject = \"{}\", which only the workspace tier supports",
                    s.name,
                    s.inject.as_str()
                ),
                "use inject = \"env\" at the microvm tier",
            ));
        }
        env.push((s.name.clone(), s.value().to_owned()));
    }
    Ok(env)
}

/// Run `inputs.argv` in `sb`'s VM (booting it first when it is down).
pub fn run(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    inputs: RunInputs<'_>,
) -> Result<MicrovmRun, BoxError> {
    let mut env = run_env(sb, policy, inputs.secrets)?;
    if let Some(image) = &policy.image {
        if msb::MsbFacts::gather().missing(Some(image)).is_empty() {
            let child = msb::run(sb, policy, image, inputs.argv, &env, inputs.wall)?;
            return Ok(MicrovmRun {
                child,
                oom: None,
                usage: None,
                egress: None,
            });
        }
    }
    check_policy(sb, policy)?;
    let caches = CacheShares::of(inputs.caches)?;
    // Set only with the shares they name: the VM is booted with exactly this grant.
    env.extend(
        inputs
            .caches
            .env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    // Pinned before anything boots or runs: no name is resolved after the run starts.
    let plan = crate::container::egress::plan_for(policy)?;
    let spec = RunSpec {
        argv: inputs.argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
        env: env
            .into_iter()
            .map(|(k, v)| format!("{k}={v}").into_bytes())
            .collect(),
        cwd: GUEST_WORK.as_bytes().to_vec(),
        mem_bytes: policy.resources.mem_bytes.unwrap_or(0),
        procs: policy.resources.procs.unwrap_or(0),
        egress: false,
        pty: None,
    };
    let vm = vm::ensure(sb, || boot_plan(sb, policy, caches))?;
    let forward = plan.map(forward::Forward::start).transpose()?;
    let session = client::run(&vm, &spec, inputs.wall, forward.as_ref(), inputs.stdio);
    let egress = forward.map(|f| f.finish().tally);
    let observed = match session? {
        Ok(o) => o,
        Err(client::SessionError::Stuck) => {
            let console = vm.console();
            drop(vm);
            vm::teardown(sb)?;
            return Err(refuse(
                format!(
                    "the box's VM did not end the run within {}s of the wall clock's kill, so h5i stopped the VM (its console was {})",
                    client::KILL_GRACE.as_secs(),
                    console.display()
                ),
                "run again (the next run boots a fresh VM)",
            ));
        }
        Err(client::SessionError::Mismatch(speaks)) => {
            return Err(client::mismatch_refused(&speaks))
        }
        Err(client::SessionError::Broken(why)) => {
            return Err(refuse(
                format!(
                    "the session with box `{}`'s VM broke: {why} (guest console: {})",
                    sb.manifest.name,
                    vm.console().display()
                ),
                "run again; if the VM keeps failing, h5i box abort and recreate the box",
            ));
        }
    };
    let mut run = observed_to_run(observed, vm.state.pid);
    run.egress = egress;
    Ok(run)
}

/// The host's report of an observed run.
fn observed_to_run(o: client::Observed, pid: i32) -> MicrovmRun {
    let (exit, usage, oom) = match (o.exit, o.failed) {
        (Some(x), _) => {
            let usage = CgroupUsage {
                cpu_us: Some(x.user_us + x.sys_us),
                user_us: Some(x.user_us),
                sys_us: Some(x.sys_us),
                mem_peak_bytes: (x.mem_peak > 0).then_some(x.mem_peak),
            };
            let oom = (x.oom_kills > 0).then_some(OomReport {
                limit_bytes: x.mem_limit,
                peak_bytes: (x.mem_peak > 0).then_some(x.mem_peak),
                kill_count: x.oom_kills,
            });
            let exit = ExitOutcome {
                code: x.code,
                signal: x.signal,
                timed_out: o.timed_out,
                oom_killed: false,
            };
            (exit, usage, oom)
        }
        (None, failed) => {
            eprintln!(
                "h5i: {}",
                failed.unwrap_or_else(|| "the command could not be started".into())
            );
            let exit = ExitOutcome {
                code: Some(127),
                signal: None,
                timed_out: o.timed_out,
                oom_killed: false,
            };
            (exit, CgroupUsage::default(), None)
        }
    };
    let rusage = Rusage {
        user_us: usage.user_us.unwrap_or(0),
        sys_us: usage.sys_us.unwrap_or(0),
        ..Rusage::default()
    };
    MicrovmRun {
        child: ChildReport {
            exit,
            rusage,
            wall: o.wall,
            pid,
        },
        oom,
        usage: Some(usage),
        egress: None,
    }
}

/// At `box create`: the image a microvm box will run, looked up in the container engine's
/// storage (refused when missing: runs never pull). `None` at every other tier.
pub fn image_for_create(
    policy: &ResolvedPolicy,
) -> Result<Option<crate::container::image::PinnedImage>, BoxError> {
    if policy.tier != h5i_policy::Tier::Microvm {
        return Ok(None);
    }
    let Some(name) = &policy.image else {
        return Ok(None);
    };
    let engine = crate::container::engine::Engine::for_caller()
        .map_err(|e| split_refusal(&e.to_string()))?;
    crate::container::image::inspect(&engine, name)?
        .map(Some)
        .ok_or_else(|| crate::container::image::missing(&engine, name))
}

/// `status`'s lines for a microvm box: the backend, whether its VM is up, and how it runs.
pub fn status_lines(sb: &StoredBox, policy: &ResolvedPolicy) -> Vec<String> {
    let msb = msb::MsbFacts::gather();
    if let Some(image) = policy
        .image
        .as_deref()
        .filter(|i| msb.missing(Some(i)).is_empty())
    {
        return vec![
            format!("microvm backend: msb (microsandbox), image `{image}` pulled into msb"),
            "microvm egress: default deny plus one address rule per pinned destination, enforced by msb's network stack".into(),
            "microvm evidence: exit and wall from msb's client; no per-request egress tally (msb's netstack drops packets without reporting them)".into(),
        ];
    }
    let accel = accel::choose(&accel::kvm_facts()).1;
    let vm = match vm::status(sb) {
        Some(s) => format!(
            "microvm: VM up (QEMU pid {}, {}, booted in {} ms)",
            s.pid,
            if s.accel == "tcg" {
                "software-emulated"
            } else {
                "KVM"
            },
            s.boot_ms
        ),
        None => "microvm: VM down (the next run boots it)".into(),
    };
    vec![
        "microvm backend: QEMU -M microvm (guest kernel of its own; /work and the spool shared over 9p; no network device)".into(),
        match policy.net.egress.is_empty() {
            true => "microvm egress: none (the guest has no network device and no forward)".into(),
            false => "microvm egress: through a forward on the guest's loopback to h5i's egress proxy only (pinned allowlist; a raw socket has no route)".into(),
        },
        format!("microvm acceleration: {accel}"),
        vm,
        "microvm evidence: exit, CPU time, memory peak and OOM kills come from h5i's guest agent (the run's cgroup inside the guest); the egress tally from h5i's proxy on the host, per request".into(),
    ]
}

/// Stop the box's VM (`abort`, `rm`).
pub fn teardown(sb: &StoredBox) -> Result<(), BoxError> {
    vm::teardown(sb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_lands_on_qemu_only_under_kvm_as_root() {
        use accel::Accel::{Kvm, Tcg};
        assert_eq!(for_auto(None, false, Kvm, true), AutoChoice::Available);
        assert!(matches!(
            for_auto(None, false, Tcg, true),
            AutoChoice::OnRequest(r) if r.contains("software-emulated")
        ));
        assert!(matches!(
            for_auto(None, false, Kvm, false),
            AutoChoice::OnRequest(r) if r.contains("root")
        ));
        assert_eq!(
            for_auto(Some("no kernel".into()), false, Kvm, true),
            AutoChoice::Unavailable("no kernel".into())
        );
        // msb, where it runs, serves auto whatever QEMU can do.
        assert_eq!(
            for_auto(Some("no kernel".into()), true, Tcg, false),
            AutoChoice::Available
        );
    }
}
