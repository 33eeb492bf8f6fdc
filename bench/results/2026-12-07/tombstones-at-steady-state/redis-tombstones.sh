#!/usr/bin/env bash
# Bytes of used_memory per Redis tombstone: 1,000,000 keys written exactly as
# store-redis's mark_tombstone writes them (SET key until_ms PXAT until_ms)
# into an empty redis-server, pipelined.
set -euo pipefail
cd "$(dirname "$0")"
port=${PORT:-26390}
dir=$(mktemp -d)
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --dir "$dir" --logfile "$dir/redis.log"
sleep 1
redis-server --version
before=$(redis-cli -p "$port" INFO memory | awk -F: '/^used_memory:/ {print $2+0}')
python3 redis-tombstones.py 1000000 | redis-cli -p "$port" --pipe | tail -1
after=$(redis-cli -p "$port" INFO memory | awk -F: '/^used_memory:/ {print $2+0}')
keys=$(redis-cli -p "$port" DBSIZE)
echo "used_memory before $before, after $after, keys $keys: $(( (after - before) / keys )) bytes per tombstone"
