//! What a container-tier run was actually given, for `box status`: the OCI spec Podman handed
//! the runtime, captured by h5i-runc at `create` (annotation [`CAPTURE_ANNOTATION`]) before any
//! of the box's code ran, summarized, and checked against the policy.
//!
//! Owns `<box>/container-evidence.json` (host-written, outside every grant): the runtime that
//! ran, the engine user, the pinned image (id and digest), the cage, the flags h5i passed, and
//! the spec's summary — root read-only or not, every capability set, `noNewPrivileges`, the
//! namespaces, the uid mapping, each mount (destination, type, source, options), the `h5i.*`
//! annotations and the cgroups path. Never the spec's environment: it holds the run's secrets
//! and dummies, so only variable *names* are kept.
//!
//! Must never: store an environment value, or call a run matching when its spec was not
//! captured (that is reported as missing evidence, not as a match).
//!
//! Guarded by the unit tests below and `tests/container_tier.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use h5i_policy::spec_names::annotation;
use serde::{Deserialize, Serialize};

use super::image::PinnedImage;
use super::podman_args::{BOX_OBJECTS, BOX_SPOOL, BOX_WORK, INIT_DEST, TMP_SIZE};
use crate::error::BoxError;
use crate::store::StoredBox;

pub use h5i_policy::spec_names::annotation::EVIDENCE_SPEC as CAPTURE_ANNOTATION;
/// The evidence file, beside the box's manifest.
pub const EVIDENCE_FILE: &str = "container-evidence.json";

/// Which OCI runtime Podman ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "path", rename_all = "kebab-case")]
pub enum RuntimeUsed {
    /// h5i-runc (Landlock, h5i's seccomp deny-list, the socket gate), at this path.
    H5iRunc(String),
    /// The host's default runtime, because the profile asked for it.
    HostDefault(String),
}

/// One mount of the spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSummary {
    /// Path in the box.
    pub destination: String,
    /// Filesystem type (`bind`, `tmpfs`, `proc`...).
    pub kind: String,
    /// Source.
    pub source: String,
    /// Options.
    pub options: Vec<String>,
}

/// The parts of the spec the policy speaks about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecSummary {
    /// `root.readonly`.
    pub readonly_root: bool,
    /// Capability sets, by name (`bounding`, `effective`, ...), each its capabilities.
    pub capabilities: BTreeMap<String, Vec<String>>,
    /// `process.noNewPrivileges`.
    pub no_new_privileges: bool,
    /// Namespaces: type -> `new` or the path joined.
    pub namespaces: BTreeMap<String, String>,
    /// The process's uid and gid in the box.
    pub user: (u32, u32),
    /// `process.user.additionalGids`: its supplementary groups (Podman lists the gid itself
    /// under keep-id; any other is a group the image's `/etc/group` or a flag gave the box).
    #[serde(default)]
    pub additional_gids: Vec<u32>,
    /// uid mappings: (box id, engine id, size).
    pub uid_mappings: Vec<(u32, u32, u32)>,
    /// Every mount.
    pub mounts: Vec<MountSummary>,
    /// The `h5i.*` annotations.
    pub annotations: BTreeMap<String, String>,
    /// `linux.cgroupsPath`.
    pub cgroups_path: Option<String>,
    /// Names (never values) of the environment variables.
    pub env_names: Vec<String>,
    /// Whether a seccomp profile was set.
    pub seccomp: bool,
}

