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

# overload-and-steady.sh: the overload profile's goodput per phase, and the
# design-peak run's rate, latency and lost intents.
print()
for number, order in [(1, "fifo"), (2, "adaptive-lifo"), (3, "adaptive-lifo"), (4, "fifo")]:
    overload = json.load(open(f"overload-embedded-{order}-{number}.json"))["http"][0]["overload"]
    print("| overload, embedded, co-located | %s (%d) | %s | %s |" % (
        order, number,
        " / ".join("{:,.0f} ({:.0%})".format(p["goodput_per_s"], p["goodput_share_of_capacity"]) for p in overload["phases"]),
        "{:,}".format(sum(p["lost"] for p in overload["phases"])),
    ))
print()
for number, order in [(1, "fifo"), (2, "adaptive-lifo"), (3, "adaptive-lifo"), (4, "fifo")]:
    run = json.load(open(f"steady-embedded-{order}-{number}.json"))["http"][0]
    latency = run["open_loop"]["latency"]
    print("| 2,000/s for 60 s, embedded, co-located | %s (%d) | %s/s | %.1f / %.0f / %.0f ms | %s |" % (
        order, number, "{:,.0f}".format(run["open_loop"]["achieved_rate_per_s"]),
        latency["p50_ms"], latency["p99_ms"], latency["p999_ms"], "{:,}".format(run["audit"]["lost"]),
    ))
