#!/usr/bin/env python3
"""Prints analysis.txt: the steady step's seconds that lost intents, and the
store's bytes per record over the step (records and tombstones tables over
PostgreSQL's live-row estimate), from steady.json and samples.csv."""
import csv
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
series = json.load(open(os.path.join(here, "steady.json")))["http"][0]["open_loop"]["series"]
failing = [second for second in series if second["failures"] > 0]
episodes = []
for second in failing:
    if episodes and second["second"] - episodes[-1][-1]["second"] <= 3:
        episodes[-1].append(second)
    else:
        episodes.append([second])
print(f"seconds that lost intents: {len(failing)}, {sum(s['failures'] for s in failing)} intents, in {len(episodes)} episodes")
for episode in episodes:
    worst = max(second["latency"]["max_ms"] for second in episode)
    lost = sum(second["failures"] for second in episode)
    print(f"  seconds {episode[0]['second']} to {episode[-1]['second']}: {lost} lost, slowest answer {worst:.0f} ms")
over = [second for second in series if second["latency"]["p99_ms"] > 100]
print(f"seconds with a p99 over 100 ms: {len(over)} of {len(series)}")

rows = [row for row in csv.DictReader(open(os.path.join(here, "samples.csv"))) if row["record_count"]]
start = int(rows[0]["unix_ms"])
print("phase  s  live rows (estimate)  bytes  bytes per row  dead rows  autovacuum runs  service RSS MiB")
for row in rows[::24] + [rows[-1]]:
    count, size = int(row["record_count"]), int(row["store_bytes"])
    print(
        row["phase"], (int(row["unix_ms"]) - start) // 1000, count, size, round(size / count),
        row["dead_tuples"], row["autovacuum_runs"], int(row["service_rss_kib"]) // 1024,
    )
