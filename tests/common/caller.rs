//! Who runs h5i in a test: root in a scratch repository, or the unprivileged test user
//! (`h5i-test`, made by `make setup`) in a repository it owns, with its own copies of the
//! binaries. The one place tests switch to the test user.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{stderr, stdout, Repo, H5I};

/// The unprivileged user `make setup` prepares (subuids, runtime dir, cgroup delegation).
pub const TEST_USER: &str = "h5i-test";

/// `user`'s uid; panics with the mend when the user is missing.
pub fn uid_of(user: &str) -> u32 {
    h5i_testsupport::process::test_user_uid(user)
}

/// A command that runs as `user` through `runuser`, with the user's runtime dir and, when
/// given, `HOME` (h5i's runs use `/tmp`: the user may have no home of its own). Append the
/// program and its arguments (and any further `VAR=value` before the program).
pub fn as_user(user: &str, home: Option<&str>) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", user, "--", "env"])
        .arg(format!("XDG_RUNTIME_DIR=/run/user/{}", uid_of(user)));
    if let Some(home) = home {
        c.arg(format!("HOME={home}"));
    }
    c
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Who runs h5i, and the environment every h5i it runs gets.
pub struct Caller {
    who: Who,
    env: Vec<(String, String)>,
}

enum Who {
    /// Root, in the test's own repository.
    Root(Repo),
    /// The test user, in a repository under a tree it owns.
    User { tree: tempfile::TempDir, uid: u32 },
}

/// The image the container tier's tests use, made for the test user by
/// `scripts/make-test-image.sh` (once per test binary); panics with the mend when it cannot be.
pub fn container_image() -> &'static str {
    static READY: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    test_image(&READY, &[]);
    "localhost/h5i-busybox:latest"
}

/// The test image with the host's git added (`make-test-image.sh --git`), for a box's own git
/// at the container tier.
pub fn container_git_image() -> &'static str {
    static READY: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    test_image(&READY, &["--git"]);
    "localhost/h5i-busybox-git:latest"
}

fn test_image(ready: &std::sync::OnceLock<Result<(), String>>, flags: &[&str]) {
    let ok = ready.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/make-test-image.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg("--user")
            .args(flags)
            .env("H5I_TEST_USER", TEST_USER)
            .env_remove("H5I_TEST_IMAGE")
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    if let Err(e) = ok {
        panic!("the test image {flags:?} for {TEST_USER} cannot be made (run `make setup`): {e}");
    }
}

impl Caller {
    pub fn root() -> Caller {
        Caller {
            who: Who::Root(Repo::new()),
            env: Vec::new(),
        }
    }

