"""Cost reports: load allocation intervals, samples and prices from the database, run the pure ledger,
aggregate and round (ledger.py documents the rounding rule)."""

from __future__ import annotations

import heapq
import json
import os
import re
from bisect import bisect_right
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate
from operator import mul

from django.db import connection, transaction
from django.db.models import BigIntegerField, Case, Count, DateTimeField, F, Q, TextField, Value, When
from django.db.models.functions import Cast
from django.utils import timezone

from broker import clock
from broker.costs import checkpoint, held, ledger, rollup
from broker.costs.models import CapacitySample, CostCheckpointRow
from broker.costs.prices import price_timelines
from broker.costs.windows import from_us, steps_of, to_us
from broker.flat_rows import fetch_rows
from broker.inventory import quantities
from broker.inventory.models import Device
from broker.policy.models import DeviceClass, Team
from broker.scheduler import accounting, heap
from broker.workloads.models import Allocation, Workload

AGGREGATES = ("team", "queue", "resource_class", "cost_label", "workload", "device_class")
UNALLOCATED_CATEGORIES = ("idle", "stranded", "unhealthy", "reserved_unused")
NONE_LABEL = rollup.NONE_LABEL
# The allocation line that sums every key but the `top` costliest (no team, queue or workload name has
# parentheses: they are slugs).
OTHER_LABEL = "(other)"


@dataclass
class Loaded:
    steps: list  # [StepLedger]
    meta: dict  # workload id -> {"name", "team", "queue", "resource_class", "cost_label", "state"}
    class_names: dict  # device class id -> name


# --- loading -------------------------------------------------------------------------------------------------


def load(start, end, step, now=None, by_workload=True):
    """The exact ledger of [start, end) in `step` steps, with what aggregation needs to name lines.
    Unless `by_workload`, the whole hours the rollup covers come from it (rollup.py), and the stretch
    after them up to the checkpoint from the checkpoint (checkpoint.py): their lines are groups of
    workloads, named as their workloads are."""
    now = now or timezone.now()
    steps = steps_of(start, end, step)
    with checkpoint.one_snapshot():
        prices = {pk: [(to_us(at), units) for at, units in rows] for pk, rows in price_timelines().items()}
        ledgers = [ledger.StepLedger(to_us(a), to_us(b)) for a, b in steps]
        span = None if by_workload else rollup.covered(rollup.COSTS, start, end, now)
        names = None if by_workload else rollup.GroupNames()
        meta = rollup.stitch(
            ledgers, steps, start, end, span,
            usable=lambda p, q: None if by_workload else checkpoint.usable(rollup.COSTS, p, q, now),
            add_checkpoint=lambda found: rollup.add_costs(
                ledgers, (found.base, found.until), step, names, CostCheckpointRow
            ),
            tail=lambda windows, found: tail_ledger(windows, now, prices, found, names),
            direct=lambda windows: direct_ledger(windows, now, prices, grouped=not by_workload, names=names),
            add_span=lambda span: rollup.add_costs(ledgers, span, step, names),
        )  # fmt: skip
        class_names = dict(DeviceClass.objects.values_list("pk", "name"))
    return Loaded(ledgers, meta, class_names)


def direct_ledger(steps, now, prices, grouped=False, names=None):
    """(StepLedgers of the contiguous `steps` [(start, end)] from the allocations and samples themselves,
    {line: names} of their lines). Lines are workload ids; with `grouped`, allocations are summed per
    group of workloads (rollup.GROUP lines) and per start and end: the same amounts, in far fewer
    intervals (a cycle admits thousands at one time, and most of a full cluster is held all along)."""
    steps_ledger, meta, _ = direct_intervals_ledger(steps, now, prices, grouped, names)
    return steps_ledger, meta


def direct_intervals_ledger(steps, now, prices, grouped=False, names=None):
    """direct_ledger's (StepLedgers, {line: names}), and the intervals billed."""
    start, end = steps[0][0], steps[-1][1]
    billed_until = min(end, now)
    within = overlapping(start, billed_until)
    intervals, meta = [], {}
    if grouped:
        intervals, meta = group_intervals(within, start, billed_until, names)
    else:
        intervals = allocation_intervals(within)
    us_steps = [(to_us(a), to_us(b)) for a, b in steps]
    samples = capacity_samples(start, end)
    steps_ledger = ledger.build_ledger(us_steps, to_us(now), prices, samples, intervals, clock.billing_scale())
    if not grouped:
        workload_ids = {line for step_ledger in steps_ledger for line, _ in step_ledger.allocated}
        if workload_ids:
            rows = workload_meta(within.values("workload_id"))
            meta = {pk: row for pk, row in rows.items() if pk in workload_ids}
    return steps_ledger, meta, intervals


def tail_ledger(steps, now, prices, found, names):
    """direct_ledger(steps, now, prices, grouped=True) for the `steps` from the Checkpoint `found`'s
    `until` on, from the checkpoint: what was held at `until` billed on, except for the workloads whose
    allocations changed since (a stamp at or after `until`), whose own holding at `until` is taken out
    and whose intervals since are read instead. The ledger is linear in its intervals (a negative count
    takes devices out, in the bill and in what is left free), so this is the direct ledger exactly."""
    start, end = steps[0][0], steps[-1][1]
    billed_until = min(end, now)
    until = to_us(found.until)
    changed = checkpoint.holders_changed_since(found.until)
    intervals, meta = [], {}
    for class_id, team_id, queue_id, resource_class_id, _, devices in checkpoint.open_groups(rollup.COSTS):
        line = (rollup.GROUP, team_id, queue_id, resource_class_id)
        meta.setdefault(line, names.allocated_meta(team_id, queue_id, resource_class_id))
        intervals.append(ledger.Interval(until, None, class_id, line, devices))
    if changed:
        held_then, held_meta = group_intervals(
            overlapping(found.base, found.until).filter(workload_id__in=changed), found.base, found.until, names
        )
        for interval in held_then:
            if interval.end is None:  # still held at `until`: in the checkpoint's open groups
                intervals.append(ledger.Interval(until, None, interval.device_class, interval.line, -interval.devices))
        since, since_meta = group_intervals(
            overlapping(start, billed_until).filter(workload_id__in=changed), start, billed_until, names
        )
        intervals.extend(since)
        meta.update(held_meta)
        meta.update(since_meta)
    us_steps = [(to_us(a), to_us(b)) for a, b in steps]
    samples = capacity_samples(start, end)
    steps_ledger = ledger.build_ledger(us_steps, to_us(now), prices, samples, intervals, clock.billing_scale())
    for step_ledger in steps_ledger:
        step_ledger.drop_empty_lines()
    return steps_ledger, meta


