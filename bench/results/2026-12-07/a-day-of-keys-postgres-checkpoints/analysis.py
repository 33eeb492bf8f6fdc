#!/usr/bin/env python3
"""What one scripts/day-of-keys run on PostgreSQL says about bytes and stalls.

    python3 analysis.py RUN_DIR

- the records' relations (table and indexes) per record, and the
  tombstones' per tombstone, at the first, middle and last sample of
  relations.csv (records: those loaded, plus those created, less those
  purged, from samples.csv; tombstones: one per record purged);
- the 400/s step's seconds with a p99 over 100 ms (steady.json's series),
  each with the PostgreSQL events within 5 s before it (postgres.log.gz:
  checkpoints started, autovacuum of the records' table);
- the checkpoints started and completed during the step: how many,
  started by WAL volume or by time, and the WAL each one covered.
"""
import csv, gzip, json, re, sys
from datetime import datetime, timezone

run = sys.argv[1]
LOADED = int(re.search(r"^records=(\d+)", open(f"{run}/scenario.txt").read(), re.M).group(1))

samples = list(csv.DictReader(open(f"{run}/samples.csv")))
relations = {}
for row in csv.DictReader(open(f"{run}/relations.csv")):
    relations.setdefault(int(row["unix_ms"]) // 1000, {})[row["relation"]] = int(row["bytes"])

print("bytes (records: table + primary key + expires_at index; tombstones: the same three of theirs)")
times = sorted(relations)
for second in (times[0], times[len(times) // 2], times[-1]):
    sizes = relations[second]
    sample = min(samples, key=lambda s: abs(int(s["unix_ms"]) // 1000 - second))
    purged, created = int(sample["purged_total"] or 0), int(sample["created_total"] or 0)
    records = LOADED + created - purged
    parts = ["idempotency_keys", "idempotency_keys_pkey", "idempotency_keys_expires_at"]
    tomb_parts = ["idempotency_tombstones", "idempotency_tombstones_pkey", "idempotency_tombstones_expires_at"]
    line = f"  {sample['phase']:6} +{second - times[0]:5d} s: {records:,} records, " + " + ".join(
        f"{sizes[p] / records:.1f}" for p in parts) + f" = {sum(sizes[p] for p in parts) / records:.1f} B each"
    if purged:
        line += f"; {purged:,} tombstones, " + " + ".join(f"{sizes[p] / purged:.1f}" for p in tomb_parts) + \
            f" = {sum(sizes[p] for p in tomb_parts) / purged:.1f} B each"
    print(line)

events = []
with gzip.open(f"{run}/postgres.log.gz", "rt") as log:
    for line in log:
        match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) UTC \[\d+\] LOG:  (.*)", line)
        if not match:
            continue
        when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
        text = match.group(2)
        if text.startswith("checkpoint starting") or "vacuum of table" in text and "idempotency_keys\"" in text:
            events.append((when, text[:90]))

steady = json.load(open(f"{run}/steady.json"))
loop = steady["http"][0]["open_loop"]
started = datetime.strptime(steady["machine"]["started_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
# The series counts from the end of the warm-up.
zero = started + loop["warmup_s"]
end = zero + loop["duration_s"]
print(f"\n400/s step: p50 / p99 / p99.9 / max {loop['latency']['p50_ms']} / {loop['latency']['p99_ms']} / "
      f"{loop['latency']['p999_ms']} / {loop['latency']['max_ms']} ms")
slow = [s for s in loop["series"] if s["latency"]["p99_ms"] > 100]
print(f"seconds with a p99 over 100 ms: {len(slow)} of {len(loop['series'])} (second: p99 / max ms; PostgreSQL events in the 5 s before, the second's start within a second or two)")
for s in slow:
    at = zero + s["second"]
    near = [f"{e[1]} ({at - e[0]:+.1f} s)" for e in events if -1 <= at - e[0] <= 5]
    print(f"  {s['second']:5d}: {s['latency']['p99_ms']:.0f} / {s['latency']['max_ms']:.0f}  " + ("; ".join(near) or "-"))

with gzip.open(f"{run}/postgres.log.gz", "rt") as log:
    text = log.read()
# Each checkpoint's start, and the WAL it covered (its "complete" line's
# distance: the WAL since the start before it), for those started in the step.
checkpoints, started_in_step = [], None
for match in re.finditer(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\d+ UTC \[\d+\] LOG:  checkpoint "
                         r"(?:starting: (\w+)|complete:.*?distance=(\d+) kB)", text):
    when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    if match.group(2):
        started_in_step = match.group(2) if zero <= when <= end else None
    elif started_in_step:
        checkpoints.append((started_in_step, int(match.group(3))))
        started_in_step = None
reasons = [reason for reason, _ in checkpoints]
print(f"\ncheckpoints started and completed during the step: {len(checkpoints)} "
      f"({reasons.count('wal')} by WAL volume, {reasons.count('time')} by time)")
if checkpoints:
    distances = [distance for _, distance in checkpoints]
    print(f"WAL each covered: {min(distances) / 1024:.1f} to {max(distances) / 1024:.1f} MiB")
