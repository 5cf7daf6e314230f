"""How fast this machine runs Python like the decision core's, measured inside the bench run, so reports
from different machines (and the start and end of one noisy run) can be compared: these machines differ
by a factor of two from one day to the next, which no absolute target survives.

The reference workload is fixed: small objects with __slots__, dict lookups by string key, counters,
small tuples and a sort, about as the cycle spends its time. Its CPU time is taken as the best of a few
runs. Steal is the share of CPU time the hypervisor gave to other guests while the bench ran.

The bench reads it in a fresh interpreter (`fresh_reference_seconds`): inside the bench process, after
Django's migrations or a few 100k-device cycles, the same workload took 1.5-2.2x as long as in a new
process at the same moment, with the collector off too (its objects land in the holes that the freed ones
left across a large heap, not in fresh memory). That reading measured the bench's own heap and was taken
for the machine's speed in the reports made before commit ada71a8 (2026-12-01)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


class _Record:
    __slots__ = ("key", "node", "count", "holder")

    def __init__(self, key: str, node: int):
        self.key = key
        self.node = node
        self.count = 0
        self.holder = None


def reference_workload() -> int:
    records = [_Record(f"n{index // 8}/{index % 8}", index // 8) for index in range(60_000)]
    by_key = {record.key: record for record in records}
    per_node = [0] * 7_500
    for round_number in range(4):
        for index in range(0, 60_000, 3):
            record = by_key[f"n{index // 8}/{index % 8}"]
            if record.count <= round_number:
                record.count += 1
                record.holder = (round_number, record.node)
                per_node[record.node] += 1
    ordered = sorted(records, key=lambda record: (-record.count, record.node, record.key))
    return sum(per_node) + ordered[0].node


def reference_seconds(repeat: int = 5) -> float:
    """CPU seconds of one reference workload, the best of `repeat`."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        reference_workload()
        best = min(best, time.process_time() - started)
    return round(best, 4)


def fresh_reference_seconds(repeat: int = 5) -> float:
    """`reference_seconds(repeat)` measured in a new interpreter: the machine's speed right now, whatever
    the calling process's heap looks like."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.machine_speed", "--repeat", str(repeat)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return float(completed.stdout)


def cpu_times() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot, or None where /proc/stat is not there."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(value) for value in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_percent(since: tuple[int, int] | None) -> float | None:
    now = cpu_times()
    if since is None or now is None or now[1] <= since[1]:
        return None
    return round(100 * (now[0] - since[0]) / (now[1] - since[1]), 1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="CPU seconds of the reference workload, the best of --repeat")
    parser.add_argument("--repeat", type=int, default=5)
    print(reference_seconds(parser.parse_args().repeat))