GROUP_FIELDS = ("workload__team_id", "workload__queue_id", "workload__resource_class_id", "device_class_id")


def group_intervals(allocations, start, end, names=None):
    """`allocations`, all overlapping [start, end), as intervals per group, device class, start and end,
    their times clipped to the window first: a cycle admits thousands at one time, and most of a full
    cluster is held all through the window."""
    begins = Case(When(allocated_at__lte=start, then=Value(start)), default=F("allocated_at"))
    ends = Case(
        When(Q(released_at__isnull=True) | Q(released_at__gte=end), then=Value(None, DateTimeField())),
        default=F("released_at"),
    )
    rows = (
        allocations.order_by()
        .annotate(begins=begins, ends=ends, **SHARE_KEYS)
        .values(*GROUP_FIELDS, "begins", "ends", *SHARE_KEYS)
        .annotate(devices=Count("id"))
        .values_list(*GROUP_FIELDS, "begins", "ends", *SHARE_KEYS, "devices")
    )
    names = names or rollup.GroupNames()
    intervals, meta = [], {}
    rows = fetch_rows(rows)
    shares = Shares(row[-3] for row in rows)
    for team_id, queue_id, resource_class_id, class_id, held_from, held_to, device, consumed, devices in rows:
        line = (rollup.GROUP, team_id, queue_id, resource_class_id)
        if line not in meta:
            meta[line] = names.allocated_meta(team_id, queue_id, resource_class_id)
        until = None if held_to is None else to_us(held_to)
        intervals.append(
            ledger.Interval(to_us(held_from), until, class_id, line, shares.devices(devices, device, consumed))
        )
    return intervals, meta


# An allocation of a shared device is grouped apart from whole ones (the key of a whole one is NULL, NULL):
# by its device and its share, fixed when it was made (Allocation.share_millionths), as JSON text (a
# number); one written without it (before workloads migration 0025 fixed them all) by what it consumes.
SHARE_KEYS = {
    "shared_device": Case(
        When(consumed_capacity__isnull=True, then=Value(None)), default=F("device_id"), output_field=BigIntegerField()
    ),
    "consumed": Case(
        When(consumed_capacity__isnull=True, then=Value(None)),
        When(share_millionths__isnull=False, then=Cast("share_millionths", TextField())),
        default=Cast("consumed_capacity", TextField()),
        output_field=TextField(),
    ),
}


class Shares:
    """What the allocations of shared devices count for: `devices(count, device, consumed)` is `count`
    whole devices when `device` is None, else `count` times the allocation's share of its device:
    `consumed` (JSON text, SHARE_KEYS) is that share in millionths, fixed when it was made, so a device
    republished with another capacity keeps the shares it had; or, for an allocation written without
    one, what it consumes, read against the device's capacity as published now
    (accounting.device_share). `device_pks`: the shared devices met."""

    def __init__(self, device_pks):
        wanted = {pk for pk in device_pks if pk is not None}
        rows = Device.objects.filter(pk__in=wanted).values_list("pk", "capacity") if wanted else ()
        self.capacity = {pk: quantities.numbers(capacity) for pk, capacity in rows}
        self.known = {}

    def devices(self, count, device, consumed):
        if device is None:
            return count
        key = (device, consumed)
        share = self.known.get(key)
        if share is None:
            value = json.loads(consumed) if isinstance(consumed, str) else consumed
            if isinstance(value, int):
                share = ledger.from_millionths(0, value)
            else:
                share = accounting.device_share(self.capacity.get(device, {}), quantities.numbers(value))
            self.known[key] = share
        return count * share


def overlapping(start, end):
    """The allocation rows whose holding overlaps [start, end)."""
    return Allocation.objects.filter(allocated_at__lt=end).filter(
        Q(released_at__isnull=True) | Q(released_at__gt=start)
    )


def allocation_intervals(allocations):
    """`allocations` (e.g. overlapping(start, end)) as ledger intervals; the devices of a gang placed and
    released together become one interval of n devices."""
    # Grouped in SQL: a gang's devices are one row each, 100,000 of them on a full large cluster.
    grouped = (
        allocations.order_by()
        .annotate(**SHARE_KEYS)
        .values("workload_id", "device_class_id", "allocated_at", "released_at", *SHARE_KEYS)
        .annotate(devices=Count("id"))
        .values_list("workload_id", "device_class_id", "allocated_at", "released_at", *SHARE_KEYS, "devices")
    )
    rows = fetch_rows(grouped)
    shares = Shares(row[-3] for row in rows)
    return [
        ledger.Interval(
            start=to_us(allocated_at),
            end=None if released_at is None else to_us(released_at),
            device_class=class_id,
            line=workload_id,
            devices=shares.devices(devices, device, consumed),
        )
        for workload_id, class_id, allocated_at, released_at, device, consumed, devices in rows
    ]


