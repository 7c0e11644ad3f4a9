//! A box run as an OCI bundle: the policy's grants become mounts, namespaces, a user mapping,
//! rlimits and the `h5i.*` annotations that `h5i-runc`'s executor turns into Landlock and
//! seccomp.
//!
//! Owns the shape of the box as the kernel will see it:
//! - the root is an empty, read-only directory; every path the box sees is a mount listed here;
//! - every directory grant is a [`Bind`] of a host path at a box path, read-only or read-write
//!   (missing sources are skipped, and listed): absolute `fs.read`/`fs.write` paths at the same
//!   path; h5i's own places at a box path of their own, never the host's: the workspace at
//!   `/work`, the spool, the box's HOME and the object store the workspace borrows from under
//!   `/.h5i` (`h5i_policy::inbox`), so nothing the box sees names where the parent repository
//!   lives; nothing else of the parent's `.git` is mounted;
//! - a private scratch `/tmp` (tmpfs) mounted before the binds, so a workspace that itself lives
//!   under `/tmp` stays visible;
//! - minimal `/dev`, its own `/proc` (pid namespace), no `/sys` at all (libcontainer would mount
//!   cgroup controllers read-write on v1);
//! - a user namespace with one mapping line, box uid/gid 0 -> `uid`/`gid` for `id_count` ids:
//!   an unprivileged caller's own ids (it can map only itself), or for a root caller the
//!   unprivileged range h5i owns (never host root; see `h5i::identity`); libcontainer needs
//!   uid 0 mapped to set the box up. Empty capability sets and `noNewPrivileges`, so "root" in
//!   the box holds nothing. The rootfs directory is owned by the mapped root, which makes the
//!   mount points in it (h5i-runc's `stage` makes the sources reachable to it). One exception:
//!   an unprivileged caller's browser box maps one more group (`extra_gid`), the sidecar's;
//! - `net.mode = "deny"`: an empty network namespace (loopback only); `host`: the host's;
//!   a box with a live service joins that service's network namespace (and, so the join is
//!   permitted, its user namespace, which has the same single mapping) by path;
//! - with a socket gate (supervised tier): `linux.seccomp` sends every `socket`/`socketpair`
//!   call to the gate's listener (`crate::socket_gate::notify_section`) and the annotation
//!   `h5i.net.gate = on` tells the executor to leave those calls to it.
//!
//! Pure: [`BundlePlan::to_config`] builds the JSON and unit tests check it; writing it to disk is
//! [`write_bundle`]. Must never: mount a path the policy did not grant, or grant a capability.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::confine::{
    ANNOTATION_LANDLOCK, ANNOTATION_NET_GATE, ANNOTATION_NET_UNIX, ANNOTATION_SECCOMP, NET_GATE_ON,
};

/// The `/dev/shm` a box gets unless its plan asks for more: 64 MiB, what OCI runtimes give.
pub const DEFAULT_SHM_BYTES: u64 = 64 << 20;

