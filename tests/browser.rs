//! The browser in a box, asserted with real Chromium driven by real agent-browser in real boxes,
//! as root and as the unprivileged test user, at the process and supervised tiers: the box serves
//! the demo app (`examples/browser-demo/`) on its own loopback (at process, as a declared box
//! service whose network namespace the run joins; at supervised, where this build has no
//! services, from the run itself); agent-browser opens it, reads it
//! as an accessibility tree with @refs, fills and clicks through those refs, and takes a
//! screenshot whose pixels are checked; Chrome runs with its own sandbox off, a fresh profile in
//! the box's private /tmp and a sized /dev/shm; `chat` is refused because the gateway credential
//! is never injected (the host has one set); `--allowed-domains` refuses a host outside the
//! policy inside Chrome, and at the supervised tier the pinned table refuses an allowed name on a
//! port it does not list (L4), which the run's receipt counts as denied; at the container tier
//! (the `localhost/h5i-browser` image `make images` builds) Chrome's egress goes through the
//! run's proxy, which refuses and counts the same unlisted port. At every tier the browser is the
//! box's `browser` sidecar (at supervised, in the network of the box's sandbox, so the page's
//! refused dial is counted in the run's receipt; at container, a container whose user and
//! network namespaces each run joins, driven by one run at a time): it outlives each
//! run, and h5i's relay in front of it
//! enforces the control lock (`h5i browser take|release`) and feeds "What the browser saw" in
//! report.md, after runs and terminal shell sessions alike; a hostile run that dials Chromium's
//! DevTools port, the daemon's stream port or the daemon's socket directly never completes a
//! handshake or finds the socket (the fence, `src/browser/fence.rs`). Every destination is loopback or one of this test's own hosts
//! (tests/common/testnet.rs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::testnet::TestHosts;
use common::{require_root, stderr, stdout, Caller};

/// The demo app every case serves, checked in for `make demo` too.
const DEMO_PAGE: &str = include_str!("../examples/browser-demo/index.html");

/// A gateway credential set in h5i's own environment: it must never reach the box.
const GATEWAY_KEY: &str = "h5i-test-gateway-key-never-injected";

/// The swatch the demo page paints at its top-left corner (`#swatch`).
const SWATCH_RGB: [u8; 3] = [0x1a, 0x7f, 0x37];

/// The box's dev server port (its own loopback).
const APP_PORT: u16 = 3000;

/// What every case runs in the box: wait for the demo app on the box's loopback, then one
/// agent-browser verb per step. Each step prints `== NAME`, its output, then `rc=N`.
/// `serve_in_run`: the run starts the dev server itself (the supervised tier, which has no
/// services in this build); otherwise the box's declared service `demo` serves it.
/// `close`: the script closes the browser at its end (a box-lifetime browser is left open for
/// the host to inspect).
fn drive_script(serve_in_run: bool, close: bool, extra_steps: &str) -> String {
    let serve = if serve_in_run {
        format!("python3 -m http.server {APP_PORT} --bind 127.0.0.1 >/tmp/app.log 2>&1 &")
    } else {
        String::new()
    };
    format!(
        r#"cd /work/app || exit 90
{serve}
python3 -c '
import socket, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", {APP_PORT}), 1).close(); break
    except OSError:
        time.sleep(0.05)
'
step() {{ name=$1; shift; echo "== $name"; "$@" 2>&1; echo "rc=$?"; }}
step open agent-browser open http://127.0.0.1:{APP_PORT}/
step snapshot agent-browser snapshot -i
email=$(agent-browser snapshot -i | sed -n 's/.*textbox "Email".*ref=\(e[0-9]*\).*/\1/p')
button=$(agent-browser snapshot -i | sed -n 's/.*button "Sign up".*ref=\(e[0-9]*\).*/\1/p')
step fill agent-browser fill "@$email" test@example.com
step click agent-browser click "@$button"
step text agent-browser get text '#out'
step tabs agent-browser tab
step visibility agent-browser eval document.visibilityState
step shot agent-browser screenshot /work/shot.png
step chrome sh -c 'cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\0" "\n" | grep -E "^--(no-sandbox|no-startup-window|user-data-dir=)" | sort -u'
step shm sh -c 'df -k /dev/shm | tail -n 1'
step gateway sh -c 'env | grep -c AI_GATEWAY'
step chat agent-browser chat hello
step outside agent-browser open http://denied.test/
{extra_steps}
{close}
"#,
        close = if close {
            "agent-browser close >/dev/null 2>&1"
        } else {
            ""
        }
    )
}

/// The steps' outputs and exit codes, by name.
fn steps(out: &str) -> BTreeMap<String, (String, i32)> {
    let mut map = BTreeMap::new();
    let mut name: Option<String> = None;
    let mut text = String::new();
    for line in out.lines() {
        if let Some(n) = line.strip_prefix("== ") {
            name = Some(n.to_string());
            text.clear();
        } else if let (Some(n), Some(rc)) = (name.as_ref(), line.strip_prefix("rc=")) {
            map.insert(n.clone(), (text.trim().to_string(), rc.parse().unwrap()));
            name = None;
        } else if name.is_some() {
            text.push_str(line);
            text.push('\n');
        }
    }
    map
}

/// Width, height and the RGB of pixel (x, y) of the PNG at `path` (see [`png_pixels`]).
fn png_pixel(path: &Path, x: u32, y: u32) -> (u32, u32, [u8; 3]) {
    let (w, h, px) = png_pixels(path, &[(x, y)]);
    (w, h, px[0])
}

/// Width, height and the RGB of each pixel at `points` of the PNG at `path`, decoded by the
/// host's python3 (zlib + the five PNG row filters): the screenshot is a real rendering.
fn png_pixels(path: &Path, points: &[(u32, u32)]) -> (u32, u32, Vec<[u8; 3]>) {
    const DECODE: &str = r#"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, ihdr = 8, b"", None
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR": ihdr = struct.unpack(">IIBBBBB", body)
    if kind == b"IDAT": idat += body
    pos += 12 + n
w, h, depth, color = ihdr[:4]
assert depth == 8 and color in (2, 6), ihdr
bpp = 3 if color == 2 else 4
raw, stride, prev, rows, off = zlib.decompress(idat), w * bpp, bytearray(w * bpp), [], 0
for _ in range(h):
    f, line = raw[off], bytearray(raw[off + 1:off + 1 + stride]); off += 1 + stride
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line); prev = line
print(w, h)
for x, y in zip(map(int, sys.argv[2::2]), map(int, sys.argv[3::2])):
    print(*rows[y][x * bpp:x * bpp + 3])
"#;
    let mut args = vec![path.to_str().unwrap().to_string()];
    args.extend(
        points
            .iter()
            .flat_map(|(x, y)| [x.to_string(), y.to_string()]),
    );
    let v = python_numbers(DECODE, &args);
    let px = v[2..]
        .chunks(3)
        .map(|c| [c[0] as u8, c[1] as u8, c[2] as u8])
        .collect();
    (v[0], v[1], px)
}

/// The whitespace-separated numbers the host's python3 prints running `script` with `args`.
fn python_numbers(script: &str, args: &[String]) -> Vec<u32> {
    let out = Command::new("python3")
        .args(["-c", script])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "python3 {args:?}: {}", stderr(&out));
    stdout(&out)
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect()
}

/// A browser box `name` at `tier` for `c`: a custom profile with the browser grants
/// (agent-browser's state directory and `net.unix`); at supervised and container, egress
/// `allowed.test:8080` (at container, in the `localhost/h5i-browser` image); at process, the
/// demo app declared as the service `demo` on the box's port 3000.
fn browser_box(c: &mut Caller, name: &str, tier: &str) {
    let extra = match tier {
        "supervised" => "egress = [\"allowed.test:8080\"]\n".to_string(),
        "container" => format!(
            "egress = [\"allowed.test:8080\"]\n[profile.web.container]\nimage = \"{BROWSER_IMAGE}\"\n"
        ),
        _ => format!(
            "[service.demo]\ncommand = \"exec python3 -m http.server {APP_PORT} --bind 127.0.0.1 --directory /work/app\"\nport = {APP_PORT}\n"
        ),
    };
    c.write(
        ".h5i/env.toml",
        format!(
            "[profile.web]\nisolation = \"{tier}\"\n[profile.web.fs]\nwrite = [\"~/.agent-browser\"]\n[profile.web.net]\nunix = true\n{extra}"
        ),
    );
    c.write("app/index.html", DEMO_PAGE);
    c.commit_all("browser demo");
    if tier == "container" {
        // The profile's image (create_at_with would name the plain test image).
        c.ok(&["box", "create", name, "--profile", "web"]);
    } else {
        c.create_at_with(name, tier, &["--profile", "web"]);
    }
}

/// The checks every tier shares; returns the steps for tier-specific ones.
fn drive(
    c: &mut Caller,
    name: &str,
    serve_in_run: bool,
    sidecar: bool,
    extra_steps: &str,
) -> BTreeMap<String, (String, i32)> {
    let script = drive_script(serve_in_run, !sidecar, extra_steps);
    let out = c.h5i(&["box", "run", name, "--", "sh", "-c", &script]);
    let text = stdout(&out);
    let who = c.who();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{who}: {text}{}\nthe browser's log: {}",
        stderr(&out),
        std::fs::read_to_string(c.box_dir(name).join("services/browser.log")).unwrap_or_default()
    );
    let s = steps(&text);
    let step = |n: &str| {
        s.get(n)
            .cloned()
            .unwrap_or_else(|| panic!("{who}: step {n} missing: {text}"))
    };

    let (open, rc) = step("open");
    assert_eq!(rc, 0, "{who}: open: {open}");
    assert!(open.contains("h5i browser demo"), "{who}: {open}");
    let (snap, rc) = step("snapshot");
    assert_eq!(rc, 0, "{who}: snapshot: {snap}");
    for want in ["textbox \"Email\"", "button \"Sign up\"", "[ref=e"] {
        assert!(
            snap.contains(want),
            "{who}: {want} not in the snapshot: {snap}"
        );
    }
    assert_eq!(step("fill").1, 0, "{who}: {text}");
    assert_eq!(step("click").1, 0, "{who}: {text}");
    assert_eq!(
        step("text").0,
        "signed up test@example.com",
        "{who}: {text}"
    );
    // The tab agent-browser drives is the browser's only one, so it is in front and painted:
    // a tab behind another in Chrome's headless window is hidden and never gives a frame.
    let (tabs, rc) = step("tabs");
    assert_eq!(rc, 0, "{who}: tab: {tabs}");
    assert_eq!(tabs.lines().count(), 1, "{who}: not one tab: {tabs}");
    assert!(tabs.contains("127.0.0.1:3000"), "{who}: {tabs}");
    assert_eq!(step("visibility").0, "\"visible\"", "{who}: {text}");
    let (shot, rc) = step("shot");
    assert_eq!(rc, 0, "{who}: screenshot: {shot}");

    let png = c.workspace(name).join("shot.png");
    let (w, h, px) = png_pixel(&png, 8, 8);
    assert!(w >= 640 && h >= 360, "{who}: a {w}x{h} screenshot");
    assert_eq!(
        px, SWATCH_RGB,
        "{who}: pixel (8, 8) is not the demo's swatch"
    );
    let (_, _, white) = png_pixel(&png, w - 8, h - 8);
    assert_eq!(white, [0xff; 3], "{who}: the page's background is white");

    // Chrome's own sandbox is off (the box is the boundary), it opens no startup tab of its own
    // (`h5i::browser::box_env` says why), and its profile is a fresh one in
    // the box's private /tmp, never a directory of the host. A box-lifetime browser runs in the
    // box's sidecar, whose processes the run cannot see: read them from the host.
    let (chrome, _) = if sidecar {
        (sidecar_chrome_args(c, name).join("\n"), 0)
    } else {
        step("chrome")
    };
    for flag in ["--no-sandbox", "--no-startup-window"] {
        assert!(chrome.lines().any(|l| l == flag), "{who}: {flag}: {chrome}");
    }
    let dirs: Vec<&str> = chrome
        .lines()
        .filter_map(|l| l.strip_prefix("--user-data-dir="))
        .collect();
    assert!(!dirs.is_empty(), "{who}: no profile directory: {chrome}");
    for d in dirs {
        assert!(d.starts_with("/tmp/agent-browser-chrome-"), "{who}: {d}");
    }
    let (shm, _) = step("shm");
    assert_eq!(
        shm.split_whitespace().nth(1),
        Some("1048576"),
        "{who}: /dev/shm is not sized for Chromium: {shm}"
    );

    // The gateway credential is in h5i's environment and never in the box's: chat is refused.
    assert_eq!(step("gateway").0, "0", "{who}: {text}");
    let (chat, rc) = step("chat");
    assert_ne!(rc, 0, "{who}: chat ran: {chat}");
    assert!(chat.contains("AI_GATEWAY_API_KEY not set"), "{who}: {chat}");

    // The second layer: a host outside the policy is refused inside Chrome.
    let (outside, rc) = step("outside");
    assert_ne!(rc, 0, "{who}: {outside}");
    assert!(
        outside.contains("not in the allowed domains list"),
        "{who}: {outside}"
    );
    s
}

/// Two steps that have the page fetch `allowed.test` on its listed port (`listed`) and on an
/// unlisted one (`unlisted`); each prints `"answered"` or `"failed"`.
fn egress_steps(scheme: &str) -> String {
    let fetch = |port: u16| {
        format!(
            "agent-browser eval 'fetch(\"{scheme}://allowed.test:{port}/\").then(() => \"answered\", () => \"failed\")'"
        )
    };
    format!(
        "step listed {}\nstep unlisted {}\n",
        fetch(8080),
        fetch(9090)
    )
}

/// The test hosts saw the listed destination (`first:8080`) and never the unlisted port 9090;
/// returns the box `web`'s last host-observed run receipt.
fn only_the_listed_port_was_reached(
    c: &Caller,
    hosts: &mut TestHosts,
    s: &BTreeMap<String, (String, i32)>,
) -> serde_json::Value {
    let who = c.who();
    let first = hosts.first;
    let log = hosts.log();
    assert!(
        log.contains(&format!("tcp {first}:8080")),
        "{who}: the listed destination was never dialled: {log:?} {s:?}"
    );
    assert!(
        !log.iter().any(|l| l.ends_with(":9090")),
        "{who}: the unlisted port was reached: {log:?}"
    );
    let receipts = std::fs::read_to_string(c.box_dir("web").join("receipts.jsonl")).unwrap();
    receipts
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["kind"] == "run" && r["lane"] == "host-env-run")
        .unwrap_or_else(|| panic!("{who}: no host-observed run receipt: {receipts}"))
}

