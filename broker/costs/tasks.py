"""Celery tasks of the costs app: the hourly rollups' catch-up and the checkpoint after them, which beat
runs every ROLLUP_INTERVAL_SECONDS (the embedded default's loop calls it as often)."""

import logging

from celery import shared_task
from django.utils import timezone

from broker.costs import rolling

log = logging.getLogger(__name__)


@shared_task(name="broker.costs.tasks.roll_up", ignore_result=True)
def roll_up():
    """Roll up the bill's and the cost of pending's whole hours not rolled up yet, at most
    rolling.BATCHES_PER_RUN batches of each, then take the checkpoint after them (checkpoint.py);
    returns {kind: hours rolled up}."""
    done = rolling.catch_up(timezone.now(), batches=rolling.BATCHES_PER_RUN)
    if any(done.values()):
        log.info("cost rollups: %s", ", ".join(f"{kind} {hours} h" for kind, hours in done.items()))
    rolling.take_checkpoint(timezone.now())
    return done
