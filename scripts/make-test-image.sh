#!/usr/bin/env bash
# Make the registry-free test image localhost/h5i-busybox:latest: a busybox-static
# rootfs (/bin/busybox plus one symlink per applet), tarred and `podman import`ed.
# No registry is reachable here, so every image tests use is built locally (0.2 s).
#
# Usage: make-test-image.sh [--root | --user | --all] [--git] [--force]
#   --root   import into root's (rootful) storage
#   --user   import into the test user's rootless storage ($H5I_TEST_USER, default
#            h5i-test); run as a non-root user, it imports into that user's storage
#   --all    both (the default as root)
#   --git    add the host's git and the libraries it links (the image is then
#            localhost/h5i-busybox-git:latest): for tests of a box's git at the container tier
#   --force  re-import even if the image exists
# Idempotent: an existing image is left alone. Prints one line per image it imported.
#
# Environment: H5I_TEST_IMAGE (default localhost/h5i-busybox[-git]:latest), H5I_TEST_USER.
set -euo pipefail

TEST_USER="${H5I_TEST_USER:-h5i-test}"
BUSYBOX=/bin/busybox
want_root=0 want_user=0 force=0 with_git=0

die() { echo "make-test-image: error: $*" >&2; exit 1; }

for arg in "$@"; do
    case "$arg" in
    --root) want_root=1 ;;
    --user) want_user=1 ;;
    --all) want_root=1 want_user=1 ;;
    --force) force=1 ;;
    --git) with_git=1 ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) die "unknown argument: $arg" ;;
    esac
done
if [ "$with_git" = 1 ]; then
    IMAGE="${H5I_TEST_IMAGE:-localhost/h5i-busybox-git:latest}"
    [ -x /usr/bin/git ] || die "/usr/bin/git missing: apt-get install git"
else
    IMAGE="${H5I_TEST_IMAGE:-localhost/h5i-busybox:latest}"
fi
if [ "$want_root" = 0 ] && [ "$want_user" = 0 ]; then
    want_root=1 want_user=1
fi
[ -x "$BUSYBOX" ] || die "$BUSYBOX missing: apt-get install busybox-static (scripts/setup-host.sh does)"

# make_rootfs: a minimal, deterministic busybox root filesystem in $rootfs (made only
# when some storage lacks the image, so the nothing-to-do path stays fast).
rootfs=""
make_rootfs() {
    local root applet
    rootfs="$(mktemp -d /tmp/h5i-busybox-rootfs.XXXXXX)"
    trap 'rm -rf "$rootfs"' EXIT
    chmod 755 "$rootfs"
    root="$rootfs"
    install -d -m 755 "$root"/{bin,sbin,usr/bin,usr/sbin,etc,dev,proc,sys,root,home,var,run}
    install -d -m 1777 "$root/tmp"
    install -m 755 "$BUSYBOX" "$root/bin/busybox"
    while IFS= read -r applet; do
        [ "$applet" = bin/busybox ] || [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
    done < <("$BUSYBOX" --list-full)
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\n' >"$root/etc/group"
    if [ "$with_git" = 1 ]; then
        # git and every library ldd names (and the loader), each at its host path.
        install -m 755 /usr/bin/git "$root/usr/bin/git"
        local lib
        for lib in $(ldd /usr/bin/git | grep -o '/[^ ]*'); do
            install -D -m 755 "$(readlink -f "$lib")" "$root$lib"
        done
    fi
}

# import_into LABEL CMD...: CMD runs podman for one storage; import if the image is absent.
import_into() {
    local label="$1"
    shift
    if [ "$force" = 0 ]; then
        local rc=0 err
        err="$("$@" image exists "$IMAGE" 2>&1)" || rc=$?
        case "$rc" in
            0) return 0 ;;
            1) ;; # absent
            *) die "podman for $label storage fails (exit $rc): $err" ;;
        esac
    fi
    [ -n "$rootfs" ] || make_rootfs
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -c . |
        "$@" import --quiet \
            --change 'CMD ["/bin/sh"]' \
            --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
            - "$IMAGE" >/dev/null ||
        die "podman import into $label storage failed"
    echo "imported $IMAGE into $label storage"
}

if [ "$(id -u)" -ne 0 ]; then
    # Unprivileged caller: its own rootless storage only.
    : "${XDG_RUNTIME_DIR:=/run/user/$(id -u)}"
    export XDG_RUNTIME_DIR
    import_into "$(id -un)'s rootless" podman
    exit 0
fi

if [ "$want_root" = 1 ]; then
    exec 8>/run/h5i-test-image.root.lock
    flock 8
    import_into "root's" podman
    exec 8>&-
fi
if [ "$want_user" = 1 ]; then
    getent passwd "$TEST_USER" >/dev/null || die "user $TEST_USER missing: run scripts/setup-host.sh"
    uid="$(id -u "$TEST_USER")"
    home="$(getent passwd "$TEST_USER" | cut -d: -f6)"
    [ -d "/run/user/$uid" ] || die "/run/user/$uid missing: run scripts/setup-host.sh"
    exec 8>"/run/h5i-test-image.$uid.lock"
    flock 8
    cd /
    import_into "$TEST_USER's rootless" \
        runuser -u "$TEST_USER" -- env HOME="$home" XDG_RUNTIME_DIR="/run/user/$uid" podman
    exec 8>&-
fi
