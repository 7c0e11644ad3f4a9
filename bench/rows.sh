# shellcheck shell=bash
# shellcheck disable=SC2016  # commands are templates: $VARS expand later, on purpose
# Benchmark rows, sourced by bench/run.sh. Each row compares an h5i command with a
# baseline measured in the SAME hyperfine run.
#
# add_row NAME [--key VALUE]...
#   --kind time|transfer time (default): hyperfine times each whole command.
#                        transfer: each command makes one transfer and prints curl's
#                        -w '%{size_download} %{time_starttransfer} %{time_total}';
#                        the two alternate (--runs, default 30) and the row compares
#                        the transfers' own times (bench/transfer.py); no prepares
#   --title T            one line for the report
#   --setup CMD          bash, run in a fresh $ROW_DIR before measuring; failing it
#                        marks the row "not measured: setup failed"
#   --cwd DIR            where the measured commands run (default $ROW_DIR)
#   --baseline CMD       the baseline command                          (required)
#   --baseline-prepare CMD   bash, before every baseline run (also warmups)
#   --h5i CMD            the h5i command                               (required)
#   --h5i-prepare CMD    bash, before every h5i run (also warmups)
#   --check CMD          bash, after a trial run of both commands: proves the h5i
#                        command really did its job (an exit 0 from a stub is not a
#                        result); failing it marks the row "not measured"
#   --teardown CMD       bash, after measuring (errors ignored)
#   --target EXPR        METRIC[:STAT] OP NUMBER, METRIC one of
#                          ratio     h5i STAT / baseline STAT
#                          rate_ratio  baseline STAT / h5i STAT: the h5i side's rate
#                                    over the baseline's (transfer rows)
#                          added_ms  h5i STAT - baseline STAT, in milliseconds
#                        STAT mean|median|min (default median), OP <= < >= >
#   --shell bash|none    hyperfine's --shell (default none: `hyperfine -N`, for
#                        small commands; quotes still group words, no $-expansion)
#   --runs N             fixed run count (default: hyperfine's, >= 10 runs and >= 3 s)
#   --warmup N           warmup runs (default $BENCH_WARMUP)
#
# In every command the harness replaces $H5I (the binary), $ROW_DIR (this row's
# scratch dir), $ROOT (the h5i checkout), $BENCH_FILES (files per generated repo),
# $H5I_RUNC, $H5I_BENCH_CGROUP(_ROOT), and the engine user's $H5I_ENGINE_RUNDIR and
# $H5I_ENGINE_IDS (uid:gid) before use; the bash snippets also get them as environment variables, along with
# $BENCH_MUTATE (below). Measured commands run with hyperfine -N unless --shell bash.
#
# To add a row: append an add_row call here. `bench/run.sh NAME` measures just that
# row and keeps the other rows' previous results in BENCHMARKS.md.

# Change every tracked file of the tree in the current directory (appends one line).
# Deterministic, POSIX sh + find + sed, so it runs inside a box of any tier.
export BENCH_MUTATE='find . -name .git -prune -o -type f -exec sed -i -e "\$a changed by bench" {} +'