    /// Every h5i this caller runs gets `k=v`.
    pub fn with_env(mut self, k: &str, v: &str) -> Caller {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// Create box `name` at `tier` (`process`, `supervised` or `container`: the container tier
    /// in the test image, run by the test user's rootless Podman, as root's engine user too).
    pub fn create_at(&mut self, name: &str, tier: &str) {
        self.create_at_with(name, tier, &[]);
    }

    /// [`Caller::create_at`] with `extra` arguments for `box create` (a `--profile`, say).
    pub fn create_at_with(&mut self, name: &str, tier: &str, extra: &[&str]) {
        let mut args = vec!["box", "create", name, "--isolation", tier];
        if tier == "container" || tier == "microvm" {
            self.container_env();
            args.extend(["--image", container_image()]);
        }
        args.extend(extra);
        self.ok(&args);
    }

    /// What a container box needs in the environment of every h5i call: a fresh probe, and as
    /// root, the test user as Podman's engine user.
    fn container_env(&mut self) {
        if !self.env.iter().any(|(k, _)| k == "H5I_NO_PROBE_CACHE") {
            self.env.push(("H5I_NO_PROBE_CACHE".into(), "1".into()));
            if matches!(self.who, Who::Root(_)) {
                self.env
                    .push(("H5I_CONTAINER_USER".into(), TEST_USER.into()));
            }
        }
    }

    /// Create container box `name` in `image` (one of this module's test images).
    pub fn create_container(&mut self, name: &str, image: &str) {
        self.create_container_with(name, image, &[]);
    }

    /// [`Caller::create_container`] with `extra` arguments for `box create`.
    pub fn create_container_with(&mut self, name: &str, image: &str, extra: &[&str]) {
        self.container_env();
        let mut args = vec![
            "box",
            "create",
            name,
            "--isolation",
            "container",
            "--image",
            image,
        ];
        args.extend(extra);
        self.ok(&args);
    }

    /// The test user, with `extra` files copied into its tree (see [`super::unprivileged_tree`])
    /// and a repository at `repo/` with one commit (README.md, src/lib.txt) on `main`.
    pub fn user_with(extra: &[(&Path, &str)]) -> Caller {
        let (tree, uid) = super::unprivileged_tree(TEST_USER, extra);
        let c = Caller {
            who: Who::User { tree, uid },
            env: Vec::new(),
        };
        let out = c
            .sh("git init -q -b main . && echo hello > README.md && mkdir src && printf 'one\\ntwo\\nthree\\n' > src/lib.txt \
                 && git add -A && git -c user.name=u -c user.email=u@example.invalid commit -qm initial")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        c
    }

    pub fn user() -> Caller {
        Caller::user_with(&[])
    }

    /// Root or the test user, by `as_user`.
    pub fn either(as_user: bool) -> Caller {
        if as_user {
            Caller::user()
        } else {
            Caller::root()
        }
    }

    /// Who this is, for messages.
    pub fn who(&self) -> &'static str {
        match self.who {
            Who::Root(_) => "root",
            Who::User { .. } => TEST_USER,
        }
    }

    pub fn uid(&self) -> u32 {
        match self.who {
            Who::Root(_) => 0,
            Who::User { uid, .. } => uid,
        }
    }

    pub fn repo(&self) -> PathBuf {
        match &self.who {
            Who::Root(r) => r.path().to_path_buf(),
            Who::User { tree, .. } => tree.path().join("repo"),
        }
    }

    /// The h5i binary this caller runs.
    pub fn h5i_bin(&self) -> PathBuf {
        match &self.who {
            Who::Root(_) => PathBuf::from(H5I),
            Who::User { tree, .. } => tree.path().join("bin/h5i"),
        }
    }

    /// `sh -c script` in `dir`, as the caller.
    pub fn sh_in(&self, dir: &Path, script: &str) -> Command {
        let mut c = match self.who {
            Who::Root(_) => Command::new("sh"),
            Who::User { .. } => {
                let mut c = as_user(TEST_USER, Some("/tmp"));
                c.arg("sh");
                c
            }
        };
        c.args(["-c", script]).current_dir(dir);
        c
    }

    /// `sh -c script` in the repository, as the caller.
    pub fn sh(&self, script: &str) -> Command {
        self.sh_in(&self.repo(), script)
    }

    /// `h5i args...` in `dir`, as the caller, with the caller's environment (and h5i's own
    /// selectors cleared).
    pub fn h5i_in(&self, dir: &Path, args: &[&str]) -> Command {
        let mut c = match self.who {
            Who::Root(_) => Command::new(H5I),
            Who::User { .. } => {
                let mut c = as_user(TEST_USER, Some("/tmp"));
                for (k, v) in &self.env {
                    c.arg(format!("{k}={v}"));
                }
                c.arg(self.h5i_bin());
                c
            }
        };
        for k in ["H5I_AGENT", "H5I_DEFAULT_ISOLATION", "H5I_CREDENTIAL_PROXY"] {
            c.env_remove(k);
        }
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c.args(args).current_dir(dir);
        c
    }

    /// `h5i args...` in the repository, as the caller, with `extra` variables set for it (a
    /// command to run as the test likes: on a terminal, say).
    pub fn h5i_cmd_with(&mut self, args: &[&str], extra: &[(&str, &str)]) -> Command {
        let keep = self.env.len();
        self.env
            .extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let cmd = self.h5i_in(&self.repo(), args);
        self.env.truncate(keep);
        cmd
    }

