"""The cost of pending: requested devices x price x time waiting, by workload, team and reason code.
A time-sliced pod set's devices count for the share its capacity amounts take of one (RequestedShares).

An opportunity cost, shown beside the bill and never added to it. A workload waits while its state is
Submitted, AwaitingApproval, Pending or Preempted (WorkloadTransition history, from its submission). The
reason for each moment is the latest ExplanationChange made since that stretch of waiting began; before
the first explanation of a stretch it is AwaitingApproval in that state, else NotYetExplained. The price is
that of the first device class in each pod set's fallback list (what it asked for first), at that moment.
"""

from __future__ import annotations

import json
from collections import defaultdict

from django.db.models import Case, Q, TextField, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from broker import clock
from broker.costs import checkpoint, ledger, rollup
from broker.costs.models import PendingCheckpointRow
from broker.costs.prices import price_timelines
from broker.costs.report import entry, round_leaves
from broker.costs.windows import from_us, steps_of, to_us
from broker.flat_rows import fetch_rows
from broker.inventory import quantities
from broker.inventory.models import Device
from broker.policy.models import DeviceClass, ResourceClassDeviceClass
from broker.scheduler import accounting
from broker.scheduler import snapshot as core
from broker.scheduler.selectors import ClassMatcher
from broker.workloads.models import ExplanationChange, PodSet, Workload, WorkloadTransition
from broker.workloads.states import FINAL_STATES, WAITING_STATES, State

PENDING_AGGREGATES = ("workload", "team", "queue", "reason", "device_class")
NOT_YET_EXPLAINED = "NotYetExplained"


def waiting_stretches(submitted_at, transitions):
    """[(start, end or None, state at start)] from the submission and [(at, to_state)] ascending; each
    stretch is split where the state changes between two waiting states."""
    stretches = []
    state, since = State.SUBMITTED, submitted_at
    for at, to_state in transitions:
        if state in WAITING_STATES:
            stretches.append((since, at, state))
        state, since = to_state, at
    if state in WAITING_STATES:
        stretches.append((since, None, state))
    return stretches


def reasons_over(stretches, changes):
    """[(start, end or None, reason)]: the waiting time cut by reason. A change counts from its time within
    the same run of waiting (consecutive stretches); a new run starts unexplained."""
    out = []
    run_start = None
    previous_end = object()
    for start, end, state in stretches:
        if start != previous_end:
            run_start = start
        previous_end = end
        fallback = "AwaitingApproval" if state == State.AWAITING_APPROVAL else NOT_YET_EXPLAINED
        current = [(at, reason) for at, reason in changes if run_start <= at <= start]
        reason = current[-1][1] if current else fallback
        cursor = start
        for at, new_reason in changes:
            if at <= start or (end is not None and at >= end):
                continue
            if new_reason != reason:
                out.append((cursor, at, reason))
                cursor, reason = at, new_reason
        out.append((cursor, end, reason))
    return [(a, b, reason) for a, b, reason in out if b is None or b > a]


def first_class_requests(workloads):
    """{workload id: [(device class id, devices requested)]}: each pod set at its first-choice class, for
    the workloads of the queryset `workloads`."""
    by_name = dict(DeviceClass.objects.values_list("name", "pk"))
    first_of_rc = {}
    for rc_id, class_id in ResourceClassDeviceClass.objects.order_by("-rank").values_list(
        "resource_class_id", "device_class_id"
    ):
        first_of_rc[rc_id] = class_id  # descending rank: the last one written is rank 0
    out = defaultdict(list)
    # The list's head taken in SQL: decoding every pod set's JSON list was a quarter of a report. Read
    # flat: Django's row iteration of 60,000 pod sets cost more than the query.
    # The capacity amounts of a time-sliced pod set (few) read as text: the rest have none ("{}").
    amounts = Case(When(capacity={}, then=Value(None)), default=Cast("capacity", TextField()), output_field=TextField())
    rows = (
        PodSet.objects.filter(workload__in=workloads.values("pk"))
        .annotate(head=KeyTextTransform("0", "device_classes"), amounts=amounts)
        .values_list("workload_id", "workload__resource_class_id", "head", "replicas", "devices_per_pod", "amounts")
    )
    shares = None
    for workload_id, rc_id, head, replicas, per_pod, capacity in fetch_rows(rows):
        class_id = by_name.get(head) if head is not None else first_of_rc.get(rc_id)
        if class_id is None:
            continue
        if capacity is None:
            out[workload_id].append((class_id, replicas * per_pod))
            continue
        shares = shares or RequestedShares()
        out[workload_id].append((class_id, replicas * per_pod * shares.of(class_id, capacity)))
    return out


