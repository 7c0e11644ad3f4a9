#!/usr/bin/env bash
# Host preparation for h5i's test suite and demo (Debian 12, run as root), in two phases:
#
#   setup-host.sh packages   system packages and rustup components (what building h5i needs)
#   setup-host.sh host       after the install: `h5i host setup --user $H5I_TEST_USER` (everything a
#                            user's host needs: device nodes, the h5i-box identity, Podman config,
#                            the supervised tier's hooks, and the test user's subordinate ids,
#                            /run/user, delegated cgroup and rootless Podman config), then what
#                            only the test suite adds: the test user itself, the container
#                            tier's engine user for root, the test images, and a Podman check
#
# With no argument, both (the install must exist: `make setup` runs `make install` in between).
# Prints one "setup: ..." line per thing it changed, or "setup: nothing to change".
#
# Environment knobs:
#   H5I_TEST_USER     unprivileged test user (default h5i-test)
#   H5I_SETUP_VERIFY  0 skips the final podman checks (default 1)
#   H5I               the h5i binary to run (default: target/install/bin/h5i, what `make install`
#                     installs)
set -euo pipefail

SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPTS_DIR/.." && pwd)"
TEST_USER="${H5I_TEST_USER:-h5i-test}"
VERIFY="${H5I_SETUP_VERIFY:-1}"
PHASE="${1:-all}"
CHANGES=0

changed() { echo "setup: $*"; CHANGES=$((CHANGES + 1)); }
die() { echo "setup: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and creates $TEST_USER)"
case "$PHASE" in packages | host | all) ;; *) die "unknown phase '$PHASE' (packages, host)" ;; esac

# write_if_differs FILE MODE OWNER CONTENT: (re)write FILE only when its bytes differ.
write_if_differs() {
    local file="$1" mode="$2" owner="$3" content="$4"
    if [ -f "$file" ] && [ "$(cat "$file")" = "$content" ]; then
        return 1
    fi
    # Called as an if-condition (errexit off inside), so every step checks itself.
    { [ -d "$(dirname "$file")" ] || install -d -m 755 -o "${owner%%:*}" -g "${owner##*:}" "$(dirname "$file")"; } &&
        printf '%s\n' "$content" >"$file.h5i-tmp" &&
        chmod "$mode" "$file.h5i-tmp" &&
        chown "$owner" "$file.h5i-tmp" &&
        mv -f "$file.h5i-tmp" "$file" ||
        die "cannot write $file"
    return 0
}

if [ "$PHASE" != host ]; then
# ---------------------------------------------------------------- packages
# The list the project needs, plus what `podman` only recommends but a dev machine
# with recommends has (catatonit for --init, netavark/aardvark-dns/CNI plugins and
# iptables for rootful bridge networks): CI must see the same podman as developers.
PACKAGES=(
    podman runc crun buildah skopeo conmon uidmap slirp4netns passt fuse-overlayfs
    nftables busybox-static bubblewrap hyperfine libseccomp-dev iproute2 git tmux
    expect pkg-config debootstrap bc python3 curl
    catatonit netavark aardvark-dns containernetworking-plugins iptables
    # Workloads tests/seccomp_base.rs runs under the default-deny seccomp base: a toolchain
    # and a browser a box's identity can read (rustup's under /root is not).
    cargo chromium
    # tests/cli_docs.rs completes `h5i box ca<TAB>` in zsh and renders `h5i man` with groff.
    zsh groff-base
    # runtime/tests/containerd.rs: containerd's runc v2 shim pointed at h5i-runc (ctr run).
    containerd
    # tests/box_cache.rs: the pip, poetry and go caches, filled and used by the host's own
    # tools (uv, which Debian 12 does not package, comes from PyPI below).
    python3-pip golang-go python3-poetry
    # The microvm tier's QEMU backend (src/microvm): QEMU -M microvm, a Debian guest kernel
    # (its image and the 9p/virtio modules the guest loads; the cloud flavour has no 9p),
    # mke2fs for the image-to-root conversion, xz to unpack the kernel once. Debian bookworm
    # ships no virtiofsd, so /work is shared over 9p.
    qemu-system-x86 linux-image-amd64 e2fsprogs xz-utils
)
installed="$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PACKAGES[@]}" 2>/dev/null |
    awk '$2 == "ii" { print $1 }' || true)"
