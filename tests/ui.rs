//! `h5i ui`, the box console: the real binary serving real HTTP on loopback, asked by a raw
//! client (every refusal: no token, a mutating method, a foreign origin or host, a traversal)
//! and loaded by a real headless Chromium (the page draws the fleet's colours; its screenshot is
//! docs/ui-console.png). Boxes are real, and so are their receipts: a supervised box's refused
//! egress (its test hosts in 198.19.0.0/16), a run that fails, one the wall clock kills, a
//! workspace-tier box and what a box staged as its own account. The console runs as root and as
//! the unprivileged test user, whose own fleet it shows, bound to loopback alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Command;

use common::chromium::{chromium, Browser};
use common::console::{assert_signal, fleet_row, request, Console, Reply};
use common::opener::{fake_opener, opened, path_with, recorded};
use common::testnet::TestHosts;
use common::{require_root, stderr, Caller, Repo, H5I};

/// Where the login page's `meta refresh` sends the browser on (from the console's own origin).
fn refresh_to(r: &Reply) -> String {
    let (_, rest) = r
        .body
        .split_once("http-equiv=\"refresh\" content=\"0;url=")
        .unwrap_or_else(|| panic!("no refresh: {r:?}"));
    rest[..rest.find('"').unwrap()].to_string()
}

/// `h5i ui --port 0` run by root in `repo`.
impl Console {
    fn start(repo: &Repo) -> Console {
        Console::start_opening(repo, None)
    }

    /// `h5i ui --port 0`; with `opener`, `--open` and that directory first on PATH.
    fn start_opening(repo: &Repo, opener: Option<&std::path::Path>) -> Console {
        let mut cmd = Command::new(H5I);
        cmd.args(["ui", "--port", "0"]).current_dir(repo.path());
        if let Some(dir) = opener {
            cmd.arg("--open").env("PATH", path_with(dir));
        }
        Console::spawn(cmd)
    }
}

#[test]
fn the_console_refuses_a_request_without_its_token_and_trades_the_token_for_a_strict_cookie() {
    let repo = Repo::new();
    let c = Console::start(&repo);
    for path in [
        "/",
        "/?token=",
        "/?token=00",
        "/c/0/api/fleet",
        "/api/fleet",
    ] {
        let r = request(c.port, "GET", path, &[]);
        assert_eq!(r.status, 401, "{path}: {r:?}");
        assert!(r.body.starts_with("refusing: "), "{r:?}");
    }
    // The token with one digit changed is no token.
    let mut wrong = c.token_path().to_string();
    let last = wrong.pop().unwrap();
    wrong.push(if last == '0' { '1' } else { '0' });
    assert_eq!(request(c.port, "GET", &wrong, &[]).status, 401);

    let r = request(c.port, "GET", c.token_path(), &[]);
    assert_eq!(r.status, 303, "{r:?}");
    let set = r.header("set-cookie").unwrap();
    let location = r.header("location").unwrap();
    assert!(
        location.starts_with("/c/") && location.ends_with('/'),
        "{location}"
    );
    assert!(!location.contains("token"), "{location}");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(set.contains(&format!("Path={location}")), "{set}");
    let token = &c.token_path()["/?token=".len()..];
    assert!(!set.contains(token), "the cookie is not the token: {set}");

    let cookie = set.split(';').next().unwrap();
    let page = c.get(cookie, location);
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("box console"), "{page:?}");
    assert!(page.header("content-security-policy").is_some(), "{page:?}");
    assert_eq!(c.get(cookie, &format!("{location}api/fleet")).status, 200);
    // The session path without the cookie, and the cookie with another value, are refused.
    assert_eq!(request(c.port, "GET", location, &[]).status, 401);
    let forged = format!("{}0", &cookie[..cookie.len() - 1]);
    let forged = if forged == cookie {
        format!("{}1", &cookie[..cookie.len() - 1])
    } else {
        forged
    };
    assert_eq!(c.get(&forged, location).status, 401);
    // A cookie of the same name a box's service set beside ours does not shadow ours.
    let tossed = format!("h5i_ui=from-a-box; {cookie}");
    assert_eq!(c.get(&tossed, location).status, 200);
}

