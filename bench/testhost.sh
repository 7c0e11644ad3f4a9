#!/usr/bin/env bash
# A benchmark test host (HOST.md network rules): netns h5i-bench with a veth pair, host end
# 198.19.250.1/24, test host 198.19.250.2 serving N bytes over HTTP/1.0 on port 8080
# (bench/bulk_server.py). Nothing but this host is ever dialled by the bench rows.
#   testhost.sh up BYTES    (idempotent: replaces an earlier one)
#   testhost.sh down
set -euo pipefail
NS=h5i-bench VETH=h5ibench
down() {
    if [ -f "/run/h5i-bench-server.pid" ]; then
        kill "$(cat /run/h5i-bench-server.pid)" 2>/dev/null || true
        rm -f /run/h5i-bench-server.pid
    fi
    ip link del "$VETH" 2>/dev/null || true
    ip netns del "$NS" 2>/dev/null || true
}
case "${1:-}" in
up)
    bytes="${2:?bytes}"
    down
    ip netns add "$NS"
    ip link add "$VETH" type veth peer name "${VETH}p"
    ip link set "${VETH}p" netns "$NS"
    ip addr add 198.19.250.1/24 dev "$VETH"
    ip link set "$VETH" up
    ip -n "$NS" addr add 198.19.250.2/24 dev "${VETH}p"
    ip -n "$NS" link set "${VETH}p" up
    ip -n "$NS" link set lo up
    ready="$(mktemp -u /tmp/h5i-bench-ready.XXXXXX)"
    mkfifo "$ready"
    setsid ip netns exec "$NS" python3 "$(dirname "$0")/bulk_server.py" 198.19.250.2 8080 "$bytes" \
        >"$ready" 2>/dev/null </dev/null &
    echo $! >/run/h5i-bench-server.pid
    read -r line <"$ready"
    rm -f "$ready"
    [ "$line" = ready ] || { echo "testhost: the bulk server did not start" >&2; exit 1; }
    ;;
down) down ;;
*) echo "usage: testhost.sh up BYTES | down" >&2; exit 2 ;;
esac
