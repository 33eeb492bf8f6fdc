#!/usr/bin/env bash
# PostgreSQL, 2,000/s for 60 s co-located, seed 7303, on an empty store:
# the benchmark cluster with PostgreSQL's default max_wal_size (1 GB) and
# with 16 GB (as scripts/day-of-keys sets it), in the order A B B A, each
# started at a 1-minute load below 1.0.
set -u
cd "$(dirname "$0")/../../../.."
out=bench/results/2026-12-07/postgres-wal-pair
wait_quiet() { local w=0; while awk '{exit !($1 >= 1.0)}' /proc/loadavg && ((w < 300)); do sleep 5; w=$((w+5)); done; }
run() { # name max_wal_size
  wait_quiet
  local cmd="target/release/idem-bench http --store-kind postgres --rate 2000 --duration-s 60 --warmup-s 5 --seed 7303 --json $out/$1.json"
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg): IDEM_POSTGRES_SERVER_OPTIONS='-c max_wal_size=$2' $cmd" >> $out/commands.txt
  IDEM_POSTGRES_SERVER_OPTIONS="-c max_wal_size=$2" $cmd > $out/$1.txt 2>&1
}
run max-wal-size-1gb-1 1GB
run max-wal-size-16gb-1 16GB
run max-wal-size-16gb-2 16GB
run max-wal-size-1gb-2 1GB
echo "$(date -u +%H:%M:%S) done" >> $out/commands.txt
