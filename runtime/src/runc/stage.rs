//! Mount sources reached from the host's user namespace, for a container whose root is not
//! host root.
//!
//! libcontainer sets a container's mounts up from inside its new user namespace: every bind
//! source (and the rootfs, and each `createContainer` hook's program) is looked up by path with
//! the credentials of the container's root. When h5i runs as root that root is an unprivileged
//! host id (`h5i-box`'s range), which holds no DAC override over host-root inodes: a workspace
//! under a `0700` directory (`/root/src/...`, a test's temporary directory, the box store's
//! `0700` box directories, `/run/h5i`) could not even be traversed. So before libcontainer
//! forks, h5i-runc (still host root in the host's user namespace):
//! 1. moves itself into a private mount namespace (`unshare(CLONE_NEWNS)`, `/` made
//!    recursively private: nothing it mounts reaches the host's);
//! 2. mounts a fresh tmpfs (mode 0755) over [`STAGE_DIR`], an empty root-owned directory on
//!    the host;
//! 3. bind-mounts (recursively) the rootfs, every bind source and every `createContainer` hook
//!    program onto their own entry of that tmpfs, resolving each path as host root;
//! 4. for an overlay mount, stages the directory holding its upper and work directories the
//!    same way, and its lower layer as a read-only **idmapped** mount whose map is the
//!    container's own (a user namespace made for it with the spec's mappings, or the one the
//!    spec joins): the lower layer is a tree host root owns (npm's built tree in the
//!    repository's cache), which the container's root would otherwise see owned by nobody, so
//!    it could neither change a file of it (overlayfs copies it up) nor remove one (overlayfs
//!    whites it out); through the map the container's root owns it, and overlayfs still never
//!    writes the lower layer (nor could it: the mount is read-only);
//! 5. rewrites the spec to name the staged paths.
//!
//! The container's mount namespace is a copy of this one, so libcontainer finds each tree at a
//! path whose only directory is the world-traversable tmpfs root; the box sees every mount at
//! its usual destination, with the permissions of the source itself (a `0700` root-owned
//! source stays closed to the box). Nothing is chowned or made traversable on the host.
//!
//! Must never: mount anything in the host's mount namespace, stage a path the spec does not
//! name, or run for a caller that is not real root (an unprivileged runtime's container root is
//! the caller, who reaches its own paths).
//!
//! Guarded by the unit tests below and, through real boxes, by `tests/identity.rs`.

use h5i_sys::mount::mount;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{LinuxNamespaceType, Spec};

/// The host directory the staging tmpfs is mounted over (in h5i-runc's own namespace only).
pub const STAGE_DIR: &str = "/run/h5i-runc-stage";

/// Why staging failed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// A step failed.
    #[error("refusing: cannot stage {path} for a container whose root is not host root ({step}: {source}); to fix: check that {STAGE_DIR} is an empty directory owned by root and that the path exists")]
    Step {
        /// What was being done.
        step: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Whether `spec` needs staging when run by a runtime that `real_root` says is host root: the
/// container has a user namespace (made or joined), so its root's lookups are not host root's.
pub fn needed(spec: &Spec, real_root: bool) -> bool {
    real_root
        && spec
            .linux()
            .as_ref()
            .and_then(|l| l.namespaces().as_ref())
            .is_some_and(|ns| ns.iter().any(|n| n.typ() == LinuxNamespaceType::User))
}

fn is_bind(m: &libcontainer::oci_spec::runtime::Mount) -> bool {
    m.typ().as_deref() == Some("bind")
        || m.options()
            .as_ref()
            .is_some_and(|o| o.iter().any(|x| x == "bind" || x == "rbind"))
}

/// One tree to stage: host path, entry name under [`STAGE_DIR`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The host path, resolved as host root.
    pub source: PathBuf,
    /// Its entry under the staging tmpfs.
    pub staged: PathBuf,
    /// Staged read-only through the container's id map (an overlay's lower layer), not as a
    /// plain recursive bind.
    pub idmapped: bool,
}

/// How `enter` finds the user namespace an idmapped entry is mapped through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdMap {
    /// One made for it with these `uid_map` and `gid_map` texts (the spec's mappings).
    Maps(String, String),
    /// The user namespace the spec joins, by path.
    Joined(PathBuf),
}

