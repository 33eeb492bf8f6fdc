#!/usr/bin/env bash
# One run against a fresh single-process fdbserver from scripts/foundationdb.sh,
# with the fdbserver's CPU over the whole run appended to the output.
# Run from the repository's root with CARGO_TARGET_DIR set to the
# `foundationdb` build of server and bench:
#   CARGO_TARGET_DIR=... [IDEM_FDB_STORAGE_ENGINE=ssd-redwood-1] [IDEM__SERVER__ADMISSION__WORKERS=256] \
#     bench/results/2026-12-07/foundationdb-on-a-slower-host/run-fdb.sh NAME --rate 2000 --duration-s 60 --warmup-s 5 --seed 7303 [--client-profile polite]
set -euo pipefail
out=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/foundationdb.sh
source scripts/foundationdb.sh
find_distribution > /dev/null
use_client_library
start_server > /dev/null
name=$1
shift
while awk '{exit !($1 >= 1.0)}' /proc/loadavg; do sleep 5; done
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.1f", ($14 + $15) / hz}' "/proc/$server_pid/stat"; }
before=$(cpu_s)
"$CARGO_TARGET_DIR/release/idem-bench" http --store-kind foundationdb "$@" --json "$out/$name.json" > "$out/$name.txt" 2>&1 || true
echo "fdbserver cpu $(awk -v a="$before" -v b="$(cpu_s)" 'BEGIN {print b - a}') s" >> "$out/$name.txt"
