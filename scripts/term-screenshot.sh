#!/usr/bin/env bash
# docs/box-view-term.png: `h5i box view NAME --term` in a real Kitty (the terminal that defines
# the Kitty graphics protocol) on a virtual X display, screenshotted. Makes a scratch repository
# with the demo app (examples/browser-demo/) and a process-tier browser box serving it, opens
# the page with agent-browser, runs the terminal viewer in Kitty, captures Kitty's window, and
# removes the box and the display. Needs kitty, xvfb, x11-utils and imagemagick (Debian
# packages), a display number that is free (H5I_SHOT_DISPLAY, default 57) and the h5i that
# `make install` installed (H5I). Usage: scripts/term-screenshot.sh [OUT.png]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
h5i="${H5I:-$root/target/install/bin/h5i}"
out="${1:-$root/docs/box-view-term.png}"
display=":${H5I_SHOT_DISPLAY:-57}"
for tool in kitty Xvfb xwininfo import; do
    command -v "$tool" >/dev/null || { echo "term-screenshot: $tool is missing (apt-get install kitty xvfb x11-utils imagemagick)" >&2; exit 1; }
done
[ -x "$h5i" ] || { echo "term-screenshot: $h5i is missing; run make install first" >&2; exit 1; }

work=$(mktemp -d)
xvfb=""
cleanup() {
    (cd "$work/repo" 2>/dev/null && "$h5i" box rm --force web >/dev/null 2>&1) || true
    [ -n "$xvfb" ] && kill "$xvfb" 2>/dev/null && wait "$xvfb" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/repo/.h5i" "$work/repo/app"
cd "$work/repo"
git init -q
cp "$root/examples/browser-demo/index.html" app/
cp "$root/examples/browser-demo/env.toml" .h5i/env.toml
git add -A
git -c user.name=h5i -c user.email=h5i@example.com commit -qm "browser demo"
"$h5i" box create web --isolation process --profile web >/dev/null
"$h5i" box service start web demo >/dev/null
"$h5i" box run web -- sh -c 'python3 -c "import socket, time; any(socket.socket().connect_ex((\"127.0.0.1\", 3000)) == 0 or time.sleep(0.1) for _ in range(100))" && agent-browser open http://127.0.0.1:3000/' >/dev/null

Xvfb "$display" -screen 0 1400x900x24 -nolisten tcp >/dev/null 2>&1 &
xvfb=$!
DISPLAY=$display timeout 120 kitty --config NONE -o font_size=10 -o remember_window_size=no \
    -o initial_window_width=1320 -o initial_window_height=800 -o background='#101014' \
    "$h5i" box view web --term >/dev/null 2>&1 &
kitty=$!
# Kitty under a software GL starts in seconds; its window is the display's only one.
window=""
for _ in $(seq 1 60); do
    window=$(DISPLAY=$display xwininfo -root -tree 2>/dev/null | awk '/"kitty"/ {print $1; exit}')
    [ -n "$window" ] && break
    sleep 0.5
done
[ -n "$window" ] || { echo "term-screenshot: kitty opened no window" >&2; exit 1; }
# Row one comes at once; the first frame within a few seconds.
sleep 8
DISPLAY=$display import -window "$window" "$out"
kill "$kitty" 2>/dev/null || true
wait "$kitty" 2>/dev/null || true
echo "term-screenshot: wrote $out"