/// The id map of `spec`'s container: its mappings, or the user namespace it joins.
pub fn id_map(spec: &Spec) -> Option<IdMap> {
    let linux = spec.linux().as_ref()?;
    let text = |m: &Option<Vec<libcontainer::oci_spec::runtime::LinuxIdMapping>>| {
        m.as_ref().filter(|m| !m.is_empty()).map(|m| {
            m.iter()
                .map(|l| format!("{} {} {}\n", l.container_id(), l.host_id(), l.size()))
                .collect::<String>()
        })
    };
    if let (Some(u), Some(g)) = (text(linux.uid_mappings()), text(linux.gid_mappings())) {
        return Some(IdMap::Maps(u, g));
    }
    linux
        .namespaces()
        .as_ref()?
        .iter()
        .find(|n| n.typ() == LinuxNamespaceType::User)
        .and_then(|n| n.path().clone())
        .map(IdMap::Joined)
}

/// Stage an overlay mount's layers (`options`, the OCI mount's): its `lowerdir+` as an
/// idmapped entry `o<i>l`, the one directory holding its `upperdir` and `workdir` as a plain
/// entry `o<i>`; the options are rewritten to name them. Layers that do not exist, or an upper
/// and work directory that do not share their parent, are left alone: libcontainer then
/// reports the mount with the spec's own paths.
fn stage_overlay(
    i: usize,
    options: &mut [String],
    stage: &Path,
    exists: &impl Fn(&Path) -> bool,
    entries: &mut Vec<Entry>,
) {
    let value = |key: &str| {
        options
            .iter()
            .find_map(|o| o.strip_prefix(key).map(PathBuf::from))
    };
    let (upper, work) = (value("upperdir="), value("workdir="));
    let state = match (&upper, &work) {
        (Some(u), Some(w)) if u.parent().is_some() && u.parent() == w.parent() => {
            u.parent().map(Path::to_path_buf)
        }
        _ => None,
    };
    for o in options.iter_mut() {
        if let Some(lower) = o.strip_prefix("lowerdir+=").map(PathBuf::from) {
            if exists(&lower) {
                let staged = stage.join(format!("o{i}l"));
                *o = format!("lowerdir+={}", staged.display());
                entries.push(Entry {
                    source: lower,
                    staged,
                    idmapped: true,
                });
            }
        }
    }
    let Some(state) = state.filter(|s| exists(s)) else {
        return;
    };
    let staged = stage.join(format!("o{i}"));
    for o in options.iter_mut() {
        for key in ["upperdir=", "workdir="] {
            if let Some(name) = o
                .strip_prefix(key)
                .and_then(|p| Path::new(p).file_name().map(PathBuf::from))
            {
                *o = format!("{key}{}", staged.join(name).display());
            }
        }
    }
    entries.push(Entry {
        source: state,
        staged,
        idmapped: false,
    });
}

/// Rewrite `spec` to name staged paths (rootfs `rootfs`, bind sources and hook programs
/// absolute under [`STAGE_DIR`]) and return what must be mounted where. A path that does not
/// exist is left alone: libcontainer reports it with the spec's own path.
pub fn plan(spec: &mut Spec, bundle: &Path, exists: impl Fn(&Path) -> bool) -> Vec<Entry> {
    let stage = Path::new(STAGE_DIR);
    let mut entries = Vec::new();
    if let Some(mut root) = spec.root().clone() {
        let source = bundle.join(root.path());
        if exists(&source) {
            let staged = stage.join("rootfs");
            root.set_path(staged.clone());
            spec.set_root(Some(root));
            entries.push(Entry {
                source,
                staged,
                idmapped: false,
            });
        }
    }
    if let Some(mut mounts) = spec.mounts().clone() {
        for (i, m) in mounts.iter_mut().enumerate() {
            if m.typ().as_deref() == Some("overlay") {
                let mut options = m.options().clone().unwrap_or_default();
                stage_overlay(i, &mut options, stage, &exists, &mut entries);
                m.set_options(Some(options));
                continue;
            }
            let Some(source) = m.source().clone() else {
                continue;
            };
            if !is_bind(m) || !source.is_absolute() || !exists(&source) {
                continue;
            }
            let staged = stage.join(format!("m{i}"));
            m.set_source(Some(staged.clone()));
            entries.push(Entry {
                source,
                staged,
                idmapped: false,
            });
        }
        spec.set_mounts(Some(mounts));
    }
    if let Some(mut hooks) = spec.hooks().clone() {
        if let Some(mut list) = hooks.create_container().clone() {
            for (i, h) in list.iter_mut().enumerate() {
                let source = h.path().clone();
                if !exists(&source) {
                    continue;
                }
                let staged = stage.join(format!("h{i}"));
                h.set_path(staged.clone());
                entries.push(Entry {
                    source,
                    staged,
                    idmapped: false,
                });
            }
            hooks.set_create_container(Some(list));
        }
        spec.set_hooks(Some(hooks));
    }
    entries
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("NUL in a path"))
}

