//! The `podman run` command line of a container-tier run, as data (pure: unit-tested flag by
//! flag, and the same list `make bench` runs without h5i).
//!
//! Owns the article's configuration in one place: the workspace read-write at `/work` and
//! nothing else of the host but the workspace's object store (read-only at `/.h5i/objects`,
//! named by an in-box `alternates` file bound read-only over the workspace's, so the box's git
//! finds the base it borrows without learning the store's host path), the warm dependency caches
//! whose key matches (read-only under `/.h5i/cache`) and the box's spool (`/.h5i/spool`); a
//! read-only image root with a private 1 GiB `/tmp` (nosuid, nodev; also the box's HOME) and
//! no other writable tmpfs but a Claude Code box's `~/.claude` in it (64 MiB, nosuid, nodev);
//! every capability dropped; `no-new-privileges`; a private IPC namespace; `--userns=keep-id`
//! with the engine user's own uid and gid named (`--user UID:GID`, whatever `USER` the image
//! sets, and so no supplementary group looked up in the image's `/etc/group`); `--pull=never`;
//! `--rm`; no network (`--network none`: egress only through the proxy
//! listener a hook hands in); the cage as `--cgroup-parent`; h5i-runc's confinement
//! annotations; catatonit as the box's pid 1 (`--init`, bound read-only at
//! `/run/podman-init`), so the command gets signals as it would outside. Secrets are passed by
//! name (`-e NAME`, the value in Podman's environment), never in argv.
//!
//! Must never: mount the Podman socket or any host path the plan does not name, or let an
//! image pull happen at run time.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Where the workspace appears in the box (the same place at every tier).
pub const BOX_WORK: &str = h5i_policy::inbox::WORK;
/// Where the spool appears in the box (the same place at every tier).
pub const BOX_SPOOL: &str = h5i_policy::inbox::SPOOL;
/// Where the borrowed objects appear in the box (read-only; the same place at every tier).
pub const BOX_OBJECTS: &str = h5i_policy::inbox::OBJECTS;
/// The private `/tmp`'s size: the kernel tiers' (`crate::process::TMP_BYTES`, 1 GiB). At
/// this tier it is also the box's HOME, so the agent's state and the package managers' caches
/// share it with `TMPDIR`; tmpfs pages are charged to the box's `mem`.
pub const TMP_SIZE: &str = "1024m";
/// The size of an agent's config-directory tmpfs ([`PodmanRun::config_tmpfs`]).
pub const CONFIG_TMPFS_SIZE: &str = "64m";
pub use h5i_policy::spec_names::annotation::RUN as RUN_ANNOTATION;
/// Where Podman binds the init program (`--init`) in the box.
pub const INIT_DEST: &str = "/run/podman-init";

/// One bind mount: host (or engine-namespace) source -> box path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// Source path as Podman sees it.
    pub source: PathBuf,
    /// Path in the box.
    pub dest: PathBuf,
    /// Read-only.
    pub readonly: bool,
}