#[test]
fn every_method_but_get_is_refused_on_every_route() {
    let repo = Repo::new();
    let c = Console::start(&repo);
    let (cookie, base) = c.login();
    let routes = [
        "/".to_string(),
        c.token_path().to_string(),
        base.clone(),
        format!("{base}api/fleet"),
        format!("{base}api/box/b"),
        format!("{base}no-such-route"),
    ];
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        for path in &routes {
            let r = request(c.port, method, path, &[("Cookie", &cookie)]);
            assert_eq!(r.status, 405, "{method} {path}: {r:?}");
            assert_eq!(r.header("allow"), Some("GET"), "{r:?}");
        }
    }
}

#[test]
fn a_foreign_origin_host_or_site_is_refused() {
    let repo = Repo::new();
    let c = Console::start(&repo);
    let (cookie, base) = c.login();
    let fleet = format!("{base}api/fleet");
    let own = format!("http://127.0.0.1:{}", c.port);
    assert_eq!(
        request(
            c.port,
            "GET",
            &fleet,
            &[("Cookie", &cookie), ("Origin", &own)]
        )
        .status,
        200
    );
    let foreign_host = format!("rebound.test:{}", c.port);
    let refused: [(&str, &str); 7] = [
        // A box's dev server published on another loopback port is another origin.
        ("Origin", "http://127.0.0.1:3000"),
        ("Origin", "null"),
        ("Origin", "http://example.com"),
        ("Sec-Fetch-Site", "cross-site"),
        ("Sec-Fetch-Site", "same-site"),
        // DNS rebinding: another name pointed at 127.0.0.1.
        ("Host", &foreign_host),
        ("Host", "localhost"),
    ];
    for (k, v) in refused {
        let r = request(c.port, "GET", &fleet, &[("Cookie", &cookie), (k, v)]);
        assert_eq!(r.status, 403, "{k}: {v}: {r:?}");
        assert!(!r.body.contains("boxes"), "{r:?}");
        // Not even the token is traded from there, but for a navigation another site started
        // (`--open`'s `file:` page is one; the token is the proof, and all it buys is the
        // cookie): that one is sent on by a page of the console's own origin.
        let r = request(c.port, "GET", c.token_path(), &[(k, v)]);
        if k == "Sec-Fetch-Site" {
            assert_eq!(r.status, 200, "login with {k}: {v}: {r:?}");
            assert!(refresh_to(&r).starts_with("/c/"), "{r:?}");
            let without = request(c.port, "GET", "/?token=", &[(k, v)]);
            assert_eq!(without.status, 403, "{without:?}");
            continue;
        }
        assert_eq!(r.status, 403, "login with {k}: {v}: {r:?}");
        assert!(r.header("set-cookie").is_none(), "{r:?}");
    }
}

#[test]
fn path_traversal_reaches_no_file() {
    let repo = Repo::new();
    repo.ok(&["box", "create", "b", "--isolation", "workspace"]);
    let c = Console::start(&repo);
    let (cookie, base) = c.login();
    for path in [
        format!("{base}../../../../etc/passwd"),
        format!("{base}app.js/../../../../etc/passwd"),
        format!("{base}%2e%2e/%2e%2e/%2e%2e/etc/passwd"),
        format!("{base}api/box/..%2F..%2F..%2F..%2Fetc%2Fpasswd"),
        format!("{base}api/box/..%2F..%2Fenv%2Fnone%2Fb"),
        format!("{base}api/box/b%2F..%2F..%2Fb"),
        format!("{base}api/box/../b"),
        format!("{base}api/box/b/receipt/..%2F1"),
        format!("{base}page/app.js"),
        format!("{base}index.html"),
        format!("{base}/etc/passwd"),
    ] {
        let r = c.get(&cookie, &path);
        assert!(
            r.status == 404 || r.status == 400,
            "{path}: {}: {}",
            r.status,
            r.body
        );
        assert!(!r.body.contains("root:"), "{path}: {r:?}");
    }
    assert_eq!(c.get(&cookie, &format!("{base}api/box/b")).status, 200);
}