missing=()
for p in "${PACKAGES[@]}"; do
    grep -qx -- "$p" <<<"$installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log="$(mktemp /tmp/h5i-setup-apt.XXXXXX)"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
        >"$log" 2>&1 </dev/null; then
        tail -n 30 "$log" >&2
        die "apt-get failed (full log: $log)"
    fi
    rm -f "$log"
    changed "installed packages: ${missing[*]}"
fi

# ---------------------------------------------------------------- rust toolchain
# rustup's cargo lives in /root/.cargo/bin; CI runs as root with that on PATH (.ci/run).
CARGO_BIN=/root/.cargo/bin
[ -x "$CARGO_BIN/cargo" ] || die "$CARGO_BIN/cargo not found: this machine kind ships rustup's toolchain there"
components="$(PATH="$CARGO_BIN:$PATH" rustup component list --installed 2>/dev/null)" ||
    die "rustup has no usable default toolchain ('rustup default stable')"
for comp in rustfmt clippy; do
    if ! grep -q "^$comp" <<<"$components"; then
        PATH="$CARGO_BIN:$PATH" rustup component add "$comp" >/dev/null 2>&1 ||
            die "rustup component $comp missing and could not be added"
        changed "added rustup component $comp"
    fi
done
# The microvm guest agent (guest/, h5i-guest) is the guest's /init: a static musl binary.
if ! PATH="$CARGO_BIN:$PATH" rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
    PATH="$CARGO_BIN:$PATH" rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1 ||
        die "rustup target x86_64-unknown-linux-musl missing and could not be added"
    changed "added rustup target x86_64-unknown-linux-musl"
fi

# ---------------------------------------------------------------- uv
# tests/box_cache.rs's uv project: uv from PyPI (its wheel is one static binary), installed with
# Debian's pip into its own directory under /usr/local (--target leaves Debian's Python alone),
# linked into /usr/local/bin, which the kernel tiers' read grants and a box's PATH cover.
UV_VERSION=0.13.8
if [ "$(/usr/local/bin/uv --version 2>/dev/null | awk '{ print $2 }')" != "$UV_VERSION" ]; then
    log="$(mktemp /tmp/h5i-setup-uv.XXXXXX)"
    rm -rf /usr/local/lib/h5i-uv.new
    if ! /usr/bin/python3 -m pip install -q --disable-pip-version-check --no-input --only-binary=:all: \
        --target /usr/local/lib/h5i-uv.new "uv==$UV_VERSION" >"$log" 2>&1 </dev/null; then
        tail -n 30 "$log" >&2
        die "pip install uv==$UV_VERSION failed (full log: $log)"
    fi
    rm -f "$log"
    rm -rf /usr/local/lib/h5i-uv
    mv /usr/local/lib/h5i-uv.new /usr/local/lib/h5i-uv
    ln -sfn /usr/local/lib/h5i-uv/bin/uv /usr/local/bin/uv
    [ "$(/usr/local/bin/uv --version | awk '{ print $2 }')" = "$UV_VERSION" ] ||
        die "uv --version is not $UV_VERSION after the install"
    changed "installed uv $UV_VERSION under /usr/local"
fi

