//! One install, one setup (issue 14), tested on the installed artifact: `cargo install --path .
//! --root TMP` installs `h5i`, `h5i-runc` and `h5i-hook`; `TMP/bin/h5i host setup` (as root,
//! twice: the second run changes nothing) leaves `box probe` with the process and supervised
//! tiers available; and that installed binary, built without the `test-seams` feature, ignores
//! `H5I_TEST_HOSTS`, which the test build honours.
//!
//! The install builds in the workspace's own target directory, as `make install` (so `make
//! setup`) does: the seam-free build shares every dependency's artifacts with the test build and
//! after `make setup` has nothing to compile. `cargo install` puts the seam-free `h5i*` in
//! `target/release`, over the test build's that the later test binaries run, so the test build's
//! are set aside first and moved back when the install is done (cargo runs one test binary at a
//! time, and this one holds one test).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{require_root, stderr, stdout, Repo, H5I};

const BINS: [&str; 3] = ["h5i", "h5i-runc", "h5i-hook"];

/// The test build's `h5i*`, copied aside from `target/release` and moved back over whatever is
/// there when dropped (on every way out of the install, a failed one included).
struct TestBuildAside {
    release: PathBuf,
    saved: tempfile::TempDir,
}

impl TestBuildAside {
    fn take(release: &Path) -> TestBuildAside {
        // Beside target/release, so moving back is a rename on the same filesystem.
        let saved = tempfile::tempdir_in(release.parent().unwrap()).unwrap();
        for b in BINS {
            std::fs::copy(release.join(b), saved.path().join(b)).unwrap();
        }
        TestBuildAside {
            release: release.to_path_buf(),
            saved,
        }
    }
}

impl Drop for TestBuildAside {
    fn drop(&mut self) {
        for b in BINS {
            let _ = std::fs::rename(self.saved.path().join(b), self.release.join(b));
        }
    }
}

/// `cargo install` into `root`, building in the workspace's target directory; the test build's
/// binaries there are the same before and after.
fn cargo_install(root: &Path) {
    // CARGO_BIN_EXE_h5i is <target>/release/h5i.
    let release = Path::new(H5I).parent().unwrap();
    let target = release.parent().unwrap();
    let _kept = TestBuildAside::take(release);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut install = Command::new(cargo);
    // The test runs with the variables cargo sets for a test (CARGO_MANIFEST_DIR, CARGO_PKG_*,
    // ...). A build script that tracks one of them (ring's tracks CARGO_MANIFEST_DIR) sees it
    // change against `make install`'s build and rebuilds ring and all above it: minutes of CI.
    // The nested install gets the environment `make install` had.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO_") && key != "CARGO_HOME" {
            install.env_remove(key);
        }
    }
    let out = install
        .args(["install", "--offline", "--locked", "--path"])
        .arg(env!("CARGO_MANIFEST_DIR"))
        .arg("--root")
        .arg(root)
        .arg("--target-dir")
        .arg(target)
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo install: {}", stderr(&out));
}

#[test]
fn cargo_install_then_host_setup_gives_the_kernel_tiers_and_the_installed_binary_has_no_test_seams()
{
    if !require_root(
        "cargo_install_then_host_setup_gives_the_kernel_tiers_and_the_installed_binary_has_no_test_seams",
        "host setup changes system files",
    ) {
        return;
    }
    // The seam: a malformed H5I_TEST_HOSTS is refused by the test build (it reads it) and, below, ignored by the
    // installed one (it cannot). The seam is read only when there is egress to pin; an address
    // literal (a test-host address, never contacted by `true`) needs no resolver either way.
    let r = Repo::new();
    r.write_policy(
        "[profile.sup]\nisolation = \"supervised\"\n[profile.sup.net]\negress = [\"198.18.0.1:8080\"]\n",
    );
    r.ok(&["box", "create", "s", "--profile", "sup"]);
    let seam = [("H5I_TEST_HOSTS", "not-a-host-map")];
    let tested = r.h5i_env(&["box", "run", "s", "--", "true"], &seam);
    assert_eq!(tested.status.code(), Some(125), "{}", stderr(&tested));
    assert!(
        stderr(&tested).contains("H5I_TEST_HOSTS"),
        "{}",
        stderr(&tested)
    );

    let root = tempfile::tempdir().unwrap();
    cargo_install(root.path());
    let bin = root.path().join("bin");
    for b in BINS {
        assert!(bin.join(b).is_file(), "cargo install left out {b}");
    }
    let h5i = bin.join("h5i");
    let setup = Command::new(&h5i).args(["host", "setup"]).output().unwrap();
    assert_eq!(setup.status.code(), Some(0), "{}", stderr(&setup));
    let again = Command::new(&h5i).args(["host", "setup"]).output().unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(stdout(&again), "setup: nothing to change\n");

    let probe = Command::new(&h5i)
        .args(["box", "probe"])
        .current_dir(r.path())
        .output()
        .unwrap();
    let text = stdout(&probe);
    for tier in ["process", "supervised"] {
        assert!(
            text.contains(&format!("tier {tier}= available")),
            "{tier} not available after host setup:\n{text}"
        );
    }
    assert!(
        text.contains(&format!("h5i-runc= {}", bin.join("h5i-runc").display())),
        "{text}"
    );

    let installed = Command::new(&h5i)
        .args(["box", "run", "s", "--", "true"])
        .env("H5I_TEST_HOSTS", "not-a-host-map")
        .current_dir(r.path())
        .output()
        .unwrap();
    assert_eq!(installed.status.code(), Some(0), "{}", stderr(&installed));
}