    /// `h5i args...` in the repository, as the caller.
    pub fn h5i(&self, args: &[&str]) -> Output {
        self.h5i_in(&self.repo(), args).output().unwrap()
    }

    /// `h5i args...` in the repository with `extra` variables set for this one call.
    pub fn h5i_with(&mut self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        let keep = self.env.len();
        self.env
            .extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let out = self.h5i(args);
        self.env.truncate(keep);
        out
    }

    /// [`Caller::h5i_with`], bounded by `limit` (see [`super::output_bounded`]).
    pub fn h5i_bounded(
        &mut self,
        args: &[&str],
        extra: &[(&str, &str)],
        limit: std::time::Duration,
    ) -> Output {
        let cmd = self.h5i_cmd_with(args, extra);
        super::output_bounded(cmd, limit, &format!("h5i {args:?} as {}", self.who()))
    }

    /// Run h5i and insist it succeeded; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        succeeded(&self.h5i(args), args, self.who())
    }

    /// `sh -c script` inside the box, which must succeed.
    pub fn in_box(&self, name: &str, script: &str) {
        let out = self.h5i(&["box", "run", name, "--", "sh", "-c", script]);
        assert!(
            out.status.success(),
            "in box {name}: {script}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }

    /// Commit everything in the repository, as the caller.
    pub fn commit_all(&self, message: &str) {
        let out = self
            .sh(&format!(
                "git add -A && git -c user.name=u -c user.email=u@example.invalid commit -qm '{message}'"
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }

    /// The directory of box `name` (under its agent's directory: `none` unless the box was
    /// made for an agent runtime).
    pub fn box_dir(&self, name: &str) -> PathBuf {
        let env = self.repo().join(".git/.h5i/env");
        std::fs::read_dir(&env)
            .into_iter()
            .flatten()
            .flatten()
            .map(|agent| agent.path().join(name))
            .find(|d| d.join("manifest.json").exists())
            .unwrap_or_else(|| env.join("none").join(name))
    }

    pub fn workspace(&self, name: &str) -> PathBuf {
        self.box_dir(name).join("workspace")
    }

    /// Every record in box `name`'s receipt log, oldest first.
    pub fn receipts(&self, name: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.box_dir(name).join("receipts.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Box `name`'s latest host-observed run record.
    pub fn last_run(&self, name: &str) -> serde_json::Value {
        let receipts = std::fs::read_to_string(self.box_dir(name).join("receipts.jsonl")).unwrap();
        receipts
            .lines()
            .rev()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|r| r["lane"] == "host-env-run")
            .expect("a host-env-run receipt")
    }

    pub fn manifest(&self, name: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.box_dir(name).join("manifest.json")).unwrap())
            .unwrap()
    }

    pub fn base(&self, name: &str) -> String {
        self.manifest(name)["base"].as_str().unwrap().to_string()
    }

    /// Write a file in the repository owned by the caller (made as root, then handed over).
    pub fn write(&self, rel: &str, bytes: impl AsRef<[u8]>) {
        let p = self.repo().join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&p, bytes).unwrap();
        if let Who::User { uid, .. } = self.who {
            let st = Command::new("chown")
                .args(["-R", &format!("{uid}:{uid}")])
                .arg(self.repo())
                .status()
                .unwrap();
            assert!(st.success());
        }
    }
}

/// Insist `h5i args` (run as `who`) succeeded, naming what it printed; returns its stdout.
pub fn succeeded(out: &Output, args: &[&str], who: &str) -> String {
    assert!(
        out.status.success(),
        "h5i {args:?} as {who}: {}{}",
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

/// The pid of the `h5i` process `launched` is or started (the test user's runs go through
/// `runuser`, whose child is h5i), found through /proc's children lists.
pub fn h5i_pid(launched: u32) -> i32 {
    let mut stack = vec![launched];
    while let Some(pid) = stack.pop() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "h5i" {
            return pid as i32;
        }
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        stack.extend(
            children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    panic!("no h5i process under {launched}");
}