# ---------------------------------------------------------------- coding agents and agent-browser
# Claude Code, Codex and agent-browser, at the versions pinned in images/agent-versions.env (the
# images use the same pins), from the npm registry under /usr/local: the kernel tiers' read
# grants cover /usr, and the box's PATH names /usr/local/bin. Claude Code's native binary comes
# in its -linux-x64 optional package and needs no node at run time (npm's engine notice about
# node 22 is only a notice); agent-browser's CLI is a native binary too, and it drives Debian's
# chromium (installed above), never a browser of its own. tests/agent_claude.rs runs the agents
# against a scripted model, never a real one; tests/browser.rs drives agent-browser in boxes.
# pnpm and Yarn 1 come the same way (tests/box_cache.rs's pnpm and yarn projects; npm 11 leaves
# yarn's preinstall script, a corepack notice, unrun, and yarn needs nothing from it). Every
# package comes from the registry the host's own npm configuration names.
# shellcheck source=../images/agent-versions.env
. "$REPO_DIR/images/agent-versions.env"
agent_version() { # COMMAND: the installed version, or nothing
    [ -x "/usr/local/bin/$1" ] || return 0
    DISABLE_AUTOUPDATER=1 "/usr/local/bin/$1" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1
}
wanted=()
[ "$(agent_version claude)" = "$CLAUDE_CODE_VERSION" ] || wanted+=("@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION")
[ "$(agent_version codex)" = "$CODEX_VERSION" ] || wanted+=("@openai/codex@$CODEX_VERSION")
[ "$(agent_version agent-browser)" = "$AGENT_BROWSER_VERSION" ] || wanted+=("agent-browser@$AGENT_BROWSER_VERSION")
[ "$(agent_version pnpm)" = "$PNPM_VERSION" ] || wanted+=("pnpm@$PNPM_VERSION")
[ "$(agent_version yarn)" = "$YARN_VERSION" ] || wanted+=("yarn@$YARN_VERSION")
if [ "${#wanted[@]}" -gt 0 ]; then
    command -v npm >/dev/null || die "npm is not installed (apt-get install npm), needed for ${wanted[*]}"
    log="$(mktemp /tmp/h5i-setup-npm.XXXXXX)"
    if ! npm install -g --prefix /usr/local --no-audit --no-fund "${wanted[@]}" >"$log" 2>&1 </dev/null; then
        tail -n 30 "$log" >&2
        die "npm install ${wanted[*]} failed (full log: $log)"
    fi
    rm -f "$log"
    [ "$(agent_version claude)" = "$CLAUDE_CODE_VERSION" ] ||
        die "claude --version is not $CLAUDE_CODE_VERSION after the install (is the -linux-x64 package missing?)"
    [ "$(agent_version codex)" = "$CODEX_VERSION" ] ||
        die "codex --version is not $CODEX_VERSION after the install"
    [ "$(agent_version agent-browser)" = "$AGENT_BROWSER_VERSION" ] ||
        die "agent-browser --version is not $AGENT_BROWSER_VERSION after the install"
    [ "$(agent_version pnpm)" = "$PNPM_VERSION" ] || die "pnpm --version is not $PNPM_VERSION after the install"
    [ "$(agent_version yarn)" = "$YARN_VERSION" ] || die "yarn --version is not $YARN_VERSION after the install"
    changed "installed ${wanted[*]} under /usr/local"
fi

fi
[ "$PHASE" = packages ] && { [ "$CHANGES" -gt 0 ] || echo "setup: nothing to change"; exit 0; }

# ---------------------------------------------------------------- test user
if ! getent passwd "$TEST_USER" >/dev/null; then
    # No automatic subordinate ids: the ranges are set below, the same on every machine.
    useradd -m -s /bin/bash -K SUB_UID_COUNT=0 -K SUB_GID_COUNT=0 "$TEST_USER"
    changed "created user $TEST_USER"
fi
uid="$(id -u "$TEST_USER")"
gid="$(id -g "$TEST_USER")"
home="$(getent passwd "$TEST_USER" | cut -d: -f6)"
[ -d "$home" ] || { install -d -m 755 -o "$uid" -g "$gid" "$home"; changed "created $home"; }

