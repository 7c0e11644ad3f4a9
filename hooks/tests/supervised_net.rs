//! The supervised network end to end: real boxes under h5i-runc (as root and as the
//! unprivileged `h5i-test` user) and under Podman with the shipped hooks.d entries (rootful and
//! rootless), against test hosts in a network namespace of the test's own. Every claim is
//! checked from inside the box with `netprobe` (the kernel's answer: a greeting, or
//! `EHOSTUNREACH` from the table's reject, `EPERM` for a refused send or socket), and the
//! run's `tally.json` is checked against the attempts made.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use h5i_policy::receipt::{NetTally, PinnedRule};
use h5i_testsupport::cgroup::{delegate, Delegated};
use h5i_testsupport::podman::{remove_cgroup_parent, unmount_under};
use support::*;

/// The probes every box runs, in order, and what each must answer. `{A2}`/`{A3}` are the
/// allowed and the second test host, `{LO}` the host-loopback listener's port, `{A1}:{HA}` a
/// listener on the host's own address on the test hosts' pair.
///
/// The first is the box's first packet, and a refused one: {A2}:9090 greets whoever reaches it,
/// so `EHOSTUNREACH` there proves the table was in force from the box's first instruction (the
/// sentry loads it while the uplink starts, and holds the box until both are done); the second
/// proves the uplink was up by then. `127.0.0.1:{LO}` answering `ECONNREFUSED` from the box's
/// own loopback proves the uplink splices no host port into it (pasta's default `-T auto`
/// would, past the table, which accepts `lo`).
const PROBES: &[(&str, &str)] = &[
    ("tcp {A2} 9090", "EHOSTUNREACH"),
    ("tcp {A2} 8080", "OK host {A2}:8080"),
    ("tcp {A3} 8080", "EHOSTUNREACH"),
    ("udp {A2} 5353", "EPERM"),
    ("tcp 10.0.2.2 {LO}", "EHOSTUNREACH"),
    ("tcp 127.0.0.1 {LO}", "ECONNREFUSED"),
    ("tcp {A1} {HA}", "EHOSTUNREACH"),
    ("udp 10.0.2.3 53", "EPERM"),
];

/// Probes of the socket gate: raw inet, packet, netlink, unix; socketpair stays allowed.
const GATE_PROBES: &[(&str, &str)] = &[
    ("socket 2 3 1", "EPERM"),
    ("socket 17 3 0", "EPERM"),
    ("socket 16 3 0", "EPERM"),
    ("socket 1 1 0", "EPERM"),
    ("socketpair", "OK"),
];

struct Expect {
    script: String,
    want: Vec<(String, String)>,
}

fn fill(s: &str, hosts: &TestHosts) -> String {
    s.replace("{A1}", &hosts.addr(1))
        .replace("{HA}", &hosts.host_address_port.to_string())
        .replace("{A2}", &hosts.addr(2))
        .replace("{A3}", &hosts.addr(3))
        .replace("{LO}", &hosts.host_loopback_port.to_string())
}

/// The box's script: the network probes, the gate probes (when gated), an attempt to delete
/// the table with the host's own `nft`, then the first two probes again (the table held), and
/// the receive-window clamp on the box's default route as the kernel reports it
/// (`/proc/net/route`'s Window column): pasta's route carries `uplink::WINDOW_CLAMP`, the veth
/// pair's none.
fn box_script(hosts: &TestHosts, gated: bool, uplink: UplinkSeen) -> Expect {
    let mut e = Expect {
        script: String::new(),
        want: Vec::new(),
    };
    let probe = |e: &mut Expect, p: &str, r: &str| {
        let p = fill(p, hosts);
        let name = match p.rsplit_once(' ') {
            Some((a, b)) if a.starts_with("tcp") || a.starts_with("udp") => format!("{a}:{b}"),
            _ => p.clone(),
        };
        e.script.push_str(&format!("netprobe {p}\n"));
        e.want.push((name, fill(r, hosts)));
    };
    for (p, r) in PROBES {
        probe(&mut e, p, r);
    }
    if gated {
        for (p, r) in GATE_PROBES {
            probe(&mut e, p, r);
        }
    }
    e.script
        .push_str("out=$(nft delete table inet h5i 2>&1); echo \"nft-delete=$? $out\" | head -1\n");
    e.want.push(("nft-delete".into(), "1".into()));
    for (p, r) in &PROBES[..2] {
        probe(&mut e, p, r);
    }
    e.script.push_str(
        "while read -r _ dst _ _ _ _ _ _ _ window _; do \
         if [ \"$dst\" = 00000000 ]; then echo \"route-window=$window\"; fi; done < /proc/net/route\n",
    );
    let window = match uplink {
        UplinkSeen::Veth => 0,
        UplinkSeen::Pasta => h5i_hook::uplink::WINDOW_CLAMP,
    };
    e.want.push(("route-window".into(), window.to_string()));
    e
}

