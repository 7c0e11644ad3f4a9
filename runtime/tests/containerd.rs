//! h5i-runc under containerd: Debian's containerd with its runc v2 shim pointed at h5i-runc
//! (`ctr run --runc-binary`, the option the CRI plugin's `BinaryName` sets for a Kubernetes
//! RuntimeClass, docs/containerd.md). A private containerd per test (its own root, state and
//! socket; the CRI plugin off), a busybox-static rootfs directory with the probe, cgroups under
//! the test's own cgroup. Asserted from inside the container: exit codes pass through, and the
//! `h5i.*` annotations confine (EPERM for `socket(AF_UNIX)`, EACCES for a write Landlock does
//! not grant) where the same container without them is not confined.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The namespace containerd keeps this test's containers in.
const NAMESPACE: &str = "h5i-test";

struct Containerd {
    dir: tempfile::TempDir,
    daemon: Child,
}

impl Containerd {
    /// A private containerd, answering on its socket; None (after a loud skip line) when the
    /// host cannot run one.
    fn start(test: &str) -> Option<Containerd> {
        if !require_root(test) {
            return None;
        }
        for tool in ["containerd", "ctr", "containerd-shim-runc-v2"] {
            if !installed(tool) && !Path::new(&format!("/usr/bin/{tool}")).exists() {
                h5i_testsupport::skipped!(
                    "{test}: {tool} is not installed (make setup installs containerd)"
                );
                return None;
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("h5i-containerd")
            .tempdir_in("/var/tmp")
            .unwrap();
        let d = dir.path();
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n\
             [debug]\n  address = \"{debug}\"\n",
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = d.join("containerd.sock").display(),
            debug = d.join("debug.sock").display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(d.join("containerd.log")).unwrap();
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let c = Containerd { dir, daemon };
        let end = Instant::now() + Duration::from_secs(60);
        while !c.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < end,
                "containerd never answered: {}",
                std::fs::read_to_string(c.dir.path().join("containerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(c)
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.dir.path().join("containerd.sock"))
            .args(["--namespace", NAMESPACE])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `ctr run --rm` of `argv` in `rootfs` with h5i-runc as the shim's runtime and
    /// `annotations`, cgroup under the test's own.
    fn run(&self, id: &str, rootfs: &Path, annotations: &[(&str, &str)], argv: &[&str]) -> Output {
        // `--rootfs` makes the first argument a rootfs directory, not an image; with no image
        // config there is no PATH unless given.
        let flags = ["--rootfs", "--env", "PATH=/bin"];
        self.run_target(id, &flags, &rootfs.display().to_string(), annotations, argv)
    }

    /// `ctr run --rm` of `argv` in the imported image `image` (its own config: PATH, cwd).
    fn run_image(
        &self,
        id: &str,
        image: &str,
        annotations: &[(&str, &str)],
        argv: &[&str],
    ) -> Output {
        self.run_target(id, &[], image, annotations, argv)
    }

    fn run_target(
        &self,
        id: &str,
        flags: &[&str],
        target: &str,
        annotations: &[(&str, &str)],
        argv: &[&str],
    ) -> Output {
        let mut args: Vec<String> = vec![
            "run".into(),
            "--rm".into(),
            "--runc-binary".into(),
            bin().into(),
            "--cgroup".into(),
            test_cgroup(id),
        ];
        args.extend(flags.iter().map(|f| f.to_string()));
        for (k, v) in annotations {
            args.push("--annotation".into());
            args.push(format!("{k}={v}"));
        }
        args.push(target.into());
        args.push(id.into());
        args.extend(argv.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ctr(&args)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the daemon this test started, not yet reaped.
        unsafe { libc::kill(self.daemon.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.daemon.wait();
    }
}

/// A busybox-static rootfs with the probe (the bundle helper's tree, used as `--rootfs`).
fn rootfs() -> (Bundle, PathBuf) {
    let b = Bundle::new(&["true"], None);
    let root = b.rootfs();
    (b, root)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn ctr_run_with_h5i_runc_passes_exit_codes_through() {
    let Some(c) = Containerd::start("ctr_run_with_h5i_runc_passes_exit_codes_through") else {
        return;
    };
    let (_b, root) = rootfs();
    let ok = c.run(&id("ctrd-true"), &root, &[], &["true"]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok));
    let seven = c.run(
        &id("ctrd-seven"),
        &root,
        &[],
        &["sh", "-c", "echo in-box; exit 7"],
    );
    assert_eq!(seven.status.code(), Some(7), "{}", text(&seven));
    assert_eq!(String::from_utf8_lossy(&seven.stdout), "in-box\n");
    // --rm: nothing of either container is left in containerd.
    let left = c.ctr(&["containers", "list", "--quiet"]);
    assert_eq!(
        String::from_utf8_lossy(&left.stdout).trim(),
        "",
        "{}",
        text(&left)
    );
}

#[test]
fn ctr_run_with_h5i_annotations_is_confined_and_without_them_is_not() {
    let Some(c) =
        Containerd::start("ctr_run_with_h5i_annotations_is_confined_and_without_them_is_not")
    else {
        return;
    };
    let (_b, root) = rootfs();
    let script = "probe unix; probe write /etc/h5i-denied; probe write /tmp/h5i-allowed";
    let control = c.run(&id("ctrd-plain"), &root, &[], &["sh", "-c", script]);
    assert_eq!(control.status.code(), Some(0), "{}", text(&control));
    let r = probe_results(&String::from_utf8_lossy(&control.stdout));
    assert_eq!(result_of(&r, "socket_unix"), "OK", "{}", text(&control));
    assert!(root.join("etc/h5i-denied").exists());
    std::fs::remove_file(root.join("etc/h5i-denied")).unwrap();
    std::fs::remove_file(root.join("tmp/h5i-allowed")).unwrap();

    let confined = c.run(
        &id("ctrd-h5i"),
        &root,
        &[
            ("h5i.seccomp", "h5i-v2"),
            ("h5i.net.unix", "false"),
            ("h5i.landlock", r#"{"read":["/"],"write":["/tmp","/dev"]}"#),
        ],
        &["sh", "-c", script],
    );
    assert_eq!(confined.status.code(), Some(0), "{}", text(&confined));
    let r = probe_results(&String::from_utf8_lossy(&confined.stdout));
    assert_eq!(result_of(&r, "socket_unix"), "EPERM", "{}", text(&confined));
    let writes: Vec<&str> = r
        .iter()
        .filter(|(n, _)| n == "write")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(writes, ["EACCES", "OK"], "{}", text(&confined));
    assert!(!root.join("etc/h5i-denied").exists());
}

/// The registry-free test image (scripts/make-test-image.sh), moved from root's Podman storage
/// into this containerd by `podman save` and `ctr images import`, runs under h5i-runc with its
/// own image config, and `h5i.landlock` confines it where the same image without it is not.
#[test]
fn ctr_run_of_an_imported_podman_image_is_confined_by_h5i_landlock() {
    const TEST: &str = "ctr_run_of_an_imported_podman_image_is_confined_by_h5i_landlock";
    const IMAGE: &str = "localhost/h5i-busybox:latest";
    let Some(c) = Containerd::start(TEST) else {
        return;
    };
    if !installed("podman") {
        h5i_testsupport::skipped!("{TEST}: podman is not installed (make setup installs it)");
        return;
    }
    let archive = c.dir.path().join("h5i-busybox.tar");
    let save = Command::new("podman")
        .args(["save", "--format", "docker-archive", "--output"])
        .arg(&archive)
        .arg(IMAGE)
        .output()
        .unwrap();
    if !save.status.success() {
        h5i_testsupport::skipped!(
            "{TEST}: {IMAGE} is not in root's Podman storage (make setup makes it): {}",
            text(&save)
        );
        return;
    }
    let import = c.ctr(&["images", "import", &archive.display().to_string()]);
    assert!(import.status.success(), "{}", text(&import));
    let listed = c.ctr(&["images", "list", "--quiet"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .any(|l| l == IMAGE),
        "{}",
        text(&listed)
    );

    // The image's own PATH finds busybox's applets; each write's exit status is echoed.
    let script = "echo in-image; touch /etc/h5i-denied; echo etc=$?; \
                  touch /tmp/h5i-allowed; echo tmp=$?; exit 5";
    // Runs the script, asserting its exit code and what it echoed; returns the run.
    let run = |name: &str, annotations: &[(&str, &str)], echoed: &str| {
        let out = c.run_image(&id(name), IMAGE, annotations, &["sh", "-c", script]);
        assert_eq!(out.status.code(), Some(5), "{}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            echoed,
            "{}",
            text(&out)
        );
        out
    };
    run("ctrd-img-plain", &[], "in-image\netc=0\ntmp=0\n");
    let confined = run(
        "ctrd-img-h5i",
        &[("h5i.landlock", r#"{"read":["/"],"write":["/tmp","/dev"]}"#)],
        "in-image\netc=1\ntmp=0\n",
    );
    // The kernel's answer, as busybox reports it: EACCES (Landlock), not EROFS or EPERM.
    assert!(
        String::from_utf8_lossy(&confined.stderr)
            .contains("touch: /etc/h5i-denied: Permission denied"),
        "{}",
        text(&confined)
    );
}

/// A malformed annotation is refused by h5i-runc at create: the container never runs, and
/// containerd reports the failure rather than a success.
#[test]
fn ctr_run_with_a_malformed_h5i_annotation_fails_closed() {
    let Some(c) = Containerd::start("ctr_run_with_a_malformed_h5i_annotation_fails_closed") else {
        return;
    };
    let (_b, root) = rootfs();
    let out = c.run(
        &id("ctrd-bad"),
        &root,
        &[("h5i.landlock", "{not json")],
        &["sh", "-c", "touch /tmp/ran"],
    );
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        !root.join("tmp/ran").exists(),
        "the payload ran: {}",
        text(&out)
    );
}

/// The RuntimeClass recipe in docs/containerd.md is a configuration containerd accepts, and
/// it names h5i-runc as the runc shim's binary with the `h5i.*` annotations passed through.
#[test]
fn the_documented_runtime_class_recipe_is_a_config_containerd_reads() {
    if !require_root("the_documented_runtime_class_recipe_is_a_config_containerd_reads") {
        return;
    }
    if !installed("containerd") {
        h5i_testsupport::skipped!(
            "the_documented_runtime_class_recipe_...: containerd is not installed"
        );
        return;
    }
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/containerd.md"),
    )
    .unwrap();
    let start = doc.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let recipe = &doc[start..start + doc[start..].find("```").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        format!("version = 2\n{recipe}"),
    )
    .unwrap();
    let dump = Command::new("containerd")
        .arg("--config")
        .arg(dir.path().join("config.toml"))
        .args(["config", "dump"])
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", text(&dump));
    let dumped = String::from_utf8_lossy(&dump.stdout);
    let h5i = dumped
        .find("runtimes.h5i]")
        .map(|i| &dumped[i..])
        .expect("the h5i runtime");
    assert!(
        h5i.contains("runtime_type = \"io.containerd.runc.v2\""),
        "{h5i}"
    );
    assert!(
        h5i.contains("BinaryName = \"/usr/local/bin/h5i-runc\""),
        "{h5i}"
    );
    assert!(h5i.contains("\"h5i.*\""), "{h5i}");
}
