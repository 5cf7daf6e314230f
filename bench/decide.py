"""Section "decide": the pure core's decision time and memory on synthetic clusters.

Each case runs in a fresh interpreter (`python -m bench.decide NODES PENDING REPEAT`) so its peak
resident memory is its own. Snapshots come from broker.scheduler.synthetic with gang sizes drawn from
the real Philly trace (bench.bench_decide.philly_sizes on settings.TRACES_DIR), exactly as
bench/bench_decide.py builds them. Reported: best and median of REPEAT timed decide() calls, then one
more call under tracemalloc for the peak Python memory decide() itself allocates (not timed: tracing
slows it down), and the process's peak RSS.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ((125, 1_000), (1_250, 10_000), (12_500, 20_000))
QUICK_CASES = ((125, 1_000), (1_250, 1_000))
TARGET_SECONDS = 0.5  # at 100k devices / 20k pending (issue 3)
DEVICES_PER_NODE = 8


def philly_path() -> Path:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    from django.conf import settings

    return Path(settings.TRACES_DIR) / "philly" / "philly.csv"


def measure(nodes: int, pending: int, repeat: int, seed: int = 1) -> dict:
    from bench.bench_decide import philly_sizes
    from broker.scheduler.cycle import decide
    from broker.scheduler.synthetic import synthetic_snapshot

    sizes = philly_sizes(philly_path())
    started = time.perf_counter()
    snapshot = synthetic_snapshot(
        nodes=nodes, devices_per_node=DEVICES_PER_NODE, pending=pending, seed=seed, sizes=sizes
    )
    build_seconds = time.perf_counter() - started
    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    timings = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = decide(snapshot)
        timings.append(time.perf_counter() - started)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    del result
    gc.collect()
    tracemalloc.start()
    result = decide(snapshot)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    reasons = Counter(decision.reason for decision in result.pending)
    return {
        "nodes": nodes,
        "devices": len(snapshot.devices),
        "pending": pending,
        "running": len(snapshot.running),
        "gang_sizes": "philly.csv num_gpus" if sizes else "built-in Philly mix",
        "snapshot_build_seconds": round(build_seconds, 3),
        "repeat": repeat,
        "decide_seconds": [round(t, 4) for t in timings],
        "decide_seconds_best": round(min(timings), 4),
        "decide_seconds_median": round(statistics.median(timings), 4),
        "tracemalloc_peak_mb": round(peak / 2**20, 1),
        "max_rss_mb_before_decide": round(rss_before / 1024, 1),
        "max_rss_mb_after_decide": round(rss_after / 1024, 1),
        "admitted": len(result.admissions),
        "preemptions": len(result.preemptions),
        "pending_reasons": dict(sorted(reasons.items())),
    }


def run_case(nodes: int, pending: int, repeat: int, timeout: float = 900) -> dict:
    """One case in a fresh interpreter."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.decide", str(nodes), str(pending), str(repeat)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if completed.returncode != 0:
        return {"nodes": nodes, "pending": pending, "error": completed.stderr.strip().splitlines()[-5:]}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def section(quick: bool, repeat: int | None = None) -> dict:
    repeat = repeat or (2 if quick else 3)
    cases = [run_case(nodes, pending, repeat) for nodes, pending in (QUICK_CASES if quick else CASES)]
    by_size = {(c["nodes"], c["pending"]): c for c in cases if "error" not in c}
    largest = by_size.get(CASES[-1])
    ratios = {}
    if largest and by_size.get(CASES[1]):
        ratios["decide_100k_20k_over_10k_10k"] = round(
            largest["decide_seconds_median"] / by_size[CASES[1]]["decide_seconds_median"], 2
        )
    if len(by_size) >= 2:
        small, big = cases[0], cases[-1]
        if "error" not in small and "error" not in big:
            ratios["largest_over_smallest"] = round(big["decide_seconds_median"] / small["decide_seconds_median"], 2)
    target = {
        "what": "decide() median at 100,000 devices (12,500 nodes x 8) with 20,000 pending",
        "seconds": TARGET_SECONDS,
    }
    if largest:
        target["measured_seconds"] = largest["decide_seconds_median"]
        target["pass"] = largest["decide_seconds_median"] <= TARGET_SECONDS
    else:
        target["pass"] = None  # not measured (quick run, or the case failed)
    for case in cases:
        if "error" not in case:
            case["within_target"] = case["decide_seconds_median"] <= TARGET_SECONDS
    return {"cases": cases, "ratios": ratios, "target": target}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    nodes, pending, repeat = (int(arg) for arg in sys.argv[1:4])
    print(json.dumps(measure(nodes, pending, repeat)))
