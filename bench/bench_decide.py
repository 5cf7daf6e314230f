"""Time the pure decision core: decide() on synthetic clusters of 1k / 10k / 100k devices with 1k / 10k /
20k pending gangs of Philly's sizes. Prints a table and writes JSON.

    .venv/bin/python bench/bench_decide.py [--out var/bench/decide.json] [--quick] [--repeat 3]

Pending gang sizes are drawn from the real Philly trace (../shared/data/traces/philly/philly.csv,
column num_gpus) when it is there, else from the built-in Philly mix. Each case reports the best and
median of --repeat runs, plus how the pending workloads were decided (admitted, reason codes).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.scheduler.cycle import decide  # noqa: E402
from broker.scheduler.synthetic import synthetic_snapshot  # noqa: E402

PHILLY = ROOT.parent / "shared" / "data" / "traces" / "philly" / "philly.csv"
# (nodes x 8 devices, pending gangs)
CASES = ((125, 1_000), (1_250, 10_000), (12_500, 20_000))
QUICK_CASES = ((125, 1_000), (1_250, 1_000))


def philly_sizes(path: Path = PHILLY) -> tuple[int, ...] | None:
    """Gang sizes of the real Philly jobs (1..128 GPUs), or None when the trace is not available."""
    if not path.exists():
        return None
    with path.open(newline="") as handle:
        sizes = tuple(int(float(row["num_gpus"])) for row in csv.DictReader(handle) if row.get("num_gpus"))
    usable = tuple(size for size in sizes if size >= 1)
    return usable if usable else None


def required_philly_sizes(path: Path = PHILLY) -> tuple[int, ...]:
    """philly_sizes(path), or an error that names the missing trace: `make bench` reports numbers for
    Philly's gang mix, and a silent fallback to another mix made runs incomparable."""
    sizes = philly_sizes(path)
    if sizes is None:
        raise FileNotFoundError(
            f"no Philly trace at {path}: the benchmarks draw pending gang sizes from its num_gpus column "
            "(../shared/data/traces, or TRACES_DIR)"
        )
    return sizes


def run_case(nodes: int, pending: int, sizes, repeat: int, seed: int = 1) -> dict:
    snapshot = synthetic_snapshot(nodes=nodes, devices_per_node=8, pending=pending, seed=seed, sizes=sizes)
    timings = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = decide(snapshot)
        timings.append(time.perf_counter() - started)
    reasons = Counter(decision.reason for decision in result.pending)
    return {
        "devices": len(snapshot.devices),
        "nodes": nodes,
        "pending": pending,
        "running": len(snapshot.running),
        "decide_seconds_best": round(min(timings), 4),
        "decide_seconds_median": round(statistics.median(timings), 4),
        "admitted": len(result.admissions),
        "preemptions": len(result.preemptions),
        "pending_reasons": dict(sorted(reasons.items())),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "decide.json"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small cases only (a smoke run)")
    args = parser.parse_args(argv)
    sizes = philly_sizes()
    report = {
        "benchmark": "scheduler decide() on synthetic clusters",
        "gang_sizes": "philly.csv num_gpus" if sizes else "built-in Philly mix",
        "cases": [],
    }
    for nodes, pending in QUICK_CASES if args.quick else CASES:
        case = run_case(nodes, pending, sizes, args.repeat)
        report["cases"].append(case)
        print(
            f"{case['devices']:>7} devices {case['pending']:>6} pending: "
            f"decide {case['decide_seconds_best']:.3f}s (median {case['decide_seconds_median']:.3f}s), "
            f"admitted {case['admitted']}, "
            f"preempted {case['preemptions']}, reasons {case['pending_reasons']}",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
