"""How fast this machine runs Python like the decision core's, measured inside the bench run, so reports
from different machines (and the start and end of one noisy run) can be compared: these machines differ
by a factor of two from one session to the next, which no absolute target survives.

The reference workload is fixed: small objects with __slots__, dict lookups by string key, counters,
small tuples and a sort, about as the cycle spends its time. Its CPU time is taken as the best of a few
runs. Steal is the share of CPU time the hypervisor gave to other guests while the bench ran."""

from __future__ import annotations

import time


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
