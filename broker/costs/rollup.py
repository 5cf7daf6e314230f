"""Hourly rollups of the cost ledgers: the exact amounts of every whole past hour, summed per group, so a
report over a month reads ~720 rows per group instead of every allocation, sample and transition.

A report splits its window into the whole hours the rollup covers and the rest (the partial hours at
its edges and the hours not rolled up yet), computes the rest directly and adds the rollup's amounts to
the same steps. The amounts are exact (integers, or with shares of shared devices Fractions in
millionths, stored as whole units plus millionths) and the ledger splits at every hour boundary anyway, so
the sum is the direct ledger's to the microsecond, and the one rounding (ledger.py) sees the same
figures: the reports come out identical.

Rows carry ids; the reading side gives each group a line of its own (GROUP, team, queue, resource
class) with the names a workload's line would have, so the reports aggregate them as they do workloads.
A report by workload cannot use them: it is always computed directly.

This module stores and reads; broker/costs/rolling.py writes the rows (it computes them with the
reports' own direct code, which imports this module).
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import UTC, timedelta

from django.db.models import Sum
from django.db.models.functions import Trunc

from broker.costs import ledger
from broker.costs.models import CostRollup, PendingRollup, RollupProgress
from broker.costs.windows import to_us
from broker.policy.models import Queue, ResourceClass, Team

HOUR = timedelta(hours=1)
COSTS, PENDING = "costs", "pending"
GROUP = "group"  # first item of a rolled-up group's line: workload lines are ids, never tuples
NONE_LABEL = "(none)"  # a workload without a resource class (or cost label) is reported under this
RAW_SPLIT = 40  # raw = high << RAW_SPLIT | low: a sum of a month's lows stays far below 2^63


def hour_floor(moment):
    return moment.replace(minute=0, second=0, microsecond=0)


def hour_ceil(moment):
    floor = hour_floor(moment)
    return floor if floor == moment else floor + HOUR


def split_raw(raw):
    return raw >> RAW_SPLIT, raw & ((1 << RAW_SPLIT) - 1)


def rolled_until(name):
    return RollupProgress.objects.filter(name=name).values_list("until", flat=True).first()


def covered(name, start, end, now):
    """(a, b): the whole hours of [start, min(end, now)) the rollup `name` covers, or None."""
    until = rolled_until(name)
    if until is None:
        return None
    a, b = hour_ceil(start), min(until, hour_floor(min(end, now)))
    return (a, b) if a < b else None


def direct_pieces(start, end, span):
    """[(p, q)]: what of [start, end) is left to compute directly around the rolled-up `span`."""
    if span is None:
        return [(start, end)]
    a, b = span
    return [(p, q) for p, q in ((start, a), (b, end)) if p < q]


def clip_steps(steps, p, q):
    """The report's steps cut to [p, q), as (index of the step, (start, end))."""
    return [(i, (max(s, p), min(e, q))) for i, (s, e) in enumerate(steps) if max(s, p) < min(e, q)]


def merge(into, piece):
    """Add the exact amounts of the StepLedger `piece` to `into`."""
    for target, source in ((into.allocated, piece.allocated), (into.capacity, piece.capacity)):
        for key, amount in source.items():
            known = target[key]
            known.device_us += amount.device_us
            known.raw += amount.raw


def stitch(ledgers, steps, start, end, span, usable, add_checkpoint, tail, direct, add_span):
    """Fill `ledgers` (one StepLedger per step of `steps`) with [start, end) and return its lines' names:
    the rollup's whole hours `span` (add_span(span)) and, in each piece around them, the checkpoint's
    stretch where `usable(p, q)` finds one (add_checkpoint(found)) followed by its tail (tail(windows,
    found)), else the piece computed directly (direct(windows)). What each of them returns is a
    {line: names} dict; the tail and the direct piece give one StepLedger per window too."""
    meta = {}
    for p, q in direct_pieces(start, end, span):
        found = usable(p, q)
        if found is not None:
            meta.update(add_checkpoint(found))
            p = found.until
        clipped = clip_steps(steps, p, q)
        if not clipped:
            continue
        windows = [window for _, window in clipped]
        piece, piece_meta = tail(windows, found) if found is not None else direct(windows)
        for (index, _), piece_ledger in zip(clipped, piece, strict=True):
            merge(ledgers[index], piece_ledger)
        meta.update(piece_meta)
    if span is not None:
        meta.update(add_span(span))
    return meta


def _bucketed(model, span, step, step_starts, keys, **filters):
    """Rows of `model` in the hours of `span`, summed per step of the report and `keys`:
    [(step index, {key: value}, Amount)]."""
    rows = (
        model.objects.filter(hour__gte=span[0], hour__lt=span[1], **filters)
        .annotate(bucket=Trunc("hour", step, tzinfo=UTC))
        .values("bucket", *keys)
        .annotate(
            us=Sum("device_us"),
            high=Sum("raw_high"),
            low=Sum("raw_low"),
            us_millionths=Sum("device_us_millionths"),
            raw_millionths=Sum("raw_millionths"),
        )
        .order_by()
    )
    out = []
    for row in rows:
        # The first step starts at the window's start, inside its calendar step: its bucket is before it.
        index = max(0, bisect_right(step_starts, to_us(row["bucket"])) - 1)
        device_us = ledger.from_millionths(row["us"], row["us_millionths"])
        raw = ledger.from_millionths((row["high"] << RAW_SPLIT) + row["low"], row["raw_millionths"])
        out.append((index, row, ledger.Amount(device_us, raw)))
    return out