# ---------------------------------------------------------------- h5i host setup
H5I="${H5I:-$REPO_DIR/target/install/bin/h5i}"
case "$H5I" in /*) ;; *) H5I="$REPO_DIR/$H5I" ;; esac
[ -x "$H5I" ] || die "$H5I is not installed: run 'make install' (or 'make setup', which installs) first"
[ -x "$(dirname "$H5I")/h5i-hook" ] || die "no h5i-hook beside $H5I: install with 'cargo install --path .' (it installs h5i-hook beside h5i)"
host_out="$("$H5I" host setup --user "$TEST_USER")" || die "h5i host setup failed: $host_out"
while IFS= read -r line; do
    case "$line" in "setup: nothing to change" | "") ;; *) changed "${line#setup: }" ;; esac
done <<<"$host_out"
rundir="/run/user/$uid"

# The container tier, run as root, runs rootless Podman as this user (src/container/engine.rs).
if write_if_differs /etc/h5i/container.toml 644 root:root "# Written by h5i scripts/setup-host.sh: when h5i runs as root, container-tier boxes
# run in rootless Podman as this unprivileged user (never rootful).
user = \"$TEST_USER\""; then
    changed "wrote /etc/h5i/container.toml (container tier engine user: $TEST_USER)"
fi

# `h5i host setup --user` wrote the user's storage.conf (native rootless overlay) unless one was
# there. If native overlay ever fails here, the verify step below switches it to
# fuse-overlayfs, and a later run keeps that choice (h5i leaves an existing file alone).
STORAGE_NATIVE=native
STORAGE_FUSE='# Written by h5i scripts/setup-host.sh: native rootless overlay failed here.
[storage]
driver = "overlay"

[storage.options.overlay]
mount_program = "/usr/bin/fuse-overlayfs"'
storage_conf="$home/.config/containers/storage.conf"
want_storage="$STORAGE_NATIVE"
if [ -f "$storage_conf" ] && [ "$(cat "$storage_conf")" = "$STORAGE_FUSE" ]; then
    want_storage="$STORAGE_FUSE"
fi

as_user() {
    (cd / && runuser -u "$TEST_USER" -- env HOME="$home" XDG_RUNTIME_DIR="$rundir" "$@")
}

# ---------------------------------------------------------------- test user's Podman state
# A container whose conmon was killed (a machine stopped mid-run) leaves the user's Podman
# state naming processes that are gone, and every rootless podman call of that user then fails
# ("invalid internal status, try resetting the pause process with podman system migrate").
# Podman's own mend, run when (and only when) Podman asks for it.
if ! state_err="$(as_user podman ps --all --quiet 2>&1 >/dev/null)" &&
    [[ "$state_err" == *"podman system migrate"* ]]; then
    as_user podman system migrate >/dev/null 2>&1 ||
        die "rootless podman for $TEST_USER is broken and 'podman system migrate' did not mend it: $state_err"
    as_user podman ps --all --quiet >/dev/null 2>&1 ||
        die "rootless podman for $TEST_USER still fails after 'podman system migrate': $state_err"
    changed "mended $TEST_USER's rootless Podman state with 'podman system migrate' (a container's conmon had been killed)"
fi

# ---------------------------------------------------------------- test images
# localhost/h5i-busybox:latest in root's and the test user's storage (idempotent).
imported="$(H5I_TEST_USER="$TEST_USER" "$SCRIPTS_DIR/make-test-image.sh" --all)" ||
    die "scripts/make-test-image.sh failed"
while IFS= read -r line; do
    [ -z "$line" ] || changed "$line"
done <<<"$imported"

# ---------------------------------------------------------------- verify
if [ "$VERIFY" = 1 ]; then
    # Rootful check in the background while the rootless ones run.
    rootful_log="$(mktemp /tmp/h5i-setup-podman.XXXXXX)"
    podman info --format '{{.Host.OCIRuntime.Name}}' >"$rootful_log" 2>&1 &
    rootful_pid=$!
    # The answer is stdout alone: podman logs unrelated complaints (a leftover container whose
    # runtime is gone, say) on stderr, which is shown only when the check fails.
    rootless_err="$(mktemp /tmp/h5i-setup-podman.XXXXXX)"
    rootless="$(as_user podman info --format '{{.Host.Security.Rootless}} {{.Store.GraphDriverName}}' 2>"$rootless_err")" ||
        die "rootless 'podman info' fails for $TEST_USER: $(cat "$rootless_err")"
    [ "$rootless" = "true overlay" ] ||
        die "rootless podman for $TEST_USER reports '$rootless' (want 'true overlay'): $(cat "$rootless_err")"
    rm -f "$rootless_err"
    if ! out="$(as_user podman run --rm --network none localhost/h5i-busybox:latest true 2>&1)"; then
        if [ "$want_storage" = "$STORAGE_NATIVE" ]; then
            # Native overlay failed: fall back to fuse-overlayfs, which needs a fresh store.
            as_user podman system reset --force >/dev/null 2>&1 || true
            write_if_differs "$storage_conf" 644 "$uid:$gid" "$STORAGE_FUSE" || true
            changed "native rootless overlay failed ($out); switched $storage_conf to fuse-overlayfs"
            H5I_TEST_USER="$TEST_USER" "$SCRIPTS_DIR/make-test-image.sh" --user >/dev/null
            out="$(as_user podman run --rm --network none localhost/h5i-busybox:latest true 2>&1)" ||
                die "rootless 'podman run' fails for $TEST_USER even with fuse-overlayfs: $out"
        else
            die "rootless 'podman run' fails for $TEST_USER: $out"
        fi
    fi
    wait "$rootful_pid" && [ "$(cat "$rootful_log")" = runc ] ||
        die "rootful 'podman info' fails or does not pick runc: $(tail -n 3 "$rootful_log")"
    rm -f "$rootful_log"
fi

[ "$CHANGES" -gt 0 ] || echo "setup: nothing to change"
