#!/usr/bin/env bash
# The broker's proxy figures (throughput of a 100 MB CONNECT transfer, p50/p99 latency of 1,000
# small requests, each against the same transfer or requests with no proxy, measured in the same
# run on loopback) into BENCHMARKS.md, between the markers below. Run by `make bench`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
report="${BENCH_REPORT:-$root/BENCHMARKS.md}"
# The 1/5/15-minute load averages before the run: on a small shared host the wall-clock ratio
# moves with them (the per-pair spread in the output shows by how much).
load="$(cut -d' ' -f1-3 /proc/loadavg)"
out="$(cd "$root" && cargo bench -q -p h5i-broker --bench proxy 2>/dev/null)"
begin='<!-- proxy-bench:begin -->'
end='<!-- proxy-bench:end -->'
section="$(printf '%s\n## broker-proxy\n\nThe egress proxy (CONNECT tunnel, plain HTTP) against the same traffic with no proxy, on loopback, measured in one run by `cargo bench -p h5i-broker --bench proxy` on %s, load average %s before it. Targets: throughput >= 0.9x direct; added p50 <= 0.5 ms.\n\n```\n%s\n```\n%s' "$begin" "$(date -u '+%Y-%m-%d %H:%M UTC')" "$load" "$out" "$end")"
touch "$report"
python3 - "$report" "$section" "$begin" "$end" <<'PY'
import sys
path, section, begin, end = sys.argv[1:5]
text = open(path).read()
if begin in text and end in text:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    text = head + section + tail
else:
    text = text.rstrip("\n") + "\n\n" + section + "\n"
open(path, "w").write(text)
PY
echo "bench: wrote the broker-proxy section of $report"
