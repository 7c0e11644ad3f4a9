#!/usr/bin/env bash
# Build h5i's container images with Podman, without a registry (none is reachable here):
#   localhost/h5i-debian:bookworm   debootstrap --variant=minbase bookworm, tarred, podman import
#   localhost/h5i-base:latest       Containerfile.base (git, curl, python3, node/npm, pnpm, yarn, ...)
#   localhost/h5i-agent-claude      Containerfile.agent-claude (@anthropic-ai/claude-code)
#   localhost/h5i-agent-codex       Containerfile.agent-codex (@openai/codex)
#   localhost/h5i-browser           Containerfile.browser (Debian chromium + agent-browser, pinned in agent-versions.env)
# The npm registry and the Debian mirror are reachable; each RUN step fetches from them.
#
# Usage: images/build.sh [--force-base] [NAME...]   (NAME: base agent-claude agent-codex browser;
#        default all, in dependency order). `make images` runs it.
#
# Images go into the storage of the user the container tier runs Podman as: run as root, the
# engine user of /etc/h5i/container.toml (H5I_CONTAINER_USER overrides; make setup names
# h5i-test); otherwise the caller's own. Podman's build output is shown as it goes; a table of
# build times and sizes is printed at the end (and written to $IMAGES_TIMES when set).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The Debian mirror is the host's own (its apt sources; not the security archive), unless
# DEBIAN_MIRROR names one.
host_mirror() {
    local f uris=()
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        while read -r key rest; do
            [ "$key" = "URIs:" ] && uris+=($rest)
        done <"$f"
    done
    if [ -r /etc/apt/sources.list ]; then
        while read -r kind a b _; do
            [ "$kind" = deb ] || continue
            case "$a" in \[*) uris+=("$b") ;; *) uris+=("$a") ;; esac
        done </etc/apt/sources.list
    fi
    for f in "${uris[@]}"; do
        case "$f" in *security*) ;; *) echo "$f"; return ;; esac
    done
}
MIRROR="${DEBIAN_MIRROR:-$(host_mirror)}"
force_base=0
names=()
for a in "$@"; do
    case "$a" in
    --force-base) force_base=1 ;;
    base | agent-claude | agent-codex | browser) names+=("$a") ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "images: error: unknown argument '$a' (names: base agent-claude agent-codex browser)" >&2; exit 2 ;;
    esac
done
[ "${#names[@]}" -gt 0 ] || names=(base agent-claude agent-codex browser)

die() { echo "images: error: $*" >&2; exit 1; }
say() { printf '\n== images: %s\n' "$*"; }

# ---------------------------------------------------------------- whose storage
if [ "$(id -u)" -eq 0 ]; then
    user="${H5I_CONTAINER_USER:-}"
    if [ -z "$user" ] && [ -f /etc/h5i/container.toml ]; then
        user="$(sed -n 's/^[[:space:]]*user[[:space:]]*=[[:space:]]*"\([A-Za-z0-9._-]*\)"[[:space:]]*$/\1/p' /etc/h5i/container.toml | head -n 1)"
    fi
    [ -n "$user" ] || die "no engine user: run make setup (it writes /etc/h5i/container.toml) or set H5I_CONTAINER_USER"
    [ "$user" != root ] || die "the container tier never runs rootful Podman; name an unprivileged engine user"
    uid="$(id -u "$user")" || die "no user $user"
    home="$(getent passwd "$user" | cut -d: -f6)"
    podman_as() {
        (cd / && runuser -u "$user" -- env -i HOME="$home" XDG_RUNTIME_DIR="/run/user/$uid" \
            PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 podman "$@")
    }
else
    user="$(id -un)"
    podman_as() { podman "$@"; }
fi
command -v podman >/dev/null || die "podman is not installed (make setup)"
podman_as info --format '{{.Host.Security.Rootless}}' | grep -qx true ||
    die "Podman for $user is not rootless"

