#!/usr/bin/env bash
# make fuzz: run every fuzz target in fuzz/ for FUZZ_SECONDS (default 60) each, over the corpus
# checked in under fuzz/corpus/TARGET. New inputs libFuzzer finds go to target/fuzz-new/TARGET
# (the checked-in corpus is only read); a crash stops the run, leaving its input under
# fuzz/artifacts/TARGET, and the script exits non-zero.
#
# Toolchain: cargo-fuzz (crates.io; installed here when missing). With a nightly toolchain it
# runs with AddressSanitizer (cargo fuzz's default); with only the stable toolchain it runs with
# `--sanitizer none`, which cargo-fuzz supports on stable: the same coverage-guided libFuzzer
# and Rust's own checks (debug assertions, overflow checks, panics), without ASan's.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/root/.cargo/bin:$PATH"
seconds="${FUZZ_SECONDS:-60}"
targets="${FUZZ_TARGETS:-http1_messages egress_target socket_gate env_toml spool_record export_paths runc_config}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
if rustup run nightly rustc --version >/dev/null 2>&1; then
    toolchain=(+nightly)
    sanitizer=(--sanitizer address)
else
    toolchain=()
    sanitizer=(--sanitizer none)
fi
echo "fuzz: ${toolchain[*]:-stable} ${sanitizer[*]}, ${seconds}s per target"

for t in $targets; do
    fresh="target/fuzz-new/$t"
    mkdir -p "$fresh"
    echo "fuzz: $t"
    cargo "${toolchain[@]}" fuzz run --fuzz-dir fuzz "${sanitizer[@]}" "$t" \
        "$fresh" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1
done
echo "fuzz: every target ran ${seconds}s without a crash"
