#!/usr/bin/env bash
# A benchmark npm registry stand-in (HOST.md network rules): netns h5i-benchnpm with a veth
# pair, host end 198.19.251.1/24, test host 198.19.251.2 serving a directory made by
# bench/npm_fixture.py over HTTP on port 8080 (python3 -m http.server). Nothing but this host
# is ever dialled by the cache bench row.
#   npm_registry.sh up DIR    (idempotent: replaces an earlier one)
#   npm_registry.sh down
set -euo pipefail
NS=h5i-benchnpm VETH=h5ibnpm PIDFILE=/run/h5i-bench-npm.pid
down() {
    if [ -f "$PIDFILE" ]; then
        kill "$(cat "$PIDFILE")" 2>/dev/null || true
        rm -f "$PIDFILE"
    fi
    ip link del "$VETH" 2>/dev/null || true
    ip netns del "$NS" 2>/dev/null || true
}
case "${1:-}" in
up)
    dir="${2:?registry directory}"
    down
    ip netns add "$NS"
    ip link add "$VETH" type veth peer name "${VETH}p"
    ip link set "${VETH}p" netns "$NS"
    ip addr add 198.19.251.1/24 dev "$VETH"
    ip link set "$VETH" up
    ip -n "$NS" addr add 198.19.251.2/24 dev "${VETH}p"
    ip -n "$NS" link set "${VETH}p" up
    ip -n "$NS" link set lo up
    ready="$(mktemp -u /tmp/h5i-bench-npm-ready.XXXXXX)"
    mkfifo "$ready"
    setsid ip netns exec "$NS" python3 -u -m http.server 8080 --bind 198.19.251.2 \
        --directory "$dir" >"$ready" 2>/dev/null </dev/null &
    echo $! >"$PIDFILE"
    read -r line <"$ready"
    rm -f "$ready"
    case "$line" in "Serving HTTP"*) ;; *) echo "npm_registry: the server did not start" >&2; exit 1 ;; esac
    ;;
down) down ;;
*) echo "usage: npm_registry.sh up DIR | down" >&2; exit 2 ;;
esac