/// Everything one `podman run` needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodmanRun {
    /// The OCI runtime Podman runs (`--runtime`): h5i-runc's path, or `None` for the host's
    /// default (only when the profile asks for it).
    pub runtime: Option<PathBuf>,
    /// Per-run hooks directory (`--hooks-dir`), replacing the system's.
    pub hooks_dir: Option<PathBuf>,
    /// The container's name.
    pub name: String,
    /// The box's user: the engine user's uid and primary gid ([`confinement_flags`]); a
    /// browser sidecar's gid is the box's browser group instead.
    pub user: (u32, u32),
    /// The browser sidecar container whose user and network namespaces this run joins
    /// ([`confinement_flags_for`]), in place of keep-id's and a network of its own.
    pub joins: Option<String>,
    /// `--pidfile`: where the runtime writes the container init's pid (a browser sidecar's,
    /// which its supervisor watches).
    pub pid_file: Option<PathBuf>,
    /// keep-id's mapping spelled out ([`keep_id_maps`]) in place of `--userns=keep-id`: a
    /// browser sidecar's, whose group is not the engine user's (keep-id would add the engine
    /// user's group as a supplementary one, which the sidecar must not hold).
    pub keep_id_maps: Option<KeepIdMaps>,
    /// The run id (the hooks match on it).
    pub run_id: String,
    /// The image reference (a pinned image id).
    pub image: String,
    /// Command and arguments.
    pub argv: Vec<OsString>,
    /// The workspace (read-write at `/work`).
    pub work: Bind,
    /// Other binds (the object store read-only; the spool read-write; an agent box's skill,
    /// settings and capture hook read-only).
    pub binds: Vec<Bind>,
    /// A Claude Code box's `~/.claude` under its `/tmp` HOME: a tmpfs of its own (writable by
    /// the box's users, 1777, `nosuid,nodev`, [`CONFIG_TMPFS_SIZE`]), since the skill's bind
    /// in it would otherwise leave it root's.
    pub config_tmpfs: Option<PathBuf>,
    /// The login shell of the box user's passwd entry (`--passwd-entry`, the entry
    /// `--userns=keep-id` writes, with this shell in place of Podman's `/bin/sh`): a Codex
    /// box's bash, where the tee shim is bound, since Codex runs its commands through the
    /// user's login shell.
    pub login_shell: Option<String>,
    /// Environment `KEY=VALUE` pairs that hold no secret.
    pub env: Vec<(String, String)>,
    /// Names of variables Podman passes from its own environment (secrets, dummies).
    pub env_by_name: Vec<String>,
    /// The cage (`--cgroup-parent`), when one holds the limits.
    pub cgroup_parent: Option<String>,
    /// h5i-runc's annotations (`h5i.landlock`, `h5i.seccomp`, `h5i.net.unix`).
    pub annotations: Vec<(String, String)>,
    /// `--shm-size`, bytes, when the box needs a larger `/dev/shm` than Podman's 64 MiB (a
    /// browser box's Chromium).
    pub shm_bytes: Option<u64>,
    /// `-t`: a pty of the container's own (`box shell`, or `box run` on a terminal).
    pub tty: bool,
    /// The init program (`--init --init-path`, catatonit) that runs as the box's pid 1, so the
    /// command is not pid 1: the kernel drops a signal to pid 1 that it has no handler for, so
    /// without it `timeout`, Ctrl-C and `h5i box run`'s forwarded SIGTERM would not end it.
    pub init: PathBuf,
    /// `--log-driver=passthrough`: the box gets h5i's own standard descriptors (a `/dev/null`
    /// stays writable, `/dev/full` gives ENOSPC inside, a file stays that file) rather than
    /// conmon's pipes. Podman refuses it when any of them is a terminal.
    pub passthrough: bool,
    /// `--timeout`: conmon kills the container this long after its start even when h5i is
    /// gone (killed with SIGKILL, which no handler sees), so a run never outlives its wall
    /// clock by more than [`WALL_GRACE`]. h5i's own wall clock fires first and is what the
    /// receipt reports.
    pub wall: Option<Duration>,
}

/// How long past the wall clock conmon's own timeout waits: h5i's kill comes first whenever
/// h5i is alive.
pub const WALL_GRACE: Duration = Duration::from_secs(5);

/// The flags that make the article's configuration, in order (shared with `make bench`'s
/// baseline so both sides run the same container). `user` is the engine user's uid and primary
/// gid: the box's user under keep-id. Named explicitly because Podman otherwise runs an image's
/// own `USER` (root, or an account of the image's) and, for a user named without a group, adds
/// the groups the image's `/etc/group` gives that name as supplementary groups: the box would
/// not be the engine user, and h5i-runc refuses any supplementary group in a rootless user
/// namespace (CVE-2014-8989), so such an image could not start at all.
pub fn confinement_flags(user: (u32, u32)) -> Vec<String> {
    confinement_flags_for(user, None)
}

