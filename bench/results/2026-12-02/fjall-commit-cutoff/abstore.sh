#!/bin/bash
tag=$1; shift
for v in "$@"; do
  for i in $(seq 1 60); do l=$(cut -d' ' -f1 /proc/loadavg); python3 -c "import sys; sys.exit(0 if $l < 0.5 else 1)" && break; sleep 5; done
  echo "== $v load $(cut -d' ' -f1-3 /proc/loadavg) $(date -u +%H:%M:%S)"
  ./idem-bench-$v store --backend embedded --rate 1000 --duration-s 10 --warmup-s 2 --saturate-s 20 --seed 4242 --json store-$tag-$v.json > store-$tag-$v.txt 2> store-$tag-$v.err
  grep -E '^store|^embedded ' store-$tag-$v.txt
  echo "   after: load $(cut -d' ' -f1-3 /proc/loadavg)"
done