fn check_results(out: &std::process::Output, expect: &Expect, log: &str) {
    let got = results(&out.stdout);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        got.len(),
        expect.want.len(),
        "box output:\n{text}\nstderr:\n{}\nsentry log:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    for ((k, v), (wk, wv)) in got.iter().zip(&expect.want) {
        assert_eq!(k, wk, "box output:\n{text}");
        if wk == "nft-delete" {
            // nft fails and says the kernel refused: without the gate, the netlink request
            // (exit 1); with it, the netlink socket itself (exit 3).
            assert!(
                (v.starts_with("1 ") || v.starts_with("3 "))
                    && v.contains("Operation not permitted"),
                "nft in the box: {v}\n{text}"
            );
        } else {
            assert_eq!(v, wv, "{k}: box output:\n{text}");
        }
    }
}

/// The egress tally the probes must leave: two allowed connections, one refusal per denied
/// probe (two to {A2}:9090).
fn check_tally(t: &NetTally, hosts: &TestHosts) {
    let a2 = hosts.addr(2);
    assert_eq!(
        t.table.rules,
        vec![PinnedRule {
            host: "api.test".into(),
            port: 8080,
            addrs: vec![a2.clone()],
        }]
    );
    assert_eq!(
        t.table.digest,
        h5i_hook::nft::digest(&h5i_hook::nft::render(&t.table.rules))
    );
    assert_eq!(
        t.egress.allowed,
        BTreeMap::from([("api.test:8080".to_string(), 2)])
    );
    let lo = hosts.host_loopback_port;
    assert_eq!(
        t.egress.denied,
        BTreeMap::from([
            (format!("{a2}:9090/tcp"), 2),
            (format!("{}:8080/tcp", hosts.addr(3)), 1),
            (format!("{a2}:5353/udp"), 1),
            (format!("10.0.2.2:{lo}/tcp"), 1),
            (
                format!("{}:{}/tcp", hosts.addr(1), hosts.host_address_port),
                1
            ),
            ("10.0.2.3:53/udp".to_string(), 1),
        ]),
        "{t:#?}"
    );
}

/// The socket gate's tally for the probes: 10 inet sockets (8 TCP, 2 UDP), one pair; raw and
/// packet refused once each; netlink at least twice (the probe, then nft) and unix at least
/// once (the probe; nft's glibc also tries nscd's socket for its name lookups).
fn check_gate_tally(t: &NetTally) {
    let g = &t.socket_gate;
    assert_eq!(g.allowed.get("inet"), Some(&10), "{g:#?}");
    assert_eq!(g.allowed.get("unix-pair"), Some(&1), "{g:#?}");
    assert_eq!(g.allowed.len(), 2, "{g:#?}");
    for k in ["inet-raw", "packet"] {
        assert_eq!(g.denied.get(k), Some(&1), "{k}: {g:#?}");
    }
    assert!(g.denied.get("netlink").is_some_and(|n| *n >= 2), "{g:#?}");
    assert!(g.denied.get("unix").is_some_and(|n| *n >= 1), "{g:#?}");
    assert_eq!(g.denied.len(), 4, "{g:#?}");
}

fn egress(hosts: &TestHosts) -> String {
    format!(
        r#"[{{"host":"api.test","port":8080,"addrs":["{}"]}}]"#,
        hosts.addr(2)
    )
}

/// A bundle directory with the rootfs and the spec.
fn bundle(dir: &Path, spec: &serde_json::Value) -> PathBuf {
    let b = dir.join("bundle");
    make_rootfs(&b.join("rootfs"));
    std::fs::write(
        b.join("config.json"),
        serde_json::to_vec_pretty(spec).unwrap(),
    )
    .unwrap();
    b
}

/// Which uplink the sentry started (the log's uplink line).
#[derive(Clone, Copy, PartialEq, Eq)]
enum UplinkSeen {
    /// A veth pair and the host's forwarding (a sentry that is real root).
    Veth,
    /// pasta, forwarding no port either way and the gateway not to the host.
    Pasta,
}

fn assert_uplink(log: &str, want: UplinkSeen) {
    let line = log
        .lines()
        .find(|l| l.starts_with("h5i sentry: uplink: "))
        .unwrap_or_else(|| panic!("no uplink line in the sentry log:\n{log}"));
    match want {
        UplinkSeen::Veth => assert!(line.contains("veth pair"), "{line}"),
        UplinkSeen::Pasta => {
            assert!(line.contains("pasta --foreground"), "{line}");
            assert!(
                line.contains("-t none -u none -T none -U none --no-map-gw"),
                "{line}"
            );
        }
    }
}