def add_costs(ledgers, span, step, names, model=CostRollup):
    """Add the capacity rollup of `span` to the report's StepLedgers; returns {group line: names} for
    the allocated groups. `names`: team, queue and resource class names by id (see group_names).
    `model`: CostRollup, or CostCheckpointRow for the stretch after it (broker/costs/checkpoint.py)."""
    meta = {}
    keys = ("category", "device_class_id", "team_id", "queue_id", "resource_class_id", "reserved_team")
    for index, row, amount in _bucketed(model, span, step, [s.start for s in ledgers], keys):
        if row["category"] == "allocated":
            line = (GROUP, row["team_id"], row["queue_id"], row["resource_class_id"])
            meta.setdefault(line, names.allocated_meta(*line[1:]))
            target = ledgers[index].allocated[(line, row["device_class_id"])]
        else:
            team = row["reserved_team"] or None
            target = ledgers[index].capacity[(row["category"], row["device_class_id"], team)]
        target.device_us += amount.device_us
        target.raw += amount.raw
    return meta


def add_pending(ledgers, span, step, names, team_ids=None, model=PendingRollup):
    """Add the pending rollup of `span` to the pending report's StepLedgers; returns {group: names}.
    `model`: PendingRollup, or PendingCheckpointRow for the stretch after it."""
    meta = {}
    filters = {} if team_ids is None else {"team_id__in": team_ids}
    keys = ("device_class_id", "team_id", "queue_id", "reason")
    for index, row, amount in _bucketed(model, span, step, [s.start for s in ledgers], keys, **filters):
        group = (GROUP, row["team_id"], row["queue_id"])
        meta.setdefault(group, names.pending_meta(*group[1:]))
        target = ledgers[index].allocated[((group, row["reason"]), row["device_class_id"])]
        target.device_us += amount.device_us
        target.raw += amount.raw
    return meta


def write_costs(hour, step_ledger, workload_groups, model=CostRollup):
    """CostRollup rows (or `model`'s) of one hour from its StepLedger, whose lines are workload ids or
    GROUP lines; `workload_groups`: {workload id: (team id, queue id, resource class id)}."""
    sums = {}
    for (line, class_id), amount in step_ledger.allocated.items():
        group = line[1:] if isinstance(line, tuple) else workload_groups[line]
        key = ("allocated", class_id, *group, "")
        _add(sums, key, amount)
    for (category, class_id, team), amount in step_ledger.capacity.items():
        _add(sums, (category, class_id, None, None, None, team or ""), amount)
    model.objects.bulk_create(
        model(
            hour=hour,
            category=category,
            device_class_id=class_id,
            team_id=team_id,
            queue_id=queue_id,
            resource_class_id=rc_id,
            reserved_team=reserved_team,
            **_amount_fields(amount),
        )
        for (category, class_id, team_id, queue_id, rc_id, reserved_team), amount in sums.items()
    )


def write_pending(hour, step_ledger, model=PendingRollup):
    """PendingRollup rows (or `model`'s) of one hour from its StepLedger, whose lines are (GROUP line,
    reason)."""
    sums = {}
    for ((group, reason), class_id), amount in step_ledger.allocated.items():
        _add(sums, (class_id, *group[1:], reason), amount)
    model.objects.bulk_create(
        model(
            hour=hour, device_class_id=class_id, team_id=team_id, queue_id=queue_id, reason=reason, **_amount_fields(a)
        )
        for (class_id, team_id, queue_id, reason), a in sums.items()
    )


def _add(sums, key, amount):
    known = sums.get(key)
    if known is None:
        known = sums[key] = ledger.Amount()
    known.device_us += amount.device_us
    known.raw += amount.raw


def _amount_fields(amount):
    """The columns of an exact Amount: whole units (raw split in two) plus millionths of a unit, which
    shares of shared devices bring (ledger.py)."""
    device_us, device_us_millionths = ledger.whole_and_millionths(amount.device_us)
    raw, raw_millionths = ledger.whole_and_millionths(amount.raw)
    high, low = split_raw(raw)
    return {
        "device_us": device_us,
        "device_us_millionths": device_us_millionths,
        "raw_high": high,
        "raw_low": low,
        "raw_millionths": raw_millionths,
    }


class GroupNames:
    """The names a group's line shows, as a workload's line of the same group would show them now."""

    def __init__(self):
        self.teams = dict(Team.objects.values_list("pk", "name"))
        self.queues = dict(Queue.objects.values_list("pk", "name"))
        rows = ResourceClass.objects.values_list("pk", "name", "cost_label")
        self.classes = {pk: (name, label) for pk, name, label in rows}

    def allocated_meta(self, team_id, queue_id, resource_class_id):
        name, label = self.classes.get(resource_class_id, (None, None))
        return {
            "name": None,
            "team": self.teams.get(team_id),
            "queue": self.queues.get(queue_id),
            "resource_class": name or NONE_LABEL,
            "cost_label": label or NONE_LABEL,
            "state": None,
        }

    def pending_meta(self, team_id, queue_id):
        return {"name": None, "team__name": self.teams.get(team_id), "queue__name": self.queues.get(queue_id)}
