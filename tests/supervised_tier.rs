//! The supervised tier, asserted from inside real boxes: the only way out is the pinned egress
//! table; names come from a hosts file; the socket() gate refuses and counts; the receipt's
//! tally matches what the box attempted; `status` and `capabilities` show the table loaded.
//! Every destination is one of this test's own hosts (tests/common/testnet.rs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Output;

use common::testnet::TestHosts;
use common::{labelled_results as results, stderr, stdout, Repo};

/// Python run inside the box: each check prints `name=result`, where result is the greeting,
/// `ok`, or `err:ERRNO_NAME`.
const CLIENT: &str = r#"
import errno, socket, sys
def name(e):
    return "err:" + (errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__)
def tcp(label, host, port):
    try:
        s = socket.create_connection((host, port), timeout=3)
        print("%s=%s" % (label, s.recv(100).decode().strip())); s.close()
    except OSError as e:
        print("%s=%s" % (label, name(e)))
def make(label, *args):
    try:
        socket.socket(*args).close(); print("%s=ok" % label)
    except OSError as e:
        print("%s=%s" % (label, name(e)))
for spec in sys.argv[1:]:
    kind, _, rest = spec.partition(":")
    if kind == "tcp":
        label, host, port = rest.split(",")
        tcp(label, host, int(port))
    elif kind == "udp":
        label, host, port = rest.split(",")
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendto(b"x", (host, int(port))); print("%s=sent" % label)
        except OSError as e:
            print("%s=%s" % (label, name(e)))
    elif kind == "sock":
        fam, typ, proto = rest.split(",")
        make("sock_" + fam + "_" + typ, getattr(socket, fam), getattr(socket, typ), int(proto))
    elif kind == "pair":
        try:
            a, b = socket.socketpair(); a.close(); b.close(); print("socketpair=ok")
        except OSError as e:
            print("socketpair=%s" % name(e))
    elif kind == "write":
        try:
            open(rest, "a").write("198.19.0.3 allowed.test\n"); print("write=ok")
        except OSError as e:
            print("write=%s" % name(e))
"#;

