#!/usr/bin/env bash
# The FoundationDB rows: one single-process fdbserver (ssd) from
# scripts/foundationdb.sh, the metastable profile co-located with the
# polite and the standard client, then split with the standard one (the
# fdbserver pinned to the service's CPU, as scripts/bench-quiet does).
# Run from the repository's root with CARGO_TARGET_DIR set to where the
# `foundationdb` builds of server and bench are:
#   CARGO_TARGET_DIR=... bench/results/2026-12-05/metastable-with-the-standard-client/foundationdb-runs.sh
set -euo pipefail
out=$(cd "$(dirname "$0")" && pwd)
bench="$CARGO_TARGET_DIR/release/idem-bench"
# shellcheck source=scripts/foundationdb.sh
source scripts/foundationdb.sh
find_distribution
use_client_library
start_server
wait_for_quiet() { while awk '{exit !($1 >= 1.0)}' /proc/loadavg; do sleep 5; done; }
run() {
    local name=$1
    shift
    wait_for_quiet
    echo "$(date -u +%T) $name load before $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/commands.txt"
    echo "  idem-bench http --store-kind foundationdb $* --profile metastable --warmup-s 3 --seed 7303" >> "$out/commands.txt"
    "$bench" http --store-kind foundationdb "$@" --profile metastable --warmup-s 3 --seed 7303 \
        --json "$out/$name.json" --chart "$out/$name.svg" > "$out/$name.txt" 2>&1 || true
}
run metastable-foundationdb-co-located-standard-1 --rate 2000 --client-profile standard
run metastable-foundationdb-co-located-polite-1 --rate 2000 --client-profile polite
taskset -a -p -c 0 "$server_pid" > /dev/null
run metastable-foundationdb-split-standard-1 --split-cpus --rate 1000 --client-profile standard
