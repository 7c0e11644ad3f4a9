#!/usr/bin/env python3
"""Frame latency of h5i's two viewers of a box's browser (bench/rows.sh, view-frame-*).

Usage:
  view-latency.py browser URL_FILE [--change]   the browser viewer (`h5i box view --port 0`,
                                                its URL read from URL_FILE)
  view-latency.py term H5I BOX [--change]       `h5i box view BOX --term` on a pty

The bench page (bench/rows.sh) paints its whole body black or white by the wall clock: it
turns at every multiple of PERIOD_MS since the epoch (a setTimeout aimed at the boundary), so
the host knows when the page changed without touching it. Without --change: connect, wait for
the first frame, then for the next boundary, and leave (the baseline). With --change: the same,
then wait for the first frame after that boundary that differs from the last one before it
(the page draws nothing else, so that is the frame that shows the change); it is then decoded
and must be the colour the page turned to (the browser viewer's JPEG by the sign of its
first block's luma DC coefficient, Huffman-decoded here; the terminal's zlib RGB here), else
the run fails. The added time is page change to changed frame on the viewer's side; each --change run also prints it, measured alone
(`latency_ms N`). Bounded: every wait gives up after 30 s (exit 1).
"""

import base64
import json
import os
import pty
import select
import socket
import sys
import time
import zlib

DEADLINE = 30.0
PERIOD_MS = 500
# Do not aim at a boundary closer than this: the page's timer must be armed for it.
MARGIN_MS = 100


