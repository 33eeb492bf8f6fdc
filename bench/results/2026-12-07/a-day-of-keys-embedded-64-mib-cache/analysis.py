#!/usr/bin/env python3
"""The steady step second by second (steady.json), the service's samples
(samples.csv) and the embedded store's gauges each second
(level-zero-samples.csv, the service on port 32327): prints analysis.txt."""
import csv, datetime, json, statistics

series = json.load(open("steady.json"))["http"][0]["open_loop"]["series"]
p99 = [s["latency"]["p99_ms"] for s in series if s["latency"]["count"]]
print("seconds %d, median per-second p99 %.1f ms" % (len(p99), statistics.median(p99)))
for threshold in (50, 100, 250, 1000, 2500):
    print("seconds with p99 > %d ms: %d" % (threshold, sum(1 for v in p99 if v > threshold)))
print("minute: median / worst per-second p99 (ms)")
print(" ".join("%d:%.0f/%.0f" % (m, statistics.median(p99[m * 60:(m + 1) * 60]), max(p99[m * 60:(m + 1) * 60])) for m in range(30)))
rows = [r for r in csv.DictReader(open("samples.csv")) if r["phase"] == "steady"]
rss = [int(r["service_rss_kib"]) / 1024 for r in rows]
later = rss[12:]
print("RSS MiB: first sample %.0f (before the load); from the second minute on min %.0f max %.0f mean %.0f, last %.0f" % (rss[0], min(later), max(later), statistics.mean(later), rss[-1]))
count = [int(r["record_count"]) for r in rows if r["record_count"]]
print("record count: first %d min %d max %d last %d" % (count[0], min(count), max(count), count[-1]))
size = [int(r["store_bytes"]) for r in rows]
print("store bytes during the step: min %.2f max %.2f GB, median %.2f GB: %.0f bytes per record" % (min(size) / 1e9, max(size) / 1e9, statistics.median(size) / 1e9, statistics.median(size) / statistics.median(count)))
# Seconds over 1 s against the gauges: the step began 04:17:50 UTC, 5 s of warm-up.
start = datetime.datetime(2026, 12, 7, 4, 17, 55, tzinfo=datetime.timezone.utc).timestamp()
gauges = [(int(r["unix_ms"]) / 1000, r) for r in csv.DictReader(open("level-zero-samples.csv")) if r["service_port"] == "32327"]
print("seconds with p99 over 1 s, and the gauges from 4 s before to 3 s after (s from the second, level-0 tables, sealed memtables, compactions):")
for index, second in enumerate(series):
    if second["latency"]["count"] and second["latency"]["p99_ms"] > 1000:
        at = start + index
        near = [(round(t - at, 1), int(r["level_zero_tables"]), int(r["sealed_memtables"]), int(r["compactions_running"])) for t, r in gauges if -4 <= t - at <= 3]
        print(" ", datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%H:%M:%S"), "p99 %.0f ms" % second["latency"]["p99_ms"], near)
