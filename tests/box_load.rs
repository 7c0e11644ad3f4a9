//! Load (issue 20): 20 real boxes running at once, mixed tiers (process, supervised, container
//! with the `localhost/h5i-busybox` image), each running a few runs back to back while the
//! others run, after the same runs made one box at a time (the baseline of the figures).
//! Asserted: every box's receipt log holds exactly the runs it ran (their exit codes, in order)
//! with every line whole JSON; every connection a box made to the allowed test host went
//! through (the container boxes' through their egress proxies: every answer a `200`, none
//! refused) and was counted in that run's receipt, and the test host saw each one; h5i's own
//! processes (the `h5i` verbs and the sibling `h5i-*` binaries of this build) stay within a
//! memory and descriptor bound; and `box rm` then removes every box, leaving no box directory
//! and no container.
//!
//! Prints its figures (BENCHMARKS.md, `box-load`): wall time at once and one box at a time,
//! peak h5i-side resident memory and descriptors (per process and summed), receipts counted.
//!
//! Run as root (CI): the container tier runs rootless Podman as the test user
//! (`H5I_CONTAINER_USER=h5i-test`), the supervised tier's boxes and the test hosts need
//! network namespaces. Every destination is one of this test's own hosts
//! (tests/common/testnet.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::testnet::TestHosts;
use common::{stdout, Repo, H5I};

const USER: &str = "h5i-test";
const IMAGE: &str = "localhost/h5i-busybox:latest";
/// Boxes of each tier, 20 in all.
const TIERS: [(&str, usize); 3] = [("process", 7), ("supervised", 7), ("container", 6)];
/// Runs each box runs, one after another (run `k` exits with code `k`).
const RUNS: usize = 3;
/// Connections to the allowed test host each supervised or container run opens at once.
const CONNS: usize = 10;
/// The most resident memory one h5i process may hold under this load.
const RSS_BOUND: u64 = 64 << 20;
/// The most descriptors one h5i process may hold under this load.
const FD_BOUND: usize = 256;
/// How long one run may take on a loaded 2-core host before the test fails (killed).
const RUN_LIMIT: Duration = Duration::from_secs(600);

fn policy() -> String {
    format!(
        "[profile.process]\nisolation = \"process\"\n\
         [profile.supervised]\nisolation = \"supervised\"\n\
         [profile.supervised.net]\negress = [\"allowed.test:8080\"]\n\
         [profile.container]\nisolation = \"container\"\n\
         [profile.container.container]\nimage = \"{IMAGE}\"\n\
         [profile.container.net]\negress = [\"allowed.test:8443\"]\n"
    )
}

/// The command run `k` of a box of `tier` runs: its connections opened together, then exit `k`.
fn script(tier: &str, k: usize) -> Vec<String> {
    let sh = |s: String| vec!["sh".to_string(), "-c".to_string(), s];
    match tier {
        "process" => sh(format!("echo run-{k} > run-{k}.txt; exit {k}")),
        "supervised" => vec![
            "python3".into(),
            "-c".into(),
            format!(
                "import socket, sys, threading\n\
                 def one():\n    s = socket.create_connection(('allowed.test', 8080), timeout=30)\n    \
                 print(s.recv(100).decode().strip()); s.close()\n\
                 ts = [threading.Thread(target=one) for _ in range({CONNS})]\n\
                 [t.start() for t in ts]; [t.join() for t in ts]\n\
                 sys.exit({k})"
            ),
        ],
        _ => sh(format!(
            "for i in $(seq {CONNS}); do \
               (printf 'CONNECT allowed.test:8443 HTTP/1.1\\r\\nHost: allowed.test:8443\\r\\n\\r\\n' \
                 | nc -w 30 127.0.0.1 3128 | head -c 200 | tr -d '\\r' | tr '\\n' ' '; echo) & \
             done; wait; exit {k}"
        )),
    }
}

/// What `h5i ARGS` printed and how it ended, run with the engine user named, bounded by
/// [`RUN_LIMIT`].
struct Ran {
    code: Option<i32>,
    out: String,
    err: String,
}

fn h5i(repo: &Path, args: &[String], pin: &str, scratch: &Path) -> Ran {
    let id = format!(
        "{}-{}",
        args.get(2).map_or("x", String::as_str),
        output_id()
    );
    let (o, e) = (
        scratch.join(format!("{id}.out")),
        scratch.join(format!("{id}.err")),
    );
    let mut c = Command::new(H5I);
    c.args(args)
        .current_dir(repo)
        .env_remove("H5I_AGENT")
        .env_remove("H5I_DEFAULT_ISOLATION")
        .env_remove("H5I_CREDENTIAL_PROXY")
        .env("H5I_CONTAINER_USER", USER)
        .env("H5I_NO_PROBE_CACHE", "1")
        .env("H5I_TEST_HOSTS", pin)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap());
    let child = c.spawn().unwrap();
    let status = common::wait_bounded(child, RUN_LIMIT, &format!("h5i {args:?}"));
    Ran {
        code: status.code(),
        out: std::fs::read_to_string(&o).unwrap(),
        err: std::fs::read_to_string(&e).unwrap(),
    }
}