class RequestedShares:
    """What a time-sliced pod set's device counts for while it waits: the share its amounts take of the
    class's shared devices (accounting.device_share), against the largest value of each capacity any
    shared device of the class publishes: the least it could be billed once placed. A class with no
    shared device counts whole devices."""

    def __init__(self):
        self.classes = {
            pk: ClassMatcher((core.DeviceClass(name, selector=selector or None),))
            for pk, name, selector in DeviceClass.objects.values_list("pk", "name", "selector")
        }
        self.devices = [
            (core.Device(str(pk), str(node_id), driver, attributes or {}, numeric), numeric)
            for pk, node_id, driver, attributes, capacity in Device.objects.filter(
                allow_multiple_allocations=True
            ).values_list("pk", "node_id", "driver", "attributes", "capacity")
            for numeric in (quantities.numbers(capacity),)
        ]
        self.largest = {}
        self.known = {}

    def of(self, class_id, amounts_text):
        key = (class_id, amounts_text)
        if key not in self.known:
            largest = self.largest.get(class_id)
            if largest is None:
                largest = self.largest[class_id] = {}
                matcher = self.classes.get(class_id)
                for device, capacity in self.devices:
                    if matcher is not None and matcher.classes_of(device):
                        for name, value in capacity.items():
                            largest[name] = max(largest.get(name, 0), value)
            amounts = quantities.numbers(json.loads(amounts_text))
            self.known[key] = accounting.device_share(largest, amounts) if largest else 1
        return self.known[key]