def capacity_samples(start, end):
    """{class id: [Sample]}: the last sample at or before `start` of each class (it still holds) and all
    samples inside the window."""
    out = defaultdict(list)
    for class_id in DeviceClass.objects.values_list("pk", flat=True):
        before = CapacitySample.objects.filter(device_class_id=class_id, at__lte=start).order_by("-at").first()
        rows = list(CapacitySample.objects.filter(device_class_id=class_id, at__gt=start, at__lt=end).order_by("at"))
        for row in ([before] if before else []) + rows:
            shared = row.shared or {}
            out[class_id].append(
                ledger.Sample(
                    at=to_us(row.at),
                    total=ledger.from_millionths(row.total, shared.get("over", 0)),
                    unhealthy=ledger.from_millionths(row.unhealthy, shared.get("unhealthy", 0)),
                    stranded=ledger.from_millionths(row.stranded, shared.get("stranded", 0)),
                    reserved=tuple(sorted((team, int(n)) for team, n in row.reserved_by_team.items())),
                )
            )
    return dict(out)


def workload_meta(workload_ids):
    """{workload id: its names} for `workload_ids`, ids or a subquery of them: a month's tens of thousands
    of ids as parameters cost more than the report's ledger."""
    rows = Workload.objects.filter(pk__in=workload_ids).values_list(
        "pk",
        "name",
        "state",
        "team__name",
        "queue__name",
        "resource_class__name",
        "resource_class__cost_label",
        "team_id",
        "queue_id",
        "resource_class_id",
    )
    # Read flat: Django's dict rows of 50,000 workloads cost more than the query.
    return {
        pk: {
            "name": name,
            "team": team,
            "queue": queue,
            "resource_class": resource_class or NONE_LABEL,
            "cost_label": cost_label or NONE_LABEL,
            "state": state,
            "group": (team_id, queue_id, resource_class_id),
        }
        for pk, name, state, team, queue, resource_class, cost_label, team_id, queue_id, resource_class_id in (
            fetch_rows(rows)
        )
    }


# --- aggregation ---------------------------------------------------------------------------------------------


def line_key(meta, class_name, dims):
    """The aggregate name of one (workload, device class) line, e.g. "team-a" or "team-a/h100"."""
    parts = []
    for dim in dims:
        if dim == "device_class":
            parts.append(class_name)
        elif dim == "workload":
            parts.append(f"{meta['team']}/{meta['name']}")
        else:
            parts.append(meta[dim])
    return "/".join(parts)


def step_leaves(step_ledger, loaded, dims):
    """Exact leaf lines of one step: {("allocated", key) | ("idle",) | ("stranded",) | ("unhealthy",) |
    ("reserved_unused", team): Amount}; leaves are ordered allocations first (by key), then the rest."""
    allocated = defaultdict(ledger.Amount)
    for (workload_id, class_id), amount in step_ledger.allocated.items():
        key = line_key(loaded.meta[workload_id], loaded.class_names[class_id], dims)
        _accumulate(allocated[("allocated", key)], amount)
    rest = defaultdict(ledger.Amount)
    for category in ("idle", "stranded", "unhealthy"):
        rest[(category,)] = ledger.Amount()
    for (category, _class_id, team), amount in step_ledger.capacity.items():
        leaf = ("reserved_unused", team) if category == "reserved_unused" else (category,)
        _accumulate(rest[leaf], amount)
    leaves = dict(sorted(allocated.items()))
    leaves.update(sorted(rest.items()))
    return leaves


def _accumulate(into, amount):
    into.device_us += amount.device_us
    into.raw += amount.raw


def round_leaves(leaves):
    """{leaf: (ten-thousandths of device-hours, cents)} and the step's (hours, cents) totals; the lines
    sum to the totals exactly."""
    hours_total, hours = ledger.round_lines(
        {leaf: amount.device_us for leaf, amount in leaves.items()}, ledger.MICROS_PER_TEN_THOUSANDTH_HOUR
    )
    cents_total, cents = ledger.round_lines({leaf: amount.raw for leaf, amount in leaves.items()}, ledger.RAW_PER_CENT)
    return {leaf: (hours[leaf], cents[leaf]) for leaf in leaves}, (hours_total, cents_total)


def money(cents):
    return ledger.cents_to_money(cents)


def hours(units):
    return ledger.ten_thousandths_to_hours(units)


def entry(units, cents):
    return {"device_hours": hours(units), "cost": money(cents)}


def allocation_report(
    start,
    end,
    aggregate=("team",),
    step="day",
    idle=True,
    share_idle=False,
    now=None,
    workload_detail=False,
    top=None,
):
    """The OpenCost-shaped report: per step, aggregate -> {device_hours, cost} and the unallocated rows.
    `top`: keep the lines of that many costliest keys over the window, and sum the rest into one
    OTHER_LABEL line (a month of a busy cluster has tens of thousands of workloads)."""
    fast = (
        costliest_workloads(start, end, step, now, top)
        if top is not None and tuple(aggregate) == ("workload",)
        else None
    )
    if fast is not None:
        loaded, rounded_steps, kept, kept_ids = fast
    else:
        loaded = load(start, end, step, now, by_workload="workload" in aggregate)
        rounded_steps = [round_leaves(step_leaves(step_ledger, loaded, aggregate)) for step_ledger in loaded.steps]
        kept = None
        if top is not None:
            rounded_steps, kept = keep_costliest(rounded_steps, top)
    steps_out = []
    totals = _empty_totals()
    for step_ledger, (rounded, (hours_total, cents_total)) in zip(loaded.steps, rounded_steps, strict=True):
        step_out = _step_output(step_ledger, rounded, hours_total, cents_total, idle, share_idle)
        _add_totals(totals, step_out, rounded, hours_total, cents_total)
        steps_out.append(step_out)
    report = {
        "window": {"start": start, "end": end},
        "aggregate": ",".join(aggregate),
        "step": step,
        "idle": idle,
        "share_idle": share_idle,
        "steps": steps_out,
        "totals": _totals_output(totals),
    }
    if top is not None:
        report["top"] = top
        report["other"] = OTHER_LABEL
    if fast is not None:
        report["workloads"] = _workload_rows(workload_meta(kept_ids) if kept_ids else {}, workload_detail)
    elif "workload" in aggregate:
        report["workloads"] = _workload_index(loaded, aggregate, workload_detail, kept)
    return report


