//! One scripted agent session in a box, shared by `tests/agent_claude.rs` and
//! `tests/agent_codex.rs`: the repository with the broken greeting, the scripted model (with the
//! CA the credential proxy trusts for it, through h5i's test seams), the commands the model has
//! the agent run (the key scan and the reach-out to hosts outside the profile), and the checks
//! every agent row makes: the edit in `box diff` and in the export's patch, the real key at the
//! model service on every call and never the dummy, and the key nowhere the box or its export
//! holds.
//!
//! The model service and the denied host are test hosts of the test's own, each in a network
//! namespace it made (`common::testnet`, HOST.md's network rules); h5i is run as root or as the
//! unprivileged test user ([`Caller`]), every session bounded by [`SESSION_LIMIT`].
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::testnet::TestHosts;
use crate::common::{self, stderr, stdout, Caller, TEST_USER};
use crate::model::{Api, Kind, ModelService, Turn};
use crate::support::TestCa;

/// Where every confining tier shows the box its workspace.
pub const WORK: &str = "/work";

/// One agent runtime under test.
pub struct Agent {
    /// The built-in profile (`agent-claude`, `agent-codex`).
    pub profile: &'static str,
    /// The API its model service speaks, and the host the credential proxy serves it as.
    pub api: Api,
    pub host: &'static str,
    /// The other agent's API host, outside this agent's profile: its box asks for it directly
    /// and through its own base URL ([`reach_out`]), and both are refused.
    pub other_host: &'static str,
    /// The variable holding the host's real key, and that key.
    pub key_var: &'static str,
    pub real: &'static str,
    /// The header the real key must arrive in, and its value's prefix (`Bearer ` or none).
    pub key_header: &'static str,
    pub key_prefix: &'static str,
    /// The image `make images` builds for its container-tier row.
    pub image: &'static str,
}

/// How long one scripted session may take before the test kills it and fails (the sessions
/// measured in BENCHMARKS.md take seconds): a hung agent fails its test, never CI.
pub const SESSION_LIMIT: Duration = Duration::from_secs(300);

/// The scripted model on a test host of its own (`agent.host` pinned to it, port 443), the CA
/// file the proxy trusts for it, and a HOME with no agent config, both owned by the caller.
pub struct Model {
    pub service: ModelService,
    _net: TestHosts,
    _dir: tempfile::TempDir,
    ca_file: String,
    home: String,
    hosts: String,
    turns: usize,
}

impl Model {
    /// `None` (after `skipped:`) when this process cannot make network namespaces.
    pub fn start(test: &str, agent: &Agent, c: &Caller, turns: Vec<Turn>) -> Option<Model> {
        let net = TestHosts::up(test, &[], &[])?;
        let ca = TestCa::new();
        let n = turns.len();
        let service = ModelService::serve(
            net.listen(net.first, 443),
            ca.server_config(&[agent.host]),
            agent.api,
            turns,
        );
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.der");
        std::fs::write(&ca_file, &ca.ca_der).unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        for p in [dir.path(), &ca_file, &home] {
            std::os::unix::fs::chown(p, Some(c.uid()), Some(c.uid())).unwrap();
        }
        Some(Model {
            hosts: format!("{}={}", agent.host, service.addr),
            service,
            _net: net,
            ca_file: ca_file.display().to_string(),
            home: home.display().to_string(),
            turns: n,
            _dir: dir,
        })
    }

    /// h5i's environment: the host's real key and the seams that point the proxy here.
    pub fn env<'a>(&'a self, agent: &'a Agent) -> Vec<(&'a str, &'a str)> {
        vec![
            (agent.key_var, agent.real),
            ("H5I_TEST_HOSTS", self.hosts.as_str()),
            ("H5I_TEST_CA_FILE", self.ca_file.as_str()),
            ("HOME", self.home.as_str()),
        ]
    }
}

/// Whether the test runs (root: it makes network namespaces, and runs h5i as root or switches
/// to the test user), and the agent `make setup` installs is there.
pub fn have_agent(test: &str, binary: &str) -> bool {
    if !common::require_root(
        test,
        "boxes as root and as h5i-test, and test hosts in netns",
    ) {
        return false;
    }
    assert!(
        Path::new(binary).exists(),
        "{binary} is missing: run `make setup` (it installs the pinned Claude Code and Codex)"
    );
    true
}

