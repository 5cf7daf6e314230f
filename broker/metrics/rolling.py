"""Writing the hourly rollup of the seconds waited by reason (PendingSecondsRollup): each whole hour once
it is safely past, with the scrape's own walk over the history, so a rolled-up hour holds exactly what
the direct computation counts in it and the scrape walks only the time since.

The rules are the cost rollups' (broker/costs/rolling.py): an hour is rolled up LATE_WRITES after it
ended, as the cycle and the executor stamp their rows with the time they began and commit a moment
later; a periodic task calls catch_up (broker/metrics/tasks.py: Celery beat, or the embedded default's
loop), a bounded number of hours at a time. The scrape reads the whole hours not rolled up yet from the
history itself, so a rollup that lags costs time, never correctness.

What the rollup keeps that the direct computation would not: the seconds of a workload deleted since
(its history cascades away), and of history removed by HISTORY_RETENTION_DAYS. A Prometheus counter
must not go down, so these stay counted.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Min

from broker.costs.rolling import LATE_WRITES
from broker.costs.rollup import HOUR, hour_floor
from broker.metrics import queries
from broker.metrics.models import PendingSecondsProgress, PendingSecondsRollup
from broker.workloads.models import ExplanationChange

# One batch walks every workload with history after its first hour, so a day costs about what one hour
# costs: at 100k devices (40,000 changes) about a second, and a month catches up in 30 batches.
HOURS_PER_BATCH = 24
# Batches of one periodic run (broker/metrics/tasks.py): a week of history.
BATCHES_PER_RUN = 7


def catch_up(now, batches=1):
    """Roll up the hours that ended at least LATE_WRITES before `now` and are not rolled up yet, at most
    `batches` x HOURS_PER_BATCH of them; returns how many hours were rolled up."""
    target = hour_floor(now - LATE_WRITES)
    done = 0
    for _ in range(batches):
        hours = _one_batch(target, now)
        done += hours
        if hours < HOURS_PER_BATCH:
            break
    return done


def _one_batch(target, now):
    row = PendingSecondsProgress.ROW
    with transaction.atomic():
        if not PendingSecondsProgress.objects.filter(pk=row).exists():
            PendingSecondsProgress.objects.get_or_create(pk=row, defaults={"until": _start(target)})
        # Locked: two processes catching up at once would write an hour twice.
        progress = PendingSecondsProgress.objects.select_for_update().get(pk=row)
        if progress.until >= target:
            return 0
        end = min(target, progress.until + HOURS_PER_BATCH * HOUR)
        roll(progress.until, end, now)
        hours = (end - progress.until) // HOUR
        progress.until = end
        progress.save(update_fields=["until"])
    return hours


def _start(target):
    """The hour of the first explanation change; with none yet, `target` (every later one is after it)."""
    first = ExplanationChange.objects.aggregate(at=Min("at"))["at"]
    return target if first is None else min(hour_floor(first), target)


def roll(start, end, now):
    totals = queries.pending_us_by_hour(now, start, end)
    PendingSecondsRollup.objects.bulk_create(
        PendingSecondsRollup(hour=hour, reason=reason, team_id=team, resource_class_id=resource_class, us=us)
        for (hour, reason, team, resource_class), us in totals.items()
    )


def forget():
    """Drop the rollup: the next catch_up starts again from the first change (a restart from empty)."""
    with transaction.atomic():
        PendingSecondsRollup.objects.all().delete()
        PendingSecondsProgress.objects.all().delete()