/// [`confinement_flags`] for a run that joins the browser sidecar `joins`, when given: its
/// network and its user namespace (`container:NAME`; the user namespace too, since mounting
/// the box's `/sys` needs the one that owns the network namespace) in place of a network of
/// its own and keep-id's. The sidecar's namespace is keep-id's already, so `user` names the
/// same ids there.
pub fn confinement_flags_for(user: (u32, u32), joins: Option<&str>) -> Vec<String> {
    let network = joins.map_or_else(|| "none".to_string(), |c| format!("container:{c}"));
    let userns = joins.map_or_else(
        || "--userns=keep-id".to_string(),
        |c| format!("--userns=container:{c}"),
    );
    vec![
        "--rm".into(),
        "--pull=never".into(),
        "--network".into(),
        network,
        "--read-only".into(),
        "--read-only-tmpfs=false".into(),
        "--tmpfs".into(),
        format!("/tmp:rw,size={TMP_SIZE},nosuid,nodev,notmpcopyup"),
        "--cap-drop=ALL".into(),
        "--security-opt".into(),
        "no-new-privileges".into(),
        "--ipc".into(),
        "private".into(),
        userns,
        format!("--user={}:{}", user.0, user.1),
    ]
}

/// The ids keep-id maps: the engine user's uid and gid, and how many subordinate ids its
/// first `/etc/subuid` and `/etc/subgid` ranges hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepIdMaps {
    /// The engine user's uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its subordinate uid count.
    pub subuids: u32,
    /// Its subordinate gid count.
    pub subgids: u32,
}

/// `--uidmap`/`--gidmap` flags mapping exactly as `--userns=keep-id` does (as measured on
/// Podman 4.3): container ids below the engine user's to the rootless namespace's 1.., the
/// engine user's own to 0 (the engine user on the host), the rest to themselves.
pub fn keep_id_maps(m: KeepIdMaps) -> Vec<String> {
    let mut out = Vec::new();
    for (flag, id, count) in [
        ("--uidmap", m.uid, m.subuids),
        ("--gidmap", m.gid, m.subgids),
    ] {
        out.push(format!("{flag}=0:1:{id}"));
        out.push(format!("{flag}={id}:0:1"));
        if count > id {
            out.push(format!("{flag}={}:{}:{}", id + 1, id + 1, count - id));
        }
    }
    out
}

/// CSV-quote one `--annotation` value (Podman parses the flag's value as CSV).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn volume(b: &Bind) -> OsString {
    let mut v = b.source.clone().into_os_string();
    v.push(":");
    v.push(&b.dest);
    v.push(if b.readonly { ":ro" } else { ":rw" });
    v
}