def next_boundary():
    """The wall-clock time (s) of the next colour change at least MARGIN_MS away, and whether
    the page is black after it."""
    now_ms = time.time() * 1000
    k = int((now_ms + MARGIN_MS) // PERIOD_MS) + 1
    return k * PERIOD_MS / 1000.0, k % 2 == 1


def wait_until(t):
    while time.time() < t:
        time.sleep(min(0.01, max(0.0, t - time.time())))


def dark(rgb):
    if max(rgb) < 64:
        return True
    if min(rgb) > 191:
        return False
    fail(f"the changed frame is neither black nor white: {rgb}")


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


def jpeg_dark(data_b64):
    """Whether a baseline JPEG of one flat colour is dark: the sign of its first block's luma DC
    coefficient (the block's mean less 128), Huffman-decoded here (no image library on this
    host). Only what the bench page draws (one colour) is judged by it."""
    b = base64.b64decode(data_b64)
    i, dht, comps, q = 2, {}, [], {}
    while i < len(b):
        marker, n = b[i + 1], int.from_bytes(b[i + 2 : i + 4], "big")
        seg = b[i + 4 : i + 2 + n]
        if marker == 0xDB:
            j = 0
            while j < len(seg):
                pq, tq = seg[j] >> 4, seg[j] & 15
                q[tq] = seg[j + 1] if pq == 0 else int.from_bytes(seg[j + 1 : j + 3], "big")
                j += 1 + 64 * (pq + 1)
        elif marker == 0xC4:
            j = 0
            while j < len(seg):
                tc_th, counts = seg[j], seg[j + 1 : j + 17]
                symbols, code, table, k = seg[j + 17 : j + 17 + sum(counts)], 0, {}, 0
                for length, count in enumerate(counts, 1):
                    for _ in range(count):
                        table[(length, code)] = symbols[k]
                        code, k = code + 1, k + 1
                    code <<= 1
                dht[tc_th] = table
                j += 17 + sum(counts)
        elif marker == 0xC0:
            comps = [(seg[6 + 3 * c], seg[8 + 3 * c]) for c in range(seg[5])]
        elif marker in (0xC1, 0xC2):
            fail("not a baseline JPEG")
        elif marker == 0xDA:
            td = seg[2] >> 4
            data = b[i + 2 + n :].replace(b"\xff\x00", b"\xff")
            bits = "".join(f"{x:08b}" for x in data[:16])
            code, pos = 0, 0
            while True:
                code, pos = (code << 1) | int(bits[pos]), pos + 1
                size = dht[td].get((pos, code))
                if size is not None:
                    break
                if pos > 16:
                    fail("no DC code in the JPEG")
            raw = int(bits[pos : pos + size], 2) if size else 0
            value = raw if size == 0 or raw >= 1 << (size - 1) else raw - (1 << size) + 1
            return value * q[comps[0][1]] < 0
        i += 2 + n
    fail("no scan in the JPEG")


def frame_data(m):
    return json.loads(m).get("data", "")


def browser(url_file, change):
    with open(url_file) as f:
        url = f.readline().split(" at ", 1)[-1].strip()
    s, buf = ws_connect(url)
    s.settimeout(DEADLINE)
    msgs = ws_messages(s, buf)
    last = None
    for m in msgs:
        if '"type":"frame"' in m:
            last = frame_data(m)
            break
    boundary, black = next_boundary()
    if not change:
        wait_until(boundary)
        s.close()
        return
    # Frames until the boundary are the old colour; the first one after it that differs is new.
    for m in msgs:
        if '"type":"frame"' not in m:
            continue
        data = frame_data(m)
        now = time.time()
        if now < boundary:
            last = data
        elif data != last:
            break
    s.close()
    if jpeg_dark(data) != black:
        fail("the changed frame is not the colour the page turned to")
    print(f"latency_ms {(now - boundary) * 1000:.1f}")


def kitty_images(state, data):
    """Feed pty output; append each complete Kitty image (its keys of the first chunk and its
    whole payload) to state["images"]."""
    buf = state["tail"] + data
    while True:
        i = buf.find(b"\x1b_G")
        if i < 0:
            state["tail"] = buf[-8:]
            return
        j = buf.find(b"\x1b\\", i)
        if j < 0:
            state["tail"] = buf[i:]
            return
        body, buf = buf[i + 3 : j], buf[j + 2 :]
        keys, _, payload = body.partition(b";")
        kv = dict(k.split(b"=", 1) for k in keys.split(b",") if b"=" in k)
        if kv.get(b"a") == b"T":
            state["building"] = (kv, [payload])
        elif state.get("building") is not None and not kv.get(b"a"):
            state["building"][1].append(payload)
        else:
            continue
        if kv.get(b"m", b"0") == b"0" and state.get("building") is not None:
            first, parts = state["building"]
            state["building"] = None
            state["images"].append((time.time(), first, b"".join(parts)))


def kitty_centre(first, payload):
    raw = base64.b64decode(payload)
    if first.get(b"o") == b"z":
        raw = zlib.decompress(raw)
    width = int(first[b"s"])
    px = 4 if first.get(b"f") == b"32" else 3
    at = (16 * width + 16) * px
    return list(raw[at : at + 3])


def term(h5i, box, change):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(h5i, [h5i, "box", "view", box, "--term"])
    state = {"tail": b"", "images": [], "answered": False, "building": None}
    end = time.monotonic() + DEADLINE

    def pump(done):
        while not done():
            if time.monotonic() > end:
                fail("no frame in time")
            r, _, _ = select.select([fd], [], [], 0.05)
            if not r:
                continue
            data = os.read(fd, 1 << 20)
            if not state["answered"] and b"\x1b_Gi=31," in state["tail"] + data:
                os.write(fd, b"\x1b_Gi=31;OK\x1b\\\x1b[?62;22c")
                state["answered"] = True
            kitty_images(state, data)

    pump(lambda: len(state["images"]) >= 1)
    boundary, black = next_boundary()
    if change:
        def changed():
            imgs = state["images"]
            before = [im for im in imgs if im[0] < boundary]
            last = before[-1][2] if before else imgs[0][2]
            return any(im[0] >= boundary and im[2] != last for im in imgs)

        pump(changed)
        imgs = state["images"]
        last = [im for im in imgs if im[0] < boundary][-1][2] if any(im[0] < boundary for im in imgs) else imgs[0][2]
        at, first, payload = next(im for im in imgs if im[0] >= boundary and im[2] != last)
        if dark(kitty_centre(first, payload)) != black:
            fail("the changed image is not the colour the page turned to")
        print(f"latency_ms {(at - boundary) * 1000:.1f}")
    else:
        pump(lambda: time.time() >= boundary)
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