/// The pinned version `make setup` installs (images/agent-versions.env).
pub fn pinned(var: &str) -> String {
    let pins = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("images/agent-versions.env"),
    )
    .unwrap();
    pins.lines()
        .find_map(|l| l.strip_prefix(&format!("{var}=")))
        .unwrap_or_else(|| panic!("no {var} in images/agent-versions.env"))
        .to_owned()
}

/// Whether the container tier's engine user has `image` (built by `make images`, not by `make
/// setup`); when it does not, says `skipped:` loudly with the mend.
pub fn image_built(test: &str, image: &str) -> bool {
    let exists = std::process::Command::new("runuser")
        .args(["-u", TEST_USER, "--", "podman", "image", "exists", image])
        .current_dir("/")
        .status()
        .is_ok_and(|s| s.success());
    if !exists {
        h5i_testsupport::skipped!(
            "{test}: the image {image} is not built on this host (run `make images`)"
        );
    }
    exists
}

/// A command the model runs in the box: two hosts outside the profile, by name (`denied.test`,
/// never resolved by the system: the box's proxy refuses it by name, or the box has no
/// resolver) and by address (`denied_ip`, a test host of the test's own, see [`DeniedHost`]),
/// `other_host` (the other agent's API) directly, and `other_host`'s model list through this
/// agent's base URL (`models_url`, a shell expression), which the credential proxy must refuse
/// (421). Prints `denied=CODE`, `ip=CODE`, `direct=STATUS` (000: no HTTP answer came) and
/// `other=STATUS`.
pub fn reach_out(models_url: &str, other_host: &str, denied_ip: Ipv4Addr) -> String {
    format!(
        "curl -sS -m 10 -o /dev/null -w 'denied=%{{http_connect}}\\n' https://denied.test/; \
         curl -sS -m 5 -o /dev/null -w 'ip=%{{http_code}}\\n' https://{denied_ip}/; \
         curl -sS -m 10 -o /dev/null -w 'direct=%{{http_code}}\\n' https://{other_host}/v1/models; \
         curl -sS -m 10 -o /dev/null -w 'other=%{{http_code}}\\n' -H 'Host: {other_host}' \
         \"{models_url}\"; true"
    )
}

/// The proposal every scripted session stages (the skill's `proposal` page: a file named
/// `proposal.md` in the spool), and the command that stages it; it prints `staged`.
pub const PROPOSAL: &str = "Fixed the greeting: helo wrld is now hello world.";

pub fn stage_proposal() -> String {
    format!("printf '%s\\n' '{PROPOSAL}' > \"$H5I_ENV_CAPTURE_SPOOL/proposal.md\" && echo staged")
}

/// The report's "The agent's proposal" section.
pub fn proposal_section(report: &str) -> &str {
    report
        .split("## The agent's proposal")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .unwrap_or("")
}

/// A test host outside every agent profile, listening on 443 in the test's own network
/// namespace, for the model to try to reach.
pub struct DeniedHost {
    hosts: TestHosts,
}

impl DeniedHost {
    /// `None` (after `skipped:`) when this process cannot make network namespaces.
    pub fn up(test: &str) -> Option<DeniedHost> {
        TestHosts::up(test, &[443], &[]).map(|hosts| DeniedHost { hosts })
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.hosts.first
    }

    /// After the session: the host was never reached, and the export's report lists under
    /// "Denied egress attempts" what refused the script's reach-out: at every tier the
    /// credential proxy for `agent`'s host, which refused the request for the other API's host
    /// (counted under its own host); at the process and supervised tiers the box's egress
    /// table (deny-all at the process tier), which refused and counted the connection to the
    /// test host; at the container tier the box's
    /// egress proxy, which refused the CONNECT to it, to `denied.test` and to the other API's
    /// host. (At the supervised tier the direct request for the other API's host has no name to
    /// go to: the box's `/etc/hosts` holds only its profile's hosts and there is no resolver.) No
    /// tier's report says anything went uncounted.
    pub fn was_refused(mut self, agent: &Agent, tier: &str, report: &str) {
        assert_eq!(
            self.hosts.log(),
            Vec::<String>::new(),
            "the denied host was reached"
        );
        let denied = denied_section(report);
        let mut keys = vec![format!("`{}:443` refused", agent.host)];
        match tier {
            "process" | "supervised" => keys.push(format!("{}:443/tcp", self.ip())),
            "container" => keys.extend([
                format!("{}:443", self.ip()),
                "denied.test:443".into(),
                format!("{}:443", agent.other_host),
            ]),
            _ => {}
        }
        for key in keys {
            assert!(denied.contains(&key), "{key}: {report}");
        }
        assert!(!denied.contains("Not counted"), "{report}");
    }
}