/// Enter a private mount namespace and mount `entries` under a fresh tmpfs at [`STAGE_DIR`],
/// an idmapped entry through `id_map` (which must be given when one is). The process must be
/// single-threaded (`unshare(CLONE_NEWNS)` refuses a shared fs context).
pub fn enter(entries: &[Entry], id_map: Option<&IdMap>) -> Result<(), StageError> {
    let stage = Path::new(STAGE_DIR);
    let step = |step, path: &Path| {
        let path = path.to_path_buf();
        move |source| StageError::Step { step, path, source }
    };
    match std::fs::DirBuilder::new().mode(0o755).create(stage) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(step("mkdir", stage)(e)),
    }
    let meta = std::fs::symlink_metadata(stage).map_err(step("stat", stage))?;
    if !meta.is_dir() || meta.uid() != 0 {
        return Err(step("check", stage)(io::Error::other(
            "not a directory owned by root",
        )));
    }
    // Fails (EINVAL) if threads share our fs context.
    h5i_sys::mount::private_namespace().map_err(step("unshare and make / private", stage))?;
    mount(
        Some(Path::new("tmpfs")),
        stage,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(step("mount tmpfs", stage))?;
    let userns = match (entries.iter().any(|e| e.idmapped), id_map) {
        (false, _) => None,
        (true, Some(IdMap::Maps(u, g))) => Some(
            h5i_sys::idmap::userns_with_maps(u, g)
                .map_err(step("make the id map's user namespace", stage))?,
        ),
        (true, Some(IdMap::Joined(p))) => Some(OwnedFd::from(
            std::fs::File::open(p).map_err(step("open the joined user namespace", p))?,
        )),
        (true, None) => {
            return Err(step("idmap", stage)(io::Error::other(
                "an overlay layer needs the container's id map and the spec has none",
            )))
        }
    };
    for e in entries {
        let meta = std::fs::metadata(&e.source).map_err(step("stat", &e.source))?;
        if meta.is_dir() {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&e.staged)
                .map_err(step("mkdir", &e.staged))?;
        } else {
            std::fs::File::create(&e.staged).map_err(step("create", &e.staged))?;
        }
        if let (true, Some(userns)) = (e.idmapped, &userns) {
            stage_idmapped(&e.source, &e.staged, userns)?;
            continue;
        }
        mount(
            Some(&e.source),
            &e.staged,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )
        .map_err(step("bind", &e.source))?;
    }
    Ok(())
}

