#!/usr/bin/env bash
# Before and after lsm-tree's collected versions were dropped after the
# version lock (vendor/README.md): a 10M-record day of keys per build, with
# lsm-tree's version GC and table clean-up traced in the service's log, then
# the empty store at 2,000/s, the builds alternated.
#
#   SERVER_BEFORE=PATH SERVER_AFTER=PATH run.sh
#
# Run from the repository's root; the bench is target/release/idem-bench.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export RUST_LOG='warn,fjall::keyspace=debug,lsm_tree::version::super_version=trace,lsm_tree::table::inner=trace'

for build in before after; do
    server_var="SERVER_${build^^}"
    out="$here/day-of-keys-10m-$build"
    rm -rf "$out"
    # day-of-keys removes its scratch directory when it ends: copy the
    # service's log while it runs.
    ( while sleep 5; do
          for log in /tmp/idem-day-of-keys.*/service.log; do
              [ -f "$log" ] && mkdir -p "$out" && cp "$log" "$out/service.log"
          done
      done ) &
    copier=$!
    IDEM_SERVER_BIN="${!server_var}" scripts/day-of-keys --backend embedded --records 10000000 \
        --minutes 5 --peak-s 60 --reference-s 0 --out "$out" || true
    kill "$copier"
    grep -E 'manifest GC|Manifest GC|Cleanup deleted table|Rotating keyspace' "$out/service.log" \
        >"$out/version-gc-trace.log" || true
    rm -f "$out/service.log"
done

unset RUST_LOG
for pair in 1 2; do
    for build in before after; do
        server_var="SERVER_${build^^}"
        echo "$(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg): $build, pair $pair" >>"$here/commands.txt"
        IDEM_SERVER_BIN="${!server_var}" target/release/idem-bench http --store-kind embedded \
            --rate 2000 --duration-s 60 --warmup-s 5 --seed 7303 --quiet \
            --json "$here/peak-empty-$build-$pair.json" >"$here/peak-empty-$build-$pair.txt" 2>&1 || true
        echo "  -> load after $(cut -d' ' -f1-3 /proc/loadavg)" >>"$here/commands.txt"
        sleep 20
    done
done
