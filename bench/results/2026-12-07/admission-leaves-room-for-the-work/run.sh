#!/usr/bin/env bash
# Before and after: admission sheds a queued request once its deadline
# leaves less than the time admitted work has lately taken. The metastable
# profile co-located (BENCHMARKS.md's command, the default client), each
# backend in pairs, the two builds alternating. Run from the repository's
# root with the bench and the "after" service in CARGO_TARGET_DIR and the
# "before" service at SERVER_BEFORE:
#   CARGO_TARGET_DIR=... SERVER_BEFORE=... bench/results/2026-12-07/admission-leaves-room-for-the-work/run.sh KIND...
set -euo pipefail
out=$(cd "$(dirname "$0")" && pwd)
bench="$CARGO_TARGET_DIR/release/idem-bench"
after="$CARGO_TARGET_DIR/release/server"
pairs=${PAIRS:-2}
wait_for_quiet() { while awk '{exit !($1 >= 1.0)}' /proc/loadavg; do sleep 5; done; }
run() {
    local name=$1 server=$2
    shift 2
    wait_for_quiet
    echo "$(date -u +%T) load before $(cut -d' ' -f1-3 /proc/loadavg): IDEM_SERVER_BIN=$server idem-bench http $* --profile metastable --warmup-s 3 --seed 7303" >> "$out/commands.txt"
    IDEM_SERVER_BIN="$server" "$bench" http "$@" --profile metastable --warmup-s 3 --seed 7303 \
        --json "$out/$name.json" --chart "$out/$name.svg" > "$out/$name.txt" 2>&1 || true
}
for kind in "$@"; do
    for pair in $(seq 1 "$pairs"); do
        run "$kind-co-located-before-$pair" "$SERVER_BEFORE" --store-kind "$kind" --rate 2000
        run "$kind-co-located-after-$pair" "$after" --store-kind "$kind" --rate 2000
    done
done