/// What is left in a net directory after the run (the tally and the log, nothing else).
fn leftovers(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn supervised_box_as_root(gated: bool, test: &str) {
    if !require_root(test) {
        return;
    }
    let hosts = TestHosts::new();
    let tmp = tempfile::Builder::new()
        .prefix("h5i-net")
        .tempdir_in("/tmp")
        .unwrap();
    let id = format!("{test}-{}", std::process::id());
    let net_dir = tmp.path().join("n");
    private_dir(&net_dir, 0);
    let cgroup = format!("{}/h5i-net-test/{id}", own_cgroup().trim_end_matches('/'));
    let expect = box_script(&hosts, gated, UplinkSeen::Veth);
    let spec = spec(
        &["sh", "-c", &expect.script],
        &hook_bin(),
        &NetBox {
            dir: Some(net_dir.clone()),
            egress: egress(&hosts),
            gate: gated,
            uid: 0,
            cgroup: cgroup.clone(),
        },
    );
    let b = bundle(tmp.path(), &spec);
    let out = run_to_files(
        Command::new(runc_bin())
            .arg("--root")
            .arg(tmp.path().join("state"))
            .args(["run", "--bundle"])
            .arg(&b)
            .arg(&id),
    );
    remove_cgroup(&cgroup);
    remove_cgroup(&format!(
        "{}/h5i-net-test",
        own_cgroup().trim_end_matches('/')
    ));
    let log = sentry_log(&net_dir);
    assert!(
        out.status.success(),
        "h5i-runc run: {:?}\n{}\nsentry log:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    check_results(&out, &expect, &log);
    assert_uplink(&log, UplinkSeen::Veth);
    let t = tally(&net_dir);
    check_tally(&t, &hosts);
    if gated {
        check_gate_tally(&t);
    }
    assert_eq!(leftovers(&net_dir), ["sentry.log", "tally.json"]);
}

#[test]
fn a_supervised_box_reaches_only_its_pinned_destination() {
    supervised_box_as_root(true, "a_supervised_box_reaches_only_its_pinned_destination");
}

#[test]
fn nft_in_the_box_cannot_alter_its_table_even_without_the_socket_gate() {
    supervised_box_as_root(
        false,
        "nft_in_the_box_cannot_alter_its_table_even_without_the_socket_gate",
    );
}

/// `<own>/h5i` in every hierarchy, owned by `uid` (what `make setup` delegates to h5i-test, made
/// again for this test's own cgroup).
fn delegate_cgroup_to(uid: u32) -> String {
    let rel = format!("{}/h5i", own_cgroup().trim_end_matches('/'));
    delegate(&rel, uid, Some(uid));
    rel
}

/// The same box as the unprivileged `h5i-test` user: its own user namespace (box 0 -> 1001),
/// the sentry and pasta run as 1001, and h5i-runc picks the net directory
/// (`$XDG_RUNTIME_DIR/h5i-net/<id>`), since the spec names none.
#[test]
fn an_unprivileged_user_gets_the_same_supervised_network() {
    let test = "an_unprivileged_user_gets_the_same_supervised_network";
    if !require_root(test) {
        return;
    }
    let uid = test_user_uid();
    let hosts = TestHosts::new();
    let tmp = tempfile::Builder::new()
        .prefix("h5i-net-user")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // The build tree may sit where h5i-test cannot reach: the user runs its own copies.
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for (from, name) in [(runc_bin(), "h5i-runc"), (hook_bin(), "h5i-hook")] {
        std::fs::copy(from, bin.join(name)).unwrap();
    }
    let xdg = tmp.path().join("xdg");
    private_dir(&xdg, uid);
    let id = format!("unpriv-{}", std::process::id());
    let net_dir = xdg.join("h5i-net").join(&id[..id.len().min(16)]);
    let delegated = delegate_cgroup_to(uid);
    let cgroup = format!("{delegated}/net-test-{}", std::process::id());
    let expect = box_script(&hosts, true, UplinkSeen::Pasta);
    let mut spec = spec(
        &["sh", "-c", &expect.script],
        &bin.join("h5i-hook"),
        &NetBox {
            dir: Some(net_dir.clone()),
            egress: egress(&hosts),
            gate: true,
            uid,
            cgroup: cgroup.clone(),
        },
    );
    // h5i-runc names the directory (the gate's listenerPath above is where it will put it).
    spec["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("h5i.net.dir");
    let b = bundle(tmp.path(), &spec);
    // The user's bundle is the user's (h5i-runc writes the net directory back into it).
    for p in [b.clone(), b.join("config.json")] {
        std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
    }
    let out = run_to_files(
        Command::new("runuser")
            .args(["-u", "h5i-test", "--", "env"])
            .arg(format!("XDG_RUNTIME_DIR={}", xdg.display()))
            .arg(format!("HOME={}", xdg.display()))
            .arg(bin.join("h5i-runc"))
            .args(["run", "--bundle"])
            .arg(&b)
            .arg(&id),
    );
    remove_cgroup(&cgroup);
    // The directory h5i-runc made went with the run (net-down, run by h5i-runc's delete); its
    // tally and log are kept in the bundle.
    let log = std::fs::read_to_string(b.join(h5i_hook::net_end::KEPT_LOG)).unwrap_or_default();
    assert!(
        out.status.success(),
        "h5i-runc run as h5i-test: {:?}\n{}\nsentry log:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !outlived(&net_dir),
        "{} outlived the run",
        net_dir.display()
    );
    check_results(&out, &expect, &log);
    assert_uplink(&log, UplinkSeen::Pasta);
    let t = tally_kept_in(&b);
    check_tally(&t, &hosts);
    check_gate_tally(&t);
}

// ---------------------------------------------------------------------------------------------
// Podman: `podman --runtime h5i-runc --hooks-dir DIR run --network none --annotation
// h5i.net=supervised ...`, DIR holding the shipped hooks.d entries with the hook path pointed
// at the binary under test. Isolated storage (`--root`/`--runroot` in a temp dir) and an
// imported image, as runtime/tests/podman.rs does.

const IMAGE: &str = "localhost/h5i-net-test";

/// The shipped hooks.d entries, rewritten to run `hook`, in `dir`.
fn hooks_dir(dir: &Path, hook: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("oci");
    let mut n = 0;
    for e in std::fs::read_dir(&shipped).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "json") {
            let mut v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap();
            assert_eq!(v["hook"]["path"], "/usr/local/libexec/h5i/h5i-hook");
            assert_eq!(v["when"]["annotations"]["^h5i\\.net$"], "^supervised$");
            v["hook"]["path"] = serde_json::json!(hook);
            std::fs::write(dir.join(e.file_name()), v.to_string()).unwrap();
            n += 1;
        }
    }
    assert_eq!(n, 3, "three hooks.d entries ship in hooks/oci");
}

/// `--annotation` values: Podman parses them as CSV, so the JSON is quoted. No `--rm`: the
/// caller reads the tally kept in the container's bundle, then removes the container.
fn podman_net_args(hosts: &TestHosts, cidfile: &Path) -> Vec<String> {
    let egress = egress(hosts).replace('"', "\"\"");
    vec![
        "run".into(),
        "--network".into(),
        "none".into(),
        "--cidfile".into(),
        cidfile.display().to_string(),
        "--annotation".into(),
        "h5i.net=supervised".into(),
        "--annotation".into(),
        format!("\"h5i.net.egress={egress}\""),
        "-v".into(),
        "/usr:/usr:ro".into(),
    ]
}

fn import_image(podman: &dyn Fn(&[String]) -> std::process::Output, dir: &Path, uid: u32) {
    let rootfs = dir.join("image-rootfs");
    make_rootfs(&rootfs);
    let tar = dir.join("image.tar");
    h5i_testsupport::rootfs::tar(&rootfs, &tar);
    std::os::unix::fs::chown(&tar, Some(uid), Some(uid)).unwrap();
    let out = podman(&["import".into(), tar.display().to_string(), IMAGE.into()]);
    assert!(
        out.status.success(),
        "podman import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn have_podman(test: &str) -> bool {
    let ok = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        h5i_testsupport::skipped!("{test}: podman is not installed");
    }
    ok
}

fn read_cid(cidfile: &Path) -> String {
    std::fs::read_to_string(cidfile)
        .unwrap_or_else(|e| panic!("{}: {e}", cidfile.display()))
        .trim()
        .to_string()
}

/// Whether the run's net directory outlived the run; removed here either way, so a failing
/// assertion leaves nothing behind.
fn outlived(net_dir: &Path) -> bool {
    let left = std::fs::symlink_metadata(net_dir).is_ok();
    let _ = std::fs::remove_dir_all(net_dir);
    left
}

/// The container's bundle (Podman's `StaticDir`), where net-down keeps the tally and the log.
fn bundle_of(podman: &dyn Fn(&[String]) -> std::process::Output, cid: &str) -> PathBuf {
    let out = podman(&[
        "inspect".into(),
        "--format".into(),
        "{{.StaticDir}}".into(),
        cid.into(),
    ]);
    assert!(
        out.status.success(),
        "podman inspect: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Rootful Podman on private storage under /var/tmp, with h5i-runc, the shipped hooks.d
/// entries (running the hook under test) and a cgroup parent under this test's own cgroup.
/// Every container, image, mount and cgroup it made goes on drop.
struct RootfulPodman {
    dir: tempfile::TempDir,
    cgroup_parent: String,
}

impl RootfulPodman {
    fn new(name: &str) -> RootfulPodman {
        let dir = tempfile::Builder::new()
            .prefix(name)
            .tempdir_in("/var/tmp")
            .unwrap();
        let p = dir.path();
        hooks_dir(&p.join("hooks.d"), &hook_bin());
        std::fs::write(
            p.join("containers.conf"),
            format!(
                "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
                 [engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\ntmp_dir = \"{}\"\n",
                p.join("tmp").display()
            ),
        )
        .unwrap();
        let podman = RootfulPodman {
            cgroup_parent: format!(
                "{}/{name}-{}",
                own_cgroup().trim_end_matches('/'),
                std::process::id()
            ),
            dir,
        };
        import_image(&|a: &[String]| podman.podman(a), podman.dir.path(), 0);
        podman
    }

    fn podman(&self, args: &[String]) -> std::process::Output {
        let p = self.dir.path();
        run_to_files(
            Command::new("podman")
                .env("CONTAINERS_CONF", p.join("containers.conf"))
                .arg("--root")
                .arg(p.join("storage"))
                .arg("--runroot")
                .arg(p.join("run"))
                .args(["--storage-driver", "overlay", "--runtime"])
                .arg(runc_bin())
                .arg("--hooks-dir")
                .arg(p.join("hooks.d"))
                .args(args),
        )
    }

    /// `podman run` with `args` before the image and `cmd` after it, the cgroup parent placed.
    fn run(&self, args: &[String], cmd: &[&str]) -> std::process::Output {
        let mut all = args.to_vec();
        all.extend(["--cgroup-parent", &self.cgroup_parent, IMAGE].map(String::from));
        all.extend(cmd.iter().map(|s| s.to_string()));
        self.podman(&all)
    }
}

impl Drop for RootfulPodman {
    fn drop(&mut self) {
        let _ = self.podman(&["rm".into(), "--all".into(), "--force".into()]);
        let _ = self.podman(&["rmi".into(), "--all".into(), "--force".into()]);
        unmount_under(self.dir.path());
        remove_cgroup_parent(&self.cgroup_parent);
    }
}

#[test]
fn podman_with_the_shipped_hooks_gives_a_supervised_box() {
    let test = "podman_with_the_shipped_hooks_gives_a_supervised_box";
    if !require_root(test) || !have_podman(test) {
        return;
    }
    let hosts = TestHosts::new();
    let podman = RootfulPodman::new("h5i-net-podman");
    let cidfile = podman.dir.path().join("cid");
    let expect = box_script(&hosts, false, UplinkSeen::Veth);
    let out = podman.run(
        &podman_net_args(&hosts, &cidfile),
        &["sh", "-c", &expect.script],
    );
    let cid = read_cid(&cidfile);
    let net_dir = PathBuf::from("/run/h5i-net").join(&cid[..16]);
    let bundle = bundle_of(&|a: &[String]| podman.podman(a), &cid);
    let log = std::fs::read_to_string(bundle.join(h5i_hook::net_end::KEPT_LOG)).unwrap_or_default();
    assert!(
        !outlived(&net_dir),
        "{} outlived the run",
        net_dir.display()
    );
    assert!(
        out.status.success(),
        "podman run: {:?}\n{}\nsentry log:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    check_results(&out, &expect, &log);
    assert_uplink(&log, UplinkSeen::Veth);
    let t = tally_kept_in(&bundle);
    check_tally(&t, &hosts);
    // The kept files live as long as the container: `podman rm` takes them with it.
    let rm = podman.podman(&["rm".into(), cid]);
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    assert!(
        !bundle.exists(),
        "{} outlived the container",
        bundle.display()
    );
}

fn tally_kept_in(bundle: &Path) -> NetTally {
    let path = bundle.join(h5i_hook::net_end::KEPT_TALLY);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The net directory h5i-runc made goes however the run ends: a normal exit under `--rm`
/// (poststop), `podman rm -f` of a running box (poststop after the kill), and a create the
/// network hooks refuse (no poststop: h5i-runc removes it itself).
#[test]
fn podman_leaves_no_net_directory_however_the_run_ends() {
    let test = "podman_leaves_no_net_directory_however_the_run_ends";
    if !require_root(test) || !have_podman(test) {
        return;
    }
    let hosts = TestHosts::new();
    let podman = RootfulPodman::new("h5i-net-ends");
    let p = podman.dir.path().to_path_buf();
    let net_dir = |cidfile: &Path| PathBuf::from("/run/h5i-net").join(&read_cid(cidfile)[..16]);
    let with = |cidfile: &Path, extra: &[&str]| {
        let mut a = podman_net_args(&hosts, cidfile);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };

    // A normal (failing) exit, removed with the container.
    let cid = p.join("cid-exit");
    let out = podman.run(&with(&cid, &["--rm"]), &["sh", "-c", "exit 3"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = net_dir(&cid);
    assert!(!outlived(&d), "{} outlived a normal exit", d.display());

    // Killed while running.
    let cid = p.join("cid-kill");
    let out = podman.run(&with(&cid, &["-d"]), &["sleep", "600"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = net_dir(&cid);
    assert!(d.is_dir(), "the running box has its net directory");
    let rm = podman.podman(&[
        "rm".into(),
        "-f".into(),
        "-t".into(),
        "0".into(),
        read_cid(&cid),
    ]);
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    assert!(!outlived(&d), "{} outlived podman rm -f", d.display());

    // Refused at create (net-up: CAP_NET_ADMIN would let the box rewrite its table).
    let cid = p.join("cid-refused");
    let out = podman.run(&with(&cid, &["--rm", "--cap-add", "NET_ADMIN"]), &["true"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CAP_NET_ADMIN"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = net_dir(&cid);
    assert!(!outlived(&d), "{} outlived a refused create", d.display());
}

/// Rootless Podman as h5i-test: h5i-runc runs as uid 0 in Podman's user namespace (which the
/// box shares: the sentry enters only its network namespace), with `XDG_RUNTIME_DIR` set, so
/// the net directory is `$XDG_RUNTIME_DIR/h5i-net/<id>`. Podman is started inside cgroups root
/// delegated to the user (cgroup v1 has no rootless delegation of its own).
#[test]
fn rootless_podman_with_the_shipped_hooks_gives_a_supervised_box() {
    let test = "rootless_podman_with_the_shipped_hooks_gives_a_supervised_box";
    if !require_root(test) || !have_podman(test) {
        return;
    }
    let uid = test_user_uid();
    let hosts = TestHosts::new();
    let tmp = tempfile::Builder::new()
        .prefix("h5i-net-rootless")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = tmp.path().to_path_buf();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for d in ["tmp", "storage", "run", "out"] {
        std::fs::create_dir(p.join(d)).unwrap();
        std::os::unix::fs::chown(p.join(d), Some(uid), Some(uid)).unwrap();
    }
    let xdg = p.join("xdg");
    private_dir(&xdg, uid);
    let bin = p.join("bin");
    std::fs::create_dir(&bin).unwrap();
    for (from, name) in [(runc_bin(), "h5i-runc"), (hook_bin(), "h5i-hook")] {
        std::fs::copy(from, bin.join(name)).unwrap();
    }
    hooks_dir(&p.join("hooks.d"), &bin.join("h5i-hook"));
    std::fs::write(
        p.join("containers.conf"),
        format!(
            "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
             [engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\ntmp_dir = \"{}\"\n",
            p.join("tmp").display()
        ),
    )
    .unwrap();
    // Root moves this shell into cgroups delegated to the user, then becomes the user.
    let cgroups = Delegated::new("h5i-net-rootless", uid, uid);
    let podman = |args: &[String]| {
        run_to_files(
            cgroups
                .command_as("h5i-test")
                .arg(format!("XDG_RUNTIME_DIR={}", xdg.display()))
                .arg(format!(
                    "CONTAINERS_CONF={}",
                    p.join("containers.conf").display()
                ))
                .arg(format!("HOME={}", xdg.display()))
                .args(["podman", "--root"])
                .arg(p.join("storage"))
                .arg("--runroot")
                .arg(p.join("run"))
                .arg("--runtime")
                .arg(bin.join("h5i-runc"))
                .arg("--hooks-dir")
                .arg(p.join("hooks.d"))
                .args(args),
        )
    };
    import_image(&podman, &p, uid);
    let cidfile = p.join("out/cid");
    let expect = box_script(&hosts, false, UplinkSeen::Pasta);
    let mut args = podman_net_args(&hosts, &cidfile);
    args.extend([IMAGE, "sh", "-c", &expect.script].map(String::from));
    let out = podman(&args);
    let cid = read_cid(&cidfile);
    let net_dir = xdg.join("h5i-net").join(&cid[..16]);
    let bundle = bundle_of(&podman, &cid);
    let log = std::fs::read_to_string(bundle.join(h5i_hook::net_end::KEPT_LOG)).unwrap_or_default();
    let tally = std::fs::read_to_string(bundle.join(h5i_hook::net_end::KEPT_TALLY));
    let dir_outlived = outlived(&net_dir);
    let _ = podman(&["rm".into(), "--all".into(), "--force".into()]);
    let _ = podman(&["rmi".into(), "--all".into(), "--force".into()]);
    // Our own pause process (its own XDG_RUNTIME_DIR, so never another test's).
    for pause in [p.join("tmp/pause.pid"), xdg.join("libpod/tmp/pause.pid")] {
        if let Some(pid) = std::fs::read_to_string(&pause)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|pid| *pid > 1)
        {
            if let Ok(fd) = h5i_sys::pidfd::open(pid) {
                // The pid Podman recorded for the pause process it started for this test's
                // private runtime dir; its cgroup can go only once it has exited.
                let _ = h5i_sys::pidfd::kill(&fd);
                let _ = h5i_sys::pidfd::wait_exited(&fd, std::time::Duration::from_secs(10));
            }
        }
    }
    unmount_under(&p);
    drop(cgroups);
    assert!(
        out.status.success(),
        "rootless podman run: {:?}\n{}\nsentry log:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir_outlived, "{} outlived the run", net_dir.display());
    check_results(&out, &expect, &log);
    assert_uplink(&log, UplinkSeen::Pasta);
    let t: NetTally = serde_json::from_str(&tally.unwrap()).unwrap();
    check_tally(&t, &hosts);
}

/// A box whose network cannot be supervised never starts: the hooks refuse, say why, and
/// leave no sentry behind.
#[test]
fn a_box_whose_network_cannot_be_supervised_never_starts() {
    let test = "a_box_whose_network_cannot_be_supervised_never_starts";
    if !require_root(test) {
        return;
    }
    type Mangle = fn(&mut serde_json::Value);
    let cases: [(&str, &str, Mangle); 6] = [
        ("netadmin", "CAP_NET_ADMIN", |s| {
            s["process"]["capabilities"]["bounding"] = serde_json::json!(["CAP_NET_ADMIN"]);
        }),
        ("loopback", "loopback", |s| {
            s["annotations"]["h5i.net.egress"] =
                serde_json::json!(r#"[{"host":"lo.test","port":80,"addrs":["127.0.0.1"]}]"#);
        }),
        ("gateway", "uplink's own network", |s| {
            s["annotations"]["h5i.net.egress"] =
                serde_json::json!(r#"[{"host":"gw.test","port":22,"addrs":["10.0.2.2"]}]"#);
        }),
        ("veth_range", "100.127.0.0/16", |s| {
            s["annotations"]["h5i.net.egress"] =
                serde_json::json!(r#"[{"host":"pair.test","port":22,"addrs":["100.127.0.0"]}]"#);
        }),
        ("hostnet", "host's network namespace", |s| {
            let ns = s["linux"]["namespaces"].as_array_mut().unwrap();
            ns.retain(|n| n["type"] != "network");
        }),
        ("badegress", "h5i.net.egress", |s| {
            s["annotations"]["h5i.net.egress"] = serde_json::json!(r#"[{"host":"x.test"}]"#);
        }),
    ];
    for (name, why, mangle) in cases {
        let tmp = tempfile::Builder::new()
            .prefix("h5i-net-refuse")
            .tempdir_in("/tmp")
            .unwrap();
        let net_dir = tmp.path().join("n");
        private_dir(&net_dir, 0);
        let id = format!("refuse-{name}-{}", std::process::id());
        let cgroup = format!("{}/h5i-net-test/{id}", own_cgroup().trim_end_matches('/'));
        let mut s = spec(
            &["sh", "-c", "echo RAN"],
            &hook_bin(),
            &NetBox {
                dir: Some(net_dir.clone()),
                egress: "[]".into(),
                gate: false,
                uid: 0,
                cgroup: cgroup.clone(),
            },
        );
        mangle(&mut s);
        let b = bundle(tmp.path(), &s);
        let out = run_to_files(
            Command::new(runc_bin())
                .arg("--root")
                .arg(tmp.path().join("state"))
                .args(["run", "--bundle"])
                .arg(&b)
                .arg(&id),
        );
        remove_cgroup(&cgroup);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: the box ran");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("RAN"),
            "{name}: the box ran"
        );
        assert!(
            err.contains("refusing") && err.contains(why),
            "{name}: {err}"
        );
        for f in ["net.sock", "gate.sock", "sentry.pid"] {
            assert!(!net_dir.join(f).exists(), "{name}: {f} left behind");
        }
    }
    remove_cgroup(&format!(
        "{}/h5i-net-test",
        own_cgroup().trim_end_matches('/')
    ));
}

/// A 100 MB stream from an allowed test host arrives whole through the box (table, uplink and
/// all), five times; the same fetch from the host without a box is the comparison. The times
/// are printed, not asserted (a shared machine's timings are no pass/fail signal).
#[test]
fn a_100_mb_stream_from_an_allowed_host_arrives_whole_through_the_box() {
    let test = "a_100_mb_stream_from_an_allowed_host_arrives_whole_through_the_box";
    if !require_root(test) {
        return;
    }
    let hosts = TestHosts::new();
    let tmp = tempfile::Builder::new()
        .prefix("h5i-net-bulk")
        .tempdir_in("/tmp")
        .unwrap();
    let net_dir = tmp.path().join("n");
    private_dir(&net_dir, 0);
    let id = format!("bulk-{}", std::process::id());
    let cgroup = format!("{}/h5i-net-test/{id}", own_cgroup().trim_end_matches('/'));
    let a2 = hosts.addr(2);
    let fetch = format!("netprobe fetch {a2} {BULK_PORT}");
    let script = [fetch.as_str(); 5].join("\n");
    let spec = spec(
        &["sh", "-c", &script],
        &hook_bin(),
        &NetBox {
            dir: Some(net_dir.clone()),
            egress: format!(r#"[{{"host":"bulk.test","port":{BULK_PORT},"addrs":["{a2}"]}}]"#),
            gate: true,
            uid: 0,
            cgroup: cgroup.clone(),
        },
    );
    let b = bundle(tmp.path(), &spec);
    let boxed = run_to_files(
        Command::new(runc_bin())
            .arg("--root")
            .arg(tmp.path().join("state"))
            .args(["run", "--bundle"])
            .arg(&b)
            .arg(&id),
    );
    remove_cgroup(&cgroup);
    let direct =
        run_to_files(Command::new(netprobe()).args(["fetch", &a2, &BULK_PORT.to_string()]));
    let log = sentry_log(&net_dir);
    assert!(
        boxed.status.success(),
        "{}\nsentry log:\n{log}",
        String::from_utf8_lossy(&boxed.stderr)
    );
    let ms = |out: &std::process::Output| -> Vec<u64> {
        results(&out.stdout)
            .iter()
            .map(|(_, v)| {
                let f: Vec<&str> = v.split(' ').collect();
                assert_eq!(f[..2], ["OK", &TestHosts::BULK_BYTES.to_string()], "{v}");
                f[2].parse().unwrap()
            })
            .collect()
    };
    let through_box = ms(&boxed);
    let without = ms(&direct);
    assert_eq!(through_box.len(), 5);
    eprintln!("100 MB through the box: {through_box:?} ms; from the host, no box: {without:?} ms");
    let t = tally(&net_dir);
    assert_eq!(
        t.egress.allowed,
        BTreeMap::from([(format!("bulk.test:{BULK_PORT}"), 5)])
    );
    assert!(t.egress.denied.is_empty(), "{t:#?}");
}

/// The sentry's protocol without a box: it answers `ready`, refuses an attach whose fds are not
/// namespaces (and any attach after the first), refuses an unknown request, and on `stop`
/// (sent by `h5i-hook net-down`, as poststop would) writes an empty-table tally, exits and
/// leaves only the tally and its log.
#[test]
fn the_sentry_refuses_a_bogus_attach_and_still_ends_with_a_tally() {
    use std::io::{BufRead, Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    use std::process::Stdio;

    let tmp = tempfile::tempdir().unwrap();
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let dir = tmp.path().join("n");
    private_dir(&dir, me);
    let mut init = Command::new("sleep").arg("30").spawn().unwrap();
    let mut sentry = Command::new(hook_bin())
        .arg("sentry")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("sentry.log")).unwrap())
        .spawn()
        .unwrap();
    let plan = serde_json::json!({"dir": dir, "init_pid": init.id(), "egress": [], "unix": false});
    sentry
        .stdin
        .take()
        .unwrap()
        .write_all(plan.to_string().as_bytes())
        .unwrap();
    let mut ready = String::new();
    std::io::BufReader::new(sentry.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready, "ready\n", "{}", sentry_log(&dir));

    let ask = |data: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]| {
        let mut c = UnixStream::connect(dir.join("net.sock")).unwrap();
        h5i_sys::fd_passing::send_with_fds(&c, data, fds).unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        answer
    };
    let null = std::fs::File::open("/dev/null").unwrap();
    let a = ask(b"attach\n", &[null.as_fd(), null.as_fd()]);
    assert!(a.starts_with("refusing: the network fd"), "{a}");
    let net = std::fs::File::open("/proc/self/ns/net").unwrap();
    let user = std::fs::File::open("/proc/self/ns/user").unwrap();
    let a = ask(b"attach\n", &[net.as_fd(), user.as_fd()]);
    assert!(a.contains("already attached"), "{a}");
    let a = ask(b"hello\n", &[]);
    assert!(a.starts_with("refusing: unknown request"), "{a}");

    let bundle = tmp.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    let config = serde_json::json!({"annotations": {"h5i.net": "supervised", "h5i.net.dir": dir}});
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    let state = serde_json::json!({"ociVersion": "1.0.2", "id": "x", "status": "stopped", "bundle": bundle});
    let mut down = Command::new(hook_bin())
        .arg("net-down")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    down.stdin
        .take()
        .unwrap()
        .write_all(state.to_string().as_bytes())
        .unwrap();
    let out = down.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "net-down: {}\nsentry log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        sentry_log(&dir)
    );
    assert!(sentry.wait().unwrap().success());
    let _ = init.kill();
    let _ = init.wait();
    let t: NetTally = tally(&dir);
    assert_eq!(
        t,
        NetTally::default(),
        "never attached: nothing loaded, nothing counted"
    );
    assert_eq!(leftovers(&dir), ["sentry.log", "tally.json"]);
}
