#!/usr/bin/env bash
# KINDS at 2,000/s for 60 s, two builds of the service (BEFORE and AFTER)
# alternating, ROUNDS times; each run waits for a 1-minute load <= 1.0.
# Outputs go to OUT (this folder by default). Used for the sealed memtables
# freed outside the version lock (here), for the conflict sets freed after
# the commit's lock (OUT=../conflict-sets-freed-outside-the-commit-lock) and
# for those dropped a few per commit (OUT=../conflict-sets-dropped-a-few-per-commit).
set -euo pipefail
bench=${BENCH:?the idem-bench binary, an absolute path}
before=${BEFORE:?the server binary built before the change}
after=${AFTER:?the server binary built with it}
kinds=${KINDS:-embedded}
rounds=${ROUNDS:-2}
cd "${OUT:-$(dirname "$0")}"
wait_for_quiet() { while awk '{exit !($1 >= 1.0)}' /proc/loadavg; do sleep 5; done; }
for round in $(seq 1 "$rounds"); do
    for kind in $kinds; do
        for which in before after; do
            wait_for_quiet
            name="$kind-2000-$which-$round"
            server=$before; [ "$which" = after ] && server=$after
            echo "$(date -u +%H:%M:%S) $name load before: $(cut -d' ' -f1-3 /proc/loadavg)" >> commands.txt
            echo "  idem-bench http --store-kind $kind --rate 2000 --duration-s 60 --warmup-s 5 --seed 7303 --server-bin SERVER-$which" >> commands.txt
            "$bench" http --store-kind "$kind" --rate 2000 --duration-s 60 --warmup-s 5 --seed 7303 \
                --server-bin "$server" --json "$name.json" > "$name.txt" 2>&1
            echo "$(date -u +%H:%M:%S) $name load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> commands.txt
        done
    done
done
