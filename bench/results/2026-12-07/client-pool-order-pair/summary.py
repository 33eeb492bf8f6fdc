#!/usr/bin/env python3
"""The table of BENCHMARKS.md's "The client's pool order" from this folder's
JSON: per run, goodput per phase, admitted p99 in the trigger and after, the
time back to 95 % goodput and p99 <= 50 ms, wasted work over the whole run
and averaged over the trigger's seconds, and the lost intents. Run here."""
import json

runs = [
    ("embedded, co-located (1x = 2,000/s)", ""),
    ("embedded, split (1x = 1,000/s)", "-split"),
    ("redis, co-located (1x = 2,000/s)", ""),
    ("postgres, split (1x = 1,000/s)", "-split"),
]
for title, suffix in runs:
    kind = title.split(",")[0]
    for number, order in [(1, "fifo"), (2, "adaptive-lifo"), (3, "adaptive-lifo"), (4, "fifo")]:
        overload = json.load(open(f"{kind}-{order}-{number}{suffix}.json"))["http"][0]["overload"]
        phases = overload["phases"]
        one_x = phases[0]["offered_per_s"]
        trigger = [s["wasted_work_share"] for s in overload["seconds"]
                   if s["offered_per_s"] > 1.5 * one_x and s["wasted_work_share"] is not None]
        recovered = overload["recovered_s"]
        print("| %s | %s (%d) | %s | %.0f / %.1f ms | %s | %.1f %% (%.1f %%) | %s |" % (
            title, order, number,
            " / ".join("{:,.0f}".format(phase["goodput_per_s"]) for phase in phases),
            phases[1]["admitted_p99_ms"], phases[2]["admitted_p99_ms"],
            "not within the 30 s after" if recovered is None else "%d s" % recovered,
            100 * overload["wasted_work_share"], 100 * sum(trigger) / len(trigger),
            "{:,}".format(sum(phase["lost"] for phase in phases)),
        ))
