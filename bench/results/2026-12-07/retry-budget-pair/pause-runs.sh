#!/usr/bin/env bash
# The runs of this folder with the service paused: embedded, 2,000/s for
# 60 s (5 s warm-up), seed 7303, the service stopped (SIGSTOP) for 300 ms
# 25 s and 45 s after the bench started (20 s and 40 s into the measured
# minute), then continued (SIGCONT). FIXED_BUCKET_BENCH is idem-bench built
# from commit 7b2ee4a (the AWS SDKs' 500-token bucket); the other runs use
# target/release/idem-bench of e40a409 (a fifth of recent intents), with the
# server of 7b2ee4a's admission for the `paused-share-of-intents-{1,2}` runs
# and of e40a409 for the `-overloaded-hint` ones. The unpaused runs are the
# same command without pause_service.
set -u
cd "$(dirname "$0")/../../../.."
source scripts/foundationdb.sh >/dev/null; find_distribution >/dev/null; use_client_library
out=bench/results/2026-12-07/retry-budget-pair
wait_quiet() { local w=0; while awk '{exit !($1 >= 1.0)}' /proc/loadavg && ((w < 300)); do sleep 5; w=$((w+5)); done; }
pause_service() {
  local pid
  for _ in $(seq 1 100); do pid=$(pgrep -f "release/server --config .*server-0.toml" | head -1); [ -n "$pid" ] && break; sleep 0.1; done
  local started=$SECONDS
  for at in 25 45; do
    sleep $((at - (SECONDS - started)))
    kill -STOP "$pid"; sleep 0.3; kill -CONT "$pid"
    echo "  paused $pid for 300 ms at $(date -u +%H:%M:%S.%N | cut -c1-12)" >> $out/commands.txt
  done
}
run() { # name binary
  wait_quiet
  local cmd="$2 http --server-bin target/release/server --store-kind embedded --rate 2000 --duration-s 60 --warmup-s 5 --seed 7303 --json $out/$1.json"
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg): $cmd" >> $out/commands.txt
  $cmd > $out/$1.txt 2>&1 &
  local bench=$!
  pause_service
  wait $bench
}
run paused-fixed-bucket-1 "$FIXED_BUCKET_BENCH"
run paused-share-of-intents-1 target/release/idem-bench
run paused-share-of-intents-2 target/release/idem-bench
run paused-fixed-bucket-2 "$FIXED_BUCKET_BENCH"
