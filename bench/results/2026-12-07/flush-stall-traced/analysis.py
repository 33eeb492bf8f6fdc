#!/usr/bin/env python3
"""Each run of lsm-tree's version GC in version-gc-trace.log (from "Running
manifest GC" to "Manifest GC done", with the tables deleted in between),
against the p99 of the seconds around it in steady.json (the 400/s step
began 05:43:01 UTC, 5 s of warm-up): prints analysis.txt."""
import datetime, json

def at(line):
    return datetime.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()

runs, started, deleted = [], None, 0
for line in open("version-gc-trace.log"):
    if "Running manifest GC" in line:
        started, deleted = at(line), 0
    elif "Cleanup deleted table" in line and started:
        deleted += 1
    elif "Manifest GC done" in line and started:
        runs.append((started, at(line) - started, deleted))
        started = None
series = json.load(open("steady.json"))["http"][0]["open_loop"]["series"]
first_second = datetime.datetime(2026, 12, 7, 5, 43, 6, tzinfo=datetime.timezone.utc).timestamp()
print("version GC runs during the service's life: %d, of which %d deleted tables" % (len(runs), sum(1 for r in runs if r[2])))
for started, took, deleted in runs:
    if not deleted:
        continue
    second = int(started - first_second)
    around = [round(s["latency"]["p99_ms"]) for s in series[max(0, second - 2):second + 3] if s["latency"]["count"]]
    print("%s GC held the version lock %.0f ms, %d tables deleted; p99 of the seconds %d to %d: %s ms" % (
        datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:12], took * 1000, deleted, second - 2, second + 2, around))
p99 = [s["latency"]["p99_ms"] for s in series if s["latency"]["count"]]
worst = sorted(range(len(p99)), key=lambda i: -p99[i])[:6]
print("the six worst seconds (second, UTC, p99 ms):", [(i, datetime.datetime.fromtimestamp(first_second + i, datetime.timezone.utc).strftime("%H:%M:%S"), round(p99[i])) for i in sorted(worst)])
