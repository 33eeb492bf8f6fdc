#!/usr/bin/env bash
set -uo pipefail
out=$1; shift
mkdir -p $out
rel=${RELEASE_DIR:-target/release}
while awk '{exit !($1 >= 1.0)}' /proc/loadavg; do sleep 5; done
echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg): idem-bench $*" > $out/command.txt
$rel/idem-bench "$@" --server-bin $rel/server --json $out/run.json > $out/run.txt 2>&1 &
bp=$!
sp=""
for _ in $(seq 200); do
  for c in $(pgrep -P $bp 2>/dev/null); do
    cl=$(tr '\0' ' ' < /proc/$c/cmdline 2>/dev/null)
    if [[ "$cl" == *"$rel/server"* && "$cl" != *" carrier "* ]]; then sp=$c; fi
  done
  [ -n "$sp" ] && break; sleep 0.2
done
config=$(tr '\0' '\n' <"/proc/$sp/cmdline" | grep -A1 -- '--config' | tail -1)
address=$(grep -oE '^listen *= *"[^"]+"' "$config" | grep -oE '[0-9.]+:[0-9]+')
for _ in $(seq 100); do curl -sf http://$address/healthz >/dev/null && break; sleep 0.2; done
python3 "$(dirname "$0")/sample.py" $address ${address##*:} $out/samples.txt &
wait $bp