/// Mount `source` at `staged` read-only (and nosuid, nodev), its owners seen through `userns`.
fn stage_idmapped(source: &Path, staged: &Path, userns: &OwnedFd) -> Result<(), StageError> {
    use h5i_sys::idmap::{
        attach, clone_tree, MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID,
        MOUNT_ATTR_RDONLY,
    };
    let err = |step: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| StageError::Step { step, path, source }
    };
    let tree = clone_tree(
        &cpath(source).map_err(err("name", source))?,
        MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        userns.as_raw_fd(),
    )
    .map_err(|(s, e)| {
        err(
            match s {
                h5i_sys::idmap::CloneStep::OpenTree => "open_tree",
                h5i_sys::idmap::CloneStep::SetAttr => "idmap (mount_setattr)",
            },
            source,
        )(e)
    })?;
    attach(
        tree.as_raw_fd(),
        &cpath(staged).map_err(err("name", staged))?,
    )
    .map_err(err("attach the idmapped tree", source))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        serde_json::from_str(
            r#"{"ociVersion":"1.0.2","root":{"path":"rootfs","readonly":true},
            "mounts":[
              {"destination":"/proc","type":"proc","source":"proc"},
              {"destination":"/usr","type":"bind","source":"/usr","options":["rbind","ro"]},
              {"destination":"/w","source":"/tmp/x/w","options":["rbind","rw"]},
              {"destination":"/tmp","type":"tmpfs","source":"tmpfs"}],
            "hooks":{"createContainer":[{"path":"/opt/h5i-hook","args":["h5i-hook","loopback"]}],
                     "poststop":[{"path":"/opt/h5i-hook","args":["h5i-hook","down"]}]},
            "linux":{"namespaces":[{"type":"user"},{"type":"mount"}]}}"#,
        )
        .unwrap()
    }

    #[test]
    fn binds_rootfs_and_create_container_hooks_are_staged_and_nothing_else() {
        let mut s = spec();
        let entries = plan(&mut s, Path::new("/run/h5i/run-1"), |_| true);
        let pairs: Vec<(&str, &str)> = entries
            .iter()
            .map(|e| (e.source.to_str().unwrap(), e.staged.to_str().unwrap()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("/run/h5i/run-1/rootfs", "/run/h5i-runc-stage/rootfs"),
                ("/usr", "/run/h5i-runc-stage/m1"),
                ("/tmp/x/w", "/run/h5i-runc-stage/m2"),
                ("/opt/h5i-hook", "/run/h5i-runc-stage/h0"),
            ]
        );
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["root"]["path"], "/run/h5i-runc-stage/rootfs");
        assert_eq!(v["mounts"][0]["source"], "proc");
        assert_eq!(v["mounts"][1]["source"], "/run/h5i-runc-stage/m1");
        assert_eq!(v["mounts"][1]["destination"], "/usr");
        assert_eq!(v["mounts"][3]["source"], "tmpfs");
        assert_eq!(
            v["hooks"]["createContainer"][0]["path"],
            "/run/h5i-runc-stage/h0"
        );
        assert_eq!(v["hooks"]["createContainer"][0]["args"][0], "h5i-hook");
        // poststop hooks run on the host side, after the container: left alone.
        assert_eq!(v["hooks"]["poststop"][0]["path"], "/opt/h5i-hook");
    }

    #[test]
    fn an_overlays_lower_layer_is_staged_idmapped_and_its_upper_and_work_through_their_parent() {
        let mut s: Spec = serde_json::from_str(
            r#"{"ociVersion":"1.0.2",
            "mounts":[
              {"destination":"/work/node_modules","type":"overlay","source":"overlay",
               "options":["lowerdir+=/r/.git/.h5i/cache/npm/k/tree/node_modules",
                          "upperdir=/b/npm-tree/k/upper","workdir=/b/npm-tree/k/work",
                          "userxattr","nosuid","nodev"]}],
            "linux":{"namespaces":[{"type":"user"},{"type":"mount"}],
                     "uidMappings":[{"containerID":0,"hostID":200000,"size":65536}],
                     "gidMappings":[{"containerID":0,"hostID":200000,"size":65536}]}}"#,
        )
        .unwrap();
        let entries = plan(&mut s, Path::new("/b"), |_| true);
        assert_eq!(
            entries,
            vec![
                Entry {
                    source: "/r/.git/.h5i/cache/npm/k/tree/node_modules".into(),
                    staged: "/run/h5i-runc-stage/o0l".into(),
                    idmapped: true,
                },
                Entry {
                    source: "/b/npm-tree/k".into(),
                    staged: "/run/h5i-runc-stage/o0".into(),
                    idmapped: false,
                },
            ]
        );
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v["mounts"][0]["options"],
            serde_json::json!([
                "lowerdir+=/run/h5i-runc-stage/o0l",
                "upperdir=/run/h5i-runc-stage/o0/upper",
                "workdir=/run/h5i-runc-stage/o0/work",
                "userxattr",
                "nosuid",
                "nodev"
            ])
        );
        assert_eq!(
            id_map(&s),
            Some(IdMap::Maps(
                "0 200000 65536\n".into(),
                "0 200000 65536\n".into()
            ))
        );
    }

    #[test]
    fn only_real_root_with_a_user_namespace_stages() {
        assert!(needed(&spec(), true));
        assert!(!needed(&spec(), false));
        let no_userns: Spec = serde_json::from_str(
            r#"{"ociVersion":"1.0.2","linux":{"namespaces":[{"type":"mount"}]}}"#,
        )
        .unwrap();
        assert!(!needed(&no_userns, true));
    }

    #[test]
    fn a_missing_source_keeps_its_own_path() {
        let mut s = spec();
        let entries = plan(&mut s, Path::new("/b"), |p| p != Path::new("/tmp/x/w"));
        assert!(entries.iter().all(|e| e.source != Path::new("/tmp/x/w")));
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["mounts"][2]["source"], "/tmp/x/w");
        assert_eq!(v["mounts"][1]["source"], "/run/h5i-runc-stage/m1");
    }
}
