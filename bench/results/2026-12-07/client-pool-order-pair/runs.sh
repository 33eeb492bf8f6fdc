#!/usr/bin/env bash
# The metastable profile, embedded store, co-located, with the client's
# connection pool first come first served (fifo) and adaptive LIFO, in the
# order A B B A. Run from the repository's root after
# `cargo build --release -p server -p bench`; writes beside this script.
set -euo pipefail
out=$(dirname "$0")
kind=${1:-embedded}
rate=${2:-2000}
extra=${3:-}
n=0
for order in fifo adaptive-lifo adaptive-lifo fifo; do
    n=$((n + 1))
    sleep 20
    name="$kind-$order-$n${extra:+-split}"
    echo "$(date -u +%FT%TZ) $name load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/commands.txt"
    ./target/release/idem-bench http --store-kind "$kind" $extra --profile metastable --rate "$rate" --warmup-s 3 --seed 7303 \
        --pool-order "$order" --json "$out/$name.json" --chart "$out/$name.svg" > "$out/$name.txt" 2>&1 || true
    echo "    ./target/release/idem-bench http --store-kind $kind $extra --profile metastable --rate $rate --warmup-s 3 --seed 7303 --pool-order $order" >> "$out/commands.txt"
done
