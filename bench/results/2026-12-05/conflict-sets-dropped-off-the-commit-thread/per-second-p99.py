"""Per-second p99 of idem-bench http runs: python3 per-second-p99.py RUN.json..."""
import json
import os
import sys

for path in sys.argv[1:]:
    series = json.load(open(path))["http"][0]["open_loop"]["series"]
    p99 = [second["latency"]["p99_ms"] for second in series]
    highest = [second["latency"]["max_ms"] for second in series]
    median = sorted(p99)[len(p99) // 2]
    print(
        f"{os.path.basename(path)}: median per-second p99 {median:.1f} ms;"
        f" seconds with p99 > 10 ms: {sum(p > 10 for p in p99)}, > 20 ms: {sum(p > 20 for p in p99)};"
        f" with a max > 20 ms: {sum(m > 20 for m in highest)}"
    )
    print("  per-second p99 (ms):", " ".join(f"{p:.0f}" for p in p99))