/// A command the model runs in the box: it looks for the host's real key (passed in two
/// halves, so the whole key is in no argv and no transcript) in its environment, every
/// `/proc/*/environ` it can read, HOME, the workspace, `/tmp` and the spool, and prints
/// `hits=[...]`; and it
/// opens h5i's skill where the agent reads it (its config directory in HOME, or Codex's system
/// skills) for appending and prints `skill=refused ERRNO` when the box refused it (EROFS, or
/// EACCES from Landlock), `skill=writable`, or `skill=missing` when there is none.
pub fn scan_command(real: &str) -> String {
    let (a, b) = real.split_at(12);
    let script = r#"
import os, sys
real = (sys.argv[1] + sys.argv[2]).encode()
hits = [k for k, v in os.environ.items() if real in v.encode()]
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if real in open("/proc/%s/environ" % p, "rb").read():
                hits.append("/proc/%s/environ" % p)
        except OSError:
            pass
for top in (os.environ["HOME"], os.getcwd(), "/tmp", os.environ["H5I_ENV_CAPTURE_SPOOL"]):
    for d, _, files in os.walk(top):
        for f in files:
            try:
                if real in open(os.path.join(d, f), "rb").read():
                    hits.append(os.path.join(d, f))
            except OSError:
                pass
print("hits=%s" % hits)
import errno
home = os.environ["HOME"]
skill = [p for p in (home + "/.claude/skills/h5i/SKILL.md", home + "/.codex/skills/h5i/SKILL.md",
                     "/etc/codex/skills/h5i/SKILL.md") if os.path.isfile(p)]
said = "missing"
if skill:
    try:
        open(skill[0], "a")
        said = "writable"
    except OSError as e:
        name = errno.errorcode.get(e.errno, str(e.errno))
        said = ("refused " if name in ("EROFS", "EACCES") else "") + name
print("skill=%s" % said)
"#;
    format!("python3 -c '{script}' {a} {b}")
}

/// A repository whose `greeting.txt` says `helo wrld`, owned by root or the test user (by
/// `as_user`), and a box `name` of `agent`'s profile at `tier` made by that caller.
pub fn greeting_box(agent: &Agent, name: &str, tier: &str, as_user: bool) -> Caller {
    let mut c = Caller::either(as_user);
    if tier == "container" {
        c = c.with_env("H5I_NO_PROBE_CACHE", "1");
        if !as_user {
            c = c.with_env("H5I_CONTAINER_USER", TEST_USER);
        }
    }
    c.write("greeting.txt", "helo wrld\n");
    c.commit_all("greeting");
    let mut create = vec![
        "box",
        "create",
        name,
        "--profile",
        agent.profile,
        "--isolation",
        tier,
    ];
    if tier == "container" {
        create.extend(["--image", agent.image]);
    }
    c.ok(&create);
    c
}

