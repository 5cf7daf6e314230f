"""Celery tasks of the metrics app: the seconds-by-reason rollup's catch-up and then a new checkpoint of
the history-walking figures (broker/metrics/checkpoint.py), which beat runs every ROLLUP_INTERVAL_SECONDS
(the embedded default's loop calls it as often)."""

import logging

from celery import shared_task
from django.utils import timezone

from broker.metrics import checkpoint, rolling

log = logging.getLogger(__name__)


@shared_task(name="broker.metrics.tasks.roll_up", ignore_result=True)
def roll_up():
    """Roll up the whole hours of waiting not rolled up yet, at most rolling.BATCHES_PER_RUN batches,
    then take a new checkpoint of the history-walking figures; returns how many hours."""
    hours = rolling.catch_up(timezone.now(), batches=rolling.BATCHES_PER_RUN)
    if hours:
        log.info("pending seconds rollup: %s h", hours)
    checkpoint.take(timezone.now())
    return hours
