#!/usr/bin/env python3
"""Keystroke echo latency on a terminal: open a pty, run an echoing program on it (as its
controlling terminal), type COUNT single bytes one at a time and time each byte's round trip.

    pty_echo.py [--count N] [--quiet] [-- PREFIX...]

The program is `sh -c 'stty raw -echo && echo READY && exec dd bs=1 count=N'`: a raw terminal
and a program that writes back every byte it reads, unbuffered, and exits after N bytes. With
no PREFIX it runs on the test pty itself (a plain pty). With PREFIX = `h5i box shell NAME --` it
runs in the box, on the box's own pty, and every byte goes test pty -> h5i -> box pty -> dd ->
box pty -> h5i -> test pty: the difference is the cost of h5i's pty proxy.

Nothing is typed before the program says READY (so no byte is echoed twice while terminal
modes change). Prints `n=... p50_ms=... p99_ms=... max_ms=...` on stderr (hyperfine discards
it; run by hand to read the figures). Every wait is bounded; exits non-zero on a timeout, a
wrong echo, or the command failing.
"""

import fcntl
import os
import select
import subprocess
import sys
import termios
import time

STARTUP_TIMEOUT_S = 30.0
ECHO_TIMEOUT_S = 5.0


def read_exact(fd, n, timeout):
    """Read exactly n bytes from fd within timeout seconds, or raise."""
    got = b""
    deadline = time.monotonic() + timeout
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"waited {timeout}s for {n} byte(s), got {got!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, n - len(got))
            if not chunk:
                raise EOFError(f"terminal closed after {got!r}")
            got += chunk
    return got


def percentile(sorted_values, p):
    i = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[i]


def main(argv):
    count, quiet = 1000, False
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--count":
            count = int(argv.pop(0))
        elif flag == "--quiet":
            quiet = True
        else:
            sys.exit(f"pty_echo: unknown flag {flag}")
    prefix = argv[1:]
    echoer = f"stty raw -echo && echo READY && exec dd bs=1 count={count} status=none"
    cmd = prefix + ["sh", "-c", echoer]

    master, slave = os.openpty()
    os.set_inheritable(master, False)

    def controlling_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    child = subprocess.Popen(
        cmd, stdin=slave, stdout=slave, stderr=slave, preexec_fn=controlling_terminal
    )
    os.close(slave)
    try:
        seen = b""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while b"READY" not in seen:
            seen += read_exact(master, 1, max(0.001, deadline - time.monotonic()))
        read_exact(master, 1, ECHO_TIMEOUT_S)  # the newline after READY
        times = []
        for i in range(count):
            b = bytes([ord("a") + i % 26])
            t0 = time.perf_counter_ns()
            os.write(master, b)
            got = read_exact(master, 1, ECHO_TIMEOUT_S)
            times.append(time.perf_counter_ns() - t0)
            if got != b:
                sys.exit(f"pty_echo: typed {b!r}, saw {got!r}")
        # dd exits after COUNT bytes.
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while child.poll() is None:
            if time.monotonic() > deadline:
                child.kill()
                sys.exit("pty_echo: the command did not exit after its last byte")
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    os.read(master, 65536)
                except OSError:
                    pass
        if child.returncode != 0:
            sys.exit(f"pty_echo: the command exited {child.returncode}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(master)
    times.sort()
    ms = [t / 1e6 for t in times]
    if not quiet:
        print(
            f"n={count} p50_ms={percentile(ms, 50):.3f} p99_ms={percentile(ms, 99):.3f} "
            f"max_ms={ms[-1]:.3f}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
