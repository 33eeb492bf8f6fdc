#!/usr/bin/env bash
# What deflating the saved response costs the service on PostgreSQL: the
# Label service before migration 0005 (SERVER_BEFORE) and after it
# (SERVER_AFTER), the same bench, each twice in alternation, spawned by
# `idem-bench http` with its own PostgreSQL at RATE (default 1,000/s, which
# this host holds; its 2,000/s collapses on PostgreSQL with either build).
#
#   SERVER_BEFORE=PATH SERVER_AFTER=target/release/server \
#       bench/results/2026-12-07/postgres-response-in-one-column/service-cpu.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
here=bench/results/2026-12-07/postgres-response-in-one-column
rate=${RATE:-1000}
for round in 1 2; do
    for build in before after; do
        server=$SERVER_AFTER
        [ "$build" = before ] && server=${SERVER_BEFORE:?}
        echo "== $build, round $round, load $(cut -d' ' -f1-3 /proc/loadavg)"
        target/release/idem-bench http --server-bin "$server" --store-kind postgres --rate "$rate" \
            --duration-s 30 --warmup-s 5 --seed 7310 --quiet --json "$here/cpu-$build-$round.json" \
            >"$here/cpu-$build-$round.txt" 2>&1 || true
        grep -E "^http postgres|cpu during|audit" "$here/cpu-$build-$round.txt"
    done
done