add_row box-create \
    --title 'h5i box create vs git worktree add, $BENCH_FILES-file repository' \
    --setup '"$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" "$BENCH_FILES" >/dev/null' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'git worktree add --quiet -b bench-wt $ROW_DIR/wt' \
    --baseline-prepare 'git worktree remove --force "$ROW_DIR/wt" 2>/dev/null; git branch -q -D bench-wt 2>/dev/null; true' \
    --h5i '$H5I box create bench-create --isolation workspace' \
    --h5i-prepare '"$H5I" box rm --force bench-create >/dev/null 2>&1; true' \
    --check '
        ws="$(find .git/.h5i/env -maxdepth 3 -type d -path "*/bench-create/workspace" | head -n 1)"
        [ -n "$ws" ] || { echo "h5i box create made no box workspace"; exit 1; }
        n="$(git --git-dir="$ws/.git" --work-tree="$ws" ls-files | wc -l)"
        [ "$n" = "$BENCH_FILES" ] || { echo "the box workspace has $n tracked files, expected $BENCH_FILES"; exit 1; }
        [ -f "$ws/$(git ls-files | head -n 1)" ] || { echo "the box workspace is not checked out"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-create' \
    --target 'ratio:median <= 1.3'

add_row box-export \
    --title 'h5i box export of a change to all $BENCH_FILES files vs git diff --binary of the same change' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" "$BENCH_FILES" >/dev/null
        cd "$ROW_DIR/repo"
        git worktree add --quiet -b bench-base "$ROW_DIR/wt"
        (cd "$ROW_DIR/wt" && sh -c "$BENCH_MUTATE")
        mkdir -p "$ROW_DIR/git-out"
        "$H5I" box create bench-export --isolation workspace
        "$H5I" box run bench-export -- sh -c "$BENCH_MUTATE"' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'git -C $ROW_DIR/wt diff --binary --output=$ROW_DIR/git-out/patch.diff' \
    --h5i '$H5I box export bench-export --out $ROW_DIR/export --force' \
    --check '
        want="$(grep -c "^diff --git" "$ROW_DIR/git-out/patch.diff" || true)"
        got="$(grep -c "^diff --git" "$ROW_DIR/export/patch.diff" 2>/dev/null || true)"
        [ "$want" = "$BENCH_FILES" ] || { echo "baseline diff has $want files, expected $BENCH_FILES"; exit 1; }
        [ "$got" = "$want" ] || { echo "export/patch.diff has ${got:-no} file diffs, git diff has $want"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-export' \
    --target 'ratio:median <= 1.5'

add_row box-run-workspace \
    --title 'h5i box run NAME -- true at --isolation workspace vs bare true' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-run --isolation workspace' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'true' \
    --h5i '$H5I box run bench-run -- true' \
    --check '
        rc=0; "$H5I" box run bench-run -- sh -c "exit 7" || rc=$?
        [ "$rc" = 7 ] || { echo "h5i box run did not pass exit code 7 through (got $rc)"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-run' \
    --target 'added_ms:median < 5'

add_row box-run-process-vs-true \
    --title 'h5i box run NAME -- true at --isolation process vs bare true' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-proc --isolation process' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'true' \
    --h5i '$H5I box run bench-proc -- true' \
    --check '
        out="$("$H5I" box run bench-proc -- sh -c "grep CapEff /proc/self/status")"
        [ "$out" = "CapEff:	0000000000000000" ] || { echo "the process-tier run was not confined (got $out)"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-proc' \
    --target 'added_ms:median < 10'

add_row box-run-process-first-run \
    --title 'h5i box run NAME -- true at --isolation process, first run of a fresh box (it makes the box sandbox) vs a run with a container of its own (H5I_SANDBOX=off)' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-perrun --isolation process' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'env H5I_SANDBOX=off $H5I box run bench-perrun -- true' \
    --h5i '$H5I box run bench-first -- true' \
    --h5i-prepare '"$H5I" box rm --force bench-first >/dev/null 2>&1 || true; "$H5I" box create bench-first --isolation process >/dev/null' \
    --check '
        "$H5I" box status bench-first | grep -q "^sandbox: up" || { echo "the first run made no sandbox"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-first; "$H5I" box rm --force bench-perrun' \
    --target 'ratio:median <= 1.5'

add_row box-run-process-vs-bwrap \
    --title 'h5i box run NAME -- true at --isolation process vs bwrap --unshare-all true' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-proc --isolation process' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'bwrap --unshare-all --ro-bind / / true' \
    --h5i '$H5I box run bench-proc -- true' \
    --check '"$H5I" box run bench-proc -- true' \
    --teardown '"$H5I" box rm --force bench-proc' \
    --target 'added_ms:median < 10'

add_row box-run-process-vs-runc \
    --title 'h5i box run NAME -- true at --isolation process vs runc run of the same bundle' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-proc --isolation process
        "$H5I" box bundle bench-proc --out "$ROW_DIR/bundle" -- true >/dev/null' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'runc run --bundle $ROW_DIR/bundle bench-runc' \
    --h5i '$H5I box run bench-proc -- true' \
    --check '"$H5I" box run bench-proc -- true && runc run --bundle "$ROW_DIR/bundle" bench-runc-check' \
    --teardown '"$H5I" box rm --force bench-proc' \
    --target 'ratio:median <= 1.5'

add_row box-run-supervised-vs-true \
    --title 'h5i box run NAME -- true at --isolation supervised, warm box sandbox (own netns, deny-all nftables table kept while the pins match, counters read over netlink, socket gate, uplink kept) vs bare true' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-sup --isolation supervised' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'true' \
    --h5i '$H5I box run bench-sup -- true' \
    --check '
        out="$("$H5I" box run bench-sup -- sh -c "grep CapEff /proc/self/status")"
        [ "$out" = "CapEff:	0000000000000000" ] || { echo "the supervised run was not confined (got $out)"; exit 1; }
        "$H5I" box status bench-sup | grep -q "^sandbox: up" || { echo "the run did not use the box sandbox"; exit 1; }
        "$H5I" box status bench-sup | grep -q "egress table loaded" || { echo "no egress table was loaded"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-sup' \
    --target 'added_ms:median < 15'

add_row box-run-supervised-first-run \
    --title 'h5i box run NAME -- true at --isolation supervised, first run of a fresh box (it makes the box sandbox: netns, table, sentry, uplink) vs a run with a container and network of its own (H5I_SANDBOX=off)' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-sup-perrun --isolation supervised' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'env H5I_SANDBOX=off $H5I box run bench-sup-perrun -- true' \
    --h5i '$H5I box run bench-sup-first -- true' \
    --h5i-prepare '"$H5I" box rm --force bench-sup-first >/dev/null 2>&1 || true; "$H5I" box create bench-sup-first --isolation supervised >/dev/null' \
    --check '
        "$H5I" box status bench-sup-first | grep -q "^sandbox: up" || { echo "the first run made no sandbox"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-sup-first; "$H5I" box rm --force bench-sup-perrun' \
    --target 'ratio:median <= 1.5'

# The 100 MB rows' test host and box: as root (BULK_SETUP, box bench-bulk, its repository
# $ROW_DIR/repo) and as the unprivileged h5i-test user (BULK_USER_SETUP, box bench-bulk-u,
# $ROW_DIR/u/repo; make setup prepares the user). The uplink is a veth pair as root, pasta for
# the user (hooks/src/uplink.rs says why).
BULK_SETUP='
        "$ROOT/bench/testhost.sh" up 104857600
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        mkdir -p .h5i
        printf "[profile.bulk]\nisolation = \"supervised\"\n[profile.bulk.net]\negress = [\"198.19.250.2:8080\"]\n" > .h5i/env.toml
        git add -A && git commit -qm bench-policy
        "$H5I" box create bench-bulk --profile bulk'
BULK_USER_SETUP='
        "$ROOT/bench/testhost.sh" up 104857600
        # make setup delegates <own cgroup>/h5i to h5i-test for the session it ran in; again here.
        anchor="$(sed -n "s/^[0-9]*:memory:\///p" /proc/self/cgroup)"
        for root in /sys/fs/cgroup/*/; do
            [ -e "$root/cgroup.procs" ] && [ "$root" != /sys/fs/cgroup/unified/ ] || continue
            level="$root"
            for part in ${anchor//\// } h5i; do
                parent="$level"; level="$level/$part"; mkdir -p "$level"
                if [ -e "$level/cpuset.cpus" ] && [ -z "$(cat "$level/cpuset.cpus")" ]; then
                    cat "$parent/cpuset.cpus" > "$level/cpuset.cpus"; cat "$parent/cpuset.mems" > "$level/cpuset.mems"
                fi
            done
            chown h5i-test "$level"; for f in cgroup.procs tasks; do [ -e "$level/$f" ] && chown h5i-test "$level/$f"; done
        done
        install -d -o h5i-test -g h5i-test "$ROW_DIR/u" "$ROW_DIR/u/bin" "$ROW_DIR/u/home"
        for b in h5i h5i-runc h5i-hook; do install -m 755 "$(dirname "$H5I")/$b" "$ROW_DIR/u/bin/$b"; done
        mkdir -p "$ROW_DIR/u/repo/.h5i"
        printf "[profile.bulk]\nisolation = \"supervised\"\n[profile.bulk.net]\negress = [\"198.19.250.2:8080\"]\n" > "$ROW_DIR/u/repo/.h5i/env.toml"
        chown -R h5i-test:h5i-test "$ROW_DIR/u/repo"
        cd "$ROW_DIR/u/repo"
        as_user() { runuser -u h5i-test -- env HOME="$ROW_DIR/u/home" XDG_RUNTIME_DIR="$H5I_ENGINE_RUNDIR" "$@"; }
        as_user git init -q -b main . && as_user git add -A
        as_user git -c user.name=b -c user.email=b@x commit -qm bench-policy
        as_user "$ROW_DIR/u/bin/h5i" box create bench-bulk-u --profile bulk'

add_row box-supervised-100mb \
    --title '100 MB HTTP download from an allowed test host (198.19.250.2, own netns): curl in a supervised box as root (veth pair + host forwarding uplink, pinned nftables table; the h5i side includes the whole warm box run) vs the same curl on the host' \
    --shell bash \
    --setup "$BULK_SETUP" \
    --cwd '$ROW_DIR/repo' \
    --baseline 'curl -sS -o /dev/null http://198.19.250.2:8080/' \
    --h5i '$H5I box run bench-bulk -- curl -sS -o /dev/null http://198.19.250.2:8080/' \
    --check '
        n="$("$H5I" box run bench-bulk -- curl -sS -o /dev/null -w "%{size_download}" http://198.19.250.2:8080/)"
        [ "$n" = 104857600 ] || { echo "the box downloaded ${n:-nothing}, not 104857600 bytes"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-bulk; "$ROOT/bench/testhost.sh" down' \
    --target 'ratio:median <= 1.11'

# The same download as the unprivileged h5i-test user (make setup prepares it): the uplink is
# pasta (hooks/src/uplink.rs says why); both sides run through runuser.
add_row box-supervised-100mb-rootless \
    --title '100 MB HTTP download from the test host 198.19.250.2: curl in a supervised box run by the unprivileged h5i-test user (pasta uplink, pinned nftables table; the h5i side includes the whole warm box run) vs the same curl on the host as that user' \
    --shell bash \
    --setup "$BULK_USER_SETUP" \
    --cwd '$ROW_DIR/u/repo' \
    --baseline 'runuser -u h5i-test -- curl -sS -o /dev/null http://198.19.250.2:8080/' \
    --h5i 'runuser -u h5i-test -- env HOME=$ROW_DIR/u/home XDG_RUNTIME_DIR=$H5I_ENGINE_RUNDIR $ROW_DIR/u/bin/h5i box run bench-bulk-u -- curl -sS -o /dev/null http://198.19.250.2:8080/' \
    --check '
        n="$(runuser -u h5i-test -- env HOME="$ROW_DIR/u/home" XDG_RUNTIME_DIR="$H5I_ENGINE_RUNDIR" "$ROW_DIR/u/bin/h5i" box run bench-bulk-u -- curl -sS -o /dev/null -w "%{size_download}" http://198.19.250.2:8080/)"
        [ "$n" = 104857600 ] || { echo "the box downloaded ${n:-nothing}, not 104857600 bytes"; exit 1; }' \
    --teardown 'runuser -u h5i-test -- env HOME="$ROW_DIR/u/home" XDG_RUNTIME_DIR="$H5I_ENGINE_RUNDIR" "$ROW_DIR/u/bin/h5i" box rm --force bench-bulk-u; "$ROOT/bench/testhost.sh" down' \
    --target 'ratio:median <= 1.43'

# The same 100 MB transfers, their rate alone (the issue's target: >= 0.9x the host's rate as
# root, >= 0.7x rootless): curl's own time from the body's first byte to its last, inside the
# box and on the host, alternating (bench/transfer.py). The rows above time the whole run.
add_row box-supervised-100mb-rate \
    --kind transfer \
    --title 'Rate of a 100 MB HTTP download from the test host 198.19.250.2: curl in a warm supervised box as root (veth pair + host forwarding) vs the same curl on the host, each timed by curl (time_total - time_starttransfer)' \
    --setup "$BULK_SETUP" \
    --cwd '$ROW_DIR/repo' \
    --baseline 'curl -sS -o /dev/null -w "%{size_download} %{time_starttransfer} %{time_total}" http://198.19.250.2:8080/' \
    --h5i '$H5I box run bench-bulk -- curl -sS -o /dev/null -w "%{size_download} %{time_starttransfer} %{time_total}" http://198.19.250.2:8080/' \
    --teardown '"$H5I" box rm --force bench-bulk; "$ROOT/bench/testhost.sh" down' \
    --runs 30 \
    --target 'rate_ratio:median >= 0.9'

add_row box-supervised-100mb-rate-rootless \
    --kind transfer \
    --title 'Rate of a 100 MB HTTP download from the test host 198.19.250.2: curl in a warm supervised box run by the unprivileged h5i-test user (pasta uplink) vs the same curl on the host as that user, each timed by curl (time_total - time_starttransfer)' \
    --setup "$BULK_USER_SETUP" \
    --cwd '$ROW_DIR/u/repo' \
    --baseline 'runuser -u h5i-test -- curl -sS -o /dev/null -w "%{size_download} %{time_starttransfer} %{time_total}" http://198.19.250.2:8080/' \
    --h5i 'runuser -u h5i-test -- env HOME=$ROW_DIR/u/home XDG_RUNTIME_DIR=$H5I_ENGINE_RUNDIR $ROW_DIR/u/bin/h5i box run bench-bulk-u -- curl -sS -o /dev/null -w "%{size_download} %{time_starttransfer} %{time_total}" http://198.19.250.2:8080/' \
    --teardown 'runuser -u h5i-test -- env HOME="$ROW_DIR/u/home" XDG_RUNTIME_DIR="$H5I_ENGINE_RUNDIR" "$ROW_DIR/u/bin/h5i" box rm --force bench-bulk-u; "$ROOT/bench/testhost.sh" down' \
    --note 'Why the box can read faster than the host here: pasta gives the box a tap device with a 65520-byte MTU, so the box'"'"'s curl receives 64 KiB segments, while the host'"'"'s curl receives the test host'"'"'s 1500-byte ones over its veth (pasta reads those into its own large socket buffer). Measured by hand on a quiet host (2026-12-06, 22 alternating pairs): the host'"'"'s own curl over that veth took a median 54.0 ms at MTU 1500 and 26.7 ms with the veth at 65520. The baseline is the path the user'"'"'s own download takes; the ratio says the uplink does not slow a box down, not that it beats the kernel.' \
    --runs 30 \
    --target 'rate_ratio:median >= 0.7'

add_row podman-h5i-runc-vs-runc \
    --title 'podman run --rm with --runtime h5i-runc vs --runtime runc (rootful, busybox image)' \
    --setup '"$ROOT/scripts/make-test-image.sh" --root >/dev/null' \
    --baseline 'podman run --rm --network none --cgroup-parent $H5I_BENCH_CGROUP --runtime runc localhost/h5i-busybox:latest true' \
    --h5i 'podman run --rm --network none --cgroup-parent $H5I_BENCH_CGROUP --runtime $H5I_RUNC localhost/h5i-busybox:latest true' \
    --check 'podman run --rm --network none --cgroup-parent "$H5I_BENCH_CGROUP" --runtime "$H5I_RUNC" localhost/h5i-busybox:latest true' \
    --target 'ratio:median <= 1.0'

# The container tier as root: h5i runs rootless Podman as the engine user of
# /etc/h5i/container.toml (make setup: h5i-test); the baseline is that user's own plain
# `podman run` of the same image with the same confinement flags (src/container/podman_args.rs)
# (--init too: a box runs its command under catatonit) and a workspace bind, on Podman's
# default runtime. h5i adds on top: h5i-runc (sealed re-exec, keep-id maps, spec capture), the cage, the loopback hook, the per-run directory and, as root,
# the idmapped attachments in the engine's mount namespace.
add_row box-run-container-vs-podman \
    --title 'h5i box run NAME -- true at --isolation container (rootless Podman as h5i-test) vs that user'"'"'s plain podman run --rm with the same flags and image' \
    --setup '
        "$ROOT/scripts/make-test-image.sh" --user >/dev/null
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        install -d -o h5i-test -g h5i-test "$ROW_DIR/work"
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-ctr --isolation container --image localhost/h5i-busybox:latest' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'setpriv --reuid=h5i-test --regid=h5i-test --clear-groups env -i HOME=/home/h5i-test XDG_RUNTIME_DIR=$H5I_ENGINE_RUNDIR PATH=/usr/bin:/bin podman run --rm --init --pull=never --network none --read-only --read-only-tmpfs=false --tmpfs /tmp:rw,size=1024m,nosuid,nodev,notmpcopyup --cap-drop=ALL --security-opt no-new-privileges --ipc private --userns=keep-id --user=$H5I_ENGINE_IDS -v $ROW_DIR/work:/work:rw -w /work localhost/h5i-busybox:latest true' \
    --h5i '$H5I box run bench-ctr -- true' \
    --check '
        out="$("$H5I" box run bench-ctr -- sh -c "grep CapEff /proc/self/status; touch /etc/x 2>&1; true")"
        case "$out" in *"CapEff:	0000000000000000"*"Read-only file system"*) ;; *) echo "the container run was not confined (got $out)"; exit 1;; esac
        "$H5I" box status bench-ctr | grep -q "matches the policy: yes" || { echo "status evidence does not match the policy"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-ctr' \
    --target 'ratio:median <= 1.1'

add_row box-run-container-vs-podman-h5i-runc \
    --title 'h5i box run NAME -- true at --isolation container vs the engine user'"'"'s podman run --rm with the same flags, image, runtime (h5i-runc) and a delegated cgroup parent: what h5i itself adds' \
    --setup '
        "$ROOT/scripts/make-test-image.sh" --user >/dev/null
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        install -d -o h5i-test -g h5i-test "$ROW_DIR/work"
        install -m 755 "$H5I_RUNC" "$ROW_DIR/h5i-runc"
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-ctr --isolation container --image localhost/h5i-busybox:latest' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'setpriv --reuid=h5i-test --regid=h5i-test --clear-groups env -i HOME=/home/h5i-test XDG_RUNTIME_DIR=$H5I_ENGINE_RUNDIR PATH=/usr/bin:/bin podman --runtime $ROW_DIR/h5i-runc run --cgroup-parent $H5I_BENCH_CGROUP_ROOT --cgroups=no-conmon --rm --init --pull=never --network none --read-only --read-only-tmpfs=false --tmpfs /tmp:rw,size=1024m,nosuid,nodev,notmpcopyup --cap-drop=ALL --security-opt no-new-privileges --ipc private --userns=keep-id --user=$H5I_ENGINE_IDS -v $ROW_DIR/work:/work:rw -w /work localhost/h5i-busybox:latest true' \
    --h5i '$H5I box run bench-ctr -- true' \
    --check '"$H5I" box run bench-ctr -- true' \
    --teardown '"$H5I" box rm --force bench-ctr' \
    --target 'ratio:median <= 1.1'

add_row shell-pty-echo \
    --title 'keystroke echo: 1,000 single bytes typed one at a time through h5i box shell (workspace tier, the box on its own pty) vs on a plain pty (bench/pty_echo.py; p50/p99 per keystroke on its stderr)' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-shell --isolation workspace' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'python3 $ROOT/bench/pty_echo.py --count 1000' \
    --h5i 'python3 $ROOT/bench/pty_echo.py --count 1000 -- $H5I box shell bench-shell --' \
    --check '
        python3 "$ROOT/bench/pty_echo.py" --count 10 -- "$H5I" box shell bench-shell -- || exit 1
        n="$("$H5I" box log bench-shell | grep -cE "^[^ ]+ +shell ")"
        [ "$n" -ge 1 ] || { echo "no box shell session was recorded for bench-shell"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-shell' \
    --target 'added_ms:median < 150'

add_row shell-pty-echo-process \
    --title 'keystroke echo: 1,000 single bytes typed one at a time through h5i box shell at --isolation process (a session in the box sandbox, on a pty its process opened inside the box) vs on a plain pty (bench/pty_echo.py)' \
    --setup '
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-shell-proc --isolation process' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'python3 $ROOT/bench/pty_echo.py --count 1000' \
    --h5i 'python3 $ROOT/bench/pty_echo.py --count 1000 -- $H5I box shell bench-shell-proc --' \
    --check '
        python3 "$ROOT/bench/pty_echo.py" --count 10 -- "$H5I" box shell bench-shell-proc -- || exit 1
        n="$("$H5I" box log bench-shell-proc | grep -cE "^[^ ]+ +shell ")"
        [ "$n" -ge 1 ] || { echo "no box shell session was recorded for bench-shell-proc"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-shell-proc' \
    --target 'added_ms:median < 150'

# The 300-package project, its cache refreshed, and the cold (stale key) and warm boxes: shared by
# the two warm-vs-cold rows. The refresh is told the registry the way a host names its npm
# mirror (NPM_CONFIG_REGISTRY): its cache-npm profile may grant no other host.
NPM_WARM_COLD_SETUP='
        mkdir -p "$ROW_DIR/reg" "$ROW_DIR/repo"
        cd "$ROW_DIR/repo"
        git init -q -b main && git config user.name bench && git config user.email bench@example.invalid
        python3 "$ROOT/bench/npm_fixture.py" "$ROW_DIR/reg" . 300 20000 http://198.19.251.2:8080
        mkdir -p .h5i
        printf "[profile.cache-npm]\nisolation = \"supervised\"\n[profile.cache-npm.net]\negress = [\"198.19.251.2:8080\"]\n[profile.dev]\nisolation = \"supervised\"\n[profile.dev.net]\negress = [\"198.19.251.2:8080\"]\n" > .h5i/env.toml
        git add -A && git commit -qm bench-npm
        "$ROOT/bench/npm_registry.sh" up "$ROW_DIR/reg"
        NPM_CONFIG_REGISTRY=http://198.19.251.2:8080/ "$H5I" box cache refresh npm
        "$H5I" box create bench-cold --profile dev
        echo >> "$(ls -d .git/.h5i/env/*/bench-cold/workspace)/package-lock.json"
        "$H5I" box create bench-warm --profile dev'

# Warm vs cold dependency install (issue 18: warm <= 20 s and >= 5x faster than cold). Both
# boxes run at the supervised tier with the same egress; the cold one's lockfile gained a
# trailing newline, written from the host before its first run (a first run with the key
# current would make the kept tree its node_modules for good, a mount point `rm -rf` cannot
# remove), so its key differs and the cache is stale for it (never mounted): it
# fetches every tarball from the stand-in and npm ci builds node_modules, while the warm one's
# node_modules is the built tree the refresh kept, overlaid read-only beneath an upper layer of
# the box's own (no copy), and npm, offline and saving nothing, finds it up to date. Each warm
# run is a fresh box's first (the prepare step, not timed, removes and re-creates the box), so
# its time includes starting the box's sandbox, which the cold box's later runs reuse.
add_row box-cache-npm-warm-vs-cold \
    --title 'installing a 300-package npm project (about 20 KB per tarball, static registry stand-in on test host 198.19.251.2, own netns) in a supervised box: cold (npm ci, no cache, every tarball fetched) vs warm (a fresh box whose node_modules is the built tree the refresh kept, overlaid read-only beneath the box'"'"'s own upper layer, then npm install --offline --no-save)' \
    --shell bash \
    --setup "$NPM_WARM_COLD_SETUP" \
    --cwd '$ROW_DIR/repo' \
    --baseline '$H5I box run bench-cold -- sh -c "rm -rf node_modules \$HOME/.npm && npm ci --no-audit --no-fund >/dev/null"' \
    --h5i '$H5I box run bench-warm -- sh -c "npm install --offline --no-save --no-audit --no-fund >/dev/null"' \
    --h5i-prepare '"$H5I" box rm --force bench-warm >/dev/null && "$H5I" box create bench-warm --profile dev >/dev/null' \
    --check '
        "$H5I" box cache mounts bench-warm | grep -q "and overlaid at /work/node_modules" || { echo "the warm box got no overlaid tree"; exit 1; }
        "$H5I" box cache mounts bench-cold | grep -q "(stale)" || { echo "the cold box is not stale"; exit 1; }
        for b in bench-cold bench-warm; do
            n="$("$H5I" box run "$b" -- sh -c "ls node_modules | wc -l")"
            [ "$n" = 300 ] || { echo "$b installed ${n:-no} packages, not 300"; exit 1; }
        done
        rec="$(grep "\"host-env-run\"" .git/.h5i/env/*/bench-warm/receipts.jsonl | grep "npm install --offline" | tail -n 1)"
        echo "$rec" | python3 -c "import json,sys; r=json.load(sys.stdin); a=sum(r[\"egress\"][\"allowed\"].values())+sum(r[\"egress\"][\"denied\"].values()); sys.exit(1 if a else 0)" \
            || { echo "the warm install reached the network: $rec"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-cold; "$H5I" box rm --force bench-warm; "$ROOT/bench/npm_registry.sh" down' \
    --runs 5 \
    --target 'ratio:median <= 0.2'

# The same 300-package project locked for pnpm or Yarn 1 (bench/npm_fixture.py's last argument),
# its cache refreshed, a cold box (its lockfile gained a trailing newline before its first run,
# written from the host: stale key, nothing mounted, not even the kept tree as its node_modules,
# which a run with the key current would have made its own) and a warm one. $1: pnpm or yarn,
# $2: its lockfile.
node_warm_cold_setup() {
    printf '%s' '
        mkdir -p "$ROW_DIR/reg" "$ROW_DIR/repo"
        cd "$ROW_DIR/repo"
        git init -q -b main && git config user.name bench && git config user.email bench@example.invalid
        python3 "$ROOT/bench/npm_fixture.py" "$ROW_DIR/reg" . 300 20000 http://198.19.251.2:8080 '"$1"'
        mkdir -p .h5i
        printf "[profile.cache-'"$1"']\nisolation = \"supervised\"\n[profile.cache-'"$1"'.net]\negress = [\"198.19.251.2:8080\"]\n[profile.dev]\nisolation = \"supervised\"\n[profile.dev.net]\negress = [\"198.19.251.2:8080\"]\n" > .h5i/env.toml
        git add -A && git commit -qm bench-'"$1"'
        "$ROOT/bench/npm_registry.sh" up "$ROW_DIR/reg"
        NPM_CONFIG_REGISTRY=http://198.19.251.2:8080/ "$H5I" box cache refresh '"$1"'
        "$H5I" box create bench-cold --profile dev
        echo >> "$(ls -d .git/.h5i/env/*/bench-cold/workspace)/'"$2"'"
        "$H5I" box create bench-warm --profile dev'
}

# The check both rows share: the warm box's node_modules the kept tree (overlaid), 300 packages
# installed in each box, the cold box stale, and the warm install's receipt (the latest run with
# --offline) with no connection at all.
NODE_WARM_COLD_CHECK='
        "$H5I" box cache mounts bench-warm | grep -q "and overlaid at /work/node_modules" || { echo "the warm box got no overlaid tree"; exit 1; }
        "$H5I" box cache mounts bench-cold | grep -q "(stale)" || { echo "the cold box is not stale"; exit 1; }
        for b in bench-cold bench-warm; do
            n="$("$H5I" box run "$b" -- sh -c "ls node_modules | grep -c ^h5i-fixture-")"
            [ "$n" = 300 ] || { echo "$b installed ${n:-no} packages, not 300"; exit 1; }
        done
        rec="$(grep "\"host-env-run\"" .git/.h5i/env/*/bench-warm/receipts.jsonl | grep -- "--offline" | tail -n 1)"
        [ -n "$rec" ] || { echo "no receipt of the warm install"; exit 1; }
        echo "$rec" | python3 -c "import json,sys; r=json.load(sys.stdin); a=sum(r[\"egress\"][\"allowed\"].values())+sum(r[\"egress\"][\"denied\"].values()); sys.exit(1 if a else 0)" \
            || { echo "the warm install reached the network: $rec"; exit 1; }'

# pnpm, cold vs warm, as the npm row: both boxes supervised with the same egress; cold fetches
# every tarball into a store in the box's home (removed before each run, with node_modules) and
# links node_modules; warm is a fresh box (made again before each run, not timed) whose
# node_modules is the tree the refresh kept (its .pnpm virtual store with it), overlaid
# read-only beneath the box's own upper layer, which pnpm, offline, finds up to date.
add_row box-cache-pnpm-warm-vs-cold \
    --title 'installing the 300-package project locked for pnpm (pnpm-lock.yaml, the same stand-in) in a supervised box: cold (pnpm install --frozen-lockfile, an empty store, every tarball fetched) vs warm (a fresh box whose node_modules is the tree the refresh kept, overlaid read-only beneath the box'"'"'s own upper layer, then pnpm install --frozen-lockfile --offline)' \
    --shell bash \
    --setup "$(node_warm_cold_setup pnpm pnpm-lock.yaml)" \
    --cwd '$ROW_DIR/repo' \
    --baseline '$H5I box run bench-cold -- sh -c "rm -rf node_modules \$HOME/.pnpm-store && pnpm install --frozen-lockfile --store-dir \$HOME/.pnpm-store >/dev/null"' \
    --h5i '$H5I box run bench-warm -- sh -c "pnpm install --frozen-lockfile --offline >/dev/null"' \
    --h5i-prepare '"$H5I" box rm --force bench-warm >/dev/null && "$H5I" box create bench-warm --profile dev >/dev/null' \
    --check "$NODE_WARM_COLD_CHECK" \
    --teardown '"$H5I" box rm --force bench-cold; "$H5I" box rm --force bench-warm; "$ROOT/bench/npm_registry.sh" down' \
    --runs 5 \
    --target 'ratio:median <= 0.2'

# Yarn 1, cold vs warm, the same way: cold fetches every tarball into a cache folder in the box's
# home (removed before each run, with node_modules); warm is a fresh box whose node_modules is the
# tree the refresh kept, which yarn, offline and with --ignore-scripts (the flag the refresh built
# it with, recorded in its .yarn-integrity), finds up to date.
add_row box-cache-yarn-warm-vs-cold \
    --title 'installing the 300-package project locked for Yarn 1 (yarn.lock, the same stand-in) in a supervised box: cold (yarn install --frozen-lockfile, an empty cache folder, every tarball fetched) vs warm (a fresh box whose node_modules is the tree the refresh kept, overlaid read-only beneath the box'"'"'s own upper layer, then yarn install --frozen-lockfile --offline --ignore-scripts)' \
    --shell bash \
    --setup "$(node_warm_cold_setup yarn yarn.lock)" \
    --cwd '$ROW_DIR/repo' \
    --baseline '$H5I box run bench-cold -- sh -c "rm -rf node_modules \$HOME/.yarn-cache && YARN_CACHE_FOLDER=\$HOME/.yarn-cache yarn install --frozen-lockfile --non-interactive >/dev/null"' \
    --h5i '$H5I box run bench-warm -- sh -c "yarn install --frozen-lockfile --offline --ignore-scripts --non-interactive >/dev/null"' \
    --h5i-prepare '"$H5I" box rm --force bench-warm >/dev/null && "$H5I" box create bench-warm --profile dev >/dev/null' \
    --check "$NODE_WARM_COLD_CHECK" \
    --teardown '"$H5I" box rm --force bench-cold; "$H5I" box rm --force bench-warm; "$ROOT/bench/npm_registry.sh" down' \
    --runs 5 \
    --target 'ratio:median <= 0.2'

# Where the warm install spends its time: the same warm `npm ci` in the box (the cache mounted
# read-only by h5i) and on the host (the same cache directory, bind-mounted read-only in a
# private mount namespace, the same npm variables). The difference is h5i's share. `npm ci`
# empties node_modules itself, entry by entry (the box's is the kept tree's overlay, a mount
# point it cannot remove).
add_row box-cache-npm-warm-box-vs-host \
    --title 'warm npm ci of the 300-package project: in a supervised box with the cache mounted read-only vs on the host with the same cache read-only' \
    --shell bash \
    --setup '
        mkdir -p "$ROW_DIR/reg" "$ROW_DIR/repo" "$ROW_DIR/host"
        cd "$ROW_DIR/repo"
        git init -q -b main && git config user.name bench && git config user.email bench@example.invalid
        python3 "$ROOT/bench/npm_fixture.py" "$ROW_DIR/reg" . 300 20000 http://198.19.251.2:8080
        cp package.json package-lock.json "$ROW_DIR/host/"
        mkdir -p .h5i
        printf "[profile.cache-npm]\nisolation = \"supervised\"\n[profile.cache-npm.net]\negress = [\"198.19.251.2:8080\"]\n[profile.dev]\nisolation = \"supervised\"\n[profile.dev.net]\negress = [\"198.19.251.2:8080\"]\n" > .h5i/env.toml
        git add -A && git commit -qm bench-npm
        "$ROOT/bench/npm_registry.sh" up "$ROW_DIR/reg"
        NPM_CONFIG_REGISTRY=http://198.19.251.2:8080/ "$H5I" box cache refresh npm
        "$ROOT/bench/npm_registry.sh" down
        ln -s "$(ls -d "$ROW_DIR"/repo/.git/.h5i/cache/npm/*/data)" "$ROW_DIR/cache"
        "$H5I" box create bench-warm --profile dev' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'unshare -m sh -c "d=\$(readlink -f $ROW_DIR/cache) && mount --bind \$d \$d && mount -o remount,ro,bind \$d && cd $ROW_DIR/host && npm_config_cache=\$d npm_config_prefer_offline=true npm_config_logs_dir=/tmp/.npm-logs npm_config_update_notifier=false npm ci --no-audit --no-fund >/dev/null"' \
    --h5i '$H5I box run bench-warm -- sh -c "npm ci --no-audit --no-fund >/dev/null"' \
    --check '
        n="$("$H5I" box run bench-warm -- sh -c "ls node_modules | wc -l")"
        [ "$n" = 300 ] || { echo "the box installed ${n:-no} packages, not 300"; exit 1; }
        [ "$(ls "$ROW_DIR/host/node_modules" | wc -l)" = 300 ] || { echo "the host install is not complete"; exit 1; }' \
    --teardown '"$H5I" box rm --force bench-warm' \
    --runs 5 \
    --target 'ratio:median <= 1.1'

# Browser cold start to first snapshot (issue 16): bench/browser-first-snapshot.sh serves the
# demo app (examples/browser-demo/) on the box's own loopback, `agent-browser open` starts the
# daemon and Debian's Chromium, and the first `snapshot -i` must show the sign-up button. The
# baseline is the same script on the host with the variables a browser box's runs get
# (src/browser/mod.rs). Each run is a cold start: the script closes the browser, and a box's
# run ends its daemon with it.
# At the process and supervised tiers as root the box's browser is its sidecar (src/browser/sidecar.rs): the
# run reaches it through h5i's relay and the fence, and each run's `close` makes the next one
# launch Chromium afresh in the sidecar. At the container tier the box runs the browser image
# (`make images`: localhost/h5i-browser) as the engine user.
BROWSER_HOST_ENV='env HOME=$ROW_DIR/home AGENT_BROWSER_EXECUTABLE_PATH=/usr/bin/chromium AGENT_BROWSER_ARGS=--no-sandbox,--no-startup-window AGENT_BROWSER_ALLOWED_DOMAINS=localhost,127.0.0.1 AGENT_BROWSER_NO_VERSION_CHECK=1'
for tier in process supervised container; do
    image=""
    [ "$tier" = container ] && image='[profile.web.container]\nimage = \"localhost/h5i-browser:latest\"\n'
    add_row "browser-first-snapshot-$tier" \
        --title "browser cold start to first snapshot: agent-browser open + snapshot -i of the demo app served on the box's loopback, in a --isolation $tier browser box vs the same on the host" \
        --setup '
            mkdir -p "$ROW_DIR/home" "$ROW_DIR/repo"
            cd "$ROW_DIR/repo"
            git init -q -b main && git config user.name bench && git config user.email bench@example.invalid
            cp -r "$ROOT/examples/browser-demo" app && cp "$ROOT/bench/browser-first-snapshot.sh" .
            mkdir -p .h5i
            printf "[profile.web]\nisolation = \"'"$tier"'\"\n'"$image"'[profile.web.fs]\nwrite = [\"~/.agent-browser\"]\n[profile.web.net]\nunix = true\n" > .h5i/env.toml
            git add -A && git commit -qm bench-browser
            "$H5I" box create bench-web --profile web' \
        --cwd '$ROW_DIR/repo' \
        --baseline "$BROWSER_HOST_ENV"' sh $ROOT/bench/browser-first-snapshot.sh $ROOT/examples/browser-demo 3917' \
        --h5i '$H5I box run bench-web -- sh browser-first-snapshot.sh app 3000' \
        --check '
            "$H5I" box status bench-web | grep -q "'"tier       $tier"'" || { echo "bench-web is not at the '"$tier"' tier"; exit 1; }' \
        --teardown '"$H5I" box rm --force bench-web' \
        --runs 10 \
        --warmup 1 \
        --target 'ratio:median <= 1.5'
done

# Frame latency of the human's viewers of a box's browser (issue 17): a process-tier browser box
# (root: its browser is the box-lifetime sidecar) shows a page that paints its body black or
# white by the wall clock, turning at every 500 ms boundary; bench/view-latency.py connects a
# viewer, waits for its first frame and then for the next boundary (the baseline), or, after
# that boundary, for the first frame that shows the change (h5i; decoded and checked to be the
# new colour): the added time is page change to changed frame, on the viewer's side, and each
# h5i run also prints it measured alone. The browser viewer is served once for the row (its
# URL read from its stdout); the terminal viewer runs per invocation on a pty whose terminal
# answers as kitty does. No input is sent: the page changes by itself.
VIEW_SETUP='
    mkdir -p "$ROW_DIR/repo/app" "$ROW_DIR/repo/.h5i" && cd "$ROW_DIR/repo"
    git init -q -b main && git config user.name bench && git config user.email bench@example.invalid
    cat >app/index.html <<"PAGE"
<!doctype html><title>bench</title><body style="margin:0;height:100vh;background:#fff"><script>
function turn() { var n = Date.now(); document.body.style.background = Math.floor(n / 500) % 2 ? "#000" : "#fff"; setTimeout(turn, 500 - n % 500); }
turn();
</script></body>
PAGE
    printf "[profile.web]\nisolation = \"process\"\n[profile.web.fs]\nwrite = [\"~/.agent-browser\"]\n[profile.web.net]\nunix = true\n[service.demo]\ncommand = \"exec python3 -m http.server 3000 --bind 127.0.0.1 --directory /work/app\"\nport = 3000\n" >.h5i/env.toml
    git add -A && git commit -qm bench-view
    "$H5I" box create bench-view --profile web >/dev/null
    "$H5I" box service start bench-view demo >/dev/null
    "$H5I" box run bench-view -- agent-browser open http://127.0.0.1:3000/ >/dev/null'
add_row view-frame-browser \
    --title 'h5i box view (browser viewer): connect, first frame, page change, changed frame vs connect, first frame, page change' \
    --setup "$VIEW_SETUP"'
    "$H5I" box view bench-view --port 0 >"$ROW_DIR/url" 2>/dev/null &
    echo $! >"$ROW_DIR/pid"
    for _ in $(seq 200); do [ -s "$ROW_DIR/url" ] && break; sleep 0.05; done' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'python3 $ROOT/bench/view-latency.py browser $ROW_DIR/url' \
    --h5i 'python3 $ROOT/bench/view-latency.py browser $ROW_DIR/url --change' \
    --check 'python3 "$ROOT/bench/view-latency.py" browser "$ROW_DIR/url" --change | grep -q "^latency_ms "' \
    --teardown 'kill "$(cat "$ROW_DIR/pid")"; "$H5I" box rm --force bench-view' \
    --runs 20 \
    --warmup 2 \
    --target 'added_ms:median < 250'
add_row view-frame-term \
    --title 'h5i box view --term (Kitty graphics on a pty): first image, page change, changed image vs first image, page change' \
    --setup "$VIEW_SETUP" \
    --cwd '$ROW_DIR/repo' \
    --baseline 'python3 $ROOT/bench/view-latency.py term $H5I bench-view' \
    --h5i 'python3 $ROOT/bench/view-latency.py term $H5I bench-view --change' \
    --check 'python3 "$ROOT/bench/view-latency.py" term "$H5I" bench-view --change | grep -q "^latency_ms "' \
    --teardown '"$H5I" box rm --force bench-view' \
    --runs 10 \
    --warmup 1 \
    --target 'added_ms:median < 400'

# The microvm tier's QEMU backend (src/microvm): a box is a VM with its own kernel, booted at
# the box's first run and kept up. On a host whose KVM cannot run a stock kernel (this kind of
# host: PVM) the guest is software-emulated (TCG); `h5i box probe` says which. The warm row is a
# no-op run in a VM that is already up (a session with the guest agent over virtio-serial)
# against the same no-op run at the process tier (a fresh container per run), measured beside
# it; the boot row is the first command of a box whose VM is down (QEMU killed between runs; the
# image-to-root conversion is already done), against the warm run measured beside it.
microvm_note='Accelerator: '"$(
    if [ -e /sys/module/kvm_pvm ]; then
        echo 'software-emulated (TCG). KVM figures: not measurable on this host: /dev/kvm is a PVM device (kvm_pvm) that cannot run a stock guest.'
    else
        echo 'as `h5i box probe` names it (KVM where the host runs a stock guest, else TCG).'
    fi
)"' Load average at the start: '"$(cut -d' ' -f1 /proc/loadavg)"' on '"$(nproc)"' CPUs.'
microvm_setup='
        "$ROOT/scripts/make-test-image.sh" --user >/dev/null
        "$ROOT/scripts/gen-bench-repo.sh" "$ROW_DIR/repo" 100 >/dev/null
        cd "$ROW_DIR/repo"
        "$H5I" box create bench-vm --isolation microvm --image localhost/h5i-busybox:latest
        "$H5I" box create bench-proc --isolation process
        "$H5I" box run bench-proc -- true
        "$H5I" box run bench-vm -- true'
microvm_teardown='"$H5I" box rm --force bench-vm; "$H5I" box rm --force bench-proc'
microvm_qemu_pid='"$H5I" box status bench-vm | sed -n "s/^microvm: VM up (QEMU pid \([0-9]*\).*/\1/p"'
add_row box-run-microvm-warm \
    --title 'h5i box run NAME -- true at --isolation microvm (QEMU -M microvm, warm VM) vs the same run at --isolation process' \
    --note "$microvm_note" \
    --setup "$microvm_setup" \
    --cwd '$ROW_DIR/repo' \
    --baseline '$H5I box run bench-proc -- true' \
    --h5i '$H5I box run bench-vm -- true' \
    --check '
        out="$("$H5I" box run bench-vm -- uname -r)"
        [ "$out" != "$(uname -r)" ] || { echo "the run did not reach a guest kernel (got $out)"; exit 1; }
        "$H5I" box status bench-vm | grep -q "^microvm: VM up" || { echo "no VM up after the runs"; exit 1; }' \
    --teardown "$microvm_teardown" \
    --runs 10 \
    --target 'added_ms:median < 500'

add_row box-run-microvm-boot \
    --title 'h5i box run NAME -- true at --isolation microvm with the VM down (boot to first command) vs the same run on the warm VM' \
    --note "$microvm_note" \
    --setup "$microvm_setup" \
    --cwd '$ROW_DIR/repo' \
    --baseline '$H5I box run bench-vm -- true' \
    --baseline-prepare '"$H5I" box run bench-vm -- true >/dev/null' \
    --h5i '$H5I box run bench-vm -- true' \
    --h5i-prepare 'pid=$('"$microvm_qemu_pid"'); [ -z "$pid" ] || { kill -9 "$pid"; for _ in $(seq 200); do [ -e /proc/$pid ] && [ "$(cut -d" " -f3 /proc/$pid/stat 2>/dev/null)" != Z ] || break; sleep 0.05; done; }' \
    --check '
        "$H5I" box status bench-vm | grep -q "^microvm: VM up" || { echo "no VM up after the boot run"; exit 1; }' \
    --teardown "$microvm_teardown" \
    --runs 3 \
    --warmup 0 \
    --target 'added_ms:median < 30000'

# The console (h5i ui, src/ui): the fleet document the page draws first, for 50 boxes with one
# receipt each, over HTTP on loopback with the session cookie, against the same client fetching
# the page's own script from the same server (no store read): the difference is what the 50-box
# fleet costs the console. Both sides are curl, whose own start (about 28 ms here, even for a
# refused connect) would otherwise be the figure. The console is started once in setup (its URL,
# token included, read from its stdout) and the token traded for the cookie.
add_row ui-fleet-50 \
    --title 'h5i ui: GET api/fleet with 50 boxes (first document the page draws) vs GET of the page script, same server and client' \
    --setup '
        mkdir -p "$ROW_DIR/repo" && cd "$ROW_DIR/repo"
        git init -q -b main && git config user.name bench && git config user.email bench@example.invalid
        git commit -q --allow-empty -m bench-ui
        for i in $(seq 1 50); do
            "$H5I" box create "b$i" --isolation workspace >/dev/null && "$H5I" box run "b$i" -- true
        done
        "$H5I" ui --port 0 >"$ROW_DIR/url" 2>/dev/null &
        echo $! >"$ROW_DIR/pid"
        for _ in $(seq 200); do [ -s "$ROW_DIR/url" ] && break; sleep 0.05; done
        url="$(head -1 "$ROW_DIR/url")"
        curl -s -o /dev/null -D "$ROW_DIR/login" "$url"
        path="$(sed -n "s/^location: *//Ip" "$ROW_DIR/login" | tr -d "\r")"
        cookie="$(sed -n "s/^set-cookie: *\([^;]*\).*/\1/Ip" "$ROW_DIR/login")"
        for doc in api/fleet app.js; do
            printf "url = \"%s%s%s\"\ncookie = \"%s\"\n" "${url%%/?token=*}" "$path" "$doc" "$cookie" >"$ROW_DIR/${doc##*/}.curl"
        done' \
    --cwd '$ROW_DIR/repo' \
    --baseline 'curl -sf -o /dev/null -K $ROW_DIR/app.js.curl' \
    --h5i 'curl -sf -o /dev/null -K $ROW_DIR/fleet.curl' \
    --check '
        curl -sf -K "$ROW_DIR/fleet.curl" | python3 -c "import json, sys; d = json.load(sys.stdin); assert len(d[\"boxes\"]) == 50, d"' \
    --teardown 'kill "$(cat "$ROW_DIR/pid")"' \
    --target 'added_ms:median < 10'
