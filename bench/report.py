#!/usr/bin/env python3
"""Render BENCHMARKS.md from bench/out/: ROW.meta.json (written by bench/run.sh) and
ROW.json (hyperfine --export-json, results[0] = baseline, results[1] = h5i).

Usage: report.py --out DIR --report FILE -- ROW...   (rows in report order)
       report.py --out DIR --report FILE --only -- ROW...
           (in the existing report, replace only each ROW's summary line and the measured
           part of its section, from its heading to its result line, keeping the notes under
           it; a row not in the report yet is added at the end)
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys

TARGET_RE = re.compile(
    r"^\s*(ratio|added_ms)(?::(mean|median|min))?\s*(<=|<|>=|>)\s*([0-9]*\.?[0-9]+)\s*$"
)
OPS = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
}
OP_TEXT = {"<=": "≤", "<": "<", ">=": "≥", ">": ">"}


def parse_target(expr):
    m = TARGET_RE.match(expr)
    if not m:
        raise ValueError(f"bad target expression {expr!r}")
    metric, stat, op, num = m.groups()
    return metric, stat or "median", op, float(num)


def target_text(expr):
    try:
        metric, stat, op, num = parse_target(expr)
    except ValueError as e:
        return str(e)
    if metric == "ratio":
        return f"h5i/baseline ({stat}) {OP_TEXT[op]} {num:g}×"
    return f"added time ({stat}) {OP_TEXT[op]} {num:g} ms"


def evaluate(expr, base, h5i):
    """(value text, met: bool) for a measured row."""
    metric, stat, op, num = parse_target(expr)
    b, h = base[stat], h5i[stat]
    if metric == "ratio":
        value = h / b if b > 0 else float("inf")
        return f"{value:.2f}×", OPS[op](value, num)
    value = (h - b) * 1000.0
    return f"{value:+.2f} ms", OPS[op](value, num)


def ms(seconds):
    v = seconds * 1000.0
    if v >= 100:
        return f"{v:.1f} ms"
    if v >= 1:
        return f"{v:.2f} ms"
    return f"{v:.3f} ms"


def code(cmd):
    """A command as a table-safe code span, with $H5I shown as h5i."""
    cmd = re.sub(r"\$H5I(?![A-Z_])", "h5i", cmd)
    cmd = " ".join(cmd.split())
    return "`" + cmd.replace("|", "\\|").replace("`", "'") + "`"


def run(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_facts():
    facts = [("CPUs (nproc)", run(["nproc"]))]
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if models:
            facts.append(("CPU model", models[0]))
    except OSError:
        pass
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            kib = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1])
        facts.append(("Memory", f"{kib / 1024 / 1024:.1f} GiB"))
    except (OSError, StopIteration, ValueError):
        pass
    facts.append(("Kernel", f"{platform.system()} {platform.release()} {platform.machine()}"))
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            pretty = dict(
                ln.rstrip("\n").split("=", 1) for ln in f if "=" in ln
            ).get("PRETTY_NAME", "unknown")
        facts.append(("OS", pretty.strip('"')))
    except OSError:
        pass
    facts.append(("cgroups", cgroup_fact()))
    facts.append(("git", run(["git", "--version"])))
    facts.append(("hyperfine", run(["hyperfine", "--version"])))
    return facts


def cgroup_fact():
    """v1/hybrid/v2, and whether the cgroup2 mount has favordynmods (make setup sets it): it
    decides what a cgroup migration costs on every box run's path."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [ln.split(" - ", 1)[1].split() for ln in f if " - " in ln]
    except OSError:
        return "unknown"
    v1 = any(m[0] == "cgroup" for m in mounts)
    v2 = [m for m in mounts if m[0] == "cgroup2"]
    layout = "v1 hybrid" if v1 and v2 else "v1" if v1 else "v2" if v2 else "none"
    if v2:
        opts = v2[0][2].split(",") if len(v2[0]) > 2 else []
        layout += ", cgroup2 " + ("with" if "favordynmods" in opts else "without") + " favordynmods"
    return layout


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def row_section(meta, results):
    name = meta["name"]
    lines = [f"## {name}", "", meta.get("title", name), ""]
    shell = "hyperfine -N" if meta.get("shell", "none") == "none" else f"hyperfine --shell {meta['shell']}"
    lines.append(
        f"Measured {meta.get('date', '?')} at h5i commit {meta.get('h5i_commit', '?')}; "
        f"{shell}, --warmup {meta.get('warmup', '?')}. Target: {target_text(meta['target'])}."
    )
    lines.append("")
    if meta.get("status") != "measured" or results is None:
        lines += [f"**Not measured:** {meta.get('reason') or 'no results'}", ""]
        lines += [
            "| | command |",
            "|---|---|",
            f"| baseline | {code(meta['baseline'])} |",
            f"| h5i | {code(meta['h5i'])} |",
            "",
        ]
        return lines
    base, h5i = results
    lines += [
        "| | command | mean ± σ | median | min | max | runs |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, cmd, r in (("baseline", meta["baseline"], base), ("h5i", meta["h5i"], h5i)):
        lines.append(
            f"| {label} | {code(cmd)} | {ms(r['mean'])} ± {ms(r['stddev'] or 0.0)} | "
            f"{ms(r['median'])} | {ms(r['min'])} | {ms(r['max'])} | {len(r['times'])} |"
        )
    ratio_mean = h5i["mean"] / base["mean"] if base["mean"] > 0 else float("inf")
    ratio_median = h5i["median"] / base["median"] if base["median"] > 0 else float("inf")
    added_mean = (h5i["mean"] - base["mean"]) * 1000.0
    added_median = (h5i["median"] - base["median"]) * 1000.0
    lines.append(
        f"| h5i − baseline | | {added_mean:+.2f} ms | {added_median:+.2f} ms | | | |"
    )
    lines.append(f"| h5i / baseline | | {ratio_mean:.2f}× | {ratio_median:.2f}× | | | |")
    lines.append("")
    value, met = evaluate(meta["target"], base, h5i)
    lines += [f"Result: {value} against {target_text(meta['target'])}: **{'met' if met else 'NOT met'}**.", ""]
    return lines


def row_lines(out, name):
    """(summary line, section lines) of one row; section None when it was never run."""
    meta = load(os.path.join(out, f"{name}.meta.json"))
    if meta is None:
        return f"| {name} | | not run yet | — |", None
    hf = load(os.path.join(out, f"{name}.json"))
    results = None
    if meta.get("status") == "measured" and hf and len(hf.get("results", [])) == 2:
        results = hf["results"]
    target = target_text(meta["target"])
    if results is None:
        reason = (meta.get("reason") or "no results").replace("|", "\\|")
        line = f"| [{name}](#{name}) | {target} | not measured: {reason} | — |"
    else:
        value, met = evaluate(meta["target"], results[0], results[1])
        line = f"| [{name}](#{name}) | {target} | {value} | {'yes' if met else '**no**'} |"
    return line, row_section(meta, results)


def splice(report, out, rows):
    """Replace `rows`' summary lines and measured sections in the report's lines."""
    with open(report, encoding="utf-8") as f:
        lines = f.read().rstrip("\n").split("\n")
    for name in rows:
        line, section = row_lines(out, name)
        if section is None:
            continue
        summary_at = [i for i, l in enumerate(lines) if l.startswith(f"| [{name}](#{name}) |") or l.startswith(f"| {name} |")]
        if summary_at:
            lines[summary_at[0]] = line
        heading = [i for i, l in enumerate(lines) if l == f"## {name}"]
        if not heading:
            lines += [""] + section
            continue
        start = heading[0]
        nxt = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        # The measured part ends at its result line, or, not measured, after its command table.
        end = next((i + 1 for i in range(start, nxt) if lines[i].startswith("Result: ")), None)
        if end is None:
            table = [i for i in range(start, nxt) if lines[i].startswith("| h5i |")]
            end = table[0] + 1 if table else nxt
        lines[start:end] = section[:-1] if section and section[-1] == "" else section
    with open(report, "w", encoding="utf-8") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--only", action="store_true")
    ap.add_argument("rows", nargs="*")
    args = ap.parse_args()

    if args.only:
        splice(args.report, args.out, args.rows)
        return 0
    summary = ["| row | target | result | met |", "|---|---|---|---|"]
    sections = []
    for name in args.rows:
        line, section = row_lines(args.out, name)
        summary.append(line)
        sections += section or []

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    doc = [
        "# Benchmarks",
        "",
        f"Written by `bench/run.sh` (`make bench`) on {now}. Each row times a baseline and "
        "the h5i command in the same hyperfine run, on the same machine, one after the "
        "other; times are wall-clock per invocation. Rows and targets are defined in "
        "`bench/rows.sh`; raw hyperfine results are in `bench/out/ROW.json`.",
        "",
        "## Machine",
        "",
    ]
    doc += [f"- {k}: {v}" for k, v in machine_facts()]
    doc += ["", "## Summary", ""] + summary + [""] + sections
    with open(args.report, "w", encoding="utf-8") as f:
        f.write("\n".join(doc).rstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
