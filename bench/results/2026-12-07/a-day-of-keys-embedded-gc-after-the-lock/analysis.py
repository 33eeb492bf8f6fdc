#!/usr/bin/env python3
"""The steady step second by second (steady.json), the service's samples
(samples.csv), and lsm-tree's version GC runs traced in the service's log
(version-gc-trace.log): prints analysis.txt."""
import csv, datetime, json, statistics

def at(line):
    stamp = datetime.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f")
    return stamp.replace(tzinfo=datetime.timezone.utc).timestamp()

def step_start(name):
    """The step's measured window: its command's time plus the 5 s warm-up."""
    for line in open("commands.txt"):
        if line.rstrip().endswith("/" + name + ".json"):
            started = datetime.datetime.strptime(line[:20], "%Y-%m-%dT%H:%M:%SZ")
            return started.replace(tzinfo=datetime.timezone.utc).timestamp() + 5
    raise SystemExit(f"no {name} step in commands.txt")

series = json.load(open("steady.json"))["http"][0]["open_loop"]["series"]
p99 = [s["latency"]["p99_ms"] for s in series if s["latency"]["count"]]
print("seconds %d, median per-second p99 %.1f ms" % (len(p99), statistics.median(p99)))
for threshold in (50, 100, 250, 1000, 2500):
    print("seconds with p99 > %d ms: %d" % (threshold, sum(1 for v in p99 if v > threshold)))
print("minute: median / worst per-second p99 (ms)")
minutes = len(p99) // 60
print(" ".join("%d:%.0f/%.0f" % (m, statistics.median(p99[m * 60:(m + 1) * 60]), max(p99[m * 60:(m + 1) * 60])) for m in range(minutes)))
rows = [r for r in csv.DictReader(open("samples.csv")) if r["phase"] == "steady"]
rss = [int(r["service_rss_kib"]) / 1024 for r in rows]
later = rss[12:]
print("RSS MiB: first sample %.0f; from the second minute on min %.0f max %.0f mean %.0f, last %.0f" % (rss[0], min(later), max(later), statistics.mean(later), rss[-1]))
count = [int(r["record_count"]) for r in rows if r["record_count"]]
print("record count: first %d min %d max %d last %d" % (count[0], min(count), max(count), count[-1]))
size = [int(r["store_bytes"]) for r in rows]
print("store bytes during the step: min %.2f max %.2f GB, median %.2f GB: %.0f bytes per record" % (min(size) / 1e9, max(size) / 1e9, statistics.median(size) / 1e9, statistics.median(size) / statistics.median(count)))

runs = []
for line in open("version-gc-trace.log"):
    if "Running manifest GC" in line:
        runs.append([at(line), None, 0])
    elif "Manifest GC done" in line and runs and runs[-1][1] is None:
        runs[-1][1] = at(line) - runs[-1][0]
    elif "Cleanup deleted table" in line and runs:
        runs[-1][2] += 1
first = step_start("steady")
inside = [run for run in runs if run[1] is not None and first <= run[0] < first + len(series)]
deleting = [run for run in inside if run[2]]
print("version GC runs in the step: %d, %d of them deleted tables (%d to %d); the lock held at most %.1f ms by any, %.1f ms by one that deleted tables" % (
    len(inside), len(deleting), min((r[2] for r in deleting), default=0), max((r[2] for r in deleting), default=0),
    max(r[1] for r in inside) * 1000, max((r[1] for r in deleting), default=0) * 1000))
print("the ten worst seconds (UTC, p99 ms, the nearest GC run that deleted tables, s from it):")
worst = sorted(range(len(series)), key=lambda i: -series[i]["latency"]["p99_ms"])[:10]
for index in sorted(worst):
    second = first + index
    nearest = min(deleting, key=lambda r: abs(r[0] - second), default=None)
    print("  %s %.0f ms %s" % (datetime.datetime.fromtimestamp(second, datetime.timezone.utc).strftime("%H:%M:%S"),
          series[index]["latency"]["p99_ms"], "%.1f" % (nearest[0] - second) if nearest else "-"))
