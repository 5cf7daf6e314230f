"""The cycle after one device goes unhealthy, at 100k devices / 20k pending, against a steady one.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/inventory_change.py [ROUNDS]

Fills a scratch database (dropped at the end) with the cycle section's largest cluster, runs the first
cycle and two more, then ROUNDS times: a steady cycle, one device marked Unhealthy by a queryset update
(what a health probe does), a cycle. Prints the phases of both as JSON lists, one entry per round.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cycle, db, run  # noqa: E402

SCRATCH_DB = "inv_scratch"
PHASES = ("load_ms", "decide_ms", "commit_ms", "run_once_wall_ms")


def measure(rounds: int) -> dict:
    from broker.inventory.models import Device, Health

    cycle.prepare(12_500, 20_000)
    cycle.warm_up()
    cycle.one_cycle()
    cycle.one_cycle()
    cycle.one_cycle()
    out = {f"{kind}_{phase}": [] for kind in ("steady", "after_health_change") for phase in PHASES}
    device_pks = Device.objects.order_by("pk").values_list("pk", flat=True)[::997][:rounds]
    for pk in device_pks:
        steady = cycle.one_cycle()
        Device.objects.filter(pk=pk).update(health=Health.UNHEALTHY)
        changed = cycle.one_cycle()
        for phase in PHASES:
            out[f"steady_{phase}"].append(steady[phase])
            out[f"after_health_change_{phase}"].append(changed[phase])
    return out


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    run.configure_environment()
    server = db.server_url()
    db.prepare_environment(SCRATCH_DB)
    try:
        import django

        django.setup()
        db.migrate()
        print(json.dumps(measure(rounds)))
    finally:
        from django.db import connections

        connections.close_all()
        db.drop(SCRATCH_DB, url=server)
        os.environ["DATABASE_URL"] = server


if __name__ == "__main__":
    main()
