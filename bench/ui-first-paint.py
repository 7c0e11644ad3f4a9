#!/usr/bin/env python3
"""First paint of the `h5i ui` console's fleet in a real browser (BENCHMARKS.md, ui-paint-50).

Usage:
  ui-first-paint.py CHROMIUM CONSOLE_URL BOXES RUNS

CONSOLE_URL is the URL `h5i ui` printed (token included) for a store of BOXES boxes. One
headless Chromium, driven over the DevTools protocol (a raw WebSocket client here), loads:
- h5i: the console, through its token (traded for the cookie; the redirect is part of the
  load), measured from navigation start to the first animation frame after the fleet list
  holds BOXES rows (the page fetched `api/fleet` and drew it);
- baseline: the same page as it ended up drawn (its DOM with the fleet in it, its style
  inlined, no script), served as a static file by Python's http.server on loopback, measured
  the same way (navigation start to the first animation frame after BOXES rows are there).
The difference is what the console's own path costs (the token trade, the script, the fleet
document, drawing it) over a page of the same size that needs none of it. RUNS loads of each,
alternated, each in a fresh tab; the figures are ms since navigation start, from the page's
own `performance.now()`. Prints one line per side: median, min, max, and every run.
"""

import base64
import http.server
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

DEADLINE = 60.0

# Installed before any page script: when #boxes first holds the wanted rows, the next
# animation frame records performance.now() (the frame that paints them).
OBSERVER = """
(() => {
  const want = %d;
  window.__h5iPainted = new Promise((done) => {
    const look = () => {
      const list = document.getElementById("boxes");
      if (list && list.querySelectorAll("li[data-box]").length >= want) {
        requestAnimationFrame(() => done(performance.now()));
        return true;
      }
      return false;
    };
    const watch = () => {
      if (look()) return;
      new MutationObserver((_, obs) => { if (look()) obs.disconnect(); })
        .observe(document, { childList: true, subtree: true });
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watch);
    else watch();
  });
})();
"""


def fail(msg):
    print(f"ui-first-paint: {msg}", file=sys.stderr)
    sys.exit(1)