fn process_case(as_user: bool) {
    if !require_root(
        "browser at the process tier",
        "boxes as root and as h5i-test",
    ) {
        return;
    }
    let mut c = Caller::either(as_user).with_env("AI_GATEWAY_API_KEY", GATEWAY_KEY);
    browser_box(&mut c, "web", "process");
    // The box's own dev server: the declared service, whose network namespace the run joins.
    c.ok(&["box", "service", "start", "web", "demo"]);
    drive(&mut c, "web", false, true, "");
    c.ok(&["box", "service", "stop", "web", "demo"]);
    // The browser sidecar lives as long as the box: removing the box ends it.
    assert!(c.box_dir("web").join("services/browser.json").is_file());
    c.ok(&["box", "rm", "--force", "web"]);
}

#[test]
fn a_process_tier_browser_box_drives_its_own_dev_server_and_refuses_chat() {
    process_case(false);
}

#[test]
fn a_process_tier_browser_box_drives_its_own_dev_server_and_refuses_chat_as_h5i_test() {
    process_case(true);
}

/// At the supervised tier Chrome's egress is the box's: the allowed name on its listed port is
/// dialled (the test host logs it); the same name on another port passes Chrome's domain list
/// and is refused by the pinned table, counted as denied in the receipt, never seen by the host.
fn supervised_case(as_user: bool) {
    let test = "browser at the supervised tier";
    let Some(mut hosts) = TestHosts::up(test, &[8080, 9090], &[]) else {
        return;
    };
    let pin = hosts.pin(&[("allowed.test", hosts.first)]);
    let mut c = Caller::either(as_user)
        .with_env("AI_GATEWAY_API_KEY", GATEWAY_KEY)
        .with_env("H5I_TEST_HOSTS", &pin);
    browser_box(&mut c, "web", "supervised");
    // The browser is the box-lifetime sidecar in the sandbox's network, for either caller.
    let s = drive(&mut c, "web", true, true, &egress_steps("http"));
    let who = c.who();
    let (unlisted, rc) = s["unlisted"].clone();
    assert_eq!(rc, 0, "{who}: {unlisted}");
    assert_eq!(unlisted, "\"failed\"", "{who}: {s:?}");

    let first = hosts.first;
    let rec = only_the_listed_port_was_reached(&c, &mut hosts, &s);
    let denied = rec["egress"]["denied"][format!("{first}:9090/tcp")].as_u64();
    assert!(
        denied.unwrap_or(0) >= 1,
        "{who}: the L4 refusal is not in the receipt: {rec}"
    );
    c.ok(&["box", "rm", "--force", "web"]);
}

#[test]
fn a_supervised_browser_box_cannot_reach_a_port_its_table_does_not_list() {
    supervised_case(false);
}

#[test]
fn a_supervised_browser_box_cannot_reach_a_port_its_table_does_not_list_as_h5i_test() {
    supervised_case(true);
}

/// `h5i browser url`: a loopback URL carrying the box's viewer token (minted at creation), the
/// same token on every ask and on any port, kept 0600 in the box directory, which the box cannot read (from inside
/// the box: the file is not there and no file the box can read holds the token). A box without
/// a browser, port 0 and a name that walks out of the store are refused.
fn viewer_url_case(as_user: bool) {
    if !require_root("h5i browser url", "boxes as root and as h5i-test") {
        return;
    }
    let mut c = Caller::either(as_user);
    let who = c.who();
    browser_box(&mut c, "web", "process");
    // Minted at creation, before anyone asked for the URL.
    let minted = std::fs::read_to_string(c.box_dir("web").join("browser/viewer.token"))
        .unwrap_or_else(|e| panic!("{who}: no viewer token after create: {e}"));
    let url = c.ok(&["browser", "url", "web"]);
    let token = url
        .trim()
        .strip_prefix("http://127.0.0.1:7331/?token=")
        .unwrap_or_else(|| panic!("{who}: not a loopback viewer URL: {url}"))
        .to_string();
    assert!(
        token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{who}: {url}"
    );
    assert_eq!(
        minted.trim(),
        token,
        "{who}: the URL's token is not the one minted"
    );
    let other = c.ok(&["browser", "url", "web", "--port", "8123"]);
    assert_eq!(
        other.trim(),
        format!("http://127.0.0.1:8123/?token={token}"),
        "{who}: the token changed"
    );

    let file = c.box_dir("web").join("browser/viewer.token");
    let meta = std::fs::metadata(&file).unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{who}");
    assert_eq!(meta.uid(), c.uid(), "{who}");

    token_out_of_reach(&c, "web", &token);

    for (args, want) in [
        (
            vec!["browser", "url", "web", "--port", "0"],
            "0 is not in 1..=65535",
        ),
        (vec!["browser", "url", "../web"], "refusing:"),
    ] {
        let out = c.h5i(&args);
        assert_ne!(out.status.code(), Some(0), "{who}: {args:?}");
        assert!(
            stderr(&out).contains(want),
            "{who}: {args:?}: {}",
            stderr(&out)
        );
    }
    c.create_at("plain", "process");
    let out = c.h5i(&["browser", "url", "plain"]);
    assert_ne!(out.status.code(), Some(0), "{who}");
    assert!(
        stderr(&out).contains("refusing: box `plain` has no browser"),
        "{who}: {}",
        stderr(&out)
    );
    assert!(
        !c.box_dir("plain").join("browser/viewer.token").exists(),
        "{who}: a refused ask minted a token"
    );
    c.ok(&["box", "rm", "--force", "web"]);
}

/// Box `name` of `c` cannot read its viewer token: not the token file, no file under the
/// places a box can list (its workspace, /tmp, its store view, /etc, /run, /var, its HOME),
/// and no process's argv or environment it can see.
fn token_out_of_reach(c: &Caller, name: &str, token: &str) {
    let who = c.who();
    let file = c.box_dir(name).join("browser/viewer.token");
    let (inside, rc) = box_sh(
        c,
        name,
        &format!(
            "cat '{}' 2>&1; echo cat=$?; timeout 120 grep -rslF {token} /work /tmp /.h5i /etc /run /var \"$HOME\" 2>/dev/null; echo grep=$?",
            file.display()
        ),
    );
    assert_eq!(rc, 0, "{who}: {inside}");
    assert!(
        !inside.contains("cat=0"),
        "{who}: the box read the token file: {inside}"
    );
    // grep: 1 when nothing matched, 2 when a listed directory is absent too; 124 is a timeout.
    assert!(
        (inside.contains("grep=1") || inside.contains("grep=2"))
            && !inside.lines().any(|l| l.starts_with('/')),
        "{who}: a file in the box holds the token: {inside}"
    );
    // Every process the box sees, but this check's own (whose argv holds the token reversed,
    // so no argv in the box holds it as it is).
    let reversed: String = token.chars().rev().collect();
    let (procs, rc) = box_sh(
        c,
        name,
        &format!(
            "python3 -c 'import os, sys\nt = sys.argv[1][::-1].encode()\nmine = {{os.getpid(), os.getppid()}}\nhits = []\nfor p in os.listdir(\"/proc\"):\n    if not p.isdigit() or int(p) in mine:\n        continue\n    for f in (\"cmdline\", \"environ\"):\n        try:\n            if t in open(\"/proc/%s/%s\" % (p, f), \"rb\").read():\n                hits.append(p + \"/\" + f)\n        except OSError:\n            pass\nprint(\"hits\", hits)' {reversed}"
        ),
    );
    assert_eq!(rc, 0, "{who}: {procs}");
    assert!(
        procs.contains("hits []"),
        "{who}: a process the box sees holds the token: {procs}"
    );
}

#[test]
fn the_viewer_url_is_loopback_and_its_token_out_of_the_boxs_reach() {
    viewer_url_case(false);
}

#[test]
fn the_viewer_url_is_loopback_and_its_token_out_of_the_boxs_reach_as_h5i_test() {
    viewer_url_case(true);
}

/// The image the container tier's browser boxes run (`make images`: images/Containerfile.browser).
const BROWSER_IMAGE: &str = "localhost/h5i-browser:latest";

/// `podman ARGS` as the container tier's engine user (h5i-test), in its rootless storage.
fn engine_podman(args: &[&str]) -> Command {
    let home = format!("/home/{}", common::caller::TEST_USER);
    let rundir = format!(
        "/run/user/{}",
        common::caller::uid_of(common::caller::TEST_USER)
    );
    let mut cmd = common::caller::as_user(common::caller::TEST_USER, Some(&home));
    cmd.arg(format!("XDG_RUNTIME_DIR={rundir}"))
        .arg("podman")
        .args(args)
        .current_dir("/");
    cmd
}

/// Whether the container tier's engine user (h5i-test) has the browser image.
fn browser_image_built() -> bool {
    engine_podman(&["image", "exists", BROWSER_IMAGE])
        .status()
        .is_ok_and(|s| s.success())
}

/// A [`Caller`] of root or h5i-test (`as_user`) for the container tier's browser boxes: the
/// engine user h5i-test (root's configured by name), probes not cached; `None` (said as
/// skipped) when the browser image is not built for h5i-test.
fn container_caller(as_user: bool, test: &str) -> Option<Caller> {
    if !browser_image_built() {
        h5i_testsupport::skipped!(
            "{test}: {BROWSER_IMAGE} is not built for h5i-test (run `make images`)"
        );
        return None;
    }
    let mut c = Caller::either(as_user)
        .with_env("AI_GATEWAY_API_KEY", GATEWAY_KEY)
        .with_env("H5I_NO_PROBE_CACHE", "1");
    if !as_user {
        c = c.with_env("H5I_CONTAINER_USER", common::caller::TEST_USER);
    }
    Some(c)
}

/// At the container tier the browser is the box's sidecar container, and Chrome's egress is the
/// run's proxy, the sidecar's only way out: `https://` is a CONNECT, which the proxy opens for
/// the listed destination (the test host logs the connection; the page then fails TLS against
/// the plain greeter) and refuses with a count for the unlisted port. `box rm` ends the sidecar.
fn container_case(as_user: bool) {
    let test = "browser at the container tier";
    if !require_root(test, "boxes as root and as h5i-test") {
        return;
    }
    let Some(c) = container_caller(as_user, test) else {
        return;
    };
    let Some(mut hosts) = TestHosts::up(test, &[8080, 9090], &[]) else {
        return;
    };
    let pin = hosts.pin(&[("allowed.test", hosts.first)]);
    let mut c = c.with_env("H5I_TEST_HOSTS", &pin);
    browser_box(&mut c, "web", "container");
    let s = drive(&mut c, "web", true, true, &egress_steps("https"));
    let who = c.who();
    assert_eq!(
        s["unlisted"],
        (String::from("\"failed\""), 0),
        "{who}: {s:?}"
    );
    let rec = only_the_listed_port_was_reached(&c, &mut hosts, &s);
    assert!(
        rec["egress"]["denied"]["allowed.test:9090"]
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "{who}: the proxy's refusal is not in the receipt: {rec}"
    );
    let init = sidecar_init(&c, "web");
    c.ok(&["box", "rm", "--force", "web"]);
    assert!(
        !Path::new(&format!("/proc/{init}")).exists(),
        "{who}: the browser sidecar outlived `box rm`"
    );
}

#[test]
fn a_container_browser_box_reaches_only_what_its_proxy_allows() {
    container_case(false);
}

#[test]
fn a_container_browser_box_reaches_only_what_its_proxy_allows_as_h5i_test() {
    container_case(true);
}

/// A browser box whose policy would inject the chat gateway's credential as a secret is refused
/// before anything runs, at every tier, and the refusal never prints the value.
fn gateway_secret_case(tier: &str, as_user: bool) {
    let test = "a browser box whose policy injects the chat credential";
    if !require_root(test, "boxes as root and as h5i-test") {
        return;
    }
    if tier == "container" && !browser_image_built() {
        h5i_testsupport::skipped!(
            "{test} at container: {BROWSER_IMAGE} is not built for h5i-test (run `make images`)"
        );
        return;
    }
    let mut c = Caller::either(as_user)
        .with_env("H5I_SECRET_AI_GATEWAY_API_KEY", GATEWAY_KEY)
        .with_env("H5I_NO_PROBE_CACHE", "1");
    if !as_user {
        c = c.with_env("H5I_CONTAINER_USER", common::caller::TEST_USER);
    }
    let image = if tier == "container" {
        format!("[profile.web.container]\nimage = \"{BROWSER_IMAGE}\"\n")
    } else {
        String::new()
    };
    c.write(
        ".h5i/env.toml",
        format!(
            "[profile.web]\nisolation = \"{tier}\"\nsecrets = [\"AI_GATEWAY_API_KEY\"]\n{image}[profile.web.fs]\nwrite = [\"~/.agent-browser\"]\n[profile.web.net]\nunix = true\n"
        ),
    );
    c.commit_all("a browser box with the gateway credential");
    c.ok(&["box", "create", "web", "--profile", "web"]);
    let out = c.h5i(&[
        "box",
        "run",
        "web",
        "--",
        "sh",
        "-c",
        "echo ran > /work/ran",
    ]);
    let who = c.who();
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{who} at {tier}: {err}");
    assert!(
        err.contains("refusing: secret `AI_GATEWAY_API_KEY` would give the browser box"),
        "{who} at {tier}: {err}"
    );
    assert!(
        !err.contains(GATEWAY_KEY) && !stdout(&out).contains(GATEWAY_KEY),
        "{who} at {tier}: the value was printed"
    );
    assert!(
        !c.workspace("web").join("ran").exists(),
        "{who} at {tier}: the command ran"
    );
}

#[test]
fn a_browser_box_whose_policy_injects_the_chat_credential_is_refused_at_every_tier() {
    for tier in ["process", "supervised", "container"] {
        gateway_secret_case(tier, false);
    }
}

#[test]
fn a_browser_box_whose_policy_injects_the_chat_credential_is_refused_as_h5i_test() {
    for tier in ["process", "supervised", "container"] {
        gateway_secret_case(tier, true);
    }
}

/// Removes a box (and so stops its services and browser sidecar) when dropped, so a failing
/// case leaves no sidecar running.
struct RemovedAtEnd<'a>(&'a Caller, &'static str);

impl Drop for RemovedAtEnd<'_> {
    fn drop(&mut self) {
        let _ = self.0.h5i(&["box", "rm", "--force", self.1]);
    }
}

/// A browser box `web` of root or h5i-test whose browser is the box-lifetime sidecar (or `None`, said
/// as skipped), and what serves the demo app: at process its `demo` service; at supervised and
/// container (no services of the box's own there) each run that needs the app starts it
/// (`serve`), and the box's egress `allowed.test:8080` is pinned to the test hosts kept here.
struct SidecarBox {
    c: Caller,
    tier: &'static str,
    /// Kept up for as long as the box runs (its hosts answer the pinned names).
    _hosts: Option<TestHosts>,
}

