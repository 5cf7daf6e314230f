"""Profile one decide() call on a synthetic cluster: .venv/bin/python bench/profile_decide.py NODES PENDING"""

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_decide import philly_sizes  # noqa: E402
from broker.scheduler.cycle import decide  # noqa: E402
from broker.scheduler.synthetic import synthetic_snapshot  # noqa: E402

if __name__ == "__main__":
    nodes, pending = int(sys.argv[1]), int(sys.argv[2])
    snapshot = synthetic_snapshot(nodes=nodes, pending=pending, sizes=philly_sizes())
    started = time.perf_counter()
    decide(snapshot)
    print(f"decide: {time.perf_counter() - started:.3f}s")
    if "--profile" in sys.argv:
        profile = cProfile.Profile()
        profile.runcall(decide, snapshot)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(35)