/// Everything a bundle needs, with `$WORK`/`$HOME` already expanded by the caller.
#[derive(Debug, Clone)]
pub struct BundlePlan {
    /// Container id (also the hostname suffix).
    pub id: String,
    /// Command and arguments.
    pub argv: Vec<String>,
    /// Environment, `K=V`.
    pub env: Vec<String>,
    /// Working directory inside the box.
    pub cwd: PathBuf,
    /// Every directory grant: the policy's paths, the workspace and its `$WORK/..` grants, the
    /// spool, the box's HOME, the borrowed object store.
    pub binds: Vec<Bind>,
    /// Overlays mounted after every directory grant (so one may sit beneath a grant): npm's
    /// built tree under a box-private upper layer.
    pub overlays: Vec<Overlay>,
    /// Whether the box gets the host's network namespace.
    pub host_network: bool,
    /// Whether `socket(AF_UNIX)` is allowed.
    pub unix_sockets: bool,
    /// Host uid the box's uid 0 maps to: the caller's, or a root caller's box range.
    pub uid: u32,
    /// Host gid the box's gid 0 maps to.
    pub gid: u32,
    /// How many ids the map holds from there (1 for an unprivileged caller).
    pub id_count: u32,
    /// The box's own gid the process runs as: 0, except for a process the box's network
    /// namespace must tell apart from the box's by its sockets (the browser sidecar's
    /// Chromium); it must be inside the map (`id_count`, or `extra_gid`).
    pub process_gid: u32,
    /// One more line of the gid map, (box gid, host gid): for an unprivileged caller's browser
    /// box, whose one-id map has no group for the sidecar, the sidecar's group mapped to the
    /// caller's first subordinate gid (libcontainer then writes the map with `newgidmap`,
    /// which checks `/etc/subgid`).
    pub extra_gid: Option<(u32, u32)>,
    /// `linux.cgroupsPath`, when a cage holds the limits.
    pub cgroups_path: Option<String>,
    /// Largest file the box may write, bytes (`RLIMIT_FSIZE`).
    pub max_file_bytes: Option<u64>,
    /// Size of the private `/tmp`, bytes.
    pub tmp_bytes: u64,
    /// Size of `/dev/shm`, bytes (a browser box's Chromium keeps its renderers' shared memory
    /// there; [`DEFAULT_SHM_BYTES`] otherwise).
    pub shm_bytes: u64,
    /// `createContainer` hooks, each an argv whose first element is the program's absolute
    /// path; the runtime runs them inside the container's namespaces, before `pivot_root`, with
    /// the container state on stdin.
    pub create_container_hooks: Vec<Vec<String>>,
    /// `createRuntime` hooks: run by the runtime on the host side once the container's
    /// namespaces exist, before any `createContainer` hook (the supervised tier's sentry).
    pub create_runtime_hooks: Vec<Vec<String>>,
    /// `poststop` hooks: run by the runtime after the container is gone.
    pub poststop_hooks: Vec<Vec<String>>,
    /// More `h5i.*` annotations, added over the ones the plan derives itself (the supervised
    /// tier's network plan).
    pub extra_annotations: BTreeMap<String, String>,
    /// Read-only single-file binds `(host file, box path)`, mounted after every directory grant
    /// so they cover what a grant brought in (the supervised tier's `/etc/hosts`).
    pub file_binds: Vec<(PathBuf, PathBuf)>,
    /// A program bound read-only (and executable) into the box `(host file, box path)`: the
    /// box sandbox's init.
    pub init_program: Option<(PathBuf, PathBuf)>,
    /// Programs of h5i's own bound read-only (and executable) into the box `(host file, box
    /// path)`, under `/.h5i`: the in-box capture hook an agent's tool calls run.
    pub programs: Vec<(PathBuf, PathBuf)>,
    /// `process.terminal`: the box gets a pty of its own, whose master the runtime sends to the
    /// console socket (`box shell`); never the caller's terminal.
    pub terminal: bool,
    /// Join this network namespace (`/proc/<pid>/ns/net` of a live service of the same box)
    /// instead of making an empty one. Ignored with `host_network`.
    pub netns_path: Option<PathBuf>,
    /// Join this user namespace instead of making one (the owner of `netns_path`: entering a
    /// network namespace needs a capability in its owning user namespace). The mappings are
    /// then the joined namespace's and none are written.
    pub userns_path: Option<PathBuf>,
    /// The socket gate's listener (`<net dir>/gate.sock`), when the box's socket calls go
    /// through the gate.
    pub socket_gate: Option<PathBuf>,
}

/// One directory bind: a host path, seen by the box at `dest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// The host path.
    pub source: PathBuf,
    /// Where the box sees it.
    pub dest: PathBuf,
    /// Read-write (else read-only).
    pub writable: bool,
}

impl Bind {
    /// A read-write bind of `source` at `dest`.
    pub fn rw(source: impl Into<PathBuf>, dest: impl Into<PathBuf>) -> Self {
        Bind {
            source: source.into(),
            dest: dest.into(),
            writable: true,
        }
    }

    /// A read-only bind of `source` at `dest`.
    pub fn ro(source: impl Into<PathBuf>, dest: impl Into<PathBuf>) -> Self {
        Bind {
            source: source.into(),
            dest: dest.into(),
            writable: false,
        }
    }
}

/// An overlayfs the box sees at `dest`: `lower`, never written (overlayfs keeps every change
/// of the box's in the upper layer: a write copies the file up, an unlink or rename leaves a
/// whiteout there), over `state`, a box-private directory holding the upper layer
/// ([`Overlay::upper`]) and overlayfs's work directory ([`Overlay::work`]), which must be on
/// one filesystem. Mounted from inside the box's user namespace (`userxattr`: overlayfs's own
/// attributes in the `user.` namespace, the one an unprivileged mounter may write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    /// The read-only lower layer (host path).
    pub lower: PathBuf,
    /// The box-private directory holding `upper/` and `work/` (host path).
    pub state: PathBuf,
    /// Where the box sees the merged tree.
    pub dest: PathBuf,
}