/// Run `argv` in box `name` against `m` (bounded by [`SESSION_LIMIT`]) and check the session:
/// it ended 0 having played every turn in order with no disagreement and printed `finish`;
/// every model call carried the real key and no request the dummy; the file is fixed in the
/// workspace, in `box diff` and in the export's patch; nothing the box directory or the export
/// holds has the key. Returns the export's report.md.
pub fn check_session(
    agent: &Agent,
    c: &mut Caller,
    name: &str,
    tier: &str,
    m: &Model,
    argv: &[&str],
    finish: &str,
) -> String {
    let mut args = vec!["box", "run", name, "--"];
    args.extend(argv);
    let who = c.who();
    let started = std::time::Instant::now();
    let out = c.h5i_bounded(&args, &m.env(agent), SESSION_LIMIT);
    eprintln!(
        "{} scripted session at {tier} as {who}: {:.2} s",
        agent.profile,
        started.elapsed().as_secs_f64()
    );
    let reqs = m.service.requests();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{who}: {}\n{}\nproblems: {:?}\nrequests: {:?}",
        stdout(&out),
        stderr(&out),
        m.service.problems(),
        reqs.iter()
            .map(|l| (&l.kind, &l.seen.path))
            .collect::<Vec<_>>()
    );
    assert!(
        m.service.problems().is_empty(),
        "{:?}",
        m.service.problems()
    );
    let served = m.service.turns_served();
    let mut once = served.clone();
    once.dedup();
    assert_eq!(once, (0..m.turns).collect::<Vec<_>>(), "{served:?}");
    assert!(stdout(&out).contains(finish), "{}", stdout(&out));

    // Every model call reached the service with the real key, never the box's dummy.
    let want = format!("{}{}", agent.key_prefix, agent.real);
    for l in reqs
        .iter()
        .filter(|l| matches!(l.kind, Kind::Turn(_) | Kind::Side))
    {
        assert_eq!(
            l.seen.header(agent.key_header),
            Some(want.as_str()),
            "{:?}",
            l.seen.path
        );
    }
    assert!(reqs
        .iter()
        .all(|l| !l.seen.all_text().contains("h5i-dummy-")));
    // The request for the other API's host was refused by the credential proxy and never
    // reached the model service.
    assert!(reqs.iter().all(|l| !l.seen.path.ends_with("/models")));

    assert_eq!(
        std::fs::read_to_string(c.workspace(name).join("greeting.txt")).unwrap(),
        "hello world\n"
    );
    let diff = c.ok(&["box", "diff", name]);
    assert!(diff.contains("+hello world"), "{diff}");
    let report = exported_patch_applies(c, name, agent.real);
    assert!(proposal_section(&report).contains(PROPOSAL), "{report}");
    // Nothing the box or its records hold has the key: the box directory (workspace, HOME,
    // spool, receipts) and the export.
    assert!(common::files_containing(&c.box_dir(name), agent.real.as_bytes()).is_empty());
    base_was_in_force(c, name, tier, &m.env(agent));
    report
}

/// The agent above ran under the default-deny seccomp base (`h5i-v2`, issue 20): the same box
/// answers a call the base leaves out with ENOSYS, where the host (no filter) answers it
/// itself. Checked after the export, so the probe is in no patch or report the test reads.
fn base_was_in_force(c: &mut Caller, name: &str, tier: &str, env: &[(&str, &str)]) {
    let host = Command::new(common::probe())
        .arg("unlisted")
        .output()
        .unwrap();
    assert!(
        stdout(&host).lines().any(|l| l == "kcmp=OK"),
        "{}",
        stdout(&host)
    );
    let probe = c.workspace(name).join("h5i-seccomp-probe");
    common::copy_program(common::probe(), &probe);
    let out = c.h5i_with(
        &["box", "run", name, "--", "./h5i-seccomp-probe", "unlisted"],
        env,
    );
    assert_eq!(out.status.code(), Some(0), "{tier}: {}", stderr(&out));
    let inside = stdout(&out);
    assert!(
        inside.lines().any(|l| l == "kcmp=ENOSYS"),
        "{tier}: the h5i-v2 base is not in force in the agent's box: {inside}"
    );
}

/// Export `name` as the caller; its report.md.
pub fn export_report(c: &Caller, name: &str) -> String {
    let out_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(out_dir.path(), Some(c.uid()), Some(c.uid())).unwrap();
    let review = out_dir.path().join("review");
    c.ok(&["box", "export", name, "--out", review.to_str().unwrap()]);
    std::fs::read_to_string(review.join("report.md")).unwrap()
}

