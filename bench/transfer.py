#!/usr/bin/env python3
"""Time one transfer's rate, a baseline against h5i, for a `--kind transfer` row of bench/rows.sh.

Usage: transfer.py --cwd DIR --runs N --warmup N --out FILE.json BASELINE_CMD H5I_CMD

Each command (run with `bash -c` in DIR) makes one transfer and prints, as its last line,
curl's `-w '%{size_download} %{time_starttransfer} %{time_total}'`. The transfer's time is
time_total - time_starttransfer: the body, from its first byte to its last, as curl saw it;
connecting, the request and (for h5i) the box run around the transfer are not in it (the
whole-run rows time those). The two commands alternate, baseline first, so both sides see the
same load; the warmup pairs are not kept. Every run must move the same, non-zero number of
bytes, or the row is not measured (exit 1, the reason on stderr).

The output is hyperfine's JSON shape (results[0] = baseline, results[1] = h5i; times in
seconds: the transfer times), plus `bytes` per result and `kind: "transfer"`, which
bench/report.py turns into rates.
"""

import argparse
import json
import statistics
import subprocess
import sys


def one(cmd, cwd):
    """(bytes, transfer seconds) of one run of cmd."""
    out = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit {out.returncode}: {last}")
    lines = out.stdout.strip().splitlines()
    try:
        size, start, total = lines[-1].split()
        size, start, total = int(float(size)), float(start), float(total)
    except (IndexError, ValueError):
        raise RuntimeError(f"not 'BYTES STARTTRANSFER TOTAL': {out.stdout.strip()[-200:]!r}") from None
    if size <= 0 or total < start:
        raise RuntimeError(f"no transfer: {lines[-1]!r}")
    return size, total - start


def stats(cmd, times, size):
    return {
        "command": cmd,
        "mean": statistics.fmean(times),
        "stddev": statistics.stdev(times) if len(times) > 1 else 0.0,
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "times": times,
        "bytes": size,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cwd", required=True)
    ap.add_argument("--runs", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("baseline")
    ap.add_argument("h5i")
    args = ap.parse_args()
    if args.runs < 2:
        print("transfer: --runs must be at least 2", file=sys.stderr)
        return 1
    cmds = (args.baseline, args.h5i)
    times = ([], [])
    sizes = set()
    for i in range(args.warmup + args.runs):
        for side, cmd in enumerate(cmds):
            try:
                size, secs = one(cmd, args.cwd)
            except RuntimeError as e:
                print(f"{('baseline', 'h5i')[side]} run {i + 1}: {e}", file=sys.stderr)
                return 1
            sizes.add(size)
            if i >= args.warmup:
                times[side].append(secs)
    if len(sizes) != 1:
        print(f"the runs moved different byte counts: {sorted(sizes)}", file=sys.stderr)
        return 1
    size = sizes.pop()
    result = {
        "kind": "transfer",
        "results": [stats(cmd, t, size) for cmd, t in zip(cmds, times)],
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