impl Overlay {
    /// The upper layer: `<state>/upper`.
    pub fn upper(&self) -> PathBuf {
        self.state.join("upper")
    }

    /// overlayfs's work directory: `<state>/work`.
    pub fn work(&self) -> PathBuf {
        self.state.join("work")
    }

    /// The OCI mount: `lowerdir+` (one path, no separator or escape parsed, so a host path
    /// holding `:` or `,` is taken whole), `upperdir`, `workdir`, `userxattr`.
    fn mount(&self) -> Value {
        json!({"destination": self.dest, "type": "overlay", "source": "overlay",
               "options": [format!("lowerdir+={}", self.lower.display()),
                           format!("upperdir={}", self.upper().display()),
                           format!("workdir={}", self.work().display()),
                           "userxattr", "nosuid", "nodev"]})
    }
}

/// What a plan left out, for `status` and the receipt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleNotes {
    /// Granted paths that do not exist on this host (not mounted).
    pub missing: Vec<PathBuf>,
    /// Why `mem`/`procs` could not be held for this run, when they could not.
    pub limits_unheld: Option<String>,
}

impl BundlePlan {
    /// The `config.json` value, and what was skipped.
    pub fn to_config(&self, exists: impl Fn(&Path) -> bool) -> (Value, BundleNotes) {
        let mut notes = BundleNotes::default();
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc",
                   "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
            json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                   "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
            json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                   "options": ["nosuid", "noexec", "nodev", "mode=1777", format!("size={}k", self.shm_bytes >> 10)]}),
            json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=1777", format!("size={}", self.tmp_bytes)]}),
        ];
        // Binds after /tmp, shallowest box path first, so a deeper grant is never hidden by a
        // shallower one; one bind per box path (read-only wins over read-write).
        let mut binds: Vec<(&Path, &Path, bool)> = self
            .binds
            .iter()
            .map(|b| (b.source.as_path(), b.dest.as_path(), b.writable))
            .collect();
        binds.sort_by_key(|(_, dest, rw)| (dest.components().count(), dest.to_path_buf(), *rw));
        binds.dedup_by(|a, b| a.1 == b.1);
        let mut landlock_read = vec!["/proc".to_string(), "/dev".to_string()];
        let mut landlock_write = vec![
            "/tmp".to_string(),
            "/dev/null".to_string(),
            "/dev/zero".to_string(),
            "/dev/full".to_string(),
            "/dev/pts".to_string(),
            "/dev/shm".to_string(),
            "/dev/tty".to_string(),
        ];
        for (source, dest, rw) in binds {
            if !exists(source) {
                notes.missing.push(source.to_path_buf());
                continue;
            }
            let mut options = vec!["rbind", "nosuid", "nodev"];
            options.push(if rw { "rw" } else { "ro" });
            mounts.push(
                json!({"destination": dest, "type": "bind", "source": source, "options": options}),
            );
            // Landlock is applied inside the box, after pivot_root: it names box paths.
            let s = dest.display().to_string();
            if rw {
                landlock_write.push(s);
            } else {
                landlock_read.push(s);
            }
        }
        for o in &self.overlays {
            if !exists(&o.lower) || !exists(&o.upper()) || !exists(&o.work()) {
                notes.missing.push(o.lower.clone());
                continue;
            }
            mounts.push(o.mount());
            landlock_write.push(o.dest.display().to_string());
        }
        for (src, dst) in &self.file_binds {
            mounts.push(json!({"destination": dst, "type": "bind", "source": src,
                               "options": ["bind", "nosuid", "nodev", "noexec", "ro"]}));
            landlock_read.push(dst.display().to_string());
        }
        for (src, dst) in self.init_program.iter().chain(&self.programs) {
            mounts.push(json!({"destination": dst, "type": "bind", "source": src,
                               "options": ["bind", "nosuid", "nodev", "ro"]}));
            landlock_read.push(dst.display().to_string());
        }
        let landlock = json!({"read": landlock_read, "write": landlock_write});
        let mut annotations = BTreeMap::new();
        annotations.insert(ANNOTATION_LANDLOCK.to_string(), landlock.to_string());
        annotations.insert(
            ANNOTATION_SECCOMP.to_string(),
            crate::confine::seccomp::PROFILE_H5I_V2.to_string(),
        );
        annotations.insert(
            ANNOTATION_NET_UNIX.to_string(),
            if self.unix_sockets { "true" } else { "false" }.to_string(),
        );
        for (k, v) in &self.extra_annotations {
            annotations.insert(k.clone(), v.clone());
        }
        let mut namespaces = vec![
            json!({"type": "pid"}),
            json!({"type": "mount"}),
            json!({"type": "ipc"}),
            json!({"type": "uts"}),
            match &self.userns_path {
                Some(p) => json!({"type": "user", "path": p}),
                None => json!({"type": "user"}),
            },
            json!({"type": "cgroup"}),
        ];
        if !self.host_network {
            namespaces.push(match &self.netns_path {
                Some(p) => json!({"type": "network", "path": p}),
                None => json!({"type": "network"}),
            });
        }
        let mut rlimits = vec![json!({"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096})];
        if let Some(f) = self.max_file_bytes {
            rlimits.push(json!({"type": "RLIMIT_FSIZE", "hard": f, "soft": f}));
        }
        let mut gid_mappings =
            vec![json!({"containerID": 0, "hostID": self.gid, "size": self.id_count})];
        if let Some((inside, host)) = self.extra_gid {
            gid_mappings.push(json!({"containerID": inside, "hostID": host, "size": 1}));
        }
        let mut linux = json!({
            "namespaces": namespaces,
            "uidMappings": [{"containerID": 0, "hostID": self.uid, "size": self.id_count}],
            "gidMappings": gid_mappings,
            "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
                            "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                            "/proc/sched_debug", "/proc/scsi"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                              "/proc/sysrq-trigger"],
        });
        if let Some(cg) = &self.cgroups_path {
            linux["cgroupsPath"] = json!(cg);
        }
        if let Some(listener) = &self.socket_gate {
            linux["seccomp"] = crate::socket_gate::notify_section(listener);
            annotations.insert(ANNOTATION_NET_GATE.to_string(), NET_GATE_ON.to_string());
        }
        if self.userns_path.is_some() {
            if let Some(l) = linux.as_object_mut() {
                l.remove("uidMappings");
                l.remove("gidMappings");
            }
        }
        // A runtime runs a hook with only the variables its spec names: h5i's log filter is
        // the one it gets, so `H5I_LOG` reaches the hooks and the sentry.
        let hook_env = h5i_log::passed_env();
        let declare = |list: &[Vec<String>]| -> Vec<Value> {
            list.iter()
                .map(|argv| {
                    let mut hook = json!({"path": argv[0], "args": argv, "timeout": 10});
                    if !hook_env.is_empty() {
                        hook["env"] = json!(hook_env);
                    }
                    hook
                })
                .collect()
        };
        let mut hooks = serde_json::Map::new();
        for (stage, list) in [
            ("createRuntime", &self.create_runtime_hooks),
            ("createContainer", &self.create_container_hooks),
            ("poststop", &self.poststop_hooks),
        ] {
            if !list.is_empty() {
                hooks.insert(stage.to_string(), Value::Array(declare(list)));
            }
        }
        let mut config = json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": self.terminal,
                "user": {"uid": 0, "gid": self.process_gid},
                "args": self.argv,
                "env": self.env,
                "cwd": self.cwd,
                "capabilities": {"bounding": [], "effective": [], "inheritable": [],
                                 "permitted": [], "ambient": []},
                "rlimits": rlimits,
                "noNewPrivileges": true,
            },
            "root": {"path": "rootfs", "readonly": true},
            "hostname": format!("h5i-{}", self.id),
            "mounts": mounts,
            "linux": linux,
            "annotations": annotations,
        });
        if !hooks.is_empty() {
            config["hooks"] = Value::Object(hooks);
        }
        (config, notes)
    }
}

