#!/usr/bin/env bash
# Generate a benchmark git repository: N text files (default 5000) in nested
# directories, one commit, checked out. Deterministic: the same N gives the same
# commit id (with the same git). Fast: one `git fast-import` stream, then a checkout.
#
# Usage: gen-bench-repo.sh DIR [N] [--force]
#   DIR must not exist or be empty; --force deletes an existing DIR first.
#
# Layout: src/m<00..>/p<0..9>/f<NNNNN>.rs, 25 files per leaf directory, each file
# about 1 KiB of distinct lines; exactly N files in all.
set -euo pipefail

die() { echo "gen-bench-repo: error: $*" >&2; exit 1; }

dir="" n="" force=0
for arg in "$@"; do
    case "$arg" in
    --force) force=1 ;;
    -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) die "unknown option: $arg" ;;
    *)
        if [ -z "$dir" ]; then dir="$arg"
        elif [ -z "$n" ]; then n="$arg"
        else die "too many arguments"; fi
        ;;
    esac
done
[ -n "$dir" ] || die "usage: gen-bench-repo.sh DIR [N] [--force]"
n="${n:-5000}"
[[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "N must be a positive integer, got '$n'"
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    [ "$force" = 1 ] || die "$dir exists and is not empty (--force to replace it)"
    rm -rf -- "$dir"
fi
mkdir -p "$dir"
cd "$dir"

export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null LC_ALL=C TZ=UTC
umask 022
git init -q -b main .
git config core.autocrlf false
git config commit.gpgsign false

# The whole tree as one fast-import stream (inline blobs, one commit).
awk -v n="$n" '
function data(s) { printf "data %d\n%s\n", length(s), s }
BEGIN {
    print "commit refs/heads/main"
    print "author h5i bench <bench@h5i.invalid> 1735689600 +0000"
    print "committer h5i bench <bench@h5i.invalid> 1735689600 +0000"
    data("bench: " n " generated files")
    for (i = 0; i < n; i++) {
        leaf = int(i / 25)
        path = sprintf("src/m%02d/p%d/f%05d.rs", int(leaf / 10), leaf % 10, i)
        body = sprintf("// generated file %d of %d\n", i, n)
        for (j = 0; j < 12; j++) {
            body = body sprintf("pub fn f%d_%d(x: u64) -> u64 { x.wrapping_mul(%d).rotate_left(%d) ^ %d }\n", \
                i, j, (i * 31 + j * 7) % 65521 + 1, (i + j) % 63 + 1, (i * 131 + j) % 1000003)
        }
        print "M 100644 inline " path
        data(body)
    }
}' | git fast-import --quiet

# Populate the index and the work tree from the commit.
git reset -q --hard main
git rev-parse HEAD
