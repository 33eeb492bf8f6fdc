#!/bin/bash
# usage: ab.sh tag variant...   runs embedded 2000/s x 30 s per variant, waits for load < 0.5
tag=$1; shift
for v in "$@"; do
  for i in $(seq 1 60); do l=$(cut -d' ' -f1 /proc/loadavg); python3 -c "import sys; sys.exit(0 if $l < 0.5 else 1)" && break; sleep 5; done
  echo "== $v load $(cut -d' ' -f1-3 /proc/loadavg) $(date -u +%H:%M:%S)"
  ./idem-bench-$v http --store-kind embedded --rate 2000 --duration-s 30 --warmup-s 5 --seed 4242 --server-bin ./server-$v --json run-$tag-$v.json > run-$tag-$v.txt 2> run-$tag-$v.err
  grep -E '^http|cpu|rss|shed|lost' run-$tag-$v.txt | head -12
done
