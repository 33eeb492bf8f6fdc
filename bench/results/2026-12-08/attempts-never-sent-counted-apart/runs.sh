#!/usr/bin/env bash
# The metastable and overload profiles, co-located, embedded and Redis,
# with idem-bench reporting attempts that got no connection from its own
# pool in time apart from the admitted ones. Run from the repository's
# root after `cargo build --release --locked -p server -p bench`.
set -uo pipefail
out=$(dirname "$0")
bench=target/release/idem-bench
wait_for_quiet() {
    local waited=0
    while awk '{exit !($1 >= 1.0)}' /proc/loadavg && ((waited < 300)); do sleep 5; waited=$((waited + 5)); done
}
run() {
    local name=$1
    shift
    wait_for_quiet
    echo "$(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg): $*" | tee -a "$out/commands.txt"
    "$bench" "$@" --seed 7303 --json "$out/$name.json" > "$out/$name.txt" 2>&1 || true
    echo "  -> $name (load after $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/commands.txt"
}
for kind in embedded redis; do
    run "metastable-$kind-co-located" http --store-kind "$kind" --profile metastable --rate 2000 --warmup-s 3 \
        --chart "$out/metastable-$kind-co-located.svg"
    run "overload-$kind" http --store-kind "$kind" --profile overload --rate 2000 --phase-s 15 --warmup-s 3
done
