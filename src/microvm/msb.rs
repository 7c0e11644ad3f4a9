//! The microvm tier's msb backend: microsandbox's `msb` runs the box's image as a libkrun VM,
//! where a host has what it needs (this kind of host does not: libkrunfw is in no registry it
//! reaches, and its KVM is PVM's).
//!
//! Owns h5i's contract with `msb`, exactly as the manual states it:
//! - requirements, all three or the backend is not used: `msb` 0.6 or newer on PATH, `/dev/kvm`
//!   openable, the box's image pre-pulled (`msb image ls` lists it; runs never pull); `probe`
//!   names whichever is missing ([`MsbFacts::missing`]);
//! - one run is one `msb run`: the workspace at `/work` and the spool at `/.h5i/spool` as
//!   volumes, the policy's `mem` and `procs`, the environment from a file, and egress as
//!   default deny plus one address rule per pinned destination (`--net-default deny`,
//!   `--net-allow ADDR:PORT`);
//! - secrets are staged in a 0600 file in h5i's private run directory, named on the command
//!   line only by its path (`--env-file`), and removed when the run ends: a value is never in
//!   argv;
//! - authenticated-egress grants are refused at this tier (the guest cannot dial the host's
//!   loopback credential proxy), and there is no per-request egress tally (its netstack drops
//!   packets without reporting them): `status` and the receipt say so;
//! - the exit code passes through, and the wall clock kills `msb`'s process group (124).
//!
//! Must never: put a secret value in argv, run with a requirement missing, or pull an image.
//!
//! Guarded by `tests/microvm_msb.rs` (a recording fake `msb` on PATH: argv, files, exit codes)
//! and the unit tests below.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use h5i_policy::receipt::PinnedRule;
use h5i_policy::ResolvedPolicy;
use h5i_runtime::supervise::ChildReport;

use crate::error::BoxError;
use crate::store::StoredBox;

/// The oldest msb h5i drives.
pub const MIN_VERSION: (u64, u64) = (0, 6);

/// What the host has of msb's three requirements.
#[derive(Debug, Clone)]
pub struct MsbFacts {
    /// `msb --version`, parsed.
    pub version: Result<(u64, u64, u64), String>,
    /// Whether `/dev/kvm` opens read-write for this caller.
    pub kvm: Result<(), String>,
    /// The images msb holds (`msb image ls`).
    pub images: Result<Vec<String>, String>,
}

/// `major.minor.patch` from `msb --version`'s output (the first such word).
fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    text.split_whitespace().find_map(|w| {
        let mut p = w.trim_start_matches('v').split('.');
        let v = (
            p.next()?.parse().ok()?,
            p.next()?.parse().ok()?,
            p.next()?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()?,
        );
        Some(v)
    })
}

impl MsbFacts {
    /// Ask this host (`msb` from PATH).
    pub fn gather() -> MsbFacts {
        let msb = |args: &[&str]| {
            std::process::Command::new("msb")
                .args(args)
                .stdin(std::process::Stdio::null())
                .output()
        };
        let version = match msb(&["--version"]) {
            Err(e) => Err(format!("msb is not on PATH ({e})")),
            Ok(o) if !o.status.success() => Err("`msb --version` failed".into()),
            Ok(o) => parse_version(&String::from_utf8_lossy(&o.stdout))
                .ok_or_else(|| "`msb --version` printed no version".to_string()),
        };
        let images = match (&version, msb(&["image", "ls", "--quiet"])) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), Err(e)) => Err(e.to_string()),
            (Ok(_), Ok(o)) if !o.status.success() => Err("`msb image ls` failed".into()),
            (Ok(_), Ok(o)) => Ok(String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect()),
        };
        let kvm = super::accel::kvm_openable();
        MsbFacts {
            version,
            kvm,
            images,
        }
    }

    /// Each missing requirement, with its mend (empty: msb can run `image`).
    pub fn missing(&self, image: Option<&str>) -> Vec<String> {
        let mut out = Vec::new();
        match &self.version {
            Err(e) => out.push(format!(
                "{e}; to fix: install microsandbox 0.6+ (a package problem)"
            )),
            Ok(v) if (v.0, v.1) < MIN_VERSION => out.push(format!(
                "msb {}.{}.{} is older than {}.{}; to fix: upgrade microsandbox",
                v.0, v.1, v.2, MIN_VERSION.0, MIN_VERSION.1
            )),
            Ok(_) => {}
        }
        if let Err(e) = &self.kvm {
            out.push(format!("/dev/kvm cannot be opened ({e}); to fix: enable (nested) virtualization for this host (a platform problem, not a package)"));
        }
        if let (Some(image), Ok(images)) = (image, &self.images) {
            if !images.iter().any(|i| i == image) {
                out.push(format!(
                    "image `{image}` is not pulled into msb; to fix: msb pull {image}"
                ));
            }
        }
        out
    }
}

/// `box probe`'s msb line.
pub fn probe_line(f: &MsbFacts) -> String {
    let missing = f.missing(None);
    match (&f.version, missing.is_empty()) {
        (Ok(v), true) => format!(
            "msb {}.{}.{} and /dev/kvm present: boxes whose image msb holds run on msb (no per-request egress tally there)",
            v.0, v.1, v.2
        ),
        _ => format!("not used: {}", missing.join("; ")),
    }
}

