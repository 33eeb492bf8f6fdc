#!/usr/bin/env bash
# PostgreSQL, 2,000/s for 60 s co-located, seed 7303: the fixed-bucket
# client (FIXED_BUCKET_BENCH: idem-bench built from commit 7b2ee4a) and the
# share-of-recent-intents one (target/release/idem-bench of e40a409), in
# the order A B B A, against the server of e40a409; each started at a
# 1-minute load below 1.0.
set -u
cd "$(dirname "$0")/../../../.."
source scripts/foundationdb.sh >/dev/null; find_distribution >/dev/null; use_client_library
out=bench/results/2026-12-07/retry-budget-postgres-pair
wait_quiet() { local w=0; while awk '{exit !($1 >= 1.0)}' /proc/loadavg && ((w < 300)); do sleep 5; w=$((w+5)); done; }
run() { # name binary
  wait_quiet
  local cmd="$2 http --server-bin target/release/server --store-kind postgres --rate 2000 --duration-s 60 --warmup-s 5 --seed 7303 --json $out/$1.json"
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg): $cmd" >> $out/commands.txt
  $cmd > $out/$1.txt 2>&1
}
run fixed-bucket-1 "$FIXED_BUCKET_BENCH"
run share-of-intents-1 target/release/idem-bench
run share-of-intents-2 target/release/idem-bench
run fixed-bucket-2 "$FIXED_BUCKET_BENCH"
echo done >> $out/commands.txt