impl PodmanRun {
    /// The full argument list after `podman`.
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        if let Some(r) = &self.runtime {
            a.push("--runtime".into());
            a.push(r.clone().into());
        }
        if let Some(h) = &self.hooks_dir {
            a.push("--hooks-dir".into());
            a.push(h.clone().into());
        }
        a.push("run".into());
        for f in confinement_flags_for(self.user, self.joins.as_deref()) {
            match self.keep_id_maps {
                Some(m) if f == "--userns=keep-id" => {
                    a.extend(keep_id_maps(m).into_iter().map(OsString::from));
                }
                _ => a.push(f.into()),
            }
        }
        if let Some(f) = &self.pid_file {
            a.push("--pidfile".into());
            a.push(f.clone().into());
        }
        a.push("--name".into());
        a.push(self.name.clone().into());
        a.push("-i".into());
        a.push("--init".into());
        a.push("--init-path".into());
        a.push(self.init.clone().into());
        if let Some(n) = self.shm_bytes {
            a.push(format!("--shm-size={n}b").into());
        }
        if self.tty {
            a.push("-t".into());
        } else if self.passthrough {
            a.push("--log-driver=passthrough".into());
        }
        if let Some(wall) = self.wall {
            let secs = (wall + WALL_GRACE).as_secs_f64().ceil() as u64;
            a.push(format!("--timeout={secs}").into());
        }
        if let Some(p) = &self.cgroup_parent {
            // The container's group goes inside the cage; conmon stays outside it, so the
            // box's limits count only the box.
            a.push("--cgroup-parent".into());
            a.push(p.into());
            a.push("--cgroups=no-conmon".into());
        }
        a.push("--annotation".into());
        a.push(format!("{RUN_ANNOTATION}={}", self.run_id).into());
        for (k, v) in &self.annotations {
            a.push("--annotation".into());
            a.push(csv_field(&format!("{k}={v}")).into());
        }
        if let Some(dir) = &self.config_tmpfs {
            a.push("--tmpfs".into());
            let mut t = dir.clone().into_os_string();
            t.push(format!(
                ":rw,size={CONFIG_TMPFS_SIZE},mode=1777,nosuid,nodev,notmpcopyup"
            ));
            a.push(t);
        }
        if let Some(shell) = &self.login_shell {
            // Podman fills in the `$` fields (the user's name, ids, HOME) as keep-id would.
            a.push("--passwd-entry".into());
            a.push(format!("$USERNAME:*:$UID:$GID:$NAME:$HOME:{shell}").into());
        }
        a.push("-v".into());
        a.push(volume(&self.work));
        for b in &self.binds {
            a.push("-v".into());
            a.push(volume(b));
        }
        a.push("-w".into());
        a.push(BOX_WORK.into());
        for (k, v) in &self.env {
            a.push("-e".into());
            a.push(format!("{k}={v}").into());
        }
        for k in &self.env_by_name {
            a.push("-e".into());
            a.push(k.into());
        }
        a.push(self.image.clone().into());
        a.extend(self.argv.iter().cloned());
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use h5i_runtime::confine::seccomp::PROFILE_H5I_V2;

    fn run() -> PodmanRun {
        PodmanRun {
            runtime: Some("/usr/bin/h5i-runc".into()),
            hooks_dir: Some("/run/user/1001/h5i/run-x/hooks".into()),
            name: "h5i-b-x".into(),
            user: (1001, 1001),
            joins: None,
            pid_file: None,
            keep_id_maps: None,
            run_id: "x".into(),
            image: "sha256:abc".into(),
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            work: Bind {
                source: "/repo/.git/.h5i/env/none/b/workspace".into(),
                dest: BOX_WORK.into(),
                readonly: false,
            },
            binds: vec![Bind {
                source: "/repo/.git/objects".into(),
                dest: BOX_OBJECTS.into(),
                readonly: true,
            }],
            config_tmpfs: None,
            login_shell: None,
            env: vec![("HOME".into(), "/tmp".into())],
            env_by_name: vec!["DEPLOY_KEY".into()],
            cgroup_parent: Some("/own/h5i/x".into()),
            annotations: vec![
                (
                    "h5i.landlock".into(),
                    r#"{"read":["/"],"write":["/work"]}"#.into(),
                ),
                ("h5i.seccomp".into(), PROFILE_H5I_V2.into()),
            ],
            shm_bytes: None,
            tty: false,
            init: "/usr/bin/catatonit".into(),
            passthrough: false,
            wall: None,
        }
    }

    #[test]
    fn the_private_tmp_is_the_kernel_tiers_size() {
        assert_eq!(TMP_SIZE, format!("{}m", crate::process::TMP_BYTES >> 20));
    }

    #[test]
    fn conmons_timeout_is_the_wall_clock_plus_the_grace_rounded_up() {
        let mut r = run();
        assert!(!text(&r).iter().any(|a| a.starts_with("--timeout")));
        r.wall = Some(Duration::from_millis(2500));
        let a = text(&r);
        assert!(a.contains(&"--timeout=8".to_string()), "{a:?}");
        // Before the image: Podman reads everything after it as the command.
        let image = a.iter().position(|x| x == "sha256:abc").unwrap();
        let timeout = a.iter().position(|x| x == "--timeout=8").unwrap();
        assert!(timeout < image);
    }

