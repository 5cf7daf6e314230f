"""Cost reports: load allocation intervals, samples and prices from the database, run the pure ledger,
aggregate and round (ledger.py documents the rounding rule)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from django.db.models import BigIntegerField, Case, Count, DateTimeField, F, Q, TextField, Value, When
from django.db.models.functions import Cast
from django.utils import timezone

from broker import clock
from broker.costs import ledger, rollup
from broker.costs.models import CapacitySample
from broker.costs.prices import price_timelines
from broker.costs.windows import from_us, steps_of, to_us
from broker.flat_rows import fetch_rows
from broker.inventory.models import Device
from broker.inventory.quantities import quantity
from broker.policy.models import DeviceClass, Team
from broker.scheduler import accounting
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
    Unless `by_workload`, the whole hours the rollup covers come from it (rollup.py): their lines are
    groups of workloads, named as their workloads are."""
    now = now or timezone.now()
    steps = steps_of(start, end, step)
    prices = {pk: [(to_us(at), units) for at, units in rows] for pk, rows in price_timelines().items()}
    ledgers = [ledger.StepLedger(to_us(a), to_us(b)) for a, b in steps]
    span = None if by_workload else rollup.covered(rollup.COSTS, start, end, now)
    meta = {}
    for p, q in rollup.direct_pieces(start, end, span):
        clipped = rollup.clip_steps(steps, p, q)
        piece, piece_meta = direct_ledger([window for _, window in clipped], now, prices, grouped=not by_workload)
        for (index, _), piece_ledger in zip(clipped, piece, strict=True):
            rollup.merge(ledgers[index], piece_ledger)
        meta.update(piece_meta)
    if span is not None:
        meta.update(rollup.add_costs(ledgers, span, step, rollup.GroupNames()))
    return Loaded(ledgers, meta, dict(DeviceClass.objects.values_list("pk", "name")))


def direct_ledger(steps, now, prices, grouped=False):
    """(StepLedgers of the contiguous `steps` [(start, end)] from the allocations and samples themselves,
    {line: names} of their lines). Lines are workload ids; with `grouped`, allocations are summed per
    group of workloads (rollup.GROUP lines) and per start and end: the same amounts, in far fewer
    intervals (a cycle admits thousands at one time, and most of a full cluster is held all along)."""
    start, end = steps[0][0], steps[-1][1]
    billed_until = min(end, now)
    within = overlapping(start, billed_until)
    intervals, meta = [], {}
    if grouped:
        intervals, meta = group_intervals(within, start, billed_until)
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
    return steps_ledger, meta


GROUP_FIELDS = ("workload__team_id", "workload__queue_id", "workload__resource_class_id", "device_class_id")


def group_intervals(allocations, start, end):
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
    names = rollup.GroupNames()
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
# its share depends on what it consumes of which device.
SHARE_KEYS = {
    "shared_device": Case(
        When(consumed_capacity__isnull=True, then=Value(None)), default=F("device_id"), output_field=BigIntegerField()
    ),
    "consumed": Case(
        When(consumed_capacity__isnull=True, then=Value(None)),
        default=Cast("consumed_capacity", TextField()),
        output_field=TextField(),
    ),
}


class Shares:
    """What the allocations of shared devices count for: `devices(count, device, consumed)` is `count`
    whole devices when `device` is None, else `count` times the share (accounting.device_share) that
    `consumed` (its JSON text) takes of the device's capacity. `device_pks`: the shared devices met.
    The capacity is the device's as published now: a device republished with another capacity changes
    the shares of the hours not rolled up yet (rolled-up hours keep theirs)."""

    def __init__(self, device_pks):
        wanted = {pk for pk in device_pks if pk is not None}
        rows = Device.objects.filter(pk__in=wanted).values_list("pk", "capacity") if wanted else ()
        self.capacity = {pk: numeric(capacity) for pk, capacity in rows}
        self.known = {}

    def devices(self, count, device, consumed):
        if device is None:
            return count
        key = (device, consumed)
        share = self.known.get(key)
        if share is None:
            amounts = numeric(json.loads(consumed) if isinstance(consumed, str) else consumed)
            share = self.known[key] = accounting.device_share(self.capacity.get(device, {}), amounts)
        return count * share


def numeric(amounts):
    """{name: number} of a capacity or consumedCapacity as stored (Kubernetes quantities such as "40Gi")."""
    out = {}
    for name, value in (amounts or {}).items():
        number = quantity(value)
        if number is not None:
            out[name] = number
    return out


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
    if "workload" in aggregate:
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
    out = {}
    if kept is None:
        listed = loaded.meta
    else:
        listed = {
            workload_id
            for step_ledger in loaded.steps
            for workload_id, class_id in step_ledger.allocated
            if line_key(loaded.meta[workload_id], loaded.class_names[class_id], aggregate) in kept
        }
    for workload_id, meta in loaded.meta.items():
        if workload_id not in listed:
            continue
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
