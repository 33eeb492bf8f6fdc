#!/usr/bin/env bash
# The overload profile (1x, 2x, 3x, 1x of 2,000/s, 15 s each) and the
# design-peak run (2,000/s for 60 s), embedded store, co-located, with the
# client's pool first come first served (fifo) and adaptive LIFO, each in
# the order A B B A. Run from the repository's root after
# `cargo build --release -p server -p bench`; writes beside this script.
set -euo pipefail
out=$(dirname "$0")
run() {
    local name=$1
    shift
    sleep 20
    echo "$(date -u +%FT%TZ) $name load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/commands.txt"
    echo "    ./target/release/idem-bench $*" >>"$out/commands.txt"
    ./target/release/idem-bench "$@" --json "$out/$name.json" >"$out/$name.txt" 2>&1 || true
}
n=0
for order in fifo adaptive-lifo adaptive-lifo fifo; do
    n=$((n + 1))
    run "overload-embedded-$order-$n" http --store-kind embedded --profile overload --rate 2000 --phase-s 15 \
        --warmup-s 3 --seed 7303 --pool-order "$order"
done
n=0
for order in fifo adaptive-lifo adaptive-lifo fifo; do
    n=$((n + 1))
    run "steady-embedded-$order-$n" http --store-kind embedded --rate 2000 --duration-s 60 --warmup-s 5 \
        --seed 7303 --pool-order "$order"
done
