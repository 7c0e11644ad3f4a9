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
out="$(cd "$root" && cargo bench -q -p h5i-broker --bench proxy)" || { echo "bench: the proxy bench failed (its output is above); BENCHMARKS.md left as it was" >&2; exit 1; }
begin='<!-- proxy-bench:begin -->'
end='<!-- proxy-bench:end -->'
section="$(printf '%s\n## broker-proxy\n\nThe egress proxy (CONNECT tunnel, plain HTTP) against the same traffic with no proxy, on loopback, measured in one run by `cargo bench -p h5i-broker --bench proxy` on %s, load average %s before it. Targets: throughput >= 0.9x direct; added p50 <= 0.5 ms.\n\nUnpaced, the sender, the receiver and the proxy share this host'"'"'s CPUs, so the ratio is CPU-bound: a relay adds a second TCP connection (its send path is most of the proxy'"'"'s CPU; the bytes are spliced, never copied into it), and the ceiling line is the best any relay with the measured CPU could reach on these CPUs. The paced lines cap the sender at a 10 Gbit/s link'"'"'s rate, the fastest uplink a box is likely to have: there the tunnel keeps up.\n\n```\n%s\n```\n%s' "$begin" "$(date -u '+%Y-%m-%d %H:%M UTC')" "$load" "$out" "$end")"
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