def pending_intervals(start, end, now, team_ids=None, listed=True, only=None, names=None):
    """Ledger intervals of waiting, line = (workload id, reason), one per pod set's first-choice class;
    and the names of the workloads: with `listed`, of every workload not finished before `start` (a
    report by workload lists them). Without, only the workloads that may have waited in the window are
    read, and the lines are ((rollup.GROUP, team id, queue id), reason), named by group. `only`: a
    filter of the workloads to read (checkpoint.waiters_changed_since)."""
    workloads = Workload.objects.filter(submitted_at__lt=min(end, now)).filter(
        Q(finished_at__isnull=True) | Q(finished_at__gt=start) | Q(state__in=WAITING_STATES)
    )
    if only is not None:
        workloads = workloads.filter(only)
    if not listed:
        # Waiting at some moment of the window means waiting now, or submitted in it, or a transition
        # since its start (into waiting, or out of it): on a full cluster the tens of thousands running
        # since before the window are none of these, and their histories were most of the report.
        moved = WorkloadTransition.objects.filter(at__gte=start).values("workload_id")
        workloads = workloads.filter(Q(state__in=WAITING_STATES) | Q(submitted_at__gte=start) | Q(pk__in=moved))
    if team_ids is not None:
        workloads = workloads.filter(team_id__in=team_ids)
    fields = ("pk", "name", "submitted_at", "state", "team__name", "queue__name", "team_id", "queue_id")
    # Read flat and made dicts here: Django's dict rows cost more than the query.
    meta = {row[0]: dict(zip(fields, row, strict=True)) for row in fetch_rows(workloads.values_list(*fields))}
    # The same workloads as a subquery, not their ids as parameters: a month of a busy cluster is tens of
    # thousands of workloads.
    selected = workloads.values("pk")
    transitions, changes = defaultdict(list), defaultdict(list)
    for workload_id, at, to_state in fetch_rows(
        WorkloadTransition.objects.filter(workload__in=selected)
        .values_list("workload_id", "at", "to_state")
        .order_by("at", "id")
    ):
        transitions[workload_id].append((at, to_state))
    for workload_id, at, reason in fetch_rows(
        ExplanationChange.objects.filter(workload__in=selected)
        .values_list("workload_id", "at", "reason")
        .order_by("at", "id")
    ):
        changes[workload_id].append((at, reason))
    requests = first_class_requests(workloads)
    window_start, window_end = to_us(start), to_us(min(end, now))
    held = defaultdict(int)
    for workload_id, row in meta.items():
        if row["state"] in FINAL_STATES and not transitions[workload_id]:
            continue  # its history was pruned (HISTORY_RETENTION_DAYS): when it waited is not known
        stretches = waiting_stretches(row["submitted_at"], transitions[workload_id])
        owner = workload_id if listed else (rollup.GROUP, row["team_id"], row["queue_id"])
        for a, b, reason in reasons_over(stretches, changes[workload_id]):
            a, b = to_us(a), None if b is None else to_us(b)
            if not listed:
                # Clipped to the window as the ledger clips them, so that a group's many waits that cover
                # all of it become one interval.
                if (b is not None and b <= window_start) or a >= window_end:
                    continue
                a, b = max(a, window_start), None if b is None or b >= window_end else b
            for class_id, devices in requests.get(workload_id, []):
                held[(a, b, class_id, (owner, reason))] += devices
    intervals = [ledger.Interval(a, b, class_id, line, devices) for (a, b, class_id, line), devices in held.items()]
    if not listed:
        names = names or rollup.GroupNames()
        meta = {
            (rollup.GROUP, team_id, queue_id): names.pending_meta(team_id, queue_id)
            for team_id, queue_id in {(row["team_id"], row["queue_id"]) for row in meta.values()}
        }
    return intervals, meta


def pending_report(start, end, aggregate=("team",), step="day", now=None, team_ids=None):
    """Per step, aggregate -> {device_hours (requested devices x hours waiting), cost}, and totals."""
    now = now or timezone.now()
    steps = steps_of(start, end, step)
    listed = "workload" in aggregate
    with checkpoint.one_snapshot():
        prices = {pk: [(to_us(at), units) for at, units in rows] for pk, rows in price_timelines().items()}
        ledgers = [ledger.StepLedger(to_us(a), to_us(b)) for a, b in steps]
        # A report by workload names workloads: the rollup and the checkpoint only know their groups.
        span = None if listed else rollup.covered(rollup.PENDING, start, end, now)
        names = None if listed else rollup.GroupNames()
        meta = rollup.stitch(
            ledgers, steps, start, end, span,
            usable=lambda p, q: None if listed else checkpoint.usable(rollup.PENDING, p, q, now),
            add_checkpoint=lambda found: rollup.add_pending(
                ledgers, (found.base, found.until), step, names, team_ids, PendingCheckpointRow
            ),
            tail=lambda windows, found: tail_ledger(windows, now, prices, found, names, team_ids),
            direct=lambda windows: direct_ledger(windows, now, prices, team_ids, listed=listed, names=names),
            add_span=lambda span: rollup.add_pending(ledgers, span, step, names, team_ids),
        )  # fmt: skip
        class_names = dict(DeviceClass.objects.values_list("pk", "name"))
    steps_out, totals, total_sum = [], defaultdict(lambda: [0, 0]), [0, 0]
    for step_ledger in ledgers:
        leaves = defaultdict(ledger.Amount)
        for ((line, reason), class_id), amount in step_ledger.allocated.items():
            key = _key(meta[line], reason, class_names[class_id], aggregate)
            leaves[key].device_us += amount.device_us
            leaves[key].raw += amount.raw
        rounded, (units_total, cents_total) = round_leaves(dict(sorted(leaves.items())))
        for key, (units, cents) in rounded.items():
            totals[key][0] += units
            totals[key][1] += cents
        total_sum[0] += units_total
        total_sum[1] += cents_total
        steps_out.append(
            {
                "start": from_us(step_ledger.start),
                "end": from_us(step_ledger.end),
                "pending": {key: entry(*value) for key, value in rounded.items()},
                "total": entry(units_total, cents_total),
            }
        )
    report = {
        "window": {"start": start, "end": end},
        "aggregate": ",".join(aggregate),
        "step": step,
        "steps": steps_out,
        "totals": {
            "pending": {key: entry(*value) for key, value in sorted(totals.items())},
            "total": entry(*total_sum),
        },
    }
    if "workload" in aggregate:
        report["workloads"] = {
            f"{row['team__name']}/{row['name']}": {"name": row["name"], "team": row["team__name"]}
            for row in meta.values()
            if row["name"] is not None
        }
    return report


