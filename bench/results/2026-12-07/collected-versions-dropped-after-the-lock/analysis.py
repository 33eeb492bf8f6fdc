#!/usr/bin/env python3
"""Prints analysis.txt: for each build, the runs of lsm-tree's version GC in
day-of-keys-10m-BUILD/version-gc-trace.log (the lock is held from "Running
manifest GC" to "Manifest GC done"; the tables a run deletes are logged
inside that span before the change and just after it with the change),
against the p99 of the seconds around each run in that step's JSON; then
the steps' latencies and the empty store's 2,000/s pairs."""
import datetime, json, os

here = os.path.dirname(os.path.abspath(__file__))

def at(line):
    stamp = datetime.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f")
    return stamp.replace(tzinfo=datetime.timezone.utc).timestamp()

def gc_runs(path):
    """(start, held seconds, tables deleted before the next run starts)."""
    runs = []
    for line in open(path):
        if "Running manifest GC" in line:
            runs.append([at(line), None, 0])
        elif "Manifest GC done" in line and runs and runs[-1][1] is None:
            runs[-1][1] = at(line) - runs[-1][0]
        elif "Cleanup deleted table" in line and runs:
            runs[-1][2] += 1
    return [run for run in runs if run[1] is not None]

def step_start(folder, name):
    """When a step's measured window began: its command's time plus the
    5 s warm-up (commands.txt)."""
    for line in open(os.path.join(folder, "commands.txt")):
        if "--json" in line and line.rstrip().endswith("/" + name + ".json"):
            started = datetime.datetime.strptime(line[:20], "%Y-%m-%dT%H:%M:%SZ")
            return started.replace(tzinfo=datetime.timezone.utc).timestamp() + 5
    raise SystemExit(f"no {name} step in {folder}/commands.txt")

def step(path):
    """A step's open-loop report, its latency, the p99 of each second, its
    audit."""
    report = json.load(open(path))
    loop = report["http"][0]["open_loop"]
    p99 = [s["latency"]["p99_ms"] for s in loop["series"] if s["latency"]["count"]]
    return loop, loop["latency"], p99, report["http"][0].get("audit", {})

for build in ("before", "after"):
    folder = os.path.join(here, f"day-of-keys-10m-{build}")
    runs = gc_runs(os.path.join(folder, "version-gc-trace.log"))
    print(f"## {build}")
    for name in ("empty-peak", "steady", "peak"):
        loop, lat, p99, audit = step(os.path.join(folder, f"{name}.json"))
        series = loop["series"]
        first = step_start(folder, name)
        last = first + len(series)
        print(f"{name}: achieved {loop['achieved_rate_per_s']:.0f}/s, p50 {lat['p50_ms']:.2f} p99 {lat['p99_ms']:.2f} "
              f"p99.9 {lat['p999_ms']:.1f} max {lat['max_ms']:.0f} ms, lost {audit.get('lost', '?')}")
        inside = [run for run in runs if first <= run[0] < last]
        deleting = [run for run in inside if run[2]]
        held = sorted(run[1] * 1000 for run in inside)
        print(f"  GC runs {len(inside)}, {len(deleting)} deleted tables; lock held: median {held[len(held) // 2]:.1f} ms, "
              f"max {held[-1]:.1f} ms" if held else "  no GC runs")
        for start, took, deleted in deleting:
            second = int(start - first)
            around = [round(s["latency"]["p99_ms"]) for s in series[max(0, second - 2):second + 3] if s["latency"]["count"]]
            print("  %s held %.1f ms, %d tables deleted; p99 of the seconds around it: %s ms" % (
                datetime.datetime.fromtimestamp(start, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:12],
                took * 1000, deleted, around))
        print(f"  seconds with p99 over 50 ms: {sum(1 for v in p99 if v > 50)}, over 250 ms: {sum(1 for v in p99 if v > 250)}"
              f"; worst {max(p99):.0f} ms")
    print()

print("## the empty store at 2,000/s for 60 s")
for pair in (1, 2):
    for build in ("before", "after"):
        _, lat, p99, _ = step(os.path.join(here, f"peak-empty-{build}-{pair}.json"))
        print(f"pair {pair} {build}: p50 {lat['p50_ms']:.2f} p99 {lat['p99_ms']:.2f} p99.9 {lat['p999_ms']:.1f} ms; "
              f"seconds with p99 over 10 ms: {sum(1 for v in p99 if v > 10)} of {len(p99)}")