/// One `msb run`: its argv and the environment file it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsbRun {
    /// `msb`'s arguments.
    pub args: Vec<OsString>,
    /// The environment file's text (`KEY=VALUE` lines, secrets among them).
    pub env_file: String,
}

/// The argv and environment of one run of `argv` in `sb` with `image`, egress pinned to
/// `pinned`, `env` the box's variables (secrets included: they go to the file only).
pub fn plan(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    image: &str,
    argv: &[OsString],
    pinned: &[PinnedRule],
    env: &[(String, String)],
    env_path: &Path,
) -> Result<MsbRun, BoxError> {
    if !policy.auth.is_empty() {
        return Err(BoxError::BadRequest {
            what: format!(
                "box `{}` declares authenticated-egress grants, and a microVM guest cannot dial the host's loopback credential proxy",
                sb.manifest.name
            ),
            mend: "drop the profile's [[auth]] grants, or use isolation container or supervised".into(),
        });
    }
    let mut args: Vec<OsString> = vec![
        "run".into(),
        "--name".into(),
        format!("h5i-{}", sb.manifest.name).into(),
    ];
    let mut vol = |host: PathBuf, guest: &str| {
        args.push("--volume".into());
        let mut v = host.into_os_string();
        v.push(format!(":{guest}"));
        args.push(v);
    };
    vol(sb.paths.workspace(), super::GUEST_WORK);
    vol(sb.paths.spool(), super::GUEST_SPOOL);
    if let Some(mem) = policy.resources.mem_bytes {
        args.push("--memory".into());
        args.push(format!("{}M", mem.div_ceil(1 << 20)).into());
    }
    if let Some(procs) = policy.resources.procs {
        args.push("--max-procs".into());
        args.push(procs.to_string().into());
    }
    args.push("--net-default".into());
    args.push("deny".into());
    for rule in pinned {
        for addr in &rule.addrs {
            args.push("--net-allow".into());
            args.push(
                match addr.contains(':') {
                    true => format!("[{addr}]:{}", rule.port),
                    false => format!("{addr}:{}", rule.port),
                }
                .into(),
            );
        }
    }
    args.push("--workdir".into());
    args.push(super::GUEST_WORK.into());
    args.push("--env-file".into());
    args.push(env_path.as_os_str().to_owned());
    args.push(image.into());
    args.push("--".into());
    args.extend(argv.iter().cloned());
    let mut env_file = String::new();
    for (k, v) in env {
        if v.contains('\n') || k.contains('=') || k.contains('\n') {
            return Err(BoxError::BadRequest {
                what: format!("variable `{k}` holds a newline or `=` in its name, which an msb environment file cannot carry"),
                mend: "remove the newline from the value (or the secret's source)".into(),
            });
        }
        env_file.push_str(&format!("{k}={v}\n"));
    }
    Ok(MsbRun { args, env_file })
}

/// The staged environment file, removed when dropped.
struct EnvFile(PathBuf);

impl Drop for EnvFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Run `argv` in `sb` on msb (the requirements were checked by the caller).
pub fn run(
    sb: &StoredBox,
    policy: &ResolvedPolicy,
    image: &str,
    argv: &[OsString],
    env: &[(String, String)],
    wall: Option<Duration>,
) -> Result<ChildReport, BoxError> {
    let pinned = crate::supervised::pin_egress(policy)?;
    let dir = crate::tier_host::runtime_dir()?;
    let path = dir.join(format!(
        "msb-env-{}-{}",
        std::process::id(),
        crate::store::now_ms()
    ));
    let planned = plan(sb, policy, image, argv, &pinned, env, &path)?;
    let staged = EnvFile(path.clone());
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(planned.env_file.as_bytes()))
        .map_err(|e| BoxError::io(&path, e))?;
    let mut cmd = std::process::Command::new("msb");
    cmd.args(&planned.args);
    let report = h5i_runtime::supervise::run_supervised(cmd, wall).map_err(|e| {
        let text = e.to_string();
        super::split_refusal(&text)
    })?;
    drop(staged);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_old_ones_are_named() {
        assert_eq!(parse_version("msb 0.6.15"), Some((0, 6, 15)));
        assert_eq!(parse_version("microsandbox v1.2.3-beta"), Some((1, 2, 3)));
        assert_eq!(parse_version("no version here"), None);
        let f = MsbFacts {
            version: Ok((0, 5, 9)),
            kvm: Err("No such file or directory".into()),
            images: Ok(vec!["alpine:3".into()]),
        };
        let m = f.missing(Some("python:3"));
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(
            m[0].contains("older than 0.6")
                && m[1].contains("/dev/kvm")
                && m[2].contains("msb pull python:3")
        );
        assert!(m.iter().all(|l| l.contains("to fix:")));
        let ok = MsbFacts {
            version: Ok((0, 6, 0)),
            kvm: Ok(()),
            images: Ok(vec!["python:3".into()]),
        };
        assert!(ok.missing(Some("python:3")).is_empty());
    }
}