def direct_ledger(steps, now, prices, team_ids=None, listed=False, names=None):
    """(StepLedgers of the contiguous `steps` [(start, end)] from the workloads' own history, {workload
    id: names}, see pending_intervals); the lines of `allocated` are (workload id, reason)."""
    steps_ledger, meta, _ = direct_intervals_ledger(steps, now, prices, team_ids, listed, names)
    return steps_ledger, meta


def direct_intervals_ledger(steps, now, prices, team_ids=None, listed=False, names=None):
    """direct_ledger's (StepLedgers, names), and the intervals billed."""
    start, end = steps[0][0], steps[-1][1]
    intervals, meta = pending_intervals(start, end, now, team_ids, listed, names=names)
    us_steps = [(to_us(a), to_us(b)) for a, b in steps]
    steps_ledger = ledger.build_ledger(us_steps, to_us(now), prices, {}, intervals, clock.billing_scale())
    return steps_ledger, meta, intervals


def tail_ledger(steps, now, prices, found, names, team_ids=None):
    """direct_ledger(steps, now, prices, team_ids) by group, for the `steps` from the Checkpoint `found`'s
    `until` on: the waiting open at `until` billed on, except for the workloads submitted, moved or
    explained anew since, whose own waiting at `until` is taken out and whose waiting since is read
    from their history instead (report.tail_ledger says why this is exact)."""
    start, end = steps[0][0], steps[-1][1]
    until = to_us(found.until)
    changed = checkpoint.waiters_changed_since(found.until)
    intervals, meta = [], {}
    for class_id, team_id, queue_id, _, reason, devices in checkpoint.open_groups(rollup.PENDING, team_ids):
        group = (rollup.GROUP, team_id, queue_id)
        meta.setdefault(group, names.pending_meta(team_id, queue_id))
        intervals.append(ledger.Interval(until, None, class_id, (group, reason), devices))
    if changed:
        only = Q(pk__in=changed)
        waiting_then, then_meta = pending_intervals(
            found.base, found.until, found.until, team_ids, listed=False, only=only, names=names
        )
        for interval in waiting_then:
            if interval.end is None:  # still waiting at `until`: in the checkpoint's open groups
                intervals.append(ledger.Interval(until, None, interval.device_class, interval.line, -interval.devices))
        since, since_meta = pending_intervals(start, end, now, team_ids, listed=False, only=only, names=names)
        intervals.extend(since)
        meta.update(then_meta)
        meta.update(since_meta)
    us_steps = [(to_us(a), to_us(b)) for a, b in steps]
    steps_ledger = ledger.build_ledger(us_steps, to_us(now), prices, {}, intervals, clock.billing_scale())
    for step_ledger in steps_ledger:
        step_ledger.drop_empty_lines()
    return steps_ledger, meta


def _key(row, reason, class_name, aggregate):
    parts = []
    for dim in aggregate:
        parts.append(
            {
                "workload": f"{row['team__name']}/{row['name']}",
                "team": row["team__name"],
                "queue": row["queue__name"],
                "reason": reason,
                "device_class": class_name,
            }[dim]
        )
    return "/".join(parts)
