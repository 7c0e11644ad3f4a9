//! Test processes: the root check with its loud skip line, the unprivileged test user, the
//! binaries under test beside the test binary, output captured through files, and the static C
//! probes the tests copy into boxes, built once per test binary.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// True when the test can run; otherwise prints `skipped: <test>: needs root (<why>)`.
pub fn require_root(test: &str, why: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    crate::skipped!("{test}: needs root ({why})");
    false
}

/// `user`'s uid and gid from `/etc/passwd`, or `None` when there is no such user.
pub fn user_ids(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&user))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))
            .flatten()
    })
}

/// The unprivileged test user's uid (`make setup` makes `user`); panics with the mend when the
/// user is missing.
pub fn test_user_uid(user: &str) -> u32 {
    user_ids(user)
        .unwrap_or_else(|| {
            panic!("the {user} user is missing: run `make setup` (scripts/setup-host.sh)")
        })
        .0
}

/// A binary of the workspace built beside the running test binary: `name` in the profile
/// directory above this test's `deps/` (`cargo build --release --workspace --bins` first).
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(
        p.is_file(),
        "{} is missing: build every binary first (cargo build --release --workspace --bins)",
        p.display()
    );
    p
}

/// Run `cmd` with stdin closed and stdout/stderr captured through temp files (a box's init
/// inherits them and would hold a pipe open).
pub fn run_to_files(cmd: &mut Command) -> Output {
    let mut out = tempfile::tempfile().unwrap();
    let mut err = tempfile::tempfile().unwrap();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .status()
        .unwrap();
    let read = |f: &mut std::fs::File| {
        f.rewind().unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    };
    Output {
        status,
        stdout: read(&mut out),
        stderr: read(&mut err),
    }
}

/// `rel`, a path inside the workspace (this crate sits one level below its root).
pub fn workspace_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join(rel)
}

/// Build the C file `src` with `cc -static` into `out`.
pub fn build_static(src: &Path, out: &Path) {
    let st = Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(out)
        .arg(src)
        .status()
        .expect("cc must be installed to build the test helpers");
    assert!(st.success(), "building {} failed", src.display());
}

/// A static build of the workspace's C file `rel` in `tmp_dir` (the test's
/// `CARGO_TARGET_TMPDIR`), made on the first call of this test binary.
fn built_once(slot: &'static OnceLock<PathBuf>, rel: &str, tmp_dir: &str) -> &'static Path {
    slot.get_or_init(|| {
        let stem = Path::new(rel).file_stem().unwrap().to_string_lossy();
        let out = Path::new(tmp_dir).join(format!("h5i-{stem}-{}", std::process::id()));
        build_static(&workspace_path(rel), &out);
        out
    })
}

/// The syscall probe (runtime/tests/support/probe.c): prints `NAME=RESULT` per attempt.
pub fn probe(tmp_dir: &str) -> &'static Path {
    static PROBE: OnceLock<PathBuf> = OnceLock::new();
    built_once(&PROBE, "runtime/tests/support/probe.c", tmp_dir)
}

/// The network probe (hooks/tests/support/netprobe.c): prints `NAME=RESULT` per attempt.
pub fn netprobe(tmp_dir: &str) -> &'static Path {
    static NETPROBE: OnceLock<PathBuf> = OnceLock::new();
    built_once(&NETPROBE, "hooks/tests/support/netprobe.c", tmp_dir)
}
