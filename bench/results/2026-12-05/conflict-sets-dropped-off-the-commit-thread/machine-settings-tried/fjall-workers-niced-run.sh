#!/bin/bash
# One 2,000/s embedded run whose fjall worker threads are reniced to NICE
# 4 s after the start: BENCH=... SERVER=... NICE=10 ./fjall-workers-niced-run.sh
set -eu
"$BENCH" http --store-kind embedded --rate 2000 --duration-s 60 --warmup-s 5 --seed 7303 \
    --server-bin "$SERVER" --json fjall-workers-nice-10.json > fjall-workers-nice-10.txt 2>&1 &
sleep 4
# The service is the `server` process with the most threads (the carrier
# simulator runs the same binary).
most=0 service=
for pid in $(pgrep -x server); do
    threads=$(ls /proc/"$pid"/task | wc -l)
    if [ "$threads" -gt "$most" ]; then most=$threads service=$pid; fi
done
for task in /proc/"$service"/task/*; do
    if [ "$(cat "$task"/comm)" = "fjall:worker" ]; then renice -n "$NICE" -p "$(basename "$task")"; fi
done
wait
