#!/usr/bin/env python3
"""One line per run of this folder (its JSON and text outputs): prints summary.txt."""
import glob, json, re

print("run | goodput 1x / trigger / after (per s) | admitted p99 after (ms) | back within | wasted work, whole run (trigger) | lost | server: 503 / 499")
for path in sorted(glob.glob("*-co-located-*.json")):
    run = json.load(open(path))["http"][0]
    overload = run["overload"]
    phases = overload["phases"]
    trigger = [s["wasted_work_share"] for s in overload["seconds"] if s["offered_per_s"] > 2000 and s["wasted_work_share"] is not None]
    text = open(path.replace(".json", ".txt")).read()
    server = lambda label: re.search(label + r"\s+(\d+)\s+(\d+)", text).group(2)
    recovered = overload["recovered_s"]
    print("%s | %s | %.0f | %s | %.1f %% (%.1f %%) | %d | %s / %s" % (
        path[:-5],
        " / ".join("%.0f" % phase["goodput_per_s"] for phase in phases),
        phases[-1]["admitted_p99_ms"],
        "not within the 30 s" if recovered is None else "%d s" % recovered,
        100 * overload["wasted_work_share"],
        100 * sum(trigger) / len(trigger),
        sum(phase["lost"] for phase in phases),
        server(r"unavailable \(503\)"),
        server(r"cancelled by the client \(499\)"),
    ))
