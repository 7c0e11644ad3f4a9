#!/usr/bin/env bash
# Idempotent host preparation for h5i development and CI (Debian 12, run as root).
#
# Prints one "setup: ..." line per thing it changed, or "setup: nothing to change".
# Facts behind each step: shared/HOST.md (no systemd, cgroup v1 hybrid, nofile hard
# limit 20000, crun refuses hybrid cgroups, /dev/net/tun and /dev/fuse are 0600).
#
# Environment knobs:
#   H5I_TEST_USER     unprivileged test user (default h5i-test)
#   H5I_SETUP_VERIFY  0 skips the final podman checks (default 1)
set -euo pipefail

SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEST_USER="${H5I_TEST_USER:-h5i-test}"
VERIFY="${H5I_SETUP_VERIFY:-1}"
CHANGES=0

changed() { echo "setup: $*"; CHANGES=$((CHANGES + 1)); }
die() { echo "setup: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and creates $TEST_USER)"

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

# ---------------------------------------------------------------- podman config
CONTAINERS_CONF='# Written by h5i scripts/setup-host.sh; see shared/HOST.md.
# nofile: root cannot raise the hard limit past 20000 here (podman asks 1048576).
# runc: crun refuses hybrid cgroup v1 hosts. No systemd: cgroupfs + file events.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"'
if write_if_differs /etc/containers/containers.conf 644 root:root "$CONTAINERS_CONF"; then
    changed "wrote /etc/containers/containers.conf"
fi

# ---------------------------------------------------------------- device nodes
# No udev: /dev/net/tun (slirp4netns) and /dev/fuse (fuse-overlayfs) come up 0600.
for dev in /dev/net/tun /dev/fuse; do
    if [ -c "$dev" ] && [ "$(stat -c %a "$dev")" = 600 ]; then
        chmod 0666 "$dev"
        changed "chmod 0666 $dev"
    fi
done

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

# Subordinate id ranges: 200000:65536, or the first free 65536 above every existing range.
for f in /etc/subuid /etc/subgid; do
    [ -f "$f" ] || { touch "$f"; chmod 644 "$f"; }
    if ! grep -q "^$TEST_USER:" "$f"; then
        start="$(awk -F: 'BEGIN { m = 200000 } NF == 3 && $2 + $3 > m { m = $2 + $3 } END { print m }' "$f")"
        echo "$TEST_USER:$start:65536" >>"$f"
        changed "added $TEST_USER:$start:65536 to $f"
    fi
done

# ---------------------------------------------------------------- box identity (h5i-box)
# When h5i runs as root, a box's users map to this system user's subordinate range, never to
# host root (src/identity.rs, whose `ensure` does the same). No login, no home: it owns
# nothing but what boxes write. Its range is the first free 65536 ids above every existing
# range, so it overlaps no other user's (nor the test user's above).
BOX_USER=h5i-box
if ! getent passwd "$BOX_USER" >/dev/null; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
        -K SUB_UID_COUNT=0 -K SUB_GID_COUNT=0 "$BOX_USER"
    changed "created system user $BOX_USER"
fi
for f in /etc/subuid /etc/subgid; do
    [ -f "$f" ] || { touch "$f"; chmod 644 "$f"; }
    if ! grep -q "^$BOX_USER:" "$f"; then
        start="$(awk -F: 'BEGIN { m = 100000 } NF == 3 && $2 + $3 > m { m = $2 + $3 } END { print m }' "$f")"
        echo "$BOX_USER:$start:65536" >>"$f"
        changed "added $BOX_USER:$start:65536 to $f"
    fi
done
# ---------------------------------------------------------------- end of box identity

# XDG_RUNTIME_DIR: no logind makes /run/user/<uid>.
rundir="/run/user/$uid"
if [ ! -d "$rundir" ]; then
    install -d -m 755 /run/user
    install -d -m 700 -o "$uid" -g "$gid" "$rundir"
    changed "created $rundir"
elif [ "$(stat -c '%a %u' "$rundir")" != "700 $uid" ]; then
    chown "$uid:$gid" "$rundir"
    chmod 700 "$rundir"
    changed "fixed owner/mode of $rundir"
fi

# A cgroup for the test user's boxes: h5i makes each box run's group under the caller's own
# cgroup, at `<own>/h5i/<run>`; an unprivileged user can do that only in a directory root has
# delegated. The own path is the memory controller's (what the machine's management set up);
# on v1 every controller gets the same relative path, as libcontainer places a container at
# one path in all of them. Created under this process's own cgroup, so it matches the tests
# that `make test` runs next in the same session.
delegate_cgroup() {
    local own dir ctrl level part
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        own="$(sed -n 's/^0:://p' /proc/self/cgroup)"
        dir="/sys/fs/cgroup${own%/}/h5i"
        [ -d "$dir" ] || { mkdir -p "$dir"; changed "created cgroup $dir"; }
        if [ "$(stat -c %u "$dir")" != "$uid" ]; then
            chown "$uid:$gid" "$dir" "$dir/cgroup.procs" "$dir/cgroup.subtree_control"
            changed "delegated cgroup $dir to $TEST_USER"
        fi
        return
    fi
    own="$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)"
    [ -n "$own" ] || { echo "setup: no v1 memory cgroup; box limits for $TEST_USER stay unheld"; return; }
    for ctrl in /sys/fs/cgroup/*/; do
        ctrl="${ctrl%/}"
        [ -f "$ctrl/cgroup.procs" ] || continue
        [ "$(basename "$ctrl")" = unified ] && continue
        dir="$ctrl${own%/}/h5i"
        [ -d "$dir" ] || { mkdir -p "$dir"; changed "created cgroup $dir"; }
        if [ -f "$dir/cpuset.cpus" ]; then
            # A new cpuset group starts empty, and so may the session's own: fill every empty
            # level from the root down, or no task can ever be placed there (the user's runtime
            # cannot write the levels above the delegated one).
            level="$ctrl"
            for part in $(tr '/' ' ' <<<"${own#/}/h5i"); do
                level="$level/$part"
                if [ -z "$(cat "$level/cpuset.cpus")" ]; then
                    cat "$(dirname "$level")/cpuset.cpus" >"$level/cpuset.cpus"
                    cat "$(dirname "$level")/cpuset.mems" >"$level/cpuset.mems"
                    changed "populated cpuset of $level"
                fi
            done
        fi
        if [ "$(stat -c %u "$dir")" != "$uid" ]; then
            chown "$uid:$gid" "$dir" "$dir/cgroup.procs" "$dir/tasks"
            changed "delegated cgroup $dir to $TEST_USER"
        fi
    done
}
delegate_cgroup

# ---------------------------------------------------------------- cgroup migrations
# Every box run moves its first process into the run's cgroup (one write per v1 hierarchy).
# Such a write takes the kernel's global cgroup_threadgroup_rwsem for writing, which by default
# first waits out an RCU grace period: measured here, `h5i box run -- true` at the process tier
# went from 41.3 +- 9.1 ms to 29.7 +- 2.4 ms with the kernel's `favordynmods` option, which keeps
# that lock in the mode meant for hosts that move tasks between cgroups often (at a small cost to
# fork and exit). The lock is global, so the option on the cgroup2 mount covers the v1
# hierarchies too. Performance only: a host where the remount is refused still runs every box.
favor_dynmods() {
    grep -qx favordynmods /sys/kernel/cgroup/features 2>/dev/null || return 0
    local mp opts
    # mountinfo: field 5 is the mount point; after " - ": fstype, source, super options.
    read -r mp opts < <(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break;
        if ($(i + 1) == "cgroup2") { print $5, $(i + 3); exit } }' /proc/self/mountinfo) || true
    [ -n "${mp:-}" ] || return 0
    case ",$opts," in *,favordynmods,*) return 0 ;; esac
    # A remount replaces the super options, so the ones set now are passed along.
    local keep
    keep="$(tr ',' '\n' <<<"$opts" | { grep -vx -e rw -e ro || true; } | paste -sd, -)"
    if mount -o "remount${keep:+,$keep},favordynmods" "$mp" 2>/dev/null; then
        changed "cgroup2 at $mp remounted with favordynmods (fast cgroup migrations)"
    else
        echo "setup: note: could not remount $mp with favordynmods; box runs start slower here"
    fi
}
favor_dynmods

# The container tier, run as root, runs rootless Podman as this user (src/container/engine.rs).
if write_if_differs /etc/h5i/container.toml 644 root:root "# Written by h5i scripts/setup-host.sh: when h5i runs as root, container-tier boxes
# run in rootless Podman as this unprivileged user (never rootful).
user = \"$TEST_USER\""; then
    changed "wrote /etc/h5i/container.toml (container tier engine user: $TEST_USER)"
fi

# The user's config dirs must be the user's own (install -d would make parents root's).
for d in "$home/.config" "$home/.config/containers"; do
    if [ ! -d "$d" ]; then
        install -d -m 755 -o "$uid" -g "$gid" "$d"
    elif [ "$(stat -c %u "$d")" != "$uid" ]; then
        chown "$uid:$gid" "$d"
        changed "chown $TEST_USER $d"
    fi
done
# The user's containers.conf: same limits and engine as root's.
if write_if_differs "$home/.config/containers/containers.conf" 644 "$uid:$gid" "$CONTAINERS_CONF"; then
    changed "wrote $home/.config/containers/containers.conf"
fi
# Native rootless overlay works on this kernel (6.x); without this file podman falls
# back to vfs. If native overlay ever fails, the verify step below switches this file
# to fuse-overlayfs, and a later run keeps that choice.
STORAGE_NATIVE='# Written by h5i scripts/setup-host.sh: native rootless overlay.
[storage]
driver = "overlay"'
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
if write_if_differs "$storage_conf" 644 "$uid:$gid" "$want_storage"; then
    changed "wrote $storage_conf"
fi

# ---------------------------------------------------------------- supervised network hooks
# Podman injects the supervised tier's hooks from hooks.d entries matching the annotation
# h5i.net=supervised (hooks/oci/*.json, which run /usr/local/libexec/h5i/h5i-hook). Measured on
# Podman 4.3.1 here: rootful and rootless both read only /usr/share/containers/oci/hooks.d by
# default (an entry in /etc/containers/oci/hooks.d was ignored). The binary is installed from
# this tree's release build when there is one; `make test` builds after setup, and the tests
# pass their own --hooks-dir pointing at the fresh build, so they never depend on this copy.
REPO_DIR="$(cd "$SCRIPTS_DIR/.." && pwd)"
HOOKS_D=/usr/share/containers/oci/hooks.d
HOOK_BIN=/usr/local/libexec/h5i/h5i-hook
for entry in "$REPO_DIR"/hooks/oci/*.json; do
    if write_if_differs "$HOOKS_D/$(basename "$entry")" 644 root:root "$(cat "$entry")"; then
        changed "installed $HOOKS_D/$(basename "$entry")"
    fi
done
built_hook="$REPO_DIR/target/release/h5i-hook"
if [ -x "$built_hook" ]; then
    if ! cmp -s "$built_hook" "$HOOK_BIN"; then
        install -D -m 755 -o root -g root "$built_hook" "$HOOK_BIN.h5i-tmp" &&
            mv -f "$HOOK_BIN.h5i-tmp" "$HOOK_BIN" ||
            die "cannot install $HOOK_BIN"
        changed "installed $HOOK_BIN from $built_hook"
    fi
elif [ ! -x "$HOOK_BIN" ]; then
    echo "setup: note: $HOOK_BIN is not installed yet (no release build); run 'make build' then 'make setup'"
fi

# ---------------------------------------------------------------- test images
# localhost/h5i-busybox:latest in root's and the test user's storage (idempotent).
imported="$(H5I_TEST_USER="$TEST_USER" "$SCRIPTS_DIR/make-test-image.sh" --all)" ||
    die "scripts/make-test-image.sh failed"
while IFS= read -r line; do
    [ -z "$line" ] || changed "$line"
done <<<"$imported"

# ---------------------------------------------------------------- verify
as_user() {
    (cd / && runuser -u "$TEST_USER" -- env HOME="$home" XDG_RUNTIME_DIR="$rundir" "$@")
}
if [ "$VERIFY" = 1 ]; then
    # Rootful check in the background while the rootless ones run.
    rootful_log="$(mktemp /tmp/h5i-setup-podman.XXXXXX)"
    podman info --format '{{.Host.OCIRuntime.Name}}' >"$rootful_log" 2>&1 &
    rootful_pid=$!
    rootless="$(as_user podman info --format '{{.Host.Security.Rootless}} {{.Store.GraphDriverName}}' 2>&1)" ||
        die "rootless 'podman info' fails for $TEST_USER: $rootless"
    [ "$rootless" = "true overlay" ] ||
        die "rootless podman for $TEST_USER reports '$rootless' (want 'true overlay')"
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