/// The process tier's [`SidecarBox`] of root or h5i-test (`as_user`), as its caller.
fn demo_sidecar_box(as_user: bool, test: &str) -> Option<Caller> {
    SidecarBox::up("process", as_user, test).map(|sc| sc.c)
}

impl SidecarBox {
    fn up(tier: &'static str, as_user: bool, test: &str) -> Option<SidecarBox> {
        if !require_root(test, "boxes as root and as h5i-test") {
            return None;
        }
        let mut c = match tier {
            "container" => container_caller(as_user, test)?,
            _ => Caller::either(as_user).with_env("AI_GATEWAY_API_KEY", GATEWAY_KEY),
        };
        let hosts = match tier {
            "supervised" | "container" => Some(TestHosts::up(test, &[8080, 9090], &[])?),
            _ => None,
        };
        if let Some(h) = &hosts {
            c = c.with_env("H5I_TEST_HOSTS", &h.pin(&[("allowed.test", h.first)]));
        }
        browser_box(&mut c, "web", tier);
        if tier == "process" {
            c.ok(&["box", "service", "start", "web", "demo"]);
        }
        Some(SidecarBox {
            c,
            tier,
            _hosts: hosts,
        })
    }

    /// What a run that needs the demo app runs first: nothing where a service serves it; at
    /// supervised, the app in the run's background, waited for.
    fn serve(&self) -> String {
        if self.tier == "process" {
            return String::new();
        }
        format!(
            "(python3 -m http.server {APP_PORT} --bind 127.0.0.1 --directory /work/app >/dev/null 2>&1 &) && python3 -c 'import socket, time; any(socket.socket().connect_ex((\"127.0.0.1\", {APP_PORT})) == 0 or time.sleep(0.05) for _ in range(200))' && "
        )
    }
}

/// Run `script` in box `name` (`sh -c`); its stdout and stderr together, and its exit code.
fn box_sh(c: &Caller, name: &str, script: &str) -> (String, i32) {
    let out = c.h5i(&["box", "run", name, "--", "sh", "-c", script]);
    (
        format!("{}{}", stdout(&out), stderr(&out)),
        out.status.code().unwrap_or(-1),
    )
}

/// The ref agent-browser's snapshot gives the demo's "Sign up" button.
fn sign_up_ref(snapshot: &str) -> String {
    snapshot
        .lines()
        .find(|l| l.contains("button \"Sign up\""))
        .and_then(|l| l.split("[ref=").nth(1))
        .and_then(|r| r.split(']').next())
        .map(|r| format!("@{r}"))
        .unwrap_or_else(|| panic!("no Sign up button in {snapshot}"))
}

/// The Chromium browser processes (not their helpers) in box `name`'s sidecar, read from the
/// host: (pid, argv).
fn sidecar_chromes(c: &Caller, name: &str) -> Vec<(String, Vec<String>)> {
    let init = sidecar_init(c, name);
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let want = ns(&init.to_string()).unwrap();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || ns(&pid) != Some(want.clone()) {
            continue;
        }
        let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> = argv
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let chrome = args.first().is_some_and(|a| a.ends_with("/chromium"));
        if chrome && !args.iter().any(|a| a.starts_with("--type=")) {
            found.push((pid, args));
        }
    }
    found
}