/// A number unique within this test process (names the captured output files).
fn output_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Peak h5i-side figures seen by the sampler.
#[derive(Default, Debug)]
struct Peak {
    rss_one: u64,
    rss_sum: u64,
    fds_one: usize,
    fds_sum: usize,
    processes: usize,
}

/// Every process of this build's h5i binaries (`h5i`, `h5i-runc`, `h5i-hook`, ...): its
/// executable is an `h5i*` file in the directory the `h5i` under test is in.
fn h5i_side_pids(bin_dir: &Path) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
                exe.parent() == Some(bin_dir)
                    && exe
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("h5i"))
            })
        })
        .collect()
}

fn rss_of(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb << 10)
}

fn fds_of(pid: i32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// Sample h5i-side memory and descriptors every 100 ms until `done`.
fn sample(bin_dir: &Path, done: &AtomicBool) -> Peak {
    let mut peak = Peak::default();
    while !done.load(Ordering::Relaxed) {
        let (mut rss_sum, mut fds_sum, mut n) = (0, 0, 0);
        for pid in h5i_side_pids(bin_dir) {
            let (Some(rss), Some(fds)) = (rss_of(pid), fds_of(pid)) else {
                continue;
            };
            n += 1;
            rss_sum += rss;
            fds_sum += fds;
            peak.rss_one = peak.rss_one.max(rss);
            peak.fds_one = peak.fds_one.max(fds);
        }
        peak.rss_sum = peak.rss_sum.max(rss_sum);
        peak.fds_sum = peak.fds_sum.max(fds_sum);
        peak.processes = peak.processes.max(n);
        std::thread::sleep(Duration::from_millis(100));
    }
    peak
}

/// `name`'s receipt log: every line whole JSON, newline-terminated; the records.
fn whole_receipts(r: &Repo, name: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(r.box_dir(name).join("receipts.jsonl")).unwrap();
    assert!(text.ends_with('\n'), "{name}: torn last receipt line");
    text.lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: torn receipt {l:?}: {e}"))
        })
        .collect()
}