def keep_costliest(rounded_steps, top):
    """(rounded_steps with every allocation line but those of the `top` costliest keys over the window
    merged into one OTHER_LABEL line, the keys kept; None when all are). The lines still add up to
    each step's totals exactly: the merged line is a sum of rounded lines."""
    spent = defaultdict(lambda: [0, 0])
    for rounded, _ in rounded_steps:
        for leaf, (units, cents) in rounded.items():
            if leaf[0] == "allocated":
                spent[leaf[1]][0] += units
                spent[leaf[1]][1] += cents
    if len(spent) <= top:
        return rounded_steps, None
    ranked = sorted(spent, key=lambda key: (-spent[key][1], -spent[key][0], key))
    kept = frozenset(ranked[:top])
    merged_steps = []
    for rounded, step_totals in rounded_steps:
        merged = {}
        for leaf, (units, cents) in rounded.items():
            if leaf[0] == "allocated" and leaf[1] not in kept:
                leaf = ("allocated", OTHER_LABEL)
            known_units, known_cents = merged.get(leaf, (0, 0))
            merged[leaf] = (known_units + units, known_cents + cents)
        merged_steps.append((merged, step_totals))
    return merged_steps, kept


def _step_output(step_ledger, rounded, hours_total, cents_total, idle, share_idle):
    allocations = {leaf[1]: (units, cents) for leaf, (units, cents) in rounded.items() if leaf[0] == "allocated"}
    shared = {}
    idle_units, idle_cents = rounded[("idle",)]
    if share_idle and idle_cents and any(cents for _, cents in allocations.values()):
        # OpenCost shares idle in proportion to each allocation's cost; largest remainder keeps the cents.
        shared = ledger.apportion(idle_cents, {key: cents for key, (_, cents) in allocations.items()})
    out_allocations = {}
    for key, (units, cents) in allocations.items():
        row = entry(units, cents)
        if share_idle:
            row["shared_idle_cost"] = money(shared.get(key, 0))
            row["total_cost"] = money(cents + shared.get(key, 0))
        out_allocations[key] = row
    reserved = {leaf[1]: entry(*value) for leaf, value in rounded.items() if leaf[0] == "reserved_unused"}
    by_category = _category_sums(rounded)
    step_out = {
        "start": from_us(step_ledger.start),
        "end": from_us(step_ledger.end),
        "allocations": out_allocations,
        "stranded": entry(*rounded[("stranded",)]),
        "unhealthy": entry(*rounded[("unhealthy",)]),
        "reserved_unused": reserved,
        "totals": {name: entry(*value) for name, value in by_category.items()}
        | {"total": entry(hours_total, cents_total)},
    }
    if idle:
        step_out["idle"] = entry(idle_units, idle_cents) | ({"shared": bool(shared)} if share_idle else {})
    return step_out


def _category_sums(rounded):
    sums = {name: [0, 0] for name in ledger.CATEGORIES}
    for leaf, (units, cents) in rounded.items():
        sums[leaf[0]][0] += units
        sums[leaf[0]][1] += cents
    return {name: tuple(value) for name, value in sums.items()}


def _empty_totals():
    return {
        "categories": {name: [0, 0] for name in ledger.CATEGORIES},
        "total": [0, 0],
        "allocations": defaultdict(lambda: [0, 0]),
        "reserved_unused": defaultdict(lambda: [0, 0]),
    }


def _add_totals(totals, step_out, rounded, hours_total, cents_total):
    for name, (units, cents) in _category_sums(rounded).items():
        totals["categories"][name][0] += units
        totals["categories"][name][1] += cents
    totals["total"][0] += hours_total
    totals["total"][1] += cents_total
    for leaf, (units, cents) in rounded.items():
        if leaf[0] in ("allocated", "reserved_unused"):
            bucket = totals["allocations" if leaf[0] == "allocated" else "reserved_unused"][leaf[1]]
            bucket[0] += units
            bucket[1] += cents


def _totals_output(totals):
    out = {name: entry(*value) for name, value in totals["categories"].items()}
    out["total"] = entry(*totals["total"])
    out["allocations"] = {key: entry(*value) for key, value in sorted(totals["allocations"].items())}
    out["reserved_unused_by_team"] = {key: entry(*value) for key, value in sorted(totals["reserved_unused"].items())}
    return out


def _workload_index(loaded, aggregate, detail, kept=None):
    """Who each workload key belongs to (`kept`: only the workloads of those line keys). Finance sees
    name and team only; placement, pod sets and explanations are never part of a cost report."""
    if kept is None:
        listed = loaded.meta
    else:
        listed = {
            workload_id
            for step_ledger in loaded.steps
            for workload_id, class_id in step_ledger.allocated
            if line_key(loaded.meta[workload_id], loaded.class_names[class_id], aggregate) in kept
        }
    return _workload_rows({pk: meta for pk, meta in loaded.meta.items() if pk in listed}, detail)


def _workload_rows(metas, detail):
    out = {}
    for workload_id, meta in metas.items():
        key = f"{meta['team']}/{meta['name']}"
        row = {"name": meta["name"], "team": meta["team"]}
        if detail:
            row |= {
                "id": workload_id,
                "queue": meta["queue"],
                "resource_class": meta["resource_class"],
                "state": meta["state"],
            }
        out[key] = row
    return out


# --- monthly chargeback and statements -----------------------------------------------------------------------


