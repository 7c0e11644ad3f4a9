//! The supervised tier on the box-lifetime sandbox, asserted from inside real boxes and from the
//! host, as root and as the unprivileged test user: a background process of one run is gone
//! before the next starts; a name pinned to another address is swapped into the table for the
//! next run (the host that was refused is reached and the other way round) without a rebuild,
//! and each receipt's tally is exactly its own run's; a changed plan rebuilds the sandbox, its
//! sentry and uplink going with the old one; a run's OOM kills that run only, not the sandbox,
//! or a concurrent run (a service is refused at this tier, as the manual says). A refused dial
//! is counted in its own run's receipt only: not in the next run's (whose pins match, so the table stays in force), nor is a dial
//! made between runs from inside the box's network namespace; a run during which the box's table
//! is replaced gets no tally (never one mixed from two tables), while another table made in the
//! namespace meanwhile (as the browser fence is) leaves the run's tally whole. Every
//! destination is one of this test's own hosts (tests/common/testnet.rs). The rest of the
//! supervised suite (supervised_tier, confine, run_signals, ...) runs through this sandbox too:
//! it is the default path.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::{Output, Stdio};
use std::time::Duration;

use common::sandbox::{self, pid_in};
use common::testnet::TestHosts;
use common::{labelled_results as results, process_alive as alive, stderr, stdout, Caller};

/// `tcp LABEL HOST PORT`: prints `LABEL=greeting` or `LABEL=err:ERRNO`.
const CONNECT: &str = r#"
import errno, socket, sys
args = sys.argv[1:]
for i in range(0, len(args), 3):
    label, host, port = args[i], args[i + 1], int(args[i + 2])
    try:
        s = socket.create_connection((host, port), timeout=3)
        print("%s=%s" % (label, s.recv(100).decode().strip())); s.close()
    except OSError as e:
        print("%s=err:%s" % (label, errno.errorcode.get(e.errno, str(e.errno))))
"#;

fn run(c: &mut Caller, name: &str, pin: &str, argv: &[&str]) -> Output {
    let mut args = vec!["box", "run", name, "--"];
    args.extend_from_slice(argv);
    c.h5i_with(&args, &[("H5I_TEST_HOSTS", pin)])
}