class Cdp:
    """One DevTools WebSocket (client frames masked, as the protocol requires)."""

    def __init__(self, ws_url):
        rest = ws_url.split("ws://", 1)[1]
        hostport, path = rest.split("/", 1)
        host, port = hostport.split(":")
        self.s = socket.create_connection((host, int(port)), timeout=DEADLINE)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.s.recv(4096) or fail("DevTools closed the handshake")
        if not head.startswith(b"HTTP/1.1 101"):
            fail(f"DevTools refused: {head[:80]!r}")
        self.buf = head.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def _recv(self, n):
        while len(self.buf) < n:
            self.buf += self.s.recv(1 << 20) or fail("DevTools closed")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _message(self):
        head = self._recv(2)
        n = head[1] & 0x7F
        if n == 126:
            n = int.from_bytes(self._recv(2), "big")
        elif n == 127:
            n = int.from_bytes(self._recv(8), "big")
        return head[0] & 0x0F, self._recv(n)

    def call(self, method, **params):
        self.next_id += 1
        data = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            length = bytes([0x80 | n])
        elif n < 65536:
            length = bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            length = bytes([0x80 | 127]) + n.to_bytes(8, "big")
        self.s.sendall(bytes([0x81]) + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        while True:
            op, payload = self._message()
            if op != 1:
                continue
            m = json.loads(payload)
            if m.get("id") == self.next_id:
                if "error" in m:
                    fail(f"{method}: {m['error']}")
                return m.get("result", {})


def open_watched(devtools, url, rows):
    """A fresh tab loading `url` with the paint observer for `rows` rows in place: (tab, cdp)."""
    req = urllib.request.Request(f"http://127.0.0.1:{devtools}/json/new?about:blank", method="PUT")
    tab = json.load(urllib.request.urlopen(req, timeout=DEADLINE))
    cdp = Cdp(tab["webSocketDebuggerUrl"])
    cdp.call("Page.enable")
    cdp.call("Page.addScriptToEvaluateOnNewDocument", source=OBSERVER % rows)
    cdp.call("Page.navigate", url=url)
    return tab, cdp


def painted_at(devtools, url, rows):
    """Load `url` in a fresh tab; ms from navigation start to the frame that paints `rows` rows."""
    tab, cdp = open_watched(devtools, url, rows)
    got = cdp.call(
        "Runtime.evaluate",
        expression="new Promise((ok, no) => { const t = setTimeout(() => no('no paint'), 30000); "
        "const wait = () => window.__h5iPainted ? window.__h5iPainted.then((v) => { clearTimeout(t); ok(v); }) "
        ": setTimeout(wait, 5); wait(); })",
        awaitPromise=True,
        returnByValue=True,
    )
    value = got.get("result", {}).get("value")
    if not isinstance(value, (int, float)):
        fail(f"{url}: {got}")
    cdp.s.close()
    urllib.request.urlopen(f"http://127.0.0.1:{devtools}/json/close/{tab['id']}", timeout=DEADLINE)
    return float(value)


def drawn_page(devtools, url, rows):
    """The console page as drawn (fleet included): its DOM without scripts, style inlined."""
    tab, cdp = open_watched(devtools, url, rows)
    got = cdp.call(
        "Runtime.evaluate",
        expression="(async () => { while (!window.__h5iPainted) await new Promise((r) => setTimeout(r, 5)); "
        "await window.__h5iPainted; "
        "const css = await (await fetch('app.css')).text(); "
        "const doc = document.documentElement.cloneNode(true); "
        "doc.querySelectorAll('script, link[rel=stylesheet]').forEach((n) => n.remove()); "
        "const style = document.createElement('style'); style.textContent = css; "
        "doc.querySelector('head').append(style); "
        "return '<!doctype html>' + doc.outerHTML; })()",
        awaitPromise=True,
        returnByValue=True,
    )
    cdp.s.close()
    html = got.get("result", {}).get("value")
    if not isinstance(html, str) or html.count("data-box=") < rows:
        fail(f"the drawn console page has not {rows} rows")
    return html


def main():
    if len(sys.argv) != 5:
        fail(__doc__)
    chromium, console, rows, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    profile = tempfile.mkdtemp(prefix="ui-paint-")
    static_dir = tempfile.mkdtemp(prefix="ui-paint-page-")
    port_file = os.path.join(profile, "DevToolsActivePort")
    browser = subprocess.Popen(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    server = None
    try:
        end = time.monotonic() + DEADLINE
        while not (os.path.exists(port_file) and os.path.getsize(port_file) > 0):
            if time.monotonic() > end:
                fail("Chromium opened no DevTools port")
            time.sleep(0.05)
        devtools = int(open(port_file).read().split()[0])
        html = drawn_page(devtools, console, rows)
        with open(os.path.join(static_dir, "index.html"), "w") as f:
            f.write(html)

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory=static_dir, **k)

            def log_message(self, *a):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        static = f"http://127.0.0.1:{server.server_address[1]}/index.html"
        sides = {"baseline": [], "h5i": []}
        painted_at(devtools, static, rows)
        painted_at(devtools, console, rows)
        for _ in range(runs):
            sides["baseline"].append(painted_at(devtools, static, rows))
            sides["h5i"].append(painted_at(devtools, console, rows))
        print(f"static page: {len(html)} bytes, {rows} rows")
        for side, v in sides.items():
            print(
                f"{side}: median {statistics.median(v):.1f} ms, min {min(v):.1f}, max {max(v):.1f}; "
                + " ".join(f"{x:.1f}" for x in v)
            )
        print(f"added (median): {statistics.median(sides['h5i']) - statistics.median(sides['baseline']):+.1f} ms")
    finally:
        if server:
            server.shutdown()
        browser.kill()
        browser.wait()
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(static_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