/// A supervised box whose run dialled a destination its allowlist refuses, a box whose run
/// failed, and a box whose run passed; `None` (skipped, said) without root for the test hosts.
fn three_boxes(repo: &Repo) -> Option<TestHosts> {
    let hosts = TestHosts::up("ui: a denied egress run", &[8080, 9090], &[])?;
    repo.write_policy(
        "[profile.sup]\nisolation = \"supervised\"\n[profile.sup.net]\negress = [\"allowed.test:8080\"]\n",
    );
    let pin = hosts.pin(&[("allowed.test", hosts.first)]);
    let env = [("H5I_TEST_HOSTS", pin.as_str())];
    let out = repo.h5i_env(&["box", "create", "leaky", "--profile", "sup"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let dial = format!(
        "import socket\ntry:\n socket.create_connection(('{}', 9090), timeout=3)\nexcept OSError as e:\n print('refused', e)\n",
        hosts.first
    );
    let out = repo.h5i_env(&["box", "run", "leaky", "--", "python3", "-c", &dial], &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        repo.last_run("leaky")["egress"]["denied"]
            .as_object()
            .is_some_and(|d| !d.is_empty()),
        "the run's refused dial was not counted: {}",
        repo.last_run("leaky")
    );
    repo.ok(&["box", "create", "failing", "--isolation", "process"]);
    let out = repo.h5i(&["box", "run", "failing", "--", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    repo.ok(&["box", "create", "quiet", "--isolation", "process"]);
    repo.ok(&["box", "run", "quiet", "--", "true"]);
    Some(hosts)
}

#[test]
fn a_denied_egress_run_is_red_a_failed_run_amber_and_a_row_opens_to_the_inspect_text() {
    let repo = Repo::new();
    let Some(_hosts) = three_boxes(&repo) else {
        return;
    };
    let c = Console::start(&repo);
    let (cookie, base) = c.login();
    let fleet = c.get(&cookie, &format!("{base}api/fleet")).json();
    let colour = |name: &str| fleet_row(&fleet, name)["signal"]["colour"].clone();
    assert_eq!(colour("leaky"), "red", "{fleet}");
    assert_eq!(colour("failing"), "amber", "{fleet}");
    assert_eq!(colour("quiet"), "plain", "{fleet}");

    let leaky = c.get(&cookie, &format!("{base}api/box/leaky")).json();
    let rows = leaky["flight"].as_array().unwrap();
    let red: Vec<_> = rows.iter().filter(|r| r["colour"] == "red").collect();
    assert_eq!(red.len(), 1, "{leaky}");
    assert_eq!(red[0]["evidence"], "host-observed");
    let net = red[0]["cells"][1].as_str().unwrap();
    assert!(net.contains(&format!("{}:9090", _hosts.first)), "{net}");
    assert_eq!(leaky["status"]["tier"], "supervised", "{leaky}");
    assert!(leaky["status"]["enforced"]
        .as_array()
        .is_some_and(|e| !e.is_empty()));

    let failing = c.get(&cookie, &format!("{base}api/box/failing")).json();
    let row = failing["flight"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["colour"] == "amber")
        .unwrap_or_else(|| panic!("no amber row: {failing}"));
    let seq = row["seq"].as_u64().unwrap();
    // The row opens to exactly what `h5i box inspect` prints.
    let shown = c
        .get(&cookie, &format!("{base}api/box/failing/receipt/{seq}"))
        .json();
    let printed = repo.ok(&["box", "inspect", "failing", "--capture", &seq.to_string()]);
    let lines: Vec<&str> = shown["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(lines.join("\n"), printed.trim_end(), "{shown}");
    assert!(printed.contains("exit        3"), "{printed}");
    // And the diffstat is `h5i box diff --stat`'s.
    let stat = repo.ok(&["box", "diff", "failing", "--stat"]);
    let lines: Vec<&str> = failing["diffstat"]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(lines.join("\n"), stat.trim_end(), "{failing}");
}

#[test]
fn a_finished_run_arrives_live_without_a_reload() {
    let repo = Repo::new();
    repo.ok(&["box", "create", "b", "--isolation", "process"]);
    let c = Console::start(&repo);
    let (cookie, base) = c.login();
    let first = c.get(&cookie, &format!("{base}api/changes")).json();
    let seen = first["version"].as_str().unwrap().to_string();
    // Nothing changed: the wait ends with the same version (the page asks again).
    let port = c.port;
    let waiting = {
        let (cookie, path) = (cookie.clone(), format!("{base}api/changes?seen={seen}"));
        std::thread::spawn(move || request(port, "GET", &path, &[("Cookie", &cookie)]))
    };
    let out = repo.h5i(&["box", "run", "b", "--", "sh", "-c", "exit 5"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let changed = waiting.join().unwrap().json();
    assert_ne!(changed["version"], first["version"], "{changed}");
    let fleet = c.get(&cookie, &format!("{base}api/fleet")).json();
    assert_eq!(fleet["boxes"][0]["signal"]["colour"], "amber", "{fleet}");
}

/// The class of box `name`'s row in the fleet list, as the page drew it.
fn row_class(name: &str) -> String {
    format!("(document.querySelector('#boxes li[data-box=\"{name}\"]') || {{}}).className")
}

#[test]
fn chromium_draws_the_fleet_in_its_colours_follows_a_finished_run_and_the_screenshot_is_the_docs_one(
) {
    let Some(path) = chromium() else {
        return;
    };
    let repo = Repo::new();
    let Some(_hosts) = three_boxes(&repo) else {
        return;
    };
    let c = Console::start(&repo);
    let profile = tempfile::tempdir().unwrap();
    let mut b = Browser::launch(path, profile.path());
    // The printed URL, as a human opens it: the token is traded for the cookie and leaves the
    // address bar.
    b.open(&format!("{}#box=leaky", c.url));
    b.until("document.querySelectorAll('table.flight tr.red').length === 1");
    assert_eq!(b.eval(&row_class("leaky")), "red picked");
    assert_eq!(b.eval(&row_class("failing")), "amber");
    assert_eq!(b.eval(&row_class("quiet")), "plain");
    let href = b.eval("location.href");
    assert!(!href.as_str().unwrap().contains("token"), "{href}");
    assert_eq!(b.eval("document.cookie"), "", "the cookie is HttpOnly");
    // A click on the red row opens the receipt as `h5i box inspect` renders it.
    b.eval("document.querySelector('table.flight tr.red').click()");
    b.until("!!document.querySelector('#receipt pre')");
    let seq = b.eval("Number(document.querySelector('table.flight tr.red').dataset.seq)");
    let printed = repo.ok(&["box", "inspect", "leaky", "--capture", &seq.to_string()]);
    b.until("document.querySelector('#receipt pre').textContent.length > 0");
    assert_eq!(
        b.eval("document.querySelector('#receipt pre').textContent"),
        printed.trim_end()
    );
    let png = b.screenshot();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
    if std::env::var_os("H5I_WRITE_DOCS").is_some() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ui-console.png");
        std::fs::write(docs, &png).unwrap();
    }
    // A run that fails while the page is open turns its box amber without a reload.
    let out = repo.h5i(&["box", "run", "quiet", "--", "sh", "-c", "exit 4"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    b.until(&format!("{} === 'amber'", row_class("quiet")));
}

/// A run whose argv is markup and escape sequences, drawn by a real Chromium: the flight row and
/// the opened receipt show the text as text (the same text `box inspect` prints); no element of
/// it is parsed and no script of it runs.
#[test]
fn chromium_shows_a_hostile_receipt_as_text_and_runs_none_of_it() {
    let Some(path) = chromium() else {
        return;
    };
    let repo = Repo::new();
    repo.ok(&["box", "create", "hostile", "--isolation", "process"]);
    let img = "<img src=x onerror=\"window.pwned='img'\">";
    let script = "<script>window.pwned='script'</script>";
    let escapes = "\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m";
    repo.ok(&[
        "box", "run", "hostile", "--", "printf", "%s", img, script, escapes,
    ]);
    let c = Console::start(&repo);
    let profile = tempfile::tempdir().unwrap();
    let mut b = Browser::launch(path, profile.path());
    b.open(&format!("{}#box=hostile", c.url));
    b.until("document.querySelectorAll('table.flight tr[data-seq]').length === 1");
    let cell = b.eval("document.querySelector('table.flight tr[data-seq]').cells[5].textContent");
    let cell = cell.as_str().unwrap();
    assert!(cell.contains(img) && cell.contains(script), "{cell}");
    assert!(
        !cell.contains(['\u{1b}', '\u{7}', '\u{9b}']),
        "a raw control reached the page: {cell:?}"
    );
    b.eval("document.querySelector('table.flight tr[data-seq]').click()");
    b.until("!!document.querySelector('#receipt pre') && document.querySelector('#receipt pre').textContent.length > 0");
    let shown = b.eval("document.querySelector('#receipt pre').textContent");
    let seq = b.eval("document.querySelector('table.flight tr[data-seq]').dataset.seq");
    let printed = repo.ok(&[
        "box",
        "inspect",
        "hostile",
        "--capture",
        seq.as_str().unwrap(),
    ]);
    assert_eq!(shown, printed.trim_end());
    assert!(printed.contains(script), "{printed}");
    assert_eq!(
        b.eval("document.querySelectorAll('#detail img, #detail script, #boxes img').length"),
        0
    );
    assert_eq!(b.eval("typeof window.pwned"), "undefined");
}

/// `h5i ui --open`, run by root and by h5i-test with a HOME of its own: `xdg-open` (a stand-in
/// on PATH that records what it was given) gets the path of a private file and nothing else;
/// the file (0600 in a 0700 directory of the store) leads to a one-time code, not the session
/// token, which is in no file under the store or HOME, nor in xdg-open's argv or environment;
/// a box cannot read the file or find the code; the code is traded for the cookie once (from
/// another site: the `file:` page), removing the file, and refused on second use.
fn open_case(as_user: bool) {
    let Some(c) = caller(as_user, "h5i ui --open") else {
        return;
    };
    let (fake, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let record = fake_opener(fake.path());
    for p in [fake.path(), &record, &record.join("done"), home.path()] {
        std::os::unix::fs::chown(p, Some(c.uid()), None).unwrap();
    }
    let mut c = c
        .with_env("PATH", &path_with(fake.path()))
        .with_env("HOME", home.path().to_str().unwrap());
    c.create_at("b", "process");
    let con = Console::spawn(c.h5i_in(&c.repo(), &["ui", "--port", "0", "--open"]));
    let who = c.who();
    let token = con.token_path()["/?token=".len()..].to_string();
    assert_eq!(token.len(), 64, "{}", con.url);
    opened(&record);
    let argv = recorded(&record, "argv");
    let env = recorded(&record, "env");
    assert!(
        !argv.contains(&token),
        "{who}: the token is in xdg-open's argv: {argv}"
    );
    assert!(
        !env.contains(&token),
        "{who}: the token is in xdg-open's environment"
    );
    let args: Vec<&str> = argv.lines().skip(1).collect();
    assert_eq!(args.len(), 1, "{argv}");
    let file = std::path::PathBuf::from(args[0]);
    let store = c.repo().join(".git/.h5i");
    assert_eq!(
        file.parent(),
        Some(store.join("handoff").as_path()),
        "{argv}"
    );
    assert_eq!(recorded(&record, "mode").trim(), "600");
    assert_eq!(recorded(&record, "dirmode").trim(), "700");
    let page = recorded(&record, "page");
    let prefix = format!("content=\"0;url=http://127.0.0.1:{}/?code=", con.port);
    let code = page
        .split_once(&prefix)
        .map(|(_, rest)| rest[..rest.find('"').unwrap()].to_string())
        .unwrap_or_else(|| panic!("{who}: the file leads to no one-time code: {page}"));
    assert_eq!(code.len(), 64, "{page}");
    assert_ne!(code, token);
    assert!(file.exists(), "the file went before the browser came");
    // The session token is written nowhere: not under the store, not under HOME.
    for dir in [store.as_path(), home.path()] {
        let holding = common::files_containing(dir, token.as_bytes());
        assert!(
            holding.is_empty(),
            "{who}: the session token is on disk: {holding:?}"
        );
    }
    assert_eq!(
        common::files_containing(&store, code.as_bytes()),
        [file.display().to_string()],
        "{who}: the code is somewhere besides its handoff file"
    );
    // A box of this clone can neither read the file nor find the code.
    let out = c.h5i(&[
        "box",
        "run",
        "b",
        "--",
        "sh",
        "-c",
        &format!(
            "cat '{}' 2>&1; echo cat=$?; timeout 120 grep -rslF {code} /work /tmp /.h5i \"$HOME\" 2>/dev/null; echo grep=$?",
            file.display()
        ),
    ]);
    let inside = format!("{}{}", common::stdout(&out), stderr(&out));
    assert!(
        !inside.contains("cat=0") && !inside.contains(&code),
        "{who}: the box read the handoff: {inside}"
    );
    assert!(
        (inside.contains("grep=1") || inside.contains("grep=2"))
            && !inside.lines().any(|l| l.starts_with('/')),
        "{who}: a file in the box holds the code: {inside}"
    );

    // Hostile: another site without the code or with a wrong one is refused and leaves the
    // file; the code's trade from another site sets the cookie, removes the file, and the code
    // opens nothing a second time.
    let cross = ("Sec-Fetch-Site", "cross-site");
    for path in [
        "/".to_string(),
        "/?token=".to_string(),
        "/?code=".to_string(),
        format!("/?code={}", "0".repeat(64)),
        format!("/?code={token}"),
    ] {
        let r = request(con.port, "GET", &path, &[cross]);
        assert!(r.status == 403 || r.status == 401, "{path}: {r:?}");
        assert!(r.header("set-cookie").is_none(), "{path}: {r:?}");
    }
    assert!(file.exists(), "a refused request removed the handoff file");
    let with_code = format!("/?code={code}");
    // Not a method but GET, even with the code (and the code survives the refusal).
    assert_eq!(request(con.port, "POST", &with_code, &[cross]).status, 405);
    let r = request(con.port, "GET", &with_code, &[cross]);
    assert_eq!(r.status, 200, "{who}: {r:?}");
    assert!(!file.exists(), "the handoff file outlived the code's use");
    let cookie = r.header("set-cookie").unwrap().split(';').next().unwrap();
    let base = refresh_to(&r);
    assert_eq!(con.get(cookie, &base).status, 200);
    let again = request(con.port, "GET", &with_code, &[cross]);
    assert_eq!(
        again.status, 401,
        "{who}: the one-time code worked twice: {again:?}"
    );
    assert!(again.header("set-cookie").is_none(), "{again:?}");
    let again = request(con.port, "GET", &with_code, &[]);
    assert_eq!(again.status, 401, "{who}: {again:?}");
    let r = request(con.port, "GET", &base, &[("Cookie", cookie), cross]);
    assert_eq!(r.status, 403, "{r:?}");
    // The printed token still opens the console.
    assert_eq!(request(con.port, "GET", con.token_path(), &[]).status, 303);
}

#[test]
fn open_hands_the_browser_a_one_time_code_and_never_the_token() {
    open_case(false);
}

#[test]
fn open_hands_the_browser_a_one_time_code_and_never_the_token_as_h5i_test() {
    open_case(true);
}

/// The handoff file as a real browser loads it: a `file:` page, so its navigation to the
/// console is cross-site and the strict cookie is sent only on the same-origin step after it;
/// the browser ends on the console, the token out of its address bar, and the file is gone.
#[test]
fn chromium_follows_the_handoff_file_to_the_console() {
    let Some(browser) = chromium() else {
        return;
    };
    let repo = Repo::new();
    let fake = tempfile::tempdir().unwrap();
    let record = fake_opener(fake.path());
    let _console = Console::start_opening(&repo, Some(fake.path()));
    opened(&record);
    let file = recorded(&record, "argv")
        .lines()
        .nth(1)
        .unwrap()
        .to_string();
    let profile = tempfile::tempdir().unwrap();
    let mut b = Browser::launch(browser, profile.path());
    b.open(&format!("file://{file}"));
    b.until("location.pathname.startsWith('/c/') && !!document.querySelector('#boxes')");
    let href = b.eval("location.href");
    assert!(!href.as_str().unwrap().contains("token"), "{href}");
    assert!(
        !std::path::Path::new(&file).exists(),
        "the handoff file outlived its use"
    );
}

/// `c`, or `None` (said) when the test user is asked for and this test cannot switch to it.
fn caller(as_user: bool, test: &str) -> Option<Caller> {
    if as_user && !require_root(test, "switching to h5i-test") {
        return None;
    }
    Some(Caller::either(as_user))
}

/// The console as its user runs it (root, and h5i-test: the normal human path): the server h5i
/// runs holds one listening socket, TCP on 127.0.0.1 at the printed port (its own socket table
/// read through /proc, the kernel's answer); without the token every route is 401; the token
/// is traded for an HttpOnly SameSite=Strict cookie that opens the fleet, which lists the
/// user's own boxes with their tiers; another origin, site or Host is refused with the cookie.
fn own_fleet_case(as_user: bool) {
    let Some(mut c) = caller(as_user, "h5i ui as its user") else {
        return;
    };
    c.create_at("proc", "process");
    c.create_at("sup", "supervised");
    let con = Console::of(&c);
    let sockets = common::listens(con.pid);
    let want = format!("0100007F:{:04X}", con.port);
    assert!(
        sockets.len() == 1
            && sockets[0].starts_with("tcp: ")
            && sockets[0].split_whitespace().nth(2) == Some(want.as_str()),
        "as {}: the console listens on more than {want}: {sockets:?}",
        c.who()
    );

    for path in ["/", "/?token=", "/api/fleet", "/c/0/api/fleet"] {
        let r = request(con.port, "GET", path, &[]);
        assert_eq!(r.status, 401, "{path}: {r:?}");
    }
    let r = request(con.port, "GET", con.token_path(), &[]);
    assert_eq!(r.status, 303, "{r:?}");
    let set = r.header("set-cookie").unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap();
    let base = r.header("location").unwrap();
    let fleet_path = format!("{base}api/fleet");
    assert_eq!(
        request(con.port, "GET", &fleet_path, &[]).status,
        401,
        "the fleet without the cookie"
    );
    let fleet = con.get(cookie, &fleet_path).json();
    let names: Vec<&str> = fleet["boxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{fleet}");
    assert_eq!(fleet_row(&fleet, "proc")["tier"], "process", "{fleet}");
    assert_eq!(fleet_row(&fleet, "sup")["tier"], "supervised", "{fleet}");
    let detail = con.get(cookie, &format!("{base}api/box/sup")).json();
    assert_eq!(detail["status"]["tier"], "supervised", "{detail}");

    let rebound = format!("rebound.test:{}", con.port);
    for (k, v) in [
        ("Origin", "http://127.0.0.1:3000"),
        ("Origin", "http://example.com"),
        ("Sec-Fetch-Site", "cross-site"),
        ("Host", rebound.as_str()),
    ] {
        let r = request(con.port, "GET", &fleet_path, &[("Cookie", cookie), (k, v)]);
        assert_eq!(r.status, 403, "{k}: {v}: {r:?}");
        assert!(!r.body.contains("proc"), "{r:?}");
    }
}

#[test]
fn the_console_binds_loopback_alone_and_shows_its_users_fleet() {
    own_fleet_case(false);
}

#[test]
fn the_console_binds_loopback_alone_and_shows_its_users_fleet_as_h5i_test() {
    own_fleet_case(true);
}

/// The colours the manual gives besides red and a failed run's amber, end to end: a run the
/// wall clock killed (exit 124) is amber, in the fleet and on its flight row; a workspace-tier
/// box is grey (nothing was confined); what a box staged in its spool is a grey `box-claimed`
/// row beside its run's plain `host-observed` one.
fn more_colours_case(as_user: bool) {
    let Some(mut c) = caller(as_user, "h5i ui's colours") else {
        return;
    };
    c.write(
        ".h5i/env.toml",
        "[profile.quick]\nisolation = \"process\"\n[profile.quick.resources]\nwall = \"1s\"\n\
         [service.web]\ncommand = \"exec python3 -m http.server 8000 --bind 127.0.0.1\"\nport = 8000\n",
    );
    c.commit_all("a wall-clock limit and a service");
    c.create_at_with("slow", "process", &["--profile", "quick"]);
    let out = c.h5i(&["box", "run", "slow", "--", "sleep", "60"]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    c.create_at("loose", "workspace");
    c.ok(&["box", "run", "loose", "--", "true"]);
    c.create_at("claims", "process");
    c.in_box(
        "claims",
        r#"printf '{"kind":"command","argv":["make","test"]}' > "$H5I_ENV_CAPTURE_SPOOL/01-cmd.json""#,
    );
    // A real change in the workspace (the diffstat), and the box's own account of the file it
    // wrote (the flight recorder's FS lane).
    c.in_box(
        "claims",
        r#"printf 'one\ntwo\n' > notes.txt && printf '%s' '{"kind":"tool-call","source":"claude-code","payload":"{\"tool_name\":\"Write\",\"tool_input\":{\"file_path\":\"notes.txt\"}}"}' > "$H5I_ENV_CAPTURE_SPOOL/02-write.json""#,
    );
    c.ok(&["box", "service", "start", "claims", "web"]);
    c.ok(&["box", "abort", "loose"]);

    let con = Console::of(&c);
    let fleet = con.fleet();
    assert_signal(
        &fleet,
        "slow",
        "amber",
        "the wall clock killed the last run",
    );
    assert_signal(
        &fleet,
        "loose",
        "grey",
        "workspace tier: nothing was confined",
    );
    assert_signal(&fleet, "claims", "plain", "last run exit 0");
    // Each row's state is the box's own (`box abort` changed one).
    assert_eq!(fleet_row(&fleet, "slow")["state"], "active", "{fleet}");
    assert_eq!(fleet_row(&fleet, "claims")["state"], "active", "{fleet}");
    assert_eq!(fleet_row(&fleet, "loose")["state"], "aborted", "{fleet}");

    let (cookie, base) = con.login();
    let flight = |name: &str| {
        con.get(&cookie, &format!("{base}api/box/{name}")).json()["flight"]
            .as_array()
            .unwrap()
            .clone()
    };
    let killed = flight("slow");
    assert_eq!(killed.len(), 1, "{killed:?}");
    assert_eq!(killed[0]["colour"], "amber", "{killed:?}");
    assert!(
        killed[0]["cells"][2]
            .as_str()
            .unwrap()
            .ends_with("exit 124 (wall clock killed it)"),
        "{killed:?}"
    );
    let claims = flight("claims");
    let (run, claimed): (Vec<_>, Vec<_>) = claims
        .iter()
        .partition(|r| r["evidence"] == "host-observed");
    assert_eq!((run.len(), claimed.len()), (2, 2), "{claims:?}");
    assert!(run.iter().all(|r| r["colour"] == "plain"), "{claims:?}");
    for r in &claimed {
        assert_eq!(r["colour"], "grey", "{claims:?}");
        assert_eq!(r["lane"], "inbox-capture", "{claims:?}");
    }
    // The RES lane: the kill's wall time (the 1 s limit) and its memory figure.
    let res = killed[0]["cells"][3].as_str().unwrap();
    let wall: u64 = res
        .strip_prefix("wall ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("RES: {res}"));
    assert!((1000..30_000).contains(&wall), "{res}");
    assert!(res.contains(", max-rss ") && res.ends_with(" KiB"), "{res}");
    console_detail_case(&c, &con);
}

/// The picked box's detail as `claims` ended up in [`more_colours_case`]: its services panel is
/// `box service status --json`'s (the running server, then the stopped one with its exit), its
/// enforced policy `box status --json`'s, its diffstat `box diff --stat`'s over the file the
/// box wrote, and that write is the FS cell of the box's own claim.
fn console_detail_case(c: &Caller, con: &Console) {
    let (cookie, base) = con.login();
    let detail = || con.get(&cookie, &format!("{base}api/box/claims")).json();
    let cli_json = |args: &[&str]| -> serde_json::Value {
        serde_json::from_str(&c.ok(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    let d = detail();
    let services = &d["services"]["services"];
    assert_eq!(services.as_array().map(Vec::len), Some(1), "{d}");
    assert_eq!(services[0]["service"], "web", "{d}");
    assert_eq!(services[0]["alive"], true, "{d}");
    assert!(services[0]["host_port"].as_u64().is_some(), "{d}");
    let cli = cli_json(&["box", "service", "status", "claims", "--json"]);
    assert_eq!(d["services"], cli, "as {}", c.who());
    c.ok(&["box", "service", "stop", "claims", "web"]);
    let d = detail();
    let stopped = &d["services"]["services"][0];
    assert_eq!(stopped["alive"], false, "{d}");
    assert!(stopped["last_exit"].is_i64(), "{d}");
    assert_eq!(
        d["services"],
        cli_json(&["box", "service", "status", "claims", "--json"])
    );

    let status = cli_json(&["box", "status", "claims", "--json"]);
    assert!(
        status["enforced"].as_array().is_some_and(|e| !e.is_empty()),
        "{status}"
    );
    assert_eq!(d["status"]["enforced"], status["enforced"], "{d}");
    assert_eq!(d["status"]["tier"], status["tier"], "{d}");

    let stat = c.ok(&["box", "diff", "claims", "--stat"]);
    assert!(stat.contains("notes.txt"), "{stat}");
    let lines: Vec<&str> = d["diffstat"]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(lines.join("\n"), stat.trim_end(), "{d}");

    let fs: Vec<&str> = d["flight"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["cells"][0].as_str())
        .collect();
    assert_eq!(fs, ["claimed tool-call: Write notes.txt"], "{d}");
}

#[test]
fn a_wall_clock_kill_is_amber_and_weak_evidence_grey() {
    more_colours_case(false);
}

#[test]
fn a_wall_clock_kill_is_amber_and_weak_evidence_grey_as_h5i_test() {
    more_colours_case(true);
}