/// One run's evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEvidence {
    /// The runtime Podman ran.
    pub runtime: RuntimeUsed,
    /// The user rootless Podman ran as.
    pub engine_user: String,
    /// The image, pinned.
    pub image: PinnedImage,
    /// The cage given as cgroup parent.
    pub cgroup_parent: Option<String>,
    /// Why mem/procs were not held, when they were not.
    pub limits_unheld: Option<String>,
    /// The confinement flags h5i passed to `podman run`.
    pub argv_flags: Vec<String>,
    /// The init program h5i asked Podman to run as the box's pid 1 (`--init-path`); the one
    /// host file besides the planned binds that may appear in the box, at `/run/podman-init`.
    #[serde(default)]
    pub init: Option<PathBuf>,
    /// An agent box's binds h5i planned, `(box path, source)`, each read-only: h5i's settings
    /// for the agent, the skill, the capture hook and (Codex) the shell shim over the image's
    /// bash with that bash at the shim's private path.
    #[serde(default)]
    pub agent_binds: Vec<(String, String)>,
    /// A Claude Code box's config-directory tmpfs in HOME (`nosuid,nodev`), when planned.
    #[serde(default)]
    pub agent_tmpfs: Option<String>,
    /// The browser sidecar container whose user and network namespaces the run joined (a
    /// browser box's run: `super::BrowserPart`), which then holds the relay's directory
    /// read-only at `super::RELAY_IN_BOX`.
    #[serde(default)]
    pub joined_browser: Option<String>,
    /// The captured spec, summarized (`None`: not captured).
    pub spec: Option<SpecSummary>,
}

/// Where h5i-runc writes the spec for run `id`.
pub fn file_for(run_dir: &Path, id: &str) -> PathBuf {
    run_dir.join(format!("spec-{id}.json"))
}

/// The summary of the spec the runtime wrote at `path`: a regular file (never through a
/// symlink) owned by `owner` (the engine user, whose runtime wrote it), at most 4 MiB. `None`
/// when absent or not a spec.
pub fn read_capture(path: &Path, owner: u32) -> Option<SpecSummary> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.uid() != owner {
        return None;
    }
    let mut bytes = Vec::new();
    f.take(4 << 20).read_to_end(&mut bytes).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Some(summarize(&v))
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Summarize an OCI spec (pure).
pub fn summarize(v: &serde_json::Value) -> SpecSummary {
    let process = &v["process"];
    let linux = &v["linux"];
    let mut capabilities = BTreeMap::new();
    if let Some(caps) = process["capabilities"].as_object() {
        for (set, list) in caps {
            capabilities.insert(set.clone(), strings(list));
        }
    }
    let mut namespaces = BTreeMap::new();
    for ns in linux["namespaces"].as_array().into_iter().flatten() {
        if let Some(t) = ns["type"].as_str() {
            namespaces.insert(
                t.to_owned(),
                ns["path"].as_str().unwrap_or("new").to_owned(),
            );
        }
    }
    let uid_mappings = linux["uidMappings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some((
                m["containerID"].as_u64()? as u32,
                m["hostID"].as_u64()? as u32,
                m["size"].as_u64()? as u32,
            ))
        })
        .collect();
    let mounts = v["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| MountSummary {
            destination: m["destination"].as_str().unwrap_or_default().to_owned(),
            kind: m["type"].as_str().unwrap_or_default().to_owned(),
            source: m["source"].as_str().unwrap_or_default().to_owned(),
            options: strings(&m["options"]),
        })
        .collect();
    let annotations = v["annotations"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| k.starts_with("h5i."))
                .filter_map(|(k, x)| Some((k.clone(), x.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let mut env_names: Vec<String> = strings(&process["env"])
        .into_iter()
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_owned()))
        .collect();
    env_names.sort();
    SpecSummary {
        readonly_root: v["root"]["readonly"].as_bool().unwrap_or(false),
        capabilities,
        no_new_privileges: process["noNewPrivileges"].as_bool().unwrap_or(false),
        namespaces,
        user: (
            process["user"]["uid"].as_u64().unwrap_or(0) as u32,
            process["user"]["gid"].as_u64().unwrap_or(0) as u32,
        ),
        additional_gids: process["user"]["additionalGids"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|g| g.as_u64().and_then(|g| u32::try_from(g).ok()))
                    .collect()
            })
            .unwrap_or_default(),
        uid_mappings,
        mounts,
        annotations,
        cgroups_path: linux["cgroupsPath"].as_str().map(str::to_owned),
        env_names,
        seccomp: linux["seccomp"].is_object(),
    }
}

