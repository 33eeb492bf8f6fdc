#!/usr/bin/env bash
# The metastable profile with idem-bench's default client (standard), both
# placements, embedded, Redis and PostgreSQL, as BENCHMARKS.md's commands
# give it. Run from the repository's root with CARGO_TARGET_DIR set to the
# `foundationdb` build of server and bench (scripts/bench-quiet's):
#   CARGO_TARGET_DIR=... bench/results/2026-12-07/metastable-with-the-default-client/run.sh
set -euo pipefail
out=$(cd "$(dirname "$0")" && pwd)
bench="$CARGO_TARGET_DIR/release/idem-bench"
# shellcheck source=scripts/foundationdb.sh
source scripts/foundationdb.sh
find_distribution > /dev/null
use_client_library
wait_for_quiet() { while awk '{exit !($1 >= 1.0)}' /proc/loadavg; do sleep 5; done; }
run() {
    local name=$1
    shift
    wait_for_quiet
    echo "$(date -u +%T) load before $(cut -d' ' -f1-3 /proc/loadavg): idem-bench http $* --profile metastable --warmup-s 3 --seed 7303" >> "$out/commands.txt"
    "$bench" http "$@" --profile metastable --warmup-s 3 --seed 7303 \
        --json "$out/$name.json" --chart "$out/$name.svg" > "$out/$name.txt" 2>&1 || true
}
for kind in embedded redis postgres; do
    run "metastable-$kind-split" --store-kind "$kind" --split-cpus --rate 1000
    run "metastable-$kind-co-located" --store-kind "$kind" --rate 2000
done
