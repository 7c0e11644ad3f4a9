#!/bin/sh
# Browser cold start to first snapshot, the same steps on the host and in a box (bench/rows.sh
# rows browser-first-snapshot-*): serve DIR on 127.0.0.1:PORT, `agent-browser open` it (which
# starts the daemon and Chromium), take the first `snapshot -i`, close the browser, stop the
# server. Exits non-zero unless the snapshot shows the demo's sign-up button.
#
# Usage: browser-first-snapshot.sh DIR PORT
# POSIX sh, so it runs inside a box. The box's runs get agent-browser's variables from h5i
# (src/browser/mod.rs); on the host the caller sets them.
set -u
dir="$1" port="$2"
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$dir" >/dev/null 2>&1 &
server=$!
python3 -c '
import socket, sys, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close(); break
    except OSError:
        time.sleep(0.02)
' "$port"
rc=0
agent-browser open "http://127.0.0.1:$port/" >/dev/null || rc=1
snap="$(agent-browser snapshot -i)" || rc=1
agent-browser close >/dev/null 2>&1
kill "$server"
wait "$server" 2>/dev/null
case "$snap" in *'button "Sign up"'*) ;; *) echo "no sign-up button in the first snapshot: $snap" >&2; rc=1 ;; esac
exit "$rc"