/// Export `name` as the caller and apply its patch, as the caller, to a fresh clone of main:
/// the edit lands, and the export holds no credential. Returns the export's report.md.
pub fn exported_patch_applies(c: &Caller, name: &str, real: &str) -> String {
    let out_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(out_dir.path(), Some(c.uid()), Some(c.uid())).unwrap();
    let review = out_dir.path().join("review");
    c.ok(&["box", "export", name, "--out", review.to_str().unwrap()]);
    assert!(common::files_containing(&review, real.as_bytes()).is_empty());
    let out = c
        .sh_in(
            out_dir.path(),
            "git clone -q \"$1\" clone && cd clone && git apply --3way ../review/patch.diff",
        )
        .arg("sh")
        .arg(c.repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(
        std::fs::read_to_string(out_dir.path().join("clone/greeting.txt")).unwrap(),
        "hello world\n"
    );
    std::fs::read_to_string(review.join("report.md")).unwrap()
}

/// The report's "Denied egress attempts" section.
pub fn denied_section(report: &str) -> &str {
    report
        .split("## Denied egress attempts")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .unwrap_or("")
}

/// The report's "What ran" section.
pub fn what_ran_section(report: &str) -> &str {
    report
        .split("## What ran")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .unwrap_or("")
}

/// After the session: report.md's "What ran" lists the host-observed run of `program` and,
/// under it, in order, one line per tool call of the script (`calls`: the tool and how its
/// command or file starts), each in the `inbox-capture` lane (staged by h5i's hook from the
/// agent's read-only settings), box-claimed, staged before and after it ran; "Evidence
/// problems" names no half-claimed call; and box `name` stored one raw payload per hook call.
pub fn tool_calls_listed(
    c: &Caller,
    name: &str,
    report: &str,
    program: &str,
    calls: &[(&str, &str)],
) {
    let lane = "inbox-capture";
    let ran = what_ran_section(report);
    let listed = listed_under_run(report, program, lane);
    assert_eq!(listed.len(), calls.len(), "{ran}");
    for (line, (tool, what)) in listed.iter().zip(calls) {
        assert!(
            line.contains(&format!("`{lane}` (box-claimed) `{tool}`: `{what}"))
                && line.ends_with("— PreToolUse, PostToolUse"),
            "{tool} {what}: {line}\n{ran}"
        );
    }
    let problems = report.split("## Evidence problems").nth(1).unwrap_or("");
    assert!(!problems.contains("call started and never"), "{problems}");
    assert!(!problems.contains("could not read"), "{problems}");
    assert_eq!(payloads_of(c, name, lane).len(), 2 * calls.len());
}

/// The raw payloads box `name` stored for records of `lane`, in name order.
pub fn payloads_of(c: &Caller, name: &str, lane: &str) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(c.box_dir(name).join("payloads"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{lane}-")))
        })
        .collect();
    found.sort();
    found
}

/// The lines of report.md's "What ran" under the first host-observed run of `program` that
/// are box-claimed records of `lane` ([`under_run`]).
pub fn listed_under_run<'a>(report: &'a str, program: &str, lane: &str) -> Vec<&'a str> {
    under_run(report, program)
        .into_iter()
        .filter(|l| l.contains(&format!("`{lane}` (box-claimed)")))
        .collect()
}

/// Every line of report.md's "What ran" under the first host-observed run of `program` (the
/// run's command is `program` or starts with it), every lane's, in the report's order.
pub fn under_run<'a>(report: &'a str, program: &str) -> Vec<&'a str> {
    let ran = what_ran_section(report);
    let lines: Vec<&str> = ran
        .lines()
        .filter(|l| l.trim_start().starts_with("- #"))
        .collect();
    let run = lines
        .iter()
        .position(|l| {
            l.contains("`host-env-run` (host-observed)")
                && (l.contains(&format!(": `{program} ")) || l.contains(&format!(": `{program}` ")))
        })
        .unwrap_or_else(|| panic!("no host-observed run of {program}: {ran}"));
    lines[run + 1..]
        .iter()
        .take_while(|l| l.starts_with("  - #"))
        .copied()
        .collect()
}

/// The staging time a "What ran" line shows (` at ±S.mmm s`), in milliseconds from its run's
/// start.
pub fn staged_ms(line: &str) -> Option<i64> {
    let at = line.split(" at ").nth(1)?.split(" s ").next()?;
    let (sign, abs) = at.split_at(1);
    let (s, ms) = abs.split_once('.')?;
    let v = s.parse::<i64>().ok()? * 1000 + ms.parse::<i64>().ok()?;
    (sign == "+" || sign == "-").then_some(if sign == "-" { -v } else { v })
}

/// The report's "Evidence problems" section.
pub fn problems_section(report: &str) -> &str {
    report
        .split("## Evidence problems")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .unwrap_or("")
}