declare -a rows=()
now() { date +%s.%N; }
record() { # NAME SECONDS
    local size
    size="$(podman_as image inspect --format '{{.Size}}' "$1" 2>/dev/null || echo 0)"
    rows+=("$(printf '| %s | %.1f s | %d MB |' "$1" "$2" "$((size / 1000000))")")
}

# ---------------------------------------------------------------- the Debian rootfs
need_base=0
for n in "${names[@]}"; do [ "$n" = base ] && need_base=1; done
if [ "$need_base" = 1 ] && { [ "$force_base" = 1 ] || ! podman_as image exists localhost/h5i-debian:bookworm; }; then
    [ "$(id -u)" -eq 0 ] || die "localhost/h5i-debian:bookworm is missing, and debootstrap needs root: run make images as root"
    command -v debootstrap >/dev/null || die "debootstrap is not installed: apt-get install -y debootstrap"
    [ -n "$MIRROR" ] || die "no Debian mirror in this host's apt sources: set DEBIAN_MIRROR=URL"
    rootfs="$(mktemp -d /var/tmp/h5i-debootstrap.XXXXXX)"
    trap 'rm -rf "$rootfs"' EXIT
    say "debootstrap --variant=minbase bookworm ($MIRROR) -> localhost/h5i-debian:bookworm"
    t0="$(now)"
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR"
    # What only helps a booted system, and the apt lists (the image's first RUN refreshes them).
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/dev/*
    tar --numeric-owner -C "$rootfs" -c . |
        podman_as import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - localhost/h5i-debian:bookworm >/dev/null
    record localhost/h5i-debian:bookworm "$(echo "$(now) - $t0" | bc)"
    rm -rf "$rootfs"
    trap - EXIT
fi

# ---------------------------------------------------------------- the Containerfiles
# The host's trust store, for the builds' RUN steps only (a TLS-intercepting proxy between
# this host and the registries signs with a CA only the host trusts); never baked in.
HOST_CA_FILE="${H5I_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
ca_args=()
if [ -r "$HOST_CA_FILE" ]; then
    ca_args=(--volume "$HOST_CA_FILE:/run/h5i-host-ca.crt:ro" --build-arg HOST_CA=/run/h5i-host-ca.crt)
fi
# The agent pins (one file, shared with make setup), as build arguments.
pin_args=()
while IFS='=' read -r k v; do
    case "$k" in '' | \#*) continue ;; esac
    pin_args+=(--build-arg "$k=$v")
done <"$HERE/agent-versions.env"
# The npm registry the host's own npm configuration names, for the base image's pnpm and yarn
# (nothing when the host has no npm: the image's npm keeps its default).
if command -v npm >/dev/null; then
    npm_registry="$(cd / && npm config get registry 2>/dev/null || true)"
    [ -z "$npm_registry" ] || pin_args+=(--build-arg "npm_config_registry=$npm_registry")
fi
ctx="$(mktemp -d /tmp/h5i-images.XXXXXX)"
trap 'rm -rf "$ctx"' EXIT
chmod 755 "$ctx"
for n in "${names[@]}"; do
    file="$HERE/Containerfile.$n"
    [ -f "$file" ] || die "no $file"
    install -m 644 "$file" "$ctx/Containerfile.$n"
    say "podman build -f Containerfile.$n -t localhost/h5i-$n:latest (as $user)"
    t0="$(now)"
    podman_as build --pull=never --layers "${ca_args[@]}" "${pin_args[@]}" -f "$ctx/Containerfile.$n" -t "localhost/h5i-$n:latest" "$ctx" ||
        die "building localhost/h5i-$n:latest failed (see the step above)"
    record "localhost/h5i-$n:latest" "$(echo "$(now) - $t0" | bc)"
done

table="$(printf '| image | build time | size |\n|---|---:|---:|\n'; printf '%s\n' "${rows[@]}")"
say "done, in $user's storage"
printf '%s\n' "$table"
[ -z "${IMAGES_TIMES:-}" ] || printf '%s\n' "$table" >"$IMAGES_TIMES"
