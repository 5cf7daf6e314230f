"""Writing the hourly rollups (rollup.py): each whole hour once it is safely past, with the reports' own
direct code, so a rolled-up hour holds exactly what a direct report would compute for it.

An hour is rolled up only LATE_WRITES after it ended: a cycle or an executor step stamps its rows with
the time it began, and commits a moment later. A periodic task calls catch_up (broker/costs/tasks.py:
Celery beat every ROLLUP_INTERVAL_SECONDS, or the embedded default's loop), off the cycle's path: at
100k devices an hour of the cost of pending takes seconds to roll up. A report reads the whole hours
not rolled up yet from the history itself, so a rollup that lags costs time, never correctness.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Min

from broker.costs import checkpoint, pending, report, rollup
from broker.costs.models import (
    CapacitySample,
    Checkpoint,
    CheckpointOpen,
    CostCheckpointRow,
    PendingCheckpointRow,
    RollupProgress,
)
from broker.costs.prices import price_timelines
from broker.costs.windows import to_us
from broker.workloads.models import Allocation, Workload

LATE_WRITES = timedelta(minutes=5)
# Hours rolled up in one transaction: on the bench's database (100k devices, 20k waiting) six hours
# took 0.4 s for the bill and 2.8 s for the cost of pending (one hour 2.5 s: its 40,000 workloads'
# histories dominate).
HOURS_PER_BATCH = 6
# Batches of one periodic run (broker/costs/tasks.py): two days of history, well under a minute at
# that size; a month catches up in 15 runs, and a running broker has one new hour an hour.
BATCHES_PER_RUN = 8


def catch_up(now, batches=1):
    """Roll up the hours that ended at least LATE_WRITES before `now` and are not rolled up yet, at most
    `batches` x HOURS_PER_BATCH of each kind; returns {kind: hours rolled up}."""
    target = rollup.hour_floor(now - LATE_WRITES)
    done = {}
    for name, first, roll in (
        (rollup.COSTS, first_cost_moment, roll_costs),
        (rollup.PENDING, first_pending_moment, roll_pending),
    ):
        done[name] = 0
        for _ in range(batches):
            hours = _one_batch(name, first, roll, target, now)
            done[name] += hours
            if hours < HOURS_PER_BATCH:
                break
    return done


def _one_batch(name, first, roll, target, now):
    with transaction.atomic():
        if not RollupProgress.objects.filter(name=name).exists():
            RollupProgress.objects.get_or_create(name=name, defaults={"until": _start(first(), target)})
        # Locked: two processes catching up at once would write an hour twice.
        progress = RollupProgress.objects.select_for_update().get(name=name)
        if progress.until >= target:
            return 0
        end = min(target, progress.until + HOURS_PER_BATCH * rollup.HOUR)
        roll(progress.until, end, now)
        hours = (end - progress.until) // rollup.HOUR
        progress.until = end
        progress.save(update_fields=["until"])
    return hours


def _start(first, target):
    """Where a kind's rollup begins: the hour of its first row; with nothing yet, `target` (every
    later row is stamped after it)."""
    return target if first is None else min(rollup.hour_floor(first), target)


def first_cost_moment():
    moments = [
        Allocation.objects.aggregate(at=Min("allocated_at"))["at"],
        CapacitySample.objects.aggregate(at=Min("at"))["at"],
    ]
    moments = [moment for moment in moments if moment is not None]
    return min(moments) if moments else None


def first_pending_moment():
    return Workload.objects.aggregate(at=Min("submitted_at"))["at"]


def _hours(start, end):
    steps, cursor = [], start
    while cursor < end:
        steps.append((cursor, cursor + rollup.HOUR))
        cursor += rollup.HOUR
    return steps


def _prices():
    return {pk: [(to_us(at), units) for at, units in rows] for pk, rows in price_timelines().items()}


def roll_costs(start, end, now):
    steps = _hours(start, end)
    ledgers, meta = report.direct_ledger(steps, now, _prices(), grouped=True)
    groups = {line: row["group"] for line, row in meta.items() if "group" in row}
    for (hour, _), step_ledger in zip(steps, ledgers, strict=True):
        rollup.write_costs(hour, step_ledger, groups)


def roll_pending(start, end, now):
    steps = _hours(start, end)
    ledgers, _ = pending.direct_ledger(steps, now, _prices())
    for (hour, _), step_ledger in zip(steps, ledgers, strict=True):
        rollup.write_pending(hour, step_ledger)


# --- the checkpoint inside the current hour (checkpoint.py) -------------------------------------------------


def take_checkpoint(now, until=None):
    """Store the amounts from each kind's hourly `until` to `until` (default checkpoint.safe_until(now)) and
    what is open then, replacing the last checkpoint; returns {kind: the checkpoint's until, or None when
    there is nothing after the hourly rollup yet}. Run after catch_up, off the cycle's path: at 100k devices
    it reads what a report used to read on every request (about a second of the cost of pending)."""
    done = {}
    for name, write in ((rollup.COSTS, _checkpoint_costs), (rollup.PENDING, _checkpoint_pending)):
        with transaction.atomic():
            # Locked: catch_up moves the base, and two processes would write the rows twice.
            progress = RollupProgress.objects.select_for_update().filter(name=name).first()
            at = until or checkpoint.safe_until(now, LATE_WRITES)
            CheckpointOpen.objects.filter(kind=name).delete()
            {rollup.COSTS: CostCheckpointRow, rollup.PENDING: PendingCheckpointRow}[name].objects.all().delete()
            if progress is None or at <= progress.until:
                Checkpoint.objects.filter(name=name).delete()
                done[name] = None
                continue
            checkpoint.replace(name, progress.until, at, write(progress.until, at))
            done[name] = at
    return done


def _partial_hours(start, end):
    """[(hour, hour + 1 h clipped to end)] from the whole hour `start` to `end`."""
    return [(a, min(b, end)) for a, b in _hours(start, rollup.hour_ceil(end))]


def _checkpoint_costs(base, until):
    steps = _partial_hours(base, until)
    ledgers, meta, intervals = report.direct_intervals_ledger(steps, until, _prices(), grouped=True)
    for (hour, _), step_ledger in zip(steps, ledgers, strict=True):
        rollup.write_costs(hour, step_ledger, {}, CostCheckpointRow)
    held = {}
    for interval in intervals:
        if interval.end is None:  # held at `until` (the ledger bills it up to there)
            _, team_id, queue_id, resource_class_id = interval.line
            key = (interval.device_class, team_id, queue_id, resource_class_id, "")
            held[key] = held.get(key, 0) + interval.devices
    return held


def _checkpoint_pending(base, until):
    steps = _partial_hours(base, until)
    ledgers, _, intervals = pending.direct_intervals_ledger(steps, until, _prices())
    for (hour, _), step_ledger in zip(steps, ledgers, strict=True):
        rollup.write_pending(hour, step_ledger, PendingCheckpointRow)
    waiting = {}
    for interval in intervals:
        if interval.end is None:  # waiting at `until`
            (_, team_id, queue_id), reason = interval.line
            key = (interval.device_class, team_id, queue_id, None, reason)
            waiting[key] = waiting.get(key, 0) + interval.devices
    return waiting
