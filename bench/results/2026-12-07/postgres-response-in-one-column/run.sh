#!/usr/bin/env bash
# PostgreSQL's bytes per record with the saved response in four columns
# (BENCH_BEFORE, a build before migration 0005) and deflated in one
# (BENCH_AFTER): each build preloads the same 1,000,000 records (seed 1)
# into its own database on one throw-away PostgreSQL, then the sizes of the
# table and of its two indexes are read.
#
#   BENCH_BEFORE=/path/idem-bench BENCH_AFTER=target/release/idem-bench \
#       bench/results/2026-12-07/postgres-response-in-one-column/run.sh > output.txt
set -euo pipefail
cd "$(dirname "$0")/../../../.."
records=${RECORDS:-1000000}
scratch=$(mktemp -d)
chmod 755 "$scratch"
trap 'kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; rm -rf "$scratch"' EXIT
TMPDIR="$scratch" "${BENCH_AFTER:?}" store-server --store-kind postgres --url-file "$scratch/url" \
    >"$scratch/server.log" 2>&1 &
server_pid=$!
until [ -s "$scratch/url" ]; do sleep 0.1; done
url=$(cat "$scratch/url")
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for build in before after; do
    bench=$BENCH_AFTER
    [ "$build" = before ] && bench=${BENCH_BEFORE:?}
    psql "${url%/*}/postgres" -XAtqc "CREATE DATABASE size_$build"
    "$bench" preload --store-kind postgres --postgres-url "${url%/*}/size_$build" --records "$records" --seed 1 2>&1 |
        grep -E "written in|bytes after"
    psql "${url%/*}/size_$build" -XAtF ' ' -c "SELECT '$build:', \
        'table', pg_relation_size('idempotency_keys') / $records, \
        'primary key', pg_relation_size('idempotency_keys_pkey') / $records, \
        'expires_at index', pg_relation_size('idempotency_keys_expires_at') / $records, \
        'all', pg_total_relation_size('idempotency_keys') / $records, \
        'bytes per record; mean row', round(avg(pg_column_size(keys.*))), 'bytes' FROM idempotency_keys AS keys"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