#[test]
fn twenty_boxes_of_mixed_tiers_at_once_lose_no_receipt_and_stay_bounded() {
    let test = "twenty_boxes_of_mixed_tiers_at_once_lose_no_receipt_and_stay_bounded";
    if !common::require_root(
        test,
        &format!("h5i runs rootless Podman as {USER}; supervised boxes need netns"),
    ) {
        return;
    }
    common::caller::container_image();
    let mut hosts = TestHosts::up(test, &[8080, 8443], &[]).unwrap();
    let pin = hosts.pin(&[("allowed.test", hosts.first)]);
    let r = Repo::new();
    r.write_policy(&policy());
    let scratch = tempfile::tempdir().unwrap();
    let prefix = format!("load{}", std::process::id());
    let boxes: Vec<(String, &str)> = TIERS
        .iter()
        .flat_map(|(tier, n)| (0..*n).map(move |i| (*tier, i)))
        .map(|(tier, i)| (format!("{prefix}-{tier}-{i}"), tier))
        .collect();
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for (name, tier) in &boxes {
        let made = h5i(
            r.path(),
            &args(&["box", "create", name, "--profile", tier]),
            &pin,
            scratch.path(),
        );
        assert_eq!(made.code, Some(0), "create {name}: {}", made.err);
    }
    let bin_dir: PathBuf = Path::new(H5I)
        .canonicalize()
        .unwrap()
        .parent()
        .unwrap()
        .into();
    let runs_of = |name: &str, tier: &str| -> Vec<Ran> {
        (0..RUNS)
            .map(|k| {
                let mut a = args(&["box", "run", name, "--"]);
                a.extend(script(tier, k));
                h5i(r.path(), &a, &pin, scratch.path())
            })
            .collect()
    };
    // Baseline, in the same run: every box's runs one box at a time.
    let started = Instant::now();
    let serial: Vec<Vec<Ran>> = boxes
        .iter()
        .map(|(name, tier)| runs_of(name, tier))
        .collect();
    let serial_took = started.elapsed();
    // The load: every box's runs at once, h5i's side sampled throughout.
    let done = AtomicBool::new(false);
    let started = Instant::now();
    let (peak, concurrent) = std::thread::scope(|s| {
        let sampler = s.spawn(|| sample(&bin_dir, &done));
        let runs: Vec<_> = boxes
            .iter()
            .map(|(name, tier)| {
                let runs_of = &runs_of;
                s.spawn(move || runs_of(name, tier))
            })
            .collect();
        let ran: Vec<Vec<Ran>> = runs.into_iter().map(|h| h.join().unwrap()).collect();
        done.store(true, Ordering::Relaxed);
        (sampler.join().unwrap(), ran)
    });
    let took = started.elapsed();
    let ran: Vec<Vec<Ran>> = serial
        .into_iter()
        .zip(concurrent)
        .map(|(mut one, at_once)| {
            one.extend(at_once);
            one
        })
        .collect();

    let mut receipts = 0;
    let mut expected_at_host = 0;
    for ((name, tier), ran) in boxes.iter().zip(&ran) {
        for (k, run) in ran.iter().enumerate() {
            assert_eq!(
                run.code,
                Some((k % RUNS) as i32),
                "{name} run {k}: {}{}",
                run.out,
                run.err
            );
            // The connections' output lines may interleave: count answers, not lines.
            let greeting = match *tier {
                "process" => continue,
                "supervised" => format!("hello {}:8080", hosts.first),
                _ => {
                    let answers = run.out.matches("HTTP/1.1 ").count();
                    let through = run.out.matches("HTTP/1.1 200 ").count();
                    assert_eq!(
                        (answers, through),
                        (CONNS, CONNS),
                        "{name} run {k}: not every tunnel went through: {}{}",
                        run.out,
                        run.err
                    );
                    format!("hello {}:8443", hosts.first)
                }
            };
            assert_eq!(
                run.out.matches(&greeting).count(),
                CONNS,
                "{name} run {k}: not every connection reached the host: {}{}",
                run.out,
                run.err
            );
            expected_at_host += CONNS;
        }
        let all = whole_receipts(&r, name);
        let runs: Vec<&serde_json::Value> = all
            .iter()
            .filter(|rec| rec["lane"] == "host-env-run")
            .collect();
        let codes: Vec<i64> = runs
            .iter()
            .map(|rec| rec["exit"]["code"].as_i64().unwrap())
            .collect();
        assert_eq!(
            codes,
            (0..2 * RUNS as i64)
                .map(|k| k % RUNS as i64)
                .collect::<Vec<_>>(),
            "{name}: the receipt log does not hold exactly its runs"
        );
        for rec in &runs {
            assert_eq!(rec["tier"], *tier, "{name}: {rec}");
            let dest = match *tier {
                "process" => continue,
                "supervised" => "allowed.test:8080",
                _ => "allowed.test:8443",
            };
            assert_eq!(rec["egress"]["allowed"][dest], CONNS, "{name}: {rec}");
            let denied = &rec["egress"]["denied"];
            assert!(
                denied.as_object().is_none_or(|d| d.is_empty()),
                "{name}: {rec}"
            );
        }
        receipts += runs.len();
    }
    let reached = hosts.log();
    assert_eq!(
        reached.len(),
        expected_at_host,
        "the test host saw {} connections",
        reached.len()
    );
    assert!(
        peak.rss_one < RSS_BOUND,
        "an h5i process held {} MiB",
        peak.rss_one >> 20
    );
    assert!(
        peak.fds_one < FD_BOUND,
        "an h5i process held {} fds",
        peak.fds_one
    );

    let mut left = BTreeMap::new();
    for (name, _) in &boxes {
        let rm = h5i(
            r.path(),
            &args(&["box", "rm", "--force", name]),
            &pin,
            scratch.path(),
        );
        assert_eq!(rm.code, Some(0), "rm {name}: {}", rm.err);
        let dirs: Vec<PathBuf> = std::fs::read_dir(r.h5i_dir().join("env"))
            .unwrap()
            .flatten()
            .map(|agent| agent.path().join(name))
            .filter(|d| d.exists())
            .collect();
        if !dirs.is_empty() {
            left.insert(name.clone(), dirs);
        }
    }
    assert!(left.is_empty(), "box directories left after rm: {left:?}");
    let ps = common::as_user(USER, None)
        .args(["podman", "ps", "-a", "--format", "{{.Names}}"])
        .current_dir("/")
        .output()
        .unwrap();
    let containers: Vec<String> = stdout(&ps)
        .lines()
        .filter(|n| n.starts_with(&format!("h5i-{prefix}-")))
        .map(str::to_string)
        .collect();
    assert!(containers.is_empty(), "containers left: {containers:?}");
    eprintln!(
        "box-load: {} boxes at once ({}), {RUNS} runs each, {CONNS} connections per supervised \
         or container run: all in {:.1} s; the same runs one box at a time (baseline, same \
         test): {:.1} s ({:.2}x); {receipts} run receipts counted, {expected_at_host} \
         connections seen by the test host\n\
         box-load: h5i-side peak: {} processes, RSS {:.1} MiB in one ({:.1} MiB summed), \
         {} fds in one ({} summed)",
        boxes.len(),
        TIERS
            .iter()
            .map(|(t, n)| format!("{n} {t}"))
            .collect::<Vec<_>>()
            .join(", "),
        took.as_secs_f64(),
        serial_took.as_secs_f64(),
        took.as_secs_f64() / serial_took.as_secs_f64(),
        peak.processes,
        peak.rss_one as f64 / 1048576.0,
        peak.rss_sum as f64 / 1048576.0,
        peak.fds_one,
        peak.fds_sum,
    );
}
