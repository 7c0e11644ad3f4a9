//! What the container tier needs from this host, asked of rootless Podman itself: whether the
//! engine user's Podman runs rootless (`Host.Security.Rootless`), its runtime, cgroup version
//! and manager, its storage driver, and which images it holds.
//!
//! `podman info` costs tens of milliseconds and every `box create` asks, so its answer is
//! cached per host in h5i's private runtime directory (`/run/h5i/container-probe.json` as root,
//! `$XDG_RUNTIME_DIR/h5i/` otherwise: a tmpfs, so a reboot also invalidates it, and never the
//! user's home, which h5i does not write), keyed by everything that could change it: h5i's version, the podman binary (path, size,
//! mtime), the kernel release, the engine user, and the mtimes of the containers.conf and
//! storage.conf files that apply. Any difference re-probes; `H5I_NO_PROBE_CACHE=1` always
//! does. The image list is never cached (it changes with every build), and neither is an
//! answer that Podman failed.
//!
//! Must never: report the tier available when Podman is not rootless, or trust a cache file
//! that is not the caller's own.
//!
//! Guarded by the unit tests below and `tests/container_tier.rs`.

use h5i_log::Traced as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::engine::Engine;

/// Set to re-probe instead of reusing the cached answer.
pub const NO_CACHE_VAR: &str = "H5I_NO_PROBE_CACHE";

/// What `podman info` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodmanFacts {
    /// Podman's version.
    pub version: String,
    /// `Host.Security.Rootless`.
    pub rootless: bool,
    /// The default OCI runtime's name.
    pub runtime: String,
    /// `v1` or `v2`.
    pub cgroup_version: String,
    /// `cgroupfs` or `systemd`.
    pub cgroup_manager: String,
    /// The storage driver.
    pub graph_driver: String,
}

/// The cache file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Cached {
    key: String,
    facts: PodmanFacts,
}

/// Parse `podman info --format json` (pure).
pub fn parse_info(json: &[u8]) -> Result<PodmanFacts, String> {
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("podman info is not JSON: {e}"))?;
    let host = &v["host"];
    let s = |x: &serde_json::Value| x.as_str().unwrap_or_default().to_owned();
    let version = s(&v["version"]["Version"]);
    if version.is_empty() {
        return Err("podman info names no version".into());
    }
    Ok(PodmanFacts {
        version,
        rootless: host["security"]["rootless"].as_bool().unwrap_or(false),
        runtime: s(&host["ociRuntime"]["name"]),
        cgroup_version: s(&host["cgroupVersion"]),
        cgroup_manager: s(&host["cgroupManager"]),
        graph_driver: s(&v["store"]["graphDriverName"]),
    })
}

fn podman_path() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
        .map(|d| d.join("podman"))
        .find(|p| p.is_file())
}

fn stamp(p: &Path) -> String {
    match std::fs::metadata(p) {
        Ok(m) => format!(
            "{}:{}:{}",
            p.display(),
            m.len(),
            m.modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos())
        ),
        Err(_) => format!("{}:-", p.display()),
    }
}

/// Everything the answer depends on, as one string.
fn cache_key(engine: &Engine) -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = vec![
        format!("h5i {}", env!("CARGO_PKG_VERSION")),
        std::env::current_exe().map_or_else(|_| "-".into(), |p| stamp(&p)),
        podman_path().map_or_else(|| "no podman".into(), |p| stamp(&p)),
        format!("kernel {}", kernel.trim()),
        format!("engine {} {}", engine.user, engine.uid),
    ];
    for f in [
        PathBuf::from("/etc/containers/containers.conf"),
        PathBuf::from("/etc/containers/storage.conf"),
        engine.home.join(".config/containers/containers.conf"),
        engine.home.join(".config/containers/storage.conf"),
    ] {
        parts.push(stamp(&f));
    }
    parts.join("|")
}

fn cache_file() -> Option<PathBuf> {
    crate::tier_host::runtime_dir()
        .ok()
        .map(|d| d.join("container-probe.json"))
}

fn read_cache(path: &Path, key: &str) -> Option<PodmanFacts> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let me = h5i_sys::ids::euid();
    if !meta.is_file() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return None;
    }
    let cached: Cached = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    (cached.key == key).then_some(cached.facts)
}