fn connect(c: &mut Caller, name: &str, pin: &str, checks: &[(&str, String)]) -> Output {
    let mut argv: Vec<String> = vec!["python3".into(), "-c".into(), CONNECT.into()];
    for (label, target) in checks {
        let (host, port) = target.rsplit_once(':').unwrap();
        argv.extend([label.to_string(), host.to_string(), port.to_string()]);
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    run(c, name, pin, &argv)
}

/// The box's sandbox container id, from `box status` (None when it is down).
fn sandbox_id(c: &Caller, name: &str) -> Option<String> {
    sandbox::id(c, name)
}

fn policy(c: &Caller, extra: &str) {
    c.write(
        ".h5i/env.toml",
        format!(
            "[profile.sup]\nisolation = \"supervised\"\n[profile.sup.net]\negress = [\"allowed.test:8080\"]\n{extra}"
        ),
    );
    c.commit_all("policy");
}

fn background_process_is_gone_before_the_next_run(as_user: bool) {
    let mut c = Caller::either(as_user);
    c.create_at("bg", "supervised");
    // Each caller's twin runs at the same time: a marker of its own.
    let marker = format!("sleep 987.{}", 60 + u32::from(as_user));
    let out = run(
        &mut c,
        "bg",
        "",
        &[
            "sh",
            "-c",
            &format!("{marker} & echo $! > bg.pid; echo started"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}: {}", c.who(), stderr(&out));
    let id = sandbox_id(&c, "bg").expect("the run did not use the sandbox");
    let ps = std::process::Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    assert!(
        stdout(&ps).trim().is_empty(),
        "{}: the background job outlived its run: {}",
        c.who(),
        stdout(&ps)
    );
    // From inside: the pid the first run recorded names no process in the box any more.
    let out = run(
        &mut c,
        "bg",
        "",
        &["sh", "-c", "kill -0 $(cat bg.pid) 2>&1; echo kill=$?"],
    );
    assert!(
        stdout(&out).contains("kill=1"),
        "{}: {}{}",
        c.who(),
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(sandbox_id(&c, "bg").as_deref(), Some(id.as_str()));
    c.ok(&["box", "rm", "--force", "bg"]);
}

#[test]
fn a_background_process_of_one_supervised_run_is_gone_before_the_next_run_starts() {
    background_process_is_gone_before_the_next_run(false);
}

#[test]
fn a_background_process_of_one_supervised_run_is_gone_before_the_next_run_starts_as_the_test_user()
{
    background_process_is_gone_before_the_next_run(true);
}

/// Two test hosts, a caller whose policy allows `allowed.test:8080`, and box `name` made with
/// that name pinned to the first host; the pins of the name to the first and to the second.
fn repin_fixture(
    test: &str,
    name: &str,
    as_user: bool,
) -> Option<(TestHosts, Caller, String, String)> {
    let hosts = TestHosts::up(test, &[8080], &[])?;
    let mut c = Caller::either(as_user);
    policy(&c, "");
    let pin_first = hosts.pin(&[("allowed.test", hosts.first)]);
    let pin_second = hosts.pin(&[("allowed.test", hosts.second)]);
    let out = c.h5i_with(
        &["box", "create", name, "--profile", "sup"],
        &[("H5I_TEST_HOSTS", &pin_first)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    Some((hosts, c, pin_first, pin_second))
}

/// Dial the pinned name and `other`, port 8080 both.
fn checks(other: Ipv4Addr) -> [(&'static str, String); 2] {
    [
        ("named", "allowed.test:8080".to_string()),
        ("other", format!("{other}:8080")),
    ]
}

fn repinned_name_swaps_into_the_table(as_user: bool) {
    let Some((mut hosts, mut c, pin_first, pin_second)) =
        repin_fixture("supervised sandbox repin", "rp", as_user)
    else {
        return;
    };
    let (first, second) = (hosts.first, hosts.second);
    let out = connect(&mut c, "rp", &pin_first, &checks(second));
    let got = results(&out);
    assert_eq!(got["named"], format!("hello {first}:8080"), "{got:?}");
    assert!(got["other"].starts_with("err:"), "{got:?}");
    let id = sandbox_id(&c, "rp").expect("the run did not use the sandbox");

    // The name now pins to the second host: the next run reaches it, and the first is refused.
    let out = connect(&mut c, "rp", &pin_second, &checks(first));
    let got = results(&out);
    assert_eq!(got["named"], format!("hello {second}:8080"), "{got:?}");
    assert!(got["other"].starts_with("err:"), "{got:?}");
    assert_eq!(
        sandbox_id(&c, "rp").as_deref(),
        Some(id.as_str()),
        "{}: a re-pinned name rebuilt the sandbox instead of swapping the table",
        c.who()
    );
    assert_eq!(
        hosts.log(),
        vec![format!("tcp {first}:8080"), format!("tcp {second}:8080")]
    );

    // Each receipt counts its own run only.
    let recs = c.receipts("rp");
    let (one, two) = (&recs[recs.len() - 2], &recs[recs.len() - 1]);
    for (rec, other) in [(one, second), (two, first)] {
        assert_eq!(rec["tier"], "supervised");
        assert_eq!(rec["egress"]["allowed"]["allowed.test:8080"], 1, "{rec}");
        let denied = rec["egress"]["denied"].as_object().unwrap();
        assert_eq!(
            denied.keys().collect::<Vec<_>>(),
            vec![&format!("{other}:8080/tcp")],
            "{rec}"
        );
        assert_eq!(denied[&format!("{other}:8080/tcp")], 1, "{rec}");
    }
    let status = c.ok(&["box", "status", "rp"]);
    assert!(
        status.contains(&format!("allowed.test:8080 -> {second}")),
        "{status}"
    );
    c.ok(&["box", "rm", "--force", "rp"]);
}

#[test]
fn a_repinned_name_is_swapped_into_the_table_for_the_next_run_and_each_tally_is_its_own() {
    repinned_name_swaps_into_the_table(false);
}

#[test]
fn a_repinned_name_is_swapped_into_the_table_for_the_next_run_and_each_tally_is_its_own_as_the_test_user(
) {
    repinned_name_swaps_into_the_table(true);
}

/// Run `checks` from the host inside the network namespace of `pid` (the sandbox's init): a
/// dial between runs, under the table but outside any run.
fn connect_from_netns_of(
    pid: i32,
    checks: &[(&str, String)],
) -> std::collections::BTreeMap<String, String> {
    let mut cmd = std::process::Command::new("nsenter");
    cmd.arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["python3", "-c", CONNECT]);
    for (label, target) in checks {
        let (host, port) = target.rsplit_once(':').unwrap();
        cmd.args([*label, host, port]);
    }
    results(&cmd.output().unwrap())
}

/// A receipt's denied tally, as `key -> count` (empty when none was refused).
fn denied_of(rec: &serde_json::Value) -> Vec<(String, u64)> {
    rec["egress"]["denied"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

/// A run of box `pt` under `pin` reaches the name at `reached` and is refused `refused`, and
/// its receipt counts exactly that: one allowed connection, one refused dial.
fn dial_and_count(c: &mut Caller, pin: &str, reached: Ipv4Addr, refused: Ipv4Addr) {
    let got = results(&connect(c, "pt", pin, &checks(refused)));
    assert_eq!(got["named"], format!("hello {reached}:8080"), "{got:?}");
    assert!(got["other"].starts_with("err:"), "{got:?}");
    let rec = c.receipts("pt").pop().unwrap();
    assert_eq!(rec["egress"]["allowed"]["allowed.test:8080"], 1, "{rec}");
    assert_eq!(
        denied_of(&rec),
        vec![(format!("{refused}:8080/tcp"), 1)],
        "{}: {rec}",
        c.who()
    );
}

fn each_runs_tally_and_pins_are_its_own(as_user: bool) {
    let Some((mut hosts, mut c, pin_first, pin_second)) =
        repin_fixture("supervised sandbox per-run tally", "pt", as_user)
    else {
        return;
    };
    let (first, second) = (hosts.first, hosts.second);

    // Run N: one allowed connection, one refused dial, both in its receipt.
    dial_and_count(&mut c, &pin_first, first, second);
    let id = sandbox_id(&c, "pt").expect("the run did not use the sandbox");
    let init = pid_in(&sandbox::dir(&c, &id).join("init.pid"));

    // Between runs, a dial from inside the box's network namespace is refused by the table
    // (so it is counted there) but belongs to no run.
    let between = connect_from_netns_of(init, &[("gap", format!("{second}:8080"))]);
    assert!(between["gap"].starts_with("err:"), "{between:?}");

    // Run N+1, same pins: neither run N's refusal nor the one between runs is in its receipt.
    let out = run(&mut c, "pt", &pin_first, &["true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rec = c.receipts("pt").pop().unwrap();
    assert_eq!(rec["egress"]["allowed"]["allowed.test:8080"], 0, "{rec}");
    assert_eq!(denied_of(&rec), Vec::new(), "{}: {rec}", c.who());

    // The name now pins elsewhere: the very next run reaches the new address, the old one is
    // refused, and its receipt counts only that.
    dial_and_count(&mut c, &pin_second, second, first);
    // The same pins again (the table stays as it is): the same refusal counts once, not twice.
    dial_and_count(&mut c, &pin_second, second, first);
    assert_eq!(
        sandbox_id(&c, "pt").as_deref(),
        Some(id.as_str()),
        "{}: the runs did not share the sandbox",
        c.who()
    );
    assert_eq!(
        hosts.log(),
        vec![
            format!("tcp {first}:8080"),
            format!("tcp {second}:8080"),
            format!("tcp {second}:8080")
        ]
    );
    c.ok(&["box", "rm", "--force", "pt"]);
}

#[test]
fn a_refused_dial_is_counted_in_its_own_runs_receipt_only_and_a_new_pin_holds_from_the_next_run() {
    each_runs_tally_and_pins_are_its_own(false);
}

#[test]
fn a_refused_dial_is_counted_in_its_own_runs_receipt_only_and_a_new_pin_holds_from_the_next_run_as_the_test_user(
) {
    each_runs_tally_and_pins_are_its_own(true);
}

/// `nft ARGS` with `script` on stdin, from the host inside the network namespace of `pid`.
fn nft_in_netns_of(pid: i32, args: &[&str], script: &str) -> Output {
    let mut child = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .arg("nft")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), script.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// Start a run of box `tb` that says `in`, waits 2 s, then dials `other`; returns once it
/// said `in`, for the caller to act during the run, and the child to wait for.
fn dial_after_a_pause(c: &Caller, pin: &str, other: Ipv4Addr) -> std::process::Child {
    let script = format!("echo in; sleep 2; python3 -c '{CONNECT}' other {other} 8080");
    let mut child = c
        .h5i_in(&c.repo(), &["box", "run", "tb", "--", "sh", "-c", &script])
        .env("H5I_TEST_HOSTS", pin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "in");
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    child
}

#[test]
fn a_table_replaced_during_a_run_voids_that_runs_tally_and_another_table_does_not() {
    let Some((hosts, mut c, pin_first, _)) =
        repin_fixture("supervised sandbox table replaced", "tb", false)
    else {
        return;
    };
    let second = hosts.second;
    let out = run(&mut c, "tb", &pin_first, &["true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = sandbox_id(&c, "tb").expect("the run did not use the sandbox");
    let init = pid_in(&sandbox::dir(&c, &id).join("init.pid"));

    // Another table made in the box's namespace during a run (as the browser fence is) leaves
    // the run's tally whole.
    let child = dial_after_a_pause(&c, &pin_first, second);
    let made = nft_in_netns_of(init, &["-f", "-"], "table inet h5i_probe {}\n");
    assert!(made.status.success(), "{}", stderr(&made));
    let status = common::wait_bounded(child, Duration::from_secs(60), "the run");
    assert_eq!(status.code(), Some(0));
    let rec = c.receipts("tb").pop().unwrap();
    assert_eq!(
        denied_of(&rec),
        vec![(format!("{second}:8080/tcp"), 1)],
        "{rec}"
    );

    // The box's own table replaced during a run (same rules, a new table): the counters read
    // at the end are not of the table the run began with, so the run's receipt claims none.
    let mut child = dial_after_a_pause(&c, &pin_first, second);
    let listed = nft_in_netns_of(init, &["-s", "list", "table", "inet", "h5i"], "");
    assert!(listed.status.success(), "{}", stderr(&listed));
    let replaced = nft_in_netns_of(
        init,
        &["-f", "-"],
        &format!("delete table inet h5i\n{}", stdout(&listed)),
    );
    assert!(replaced.status.success(), "{}", stderr(&replaced));
    let mut err = child.stderr.take().unwrap();
    let status = common::wait_bounded(child, Duration::from_secs(60), "the run");
    let mut said = String::new();
    std::io::Read::read_to_string(&mut err, &mut said).unwrap();
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(
        said.contains("left no tally") && said.contains("replaced"),
        "{said}"
    );
    let rec = c.receipts("tb").pop().unwrap();
    assert!(rec["egress"]["denied"].is_null(), "{rec}");

    // The next run puts the sentry's own table back and counts as before.
    let got = results(&connect(&mut c, "tb", &pin_first, &checks(second)));
    assert!(got["other"].starts_with("err:"), "{got:?}");
    let rec = c.receipts("tb").pop().unwrap();
    assert_eq!(
        denied_of(&rec),
        vec![(format!("{second}:8080/tcp"), 1)],
        "{rec}"
    );
    c.ok(&["box", "rm", "--force", "tb"]);
}

fn changed_plan_rebuilds_with_its_network(as_user: bool) {
    let Some(mut hosts) = TestHosts::up("supervised sandbox rebuild", &[8080], &[]) else {
        return;
    };
    let mut c = Caller::either(as_user);
    let late = tempfile::tempdir().unwrap();
    let grant = late.path().join("granted-later");
    policy(
        &c,
        &format!(
            "[profile.sup.fs]\nread = [\"/usr\", \"/etc\", \"/bin\", \"/lib\", \"/lib64\", \"{}\"]\n",
            grant.display()
        ),
    );
    let pin = hosts.pin(&[("allowed.test", hosts.first)]);
    let out = c.h5i_with(
        &["box", "create", "rb", "--profile", "sup"],
        &[("H5I_TEST_HOSTS", &pin)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let probe = format!("cat {}/f 2>&1; echo cat=$?", grant.display());
    let out = run(&mut c, "rb", &pin, &["sh", "-c", &probe]);
    assert!(stdout(&out).contains("cat=1"), "{}", stderr(&out));
    let first = sandbox_id(&c, "rb").expect("sandbox up after the first run");
    let dir = sandbox::dir(&c, &first);
    let old_init = pid_in(&dir.join("init.pid"));
    let old_sentry = pid_in(&dir.join("net/sentry.pid"));
    assert!(alive(old_sentry), "the sandbox's sentry is not running");

    std::fs::create_dir(&grant).unwrap();
    std::fs::write(grant.join("f"), "visible-after-rebuild\n").unwrap();
    let out = run(&mut c, "rb", &pin, &["sh", "-c", &probe]);
    assert!(
        stdout(&out).contains("visible-after-rebuild") && stdout(&out).contains("cat=0"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let second = sandbox_id(&c, "rb").expect("sandbox up after the second run");
    assert_ne!(first, second, "the sandbox was not rebuilt");
    assert!(!alive(old_init), "the old sandbox's init is still running");
    assert!(
        !alive(old_sentry),
        "the old sandbox's sentry is still running"
    );
    // The rebuilt sandbox has the same network: the pinned host only.
    let out = connect(
        &mut c,
        "rb",
        &pin,
        &[
            ("named", "allowed.test:8080".to_string()),
            ("other", format!("{}:8080", hosts.second)),
        ],
    );
    let got = results(&out);
    assert_eq!(
        got["named"],
        format!("hello {}:8080", hosts.first),
        "{got:?}"
    );
    assert!(got["other"].starts_with("err:"), "{got:?}");
    assert_eq!(hosts.log(), vec![format!("tcp {}:8080", hosts.first)]);
    let new_sentry = pid_in(&sandbox::dir(&c, &second).join("net/sentry.pid"));
    c.ok(&["box", "rm", "--force", "rb"]);
    assert!(!alive(new_sentry), "rm left the sandbox's sentry running");
}

#[test]
fn a_changed_plan_rebuilds_the_supervised_sandbox_and_its_network() {
    changed_plan_rebuilds_with_its_network(false);
}

#[test]
fn a_changed_plan_rebuilds_the_supervised_sandbox_and_its_network_as_the_test_user() {
    changed_plan_rebuilds_with_its_network(true);
}

fn oom_kills_only_that_run(as_user: bool) {
    let c = Caller::either(as_user);
    c.write(
        ".h5i/env.toml",
        "[profile.small]\nisolation = \"supervised\"\n[profile.small.resources]\nmem = \"64M\"\n",
    );
    c.commit_all("small");
    c.ok(&["box", "create", "oom", "--profile", "small"]);
    assert!(c.h5i(&["box", "run", "oom", "--", "true"]).status.success());
    let sandbox = sandbox_id(&c, "oom").expect("sandbox up");
    // The hog takes the sandbox first (it says so before it allocates), then a calm run starts
    // beside it (in a container of its own: the sandbox serves one supervised run at a time).
    let mut hog = c.h5i_in(
        &c.repo(),
        &[
            "box",
            "run",
            "oom",
            "--",
            "sh",
            "-c",
            "echo in; sleep 2; python3 -c 'x = bytearray(512 * 1024 * 1024); print(len(x))'",
        ],
    );
    let mut hog = hog
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(hog.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "in");
    let calm = c
        .h5i_in(
            &c.repo(),
            &[
                "box",
                "run",
                "oom",
                "--",
                "sh",
                "-c",
                "sleep 4; echo calm-survived",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let hog_status = common::wait_bounded(hog, Duration::from_secs(60), "the hog");
    assert_eq!(hog_status.code(), Some(137), "{}", c.who());
    let calm = calm.wait_with_output().unwrap();
    assert_eq!(calm.status.code(), Some(0), "the concurrent run was hit");
    assert!(stdout(&calm).contains("calm-survived"), "{}", stderr(&calm));
    assert_eq!(
        sandbox_id(&c, "oom").as_deref(),
        Some(sandbox.as_str()),
        "{}: the sandbox itself went down",
        c.who()
    );
    let recs = c.receipts("oom");
    let hog_rec = recs
        .iter()
        .find(|r| {
            r["argv"][2]
                .as_str()
                .is_some_and(|s| s.contains("bytearray"))
        })
        .expect("hog receipt");
    assert_eq!(hog_rec["exit"]["oom_killed"], true, "{hog_rec}");
    let calm_rec = recs
        .iter()
        .find(|r| r["argv"][2].as_str().is_some_and(|s| s.contains("calm")))
        .expect("calm receipt");
    assert_eq!(calm_rec["exit"]["oom_killed"], false, "{calm_rec}");
    // The sandbox still serves the next run.
    c.in_box("oom", "echo still-here");
    assert_eq!(sandbox_id(&c, "oom").as_deref(), Some(sandbox.as_str()));
    c.ok(&["box", "rm", "--force", "oom"]);
}

#[test]
fn a_supervised_runs_oom_kills_that_run_not_the_sandbox_or_a_concurrent_run() {
    oom_kills_only_that_run(false);
}

#[test]
fn a_supervised_runs_oom_kills_that_run_not_the_sandbox_or_a_concurrent_run_as_the_test_user() {
    oom_kills_only_that_run(true);
}

/// A supervised profile `name` with no egress and `extra` TOML after its header, committed.
fn quiet_profile(c: &Caller, name: &str, extra: &str) {
    c.write(
        ".h5i/env.toml",
        format!("[profile.{name}]\nisolation = \"supervised\"\n{extra}"),
    );
    c.commit_all(name);
}

/// The names of the run sub-cgroups (`run-*`) below sandbox `id`'s cgroups.
fn run_cgroups(id: &str) -> Vec<String> {
    sandbox::cgroups_named(id)
        .iter()
        .flat_map(|g| std::fs::read_dir(g.join("c")).into_iter().flatten())
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("run-"))
        .collect()
}

fn wall_clock_kills_a_warm_run(as_user: bool) {
    let c = Caller::either(as_user);
    quiet_profile(&c, "quick", "[profile.quick.resources]\nwall = \"3s\"\n");
    c.ok(&["box", "create", "slow", "--profile", "quick"]);
    // Warm: the sandbox is up before the run the clock ends.
    c.in_box("slow", "true");
    let id = sandbox_id(&c, "slow").expect("the run did not use the sandbox");
    let marker = format!("sleep 73.{}", 40 + u32::from(as_user));
    let out = c.h5i(&[
        "box",
        "run",
        "slow",
        "--",
        "sh",
        "-c",
        &format!("{marker} & {marker}"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(124),
        "{}: {}",
        c.who(),
        stderr(&out)
    );
    let ps = std::process::Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    assert!(
        stdout(&ps).trim().is_empty(),
        "{}: the run's processes outlived its wall clock: {}",
        c.who(),
        stdout(&ps)
    );
    assert_eq!(
        run_cgroups(&id),
        Vec::<String>::new(),
        "{}: the run's cgroup outlived it",
        c.who()
    );
    let rec = c.receipts("slow").pop().unwrap();
    assert_eq!(rec["exit"]["timed_out"], true, "{rec}");
    // The next run is served by the same sandbox.
    let out = c.h5i(&["box", "run", "slow", "--", "echo", "next-run-ok"]);
    assert_eq!(out.status.code(), Some(0), "{}: {}", c.who(), stderr(&out));
    assert!(stdout(&out).contains("next-run-ok"), "{}", stdout(&out));
    assert_eq!(
        sandbox_id(&c, "slow").as_deref(),
        Some(id.as_str()),
        "{}: the wall clock took the sandbox down",
        c.who()
    );
    c.ok(&["box", "rm", "--force", "slow"]);
}

#[test]
fn the_wall_clock_kills_a_warm_supervised_run_with_124_and_the_next_run_works() {
    wall_clock_kills_a_warm_run(false);
}

#[test]
fn the_wall_clock_kills_a_warm_supervised_run_with_124_and_the_next_run_works_as_the_test_user() {
    wall_clock_kills_a_warm_run(true);
}

fn abort_tears_down(as_user: bool) {
    let mut c = Caller::either(as_user);
    c.create_at("ab", "supervised");
    c.in_box("ab", "true");
    let held = sandbox::Held::now(&c, "ab");
    let (_, uplink) = held
        .net
        .as_ref()
        .expect("a supervised sandbox has a sentry");
    assert!(uplink.exists(), "{}: no uplink found to watch", c.who());
    c.ok(&["box", "abort", "ab"]);
    let left = held.left();
    assert!(left.is_empty(), "{}: `box abort` left {left:?}", c.who());
    let status = c.ok(&["box", "status", "ab"]);
    assert!(status.contains("sandbox: down"), "{}: {status}", c.who());
}

#[test]
fn abort_tears_the_supervised_sandbox_down_sentry_uplink_cgroup_and_directory() {
    abort_tears_down(false);
}

#[test]
fn abort_tears_the_supervised_sandbox_down_sentry_uplink_cgroup_and_directory_as_the_test_user() {
    abort_tears_down(true);
}

#[test]
fn the_idle_timeout_tears_a_supervised_sandbox_down() {
    sandbox::idle_teardown(&mut Caller::either(false), "supervised");
}

#[test]
fn the_idle_timeout_tears_a_supervised_sandbox_down_as_the_test_user() {
    sandbox::idle_teardown(&mut Caller::either(true), "supervised");
}

#[test]
fn a_supervised_box_refuses_a_service_as_the_manual_says() {
    sandbox::oom_spares_a_service(&mut Caller::either(false), "supervised");
}

#[test]
fn a_supervised_box_refuses_a_service_as_the_manual_says_as_the_test_user() {
    sandbox::oom_spares_a_service(&mut Caller::either(true), "supervised");
}

#[test]
fn what_supervised_runs_leave_in_the_boxs_scratch_counts_against_its_memory() {
    sandbox::leftovers_count_against_the_box(&mut Caller::either(false), "supervised");
}

#[test]
fn what_supervised_runs_leave_in_the_boxs_scratch_counts_against_its_memory_as_the_test_user() {
    sandbox::leftovers_count_against_the_box(&mut Caller::either(true), "supervised");
}