def chargeback(start, end, now=None):
    """Per team: allocated and reserved-unused device-hours and cost, and their sum (the charge); then the
    platform rows (idle, stranded, unhealthy) and the capacity total. One step over the month, so the
    figures are exactly those of the allocation API with step=month, aggregate=team."""
    report = allocation_report(start, end, aggregate=("team",), step="month", now=now)
    totals = report["totals"]
    teams = sorted(
        set(Team.objects.values_list("name", flat=True))
        | set(totals["allocations"])
        | set(totals["reserved_unused_by_team"])
    )
    zero = entry(0, 0)
    rows = []
    for team in teams:
        allocated = totals["allocations"].get(team, zero)
        reserved = totals["reserved_unused_by_team"].get(team, zero)
        rows.append(
            {
                "team": team,
                "allocated_device_hours": allocated["device_hours"],
                "allocated_cost": allocated["cost"],
                "reserved_unused_device_hours": reserved["device_hours"],
                "reserved_unused_cost": reserved["cost"],
                "charge": allocated["cost"] + reserved["cost"],
            }
        )
    platform = {name: totals[name] for name in ("idle", "stranded", "unhealthy")}
    return {"start": start, "end": end, "teams": rows, "platform": platform, "total": totals["total"]}


def team_breakdowns(start, end, team, dims_list, now=None):
    """The team's allocated cost over [start, end) in month steps, split by each dims of `dims_list`, each
    split apportioned inside the team's own rounded figure (largest remainder) so its lines always add up
    to the team line of the chargeback. Returns {dims: {key: entry}}."""
    loaded = load(start, end, "month", now, by_workload=any("workload" in dims for dims in dims_list))
    team_units = team_cents = 0
    fine = {dims: (defaultdict(int), defaultdict(int)) for dims in dims_list}
    for step_ledger in loaded.steps:
        rounded, _ = round_leaves(step_leaves(step_ledger, loaded, ("team",)))
        units, cents = rounded.get(("allocated", team), (0, 0))
        team_units += units
        team_cents += cents
        for (workload_id, class_id), amount in step_ledger.allocated.items():
            meta = loaded.meta[workload_id]
            if meta["team"] != team:
                continue
            for dims, (device_us, raw) in fine.items():
                key = line_key(meta, loaded.class_names[class_id], dims)
                device_us[key] += amount.device_us
                raw[key] += amount.raw
    out = {}
    for dims, (device_us, raw) in fine.items():
        keys = sorted(raw)
        units = ledger.apportion(team_units, {key: device_us[key] for key in keys}) if team_units else {}
        cents = ledger.apportion(team_cents, {key: raw[key] for key in keys}) if team_cents else {}
        out[dims] = {key: entry(units.get(key, 0), cents.get(key, 0)) for key in keys}
    return out


# --- the costliest workloads ---------------------------------------------------------------------------------

# The top of a month's tens of thousands of workloads needs every workload's amount, because the rounding
# (round_leaves: each step's total rounded half up, shared by largest remainder among all its leaf lines,
# ties in line order) ranks every line's remainder. The allocations come grouped per workload and holding
# (held.py: kept by the process between reports) and are cut into pieces per step and price in Python, as
# integers: exact numeric sums and window functions over every workload cost PostgreSQL about a second at
# 100,000 devices, and a remainder is computed once per distinct amount (a cycle admits thousands of
# workloads at one time). Amounts are counted in millionths of a device (ledger.in_millionths): a share of
# a shared device is a Fraction in millionths (SHARE_SCALE), so every amount is a whole number, and
# scaling all of a step's lines and its rounding unit by the same factor leaves the rounded total, each
# line's share and the order of the remainders as they were. The ledger is linear in its intervals, so a
# group's amount is computed once and multiplied by each of its workloads' devices.

# Workloads' line keys "team/name". The ids come as one array's text: thousands of equal workloads can tie
# at a remainder or in the ranking, and psycopg adapts a list item by item.
WORKLOAD_KEYS_SQL = """
SELECT wl.id, t.name || '/' || wl.name
FROM unnest(%(ids)s::bigint[]) AS wanted(id) JOIN workloads_workload wl ON wl.id = wanted.id
JOIN policy_team t ON t.id = wl.team_id
"""
# The first of such workloads in line order, sorted where they are: the ties can be tens of thousands, of
# which only the first few hundred or thousand take a unit. With `= ANY`, PostgreSQL hashes the ids and
# scans the workloads once (half the time of joining the unnested array).
FIRST_BY_KEY_SQL = """
SELECT wl.id FROM workloads_workload wl JOIN policy_team t ON t.id = wl.team_id
WHERE wl.id = ANY(%(ids)s::bigint[])
ORDER BY (t.name || '/' || wl.name) COLLATE "C" LIMIT %(limit)s
"""
# A team's workloads holding devices in the window, in line order (one team's keys share "team/").
FIRST_WORKLOADS_BY_KEY_SQL = """
SELECT wl.id, wl.name FROM workloads_workload wl
WHERE wl.team_id = %(team)s AND EXISTS (
    SELECT FROM workloads_allocation al WHERE al.workload_id = wl.id AND al.allocated_at < %(billed_until)s
                                          AND (al.released_at IS NULL OR al.released_at > %(window_start)s))
ORDER BY wl.name COLLATE "C" LIMIT %(limit)s OFFSET %(offset)s
"""


def costliest_workloads(start, end, step, now, top):
    """allocation_report's (rounded steps, kept keys or None, kept workload ids) for aggregate=workload
    with `top`, as round_leaves and keep_costliest make them from the direct ledger by workload: the
    unallocated leaves from the grouped ledger (rollup and checkpoint), every workload's amounts from
    the allocations' groups (Pieces), rounded by RoundedStep. None on SQLite, which has no change log to
    keep the groups by and no second connection to read them beside the ledger."""
    if connection.vendor != "postgresql":
        return None
    now = now or timezone.now()
    # A transaction open already (a test's, a caller's) may hold rows no other connection sees.
    beside = not connection.in_atomic_block
    # One snapshot for the grouped ledger and the groups: their lines must add up to the same capacity.
    # Every workload's amounts, pieces and remainders live until the ranking: see broker.scheduler.heap.
    with checkpoint.one_snapshot(), heap.collector_paused():
        return _costliest_workloads(start, end, step, now, top, beside)


