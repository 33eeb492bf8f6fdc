#!/usr/bin/env bash
# One run of this folder: 3M records preloaded into the embedded store,
# 400/s for 90 s on it with the sweeper on (scripts/day-of-keys), and a
# profile of the service (perf record -F 499, dwarf call stacks) for 12 s
# from 30 s into that step. Run from the repository's root:
#   [IDEM__STORE__EMBEDDED__CACHE_BYTES=N] bench/results/2026-12-07/embedded-cache-admits-index-blocks/run.sh OUT
set -euo pipefail
out=$1
scripts/day-of-keys --backend embedded --records 3000000 --steady-s 90 --peak-s 0 --reference-s 0 --out "$out" > "$out.log" 2>&1 &
dok=$!
until pgrep -f "idem-bench http.*--rate 400" > /dev/null; do sleep 1; kill -0 $dok 2>/dev/null || exit 1; done
sleep 30
service=$(ps -eo pid,nlwp,comm | awk '$3 == "server"' | sort -k2 -n -r | head -1 | awk '{print $1}')
perf record -F 499 -g --call-graph dwarf,8192 -o "$out.perf" -p "$service" -- sleep 12 > /dev/null 2>&1 || true
wait $dok || true
