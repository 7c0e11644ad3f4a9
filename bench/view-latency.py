#!/usr/bin/env python3
"""Frame latency of h5i's two viewers of a box's browser (bench/rows.sh, view-frame-*).

Usage:
  view-latency.py browser URL_FILE [--change]   the browser viewer (`h5i box view --port 0`,
                                                its URL read from URL_FILE)
  view-latency.py term H5I BOX [--change]       `h5i box view BOX --term` on a pty

Without --change: connect, wait for the first frame, leave (the baseline). With --change: the
same, then a click on the demo page's swatch corner (which the bench page turns into a colour
change) and wait for the next frame: the added time is input to changed frame on the viewer's
side. Bounded: every wait gives up after 30 s (exit 1).
"""

import base64
import os
import pty
import select
import socket
import sys
import time

DEADLINE = 30.0


def fail(msg):
    print(f"view-latency: {msg}", file=sys.stderr)
    sys.exit(1)


def ws_connect(url):
    rest = url.split("http://127.0.0.1:", 1)[1]
    port, query = rest.split("/?", 1)
    s = socket.create_connection(("127.0.0.1", int(port)), timeout=DEADLINE)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        (
            f"GET /ws?{query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Origin: http://127.0.0.1:{port}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            fail("the viewer closed during the handshake")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        fail(f"handshake refused: {head[:80]!r}")
    return s, head.split(b"\r\n\r\n", 1)[1]


def ws_messages(s, buf):
    """Yield text messages (unfragmented, unmasked server frames)."""
    while True:
        while len(buf) < 2:
            buf += s.recv(65536) or fail("closed")
        n = buf[1] & 0x7F
        off = 2
        if n == 126:
            while len(buf) < 4:
                buf += s.recv(65536) or fail("closed")
            n, off = int.from_bytes(buf[2:4], "big"), 4
        elif n == 127:
            while len(buf) < 10:
                buf += s.recv(65536) or fail("closed")
            n, off = int.from_bytes(buf[2:10], "big"), 10
        while len(buf) < off + n:
            buf += s.recv(1 << 20) or fail("closed")
        payload, buf = buf[off : off + n], buf[off + n :]
        if payload[:1] == b"{":
            yield payload.decode("utf-8", "replace")


def ws_send(s, text):
    data = text.encode()
    mask = os.urandom(4)
    n = len(data)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))


def browser(url_file, change):
    with open(url_file) as f:
        url = f.readline().split(" at ", 1)[-1].strip()
    s, buf = ws_connect(url)
    msgs = ws_messages(s, buf)
    for m in msgs:
        if '"type":"frame"' in m:
            break
    if change:
        for kind in ("mousePressed", "mouseReleased"):
            ws_send(
                s,
                '{"type":"input_mouse","eventType":"%s","x":8,"y":8,"button":"left","clickCount":1}' % kind,
            )
        for m in msgs:
            if '"type":"frame"' in m:
                break
    s.close()


def term(h5i, box, change):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(h5i, [h5i, "box", "view", box, "--term"])
    state = {"tail": b"", "images": 0, "driving": False, "answered": False}
    end = time.monotonic() + DEADLINE

    def pump(done):
        while not done():
            if time.monotonic() > end:
                fail("no frame in time")
            r, _, _ = select.select([fd], [], [], 0.5)
            if not r:
                continue
            seen = state["tail"] + os.read(fd, 1 << 20)
            if not state["answered"] and b"\x1b_Gi=31," in seen:
                os.write(fd, b"\x1b_Gi=31;OK\x1b\\\x1b[?62;22c")
                state["answered"] = True
            state["images"] += seen.count(b"\x1b_Ga=T,")
            state["driving"] |= "│ driving │".encode() in seen
            state["tail"] = seen.replace(b"\x1b_Ga=T,", b"")[-64:]

    pump(lambda: state["images"] >= 1)
    if change:
        os.write(fd, b"i")
        pump(lambda: state["driving"])
        before = state["images"]
        os.write(fd, b"\x1b[<0;1;2M\x1b[<0;1;2m")
        pump(lambda: state["images"] > before)
        os.write(fd, b"\x1d")
    os.write(fd, b"q")
    # Keep reading until it exits: a terminal that stops reading blocks the viewer's writes.
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > end:
            os.kill(pid, 9)
            fail("the viewer did not leave in time")
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                os.read(fd, 1 << 20)
            except OSError:
                pass


def main():
    args = sys.argv[1:]
    change = "--change" in args
    args = [a for a in args if a != "--change"]
    if args[:1] == ["browser"] and len(args) == 2:
        browser(args[1], change)
    elif args[:1] == ["term"] and len(args) == 3:
        term(args[1], args[2], change)
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