class WorkloadKeys:
    """Workloads' line keys, read once per report. Lines sort by key in byte order (COLLATE "C"): Python
    compares str by code point, the order of their UTF-8 bytes."""

    def __init__(self):
        self.known = {}

    def first(self, ids, limit):
        """The ids of the first `limit` of the workloads `ids` in line order."""
        if not ids or limit <= 0:
            return []
        with connection.cursor() as cursor:
            cursor.execute(FIRST_BY_KEY_SQL, {"ids": _id_array(ids), "limit": limit})
            return [workload_id for (workload_id,) in cursor.fetchall()]

    def read(self, ids):
        missing = [workload_id for workload_id in ids if workload_id not in self.known]
        if missing:
            with connection.cursor() as cursor:
                cursor.execute(WORKLOAD_KEYS_SQL, {"ids": _id_array(missing)})
                self.known.update(cursor.fetchall())


def _id_array(ids):
    return "{" + ",".join(map(str, ids)) + "}"


def _divmods(total, amounts, weight):
    """([total * amount // weight], [total * amount % weight]) for the `amounts`."""
    if not amounts:
        return [], []
    scaled = [total * amount for amount in amounts]
    return [part // weight for part in scaled], [part % weight for part in scaled]


class RoundedStep:
    """One measure (device-microseconds or raw cost) of one step rounded as ledger.round_lines does: the
    step's exact total rounded half up to `unit`, shared among the workloads' lines (`amounts`: {workload
    id: exact amount}) and the rest lines (`rest`: exact amounts in line order) by largest remainder, ties
    in line order: workloads first, by key, then the rest lines. Workloads of equal amounts share their
    quotient and remainder; when only some lines of the last remainder that gets a unit can have one,
    their keys decide (`by_key(ids, n)`: the first n ids in key order). Asking the keys costs a scan of
    the tied workloads (tens of thousands, when a cycle started them together), and only the workloads
    near the top of the ranking need the answer, so it is asked when first needed (`extra_workloads`)."""

    def __init__(self, amounts, rest, unit, by_key):
        self.amounts = amounts
        counts = Counter(amounts.values())
        distinct, copies = list(counts), list(counts.values())
        weight = sum(map(mul, distinct, copies)) + sum(rest)
        self.total = total = ledger.round_half_up(weight, unit)
        self.distinct = distinct
        self._weight = weight
        self._extra = frozenset()
        self.tied_amounts = frozenset()  # the amounts whose workloads the keys decide among, if any
        # An amount's units are its quotient, and one more for a remainder above the cut or, when all the
        # workloads of the cut's remainder have one, at it (computed when asked: few amounts are).
        self._cut, self._at_cut = -1, 0
        if weight == 0:
            self.rest = [0] * len(rest)
            return
        shares, remainders = _divmods(total, distinct, weight)
        rest_shares, rest_remainders = _divmods(total, rest, weight)
        left = total - sum(map(mul, shares, copies)) - sum(rest_shares)
        # The largest remainders' lines get a unit first: all of a remainder's lines or, for the first
        # remainder whose lines cannot all have one, the first of them in line order. In `order`, largest
        # remainder first, the amounts and rest lines of one remainder are neighbours.
        every = remainders + rest_remainders
        order = sorted(range(len(every)), key=every.__getitem__, reverse=True)
        given = list(accumulate(map((copies + [1] * len(rest)).__getitem__, order)))
        short = bisect_right(given, left)  # the first position whose lines cannot all have one, if any
        cut = every[order[short]] if short < len(order) else -1  # larger remainders have their unit
        whole = short  # the positions before the cut's
        while whole and every[order[whole - 1]] == cut:
            whole -= 1
        if whole:
            left -= given[whole - 1]
        self._cut = cut
        self.rest = [share + (remainder > cut) for share, remainder in zip(rest_shares, rest_remainders, strict=True)]
        if left <= 0:
            return
        # The remainder whose lines cannot all have one: workloads first, by key, then the rest lines.
        equal_amounts = [amount for amount, remainder in zip(distinct, remainders, strict=True) if remainder == cut]
        workloads = sum(counts[amount] for amount in equal_amounts)
        if left >= workloads:
            self._at_cut = 1
            tied_rest = [order for order, remainder in enumerate(rest_remainders) if remainder == cut]
            for order in tied_rest[: left - workloads]:
                self.rest[order] += 1
        else:
            self.tied_amounts = frozenset(equal_amounts)
            self._extra = None
            self._by_key, self._left = by_key, left

    @property
    def extra_workloads(self):
        """The workloads that have one unit more than their amount's: those of the tied amounts that the
        keys put first."""
        if self._extra is None:
            wanted = self.tied_amounts
            ids = [workload_id for workload_id, amount in self.amounts.items() if amount in wanted]
            self._extra = frozenset(self._by_key(ids, self._left))
        return self._extra

    def rounded(self, amount):
        """The units of the workloads of `amount`, but for the one more that the keys give some of them
        when it is one of the tied_amounts."""
        if self._weight == 0:
            return 0
        share, remainder = divmod(self.total * amount, self._weight)
        return share + (remainder > self._cut or (remainder == self._cut and self._at_cut))

    def of(self, workload_id):
        amount = self.amounts[workload_id]
        if amount in self.tied_amounts:
            return self.rounded(amount) + (workload_id in self.extra_workloads)
        return self.rounded(amount)


class Pieces:
    """Every workload's exact amounts per step (PiecesWindow.amounts): `result()` is ([{workload id:
    device-microseconds}], [{workload id: raw cost}]), one dict per step, in millionths of a device.
    `beside`: read the groups on a connection and a thread of their own, in this transaction's snapshot
    (pg_export_snapshot), mostly from what the process kept (held.groups), while this one loads the
    grouped ledger, which needs none of them."""

    def __init__(self, window, beside):
        self.running = None
        if not beside:
            self.amounts = window.amounts(held.groups(window.start, keep=False))
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_export_snapshot()")
            (snapshot,) = cursor.fetchone()
        self.running = _beside().submit(_kept_amounts, window, snapshot)

    def result(self):
        if self.running is not None:
            self.amounts, self.running = self.running.result(), None
        return self.amounts


class PiecesWindow:
    """What a report cuts the allocations by: its steps, its window's start and the end of what is billed
    (microseconds, windows.to_us), the price periods of each class and the billing scale."""

    def __init__(self, start, end, step, now):
        self.start = start
        self.steps = [(to_us(a), to_us(b)) for a, b in steps_of(start, end, step)]
        self.window_start, self.billed_until = to_us(start), to_us(min(end, now))
        self.periods = _price_periods()
        self.scale = clock.billing_scale()

    def amounts(self, by_group):
        """([{workload id: device-microseconds}], [{workload id: raw cost}]) per step of the groups
        `by_group` ({group: {workload id: devices}}, held.py). A piece (a step's stretch at one price) is
        scaled (floored) before it is multiplied, as ledger.build_ledger bills each stretch, and a
        workload has a line in a step where it has a piece, even one scaled to nothing."""
        steps, window_start, billed_until = self.steps, self.window_start, self.billed_until
        num, den = self.scale.numerator, self.scale.denominator
        unscaled = den == 1 == num
        whole = ledger.in_millionths(1)
        shared = {
            (group[1], group[2])
            for group in by_group
            if group[1] is not None and group[3] < billed_until and (group[4] is None or group[4] > window_start)
        }
        shares = Shares(device for device, _ in shared) if shared else None
        share_of = {pair: ledger.in_millionths(shares.devices(1, *pair)) for pair in shared}
        device_us = [{} for _ in steps]
        raw = [{} for _ in steps]
        steps_at = list(zip(steps, device_us, raw, strict=True))
        periods_of = self.periods
        # Conditional expressions, not max() and min(): tens of thousands of groups, a call each saved.
        for (class_id, device, consumed, held_from, held_to), holders in by_group.items():
            if held_from >= billed_until:
                continue
            if held_to is None or held_to >= billed_until:
                high = billed_until
            elif held_to <= window_start:
                continue
            else:
                high = held_to
            low = held_from if held_from > window_start else window_start
            millionths = whole if device is None else share_of[(device, consumed)]
            periods = periods_of.get(class_id, ())
            for (step_start, step_end), step_us, step_raw in steps_at:
                begins = low if low > step_start else step_start
                ends = high if high < step_end else step_end
                if begins >= ends:
                    continue
                per_device_us = per_device_raw = 0
                pieces = 0
                for price_from, price_to, price in periods:
                    length = (ends if ends < price_to else price_to) - (begins if begins > price_from else price_from)
                    if length > 0:
                        pieces += 1
                        amount = (length if unscaled else length * num // den) * millionths
                        per_device_us += amount
                        per_device_raw += amount * price
                if not pieces:
                    continue
                for workload_id, devices in holders.items():
                    step_us[workload_id] = step_us.get(workload_id, 0) + per_device_us * devices
                    step_raw[workload_id] = step_raw.get(workload_id, 0) + per_device_raw * devices
        return device_us, raw


_BESIDE = {}  # process id -> its executor


def _beside():
    """This process's one worker for the pieces (reports at once take turns on its connection). Per
    process: a child forked after its parent started the worker inherits the executor, not its thread."""
    pid = os.getpid()
    if pid not in _BESIDE:
        _BESIDE.clear()
        _BESIDE[pid] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="costliest-pieces")
    return _BESIDE[pid]


SNAPSHOT_ID = re.compile(r"[0-9A-F]+-[0-9A-F]+-[0-9]+")


def _kept_amounts(window, snapshot):
    """window.amounts of the groups read in the snapshot `snapshot` (exported by the report's
    transaction), on this thread's connection."""
    if not SNAPSHOT_ID.fullmatch(snapshot):
        raise ValueError(f"not a snapshot id: {snapshot!r}")
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cursor.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
            return window.amounts(held.groups(window.start, keep=True))
    finally:
        connection.close_if_unusable_or_obsolete()


def _price_periods():
    """{class id: [(from, to, price)]}: the price timelines as periods in microseconds, the first open
    to the past and the last to the future."""
    periods = {}
    for class_id, timeline in price_timelines().items():
        periods[class_id] = [
            (
                to_us(at) if position else to_us(datetime.min.replace(tzinfo=UTC)),
                to_us(timeline[position + 1][0] if position + 1 < len(timeline) else datetime.max.replace(tzinfo=UTC)),
                int(units),
            )
            for position, (at, units) in enumerate(timeline)
        ]
    return periods


def _costliest_workloads(start, end, step, now, top, beside=False):
    pieces = Pieces(PiecesWindow(start, end, step, now), beside)
    loaded = load(start, end, step, now, by_workload=False)
    billed_until = min(end, now)
    rest = []  # per step: [(leaf, Amount in millionths)] in line order
    for step_ledger in loaded.steps:
        leaves = {(category,): ledger.Amount() for category in ("idle", "stranded", "unhealthy")}
        for (category, _class_id, team), amount in step_ledger.capacity.items():
            leaf = ("reserved_unused", team) if category == "reserved_unused" else (category,)
            _accumulate(leaves.setdefault(leaf, ledger.Amount()), amount)
        rest.append(
            [
                (leaf, ledger.Amount(ledger.in_millionths(amount.device_us), ledger.in_millionths(amount.raw)))
                for leaf, amount in sorted(leaves.items())
            ]
        )
    device_us, raw = pieces.result()
    workload_keys = WorkloadKeys()
    unit_us = ledger.in_millionths(ledger.MICROS_PER_TEN_THOUSANDTH_HOUR)
    unit_raw = ledger.in_millionths(ledger.RAW_PER_CENT)
    rounded = [
        (
            RoundedStep(
                device_us[index], [amount.device_us for _, amount in rest[index]], unit_us, workload_keys.first
            ),
            RoundedStep(raw[index], [amount.raw for _, amount in rest[index]], unit_raw, workload_keys.first),
        )
        for index in range(len(loaded.steps))
    ]
    kept_ids = _costliest(_near_top(rounded, top), top, workload_keys)
    workload_keys.read(kept_ids)
    kept_key = {workload_id: workload_keys.known[workload_id] for workload_id in kept_ids}
    rounded_steps = []
    any_other = False
    first_others = _first_others(device_us, kept_ids, start, billed_until)
    for index, (units, cents) in enumerate(rounded):
        merged = {}
        kept_here = sorted((kept_key[w], units.of(w), cents.of(w)) for w in kept_ids if w in units.amounts)
        rest_units = sum(units.rest)
        rest_cents = sum(cents.rest)
        other = None
        if len(units.amounts) > len(kept_here):
            any_other = True
            other = (
                units.total - rest_units - sum(u for _, u, _ in kept_here),
                cents.total - rest_cents - sum(c for _, _, c in kept_here),
            )
        first_other = first_others[index] if other is not None else None
        for key, unit_count, cent_count in kept_here:
            if first_other is not None and first_other < key and ("allocated", OTHER_LABEL) not in merged:
                merged[("allocated", OTHER_LABEL)] = other
            merged[("allocated", key)] = (unit_count, cent_count)
        if other is not None and ("allocated", OTHER_LABEL) not in merged:
            merged[("allocated", OTHER_LABEL)] = other
        for (leaf, _), unit_count, cent_count in zip(rest[index], units.rest, cents.rest, strict=True):
            merged[leaf] = (unit_count, cent_count)
        rounded_steps.append((merged, (units.total, cents.total)))
    kept_keys = frozenset(kept_key.values()) if any_other else None
    return loaded, rounded_steps, kept_keys, set(kept_ids)


RANK_SHIFT = 64


def _ranked(cents, units):
    return cents << RANK_SHIFT | units


def _near_top(rounded, top):
    """{workload id: _ranked(cents, units) over the window} from the steps' (units, cents) RoundedSteps,
    exact, for a set of workloads that holds every one that can be among the `top` costliest: all tens of
    thousands of them cost a dict per step to sum, and only a few hundred can matter. In a step, a larger
    amount never rounds to fewer cents (its quotient is at least as large and, when equal, its remainder
    is larger), so taking each step's workloads of its `depth` largest amounts, any workload left out of
    all steps has at most the cents of the largest amounts not taken, summed over the steps. Once `top`
    of those taken have more, the others cannot be among the `top`; else the depth grows."""
    depth = top
    while True:
        taken = set()
        most_left_out = 0
        every_taken = True
        for _, cents in rounded:
            if depth < len(cents.distinct):
                every_taken = False
                edge = heapq.nlargest(depth + 1, cents.distinct)[-1]
                taken.update(workload_id for workload_id, amount in cents.amounts.items() if amount > edge)
                # A workload of the edge amount may be one the keys give the extra cent.
                most_left_out += cents.rounded(edge) + (edge in cents.tied_amounts)
            else:
                taken.update(cents.amounts)
        spent = dict.fromkeys(taken, 0)
        for units, cents in rounded:
            for workload_id in taken.intersection(cents.amounts):
                spent[workload_id] += _ranked(cents.of(workload_id), units.of(workload_id))
        if every_taken:
            return spent
        costliest_cents = heapq.nlargest(top, (value >> RANK_SHIFT for value in spent.values()))
        if len(costliest_cents) == top and costliest_cents[-1] > most_left_out:
            return spent
        depth *= 4


def _costliest(spent, top, keys):
    """The ids of the `top` workloads of most cents, then units, then first key ({id: _ranked(cents,
    units)}; `keys`: WorkloadKeys)."""
    if len(spent) <= top:
        return list(spent)
    edge = heapq.nlargest(top, spent.values())[-1]
    better = [workload_id for workload_id, value in spent.items() if value > edge]
    tied = [workload_id for workload_id, value in spent.items() if value == edge]
    if len(tied) <= top - len(better):
        return better + tied  # all of them are kept: no need of their order
    return better + keys.first(tied, top - len(better))


def _first_others(by_step, kept_ids, start, billed_until, batch=64):
    """Per step, the first key (line order) of the workloads with a line in it that are not kept, or None:
    where the OTHER_LABEL line goes among the kept ones. Read team by team in key order (names are slugs:
    "team/" decides before the workload's name), then by name: nearly every workload holding devices in
    the window has a line in each of its steps, so the first team's first names are almost always it."""
    kept = set(kept_ids)
    found = [None] * len(by_step)
    wanted = {index for index, amounts in enumerate(by_step) if len(amounts) > len(kept & amounts.keys())}
    teams = sorted(Team.objects.values_list("pk", "name"), key=lambda team: team[1] + "/")
    with connection.cursor() as cursor:
        for team_id, team_name in teams:
            offset, size = 0, batch
            while wanted:
                cursor.execute(
                    FIRST_WORKLOADS_BY_KEY_SQL,
                    {
                        "team": team_id,
                        "billed_until": billed_until,
                        "window_start": start,
                        "limit": size,
                        "offset": offset,
                    },
                )
                rows = cursor.fetchall()
                for workload_id, name in rows:
                    if workload_id in kept:
                        continue
                    for index in [index for index in wanted if workload_id in by_step[index]]:
                        found[index] = f"{team_name}/{name}"
                        wanted.discard(index)
                if len(rows) < size:
                    break
                offset += size
                size *= 4
            if not wanted:
                break
    return found
