#!/usr/bin/env bash
# After `cargo test` in `make test`: the skips the run recorded ($1, the file H5I_TEST_SKIPS
# named; testsupport/src/skip.rs), printed where the CI log shows them, and refused unless
# $2 (tests/skips-allowed.txt) names each with why this kind of host cannot run it: a test for a
# capability the host has must run, not skip.
set -euo pipefail
log=$1
allowed=$2
if [ ! -s "$log" ]; then
    echo "test skips: none"
    exit 0
fi
sort -u "$log" > "$log.sorted"
echo "test skips ($(wc -l < "$log.sorted")):"
sed 's/^/  /' "$log.sorted"
patterns=$(grep -v -e '^#' -e '^$' "$allowed" || true)
if [ -n "$patterns" ]; then
    unexpected=$(grep -v -E -e "$patterns" "$log.sorted" || true)
else
    unexpected=$(cat "$log.sorted")
fi
if [ -n "$unexpected" ]; then
    echo "refusing: these tests skipped on a host that make setup prepared:"
    echo "$unexpected" | sed 's/^/  /'
    echo "to fix: give the host what they need (scripts/setup-host.sh), or, if this kind of host cannot have it, add a pattern with the reason to $allowed"
    exit 1
fi