/// The sandbox, startup and profile flags of the sidecar's Chromium, as the in-box step prints
/// them.
fn sidecar_chrome_args(c: &Caller, name: &str) -> Vec<String> {
    let mut flags: Vec<String> = sidecar_chromes(c, name)
        .into_iter()
        .flat_map(|(_, args)| args)
        .filter(|a| {
            ["--no-sandbox", "--no-startup-window"].contains(&a.as_str())
                || a.starts_with("--user-data-dir=")
        })
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

/// Kill the Chromium browser process (not its helpers) of box `name`'s sidecar, from the host.
fn kill_sidecar_chrome(c: &Caller, name: &str) {
    let chromes = sidecar_chromes(c, name);
    assert_eq!(chromes.len(), 1, "the sidecar's Chromium: {chromes:?}");
    assert!(Command::new("kill")
        .args(["-KILL", &chromes[0].0])
        .status()
        .unwrap()
        .success());
}

/// A page whose title and console error carry terminal escapes (OSC title, SGR colour).
const HOSTILE_PAGE: &str = "printf '<title>\\033]0;pwned\\007evil</title><script>console.error(\"\\033[31mred \\033]52;c;AAAA\\007\")</script>' > /work/app/evil.html";

/// At every tier a browser box's browser (root's or h5i-test's) is a sidecar that
/// outlives each run (at supervised, in the network of the box's sandbox; at container, a
/// container whose namespaces the runs join): a second
/// run sees the page the first opened. A human takes control: the agent's click is refused
/// with the typed message while its snapshot works, a second take is refused, and after the
/// release a pre-take @ref is refused until a new snapshot. Report.md lists what the browser
/// saw (the demo's console error, exception and failing request exactly once across runs, a
/// hostile page's escapes escaped), a run after Chromium was killed is `unavailable`, take and
/// release are viewer-lane records, and `box rm` stops the sidecar.
fn outlives_case(tier: &'static str, as_user: bool) {
    let Some(sc) = SidecarBox::up(tier, as_user, "the box-lifetime browser") else {
        return;
    };
    let (c, serve) = (&sc.c, sc.serve());
    let _removed = RemovedAtEnd(c, "web");

    let (open, rc) = box_sh(
        c,
        "web",
        &format!("{serve}agent-browser open http://127.0.0.1:{APP_PORT}/"),
    );
    assert_eq!(rc, 0, "{open}");
    assert!(open.contains("h5i browser demo"), "{open}");
    let (url, rc) = box_sh(c, "web", "agent-browser get url");
    assert_eq!(rc, 0, "{url}");
    assert!(
        url.contains(&format!("http://127.0.0.1:{APP_PORT}/")),
        "the second run does not see the first run's page: {url}"
    );
    let status: serde_json::Value =
        serde_json::from_str(&c.ok(&["browser", "status", "web", "--json"])).unwrap();
    assert_eq!(status["holder"], "agent", "{status}");
    assert_eq!(status["running"], true, "{status}");

    let (snap, rc) = box_sh(c, "web", "agent-browser snapshot -i");
    assert_eq!(rc, 0, "{snap}");
    let button = sign_up_ref(&snap);

    c.ok(&["browser", "take", "web"]);
    let again = c.h5i(&["browser", "take", "web"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("refusing: a human already holds the browser of box `web`"),
        "{}",
        stderr(&again)
    );
    let (click, rc) = box_sh(c, "web", &format!("agent-browser click {button}"));
    assert_ne!(
        rc, 0,
        "the agent clicked while a human held the browser: {click}"
    );
    assert!(
        click.contains("refusing: a human holds the browser of box `web`"),
        "{click}"
    );
    let (watch, rc) = box_sh(c, "web", "agent-browser snapshot -i");
    assert_eq!(rc, 0, "a read-only verb was refused: {watch}");
    let status: serde_json::Value =
        serde_json::from_str(&c.ok(&["browser", "status", "web", "--json"])).unwrap();
    assert_eq!(status["holder"], "human", "{status}");

    c.ok(&["browser", "release", "web"]);
    let none = c.h5i(&["browser", "release", "web"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(
        stderr(&none).contains("nothing to release"),
        "{}",
        stderr(&none)
    );
    // The snapshot taken while the human held control predates the release too.
    let (stale, rc) = box_sh(c, "web", &format!("agent-browser click {button}"));
    assert_ne!(rc, 0, "a stale ref was acted on: {stale}");
    assert!(
        stale.contains(&format!("refusing: {button} is from before a human drove")),
        "{stale}"
    );
    let (fresh, rc) = box_sh(
        c,
        "web",
        &format!("agent-browser snapshot -i >/dev/null && agent-browser fill @e1 x@example.com; agent-browser click {button} && agent-browser get text '#out'"),
    );
    assert_eq!(rc, 0, "{fresh}");
    assert!(fresh.contains("signed up"), "{fresh}");

    let (hostile, rc) = box_sh(
        c,
        "web",
        &format!(
            "{HOSTILE_PAGE} && {serve}agent-browser open http://127.0.0.1:{APP_PORT}/evil.html"
        ),
    );
    assert_eq!(rc, 0, "{hostile}");

    // Chromium dies under the sidecar: the next run that uses the browser is `unavailable`.
    kill_sidecar_chrome(c, "web");
    let (after, _) = box_sh(c, "web", "agent-browser get url");

    let out = tempfile::tempdir().unwrap();
    hand_to(c, out.path());
    let dest = out.path().join("review");
    c.ok(&["box", "export", "web", "--out", dest.to_str().unwrap()]);
    let report = std::fs::read_to_string(dest.join("report.md")).unwrap();
    // The demo's failing request: a 404 from the box's service, or at supervised (whose app
    // ends with the run that served it) maybe no response at all.
    let missing = match tier {
        "process" => "404 GET http://127.0.0.1:3000/h5i-demo-missing.json",
        _ => "GET http://127.0.0.1:3000/h5i-demo-missing.json",
    };
    let saw = report
        .split("## What the browser saw")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap_or_else(|| panic!("no browser section: {report}"));
    for (what, n) in [
        ("h5i-demo: deliberate console error", 1),
        ("h5i-demo: deliberate uncaught exception", 1),
        (missing, 1),
        ("visited: `http://127.0.0.1:3000/evil.html`", 1),
        ("**unavailable**", 1),
    ] {
        assert_eq!(
            saw.matches(what).count(),
            n,
            "{what} in: {saw}\n(after: {after})"
        );
    }
    assert!(!report.contains('\u{1b}'), "a raw escape reached report.md");
    assert!(saw.contains("\\x1b[31mred"), "{saw}");
    let viewer = report
        .split("## Viewer sessions")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap();
    assert!(viewer.contains("browser take by"), "{viewer}");
    assert!(viewer.contains("browser release by"), "{viewer}");

    let init = sidecar_init(c, "web");
    c.ok(&["box", "rm", "--force", "web"]);
    assert!(
        !Path::new(&format!("/proc/{init}")).exists(),
        "the browser sidecar outlived `box rm`"
    );
}

#[test]
fn a_process_tier_browser_outlives_its_run_and_a_human_can_take_it() {
    outlives_case("process", false);
}

#[test]
fn a_process_tier_browser_outlives_its_run_and_a_human_can_take_it_as_h5i_test() {
    outlives_case("process", true);
}

#[test]
fn a_container_browser_outlives_its_run_and_a_human_can_take_it() {
    outlives_case("container", false);
}

#[test]
fn a_container_browser_outlives_its_run_and_a_human_can_take_it_as_h5i_test() {
    outlives_case("container", true);
}

#[test]
fn a_supervised_browser_outlives_its_run_and_a_human_can_take_it() {
    outlives_case("supervised", false);
}

#[test]
fn a_supervised_browser_outlives_its_run_and_a_human_can_take_it_as_h5i_test() {
    outlives_case("supervised", true);
}

/// What a hostile agent in a browser box runs to reach its browser around h5i's relay: every
/// TCP listener it can see on the loopback it shares with the sidecar, and the two it is told
/// of (argv: the dev server's port, the DevTools URL and the stream URL agent-browser gave it),
/// each dialled and sent a DevTools request; every unix socket path and abstract name listed in
/// `/proc/net/unix`, and the daemon's socket through every `/proc/*/root`; a raw socket (to
/// forge a handshake); and the fence's own table through `nft`. Prints one JSON object.
const BYPASS_PROBE: &str = r#"
import glob, json, os, socket, subprocess, sys
app, told = int(sys.argv[1]), sys.argv[2:]
def port_of(url):
    return int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
ports = {app} | {port_of(u) for u in told}
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A":
            ports.add(int(f[1].rsplit(":", 1)[1], 16))
out = {"tcp": {}, "unix": {}, "told": [port_of(u) for u in told]}
for p in sorted(ports):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(("127.0.0.1", p))
    except socket.timeout:
        out["tcp"][str(p)] = "connect timed out"; continue
    except OSError as e:
        out["tcp"][str(p)] = "connect errno %d" % e.errno; continue
    try:
        s.sendall(b"GET /json/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        out["tcp"][str(p)] = "answered " + s.recv(64).decode("latin-1")
    except OSError as e:
        out["tcp"][str(p)] = "read failed: %s" % e
names = set(glob.glob("/proc/*/root/tmp/h5i-browser/default.sock")) | {"/tmp/h5i-browser/default.sock"}
for line in open("/proc/net/unix").read().splitlines()[1:]:
    f = line.split()
    if len(f) > 7:
        names.add(f[7])
for n in sorted(names):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\0" + n[1:] if n.startswith("@") else n)
        out["unix"][n] = "connected"
    except OSError as e:
        out["unix"][n] = "errno %d" % e.errno
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    out["raw"] = "opened"
except OSError as e:
    out["raw"] = "errno %d" % e.errno
try:
    nft = subprocess.run(["nft", "flush", "table", "inet", "h5i_browser"], capture_output=True, text=True)
    out["nft"] = "rc %d: %s" % (nft.returncode, nft.stderr.strip())
except FileNotFoundError:
    out["nft"] = "missing"
out["capeff"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff:")][0]
print(json.dumps(out))
"#;

/// The DevTools answer a host process inside the box's network namespace gets from `port`
/// (`nsenter --net`): h5i's own view, which the fence lets through.
fn devtools_from_the_host(pid: i64, port: u16) -> String {
    let probe = format!(
        "import socket\ns = socket.create_connection(('127.0.0.1', {port}), 5)\ns.sendall(b'GET /json/version HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n')\nprint(s.recv(4096).decode('latin-1'))"
    );
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["python3", "-c", &probe])
        .output()
        .unwrap();
    format!("{}{}", stdout(&out), stderr(&out))
}

/// The sidecar's container init pid, from its service state.
fn sidecar_init(c: &Caller, name: &str) -> i64 {
    serde_json::from_slice::<serde_json::Value>(
        &std::fs::read(c.box_dir(name).join("services/browser.json")).unwrap(),
    )
    .unwrap()["pid"]["pid"]
        .as_i64()
        .unwrap()
}

/// A hostile agent goes around the relay: agent-browser hands it Chromium's DevTools URL and
/// the daemon's stream URL, and it dials them and every other listener on the loopback it
/// shares with the sidecar. No handshake with the browser's sockets completes (the kernel's
/// answer is a connect that times out: the fence drops the SYN-ACK), while the box's own dev
/// server answers the same probe and h5i, from the host, still reaches DevTools in the same
/// namespace; the fence counted the drops. The daemon's socket is not in any mount namespace
/// the box has, no abstract socket answers, a raw socket is EPERM and the fence's table
/// cannot be flushed from inside. The relay still drives the browser afterwards, and a click
/// a human's hold refuses is refused on this path too.
fn bypass_case(tier: &'static str, as_user: bool) {
    let Some(sc) = SidecarBox::up(tier, as_user, "the browser fence") else {
        return;
    };
    let (c, serve) = (&sc.c, sc.serve());
    let _removed = RemovedAtEnd(c, "web");
    let (told, rc) = box_sh(
        c,
        "web",
        &format!("{serve}agent-browser open http://127.0.0.1:{APP_PORT}/ >/dev/null && agent-browser get cdp-url && agent-browser stream status"),
    );
    assert_eq!(rc, 0, "{told}");
    let urls: Vec<&str> = told
        .split_whitespace()
        .filter(|w| w.starts_with("ws://127.0.0.1:"))
        .collect();
    assert_eq!(
        urls.len(),
        2,
        "agent-browser named no DevTools and stream URLs: {told}"
    );
    let status = c.ok(&["browser", "status", "web"]);
    assert!(
        status.contains(
            "chat        refused: h5i never gives the box agent-browser's AI gateway credential"
        ),
        "{status}"
    );
    c.ok(&["browser", "take", "web"]);

    // The probe runs beside the box's own dev server (at supervised, the run's).
    let mut argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        format!("{serve}exec python3 -c \"$0\" \"$@\""),
        BYPASS_PROBE.to_string(),
        APP_PORT.to_string(),
    ];
    argv.extend(urls.iter().map(|u| u.to_string()));
    let mut args = vec!["box", "run", "web", "--"];
    args.extend(argv.iter().map(String::as_str));
    let out = c.h5i(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let seen: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();

    let tcp = seen["tcp"].as_object().unwrap();
    assert!(
        tcp[&APP_PORT.to_string()]
            .as_str()
            .unwrap()
            .starts_with("answered HTTP/"),
        "the box's own dev server did not answer the probe: {seen}"
    );
    let told: Vec<u64> = seen["told"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    // At the container tier the run's own egress proxy listens on the shared loopback too
    // (the box's, bound by the run's hook): it answers the probe as the proxy, never as Chrome.
    const PROXY_PORT: u16 = 3128;
    if tier == "container" {
        let proxy = tcp[&PROXY_PORT.to_string()].as_str().unwrap();
        assert!(
            proxy.starts_with("answered HTTP/1.1 400") && !told.contains(&u64::from(PROXY_PORT)),
            "the run's proxy did not answer as the proxy: {seen}"
        );
    }
    for (port, said) in tcp {
        if port == &APP_PORT.to_string() || (tier == "container" && port == &PROXY_PORT.to_string())
        {
            continue;
        }
        assert_eq!(
            said, "connect timed out",
            "the box reached its browser's port {port} around the relay: {seen}"
        );
    }
    for p in &told {
        assert!(tcp.contains_key(&p.to_string()), "{seen}");
    }
    let init = sidecar_init(c, "web");
    let devtools = told[0] as u16;
    let from_host = devtools_from_the_host(init, devtools);
    assert!(
        from_host.contains("\"Browser\": \"Chrome/"),
        "the same probe from the host's side did not reach DevTools: {from_host}"
    );
    let table = Command::new("nsenter")
        .arg(format!("--net=/proc/{init}/ns/net"))
        .args(["nft", "list", "table", "inet", "h5i_browser"])
        .output()
        .unwrap();
    let drops = stdout(&table)
        .lines()
        .find(|l| l.contains("h5i-browser-fence"))
        .and_then(|l| l.split("packets ").nth(1))
        .and_then(|n| n.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        drops >= told.len() as u64,
        "the fence counted {drops} drops: {}",
        stdout(&table)
    );

    for (name, said) in seen["unix"].as_object().unwrap() {
        assert_ne!(said, "connected", "the box connected to {name}: {seen}");
        if name.contains("h5i-browser/default.sock") {
            assert_eq!(said, "errno 2", "{name}: {seen}");
        }
    }
    assert_eq!(seen["raw"], "errno 1", "{seen}");
    // Refused by the kernel: the table's change (process), or already the netlink socket nft
    // needs, which the supervised tier's socket gate refuses. The browser image has no `nft`:
    // there the box holds no capability at all (a table change needs CAP_NET_ADMIN).
    let nft = seen["nft"].as_str().unwrap();
    if tier == "container" && nft == "missing" {
        assert_eq!(seen["capeff"], "0000000000000000", "{seen}");
    } else {
        assert!(
            !nft.starts_with("rc 0") && nft.contains("Operation not permitted"),
            "{nft}"
        );
    }

    // The relay is still the way in, and it still enforces the human's hold.
    let (snap, rc) = box_sh(c, "web", "agent-browser snapshot -i");
    assert_eq!(rc, 0, "{snap}");
    let (click, rc) = box_sh(
        c,
        "web",
        &format!("agent-browser click {}", sign_up_ref(&snap)),
    );
    assert_ne!(rc, 0, "{click}");
    assert!(
        click.contains("refusing: a human holds the browser of box `web`"),
        "{click}"
    );
    c.ok(&["browser", "release", "web"]);
    let (url, rc) = box_sh(c, "web", "agent-browser get url");
    assert_eq!(rc, 0, "{url}");
    assert!(url.contains(&format!("127.0.0.1:{APP_PORT}")), "{url}");
}

#[test]
fn a_box_reaches_its_browser_only_through_the_relay_never_devtools_or_the_daemon() {
    bypass_case("process", false);
}

#[test]
fn a_box_reaches_its_browser_only_through_the_relay_never_devtools_or_the_daemon_as_h5i_test() {
    bypass_case("process", true);
}

#[test]
fn a_container_box_reaches_its_browser_only_through_the_relay_never_devtools_or_the_daemon() {
    bypass_case("container", false);
}

#[test]
fn a_container_box_reaches_its_browser_only_through_the_relay_never_devtools_or_the_daemon_as_h5i_test(
) {
    bypass_case("container", true);
}

/// At the container tier a browser box's runs share the sidecar's network, where Chrome's one
/// proxy address is the running run's proxy: a second run while one is running is refused
/// (before anything of it starts) with the typed message, and runs again once the first ended.
fn one_run_at_a_time_case(as_user: bool) {
    let Some(sc) = SidecarBox::up("container", as_user, "one container browser run at a time")
    else {
        return;
    };
    let c = &sc.c;
    let who = c.who();
    let _removed = RemovedAtEnd(c, "web");
    let (open, rc) = box_sh(
        c,
        "web",
        &format!(
            "{}agent-browser open http://127.0.0.1:{APP_PORT}/",
            sc.serve()
        ),
    );
    assert_eq!(rc, 0, "{who}: {open}");
    let started = c.workspace("web").join("first-started");
    let first = c
        .h5i_in(
            &c.repo(),
            &[
                "box",
                "run",
                "web",
                "--",
                "sh",
                "-c",
                "touch /work/first-started && sleep 20 && agent-browser get url",
            ],
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !started.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(started.exists(), "{who}: the first run never started");
    let second = c.h5i(&["box", "run", "web", "--", "agent-browser", "get", "url"]);
    assert_ne!(second.status.code(), Some(0), "{who}: {}", stdout(&second));
    assert!(
        stderr(&second).contains("refusing: another run of box `web` is using the box's browser")
            && stderr(&second).contains("to fix: wait for that run"),
        "{who}: {}",
        stderr(&second)
    );
    let first = first.wait_with_output().unwrap();
    assert_eq!(
        first.status.code(),
        Some(0),
        "{who}: {}{}",
        stdout(&first),
        stderr(&first)
    );
    assert!(stdout(&first).contains("127.0.0.1:3000"), "{who}");
    let (url, rc) = box_sh(c, "web", "agent-browser get url");
    assert_eq!(rc, 0, "{who}: {url}");
    assert!(url.contains("127.0.0.1:3000"), "{who}: {url}");
}

#[test]
fn a_container_browser_boxs_second_concurrent_run_is_refused() {
    one_run_at_a_time_case(false);
}

#[test]
fn a_container_browser_boxs_second_concurrent_run_is_refused_as_h5i_test() {
    one_run_at_a_time_case(true);
}

#[test]
fn a_supervised_box_reaches_its_browser_only_through_the_relay_never_devtools_or_the_daemon() {
    bypass_case("supervised", false);
}

#[test]
fn a_supervised_box_reaches_its_browser_only_through_the_relay_never_devtools_or_the_daemon_as_h5i_test(
) {
    bypass_case("supervised", true);
}

/// `h5i box shell NAME -- sh -c SCRIPT` run by `c` (root's h5i, or h5i-test's through
/// `runuser`) on a terminal of its own (util-linux `script` holds the pty, so the session takes
/// the terminal path, not `box run`'s): everything it printed and its exit code.
fn shell_on_a_terminal(c: &Caller, name: &str, script: &str) -> (String, i32) {
    let quote = |a: &str| format!("'{}'", a.replace('\'', r"'\''"));
    // The command line, environment and removals every h5i of this caller gets, on `script`.
    let h5i = c.h5i_in(&c.repo(), &["box", "shell", name, "--", "sh", "-c", script]);
    let line = std::iter::once(h5i.get_program())
        .chain(h5i.get_args())
        .map(|a| quote(a.to_str().unwrap()))
        .collect::<Vec<_>>()
        .join(" ");
    let mut script_cmd = Command::new("script");
    for (k, v) in h5i.get_envs() {
        match v {
            Some(v) => script_cmd.env(k, v),
            None => script_cmd.env_remove(k),
        };
    }
    let mut child = script_cmd
        .args(["-qec", &line, "/dev/null"])
        .current_dir(c.repo())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    (
        format!("{}{}", stdout(&out), stderr(&out)),
        out.status.code().unwrap_or(-1),
    )
}

/// The box's receipt records of `kind`, in order.
fn records_of(c: &Caller, name: &str, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(c.box_dir(name).join("receipts.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["kind"] == kind)
        .collect()
}

/// A shell session on a terminal drives the box-lifetime browser (started for it, as for a
/// run) and reaches the box's dev server; right after it h5i drains what the page said into a
/// host-observed record that follows the session's own run record: the demo's console error,
/// exception and failing request, once. A later session that never touches the browser adds no
/// page record, and a run after it finds nothing new.
#[test]
fn a_shell_session_that_drove_the_browser_is_drained_after_it() {
    let Some(c) = demo_sidecar_box(false, "the drain after a shell session") else {
        return;
    };
    let _removed = RemovedAtEnd(&c, "web");
    let (said, rc) = shell_on_a_terminal(
        &c,
        "web",
        &format!("test -t 0 && agent-browser open http://127.0.0.1:{APP_PORT}/ && agent-browser wait 500"),
    );
    assert_eq!(rc, 0, "{said}");
    assert!(said.contains("h5i browser demo"), "{said}");
    let runs = records_of(&c, "web", "run");
    let pages = records_of(&c, "web", "page");
    assert_eq!(pages.len(), 1, "{pages:?}");
    let page = &pages[0];
    assert_eq!(page["after_seq"], runs.last().unwrap()["seq"], "{page}");
    assert_eq!(page["state"], "observed", "{page}");
    assert_eq!(page["lane"], "host-env-run", "{page}");
    let has = |key: &str, want: &str| {
        page[key].as_array().is_some_and(|l| {
            l.iter()
                .filter(|e| e.as_str().unwrap().contains(want))
                .count()
                == 1
        })
    };
    assert!(
        has("console_errors", "h5i-demo: deliberate console error"),
        "{page}"
    );
    assert!(
        has("exceptions", "h5i-demo: deliberate uncaught exception"),
        "{page}"
    );
    assert!(has("failed_requests", "h5i-demo-missing.json"), "{page}");

    let (said, rc) = shell_on_a_terminal(&c, "web", "true");
    assert_eq!(rc, 0, "{said}");
    assert_eq!(
        records_of(&c, "web", "page").len(),
        1,
        "a session that never drove the browser was drained"
    );
    let (url, rc) = box_sh(&c, "web", "agent-browser get url");
    assert_eq!(rc, 0, "{url}");
    let pages = records_of(&c, "web", "page");
    assert_eq!(pages.len(), 2, "{pages:?}");
    assert_eq!(pages[1]["state"], "observed", "{}", pages[1]);
    assert!(
        pages[1].get("console_errors").is_none(),
        "drained twice: {}",
        pages[1]
    );
}

/// `h5i box view` running for one test: killed (and reaped) when dropped.
#[cfg(feature = "ui")]
struct Viewer(std::process::Child);

#[cfg(feature = "ui")]
impl Viewer {
    /// How the viewer ended, waited for at most `limit` (its pidfd polled, then reaped); past
    /// it the test fails, and dropping the viewer kills it.
    fn ended_within(&mut self, limit: std::time::Duration) -> std::process::ExitStatus {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let pid = self.0.id() as libc::pid_t;
        // SAFETY: pidfd_open of this test's own child, not yet reaped; a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        assert!(fd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is the fresh descriptor pidfd_open returned, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut ready = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(limit.as_millis()).unwrap();
        // SAFETY: poll of one pollfd that lives across the call.
        let n = unsafe { libc::poll(&mut ready, 1, ms) };
        assert_eq!(n, 1, "the viewer did not end within {limit:?}");
        self.0.wait().unwrap()
    }
}

#[cfg(feature = "ui")]
impl Drop for Viewer {
    fn drop(&mut self) {
        // h5i-test's viewer is `runuser`'s child: it goes first, or it outlives the test.
        let pid = self.0.id();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: kill of a child of a process this test started, with a signal number.
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 GET of `path` at the viewer on `port` with `host` as its Host header and
/// `extra` header lines: the whole answer (status line, headers, body).
#[cfg(feature = "ui")]
fn viewer_get(port: u16, host: &str, path: &str, extra: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
}

#[cfg(feature = "ui")]
type ViewerSocket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Open the viewer's WebSocket with `origin` (none when `None`): the socket, or the HTTP status
/// the handshake was refused with.
#[cfg(feature = "ui")]
async fn viewer_ws(port: u16, token: &str, origin: Option<&str>) -> Result<ViewerSocket, u16> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://127.0.0.1:{port}/ws?token={token}")
        .into_client_request()
        .unwrap();
    if let Some(o) = origin {
        req.headers_mut().insert("Origin", o.parse().unwrap());
    }
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    match tokio_tungstenite::client_async(req, tcp).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("the viewer's WebSocket: {e}"),
    }
}

/// The next message from the viewer for which `want` says yes (bounded: 60 s in all).
#[cfg(feature = "ui")]
async fn viewer_next(
    ws: &mut ViewerSocket,
    want: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    use futures_util::StreamExt;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let m = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("the viewer said nothing wanted within 60 s")
            .expect("the viewer closed")
            .unwrap();
        if let tokio_tungstenite::tungstenite::Message::Text(t) = m {
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            if want(&v) {
                return v;
            }
        }
    }
}

#[cfg(feature = "ui")]
async fn viewer_send(ws: &mut ViewerSocket, v: serde_json::Value) {
    use futures_util::SinkExt;
    ws.send(tokio_tungstenite::tungstenite::Message::Text(
        v.to_string().into(),
    ))
    .await
    .unwrap();
}

/// Width and height of the JPEG whose base64 is `data`, and its size in bytes (decoded by the
/// host's python3: base64, then the first start-of-frame marker).
#[cfg(feature = "ui")]
fn jpeg_size(data: &str) -> (u32, u32, u32) {
    const DECODE: &str = r#"
import base64, struct, sys
b = base64.b64decode(open(sys.argv[1]).read())
assert b[:2] == b"\xff\xd8", "not a JPEG"
i = 2
while i < len(b):
    marker, n = b[i + 1], struct.unpack(">H", b[i + 2:i + 4])[0]
    if marker in (0xC0, 0xC1, 0xC2):
        h, w = struct.unpack(">HH", b[i + 5:i + 9]); print(w, h, len(b)); break
    i += 2 + n
"#;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("frame.b64");
    std::fs::write(&file, data).unwrap();
    let v = python_numbers(DECODE, &[file.to_str().unwrap().to_string()]);
    assert_eq!(v.len(), 3, "not a JPEG frame: {v:?}");
    (v[0], v[1], v[2])
}

/// `h5i box view web --port 0` (with `--open` when `open`) run by `c` with `env` added: the
/// viewer, its port and its token, read from the line it prints.
#[cfg(feature = "ui")]
fn start_viewer(c: &Caller, env: &[(&str, &str)], open: bool) -> (Viewer, u16, String) {
    let mut args = vec!["box", "view", "web", "--port", "0"];
    if open {
        args.push("--open");
    }
    let mut cmd = c.h5i_in(&c.repo(), &args);
    cmd.envs(env.iter().copied());
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let viewer = Viewer(child);
    let mut said = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut said).unwrap();
    let url = said
        .split(" at ")
        .nth(1)
        .unwrap_or_else(|| panic!("no URL in {said:?}"))
        .trim()
        .to_string();
    let rest = url
        .strip_prefix("http://127.0.0.1:")
        .unwrap_or_else(|| panic!("not loopback: {url}"));
    let (port, token) = rest.split_once("/?token=").unwrap();
    (viewer, port.parse().unwrap(), token.to_string())
}

/// The bodies of the `viewer-session` records in the log at `receipts`, in order.
#[cfg(feature = "ui")]
fn viewer_records(receipts: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(receipts)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["kind"] == "viewer-session")
        .collect()
}

/// `h5i box view`: served on loopback only, every request without the box's token is 401, a
/// foreign Host is 421, a WebSocket from another origin (or none) is refused; the page's socket
/// carries the box's frames (a JPEG the size of the in-box screenshot); a click from the page
/// while the agent holds the lock is dropped and counted and the page does not change; taking
/// control from the page takes the lock (the agent's click is then refused by the relay) and
/// the human's click lands; both sessions are in report.md's "Viewer sessions".
#[cfg(feature = "ui")]
fn viewer_case(as_user: bool) {
    let Some(c) = demo_sidecar_box(as_user, "h5i box view") else {
        return;
    };
    let by = viewer_by(&c);
    let _removed = RemovedAtEnd(&c, "web");
    let (open, rc) = box_sh(
        &c,
        "web",
        &format!("agent-browser open http://127.0.0.1:{APP_PORT}/ && agent-browser screenshot /work/shot.png"),
    );
    assert_eq!(rc, 0, "{open}");
    let (shot_w, shot_h, _) = png_pixel(&c.workspace("web").join("shot.png"), 8, 8);

    let fake = tempfile::tempdir().unwrap();
    let record = common::opener::fake_opener(fake.path());
    hand_to(&c, fake.path());
    hand_to(&c, &record);
    hand_to(&c, &record.join("done"));
    let path = common::opener::path_with(fake.path());
    let (viewer, port, token) = start_viewer(&c, &[("PATH", &path)], true);
    let url = format!("http://127.0.0.1:{port}/?token={token}");
    assert_eq!(
        c.ok(&["browser", "url", "web", "--port", &port.to_string()])
            .trim(),
        url
    );
    // Bound to loopback alone: the viewer's one listening socket (TCP, TCP6 and unix read from
    // its own socket table) is TCP on 127.0.0.1 at the printed port.
    let sockets = common::listens(common::caller::h5i_pid(viewer.0.id()));
    let want = format!("0100007F:{port:04X}");
    assert!(
        sockets.len() == 1
            && sockets[0].starts_with("tcp: ")
            && sockets[0].split_whitespace().nth(2) == Some(want.as_str()),
        "the viewer listens beyond {want}: {sockets:?}"
    );

    // `--open`: xdg-open was handed a private file leading to the URL, never the token.
    common::opener::opened(&record);
    let read = |f: &str| common::opener::recorded(&record, f);
    let (argv, env) = (read("argv"), read("env"));
    assert!(
        !argv.contains(&token) && !env.contains(&token),
        "the token reached xdg-open: {argv}"
    );
    let file = argv.lines().nth(1).unwrap().to_string();
    assert_eq!(
        (read("mode").trim(), read("dirmode").trim()),
        ("600", "700")
    );
    assert!(
        read("page").contains(&format!("content=\"0;url={url}\"")),
        "{}",
        read("page")
    );
    assert!(
        Path::new(&file).exists(),
        "the handoff file went before the browser came"
    );

    let host = format!("127.0.0.1:{port}");
    for (path, what) in [
        ("/".to_string(), "no token"),
        ("/?token=".to_string(), "an empty token"),
        (format!("/?token={}", "0".repeat(64)), "a wrong token"),
        (format!("/?token={token}x"), "a longer token"),
        ("/ws".to_string(), "the socket without a token"),
        ("/../browser/viewer.token".to_string(), "a traversal"),
    ] {
        let answer = viewer_get(port, &host, &path, "");
        assert!(answer.starts_with("HTTP/1.1 401"), "{what}: {answer}");
        assert!(!answer.contains(&token), "{what}: the token leaked");
    }
    assert!(
        Path::new(&file).exists(),
        "a refused request removed the handoff file"
    );
    let page = viewer_get(port, &host, &format!("/?token={token}"), "");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        !Path::new(&file).exists(),
        "the handoff file outlived the token's use"
    );
    let lower = page.to_ascii_lowercase();
    assert!(
        lower.contains("content-security-policy: default-src 'none'"),
        "{page}"
    );
    assert!(lower.contains("x-frame-options: deny"), "{page}");
    assert!(page.contains("h5i box view"), "{page}");
    let rebound = viewer_get(
        port,
        &format!("evil.test:{port}"),
        &format!("/?token={token}"),
        "",
    );
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let own = format!("http://127.0.0.1:{port}");
    for origin in [
        Some("http://evil.test"),
        Some("http://localhost:1"),
        Some("null"),
        None,
    ] {
        let refused = rt.block_on(viewer_ws(port, &token, origin));
        assert_eq!(refused.err(), Some(403), "origin {origin:?} was let in");
    }
    assert_eq!(
        rt.block_on(viewer_ws(port, "nope", Some(&own))).err(),
        Some(401)
    );

    let mut ws = rt.block_on(viewer_ws(port, &token, Some(&own))).unwrap();
    let frame = rt.block_on(viewer_next(&mut ws, |m| m["type"] == "frame"));
    let (w, h, bytes) = jpeg_size(frame["data"].as_str().unwrap());
    assert_eq!(
        (w, h),
        (shot_w, shot_h),
        "a frame unlike the in-box screenshot"
    );
    assert!(bytes > 2000, "a blank frame of {bytes} bytes");
    let st = rt.block_on(viewer_next(&mut ws, |m| m["type"] == "h5i"));
    assert_eq!(st["box"], "web", "{st}");
    assert_eq!(st["holder"], "agent", "{st}");
    assert!(
        st["egress"].as_str().unwrap().starts_with("deny all"),
        "{st}"
    );
    assert_eq!(st["origin"], format!("http://127.0.0.1:{APP_PORT}"), "{st}");

    // Where the page's button is, asked the browser (a read-only verb, fine for either holder).
    let (bbox, rc) = box_sh(&c, "web", "agent-browser get box '#go' --json");
    assert_eq!(rc, 0, "{bbox}");
    let b: serde_json::Value =
        serde_json::from_str(bbox.trim()).unwrap_or_else(|e| panic!("{e}: {bbox}"));
    let b = if b["data"].is_object() {
        b["data"].clone()
    } else {
        b
    };
    let x = b["x"].as_f64().unwrap() + b["width"].as_f64().unwrap() / 2.0;
    let y = b["y"].as_f64().unwrap() + b["height"].as_f64().unwrap() / 2.0;
    let click = |ws: &mut ViewerSocket| {
        for kind in ["mousePressed", "mouseReleased"] {
            rt.block_on(viewer_send(
                ws,
                serde_json::json!({"type": "input_mouse", "eventType": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            ));
        }
    };

    // The agent holds the lock: the human's click is dropped, counted, and changes nothing.
    click(&mut ws);
    let st = rt.block_on(viewer_next(&mut ws, |m| {
        m["type"] == "h5i" && m["input_dropped"] == 2
    }));
    assert_eq!(st["input_sent"], 0, "{st}");
    let (out_text, _) = box_sh(&c, "web", "agent-browser get text '#out'");
    assert!(
        !out_text.contains("signed up"),
        "a dropped click landed: {out_text}"
    );

    // Taking control from the page takes the lock: the agent's click is refused by the relay,
    // and the human's lands.
    rt.block_on(viewer_send(&mut ws, serde_json::json!({"type": "take"})));
    let st = rt.block_on(viewer_next(&mut ws, |m| {
        m["type"] == "h5i" && m["mine"] == true
    }));
    assert!(
        st["holder"].as_str().unwrap().starts_with("human: "),
        "{st}"
    );
    a_human_holds_the_browser(&c);
    click(&mut ws);
    rt.block_on(viewer_next(&mut ws, |m| {
        m["type"] == "h5i" && m["input_sent"] == 2
    }));
    let (out_text, rc) = box_sh(&c, "web", "agent-browser get text '#out'");
    assert_eq!(rc, 0, "{out_text}");
    assert!(
        out_text.contains("signed up"),
        "the human's click did not land: {out_text}"
    );
    rt.block_on(viewer_send(&mut ws, serde_json::json!({"type": "release"})));
    rt.block_on(viewer_next(&mut ws, |m| {
        m["type"] == "h5i" && m["holder"] == "agent"
    }));
    rt.block_on(async {
        let _ = ws.close(None).await;
    });
    drop(ws);

    // The session's closing record is written as the server sees the close: wait for it.
    let receipts = c.box_dir("web").join("receipts.jsonl");
    let closed = (0..200).any(|_| {
        let text = std::fs::read_to_string(&receipts).unwrap_or_default();
        let done = text.contains("\"event\":\"closed\"");
        if !done {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        done
    });
    assert!(closed, "no closing viewer record");

    // A viewer SIGKILLed mid-session: its session is closed as `killed`, with the counts it
    // last saved, by the next `box view`; that one, stopped by Ctrl-C, closes its own.
    let mut ws = rt.block_on(viewer_ws(port, &token, Some(&own))).unwrap();
    click(&mut ws);
    rt.block_on(viewer_next(&mut ws, |m| {
        m["type"] == "h5i" && m["input_dropped"] == 2
    }));
    let mut viewer = viewer;
    // h5i itself (h5i-test's goes through `runuser`), then what launched it.
    let h5i = common::caller::h5i_pid(viewer.0.id());
    // SAFETY: kill of a pid this test started, with a signal number.
    assert_eq!(unsafe { libc::kill(h5i, libc::SIGKILL) }, 0);
    viewer.0.kill().unwrap();
    viewer.0.wait().unwrap();
    drop(ws);
    let (viewer, port, token) = start_viewer(&c, &[], false);
    let sessions = viewer_records(&receipts);
    let killed: Vec<&serde_json::Value> =
        sessions.iter().filter(|b| b["event"] == "killed").collect();
    assert_eq!(killed.len(), 1, "{sessions:?}");
    assert_eq!(killed[0]["input_dropped"], 2, "{sessions:?}");
    assert_eq!(
        sessions
            .iter()
            .filter(|b| b["session"] == killed[0]["session"])
            .count(),
        2,
        "the killed session is not one opening and one ending: {sessions:?}"
    );
    let own = format!("http://127.0.0.1:{port}");
    let mut ws = rt.block_on(viewer_ws(port, &token, Some(&own))).unwrap();
    rt.block_on(viewer_next(&mut ws, |m| m["type"] == "h5i"));
    let mut viewer = viewer;
    // Ctrl-C goes to h5i itself: h5i-test's `runuser` blocks SIGINT while it waits for its
    // child (a terminal's Ctrl-C reaches the child's process group directly), so a SIGINT
    // sent to `runuser` is never delivered and the wait below would never end.
    let h5i = common::caller::h5i_pid(viewer.0.id());
    // SAFETY: kill(2) of the h5i this test started (or `runuser` did), not yet reaped.
    unsafe { libc::kill(h5i, libc::SIGINT) };
    let ended = viewer.ended_within(std::time::Duration::from_secs(60));
    assert!(
        ended.success(),
        "Ctrl-C did not end the viewer cleanly: {ended:?}"
    );
    drop(ws);
    let sessions = viewer_records(&receipts);
    let last = sessions.last().unwrap();
    assert_eq!(last["event"], "closed", "{sessions:?}");
    for b in &sessions {
        let id = &b["session"];
        let ends = sessions
            .iter()
            .filter(|o| o["session"] == *id && o["event"] != "opened")
            .count();
        assert_eq!(ends, 1, "session {id} has {ends} endings: {sessions:?}");
    }
    let doctor: serde_json::Value =
        serde_json::from_str(&c.ok(&["box", "doctor", "web", "--json"])).unwrap();
    let receipts_check = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["what"] == "receipts")
        .unwrap();
    assert_eq!(receipts_check["ok"], true, "{doctor}");
    drop(viewer);
    let out = tempfile::tempdir().unwrap();
    hand_to(&c, out.path());
    let dest = out.path().join("review");
    c.ok(&["box", "export", "web", "--out", dest.to_str().unwrap()]);
    let report = std::fs::read_to_string(dest.join("report.md")).unwrap();
    let sessions = report
        .split("## Viewer sessions")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap();
    for want in [
        format!("browser viewer opened by {by}"),
        format!("browser viewer closed by {by}: a human took control; 2 input events sent, 2 dropped"),
        format!("browser viewer killed by {by}: watched only; 0 input events sent, 2 dropped while the agent held control (the viewer was killed"),
        "browser take by".to_string(),
        "browser release by".to_string(),
    ] {
        assert!(sessions.contains(&want), "{want} not in: {sessions}");
    }
}

/// Give `path` (made by the test, as root) to `c`'s user, so h5i and its helpers write there.
fn hand_to(c: &Caller, path: &Path) {
    std::os::unix::fs::chown(path, Some(c.uid()), None).unwrap();
}

/// How viewer records and the status row name the human running `c`'s viewer.
#[cfg(feature = "ui")]
fn viewer_by(c: &Caller) -> String {
    format!("{} (uid {})", c.who(), c.uid())
}

#[cfg(feature = "ui")]
#[test]
fn the_viewer_shows_the_boxs_browser_and_passes_input_only_for_the_lock_holder() {
    viewer_case(false);
}

#[cfg(feature = "ui")]
#[test]
fn the_viewer_shows_the_boxs_browser_and_passes_input_only_for_the_lock_holder_as_h5i_test() {
    viewer_case(true);
}

/// Where the page the viewer shows has frame pixel (x, y), in the viewer page's CSS pixels: the
/// frame `<img>`'s content box (its border left out), scaled from the frame's own size.
#[cfg(feature = "ui")]
struct FrameBox {
    left: f64,
    top: f64,
    scale_x: f64,
    scale_y: f64,
    natural: (u32, u32),
}

#[cfg(feature = "ui")]
impl FrameBox {
    fn of(b: &mut common::chromium::Browser) -> FrameBox {
        let v = b.eval(
            "(() => { const i = document.getElementById('frame'); const r = i.getBoundingClientRect(); \
             return [r.left + i.clientLeft, r.top + i.clientTop, i.clientWidth, i.clientHeight, i.naturalWidth, i.naturalHeight]; })()",
        );
        let n: Vec<f64> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        FrameBox {
            left: n[0],
            top: n[1],
            scale_x: n[2] / n[4],
            scale_y: n[3] / n[5],
            natural: (n[4] as u32, n[5] as u32),
        }
    }

    /// The viewer page's point over frame point (`x`, `y`).
    fn at(&self, x: f64, y: f64) -> (f64, f64) {
        (self.left + x * self.scale_x, self.top + y * self.scale_y)
    }

    /// The viewer page's pixel showing frame pixel (`x`, `y`) (its centre's).
    fn pixel(&self, x: u32, y: u32) -> (u32, u32) {
        let (px, py) = self.at(f64::from(x) + 0.5, f64::from(y) + 0.5);
        (px as u32, py as u32)
    }
}

/// The text of the element `id` in the page `b` shows.
#[cfg(feature = "ui")]
fn text_of(b: &mut common::chromium::Browser, id: &str) -> String {
    b.eval(&format!("document.getElementById('{id}').textContent"))
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A human holds box `web`'s browser: `h5i browser status` says so, and the agent's click is
/// refused with the typed message.
#[cfg(feature = "ui")]
fn a_human_holds_the_browser(c: &Caller) {
    let status: serde_json::Value =
        serde_json::from_str(&c.ok(&["browser", "status", "web", "--json"])).unwrap();
    assert_eq!(status["holder"], "human", "{status}");
    let (agent, rc) = box_sh(c, "web", "agent-browser click '#go'");
    assert_ne!(
        rc, 0,
        "the agent clicked while the human held control: {agent}"
    );
    assert!(
        agent.contains("refusing: a human holds the browser of box `web`"),
        "{agent}"
    );
}

/// `h5i box view` in a real browser: headless Chromium on the host opens the URL the viewer
/// printed, as a human does, and the page's own script draws the box's frames: the frame's
/// pixels, screenshotted off the viewer's page, are the in-box `agent-browser screenshot`'s
/// (the demo's swatch, the page's white around it, and a grid over the whole frame). h5i's
/// status bar names the box, the lock holder, the page's origin and the egress policy. A real
/// mouse click on the frame while the agent holds the lock is dropped and counted; the page's
/// take button takes the lock, after which the agent's click is refused with the typed message
/// and the human's click on the frame lands (and the frames follow); hand back returns the
/// lock. While the box is up, `h5i ui` (the same user's) marks it amber for the demo page's
/// deliberate errors. Under `H5I_WRITE_DOCS`, root's process-tier page is docs/box-view.png.
#[cfg(feature = "ui")]
fn chromium_viewer_case(tier: &'static str, as_user: bool) {
    let Some(chromium) = common::chromium::chromium() else {
        return;
    };
    let Some(sc) = SidecarBox::up(tier, as_user, "h5i box view in Chromium") else {
        return;
    };
    let (c, serve) = (&sc.c, sc.serve());
    let by = viewer_by(c);
    let _removed = RemovedAtEnd(c, "web");
    let (open, rc) = box_sh(
        c,
        "web",
        &format!("{serve}agent-browser open http://127.0.0.1:{APP_PORT}/ && agent-browser screenshot /work/shot.png"),
    );
    assert_eq!(rc, 0, "{open}");
    let shot = c.workspace("web").join("shot.png");
    let (shot_w, shot_h, swatch) = png_pixel(&shot, 8, 8);
    assert_eq!(swatch, SWATCH_RGB, "the in-box screenshot has no swatch");

    // The console sees the page's deliberate errors (drained at the run's end): amber.
    let console = common::console::Console::of(c);
    let fleet = console.fleet();
    common::console::assert_signal(&fleet, "web", "amber", "the browser reported ");
    let (cookie, base) = console.login();
    let detail = console.get(&cookie, &format!("{base}api/box/web")).json();
    let page_rows: Vec<&serde_json::Value> = detail["flight"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["cells"][4]
                .as_str()
                .is_some_and(|p| p.starts_with("page "))
        })
        .collect();
    assert!(
        !page_rows.is_empty() && page_rows.iter().all(|r| r["colour"] == "amber"),
        "{detail}"
    );
    drop(console);

    let (_viewer, port, token) = start_viewer(c, &[], false);
    let profile = tempfile::tempdir().unwrap();
    let mut b = common::chromium::Browser::launch(chromium, profile.path());
    b.open(&format!("http://127.0.0.1:{port}/?token={token}"));
    b.until(
        "document.getElementById('frame').naturalWidth > 0 && document.getElementById('box').textContent === 'web'",
    );
    let frame = FrameBox::of(&mut b);
    assert_eq!(
        frame.natural,
        (shot_w, shot_h),
        "the page draws a frame unlike the in-box screenshot"
    );
    // While the viewer serves (its token in its memory and in the page's URL), the box
    // still cannot read the token.
    token_out_of_reach(c, "web", &token);

    // h5i's status bar.
    let egress = match tier {
        "supervised" => "deny all but allowed.test:8080",
        _ => "deny all (the box's own loopback only)",
    };
    let origin = format!("http://127.0.0.1:{APP_PORT}");
    for (id, want) in [
        ("box", "web"),
        ("holder", "agent"),
        ("origin", origin.as_str()),
        ("egress", egress),
        ("sent", "0"),
        ("dropped", "0"),
    ] {
        assert_eq!(text_of(&mut b, id), want, "the status bar's #{id}");
    }
    assert_eq!(b.eval("document.getElementById('take').hidden"), false);

    // The frame as the viewer's page shows it, pixel for pixel against the in-box screenshot:
    // the swatch, white beside and below it, and a grid over the whole frame.
    let screenshot = b.screenshot();
    let dir = tempfile::tempdir().unwrap();
    let page_png = dir.path().join("view.png");
    std::fs::write(&page_png, &screenshot).unwrap();
    let mut points: Vec<(u32, u32)> = vec![(8, 8), (32, 32), (56, 56), (100, 8), (8, 80)];
    for gy in 0..8 {
        for gx in 0..12 {
            points.push(((shot_w - 1) * gx / 11, (shot_h - 1) * gy / 7));
        }
    }
    let (_, _, inbox) = png_pixels(&shot, &points);
    let on_page: Vec<(u32, u32)> = points.iter().map(|&(x, y)| frame.pixel(x, y)).collect();
    let (_, _, shown) = png_pixels(&page_png, &on_page);
    let off = |a: [u8; 3], b: [u8; 3]| a.iter().zip(b).map(|(x, y)| x.abs_diff(y)).max().unwrap();
    for (i, want) in [SWATCH_RGB, SWATCH_RGB, SWATCH_RGB, [255; 3], [255; 3]]
        .into_iter()
        .enumerate()
    {
        assert!(
            off(inbox[i], want) <= 24 && off(shown[i], want) <= 24,
            "frame pixel {:?}: in the box {:?}, on the viewer's page {:?}, not {want:?}",
            points[i],
            inbox[i],
            shown[i]
        );
    }
    let mean: f64 = inbox[5..]
        .iter()
        .zip(&shown[5..])
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .map(|(x, y)| f64::from(x.abs_diff(*y)))
                .sum::<f64>()
                / 3.0
        })
        .sum::<f64>()
        / (inbox.len() - 5) as f64;
    assert!(
        mean <= 12.0,
        "the viewer's page shows a frame unlike the in-box screenshot (mean difference {mean:.1} over a grid)"
    );

    // The agent holds the lock: a real click on the frame's Sign up button is dropped and
    // counted, and the page does not change.
    let go = centre_of(c, "#go");
    let on_go = frame.at(go.0, go.1);
    b.click_at(on_go.0, on_go.1);
    b.until("document.getElementById('dropped').textContent === '2'");
    assert_eq!(text_of(&mut b, "sent"), "0");
    let (out_text, _) = box_sh(c, "web", "agent-browser get text '#out'");
    assert!(
        !out_text.contains("signed up"),
        "a dropped click landed: {out_text}"
    );

    // The page's take button takes the lock: the agent's click is refused with the typed
    // message, and the human's click on the frame lands.
    let take = b.eval(
        "(() => { const r = document.getElementById('take').getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()",
    );
    b.click_at(take[0].as_f64().unwrap(), take[1].as_f64().unwrap());
    b.until("document.getElementById('holder').textContent.startsWith('human: ') && !document.getElementById('release').hidden");
    assert_eq!(text_of(&mut b, "holder"), format!("human: {by}"));
    a_human_holds_the_browser(c);
    let seq = b.eval("document.getElementById('frame').dataset.seq");
    b.click_at(on_go.0, on_go.1);
    b.until("document.getElementById('sent').textContent === '2'");
    let (out_text, rc) = box_sh(c, "web", "agent-browser get text '#out'");
    assert_eq!(rc, 0, "{out_text}");
    assert!(
        out_text.contains("signed up"),
        "the human's click did not land: {out_text}"
    );
    b.until(&format!(
        "document.getElementById('frame').dataset.seq !== {seq}"
    ));
    if tier == "process" && !as_user && std::env::var_os("H5I_WRITE_DOCS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/box-view.png");
        std::fs::write(docs, b.screenshot()).unwrap();
    }

    // Hand back.
    b.eval("document.getElementById('release').click()");
    b.until("document.getElementById('holder').textContent === 'agent' && !document.getElementById('take').hidden");
    let status: serde_json::Value =
        serde_json::from_str(&c.ok(&["browser", "status", "web", "--json"])).unwrap();
    assert_eq!(status["holder"], "agent", "{status}");
}

#[cfg(feature = "ui")]
#[test]
fn chromium_shows_the_viewers_frames_and_its_take_button_takes_the_lock() {
    chromium_viewer_case("process", false);
}

#[cfg(feature = "ui")]
#[test]
fn chromium_shows_the_viewers_frames_and_its_take_button_takes_the_lock_as_h5i_test() {
    chromium_viewer_case("process", true);
}

#[cfg(feature = "ui")]
#[test]
fn chromium_shows_a_supervised_viewers_frames_and_its_take_button_takes_the_lock() {
    chromium_viewer_case("supervised", false);
}

#[cfg(feature = "ui")]
#[test]
fn chromium_shows_a_supervised_viewers_frames_and_its_take_button_takes_the_lock_as_h5i_test() {
    chromium_viewer_case("supervised", true);
}

/// The terminal the `--term` cases run in: 160 by 48 cells of 10 by 20 pixels.
#[cfg(feature = "ui")]
const TERM_CELL: (u32, u32) = (10, 20);

/// `h5i box view web --term` run by `c` on a real pty, whose terminal answers as `answers`.
#[cfg(feature = "ui")]
fn term_viewer(c: &Caller, answers: common::kitty::Answers) -> common::kitty::Terminal {
    use std::os::fd::AsRawFd;
    let cmd = c.h5i_in(&c.repo(), &["box", "view", "web", "--term"]);
    let session = common::pty::Session::spawn(cmd, std::time::Duration::from_secs(60));
    common::pty::set_pixel_size(
        session.master.as_raw_fd(),
        48,
        160,
        (160 * TERM_CELL.0 as u16, 48 * TERM_CELL.1 as u16),
    );
    common::kitty::Terminal::new(session, answers)
}

/// The centre of the element `selector` in the box's page, in page pixels.
#[cfg(feature = "ui")]
fn centre_of(c: &Caller, selector: &str) -> (f64, f64) {
    let (bbox, rc) = box_sh(
        c,
        "web",
        &format!("agent-browser get box '{selector}' --json"),
    );
    assert_eq!(rc, 0, "{bbox}");
    let b: serde_json::Value =
        serde_json::from_str(bbox.trim()).unwrap_or_else(|e| panic!("{e}: {bbox}"));
    let b = if b["data"].is_object() {
        b["data"].clone()
    } else {
        b
    };
    (
        b["x"].as_f64().unwrap() + b["width"].as_f64().unwrap() / 2.0,
        b["y"].as_f64().unwrap() + b["height"].as_f64().unwrap() / 2.0,
    )
}

/// A click (press and release, SGR mouse reporting) at the cell over page point `at`.
#[cfg(feature = "ui")]
fn click_cell(term: &common::kitty::Terminal, at: (f64, f64)) {
    let (col, row) = term.cell_of(at.0, at.1, TERM_CELL);
    term.send(format!("\x1b[<0;{col};{row}M\x1b[<0;{col};{row}m").as_bytes());
}

/// The page the agent makes hostile: its title, its URL and (after the run's drain) its
/// console carry an OSC 52 clipboard write, CSI, DCS and C1 controls.
#[cfg(feature = "ui")]
const HOSTILE_EVAL: &str = r#"agent-browser eval 'document.title = "\u001b]52;c;aDVpLXB3bmVk\u0007\u009b2J"; history.pushState({}, "", "/\u001b]0;aDVpLXB3bmVk\u0007\u001bP1$r\u001b\\"); setTimeout(function () { console.error("\u001b]52;c;aDVpLXB3bmVk\u0007 \u001b[2J \u001bP1$raDVpLXB3bmVk\u001b\\ \u009d0;aDVpLXB3bmVk\u009c"); console.error("twice"); }, 4000); "ok"'"#;

/// `h5i box view --term`: in a terminal that speaks the Kitty graphics protocol (a parsing
/// harness on a real pty), row one is h5i's (box, mode, lock holder, origin, egress policy,
/// console errors); the box's frames arrive as h5i's own graphics commands and decode to the
/// in-box screenshot's size, its swatch where the page paints it; the viewer binds nothing;
/// `i` takes the lock (the agent's click is then refused), clicks at a cell land on the page
/// element under it and keys type, `Ctrl-]` hands back; a hostile page's title, URL and console
/// text reach the terminal as nothing but a count; `q` leaves, restoring the screen, and the
/// session is recorded in the `viewer` lane and report.md. The box is at `tier`: process or
/// supervised (whose runs serve the demo app themselves).
#[cfg(feature = "ui")]
fn term_case(tier: &'static str, as_user: bool) {
    use common::kitty::Answers;
    use std::time::Duration;
    let Some(sc) = SidecarBox::up(tier, as_user, "h5i box view --term") else {
        return;
    };
    let serve = sc.serve();
    let SidecarBox { c, _hosts, .. } = sc;
    let by = viewer_by(&c);
    let _removed = RemovedAtEnd(&c, "web");
    let (open, rc) = box_sh(
        &c,
        "web",
        &format!("{serve}agent-browser open http://127.0.0.1:{APP_PORT}/ && agent-browser screenshot /work/shot.png"),
    );
    assert_eq!(rc, 0, "{open}");
    let (shot_w, shot_h, _) = png_pixel(&c.workspace("web").join("shot.png"), 8, 8);
    let receipts = c.box_dir("web").join("receipts.jsonl");
    let before = viewer_records(&receipts).len();

    let mut term = term_viewer(&c, Answers::Kitty);
    let origin = format!("http://127.0.0.1:{APP_PORT}");
    let row = term.row_where("naming the box, the lock and the origin", |r| {
        r.contains(&origin) && r.contains("console errors: ")
    });
    assert!(term.probed, "no graphics query was sent");
    for want in [
        " h5i │ web │ watching │ lock: agent │ ",
        "│ egress: deny all",
        "│ i drive",
    ] {
        assert!(row.contains(want), "{want:?} not in row one {row:?}");
    }
    assert!(
        term.until(Duration::from_secs(60), |t| !t.images.is_empty()),
        "no image arrived: {}",
        term.session.transcript()
    );
    let img = term.images[0].clone();
    assert_eq!(img.key("a"), Some("T"), "{:?}", img.keys);
    assert_eq!(
        (img.width, img.height),
        (shot_w, shot_h),
        "a frame unlike the in-box screenshot"
    );
    let swatch = img.rgb(8, 8);
    assert!(
        swatch
            .iter()
            .zip(SWATCH_RGB)
            .all(|(a, b)| a.abs_diff(b) <= 24),
        "the swatch is {swatch:?}, not {SWATCH_RGB:?}"
    );
    // h5i itself: h5i-test's viewer is `runuser`'s child, and runuser binds nothing either way.
    let pid = common::caller::h5i_pid(term.session.child.id());
    assert_eq!(
        common::listens(pid),
        Vec::<String>::new(),
        "the terminal viewer binds"
    );

    // Watching: a key is not the page's, and the lock stays the agent's.
    term.send(b"x");
    term.send(b"i");
    let row = term.row_where("driving", |r| r.contains("│ driving │"));
    assert!(row.contains(&format!("lock: human: {by}")), "{row:?}");
    // The hint is the row's last field, cut to the terminal's width after a longer name.
    assert!(row.contains("Ctrl-] h"), "{row:?}");
    assert!(
        common::pty::find(&term.session.seen, b"\x1b[?1006h").is_some(),
        "driving did not turn on mouse reporting"
    );
    let status: serde_json::Value =
        serde_json::from_str(&c.ok(&["browser", "status", "web", "--json"])).unwrap();
    assert_eq!(status["holder"], "human", "{status}");
    let (agent, rc) = box_sh(&c, "web", "agent-browser click '#go'");
    assert_ne!(rc, 0, "the agent clicked while the human drove: {agent}");
    assert!(
        agent.contains("refusing: a human holds the browser of box `web`"),
        "{agent}"
    );

    // A click on the email field's cell focuses it, typed keys land, a click on the button's
    // cell presses it.
    click_cell(&term, centre_of(&c, "#email"));
    term.send(b"ab@x.test");
    click_cell(&term, centre_of(&c, "#go"));
    let landed = (0..30).any(|_| {
        let (out, _) = box_sh(&c, "web", "agent-browser get text '#out'");
        let done = out.contains("signed up ab@x.test");
        if !done {
            term.until(Duration::from_secs(1), |_| false);
        }
        done
    });
    assert!(landed, "the human's clicks and keys did not land");

    term.send(b"\x1d");
    let row = term.row_where("watching again", |r| r.contains("│ watching │"));
    assert!(row.contains("lock: agent"), "{row:?}");
    let status: serde_json::Value =
        serde_json::from_str(&c.ok(&["browser", "status", "web", "--json"])).unwrap();
    assert_eq!(status["holder"], "agent", "{status}");

    // A hostile page: none of its text reaches the terminal, only its console error count.
    let (hostile, rc) = box_sh(&c, "web", HOSTILE_EVAL);
    assert_eq!(rc, 0, "{hostile}");
    let row = term.row_where("counting the hostile console errors", |r| {
        r.contains("console errors: 2")
    });
    assert!(row.contains(&origin), "{row:?}");
    term.until(Duration::from_secs(2), |_| false);
    assert!(
        term.foreign.is_empty(),
        "escape sequences h5i did not generate reached the terminal: {:?}",
        term.foreign
    );
    for raw in [
        b"\x1b]".as_slice(),
        b"\x1bP",
        b"\x07",
        "\u{9b}".as_bytes(),
        "\u{9d}".as_bytes(),
        b"aDVpLXB3bmVk",
    ] {
        assert!(
            common::pty::find(&term.session.seen, raw).is_none(),
            "{raw:?} reached the terminal"
        );
    }

    term.send(b"q");
    assert_eq!(term.finish(), 0, "{}", term.session.transcript());
    let seen = &term.session.seen;
    for restored in [b"\x1b[?1049l".as_slice(), b"\x1b[?25h", b"\x1b_Ga=d,d=A"] {
        assert!(
            common::pty::find(seen, restored).is_some(),
            "leaving did not send {restored:?}"
        );
    }
    let sessions = viewer_records(&receipts);
    let mine: Vec<&serde_json::Value> = sessions[before..]
        .iter()
        .filter(|b| b["via"] == "terminal viewer")
        .collect();
    assert_eq!(mine.len(), 2, "{sessions:?}");
    assert_eq!(mine[0]["event"], "opened", "{sessions:?}");
    assert_eq!(mine[1]["event"], "closed", "{sessions:?}");
    assert_eq!(mine[1]["took_control"], true, "{sessions:?}");
    // Two clicks (press and release each) and nine keys (press and release each).
    assert_eq!(mine[1]["input_sent"], 22, "{sessions:?}");
    assert_eq!(mine[1]["input_dropped"], 0, "{sessions:?}");
    let out = tempfile::tempdir().unwrap();
    hand_to(&c, out.path());
    let dest = out.path().join("review");
    c.ok(&["box", "export", "web", "--out", dest.to_str().unwrap()]);
    let report = std::fs::read_to_string(dest.join("report.md")).unwrap();
    assert!(
        report.contains(&format!(
            "terminal viewer closed by {by}: a human took control; 22 input events sent"
        )),
        "{report}"
    );
}

/// `--term` in a terminal without the Kitty graphics protocol: one that answers the device
/// attributes but not the graphics query, and one that answers nothing, each get the refusal
/// pointing at the browser viewer, and no session is recorded.
#[cfg(feature = "ui")]
fn term_refusal_case(as_user: bool) {
    use common::kitty::Answers;
    if !require_root(
        "h5i box view --term refusal",
        "boxes as root and as h5i-test",
    ) {
        return;
    }
    let mut c = Caller::either(as_user);
    browser_box(&mut c, "web", "process");
    let _removed = RemovedAtEnd(&c, "web");
    let receipts = c.box_dir("web").join("receipts.jsonl");
    for (answers, why) in [
        (Answers::Plain, "it did not answer h5i's graphics query"),
        (Answers::Mute, "it answered nothing within 3 s"),
    ] {
        let mut term = term_viewer(&c, answers);
        assert_ne!(term.finish(), 0, "{}", term.session.transcript());
        let said = String::from_utf8_lossy(&term.session.seen).into_owned();
        assert!(term.probed, "{answers:?}: no graphics query: {said:?}");
        assert!(
            said.contains("refusing: this terminal does not speak the Kitty graphics protocol")
                && said.contains(why)
                && said.contains("to fix: watch in your browser instead: `h5i box view web`"),
            "{answers:?}: {said:?}"
        );
        assert!(term.images.is_empty(), "{answers:?}: an image was sent");
        assert!(term.foreign.is_empty(), "{:?}", term.foreign);
        assert!(
            common::pty::find(&term.session.seen, b"\x1b[?1049h").is_none(),
            "{answers:?}: the screen was taken before the refusal"
        );
    }
    let text = std::fs::read_to_string(&receipts).unwrap_or_default();
    assert!(
        !text.contains("\"viewer-session\""),
        "a refused viewer recorded a session"
    );
}

#[cfg(feature = "ui")]
#[test]
fn a_terminal_without_kitty_graphics_is_refused_and_pointed_at_the_browser_viewer() {
    term_refusal_case(false);
}

#[cfg(feature = "ui")]
#[test]
fn a_terminal_without_kitty_graphics_is_refused_as_h5i_test() {
    term_refusal_case(true);
}

#[cfg(feature = "ui")]
#[test]
fn the_terminal_viewer_draws_the_boxs_browser_and_drives_it_only_with_the_lock() {
    term_case("process", false);
}

#[cfg(feature = "ui")]
#[test]
fn the_terminal_viewer_draws_the_boxs_browser_and_drives_it_only_with_the_lock_as_h5i_test() {
    term_case("process", true);
}

#[cfg(feature = "ui")]
#[test]
fn the_terminal_viewer_draws_a_supervised_boxs_browser_and_drives_it_only_with_the_lock() {
    term_case("supervised", false);
}

#[cfg(feature = "ui")]
#[test]
fn the_terminal_viewer_draws_a_supervised_boxs_browser_and_drives_it_only_with_the_lock_as_h5i_test(
) {
    term_case("supervised", true);
}

/// `browser status web --json`'s holder, as `c` asks.
#[cfg(feature = "ui")]
fn holder(c: &Caller) -> String {
    let status: serde_json::Value =
        serde_json::from_str(&c.ok(&["browser", "status", "web", "--json"])).unwrap();
    status["holder"].as_str().unwrap().to_string()
}

/// The control lock a viewer holds, and a box whose browser does not stream: `h5i box view`
/// refuses a box whose browser has not started and one whose browser stopped streaming, each
/// with the mend, which works; leaving while driving (`--term`, Ctrl-C: `q` is the page's key
/// then) hands the lock back; a viewer
/// SIGKILLed while driving cannot, and the next `browser status` hands the lock back for it,
/// recorded in the `viewer` lane (the agent acts again); a lock taken with `h5i browser take`
/// (no viewer) is kept until its taker releases it. Every viewer-session record is in the
/// `viewer` lane with its time.
#[cfg(feature = "ui")]
fn viewer_lock_case(as_user: bool) {
    use common::kitty::Answers;
    let Some(c) = demo_sidecar_box(as_user, "h5i box view's lock and stream") else {
        return;
    };
    let who = c.who();
    let _removed = RemovedAtEnd(&c, "web");
    let mend =
        "to fix: start its browser and stream it: `h5i box run web -- agent-browser stream enable`";
    let refused = |why: &str| {
        let out = c.h5i(&["box", "view", "web", "--port", "0"]);
        assert_ne!(out.status.code(), Some(0), "{who}: {}", stdout(&out));
        let err = stderr(&out);
        assert!(
            err.contains("refusing: box `web` cannot be watched: ")
                && err.contains(why)
                && err.contains(mend),
            "{who}: {err}"
        );
    };
    // No run has started the box's browser yet.
    refused("");
    let (open, rc) = box_sh(
        &c,
        "web",
        &format!("agent-browser open http://127.0.0.1:{APP_PORT}/ && agent-browser stream disable"),
    );
    assert_eq!(rc, 0, "{who}: {open}");
    refused("the box's browser is not streaming");
    let (mended, rc) = box_sh(&c, "web", "agent-browser stream enable");
    assert_eq!(rc, 0, "{who}: {mended}");

    let receipts = c.box_dir("web").join("receipts.jsonl");
    let before = records_of(&c, "web", "control").len();
    // Leaving while driving hands the lock back (a key is the page's while driving, so
    // `q` would be typed there: Ctrl-C leaves).
    let mut term = term_viewer(&c, Answers::Kitty);
    term.row_where("watching", |r| r.contains("│ watching │"));
    term.send(b"i");
    term.row_where("driving", |r| r.contains("│ driving │"));
    assert_eq!(holder(&c), "human", "{who}");
    term.send(b"\x03");
    assert_eq!(term.finish(), 0, "{}", term.session.transcript());
    assert_eq!(
        holder(&c),
        "agent",
        "{who}: leaving while driving kept the lock"
    );
    let control = records_of(&c, "web", "control");
    let actions: Vec<&str> = control[before..]
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["take", "release"], "{who}: {control:?}");

    // A viewer killed while driving: its lock does not outlive it.
    let mut term = term_viewer(&c, Answers::Kitty);
    term.row_where("watching", |r| r.contains("│ watching │"));
    term.send(b"i");
    term.row_where("driving", |r| r.contains("│ driving │"));
    let viewer = common::caller::h5i_pid(term.session.child.id());
    let (agent, rc) = box_sh(&c, "web", "agent-browser click '#go'");
    assert_ne!(
        rc, 0,
        "{who}: the agent clicked while the human drove: {agent}"
    );
    // SAFETY: kill(2) of the h5i viewer this test started (runuser's child for h5i-test).
    assert_eq!(unsafe { libc::kill(viewer, libc::SIGKILL) }, 0);
    term.finish();
    // The agent's own verb hands back the lock of a viewer that is gone.
    let (agent, rc) = box_sh(&c, "web", "agent-browser click '#go'");
    assert_eq!(
        rc, 0,
        "{who}: the dead viewer's lock still refuses the agent: {agent}"
    );
    assert_eq!(holder(&c), "agent", "{who}");
    let control = records_of(&c, "web", "control");
    let last = control.last().unwrap();
    assert_eq!(
        (&last["action"], &last["holder"], &last["lane"]),
        (
            &serde_json::json!("release"),
            &serde_json::json!("agent"),
            &serde_json::json!("viewer")
        ),
        "{who}: {control:?}"
    );
    let by = last["by"].as_str().unwrap();
    assert!(
        by.contains(&format!("(pid {viewer}) ended while it held control")),
        "{who}: {by}"
    );
    assert_eq!(
        control
            .iter()
            .filter(|r| r["by"].as_str().is_some_and(|b| b.starts_with("h5i: ")))
            .count(),
        1,
        "{who}: the gone viewer's lock was handed back more than once: {control:?}"
    );

    // A lock taken by hand names no viewer: nothing but its taker ends it.
    c.ok(&["browser", "take", "web"]);
    assert_eq!(holder(&c), "human", "{who}");
    let (agent, rc) = box_sh(&c, "web", "agent-browser click '#go'");
    assert_ne!(rc, 0, "{who}: {agent}");
    assert_eq!(
        holder(&c),
        "human",
        "{who}: a lock taken by hand was handed back"
    );
    c.ok(&["browser", "release", "web"]);

    // Every viewer-session record: the viewer lane, a time, and the killed one ended by the
    // next sweep (`box export`).
    let out = tempfile::tempdir().unwrap();
    hand_to(&c, out.path());
    let dest = out.path().join("review");
    c.ok(&["box", "export", "web", "--out", dest.to_str().unwrap()]);
    let sessions = viewer_records(&receipts);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert_eq!(sessions.len(), 4, "{who}: {sessions:?}");
    for r in &sessions {
        assert_eq!(r["lane"], "viewer", "{who}: {r}");
        let at = r["at_ms"].as_u64().unwrap();
        assert!(
            at <= now && now - at < 30 * 60 * 1000,
            "{who}: a viewer session's time is not this run's: {r}"
        );
    }
    let events: Vec<&str> = sessions
        .iter()
        .map(|r| r["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["opened", "closed", "opened", "killed"], "{who}");
    assert_eq!(sessions[3]["took_control"], true, "{who}");
}

#[cfg(feature = "ui")]
#[test]
fn a_viewer_hands_its_lock_back_on_leaving_or_dying_and_an_unstreamed_browser_is_refused() {
    viewer_lock_case(false);
}

#[cfg(feature = "ui")]
#[test]
fn a_viewer_hands_its_lock_back_on_leaving_or_dying_and_an_unstreamed_browser_is_refused_as_h5i_test(
) {
    viewer_lock_case(true);
}

/// What the egress tally of record `rec` counts under `key` (`allowed` or `denied`) for `dest`.
fn egress_of(rec: &serde_json::Value, key: &str, dest: &str) -> u64 {
    rec["egress"][key][dest].as_u64().unwrap_or(0)
}

/// At the supervised tier a terminal session (`box shell` on a terminal: a container of its
/// own, never the sandbox's warm path) of a box whose browser lives in the sandbox's network
/// joins that network: the page opens the dev server the session itself started on its
/// loopback. Nothing else opens with it: the session still cannot complete a handshake with
/// Chromium's DevTools port (the fence), and its own dial to a port the policy does not list is
/// refused by the sandbox's table and counted in the session's run record.
fn terminal_dev_server_case(as_user: bool) {
    let Some(sc) = SidecarBox::up(
        "supervised",
        as_user,
        "a terminal session's dev server and the box's browser",
    ) else {
        return;
    };
    let first = sc._hosts.as_ref().unwrap().first;
    let (c, serve) = (&sc.c, sc.serve());
    let _removed = RemovedAtEnd(c, "web");
    let probe = r#"import socket
url = open("/tmp/cdp").read().split()[-1]
port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
for name, host, p in (("devtools", "127.0.0.1", port), ("unlisted", "allowed.test", 9090)):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, p))
        print(name, "connected")
    except socket.timeout:
        print(name, "timed out")
    except OSError as e:
        print(name, "errno", e.errno)
"#;
    let (said, rc) = shell_on_a_terminal(
        c,
        "web",
        &format!(
            "test -t 0 && {serve}agent-browser open http://127.0.0.1:{APP_PORT}/ && agent-browser get cdp-url > /tmp/cdp && python3 -c '{}'",
            probe.replace('\'', "\"")
        ),
    );
    assert_eq!(rc, 0, "{said}");
    assert!(
        said.contains("h5i browser demo"),
        "the page did not open the session's own dev server: {said}"
    );
    assert!(
        said.contains("devtools timed out"),
        "the session reached the browser's DevTools port: {said}"
    );
    assert!(
        said.contains("unlisted errno") || said.contains("unlisted timed out"),
        "the session reached an unlisted port: {said}"
    );
    let runs = records_of(c, "web", "run");
    let session = runs
        .iter()
        .rev()
        .find(|r| r["argv"].to_string().contains("test -t 0"))
        .unwrap_or_else(|| panic!("no record of the session: {runs:?}"));
    assert!(
        egress_of(session, "denied", &format!("{first}:9090/tcp")) >= 1,
        "the sandbox's table did not count the session's refused dial: {session}"
    );
}

#[test]
fn a_supervised_terminal_sessions_own_dev_server_is_the_pages() {
    terminal_dev_server_case(false);
}

#[test]
fn a_supervised_terminal_sessions_own_dev_server_is_the_pages_as_h5i_test() {
    terminal_dev_server_case(true);
}

/// The loopback port, in the box's network, of the go-ahead the between-runs page waits for.
const GO_PORT: u16 = 3001;

/// What the page of the between-runs case does once armed: ask its own loopback for the
/// go-ahead (every 200 ms, 600 times at most), then fetch the port the table does not list, then
/// the listed one, then report both outcomes to the go-ahead's `/done`.
const BETWEEN_RUNS_PAGE: &str = r#"(function () {
  var go = "http://127.0.0.1:GO_PORT";
  var settle = function (url) {
    return fetch(url).then(function (r) { return "status " + r.status; }, function (e) { return String(e); });
  };
  var tries = 0;
  var ask = function () {
    fetch(go + "/go", { mode: "no-cors" }).then(function () {
      settle("http://allowed.test:9090/").then(function (unlisted) {
        settle("http://allowed.test:8080/").then(function (listed) {
          fetch(go + "/done?unlisted=" + encodeURIComponent(unlisted) + "&listed=" + encodeURIComponent(listed), { mode: "no-cors" });
        });
      });
    }, function () {
      if (++tries < 600) { setTimeout(ask, 200); }
    });
  };
  ask();
  return "armed";
})()"#;

/// The go-ahead, run by the test in the sidecar's network namespace once the first run has
/// ended: it says `ready` when it listens, answers every request, and prints the request line
/// of `/done` and ends (or `timeout` after 120 s without a connection).
const GO_AHEAD: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
s.settimeout(120)
print("ready", flush=True)
while True:
    try:
        c, _ = s.accept()
    except socket.timeout:
        print("timeout", flush=True)
        break
    c.settimeout(10)
    try:
        line = c.recv(4096).decode("latin-1").split("\r\n", 1)[0]
        c.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
    except OSError:
        line = ""
    c.close()
    if " /done" in line:
        print(line, flush=True)
        break
"#;

/// The box-lifetime browser at supervised lives in the network of the box's sandbox after the
/// run that opened its page has ended. What its page sends while no run is active (a timer's
/// `fetch` of the listed destination, which the test host sees, and one of a port the table
/// does not list, refused) is in neither run's receipt but in a host-observed `browser` record
/// between them, and in report.md. The page waits for a go-ahead on its own loopback that the
/// test starts once the first run has returned (its idle window open), so no dial can fall in
/// either run; loopback is not counted.
fn between_runs_case(as_user: bool) {
    use std::io::BufRead;
    let Some(sc) = SidecarBox::up("supervised", as_user, "the browser's traffic between runs")
    else {
        return;
    };
    let serve = sc.serve();
    let SidecarBox { c, _hosts, .. } = sc;
    let mut hosts = _hosts.unwrap();
    let first = hosts.first;
    let _removed = RemovedAtEnd(&c, "web");
    let arm = BETWEEN_RUNS_PAGE.replace("GO_PORT", &GO_PORT.to_string());
    let (opened, rc) = box_sh(
        &c,
        "web",
        &format!(
            "{serve}agent-browser open http://127.0.0.1:{APP_PORT}/ && agent-browser eval '{arm}'"
        ),
    );
    assert_eq!(rc, 0, "{opened}");
    assert!(opened.contains("armed"), "{opened}");

    let mut go = Command::new("nsenter")
        .arg(format!("--net=/proc/{}/ns/net", sidecar_init(&c, "web")))
        .args(["python3", "-c", GO_AHEAD, &GO_PORT.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = std::io::BufReader::new(go.stdout.take().unwrap()).lines();
    let mut next = || said.next().map(Result::unwrap).unwrap_or_default();
    assert_eq!(next(), "ready");
    let done = next();
    common::wait_bounded(go, std::time::Duration::from_secs(30), "the go-ahead");
    assert!(
        done.starts_with("GET /done?unlisted="),
        "the page never reported its dials: {done:?}"
    );
    let (ran, rc) = box_sh(&c, "web", "true");
    assert_eq!(rc, 0, "{ran}");

    let runs = records_of(&c, "web", "run");
    let (before, after) = (&runs[runs.len() - 2], &runs[runs.len() - 1]);
    let between = records_of(&c, "web", "browser");
    assert_eq!(between.len(), 1, "{between:?}");
    let b = &between[0];
    assert_eq!(b["lane"], "host-env-run", "{b}");
    assert!(
        b["seq"].as_u64() > before["seq"].as_u64() && b["seq"].as_u64() < after["seq"].as_u64(),
        "the browser record is not between the two runs: {b}"
    );
    assert!(
        egress_of(b, "allowed", "allowed.test:8080") >= 1,
        "the listed dial between runs is not counted: {b}"
    );
    let unlisted = format!("{first}:9090/tcp");
    assert!(
        egress_of(b, "denied", &unlisted) >= 1,
        "the refused dial between runs is not counted: {b}"
    );
    for r in [before, after] {
        assert_eq!(egress_of(r, "allowed", "allowed.test:8080"), 0, "{r}");
        assert_eq!(egress_of(r, "denied", &unlisted), 0, "{r}");
    }
    let seen = hosts.log();
    assert!(
        seen.contains(&format!("tcp {first}:8080")),
        "the test host never saw the page's listed dial ({done}): {seen:?}"
    );
    assert!(
        !seen.iter().any(|l| l.ends_with(":9090")),
        "the unlisted port was reached: {seen:?}"
    );
    let out = tempfile::tempdir().unwrap();
    hand_to(&c, out.path());
    let dest = out.path().join("review");
    c.ok(&["box", "export", "web", "--out", dest.to_str().unwrap()]);
    let report = std::fs::read_to_string(dest.join("report.md")).unwrap();
    let line = format!(
        "between runs after record #{}, the box's browser made: allowed allowed.test:8080 x",
        b["after_seq"]
    );
    assert!(report.contains(&line), "{line} not in: {report}");
}

#[test]
fn the_browsers_traffic_between_runs_is_in_a_browser_record() {
    between_runs_case(false);
}

#[test]
fn the_browsers_traffic_between_runs_is_in_a_browser_record_as_h5i_test() {
    between_runs_case(true);
}

/// The pids of every `h5i box __service-supervise` process working for the repo at `repo`
/// (a supervisor runs in its repo's root: other tests' boxes named alike are not counted).
fn supervisors_of(repo: &Path) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let supervises = cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == b"__service-supervise");
            supervises && std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|d| d == repo)
        })
        .collect()
}

