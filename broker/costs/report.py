"""Cost reports: load allocation intervals, samples and prices from the database, run the pure ledger,
aggregate and round (ledger.py documents the rounding rule)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection, transaction
from django.db.models import BigIntegerField, Case, Count, DateTimeField, F, Q, TextField, Value, When
from django.db.models.functions import Cast
from django.utils import timezone

from broker import clock
from broker.costs import checkpoint, ledger, rollup
from broker.costs.models import CapacitySample, CostCheckpointRow
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
        meta = {}
        for p, q in rollup.direct_pieces(start, end, span):
            found = None if by_workload else checkpoint.usable(rollup.COSTS, p, q, now)
            if found is not None:
                meta.update(rollup.add_costs(ledgers, (found.base, found.until), step, names, CostCheckpointRow))
                p = found.until
            clipped = rollup.clip_steps(steps, p, q)
            if not clipped:
                continue
            windows = [window for _, window in clipped]
            if found is not None:
                piece, piece_meta = tail_ledger(windows, now, prices, found, names)
            else:
                piece, piece_meta = direct_ledger(windows, now, prices, grouped=not by_workload, names=names)
            for (index, _), piece_ledger in zip(clipped, piece, strict=True):
                rollup.merge(ledgers[index], piece_ledger)
            meta.update(piece_meta)
        if span is not None:
            meta.update(rollup.add_costs(ledgers, span, step, names))
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


# --- the costliest workloads in SQL --------------------------------------------------------------------------

# Every workload's exact amount per step, and the one rounding of ledger.py (round_leaves: each step's total
# rounded half up, shared by largest remainder among all its leaf lines, ties in line order), in one query:
# the top of a month's tens of thousands of workloads needs each of their remainders, and Python spent
# seconds on their intervals and divisions. PostgreSQL's numeric is exact at any size. Amounts are counted in
# millionths of a device (ledger.in_millionths): a share of a shared device is a Fraction in millionths
# (SHARE_SCALE), so every amount is then a whole number, and scaling all of a step's lines and its rounding
# unit by the same factor leaves the rounded total, each line's share and the order of the remainders as
# they were. An allocation's share comes from `shared` (Shares, in Python), a whole one counts SHARE_SCALE.
COSTLIEST_SQL = """
WITH steps(i, a, b) AS (SELECT * FROM unnest(%(step_index)s::int[], %(step_start)s::timestamptz[],
                                            %(step_end)s::timestamptz[])),
prices(c, pf, pt, p) AS (SELECT * FROM unnest(%(price_class)s::bigint[], %(price_from)s::timestamptz[],
                                             %(price_to)s::timestamptz[], %(price)s::numeric[])),
rest(i, o, k, us, raw) AS (SELECT * FROM unnest(%(rest_step)s::int[], %(rest_order)s::int[], %(rest_key)s::text[],
                                               %(rest_us)s::numeric[], %(rest_raw)s::numeric[])),
shared(d, c, m) AS (SELECT * FROM unnest(%(share_device)s::bigint[], %(share_consumed)s::text[],
                                         %(share_millionths)s::bigint[])),
