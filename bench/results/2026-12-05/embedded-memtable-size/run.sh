#!/usr/bin/env bash
# Embedded store at 2,000/s for 60 s, fjall's memtable at 16 MiB (the
# default) and 4 MiB, alternating; each run waits for a 1-minute load <= 1.0.
set -euo pipefail
bench=${BENCH:?the idem-bench binary, an absolute path}
cd "$(dirname "$0")"
wait_for_quiet() { while awk '{exit !($1 >= 1.0)}' /proc/loadavg; do sleep 5; done; }
for round in 1 2; do
    for mib in 16 4; do
        wait_for_quiet
        name="embedded-2000-memtable-${mib}m-${round}"
        echo "$(date -u +%H:%M:%S) $name load before: $(cut -d' ' -f1-3 /proc/loadavg)" >> commands.txt
        echo "  IDEM__STORE__EMBEDDED__MEMTABLE_BYTES=$((mib * 1048576)) idem-bench http --store-kind embedded --rate 2000 --duration-s 60 --warmup-s 5 --seed 7303" >> commands.txt
        IDEM__STORE__EMBEDDED__MEMTABLE_BYTES=$((mib * 1048576)) "$bench" http --store-kind embedded --rate 2000 \
            --duration-s 60 --warmup-s 5 --seed 7303 --json "$name.json" > "$name.txt" 2>&1
        echo "$(date -u +%H:%M:%S) $name load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> commands.txt
    done
done