/// The names of every container in the engine user's (h5i-test's) rootless Podman.
fn engine_container_names() -> Vec<String> {
    let out = engine_podman(&["ps", "--all", "--format", "{{.Names}}"])
        .output()
        .unwrap();
    assert!(out.status.success(), "podman ps: {}", stderr(&out));
    stdout(&out).lines().map(str::to_owned).collect()
}

/// Each run closes the container tier's browser, so the next run starts another while the
/// previous supervisor may still be waiting for Podman: the earlier supervisor's last state
/// must not mark the running browser ended (it then ran on untracked, and `box rm` left its
/// container and conmon behind). After `box rm`, within a bound, no supervisor of the box is
/// left and no container of any of them is in the engine's Podman.
fn closed_each_run_case(as_user: bool) {
    let test = "a container browser closed by each run";
    if !require_root(test, "boxes as root and as h5i-test") {
        return;
    }
    let Some(mut c) = container_caller(as_user, test) else {
        return;
    };
    let who = c.who();
    browser_box(&mut c, "web", "container");
    let _removed = RemovedAtEnd(&c, "web");
    let repo = c.repo().canonicalize().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let (out, rc) = box_sh(
            &c,
            "web",
            // Nothing listens on port 1: the open fails, but it starts the browser the close ends.
            "agent-browser open http://127.0.0.1:1/ >/dev/null 2>&1; agent-browser close",
        );
        assert_eq!(rc, 0, "{who}: {out}");
        seen.extend(supervisors_of(&repo));
    }
    assert!(!seen.is_empty(), "{who}: no supervisor of the box was seen");
    c.ok(&["box", "rm", "--force", "web"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let left = loop {
        let left: Vec<i32> = supervisors_of(&repo);
        if left.is_empty() || std::time::Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(
        left.is_empty(),
        "{who}: supervisors {left:?} of the removed box still run 90 s after `box rm`"
    );
    let theirs: Vec<String> = engine_container_names()
        .into_iter()
        .filter(|n| {
            seen.iter()
                .any(|pid| n.starts_with(&format!("h5i-web-{pid}-")))
        })
        .collect();
    assert!(
        theirs.is_empty(),
        "{who}: containers {theirs:?} of the removed box are still in the engine's Podman"
    );
}

#[test]
fn a_container_browser_closed_by_each_run_leaves_nothing_after_box_rm() {
    closed_each_run_case(false);
}

#[test]
fn a_container_browser_closed_by_each_run_leaves_nothing_after_box_rm_as_h5i_test() {
    closed_each_run_case(true);
}
