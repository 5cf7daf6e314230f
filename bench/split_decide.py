"""Where decide() spends its time, phase by phase (no profiler overhead):
.venv/bin/python bench/split_decide.py NODES PENDING"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_decide import philly_sizes  # noqa: E402
from broker.scheduler import cycle as cycle_module  # noqa: E402
from broker.scheduler import explanation  # noqa: E402
from broker.scheduler.capacity import CapacityState  # noqa: E402
from broker.scheduler.synthetic import synthetic_snapshot  # noqa: E402

if __name__ == "__main__":
    nodes, pending = int(sys.argv[1]), int(sys.argv[2])
    snapshot = synthetic_snapshot(
        nodes=nodes, pending=pending, sizes=philly_sizes(), seed=int(sys.argv[3]) if len(sys.argv) > 3 else 1
    )
    spent = {}

    def timed(name, function):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - started

        return wrapper

    CapacityState.__init__ = timed("index", CapacityState.__init__)
    explanation.explain_all = timed("explain", explanation.explain_all)
    explanation.estimate.estimated_starts = timed("estimate", explanation.estimate.estimated_starts)
    cycle_module.preemption.find_victims = timed("preemption", cycle_module.preemption.find_victims)
    cycle_module.backfill.plan_protection = timed("backfill", cycle_module.backfill.plan_protection)
    started = time.perf_counter()
    result = cycle_module.decide(snapshot)
    total = time.perf_counter() - started
    print(f"total {total:.3f}s admitted {len(result.admissions)} pending {len(result.pending)}")
    for name, seconds in spent.items():
        print(f"  {name:<12} {seconds:.3f}s")
