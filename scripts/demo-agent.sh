#!/usr/bin/env bash
# `make demo`'s agent step (scripts/demo.sh runs it; so does tests/agent_claude.rs): Claude Code
# fixes the sample repository's bug in a confined box of its own against a scripted model that
# is already serving (examples/scripted_model.rs, or the test's own), then the box is exported
# and its patch checked on a fresh copy of the base.
#
# Usage: demo-agent.sh WORK HOSTS CA_FILE
#   WORK      a directory of the caller's; the step makes WORK/agent (the sample repository and
#             its box), WORK/home (an empty HOME: nothing of the host's agent config is seeded),
#             WORK/agent-review (the export) and WORK/agent-check (the patch applied)
#   HOSTS     the H5I_TEST_HOSTS entry that points h5i's credential proxy at the model
#   CA_FILE   the CA the proxy trusts for the model (DER)
# Environment: H5I, an h5i built with the test seams (`--features test-seams`); H5I_DEMO_KEY,
# the host's key (the box only ever holds a per-run dummy; the step fails if the key is found in
# the box store or the export).
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: demo-agent.sh WORK HOSTS CA_FILE" >&2; exit 2; }
work=$1 hosts=$2 ca=$3
root=$(cd "$(dirname "$0")/.." && pwd)
h5i=${H5I:?H5I must name an h5i built with the test seams}
: "${H5I_DEMO_KEY:?H5I_DEMO_KEY must hold the host key for the demo}"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

mkdir -p "$work/home"
"$root/scripts/make-sample-repo.sh" "$work/agent" >/dev/null
cd "$work/agent"

step "h5i box create agent --profile agent-claude: Claude Code's box (tier: auto)"
"$h5i" box create agent --profile agent-claude

step "claude -p in the box: read, run the tests, edit, run them again, stage a proposal"
HOME="$work/home" ANTHROPIC_API_KEY="$H5I_DEMO_KEY" H5I_TEST_HOSTS="$hosts" \
    H5I_TEST_CA_FILE="$ca" \
    "$h5i" box run agent -- claude -p "fix the failing word count test" \
    --allowedTools Read Edit Bash

step "h5i box diff agent"
"$h5i" box diff agent

step "h5i box export agent --out $work/agent-review"
"$h5i" box export agent --out "$work/agent-review"
if grep -q "$H5I_DEMO_KEY" -r "$work/agent-review" "$work/agent/.git/.h5i"; then
    echo "demo: the host's key is in the box or its export" >&2
    exit 1
fi

step "report.md: every tool call in order with its lane, and the agent's proposal"
cat "$work/agent-review/report.md"

step "the agent's patch applies to a fresh copy of the base, and the tests pass"
"$root/scripts/make-sample-repo.sh" "$work/agent-check" >/dev/null
git -C "$work/agent-check" apply --3way "$work/agent-review/patch.diff"
(cd "$work/agent-check" && python3 -m unittest -q)