pieces AS (
    SELECT al.workload_id AS w, s.i, pr.p, coalesce(sh.m, %(whole)s) AS m,
           (extract(epoch FROM greatest(al.allocated_at, s.a, pr.pf)) * 1000000)::bigint AS x,
           (extract(epoch FROM least(coalesce(al.released_at, 'infinity'::timestamptz), s.b, pr.pt,
                                     %(billed_until)s)) * 1000000)::bigint AS y
    FROM workloads_allocation al
    JOIN steps s ON al.allocated_at < s.b AND (al.released_at IS NULL OR al.released_at > s.a)
    JOIN prices pr ON pr.c = al.device_class_id AND al.allocated_at < pr.pt
                   AND (al.released_at IS NULL OR al.released_at > pr.pf)
    LEFT JOIN shared sh ON al.consumed_capacity IS NOT NULL AND sh.d = al.device_id
                        AND sh.c = al.consumed_capacity::text
    WHERE al.allocated_at < %(billed_until)s AND (al.released_at IS NULL OR al.released_at > %(window_start)s)
),
leaves AS (
    SELECT s.i, 0 AS o, (t.name || '/' || wl.name) COLLATE "C" AS k, s.us, s.raw, s.w
    FROM (SELECT w, i, sum(((y - x) * %(num)s / %(den)s)::numeric * m) AS us,
                 sum(((y - x) * %(num)s / %(den)s)::numeric * m * p) AS raw
          FROM pieces WHERE y > x GROUP BY w, i) AS s
    JOIN workloads_workload wl ON wl.id = s.w JOIN policy_team t ON t.id = wl.team_id
    UNION ALL
    SELECT i, o, k COLLATE "C", us, raw, NULL FROM rest
),
sums AS (
    SELECT i, sum(us) AS w_us, sum(raw) AS w_raw,
           div(2 * sum(us) + %(unit_us)s, 2 * %(unit_us)s) AS t_us,
           div(2 * sum(raw) + %(unit_raw)s, 2 * %(unit_raw)s) AS t_raw
    FROM leaves GROUP BY i
),
shares AS (
    SELECT l.i, l.o, l.k, l.w,
           CASE WHEN m.w_us = 0 THEN 0 ELSE div(m.t_us * l.us, m.w_us) END AS su,
           CASE WHEN m.w_us = 0 THEN 0 ELSE mod(m.t_us * l.us, m.w_us) END AS ru,
           CASE WHEN m.w_raw = 0 THEN 0 ELSE div(m.t_raw * l.raw, m.w_raw) END AS sc,
           CASE WHEN m.w_raw = 0 THEN 0 ELSE mod(m.t_raw * l.raw, m.w_raw) END AS rc,
           m.t_us, m.t_raw
    FROM leaves l JOIN sums m ON m.i = l.i
),
ranked AS (
    SELECT i, o, k, w, su, sc,
           row_number() OVER (PARTITION BY i ORDER BY ru DESC, o, k) AS nu,
           row_number() OVER (PARTITION BY i ORDER BY rc DESC, o, k) AS nc,
           t_us - sum(su) OVER (PARTITION BY i) AS lu,
           t_raw - sum(sc) OVER (PARTITION BY i) AS lc
    FROM shares
),
rounded AS (
    SELECT i, o, k, w, su + (CASE WHEN nu <= lu THEN 1 ELSE 0 END) AS units,
           sc + (CASE WHEN nc <= lc THEN 1 ELSE 0 END) AS cents
    FROM ranked
),
spent AS (
    SELECT k, sum(cents) AS cents, sum(units) AS units FROM rounded WHERE o = 0 GROUP BY k
),
kept AS (
    SELECT k FROM spent ORDER BY cents DESC, units DESC, k LIMIT %(top)s
)
SELECT 'total', i, NULL, t_us, t_raw, NULL::bigint FROM sums
UNION ALL
SELECT 'rest', i, k, units, cents, o FROM rounded WHERE o > 0
UNION ALL
SELECT 'kept', i, k, units, cents, w FROM rounded WHERE o = 0 AND k IN (SELECT k FROM kept)
UNION ALL
SELECT 'other', i, min(k), sum(units), sum(cents), NULL FROM rounded WHERE o = 0 AND k NOT IN (SELECT k FROM kept)
GROUP BY i
"""


def costliest_workloads(start, end, step, now, top):
    """allocation_report's (rounded steps, kept keys or None, kept workload ids) for aggregate=workload
    with `top`, as round_leaves and keep_costliest make them from the direct ledger by workload: the
    unallocated leaves from the grouped ledger (rollup and checkpoint), every workload's amounts and the
    rounding in COSTLIEST_SQL. None where that query cannot run (SQLite)."""
    if connection.vendor != "postgresql":
        return None
    now = now or timezone.now()
    # One snapshot for the grouped ledger and the query: their lines must add up to the same capacity.
    with checkpoint.one_snapshot(), transaction.atomic():
        return _costliest_workloads(start, end, step, now, top)


def _costliest_workloads(start, end, step, now, top):
    loaded = load(start, end, step, now, by_workload=False)
    rest = {"step": [], "order": [], "key": [], "us": [], "raw": []}
    for index, step_ledger in enumerate(loaded.steps):
        leaves = {(category,): ledger.Amount() for category in ("idle", "stranded", "unhealthy")}
        for (category, _class_id, team), amount in step_ledger.capacity.items():
            leaf = ("reserved_unused", team) if category == "reserved_unused" else (category,)
            _accumulate(leaves.setdefault(leaf, ledger.Amount()), amount)
        for order, (leaf, amount) in enumerate(sorted(leaves.items()), start=1):
            for name, value in (("step", index), ("order", order), ("key", "/".join(leaf))):
                rest[name].append(value)
            rest["us"].append(ledger.in_millionths(amount.device_us))
            rest["raw"].append(ledger.in_millionths(amount.raw))
    periods = {"class": [], "from": [], "to": [], "price": []}
    for class_id, timeline in price_timelines().items():
        for position, (at, units) in enumerate(timeline):
            periods["class"].append(class_id)
            periods["from"].append(at if position else datetime.min.replace(tzinfo=UTC))
            periods["to"].append(
                timeline[position + 1][0] if position + 1 < len(timeline) else datetime.max.replace(tzinfo=UTC)
            )
            periods["price"].append(units)
    billed_until = min(end, now)
    shared = (
        overlapping(start, billed_until)
        .filter(consumed_capacity__isnull=False)
        .annotate(**SHARE_KEYS)
        .values_list(*SHARE_KEYS)
        .distinct()
        .order_by()
    )
    shared = list(shared)
    shares = Shares(device for device, _ in shared)
    scale = clock.billing_scale()
    params = {
        "step_index": list(range(len(loaded.steps))),
        "step_start": [from_us(s.start) for s in loaded.steps],
        "step_end": [from_us(s.end) for s in loaded.steps],
        "price_class": periods["class"],
        "price_from": periods["from"],
        "price_to": periods["to"],
        "price": periods["price"],
        "rest_step": rest["step"],
        "rest_order": rest["order"],
        "rest_key": rest["key"],
        "rest_us": rest["us"],
        "rest_raw": rest["raw"],
        "share_device": [device for device, _ in shared],
        "share_consumed": [consumed for _, consumed in shared],
        "share_millionths": [ledger.in_millionths(shares.devices(1, *pair)) for pair in shared],
        "whole": ledger.in_millionths(1),
        "billed_until": billed_until,
        "window_start": start,
        "num": scale.numerator,
        "den": scale.denominator,
        "unit_us": ledger.in_millionths(ledger.MICROS_PER_TEN_THOUSANDTH_HOUR),
        "unit_raw": ledger.in_millionths(ledger.RAW_PER_CENT),
        "top": top,
    }
    with connection.cursor() as cursor:
        # Its sorts and aggregates of every workload spilled to disk at the default 4 MB.
        cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute(COSTLIEST_SQL, params)
        rows = cursor.fetchall()
    totals = {i: (int(units), int(cents)) for kind, i, _, units, cents, _ in rows if kind == "total"}
    kept_rows = defaultdict(list)
    rest_rows = defaultdict(list)
    other = {}
    workload_ids = set()
    for kind, i, key, units, cents, extra in rows:
        if kind == "kept":
            kept_rows[i].append((key, int(units), int(cents)))
            workload_ids.add(extra)
        elif kind == "rest":
            rest_rows[i].append((extra, key, int(units), int(cents)))
        elif kind == "other":
            other[i] = (key, int(units), int(cents))
    kept_keys = {key for entries in kept_rows.values() for key, _, _ in entries}
    rounded_steps = []
    for index in range(len(loaded.steps)):
        merged = {}
        first_other = other.get(index, (None,))[0]
        for key, units, cents in sorted(kept_rows[index]):
            if first_other is not None and first_other < key and ("allocated", OTHER_LABEL) not in merged:
                merged[("allocated", OTHER_LABEL)] = other[index][1:]
            merged[("allocated", key)] = (units, cents)
        if first_other is not None and ("allocated", OTHER_LABEL) not in merged:
            merged[("allocated", OTHER_LABEL)] = other[index][1:]
        for _, key, units, cents in sorted(rest_rows[index]):
            leaf = tuple(key.split("/", 1)) if key.startswith("reserved_unused/") else (key,)
            merged[leaf] = (units, cents)
        rounded_steps.append((merged, totals.get(index, (0, 0))))
    return loaded, rounded_steps, (frozenset(kept_keys) if other else None), workload_ids
