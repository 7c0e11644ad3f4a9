#!/usr/bin/env bash
# Run the benchmark rows of bench/rows.sh with hyperfine and write BENCHMARKS.md.
#
# Usage: bench/run.sh [ROW...]      (no ROW: every row; `make bench` runs them all)
#
# Each row measures a baseline and an h5i command in the same hyperfine run
# (--warmup, --export-json bench/out/ROW.json) and is judged against its target; a
# `--kind transfer` row instead alternates the two commands and keeps the time of the
# transfer each reports (bench/transfer.py), in the same JSON shape. A row
# whose setup, trial run or check fails is reported "not measured: <reason>"; the
# other rows still run. Rows not named on the command line keep their previous result
# (from bench/out/) in the report.
#
# Environment:
#   H5I           h5i binary (default: target/release/h5i of this checkout)
#   BENCH_FILES   files in the generated repositories (default 5000)
#   BENCH_WARMUP  warmup runs per command (default 3)
#   BENCH_RUNS    force this many runs per command (default: hyperfine decides)
#   BENCH_WORK    scratch directory (default /tmp/h5i-bench; emptied per row)
#   BENCH_OUT     results directory (default bench/out)
#   BENCH_REPORT  report file (default BENCHMARKS.md at the checkout's root)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
H5I="${H5I:-$ROOT/target/release/h5i}"
case "$H5I" in /*) ;; *) H5I="$PWD/$H5I" ;; esac
BENCH_FILES="${BENCH_FILES:-5000}"
BENCH_WARMUP="${BENCH_WARMUP:-3}"
BENCH_RUNS="${BENCH_RUNS:-}"
BENCH_WORK="${BENCH_WORK:-/tmp/h5i-bench}"
OUT="${BENCH_OUT:-$ROOT/bench/out}"
REPORT="${BENCH_REPORT:-$ROOT/BENCHMARKS.md}"
H5I_RUNC="${H5I_RUNC:-$ROOT/target/release/h5i-runc}"
# Podman's --cgroup-parent: under this process's own cgroup (HOST.md: never the top).
H5I_BENCH_CGROUP="$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)"
H5I_BENCH_CGROUP_ROOT="${H5I_BENCH_CGROUP%/}/h5i"
H5I_BENCH_CGROUP="${H5I_BENCH_CGROUP%/}/h5i/bench"
# The container tier's engine user (make setup: h5i-test) and its runtime directory.
H5I_ENGINE_RUNDIR="/run/user/$(id -u h5i-test 2>/dev/null || echo 1001)"
# Its uid:gid, for `podman --user` (hyperfine -N runs a command without a shell: no `$(id ...)`).
H5I_ENGINE_IDS="$(id -u h5i-test 2>/dev/null || echo 1001):$(id -g h5i-test 2>/dev/null || echo 1001)"
export H5I ROOT BENCH_FILES H5I_RUNC H5I_BENCH_CGROUP H5I_BENCH_CGROUP_ROOT H5I_ENGINE_RUNDIR H5I_ENGINE_IDS

die() { echo "bench: error: $*" >&2; exit 1; }
command -v hyperfine >/dev/null || die "hyperfine not found (make setup installs it)"
command -v python3 >/dev/null || die "python3 not found"

# ---------------------------------------------------------------- row registry
ROWS=()
declare -A ROW=()
ROW_KEYS=" kind title note setup cwd baseline baseline-prepare h5i h5i-prepare check teardown target shell runs warmup "

add_row() {
    local name="$1" key
    shift
    [[ "$name" =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "bad row name '$name' (use a-z, 0-9, -)"
    [ -z "${ROW[$name.defined]:-}" ] || die "row '$name' defined twice"
    ROW[$name.defined]=1
    while [ $# -gt 0 ]; do
        key="${1#--}"
        [[ "$ROW_KEYS" == *" $key "* ]] || die "row '$name': unknown key '$1'"
        [ $# -ge 2 ] || die "row '$name': $1 needs a value"
        ROW[$name.$key]="$2"
        shift 2
    done
    [ -n "${ROW[$name.baseline]:-}" ] || die "row '$name': --baseline is required"
    [ -n "${ROW[$name.h5i]:-}" ] || die "row '$name': --h5i is required"
    [ -n "${ROW[$name.target]:-}" ] || die "row '$name': --target is required"
    case "${ROW[$name.kind]:-time}" in
    time) ;;
    transfer)
        [ -z "${ROW[$name.baseline-prepare]:-}${ROW[$name.h5i-prepare]:-}" ] ||
            die "row '$name': a transfer row has no prepare commands"
        ;;
    *) die "row '$name': --kind is time or transfer, not '${ROW[$name.kind]}'" ;;
    esac
    ROWS+=("$name")
}

# shellcheck source=bench/rows.sh
source "$ROOT/bench/rows.sh"

# ---------------------------------------------------------------- helpers
row_dir=""

# expand STRING: replace the harness variables in a measured command.
expand() {
    local s="$1"
    s="${s//\$BENCH_FILES/$BENCH_FILES}"
    s="${s//\$ROW_DIR/$row_dir}"
    s="${s//\$ROOT/$ROOT}"
    s="${s//\$H5I_RUNC/$H5I_RUNC}"
    s="${s//\$H5I_BENCH_CGROUP_ROOT/$H5I_BENCH_CGROUP_ROOT}"
    s="${s//\$H5I_BENCH_CGROUP/$H5I_BENCH_CGROUP}"
    s="${s//\$H5I_ENGINE_RUNDIR/$H5I_ENGINE_RUNDIR}"
    s="${s//\$H5I_ENGINE_IDS/$H5I_ENGINE_IDS}"
    s="${s//\$H5I/$H5I}"
    printf '%s' "$s"
}

# snippet DIR CODE: run a bash snippet of a row in DIR, with the row's environment.
snippet() {
    (cd "$1" && ROW_DIR="$row_dir" bash -eo pipefail -c "$2")
}

# squote STRING: single-quote for hyperfine's command splitting (POSIX rules).
squote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# last_line FILE: the last non-empty line of a log, for a one-line reason.
# (An empty log is not an error: the caller still reports the row.)
last_line() { { grep -v '^[[:space:]]*$' "$1" 2>/dev/null || true; } | tail -n 1 | cut -c1-300; }
first_line() { { grep -v '^[[:space:]]*$' "$1" 2>/dev/null || true; } | head -n 1 | cut -c1-300; }

# write_meta FILE KEY VALUE...: a flat JSON object.
write_meta() {
    local file="$1"
    shift
    python3 -c 'import json, sys; a = sys.argv[1:]; print(json.dumps(dict(zip(a[::2], a[1::2])), indent=2))' \
        "$@" >"$file"
}

# ---------------------------------------------------------------- one row
measure_row() {
    local name="$1"
    local kind title target cwd baseline h5i_cmd bprep hprep shell runs warmup
    local status="not measured" reason="" log started=0
    row_dir="$BENCH_WORK/$name"
    rm -rf "$row_dir"
    mkdir -p "$row_dir" "$OUT"
    log="$row_dir/harness.log"
    : >"$log"
    rm -f "$OUT/$name.json"

    kind="${ROW[$name.kind]:-time}"
    title="$(expand "${ROW[$name.title]:-$name}")"
    target="${ROW[$name.target]}"
    cwd="$(expand "${ROW[$name.cwd]:-\$ROW_DIR}")"
    baseline="$(expand "${ROW[$name.baseline]}")"
    h5i_cmd="$(expand "${ROW[$name.h5i]}")"
    bprep="${ROW[$name.baseline-prepare]:-}"
    hprep="${ROW[$name.h5i-prepare]:-}"
    shell="${ROW[$name.shell]:-none}"
    runs="${BENCH_RUNS:-${ROW[$name.runs]:-}}"
    warmup="${ROW[$name.warmup]:-$BENCH_WARMUP}"

    echo "== $name: $title"
    if [ ! -x "$H5I" ]; then
        reason="$H5I is not built (make build)"
    elif started=1 && ! snippet "$row_dir" "${ROW[$name.setup]:-true}" >>"$log" 2>&1; then
        reason="setup failed: $(last_line "$log")"
    elif [ ! -d "$cwd" ]; then
        reason="setup made no $cwd"
    else
        # Trial: prepare + command, twice per side, so a prepare that does not reset
        # (a second `box create` of the same name failing) shows before hyperfine.
        local side cmd prep i rc
        for side in baseline h5i; do
            if [ "$side" = baseline ]; then cmd="$baseline" prep="$bprep"; else cmd="$h5i_cmd" prep="$hprep"; fi
            for i in 1 2; do
                [ -z "$prep" ] || snippet "$cwd" "$prep" >>"$log" 2>&1 || true
                rc=0
                (cd "$cwd" && bash -c "$cmd") >"$row_dir/trial.out" 2>&1 || rc=$?
                cat "$row_dir/trial.out" >>"$log"
                if [ "$rc" != 0 ]; then
                    reason="$side command failed (exit $rc, run $i): $(last_line "$row_dir/trial.out")"
                    break 2
                fi
            done
        done
        if [ -z "$reason" ] && [ -n "${ROW[$name.check]:-}" ] &&
            ! snippet "$cwd" "${ROW[$name.check]}" >"$row_dir/check.out" 2>&1; then
            reason="check failed: $(first_line "$row_dir/check.out")"
        fi
        if [ -z "$reason" ] && [ "$kind" = transfer ]; then
            # Alternating runs, each timed by curl itself (bench/transfer.py says how).
            if (cd "$cwd" && ROW_DIR="$row_dir" python3 "$ROOT/bench/transfer.py" --cwd "$cwd" \
                --runs "${runs:-30}" --warmup "$warmup" --out "$OUT/$name.json" \
                "$baseline" "$h5i_cmd" 2>"$row_dir/transfer.err"); then
                status="measured"
            else
                reason="transfer runs failed: $(last_line "$row_dir/transfer.err")"
                rm -f "$OUT/$name.json"
            fi
        elif [ -z "$reason" ]; then
            local args=(--warmup "$warmup" --time-unit millisecond --export-json "$OUT/$name.json")
            [ "$shell" = none ] && args+=(-N) || args+=(--shell "$shell")
            [ -z "$runs" ] || args+=(--runs "$runs")
            if [ -n "$bprep$hprep" ]; then
                args+=(--prepare "bash -c $(squote "${bprep:-true}")")
                args+=(--prepare "bash -c $(squote "${hprep:-true}")")
            fi
            args+=(--command-name baseline "$baseline" --command-name h5i "$h5i_cmd")
            if (cd "$cwd" && ROW_DIR="$row_dir" hyperfine "${args[@]}" 2>"$row_dir/hyperfine.err"); then
                status="measured"
            else
                reason="hyperfine failed: $(last_line "$row_dir/hyperfine.err")"
                rm -f "$OUT/$name.json"
            fi
        fi
    fi
    if [ "$started" = 1 ] && [ -n "${ROW[$name.teardown]:-}" ] && [ -d "$cwd" ]; then
        snippet "$cwd" "${ROW[$name.teardown]}" >>"$log" 2>&1 || true
    fi
    [ "$status" = measured ] || echo "   not measured: $reason"

    write_meta "$OUT/$name.meta.json" \
        name "$name" kind "$kind" title "$title" note "$(expand "${ROW[$name.note]:-}")" \
        target "$target" status "$status" reason "$reason" \
        date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        baseline "${ROW[$name.baseline]}" h5i "${ROW[$name.h5i]}" \
        shell "$shell" warmup "$warmup" files "$BENCH_FILES" \
        h5i_commit "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo '+dirty')"
}

# ---------------------------------------------------------------- main
selected=()
if [ $# -eq 0 ]; then
    selected=("${ROWS[@]}")
else
    for want in "$@"; do
        [ -n "${ROW[$want.defined]:-}" ] || die "no row '$want' (rows: ${ROWS[*]})"
        selected+=("$want")
    done
fi

mkdir -p "$BENCH_WORK" "$OUT"
for name in "${selected[@]}"; do
    measure_row "$name"
done

python3 "$ROOT/bench/report.py" --out "$OUT" --report "$REPORT" --measured "${selected[@]}" -- "${ROWS[@]}"
echo "bench: wrote $REPORT"
