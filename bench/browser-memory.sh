#!/usr/bin/env bash
# Memory of a browser box with the browser running (issue 16), read host-side from the run's
# own memory cgroup (its cage; memory.usage_in_bytes, which counts the page cache the run
# brought in too): one run at TIER holds the demo app open in Chromium
# through agent-browser, and the cage's usage is read while it waits; the same box's run with
# only the dev server (no browser) is the baseline. Prints one markdown table row per figure.
#
# Usage: bench/browser-memory.sh [TIER]     (root; TIER process (default), supervised or container;
#                                           H5I=path/to/h5i, default target/release/h5i)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
H5I="${H5I:-$ROOT/target/release/h5i}"
tier="${1:-process}"
case "$tier" in process | supervised | container) ;; *) echo "usage: $0 [process|supervised|container]" >&2; exit 2 ;; esac
image=""
[ "$tier" = container ] && image='[profile.web.container]\nimage = "localhost/h5i-browser:latest"\n'
work="$(mktemp -d /tmp/h5i-browser-mem.XXXXXX)"
trap 'cd "$work/repo" 2>/dev/null && "$H5I" box rm --force mem >/dev/null 2>&1; cd /; rm -rf "$work"' EXIT

mkdir -p "$work/repo"
cd "$work/repo"
git init -q -b main && git config user.name bench && git config user.email bench@example.invalid
cp -r "$ROOT/examples/browser-demo" app
mkdir -p .h5i
printf '[profile.web]\nisolation = "%s"\n'"$image"'[profile.web.fs]\nwrite = ["~/.agent-browser"]\n[profile.web.net]\nunix = true\n' "$tier" >.h5i/env.toml
git add -A && git commit -qm bench-browser-memory
"$H5I" box create mem --profile web >/dev/null

# measure WITH_BROWSER(0|1): the memory cgroup usage (bytes) of one run of the box (its cage),
# read once the run has printed "ready"; the run then waits on a fifo this script holds open.
measure() {
    local fifo="$work/hold" marker="h5i-browser-mem-$1-$$" pid mcg usage line state drive=""
    rm -f "$fifo" && mkfifo "$fifo"
    [ "$1" = 1 ] && drive='agent-browser open http://127.0.0.1:3000/ >/dev/null && agent-browser snapshot -i >/dev/null &&'
    exec 8< <("$H5I" box run mem -- sh -c "cd /work/app && python3 -m http.server 3000 --bind 127.0.0.1 >/dev/null 2>&1 &
        python3 -c 'import socket,time
for _ in range(200):
    try: socket.create_connection((\"127.0.0.1\",3000),1).close(); break
    except OSError: time.sleep(0.02)'
        $drive echo ready && exec sh -c 'read x' $marker" <"$fifo" 2>&1)
    exec 9>"$fifo"
    while IFS= read -r -t 120 line <&8; do [ "$line" = ready ] && break; echo "$line" >&2; done
    [ "$line" = ready ] || { echo "the run never got ready" >&2; exit 1; }
    # The box's waiting shell (argv exactly `sh -c 'read x' MARKER`), not h5i, whose argv holds
    # the marker too.
    pid="$(python3 -c '
import os, sys
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")[:-1]
    except OSError:
        continue
    if argv == [b"sh", b"-c", b"read x", sys.argv[1].encode()]:
        print(p)
        break
' "$marker")"
    [ -n "$pid" ] || { echo "the run's waiting shell was not found" >&2; exit 1; }
    mcg="$(sed -n 's/^[0-9]*:memory://p' "/proc/$pid/cgroup")"
    usage="$(cat "/sys/fs/cgroup/memory$mcg/memory.usage_in_bytes")"
    # At the process and supervised tiers as root the browser is the box's sidecar, a container (and cage) of
    # its own beside the run's: its usage is the box's too.
    state="$(find "$work/repo/.git/.h5i" -path '*/mem/services/browser.json' 2>/dev/null | head -n 1)"
    if [ -n "$state" ]; then
        pid="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["pid"]["pid"])' "$state")"
        mcg="$(sed -n 's/^[0-9]*:memory://p' "/proc/$pid/cgroup")"
        usage=$((usage + $(cat "/sys/fs/cgroup/memory$mcg/memory.usage_in_bytes")))
    fi
    exec 9>&-
    cat <&8 >/dev/null
    exec 8<&-
    echo "$usage"
}
idle="$(measure 0)"
browser="$(measure 1)"
mib() { echo $(( $1 / 1048576 )); }
echo "| $tier | dev server only | $(mib "$idle") MiB |"
echo "| $tier | dev server + agent-browser daemon + Chromium with the demo app open | $(mib "$browser") MiB |"
echo "| $tier | the browser's share | $(mib $((browser - idle))) MiB |"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
