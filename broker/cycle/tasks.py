"""Celery tasks: the scheduling cycle, the executor, the demo replay and the daily retention (beat runs them)."""

import logging

from celery import shared_task
from django.utils import timezone

from broker.cycle.executor import get_executor
from broker.cycle.runner import run_once

log = logging.getLogger(__name__)


@shared_task(name="broker.cycle.tasks.run_cycle", ignore_result=True)
def run_cycle(reason=""):
    """One cycle; when another worker holds the lock this one has nothing to do."""
    run = run_once()
    if run is None:
        log.debug("cycle skipped (%s): another cycle is running", reason or "periodic")
        return None
    return {"cycle": run.cycle_id, "outcome": run.outcome, "admitted": len(run.admitted)}


@shared_task(name="broker.cycle.tasks.advance_executor", ignore_result=True)
def advance_executor():
    progress = get_executor().advance(timezone.now())
    return {"started": len(progress.started), "completed": len(progress.completed)}


@shared_task(name="broker.cycle.tasks.replay_tick", ignore_result=True)
def replay_tick():
    from broker.cycle.replay import PhillyReplay

    return PhillyReplay.resume().tick(timezone.now())


@shared_task(name="broker.cycle.tasks.prune_history", ignore_result=True)
def prune_history():
    """The daily retention pass (CYCLE_RETENTION_DAYS, HISTORY_RETENTION_DAYS)."""
    from broker.cycle import retention

    counts = retention.prune_history(timezone.now())
    log.info("retention: %s", ", ".join(f"{name} {count}" for name, count in counts.items()))
    return counts