/// Write `config.json` and an empty `rootfs/` owned by the box's root into `dir`.
pub fn write_bundle(plan: &BundlePlan, dir: &Path) -> std::io::Result<BundleNotes> {
    let (config, notes) = plan.to_config(|p| p.exists());
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    // The box's root makes the mount points in it from inside its user namespace.
    std::os::unix::fs::lchown(&rootfs, Some(plan.uid), Some(plan.gid))?;
    let bytes = serde_json::to_vec_pretty(&config).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("config.json"), bytes)?;
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> BundlePlan {
        BundlePlan {
            id: "b1".into(),
            argv: vec!["true".into()],
            env: vec!["PATH=/usr/bin:/bin".into()],
            cwd: "/work".into(),
            binds: vec![
                Bind::ro("/usr", "/usr"),
                Bind::ro("/etc", "/etc"),
                Bind::ro("/nope", "/nope"),
                Bind::rw("/tmp/repo/.git/.h5i/env/none/b/workspace", "/work"),
                Bind::ro("/tmp/repo/.git/objects", "/.h5i/objects"),
                Bind::rw("/tmp/repo/.git/.h5i/env/none/b/spool", "/.h5i/spool"),
            ],
            overlays: Vec::new(),
            host_network: false,
            unix_sockets: false,
            uid: 1000,
            gid: 1000,
            id_count: 1,
            process_gid: 0,
            extra_gid: None,
            cgroups_path: Some("/x/h5i/b1/c".into()),
            max_file_bytes: Some(1 << 30),
            tmp_bytes: 256 << 20,
            shm_bytes: DEFAULT_SHM_BYTES,
            create_container_hooks: vec![vec!["/opt/h5i-hook".into(), "loopback".into()]],
            create_runtime_hooks: Vec::new(),
            poststop_hooks: Vec::new(),
            extra_annotations: BTreeMap::new(),
            file_binds: Vec::new(),
            init_program: None,
            programs: Vec::new(),
            terminal: false,
            netns_path: None,
            userns_path: None,
            socket_gate: None,
        }
    }

    fn mounts(v: &Value) -> Vec<(String, String)> {
        v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["destination"].as_str().unwrap().to_string(),
                    m["options"].to_string(),
                )
            })
            .collect()
    }

    fn source_of(v: &Value, dest: &str) -> Option<String> {
        v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == dest)
            .map(|m| m["source"].as_str().unwrap().to_string())
    }

    #[test]
    fn grants_become_binds_and_missing_paths_are_noted() {
        let (v, notes) = plan().to_config(|p| p != Path::new("/nope"));
        let m = mounts(&v);
        let find = |d: &str| m.iter().find(|(x, _)| x == d).map(|(_, o)| o.clone());
        assert!(find("/usr").unwrap().contains("\"ro\""));
        assert!(find("/work").unwrap().contains("\"rw\""));
        assert!(find("/.h5i/objects").unwrap().contains("\"ro\""));
        assert!(find("/.h5i/spool").unwrap().contains("\"rw\""));
        assert!(find("/nope").is_none());
        assert_eq!(notes.missing, vec![PathBuf::from("/nope")]);
        assert!(find("/sys").is_none() && find("/sys/fs/cgroup").is_none());
    }

    #[test]
    fn binds_mount_the_host_path_at_the_box_path_and_no_bind_names_the_host_layout() {
        let (v, _) = plan().to_config(|_| true);
        assert_eq!(
            source_of(&v, "/work").as_deref(),
            Some("/tmp/repo/.git/.h5i/env/none/b/workspace")
        );
        assert_eq!(
            source_of(&v, "/.h5i/objects").as_deref(),
            Some("/tmp/repo/.git/objects")
        );
        for (dest, _) in mounts(&v) {
            assert!(!dest.contains("/tmp/repo"), "{dest} names the host layout");
        }
        assert_eq!(v["process"]["cwd"], "/work");
    }

    #[test]
    fn a_grant_beneath_another_is_mounted_after_it() {
        let mut p = plan();
        p.binds.insert(
            0,
            Bind::ro(
                "/tmp/repo/.git/.h5i/env/none/b/workspace/vendor",
                "/work/vendor",
            ),
        );
        let (v, _) = p.to_config(|_| true);
        let m = mounts(&v);
        let work = m.iter().position(|(d, _)| d == "/work").unwrap();
        let vendor = m.iter().position(|(d, _)| d == "/work/vendor").unwrap();
        assert!(work < vendor);
        assert!(m[vendor].1.contains("\"ro\""));
    }

    #[test]
    fn tmp_is_mounted_before_any_bind_beneath_it() {
        let (v, _) = plan().to_config(|_| true);
        let m = mounts(&v);
        let tmp = m.iter().position(|(d, _)| d == "/tmp").unwrap();
        let ws = m.iter().position(|(d, _)| d == "/work").unwrap();
        assert!(tmp < ws);
    }

    #[test]
    fn the_box_holds_no_capability_and_maps_only_the_caller() {
        let (v, _) = plan().to_config(|_| true);
        for set in [
            "bounding",
            "effective",
            "inheritable",
            "permitted",
            "ambient",
        ] {
            assert_eq!(v["process"]["capabilities"][set], json!([]), "{set}");
        }
        assert_eq!(v["process"]["noNewPrivileges"], true);
        assert_eq!(
            v["linux"]["uidMappings"],
            json!([{"containerID": 0, "hostID": 1000, "size": 1}])
        );
        let ns: Vec<String> = v["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap().to_string())
            .collect();
        for want in ["user", "pid", "mount", "network"] {
            assert!(ns.contains(&want.to_string()), "{want}");
        }
    }

    #[test]
    fn a_root_callers_range_is_mapped_whole_in_one_line() {
        let mut p = plan();
        (p.uid, p.gid, p.id_count) = (265_536, 265_536, 65_536);
        let (v, _) = p.to_config(|_| true);
        for key in ["uidMappings", "gidMappings"] {
            assert_eq!(
                v["linux"][key],
                json!([{"containerID": 0, "hostID": 265_536, "size": 65_536}]),
                "{key}"
            );
        }
    }

    #[test]
    fn hooks_are_declared_for_create_container() {
        let (v, _) = plan().to_config(|_| true);
        assert_eq!(v["hooks"]["createContainer"][0]["path"], "/opt/h5i-hook");
        assert_eq!(v["hooks"]["createContainer"][0]["args"][1], "loopback");
    }

    #[test]
    fn every_hook_stage_is_declared_and_empty_stages_are_left_out() {
        let mut p = plan();
        p.create_runtime_hooks = vec![vec!["/opt/h5i-hook".into(), "net-up".into()]];
        p.poststop_hooks = vec![vec!["/opt/h5i-hook".into(), "net-down".into()]];
        let (v, _) = p.to_config(|_| true);
        assert_eq!(v["hooks"]["createRuntime"][0]["args"][1], "net-up");
        assert_eq!(v["hooks"]["createContainer"][0]["args"][1], "loopback");
        assert_eq!(v["hooks"]["poststop"][0]["args"][1], "net-down");
        assert!(v["hooks"].get("prestart").is_none());
        let (v, _) = plan().to_config(|_| true);
        assert!(v["hooks"].get("createRuntime").is_none() && v["hooks"].get("poststop").is_none());
    }

    #[test]
    fn file_binds_come_after_the_grant_they_cover_read_only() {
        let mut p = plan();
        p.file_binds = vec![("/run/h5i/n-1/hosts".into(), "/etc/hosts".into())];
        p.extra_annotations
            .insert("h5i.net".into(), "supervised".into());
        let (v, _) = p.to_config(|_| true);
        let m = mounts(&v);
        let etc = m.iter().position(|(d, _)| d == "/etc").unwrap();
        let hosts = m.iter().position(|(d, _)| d == "/etc/hosts").unwrap();
        assert!(etc < hosts);
        assert!(m[hosts].1.contains("\"ro\""));
        assert_eq!(v["annotations"]["h5i.net"], "supervised");
        assert_eq!(v["annotations"]["h5i.seccomp"], "h5i-v2");
    }

    #[test]
    fn an_overlay_comes_after_the_grant_it_sits_in_and_names_its_layers_whole() {
        let mut p = plan();
        p.overlays = vec![Overlay {
            lower: "/r,x:y/.git/.h5i/cache/npm/k/tree/node_modules".into(),
            state: "/b/npm-tree/k".into(),
            dest: "/work/node_modules".into(),
        }];
        let (v, notes) = p.to_config(|_| true);
        assert!(notes.missing.is_empty());
        let m = mounts(&v);
        let work = m.iter().position(|(d, _)| d == "/work").unwrap();
        let nm = m
            .iter()
            .position(|(d, _)| d == "/work/node_modules")
            .unwrap();
        assert!(work < nm);
        let mount = &v["mounts"][nm];
        assert_eq!(mount["type"], "overlay");
        assert_eq!(
            mount["options"],
            json!([
                "lowerdir+=/r,x:y/.git/.h5i/cache/npm/k/tree/node_modules",
                "upperdir=/b/npm-tree/k/upper",
                "workdir=/b/npm-tree/k/work",
                "userxattr",
                "nosuid",
                "nodev"
            ])
        );
        let landlock: Value =
            serde_json::from_str(v["annotations"]["h5i.landlock"].as_str().unwrap()).unwrap();
        assert!(landlock["write"]
            .as_array()
            .unwrap()
            .contains(&json!("/work/node_modules")));
        // A layer that is gone is noted and not mounted.
        let (v, notes) = p.to_config(|q| !q.ends_with("upper"));
        assert_eq!(notes.missing.len(), 1);
        assert!(mounts(&v).iter().all(|(d, _)| d != "/work/node_modules"));
    }

    #[test]
    fn a_terminal_is_asked_for_only_when_planned() {
        let (v, _) = plan().to_config(|_| true);
        assert_eq!(v["process"]["terminal"], false);
        let mut p = plan();
        p.terminal = true;
        let (v, _) = p.to_config(|_| true);
        assert_eq!(v["process"]["terminal"], true);
    }

    #[test]
    fn a_joined_network_namespace_is_entered_by_path_with_its_user_namespace() {
        let mut p = plan();
        p.netns_path = Some("/proc/42/ns/net".into());
        p.userns_path = Some("/proc/42/ns/user".into());
        let (v, _) = p.to_config(|_| true);
        let ns = v["linux"]["namespaces"].as_array().unwrap();
        assert!(ns.contains(&json!({"type": "network", "path": "/proc/42/ns/net"})));
        assert!(ns.contains(&json!({"type": "user", "path": "/proc/42/ns/user"})));
        assert!(v["linux"].get("uidMappings").is_none());
        assert!(v["linux"].get("gidMappings").is_none());
    }

    #[test]
    fn host_network_keeps_the_hosts_namespace() {
        let mut p = plan();
        p.host_network = true;
        let (v, _) = p.to_config(|_| true);
        assert!(!v["linux"]["namespaces"].to_string().contains("network"));
    }

    #[test]
    fn annotations_carry_landlock_seccomp_and_unix() {
        let (v, _) = plan().to_config(|_| true);
        let ll: Value =
            serde_json::from_str(v["annotations"]["h5i.landlock"].as_str().unwrap()).unwrap();
        assert!(ll["read"].as_array().unwrap().contains(&json!("/usr")));
        assert!(ll["write"].as_array().unwrap().contains(&json!("/work")));
        assert!(ll["read"]
            .as_array()
            .unwrap()
            .contains(&json!("/.h5i/objects")));
        assert!(!ll.to_string().contains("/tmp/repo"));
        assert!(!ll["write"].as_array().unwrap().contains(&json!("/usr")));
        assert_eq!(v["annotations"]["h5i.seccomp"], "h5i-v2");
        assert_eq!(v["annotations"]["h5i.net.unix"], "false");
    }
    #[test]
    fn no_gate_means_no_spec_seccomp_and_no_gate_annotation() {
        let (v, _) = plan().to_config(|_| true);
        assert!(v["linux"].get("seccomp").is_none());
        assert!(v["annotations"].get("h5i.net.gate").is_none());
    }

    #[test]
    fn a_socket_gate_routes_socket_calls_to_its_listener() {
        let mut p = plan();
        p.socket_gate = Some("/run/h5i/net/b1/gate.sock".into());
        let (v, _) = p.to_config(|_| true);
        assert_eq!(
            v["linux"]["seccomp"],
            json!({
                "defaultAction": "SCMP_ACT_ALLOW",
                "listenerPath": "/run/h5i/net/b1/gate.sock",
                "syscalls": [{"names": ["socket", "socketpair"], "action": "SCMP_ACT_NOTIFY"}]
            })
        );
        assert_eq!(v["annotations"]["h5i.net.gate"], "on");
        assert_eq!(v["annotations"]["h5i.seccomp"], "h5i-v2");
        // What h5i-runc's executor will check before trusting the annotation.
        let spec: libcontainer::oci_spec::runtime::Spec = serde_json::from_value(v).unwrap();
        let seccomp = spec.linux().as_ref().unwrap().seccomp().as_ref().unwrap();
        assert!(crate::socket_gate::routes_sockets_to_listener(seccomp));
    }
}
