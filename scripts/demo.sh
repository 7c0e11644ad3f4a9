#!/usr/bin/env bash
# The main job, end to end: make a box from the bundled sample repository, run a confined change
# in it (fix the bug its failing test points at), and export the review bundle for a human.
# Run by `make demo` after `make setup`, with the h5i that `make install` installed (H5I).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
h5i="${H5I:-$root/target/install/bin/h5i}"
case "$h5i" in /*) ;; *) h5i="$root/$h5i" ;; esac
work="${H5I_DEMO_DIR:-$root/target/demo}"
[ -x "$h5i" ] || { echo "demo: $h5i is missing; run make install (or make demo) first" >&2; exit 1; }

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

rm -rf "$work"
mkdir -p "$work"
"$root/scripts/make-sample-repo.sh" "$work/wordcount" >/dev/null
cd "$work/wordcount"

step "h5i box probe: what this host can enforce"
"$h5i" box probe

step "h5i box create demo: a box from this repository at HEAD (tier: auto)"
"$h5i" box create demo

step "the sample's test fails before the change"
if "$h5i" box run demo -- python3 -m unittest -q; then
    echo "demo: expected the sample's test to fail before the fix" >&2
    exit 1
fi

step "a confined change: fix word_count inside the box"
"$h5i" box run demo -- sed -i 's/words = \[w for w in text.split(" ") if w\]/words = text.split()/' wordcount/textstats.py
"$h5i" box run demo -- python3 -m unittest -q

step "h5i box status demo"
"$h5i" box status demo

step "h5i box diff demo"
"$h5i" box diff demo

step "h5i box export demo --out $work/review"
"$h5i" box export demo --out "$work/review"

step "report.md (read it before applying)"
cat "$work/review/report.md"

step "the patch applies to a fresh copy of the base"
"$root/scripts/make-sample-repo.sh" "$work/check" >/dev/null
git -C "$work/check" apply --3way "$work/review/patch.diff"
(cd "$work/check" && python3 -m unittest -q)
echo
echo "demo: done. The review bundle is in $work/review"