/// Store a run's evidence.
pub fn record(sb: &StoredBox, ev: &RunEvidence) -> Result<(), BoxError> {
    let path = sb.paths.dir.join(EVIDENCE_FILE);
    let text = serde_json::to_vec_pretty(ev).map_err(|e| BoxError::Corrupt {
        path: path.clone(),
        what: e.to_string(),
    })?;
    crate::store::write_atomic(&path, &text)
}

/// The last run's evidence, if any run recorded one.
pub fn load(sb: &StoredBox) -> Option<RunEvidence> {
    let bytes = std::fs::read(sb.paths.dir.join(EVIDENCE_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Mount destinations Podman adds to every container (kernel filesystems and its own
/// generated files), which carry nothing of the host's.
const PODMAN_OWN: &[&str] = &[
    "/proc",
    "/dev",
    "/dev/pts",
    "/dev/mqueue",
    "/dev/shm",
    "/sys",
    "/sys/fs/cgroup",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/etc/passwd",
    "/etc/group",
    "/run/.containerenv",
];

/// Whether `d` is where a warm cache appears: one of `cache_dirs`, the directories under
/// `/.h5i/cache` named like the ecosystems h5i caches (the caches' own list, handed down by the
/// verb: this tier never names `crate::cache`, which runs boxes of its own).
fn is_cache_dest(d: &str, cache_dirs: &[String]) -> bool {
    cache_dirs.iter().any(|c| d == c)
}

/// Where the spec differs from what the policy asks; empty when it matches. Beside the
/// workspace and the spool, the only binds allowed are read-only: the object store at
/// `/.h5i/objects`, the in-box `alternates` naming it, and a warm cache at its ecosystem's
/// directory under `/.h5i/cache`. A bind at any other path (the store's host path, say) is
/// unplanned. `cache_dirs`: as [`is_cache_dest`].
pub fn mismatches(ev: &RunEvidence, cache_dirs: &[String]) -> Vec<String> {
    let alternates = crate::process::in_box_alternates();
    let Some(s) = &ev.spec else {
        return vec!["the run's OCI spec was not captured (the runtime did not write it)".into()];
    };
    let mut out = Vec::new();
    if !s.readonly_root {
        out.push("the image root is writable".into());
    }
    for (set, caps) in &s.capabilities {
        if !caps.is_empty() {
            out.push(format!("capability set {set} holds {}", caps.join(",")));
        }
    }
    if !s.no_new_privileges {
        out.push("noNewPrivileges is off".into());
    }
    let joined = ev.joined_browser.is_some();
    for ns in ["user", "network", "ipc", "pid", "mount"] {
        match s.namespaces.get(ns).map(String::as_str) {
            Some("new") => {}
            // The box's own browser sidecar's, which keep-id made (its own run's evidence).
            Some(_) if joined && (ns == "user" || ns == "network") => {}
            Some(path) => out.push(format!(
                "the {ns} namespace is joined from {path}, not private"
            )),
            None => out.push(format!("no private {ns} namespace")),
        }
    }
    if !joined
        && !s
            .uid_mappings
            .iter()
            .any(|&(inside, outside, size)| inside == s.user.0 && outside == 0 && size == 1)
    {
        out.push(format!(
            "uid {} in the box is not the engine user (keep-id)",
            s.user.0
        ));
    }
    let extra: Vec<String> = s
        .additional_gids
        .iter()
        .filter(|&&g| g != s.user.1)
        .map(u32::to_string)
        .collect();
    if !extra.is_empty() {
        out.push(format!(
            "supplementary group {} in the box beside its own gid {}",
            extra.join(","),
            s.user.1
        ));
    }
    for m in &s.mounts {
        let d = m.destination.as_str();
        let bindish = m.kind == "bind" || m.options.iter().any(|o| o == "bind" || o == "rbind");
        let engine_socket = |p: &str| {
            p.ends_with("podman.sock")
                || p.ends_with("docker.sock")
                || p.starts_with("/run/podman")
                || p.starts_with("/var/run/podman")
        };
        if d == INIT_DEST {
            let planned = ev.init.as_deref() == Some(Path::new(&m.source));
            if !(planned && bindish && m.options.iter().any(|o| o == "ro")) {
                out.push(format!(
                    "an unplanned mount at {d} ({} from {})",
                    m.kind, m.source
                ));
            }
            continue;
        }
        if engine_socket(&m.source) || engine_socket(d) {
            out.push(format!("a Podman socket is mounted at {d}"));
        }
        if d == BOX_WORK {
            if m.options.iter().any(|o| o == "ro") {
                out.push("/work is read-only".into());
            }
        } else if d == BOX_SPOOL {
        } else if d == BOX_OBJECTS || Path::new(d) == alternates {
            if !m.options.iter().any(|o| o == "ro") {
                out.push(format!("the borrowed objects' bind at {d} is writable"));
            }
        } else if bindish && is_cache_dest(d, cache_dirs) {
            if !m.options.iter().any(|o| o == "ro") {
                out.push(format!("the warm cache's bind at {d} is writable"));
            }
        } else if joined && d == super::RELAY_IN_BOX {
            if !(bindish && m.options.iter().any(|o| o == "ro")) {
                out.push(format!(
                    "the browser relay's directory at {d} is not a read-only bind ({} {})",
                    m.kind,
                    m.options.join(",")
                ));
            }
        } else if d == "/tmp" {
            let want = [format!("size={TMP_SIZE}"), "nosuid".into(), "nodev".into()];
            if m.kind != "tmpfs" || !want.iter().all(|w| m.options.iter().any(|o| o == w)) {
                out.push(format!(
                    "/tmp is not a private {TMP_SIZE} nosuid,nodev tmpfs ({} {})",
                    m.kind,
                    m.options.join(",")
                ));
            }
        } else if let Some((_, source)) = ev.agent_binds.iter().find(|(dest, _)| dest == d) {
            if !(bindish && &m.source == source && m.options.iter().any(|o| o == "ro")) {
                out.push(format!(
                    "the agent's mount at {d} is not the planned read-only bind of {source} ({} from {}, {})",
                    m.kind,
                    m.source,
                    m.options.join(",")
                ));
            }
        } else if ev.agent_tmpfs.as_deref() == Some(d) {
            if m.kind != "tmpfs"
                || !["nosuid", "nodev"]
                    .iter()
                    .all(|w| m.options.iter().any(|o| o == w))
            {
                out.push(format!(
                    "the agent's config directory at {d} is not a nosuid,nodev tmpfs ({} {})",
                    m.kind,
                    m.options.join(",")
                ));
            }
        } else if PODMAN_OWN.contains(&d) {
            if (d == "/sys" || d == "/sys/fs/cgroup") && !m.options.iter().any(|o| o == "ro") {
                out.push(format!("{d} is writable"));
            }
        } else if bindish || m.kind == "tmpfs" {
            out.push(format!(
                "an unplanned mount at {d} ({} from {})",
                m.kind, m.source
            ));
        }
    }
    if !s.mounts.iter().any(|m| m.destination == BOX_WORK) {
        out.push("the workspace is not mounted at /work".into());
    }
    if let RuntimeUsed::H5iRunc(_) = ev.runtime {
        for k in [
            annotation::LANDLOCK,
            annotation::SECCOMP,
            annotation::NET_UNIX,
        ] {
            if !s.annotations.contains_key(k) {
                out.push(format!("h5i-runc ran without {k}"));
            }
        }
    }
    out
}

/// `box status`'s container section: the last run's evidence and whether it matches
/// (`cache_dirs`: as [`is_cache_dest`]).
pub fn status_lines(sb: &StoredBox, cache_dirs: &[String]) -> Vec<String> {
    let Some(ev) = load(sb) else {
        return vec![format!(
            "container evidence: no run yet (`h5i box run {} -- true` records it)",
            sb.manifest.name
        )];
    };
    let mut out = vec![
        "container evidence (last run: the OCI spec Podman handed the runtime, captured by h5i-runc before the box's code ran)".to_string(),
    ];
    out.push(match &ev.runtime {
        RuntimeUsed::H5iRunc(p) => format!("  runtime   h5i-runc ({p}): Landlock, h5i's default-deny seccomp base and deny-list"),
        RuntimeUsed::HostDefault(n) => format!(
            "  runtime   {n} (the host's default, as the profile asks): no h5i-runc layers, spec not captured"
        ),
    });
    out.push(format!("  engine    rootless Podman as {}", ev.engine_user));
    out.push(format!(
        "  image     {} = {}{}",
        ev.image.name,
        ev.image.id,
        ev.image
            .digest
            .as_deref()
            .map(|d| format!(" (digest {d})"))
            .unwrap_or_default()
    ));
    out.push(format!("  flags     {}", ev.argv_flags.join(" ")));
    out.push(match (&ev.cgroup_parent, &ev.limits_unheld) {
        (Some(p), _) => format!("  cage      {p} (mem and procs held there)"),
        (None, Some(why)) => format!("  cage      none: mem and procs not held ({why})"),
        (None, None) => "  cage      none".to_string(),
    });
    if let Some(s) = &ev.spec {
        let caps: Vec<&String> = s.capabilities.values().flatten().collect();
        out.push(format!(
            "  spec      root {}; capabilities {}; no-new-privileges {}; uid {} in the box",
            if s.readonly_root {
                "read-only"
            } else {
                "WRITABLE"
            },
            if caps.is_empty() {
                "none".to_string()
            } else {
                caps.iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            },
            if s.no_new_privileges { "on" } else { "OFF" },
            s.user.0
        ));
        out.push(format!(
            "  namespaces {}",
            s.namespaces
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        for m in s.mounts.iter().filter(|m| {
            m.destination == BOX_WORK
                || m.destination == BOX_SPOOL
                || m.destination == "/tmp"
                || m.destination == BOX_OBJECTS
                || is_cache_dest(&m.destination, cache_dirs)
        }) {
            out.push(format!(
                "  mount     {} {} ({})",
                m.destination,
                m.kind,
                m.options.join(",")
            ));
        }
    }
    let diff = mismatches(&ev, cache_dirs);
    out.push(if diff.is_empty() {
        "  matches the policy: yes".to_string()
    } else {
        format!("  matches the policy: NO: {}", diff.join("; "))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> serde_json::Value {
        json!({
            "root": {"path": "/x", "readonly": true},
            "process": {
                "user": {"uid": 1001, "gid": 1001, "additionalGids": [1001]},
                "env": ["PATH=/bin", "ANTHROPIC_API_KEY=dummy-secret"],
                "noNewPrivileges": true,
                "capabilities": {"bounding": [], "effective": []}
            },
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc", "options": []},
                {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["ro"]},
                {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["rw", "size=1024m", "nosuid", "nodev"]},
                {"destination": "/work", "type": "bind", "source": "/ws", "options": ["rbind", "rw"]},
                {"destination": "/.h5i/objects", "type": "bind", "source": "/r/.git/objects", "options": ["rbind", "ro"]},
                {"destination": "/work/.git/objects/info/alternates", "type": "bind", "source": "/b/alternates.box", "options": ["rbind", "ro"]},
                {"destination": "/.h5i/spool", "type": "bind", "source": "/s", "options": ["rbind", "rw"]},
                {"destination": "/run/podman-init", "type": "bind", "source": "/usr/bin/catatonit", "options": ["bind", "ro"]}
            ],
            "annotations": {"h5i.landlock": "{}", "h5i.seccomp": "h5i-v1", "h5i.net.unix": "false", "io.podman.x": "y"},
            "linux": {
                "namespaces": [{"type": "user"}, {"type": "network"}, {"type": "ipc"}, {"type": "pid"}, {"type": "mount"}],
                "uidMappings": [{"containerID": 0, "hostID": 1, "size": 1001}, {"containerID": 1001, "hostID": 0, "size": 1}],
                "cgroupsPath": "/own/h5i/r/c/libpod-1",
                "seccomp": {"defaultAction": "SCMP_ACT_ERRNO"}
            }
        })
    }

    fn evidence(v: serde_json::Value) -> RunEvidence {
        RunEvidence {
            runtime: RuntimeUsed::H5iRunc("/usr/bin/h5i-runc".into()),
            engine_user: "u".into(),
            image: PinnedImage {
                name: "localhost/i".into(),
                id: "sha256:ab".into(),
                digest: None,
                shim_not_agent_shell: None,
            },
            cgroup_parent: None,
            limits_unheld: None,
            argv_flags: vec![],
            init: Some("/usr/bin/catatonit".into()),
            agent_binds: vec![],
            agent_tmpfs: None,
            joined_browser: None,
            spec: Some(summarize(&v)),
        }
    }

    #[test]
    fn the_articles_spec_matches() {
        let ev = evidence(spec());
        assert_eq!(mismatches(&ev, &[]), Vec::<String>::new());
        let s = ev.spec.unwrap();
        // Names only: the dummy's value is never kept.
        assert_eq!(s.env_names, ["ANTHROPIC_API_KEY", "PATH"]);
        assert!(!serde_json::to_string(&s).unwrap().contains("dummy-secret"));
        assert!(!s.annotations.contains_key("io.podman.x"));
    }

    #[test]
    fn each_departure_is_named() {
        let mut v = spec();
        v["root"]["readonly"] = json!(false);
        v["process"]["capabilities"]["effective"] = json!(["CAP_NET_RAW"]);
        v["process"]["noNewPrivileges"] = json!(false);
        v["process"]["user"]["additionalGids"] = json!([1001, 0]);
        v["linux"]["namespaces"][1] = json!({"type": "network", "path": "/proc/1/ns/net"});
        v["mounts"].as_array_mut().unwrap().push(json!(
            {"destination": "/run/podman/podman.sock", "type": "bind", "source": "/run/podman/podman.sock", "options": ["rbind"]}
        ));
        v["mounts"].as_array_mut().unwrap().push(json!(
            {"destination": "/home", "type": "bind", "source": "/home", "options": ["rbind"]}
        ));
        let m = mismatches(&evidence(v), &[]).join("\n");
        for want in [
            "image root is writable",
            "CAP_NET_RAW",
            "noNewPrivileges is off",
            "supplementary group 0 in the box beside its own gid 1001",
            "network namespace is joined",
            "Podman socket",
            "unplanned mount at /home",
        ] {
            assert!(m.contains(want), "missing {want} in\n{m}");
        }
    }

    #[test]
    fn a_run_joining_the_boxs_browser_may_share_only_its_user_and_network_namespaces() {
        let mut v = spec();
        v["linux"]["namespaces"][0] = json!({"type": "user", "path": "/proc/7/ns/user"});
        v["linux"]["namespaces"][1] = json!({"type": "network", "path": "/proc/7/ns/net"});
        v["linux"]["namespaces"][3] = json!({"type": "pid", "path": "/proc/7/ns/pid"});
        v["mounts"].as_array_mut().unwrap().push(json!(
            {"destination": "/tmp/.agent-browser", "type": "bind", "source": "/r/relay", "options": ["rbind", "ro"]}
        ));
        let alone = mismatches(&evidence(v.clone()), &[]).join("\n");
        assert!(alone.contains("user namespace is joined"), "{alone}");
        assert!(
            alone.contains("unplanned mount at /tmp/.agent-browser"),
            "{alone}"
        );
        let mut ev = evidence(v.clone());
        ev.joined_browser = Some("h5i-web-1".into());
        assert_eq!(
            mismatches(&ev, &[]),
            ["the pid namespace is joined from /proc/7/ns/pid, not private"]
        );
        v["mounts"].as_array_mut().unwrap().last_mut().unwrap()["options"] = json!(["rbind"]);
        let mut ev = evidence(v);
        ev.joined_browser = Some("h5i-web-1".into());
        assert!(mismatches(&ev, &[])
            .join("\n")
            .contains("relay's directory at /tmp/.agent-browser is not a read-only bind"));
    }

    #[test]
    fn only_the_planned_init_may_sit_at_the_init_path() {
        let swapped = |source: &str, options: serde_json::Value| {
            let mut v = spec();
            let mounts = v["mounts"].as_array_mut().unwrap();
            let init = mounts.last_mut().unwrap();
            init["source"] = json!(source);
            init["options"] = options;
            mismatches(&evidence(v), &[]).join("\n")
        };
        // Another host file bound where the init goes, or the init writable: both named.
        let other = swapped("/etc/shadow", json!(["bind", "ro"]));
        assert!(
            other.contains("unplanned mount at /run/podman-init"),
            "{other}"
        );
        let writable = swapped("/usr/bin/catatonit", json!(["bind", "rw"]));
        assert!(
            writable.contains("unplanned mount at /run/podman-init"),
            "{writable}"
        );
        // A record from before the init existed names it too.
        let mut ev = evidence(spec());
        ev.init = None;
        assert!(mismatches(&ev, &[])
            .join("\n")
            .contains("unplanned mount at /run/podman-init"));
    }

    #[test]
    fn the_store_at_its_host_path_or_a_writable_alternates_is_named() {
        let mut v = spec();
        v["mounts"].as_array_mut().unwrap().push(json!(
            {"destination": "/r/.git/objects", "type": "bind", "source": "/r/.git/objects", "options": ["rbind", "ro"]}
        ));
        v["mounts"][5]["options"] = json!(["rbind", "rw"]);
        let m = mismatches(&evidence(v), &[]).join("\n");
        for want in [
            "unplanned mount at /r/.git/objects",
            "bind at /work/.git/objects/info/alternates is writable",
        ] {
            assert!(m.contains(want), "missing {want} in\n{m}");
        }
    }

    #[test]
    fn only_the_planned_agent_binds_read_only_and_its_tmpfs_pass() {
        let mut v = spec();
        let mounts = v["mounts"].as_array_mut().unwrap();
        mounts.push(json!(
            {"destination": "/etc/codex", "type": "bind", "source": "/run/user/1001/h5i/run-x/agent-settings", "options": ["rbind", "ro"]}
        ));
        mounts.push(json!(
            {"destination": "/usr/bin/bash", "type": "bind", "source": "/opt/h5i-hook", "options": ["rbind", "ro"]}
        ));
        mounts.push(json!(
            {"destination": "/tmp/.claude", "type": "tmpfs", "source": "tmpfs", "options": ["rw", "size=64m", "nosuid", "nodev"]}
        ));
        let mut ev = evidence(v.clone());
        let unplanned = mismatches(&ev, &[]).join("\n");
        for d in ["/etc/codex", "/usr/bin/bash", "/tmp/.claude"] {
            assert!(
                unplanned.contains(&format!("an unplanned mount at {d} ")),
                "{unplanned}"
            );
        }
        ev.agent_binds = vec![
            (
                "/etc/codex".into(),
                "/run/user/1001/h5i/run-x/agent-settings".into(),
            ),
            ("/usr/bin/bash".into(), "/opt/h5i-hook".into()),
        ];
        ev.agent_tmpfs = Some("/tmp/.claude".into());
        assert_eq!(mismatches(&ev, &[]), Vec::<String>::new());
        // The planned path from another source, written through, or a tmpfs with set-id files.
        let mounts = v["mounts"].as_array_mut().unwrap();
        let n = mounts.len();
        mounts[n - 3]["source"] = json!("/home/u/.codex");
        mounts[n - 2]["options"] = json!(["rbind", "rw"]);
        mounts[n - 1]["options"] = json!(["rw", "size=64m"]);
        let planned = ev.clone();
        ev = evidence(v);
        ev.agent_binds = planned.agent_binds;
        ev.agent_tmpfs = planned.agent_tmpfs;
        let m = mismatches(&ev, &[]).join("\n");
        for want in [
            "the agent's mount at /etc/codex is not the planned read-only bind",
            "the agent's mount at /usr/bin/bash is not the planned read-only bind",
            "the agent's config directory at /tmp/.claude is not a nosuid,nodev tmpfs",
        ] {
            assert!(m.contains(want), "missing {want} in\n{m}");
        }
    }

    #[test]
    fn an_uncaptured_spec_is_never_a_match() {
        let mut ev = evidence(spec());
        ev.spec = None;
        assert_eq!(mismatches(&ev, &[]).len(), 1);
    }
}