    fn text(r: &PodmanRun) -> Vec<String> {
        r.args()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn only_a_plan_asking_for_it_gets_a_sized_dev_shm() {
        assert!(!text(&run()).iter().any(|a| a.starts_with("--shm-size")));
        let mut r = run();
        r.shm_bytes = Some(1 << 30);
        let a = text(&r);
        assert!(a.contains(&"--shm-size=1073741824b".to_string()), "{a:?}");
        let image = a.iter().position(|x| x == "sha256:abc").unwrap();
        let shm = a.iter().position(|x| x.starts_with("--shm-size")).unwrap();
        assert!(
            shm < image,
            "a flag after the image would be the command's: {a:?}"
        );
    }

    #[test]
    fn the_articles_flags_are_all_there() {
        let a = text(&run());
        let joined = a.join(" ");
        for want in [
            "--rm",
            "--pull=never",
            "--network none",
            "--read-only",
            "--read-only-tmpfs=false",
            "--tmpfs /tmp:rw,size=1024m,nosuid,nodev,notmpcopyup",
            "--cap-drop=ALL",
            "--security-opt no-new-privileges",
            "--ipc private",
            "--userns=keep-id --user=1001:1001",
            "--cgroup-parent /own/h5i/x",
            "--runtime /usr/bin/h5i-runc",
            "--init --init-path /usr/bin/catatonit",
            "-w /work",
        ] {
            assert!(joined.contains(want), "missing `{want}` in {joined}");
        }
        // Global flags come before the verb.
        let verb = a.iter().position(|x| x == "run").unwrap();
        assert!(a.iter().position(|x| x == "--runtime").unwrap() < verb);
        assert!(a.iter().position(|x| x == "--hooks-dir").unwrap() < verb);
        // The image, then the command, last.
        assert_eq!(&a[a.len() - 4..], ["sha256:abc", "sh", "-c", "echo hi"]);
    }

    #[test]
    fn the_login_shell_is_set_only_when_asked_and_keeps_podmans_fields() {
        let joined = |r: &PodmanRun| {
            r.args()
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        let mut r = run();
        assert!(!joined(&r).iter().any(|a| a == "--passwd-entry"));
        r.login_shell = Some("/usr/bin/bash".into());
        let a = joined(&r);
        let at = a.iter().position(|a| a == "--passwd-entry").unwrap();
        assert_eq!(a[at + 1], "$USERNAME:*:$UID:$GID:$NAME:$HOME:/usr/bin/bash");
        // Before the image: a flag of Podman's, never the command's.
        assert!(at < a.iter().position(|a| a == "sha256:abc").unwrap());
    }

    #[test]
    fn only_a_claude_box_gets_its_config_tmpfs_and_it_is_nosuid_nodev() {
        let joined = text(&run()).join(" ");
        assert_eq!(joined.matches("--tmpfs").count(), 1, "{joined}");
        let mut r = run();
        r.config_tmpfs = Some("/tmp/.claude".into());
        let a = text(&r);
        let tmpfs: Vec<&String> = a
            .iter()
            .zip(a.iter().skip(1))
            .filter(|(f, _)| *f == "--tmpfs")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(
            tmpfs,
            [
                "/tmp:rw,size=1024m,nosuid,nodev,notmpcopyup",
                "/tmp/.claude:rw,size=64m,mode=1777,nosuid,nodev,notmpcopyup"
            ]
        );
    }

    #[test]
    fn only_the_planned_host_paths_are_mounted() {
        let a = text(&run());
        let volumes: Vec<&String> = a
            .iter()
            .zip(a.iter().skip(1))
            .filter(|(f, _)| *f == "-v" || *f == "--volume" || *f == "--mount")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(
            volumes,
            [
                "/repo/.git/.h5i/env/none/b/workspace:/work:rw",
                "/repo/.git/objects:/.h5i/objects:ro"
            ]
        );
        assert!(!a
            .iter()
            .any(|x| x.contains("podman.sock") || x.contains("/var/run")));
    }

    #[test]
    fn secrets_are_passed_by_name_and_annotations_are_csv_quoted() {
        let a = text(&run());
        let joined = a.join(" ");
        assert!(joined.contains("-e DEPLOY_KEY "), "{joined}");
        assert!(joined.contains("-e HOME=/tmp"));
        assert!(
            a.contains(&r#""h5i.landlock={""read"":[""/""],""write"":[""/work""]}""#.to_string()),
            "{joined}"
        );
        assert!(a.contains(&"h5i.seccomp=h5i-v2".to_string()));
        assert!(a.contains(&"h5i.run=x".to_string()));
    }

    #[test]
    fn the_host_default_runtime_is_only_used_when_asked() {
        let mut r = run();
        r.runtime = None;
        assert!(!text(&r).contains(&"--runtime".to_string()));
        r.tty = true;
        assert!(text(&r).contains(&"-t".to_string()));
    }

    #[test]
    fn stdio_passes_through_only_without_a_pty() {
        let mut r = run();
        assert!(!text(&r).iter().any(|a| a.starts_with("--log-driver")));
        r.passthrough = true;
        assert!(text(&r).contains(&"--log-driver=passthrough".to_string()));
        r.tty = true;
        assert!(!text(&r).iter().any(|a| a.starts_with("--log-driver")));
    }

    #[test]
    fn a_run_joining_the_browser_sidecar_takes_its_user_and_network_namespaces() {
        let mut r = run();
        r.joins = Some("h5i-web-browser".into());
        let a = text(&r);
        let joined = a.join(" ");
        assert!(
            joined.contains("--network container:h5i-web-browser"),
            "{joined}"
        );
        assert!(
            joined.contains("--userns=container:h5i-web-browser"),
            "{joined}"
        );
        assert!(
            !joined.contains("keep-id") && !joined.contains("--network none"),
            "{joined}"
        );
        assert!(joined.contains("--user=1001:1001"), "{joined}");
        let at = a.iter().position(|x| x == "run").unwrap() + 1;
        assert_eq!(
            confinement_flags_for((1001, 1001), Some("h5i-web-browser")),
            a[at..at + confinement_flags(r.user).len()]
        );
        r.joins = None;
        r.pid_file = Some("/run/h5i-engine/run-x/out/sidecar.pid".into());
        let a = text(&r);
        let image = a.iter().position(|x| x == "sha256:abc").unwrap();
        let pid = a.iter().position(|x| x == "--pidfile").unwrap();
        assert!(pid < image && a[pid + 1].ends_with("sidecar.pid"), "{a:?}");
    }

    #[test]
    fn a_sidecars_spelled_out_keep_id_is_podmans_own_mapping() {
        let m = KeepIdMaps {
            uid: 1001,
            gid: 1001,
            subuids: 65536,
            subgids: 65536,
        };
        // As `podman run --userns=keep-id` shows in /proc/self/uid_map: 0 1 1001, 1001 0 1,
        // 1002 1002 64535.
        assert_eq!(
            keep_id_maps(m)[..3],
            [
                "--uidmap=0:1:1001",
                "--uidmap=1001:0:1",
                "--uidmap=1002:1002:64535"
            ]
        );
        let mut r = run();
        r.user = (1001, 1);
        r.keep_id_maps = Some(m);
        let a = text(&r);
        assert!(!a.iter().any(|x| x.contains("keep-id")), "{a:?}");
        assert!(a.contains(&"--gidmap=1001:0:1".to_string()), "{a:?}");
        assert!(a.contains(&"--user=1001:1".to_string()), "{a:?}");
    }
}
