#!/usr/bin/env bash
# The main job, end to end: make a box from the bundled sample repository, run a confined change
# in it (fix the bug its failing test points at), and export the review bundle for a human; then
# the same fix made by Claude Code in a box of its own against a scripted model (no internet).
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

# ---------------------------------------------------------------- the agent does the work
# The same fix, made by Claude Code in a confined box of its own against a scripted model
# (examples/scripted_model.rs: the test suite's model service on 127.0.0.1; no model, no
# internet). h5i's credential proxy holds the key and can be pointed at a local model only in a
# build with the test seams, so this step builds one (target/release) beside the installed h5i.
claude=/usr/local/bin/claude
[ -x "$claude" ] || { echo "demo: $claude is missing; run make setup (it installs the pinned Claude Code)" >&2; exit 1; }
step "build the scripted model and an h5i with the test seams (cargo build --features test-seams)"
(cd "$root" && cargo build --release --quiet --features test-seams --bins --example scripted_model)
seams="$root/target/release/h5i"
mkdir -p "$work/model"
# The host's key for this demo: the scripted model checks every call carried it; the box only
# ever holds a per-run dummy.
export H5I_DEMO_KEY="sk-ant-demo-host-only-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
# The model serves until its stdin closes; its first line is the entry that points h5i's
# credential proxy at it, the rest is what it saw. Both through fifos this shell holds open.
mkfifo "$work/model/in" "$work/model/out"
"$root/target/release/examples/scripted_model" "$work/model" <"$work/model/in" >"$work/model/out" &
model_pid=$!
exec {model_in}>"$work/model/in" {model_out}<"$work/model/out"
read -r -u "$model_out" hosts

# The step itself (the box, claude -p, the export, the patch checked) is scripts/demo-agent.sh,
# which tests/agent_claude.rs runs as it is.
H5I="$seams" "$root/scripts/demo-agent.sh" "$work" "$hosts" "$work/model/ca.der"

exec {model_in}>&-
step "what the scripted model saw"
cat <&"$model_out"
exec {model_out}<&-
wait "$model_pid"

# ---------------------------------------------------------------- the browser in the box
# The demo app (examples/browser-demo: a console error, an exception and a failing request on
# purpose) as a box service; agent-browser in the box drives the box's own browser, which lives
# as long as the box; a human takes it and hands it back; report.md says what the page said.
if [ "$(id -u)" = 0 ]; then
    step "a browser box: the demo app as a box service, opened by agent-browser in one run, read in the next"
    mkdir -p "$work/browser/app" "$work/browser/.h5i"
    cp "$root/examples/browser-demo/index.html" "$work/browser/app/"
    cp "$root/examples/browser-demo/env.toml" "$work/browser/.h5i/env.toml"
    cd "$work/browser"
    git init -q
    git add -A
    git -c user.name=demo -c user.email=demo@example.com commit -qm "browser demo"
    "$h5i" box create web --profile web
    "$h5i" box service start web demo
    "$h5i" box run web -- agent-browser open http://127.0.0.1:3000/
    "$h5i" box run web -- agent-browser snapshot -i

    step "h5i browser take web: the agent's click is refused while a human holds the browser; its snapshot is not"
    "$h5i" browser take web
    if "$h5i" box run web -- agent-browser click '#go'; then
        echo "demo: the agent clicked while a human held the browser" >&2
        exit 1
    fi
    "$h5i" box run web -- agent-browser snapshot -i
    "$h5i" browser release web
    "$h5i" browser status web

    step "the agent snapshots again, fills, clicks and takes a screenshot"
    "$h5i" box run web -- sh -c 'agent-browser snapshot -i >/dev/null && agent-browser fill "#email" demo@example.com && agent-browser click "#go" && agent-browser get text "#out" && agent-browser screenshot /work/shot.png'

    step "report.md: what the browser saw, and who was at the controls"
    "$h5i" box export web --out "$work/browser-review"
    sed -n '/^## What the browser saw/,/^## The agent/p' "$work/browser-review/report.md"
    "$h5i" box rm --force web
else
    step "the browser in the box: skipped (its box-lifetime browser is built for root's process-tier boxes)"
fi

echo
echo "demo: done. The review bundles are in $work/review and $work/agent-review"