fn supervised_box(r: &Repo, name: &str, hosts: &TestHosts, unix: bool) -> String {
    r.write_policy(&format!(
        "[profile.sup]\nisolation = \"supervised\"\n[profile.sup.net]\negress = [\"allowed.test:8080\"]\nunix = {unix}\n"
    ));
    let pin = hosts.pin(&[("allowed.test", hosts.first)]);
    let out = r.h5i_env(
        &["box", "create", name, "--profile", "sup"],
        &[("H5I_TEST_HOSTS", &pin)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    pin
}

fn run_in(r: &Repo, name: &str, pin: &str, argv: &[&str]) -> Output {
    let mut args = vec!["box", "run", name, "--"];
    args.extend_from_slice(argv);
    r.h5i_env(&args, &[("H5I_TEST_HOSTS", pin)])
}

#[test]
fn only_the_pinned_destination_is_reachable_and_the_tally_matches_the_attempts() {
    let Some(mut hosts) = TestHosts::up("supervised egress", &[8080, 9090], &[5353]) else {
        return;
    };
    let loopback = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    loopback.set_nonblocking(true).unwrap();
    let lport = loopback.local_addr().unwrap().port();
    let r = Repo::new();
    let pin = supervised_box(&r, "sup", &hosts, false);
    let (first, second) = (hosts.first.to_string(), hosts.second.to_string());
    let checks = [
        "tcp:allowed,allowed.test,8080".to_string(),
        "tcp:again,allowed.test,8080".to_string(),
        "tcp:other_port,allowed.test,9090".to_string(),
        format!("tcp:second_host,{second},8080"),
        format!("udp:udp,{first},5353"),
        format!("tcp:host_loopback,127.0.0.1,{lport}"),
        format!("tcp:uplink_gateway,10.0.2.2,{lport}"),
        "tcp:unlisted_name,example.com,80".to_string(),
        "write:/etc/hosts".to_string(),
    ];
    let mut argv = vec!["python3", "-c", CLIENT];
    argv.extend(checks.iter().map(String::as_str));
    let out = run_in(&r, "sup", &pin, &argv);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let got = results(&out);
    let greeting = format!("hello {first}:8080");
    assert_eq!(got["allowed"], greeting, "{got:?}");
    assert_eq!(got["again"], greeting, "{got:?}");
    for refused in ["other_port", "second_host", "uplink_gateway"] {
        assert!(got[refused].starts_with("err:"), "{refused}: {got:?}");
    }
    // The box's loopback is its own: nothing listens there.
    assert_eq!(got["host_loopback"], "err:ECONNREFUSED", "{got:?}");
    // No resolver: a name outside the hosts file does not resolve at all.
    assert!(got["unlisted_name"].starts_with("err:"), "{got:?}");
    // The pinned names cannot be re-pointed from inside.
    assert!(
        got["write"] == "err:EROFS" || got["write"] == "err:EACCES",
        "{got:?}"
    );
    assert!(
        loopback.accept().is_err(),
        "the host loopback listener was reached"
    );
    let log = hosts.log();
    assert_eq!(
        log,
        vec![format!("tcp {first}:8080"), format!("tcp {first}:8080")],
        "the test hosts saw exactly the two allowed connections"
    );

    let rec = r.last_run("sup");
    assert_eq!(rec["tier"], "supervised");
    let egress = &rec["egress"];
    assert_eq!(egress["allowed"]["allowed.test:8080"], 2, "{rec}");
    let denied = egress["denied"].as_object().unwrap();
    for key in [
        format!("{first}:9090/tcp"),
        format!("{second}:8080/tcp"),
        format!("{first}:5353/udp"),
        format!("10.0.2.2:{lport}/tcp"),
    ] {
        assert!(
            denied.get(&key).and_then(|v| v.as_u64()).unwrap_or(0) >= 1,
            "{key} not counted as denied: {rec}"
        );
    }
    assert!(
        !denied
            .keys()
            .any(|k| k.starts_with(&format!("{first}:8080"))),
        "{rec}"
    );

    // status and capabilities show the table the sentry loaded.
    let status = r.ok(&["box", "status", "sup"]);
    assert!(
        status.contains(&format!("allowed.test:8080 -> {first}")),
        "{status}"
    );
    let caps: serde_json::Value =
        serde_json::from_str(&r.ok(&["box", "capabilities", "sup", "--json"])).unwrap();
    assert_eq!(caps["tier"], "supervised");
    assert_eq!(
        caps["egress_table"]["rules"][0],
        serde_json::json!({"host": "allowed.test", "port": 8080, "addrs": [first]})
    );
    assert!(caps["egress_table"]["digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
}

#[test]
fn the_socket_gate_refuses_and_counts_every_family_it_does_not_allow() {
    let Some(hosts) = TestHosts::up("supervised socket gate", &[8080], &[]) else {
        return;
    };
    let r = Repo::new();
    let pin = supervised_box(&r, "gate", &hosts, false);
    let out = run_in(
        &r,
        "gate",
        &pin,
        &[
            "python3",
            "-c",
            CLIENT,
            "sock:AF_INET,SOCK_STREAM,0",
            "sock:AF_INET,SOCK_DGRAM,0",
            "sock:AF_INET,SOCK_RAW,1",
            "sock:AF_PACKET,SOCK_RAW,0",
            "sock:AF_NETLINK,SOCK_RAW,0",
            "sock:AF_UNIX,SOCK_STREAM,0",
            "pair:",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let got = results(&out);
    assert_eq!(got["sock_AF_INET_SOCK_STREAM"], "ok", "{got:?}");
    assert_eq!(got["sock_AF_INET_SOCK_DGRAM"], "ok", "{got:?}");
    for denied in [
        "sock_AF_INET_SOCK_RAW",
        "sock_AF_PACKET_SOCK_RAW",
        "sock_AF_NETLINK_SOCK_RAW",
        "sock_AF_UNIX_SOCK_STREAM",
    ] {
        assert_eq!(got[denied], "err:EPERM", "{denied}: {got:?}");
    }
    assert_eq!(got["socketpair"], "ok", "{got:?}");
    let gate = &r.last_run("gate")["socket_gate"];
    for fam in ["inet-raw", "packet", "netlink", "unix"] {
        assert!(
            gate["denied"][fam].as_u64().unwrap_or(0) >= 1,
            "{fam} not counted: {gate}"
        );
    }
    assert!(gate["allowed"]["inet"].as_u64().unwrap_or(0) >= 2, "{gate}");

    // nft inside the box cannot touch the table (and its netlink socket is refused).
    let nft = run_in(
        &r,
        "gate",
        &pin,
        &["nft", "add", "rule", "inet", "h5i", "output", "accept"],
    );
    assert_ne!(nft.status.code(), Some(0), "nft changed the box's table");
    let again = run_in(
        &r,
        "gate",
        &pin,
        &[
            "python3",
            "-c",
            CLIENT,
            &format!("tcp:second_host,{},8080", hosts.second),
        ],
    );
    assert!(
        results(&again)["second_host"].starts_with("err:"),
        "{}",
        stdout(&again)
    );
}

#[test]
fn unix_sockets_pass_the_gate_when_the_profile_allows_them() {
    let Some(hosts) = TestHosts::up("supervised unix", &[8080], &[]) else {
        return;
    };
    let r = Repo::new();
    let pin = supervised_box(&r, "unix", &hosts, true);
    let out = run_in(
        &r,
        "unix",
        &pin,
        &["python3", "-c", CLIENT, "sock:AF_UNIX,SOCK_STREAM,0"],
    );
    assert_eq!(
        results(&out)["sock_AF_UNIX_SOCK_STREAM"],
        "ok",
        "{}",
        stderr(&out)
    );
    let gate = &r.last_run("unix")["socket_gate"];
    assert!(gate["allowed"]["unix"].as_u64().unwrap_or(0) >= 1, "{gate}");
}

#[test]
fn an_explicit_supervised_tier_fails_closed_naming_a_missing_prerequisite() {
    // A PATH with git but no pasta: the uplink cannot be made, so the tier is refused.
    let bin = common::path_with_only(&["git", "nft"]);
    let r = Repo::new();
    let path = bin.path().display().to_string();
    let out = r.h5i_env(
        &["box", "create", "nope", "--isolation", "supervised"],
        &[("PATH", &path)],
    );
    assert_ne!(out.status.code(), Some(0));
    let e = stderr(&out);
    assert!(e.contains("pasta") && e.contains("to fix"), "{e}");
    assert!(
        !r.h5i_dir().join("env").exists()
            || std::fs::read_dir(r.h5i_dir().join("env"))
                .unwrap()
                .all(|a| std::fs::read_dir(a.unwrap().path())
                    .unwrap()
                    .next()
                    .is_none())
    );
}

#[test]
fn auto_picks_the_supervised_tier_on_this_host() {
    let r = Repo::new();
    r.ok(&["box", "create", "auto"]);
    assert_eq!(r.manifest("auto")["tier"], "supervised");
}

/// The core claims again as the unprivileged h5i-test user: the allowed test host answers, the
/// second does not, AF_PACKET is refused, and the receipt counts it.
#[test]
fn an_unprivileged_user_gets_the_same_supervised_network() {
    let Some(mut hosts) = TestHosts::up("supervised as h5i-test", &[8080], &[]) else {
        return;
    };
    let (dir, _) = common::unprivileged_tree(common::TEST_USER, &[]);
    let repo = dir.path().join("repo");
    let bin = dir.path().join("bin");
    // Read by python3 on stdin: no write descriptor to an executable is involved.
    std::fs::write(dir.path().join("client.py"), CLIENT).unwrap();
    let script = format!(
        r#"set -e
        cd {repo}
        git init -q -b main .
        mkdir .h5i
        printf '[profile.sup]\nisolation = "supervised"\n[profile.sup.net]\negress = ["allowed.test:8080"]\n' > .h5i/env.toml
        git add -A
        git -c user.name=u -c user.email=u@x commit -qm i
        {h5i} box create u --profile sup >/dev/null
        {h5i} box run u -- python3 - tcp:allowed,allowed.test,8080 tcp:second,{second},8080 sock:AF_PACKET,SOCK_RAW,0 < ../client.py
        "#,
        repo = repo.display(),
        h5i = bin.join("h5i").display(),
        second = hosts.second,
    );
    let pin = hosts.pin(&[("allowed.test", hosts.first)]);
    let out = common::as_user(common::TEST_USER, Some("/tmp"))
        .arg(format!("H5I_TEST_HOSTS={pin}"))
        .args(["bash", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let got = results(&out);
    assert_eq!(
        got["allowed"],
        format!("hello {}:8080", hosts.first),
        "{got:?}"
    );
    assert!(got["second"].starts_with("err:"), "{got:?}");
    assert_eq!(got["sock_AF_PACKET_SOCK_RAW"], "err:EPERM", "{got:?}");
    assert_eq!(hosts.log(), vec![format!("tcp {}:8080", hosts.first)]);
    let receipts =
        std::fs::read_to_string(repo.join(".git/.h5i/env/none/u/receipts.jsonl")).unwrap();
    let rec: serde_json::Value = serde_json::from_str(receipts.lines().last().unwrap()).unwrap();
    assert_eq!(rec["egress"]["allowed"]["allowed.test:8080"], 1, "{rec}");
    assert_eq!(rec["socket_gate"]["denied"]["packet"], 1, "{rec}");
}

/// The uplink's sandbox detaches its old root inside a mount namespace of its own; started from
/// the host's namespace with shared mounts, that detach once propagated back and unmounted every
/// `/run/netns/*` name on the host. A host netns name made before the run must still be mounted,
/// and usable, after it.
#[test]
fn a_supervised_run_leaves_the_hosts_shared_mounts_mounted() {
    if !common::require_root(
        "a_supervised_run_leaves_the_hosts_shared_mounts_mounted",
        "naming a network namespace on the host",
    ) {
        return;
    }
    let ns = format!("h5i-mnt{}", std::process::id());
    common::testnet::ip(&["netns", "add", &ns]).unwrap();
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(&format!("/run/netns/{ns}")))
    };
    assert!(mounted(), "ip netns add made no mount");
    let r = Repo::new();
    r.write_policy("[profile.sup]\nisolation = \"supervised\"\n");
    r.ok(&["box", "create", "mnt", "--profile", "sup"]);
    r.ok(&["box", "run", "mnt", "--", "true"]);
    let still = mounted();
    let used = common::testnet::ip(&["-n", &ns, "link", "show", "lo"]);
    let _ = common::testnet::ip(&["netns", "del", &ns]);
    assert!(
        still,
        "a supervised run unmounted the host's /run/netns/{ns}"
    );
    used.unwrap();
}

/// Run inside a rootful box: its gateway (the host side of its veth pair) from its routing
/// table, then each check as `name=result`.
const VETH_PROBE: &str = r#"
import errno, socket, struct, subprocess, sys
def name(e):
    return "err:" + (errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__)
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    if f[1] == "00000000":
        gw = socket.inet_ntoa(struct.pack("<L", int(f[2], 16)))
        print("gateway=" + gw)
for spec in sys.argv[1:]:
    kind, _, rest = spec.partition(":")
    if kind == "tcp":
        label, host, port = rest.split(",")
        if host == "GATEWAY":
            host = gw
        try:
            s = socket.create_connection((host, int(port)), timeout=3)
            print("%s=%s" % (label, s.recv(100).decode().strip())); s.close()
        except OSError as e:
            print("%s=%s" % (label, name(e)))
    elif kind == "raw":
        try:
            socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close(); print("raw=ok")
        except OSError as e:
            print("raw=%s" % name(e))
    elif kind == "cmd":
        label, _, argv = rest.partition(",")
        p = subprocess.run(argv.split(), capture_output=True, text=True)
        print("%s=%d %s" % (label, p.returncode, (p.stdout + p.stderr).strip().replace("\n", " | ")))
"#;

/// The host's device that holds the address `addr` (`ip -o -4 addr show to ADDR`).
fn host_device_with_addr(addr: &str) -> Option<String> {
    let out = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show", "to", addr])
        .output()
        .ok()?;
    stdout(&out).split_whitespace().nth(1).map(str::to_string)
}

/// Rootful, the uplink is a veth pair and the host's own forwarding. From inside: the allowed
/// host answers at the kernel's path; the box's gateway (the host side of its pair), the test
/// hosts' gateway (a host address), the host's loopback and another box's pair are out of reach;
/// the box cannot change its routes, its link or its table (EPERM) and raw sockets are EPERM.
/// On the host: the pair's host side forwards, the test hosts' device forwards replies only
/// under the host table's guard, and `box rm` leaves neither the device nor its record.
#[test]
fn the_rootful_veth_uplink_keeps_the_host_and_other_boxes_out_of_reach_and_leaves_nothing() {
    let Some(mut hosts) = TestHosts::up("rootful veth uplink", &[8080], &[]) else {
        return;
    };
    let loopback = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    loopback.set_nonblocking(true).unwrap();
    let lport = loopback.local_addr().unwrap().port();
    let on_gateway = std::net::TcpListener::bind((hosts.gateway, 0)).unwrap();
    on_gateway.set_nonblocking(true).unwrap();
    let gport = on_gateway.local_addr().unwrap().port();
    let r = Repo::new();
    let pin = supervised_box(&r, "veth", &hosts, false);
    let created = r.h5i_env(
        &["box", "create", "other", "--profile", "sup"],
        &[("H5I_TEST_HOSTS", &pin)],
    );
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    let out = run_in(&r, "other", &pin, &["python3", "-c", VETH_PROBE]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let other_gw: std::net::Ipv4Addr = results(&out)["gateway"].parse().unwrap();
    let other_inner = std::net::Ipv4Addr::from(u32::from(other_gw) + 1);

    let checks = [
        "tcp:allowed,allowed.test,8080".to_string(),
        format!("tcp:own_gateway,GATEWAY,{lport}"),
        format!("tcp:hosts_gateway,{},{gport}", hosts.gateway),
        format!("tcp:host_loopback,127.0.0.1,{lport}"),
        format!("tcp:other_gateway,{other_gw},{lport}"),
        format!("tcp:other_box,{other_inner},8080"),
        "raw:".to_string(),
        "cmd:route,ip route del default".to_string(),
        "cmd:link,ip link set h5i0 down".to_string(),
        "cmd:table,nft flush ruleset".to_string(),
        "tcp:still_allowed,allowed.test,8080".to_string(),
    ];
    let mut argv = vec!["python3", "-c", VETH_PROBE];
    argv.extend(checks.iter().map(String::as_str));
    let out = run_in(&r, "veth", &pin, &argv);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let got = results(&out);
    let greeting = format!("hello {}:8080", hosts.first);
    assert_eq!(got["allowed"], greeting, "{got:?}");
    assert_eq!(got["still_allowed"], greeting, "{got:?}");
    let gateway: std::net::Ipv4Addr = got["gateway"].parse().unwrap();
    assert_eq!(gateway.octets()[..2], [100, 127], "{got:?}");
    assert_ne!(gateway, other_gw, "two boxes share a pair: {got:?}");
    for refused in ["own_gateway", "hosts_gateway", "other_gateway", "other_box"] {
        assert!(got[refused].starts_with("err:"), "{refused}: {got:?}");
    }
    assert_eq!(got["host_loopback"], "err:ECONNREFUSED", "{got:?}");
    assert_eq!(got["raw"], "err:EPERM", "{got:?}");
    for (label, want) in [
        ("route", "Operation not permitted"),
        ("link", "Operation not permitted"),
        ("table", "Operation not permitted"),
    ] {
        assert!(
            !got[label].starts_with("0 ") && got[label].contains(want),
            "{label}: {got:?}"
        );
    }
    assert!(loopback.accept().is_err(), "the host loopback was reached");
    assert!(on_gateway.accept().is_err(), "a host address was reached");
    assert_eq!(
        hosts.log(),
        vec![format!("tcp {}:8080", hosts.first); 2],
        "the test hosts saw exactly the two allowed connections"
    );

    // The host side of the pair, its record, and the reply device's guarded forwarding.
    let host_dev = host_device_with_addr(&got["gateway"]).expect("the pair's host side");
    assert!(host_dev.starts_with("h5iu"), "{host_dev}");
    let flag = |dev: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{dev}/forwarding"))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(flag(&host_dev), "1");
    let record = std::path::Path::new("/run/h5i-uplink").join(&host_dev);
    assert!(record.exists(), "{}", record.display());
    let table = std::process::Command::new("nft")
        .args(["list", "table", "ip", "h5i_uplink"])
        .output()
        .unwrap();
    let table = stdout(&table);
    let hosts_dev = format!("h5is{}", hosts.gateway.octets()[2]);
    assert!(table.contains(&format!("\"{hosts_dev}\"")), "{table}");
    assert_eq!(flag(&hosts_dev), "1");

    r.ok(&["box", "rm", "--force", "veth"]);
    assert!(
        common::until(std::time::Duration::from_secs(15), || {
            !std::path::Path::new("/sys/class/net")
                .join(&host_dev)
                .exists()
                && !record.exists()
        }),
        "box rm left {host_dev} or its record"
    );
    r.ok(&["box", "rm", "--force", "other"]);
}