fn write_cache(path: &Path, key: &str, facts: &PodmanFacts) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let Ok(bytes) = serde_json::to_vec(&Cached {
        key: key.to_owned(),
        facts: facts.clone(),
    }) else {
        return;
    };
    let tmp = dir.join(format!(".container-probe.{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Ask the engine's Podman (through the cache).
pub fn podman_facts(engine: &Engine) -> Result<PodmanFacts, String> {
    let key = cache_key(engine);
    let cache = cache_file();
    let bypass = std::env::var_os(NO_CACHE_VAR).is_some_and(|v| !v.is_empty() && v != "0");
    if !bypass {
        if let Some(f) = cache.as_deref().and_then(|c| read_cache(c, &key)) {
            return Ok(f);
        }
    }
    let out = engine
        .podman()
        .args(["info", "--format", "json"])
        .stdin(Stdio::null())
        .traced()
        .output()
        .map_err(|e| {
            format!(
                "podman cannot be run as {} ({e}); to fix: apt-get install podman",
                engine.user
            )
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        let mend = if err.contains("podman system migrate") {
            // Podman's state names processes that are gone (a container's conmon was killed).
            format!("run `podman system migrate` as {}", engine.user)
        } else {
            "make rootless Podman work for that user (make setup does it for h5i-test)".into()
        };
        return Err(format!(
            "`podman info` fails for {}: {}; to fix: {mend}",
            engine.user,
            line.trim()
        ));
    }
    let facts = parse_info(&out.stdout)?;
    if let Some(c) = &cache {
        write_cache(c, &key, &facts);
    }
    Ok(facts)
}

/// Why this host cannot run the container tier, or `Ok` with the facts.
pub fn container_tier(cgroups: &Result<(), String>) -> Result<(Engine, PodmanFacts), String> {
    let engine = Engine::for_caller().map_err(|e| e.to_string())?;
    let facts = podman_facts(&engine)?;
    if !facts.rootless {
        return Err(format!(
            "Podman for {} is not rootless (Host.Security.Rootless = false), and the container tier runs rootless Podman only",
            engine.user
        ));
    }
    crate::tier_host::runc_binary().ok_or(
        "h5i-runc (the container tier's OCI runtime) is not beside h5i or on PATH (`cargo install --path .` installs it beside h5i)",
    )?;
    crate::tier_host::hook_binary().ok_or(
        "h5i-hook is not beside h5i or on PATH (`cargo install --path .` installs it beside h5i)",
    )?;
    crate::tier_host::init_program().ok_or_else(|| {
        format!(
            "{}; {}",
            crate::tier_host::NO_INIT.0,
            crate::tier_host::NO_INIT.1
        )
    })?;
    if let Err(e) = cgroups {
        if h5i_sys::ids::euid() != 0 {
            return Err(format!(
                "h5i-runc places each container in a cgroup, and an unprivileged caller needs one root has delegated to it (make setup delegates one to h5i-test): {e}"
            ));
        }
    }
    Ok((engine, facts))
}

/// Set the container tier's availability in `tiers` and return what was found.
pub fn set_availability(
    tiers: &mut h5i_policy::HostTiers,
    cgroups: &Result<(), String>,
) -> Result<(Engine, PodmanFacts), String> {
    let found = container_tier(cgroups);
    match &found {
        Ok(_) => tiers.set_available(h5i_policy::Tier::Container),
        Err(why) => tiers.set_unavailable(h5i_policy::Tier::Container, why.clone()),
    };
    found
}

/// `box probe`'s container lines: (what, answer).
pub fn lines(
    found: &Result<(Engine, PodmanFacts), String>,
    cgroups: &Result<(), String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (engine, facts) = match found {
        Ok(x) => x,
        Err(why) => {
            out.push(("container engine".into(), format!("unavailable: {why}")));
            return out;
        }
    };
    out.push((
        "container engine".into(),
        format!(
            "rootless Podman {} as {} (Host.Security.Rootless = {}), storage {}",
            facts.version, engine.user, facts.rootless, facts.graph_driver
        ),
    ));
    out.push((
        "container runtime".into(),
        format!(
            "h5i-runc (Podman's own default here: {}; a profile may ask for it instead)",
            facts.runtime
        ),
    ));
    let podman_limits = if facts.cgroup_version == "v1" {
        "rootless Podman cannot hold --memory/--pids-limit on cgroup v1"
    } else {
        "cgroup v2"
    };
    out.push((
        "container limits".into(),
        match cgroups {
            Ok(()) => format!(
                "cgroup {} ({}); {podman_limits}: mem and procs are held by a cage h5i makes under its own cgroup{}, and OOM kills are counted there",
                facts.cgroup_version,
                facts.cgroup_manager,
                if engine.switches_user {
                    format!(" and hands to {}", engine.user)
                } else {
                    String::new()
                }
            ),
            Err(e) => format!(
                "cgroup {}; {podman_limits}, and h5i cannot make a cage here ({e}): mem and procs cannot be held",
                facts.cgroup_version
            ),
        },
    ));
    out.push((
        "container images".into(),
        match super::image::present(engine) {
            Ok(v) if v.is_empty() => format!(
                "none in {}'s storage (make images builds them)",
                engine.user
            ),
            Ok(v) => v.join(", "),
            Err(e) => format!("cannot list: {e}"),
        },
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_info_is_read_for_what_the_tier_needs() {
        let f = parse_info(
            br#"{"host":{"security":{"rootless":true},"ociRuntime":{"name":"runc"},
                "cgroupVersion":"v1","cgroupManager":"cgroupfs"},
                "store":{"graphDriverName":"overlay"},"version":{"Version":"4.3.1"}}"#,
        )
        .unwrap();
        assert!(f.rootless);
        assert_eq!(
            (
                f.runtime.as_str(),
                f.cgroup_version.as_str(),
                f.version.as_str()
            ),
            ("runc", "v1", "4.3.1")
        );
        assert!(parse_info(b"not json").is_err());
        assert!(parse_info(b"{}").is_err());
    }

    #[test]
    fn a_cache_is_used_only_under_the_same_key_and_owner() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("h5i/container-probe.json");
        let facts =
            parse_info(br#"{"host":{"security":{"rootless":true}},"version":{"Version":"4.3.1"}}"#)
                .unwrap();
        write_cache(&file, "k1", &facts);
        assert_eq!(read_cache(&file, "k1"), Some(facts.clone()));
        assert_eq!(
            read_cache(&file, "k2"),
            None,
            "a changed version invalidates it"
        );
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        assert_eq!(
            read_cache(&file, "k1"),
            None,
            "a file others can write is not trusted"
        );
    }
}
