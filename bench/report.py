#!/usr/bin/env python3
"""Render BENCHMARKS.md from bench/out/: ROW.meta.json (written by bench/run.sh) and
ROW.json (hyperfine --export-json, results[0] = baseline, results[1] = h5i; for a transfer
row, bench/transfer.py's output in the same shape, times being the transfers' own).

Usage: report.py --out DIR --report FILE [--measured ROW...] -- ROW...   (rows in report order)

With --measured, only those rows' sections and summary lines are rewritten; the rest of an
existing report (other rows, and notes people wrote after a row's result) is kept.
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
    r"^\s*(ratio|rate_ratio|added_ms)(?::(mean|median|min))?\s*(<=|<|>=|>)\s*([0-9]*\.?[0-9]+)\s*$"
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
    if metric == "rate_ratio":
        return f"h5i rate / baseline rate ({stat} transfer time) {OP_TEXT[op]} {num:g}×"
    return f"added time ({stat}) {OP_TEXT[op]} {num:g} ms"


def evaluate(expr, base, h5i):
    """(value text, met: bool) for a measured row."""
    metric, stat, op, num = parse_target(expr)
    b, h = base[stat], h5i[stat]
    if metric == "ratio":
        value = h / b if b > 0 else float("inf")
        return f"{value:.2f}×", OPS[op](value, num)
    if metric == "rate_ratio":
        # The same bytes both sides: the rates' ratio is the times' inverse ratio.
        value = b / h if h > 0 else 0.0
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
    if meta.get("kind") == "transfer":
        shell = "bench/transfer.py (each command under bash -c)"
    lines.append(
        f"Measured {meta.get('date', '?')} at h5i commit {meta.get('h5i_commit', '?')}; "
        f"{shell}, --warmup {meta.get('warmup', '?')}. Target: {target_text(meta['target'])}."
    )
    lines.append("")
    if meta.get("note"):
        lines += [meta["note"], ""]
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
    if meta.get("kind") == "transfer":
        return lines + transfer_table(meta, results)
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


def mb_per_s(size, seconds):
    return f"{size / seconds / 1e6:.0f} MB/s" if seconds > 0 else "—"


def transfer_table(meta, results):
    """A transfer row's table: the transfer times curl reported, and the rates they make."""
    base, h5i = results
    size = base.get("bytes", 0)
    lines = [
        f"Each side ran {len(base['times'])} times, alternating with the other (after "
        f"{meta.get('warmup', '?')} warmup pairs); a run's time is curl's time_total − "
        f"time_starttransfer for its {size} bytes (bench/transfer.py).",
        "",
        "| | command | transfer mean ± σ | median | min | max | rate at the median | runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, cmd, r in (("baseline", meta["baseline"], base), ("h5i", meta["h5i"], h5i)):
        lines.append(
            f"| {label} | {code(cmd)} | {ms(r['mean'])} ± {ms(r['stddev'] or 0.0)} | "
            f"{ms(r['median'])} | {ms(r['min'])} | {ms(r['max'])} | "
            f"{mb_per_s(size, r['median'])} | {len(r['times'])} |"
        )
    ratio_median = base["median"] / h5i["median"] if h5i["median"] > 0 else 0.0
    ratio_mean = base["mean"] / h5i["mean"] if h5i["mean"] > 0 else 0.0
    lines.append(
        f"| h5i rate / baseline rate | | {ratio_mean:.2f}× (means) | {ratio_median:.2f}× | | | | |"
    )
    lines.append("")
    value, met = evaluate(meta["target"], base, h5i)
    lines += [f"Result: {value} against {target_text(meta['target'])}: **{'met' if met else 'NOT met'}**.", ""]
    return lines


def summary_line(name, meta, results):
    target = target_text(meta["target"])
    if results is None:
        reason = (meta.get("reason") or "no results").replace("|", "\\|")
        return f"| [{name}](#{name}) | {target} | not measured: {reason} | — |"
    value, met = evaluate(meta["target"], results[0], results[1])
    return f"| [{name}](#{name}) | {target} | {value} | {'yes' if met else '**no**'} |"


def row_block(name, meta, results):
    """A row's generated text between its markers, so a later run replaces only this."""
    return [f"<!-- row:{name}:begin -->"] + row_section(meta, results) + [f"<!-- row:{name}:end -->"]


SUMMARY_ROW_RE = re.compile(r"^\| \[?([A-Za-z0-9_.-]+)\]?")


def old_summary(lines):
    """{row: line} from the existing report's summary table."""
    rows, inside = {}, False
    for ln in lines:
        if ln.strip() == "## Summary":
            inside = True
            continue
        if inside and ln.startswith("## "):
            break
        if inside and ln.startswith("| ") and not ln.startswith("| row |"):
            m = SUMMARY_ROW_RE.match(ln)
            if m:
                rows[m.group(1)] = ln
    return rows


def block_span(lines, name):
    """(start, end) of a row's generated block in the old report, end exclusive; None if the
    row has no section. Without markers (a report written before them) the block runs from the
    heading through the `Result:` line, or through the first table when the row was not
    measured; text a person added after it stays."""
    begin, end = f"<!-- row:{name}:begin -->", f"<!-- row:{name}:end -->"
    if begin in lines and end in lines[lines.index(begin):]:
        b = lines.index(begin)
        return b, lines.index(end, b) + 1
    heading = f"## {name}"
    if heading not in lines:
        return None
    b = lines.index(heading)
    stop = next((i for i in range(b + 1, len(lines)) if lines[i].startswith("## ")
                 or lines[i].startswith("<!-- ")), len(lines))
    for i in range(b + 1, stop):
        if lines[i].startswith("Result: "):
            return b, i + 1
    seen_table = False
    for i in range(b + 1, stop):
        if lines[i].startswith("|"):
            seen_table = True
        elif seen_table:
            return b, i
    return b, stop


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--measured", nargs="*", default=None,
                    help="rows measured in this run; the other rows' text is kept as it is")
    ap.add_argument("rows", nargs="*")
    args = ap.parse_args()

    try:
        with open(args.report, encoding="utf-8") as f:
            old = f.read().splitlines()
    except OSError:
        old = []
    measured = set(args.rows if args.measured is None or not old else args.measured)
    kept = old_summary(old)

    summary = ["| row | target | result | met |", "|---|---|---|---|"]
    fresh = {}
    for name in args.rows:
        meta = load(os.path.join(args.out, f"{name}.meta.json")) if name in measured else None
        if meta is None:
            summary.append(kept.get(name, f"| {name} | | not run yet | — |"))
            continue
        hf = load(os.path.join(args.out, f"{name}.json"))
        results = None
        if meta.get("status") == "measured" and hf and len(hf.get("results", [])) == 2:
            results = hf["results"]
        summary.append(summary_line(name, meta, results))
        fresh[name] = row_block(name, meta, results)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        "# Benchmarks",
        "",
        f"Written by `bench/run.sh` (`make bench`); last run {now}, each row dated in its "
        "section. Each row times a baseline and "
        "the h5i command in the same hyperfine run, on the same machine, one after the "
        "other; times are wall-clock per invocation. Rows and targets are defined in "
        "`bench/rows.sh`; raw hyperfine results are in `bench/out/ROW.json`. A run of some rows "
        "rewrites only their sections and summary lines.",
        "",
        "## Machine",
        "",
    ]
    head += [f"- {k}: {v}" for k, v in machine_facts()]
    head += ["", "## Summary", ""] + summary + [""]

    # The body: everything after the old summary table, with each fresh row's block replaced
    # in place, or added after the row before it in report order.
    body = []
    if old and "## Summary" in old:
        i = old.index("## Summary") + 1
        while i < len(old) and not old[i].startswith("## ") and not old[i].startswith("<!-- "):
            i += 1
        body = old[i:]
    for pos, name in enumerate(args.rows):
        if name not in fresh:
            continue
        span = block_span(body, name)
        if span is not None:
            body[span[0]:span[1]] = fresh[name]
            continue
        at = len(body)
        for prev in reversed(args.rows[:pos]):
            prev_span = block_span(body, prev)
            if prev_span is not None:
                at = prev_span[1]
                while at < len(body) and not body[at].startswith("## ") \
                        and not body[at].startswith("<!-- "):
                    at += 1
                break
        body[at:at] = fresh[name] + [""]

    with open(args.report, "w", encoding="utf-8") as f:
        f.write("\n".join(head + body).rstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
