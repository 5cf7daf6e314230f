"""The boring metrics, each one small function over the database.

Figures are aggregated in SQL (GROUP BY, correlated subqueries for "until the next row") where the
database does it in one pass; the wait histogram, the seconds by reason and the fallback count are read
as flat rows and counted in Python, where SQL had to evaluate subqueries once or more a row. Durations
are summed as SQL intervals (or timedeltas) and turned into seconds at the end, so the same code runs on
PostgreSQL and on the embedded SQLite. Long reads go through fetch_rows: parsing 66,000 timestamps from
text took most of the seconds by reason. Functions that measure time up to the present take `now`, so a
caller (or a test) decides what the present is.

Labels never come back as None: a workload without a resource class is labelled "" (Prometheus treats an
empty label as absent).
"""

from bisect import bisect_left
from collections import Counter
from datetime import timedelta
from itertools import groupby
from operator import itemgetter

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import (
    BigIntegerField,
    Case,
    CharField,
    Count,
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce

from broker.audit.models import AuditEvent
from broker.costs.models import CapacitySample
from broker.flat_rows import fetch_rows
from broker.inventory.models import Device, TopologyLevel
from broker.metrics.models import PendingSecondsProgress, PendingSecondsRollup
from broker.policy import roles
from broker.policy.models import ResourceClass, ResourceClassDeviceClass, Team
from broker.scheduler.accounting import SHARE_SCALE
from broker.workloads.models import (
    Allocation,
    ExplanationChange,
    PodSet,
    SchedulingCycle,
    Workload,
    WorkloadTransition,
)
from broker.workloads.states import WAITING_STATES, State

WAITING = sorted(WAITING_STATES)
# Upper bounds of the pending-wait histogram: a minute to a week, the range a queue's promises live in.
WAIT_BUCKETS = (60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400)
# History rows the cycle writes that are not reasons to wait: admission closes a stretch of waiting.
NOT_A_WAIT = ("Admitted",)
NOT_YET_EXPLAINED = "NotYetExplained"
WRONG_CLASS_REASONS = ("InvalidRequest", "NotEntitled")
FALLBACK_USED = "FallbackUsed"
FITS_SMALLER_CLASS = "FitsSmallerClass"
# The governance engine's audit action for "this request would fit a smaller resource class".
WRONG_CLASS_GUIDANCE_ACTION = "guidance.wrong_class"
# One role per actor for the intervention count, the most privileged first.
ROLE_ORDER = (roles.ADMIN, roles.OPERATOR, roles.APPROVER, roles.FINANCE, roles.MEMBER)
SYSTEM = "system"
NODE_LEVEL = "node"


def seconds(duration):
    """An SQL interval sum as float seconds (None, for an empty group, is 0)."""
    if duration is None:
        return 0.0
    if isinstance(duration, timedelta):
        return duration.total_seconds()
    # Some backends hand back the raw microseconds of a DurationField aggregate.
    return float(duration) / 1_000_000


def interval(end, start):
    return ExpressionWrapper(end - start, output_field=DurationField())


def label(path):
    return Coalesce(F(path), Value(""), output_field=CharField())


def workload_labels(prefix="workload__"):
    """Team and resource class labels of a row about a workload (for Workload itself, see own_labels)."""
    return {"team": label(f"{prefix}team__name"), "resource_class": label(f"{prefix}resource_class__name")}


def own_labels():
    # Workload has fields named team and resource_class, so its annotations need other names.
    return {"team_label": label("team__name"), "class_label": label("resource_class__name")}


# --- how often and how long workloads pend ----------------------------------------------------------------


def pending_now():
    """Workloads waiting right now, by their latest reason, team and resource class. A waiting workload the
    cycle has not explained yet is AwaitingApproval in that state, else NotYetExplained (as the cost of
    pending counts it)."""
    reason = Coalesce(
        F("explanation__reason"),
        Case(
            When(state=State.AWAITING_APPROVAL, then=Value("AwaitingApproval")),
            default=Value(NOT_YET_EXPLAINED),
        ),
        output_field=CharField(),
    )
    rows = (
        Workload.objects.filter(state__in=WAITING)
        .annotate(reason_label=reason, **own_labels())
        .values("reason_label", "team_label", "class_label")
        .annotate(count=Count("id"))
        .order_by("reason_label", "team_label", "class_label")
    )
    return [
        {"reason": r["reason_label"], "team": r["team_label"], "resource_class": r["class_label"], "count": r["count"]}
        for r in rows
    ]


def waits(workloads=None):
    """(team, resource class, outcome, wait) of each transition that ends a run of waiting (Pending ->
    Admitted, a cancel while queued, ...); `wait` is the time since that run began: at submission, or
    where a held workload was preempted back into the queue (the last transition into waiting from
    outside it). Each workload's transitions are walked in order: as a correlated subquery per end,
    the SQL took most of the histogram's time (0.47 s against 0.2 s for 45,000 transitions)."""
    teams, classes = label_names()
    for _, team, resource_class, outcome, wait in waits_by_workload(workloads):
        yield teams.get(team, ""), classes.get(resource_class, ""), outcome, wait


def waits_by_workload(workloads=None):
    """(workload id, team id, resource class id, outcome, wait) of each completed wait (see waits), of the
    workloads `workloads` (a Q on the workload id's field) selects, or of all."""
    into = Q(to_state__in=WAITING) & ~Q(from_state__in=WAITING)
    out_of = Q(from_state__in=WAITING) & ~Q(to_state__in=WAITING)
    rows = WorkloadTransition.objects.filter(into | out_of)
    if workloads is not None:
        rows = rows.filter(workloads)
    rows = rows.order_by("workload_id", "at", "id").values_list(
        "workload_id", "at", "to_state", "workload__submitted_at", "workload__team_id", "workload__resource_class_id"
    )
    for workload_id, group in groupby(fetch_rows(rows), key=itemgetter(0)):
        began = None
        for _, at, to_state, submitted_at, team, resource_class in group:
            if to_state in WAITING_STATES:
                began = at
            else:
                yield workload_id, team, resource_class, to_state, at - (submitted_at if began is None else began)


def label_names():
    """({team id: name}, {resource class id: name}): the labels of rows read by id (no class: "")."""
    return dict(Team.objects.values_list("pk", "name")), dict(ResourceClass.objects.values_list("pk", "name"))


def wait_durations(buckets=WAIT_BUCKETS):
    """Completed waits by team, resource class and how they ended (Admitted, Cancelled, Failed): count,
    total seconds and cumulative counts at or under each bucket bound (a Prometheus histogram's shape).

    Each wait is read once and counted here: aggregated in SQL, every bucket's FILTER evaluated the
    wait's correlated subquery again, a dozen times a row (2.8 s for 23,000 waits on PostgreSQL)."""
    groups = {}
    for team, resource_class, outcome, wait in waits():
        group = groups.setdefault((team, resource_class, outcome), WaitGroup(buckets))
        group.add(microseconds(wait))
    return wait_rows(groups, buckets)


class WaitGroup:
    """One series of the wait histogram: count, total microseconds and the count at or under each bound.
    Integer microseconds, so groups can be added and taken apart exactly (broker/metrics/checkpoint.py)."""

    def __init__(self, buckets=WAIT_BUCKETS, count=0, total_us=0, le=None):
        self.bounds_us = [bound * 1_000_000 for bound in buckets]
        self.count = count
        self.total_us = total_us
        self.le = list(le) if le is not None else [0] * len(buckets)

    def add(self, wait_us, sign=1):
        self.count += sign
        self.total_us += sign * wait_us
        for index, bound in enumerate(self.bounds_us):
            if wait_us <= bound:
                self.le[index] += sign


def wait_rows(groups, buckets=WAIT_BUCKETS):
    """wait_durations' rows from {(team, resource class, outcome): WaitGroup}; empty groups left out."""
    return [
        {
            "team": team,
            "resource_class": resource_class,
            "outcome": outcome,
            "count": group.count,
            "sum_seconds": seconds(timedelta(microseconds=group.total_us)),
            "buckets": list(zip(buckets, group.le, strict=True)),
        }
        for (team, resource_class, outcome), group in sorted(groups.items())
        if group.count
    ]


def exits_from_waiting(workloads=None):
    """{workload id: [at, ...] ascending}: when each workload left the queue (admitted, cancelled, failed);
    only those of `workloads` (a Q on the workload id's field) when given."""
    rows = WorkloadTransition.objects.filter(from_state__in=WAITING).exclude(to_state__in=WAITING)
    if workloads is not None:
        rows = rows.filter(workloads)
    rows = fetch_rows(rows.order_by("workload_id", "at", "id").values_list("workload_id", "at"))
    return {workload_id: [at for _, at in group] for workload_id, group in groupby(rows, key=itemgetter(0))}


def touched_since(since):
    """A Q on `workload_id`: the workloads whose waiting may have lasted past `since`: those waiting now
    and those with an explanation change or an exit from the queue at or after it. Any other workload's
    last stretch ended (at its next change or exit) before `since`, or never lasted (it left the queue
    with no exit row)."""
    changed = ExplanationChange.objects.filter(at__gte=since).values("workload_id")
    left = (
        WorkloadTransition.objects.filter(at__gte=since, from_state__in=WAITING)
        .exclude(to_state__in=WAITING)
        .values("workload_id")
    )
    return Q(workload__state__in=WAITING) | Q(workload_id__in=changed) | Q(workload_id__in=left)


def stretches_of_waiting(now, since=None):
    """(reason, team id, resource class id, start, end) of each stretch a workload waited under a reason
    (see pending_seconds_by_reason), over all history, or at least those that may end after `since`
    (the caller clips them to it)."""
    for _, reason, team, resource_class, start, end, _ in stretches_by_workload(now, since):
        yield reason, team, resource_class, start, end


def stretches_by_workload(now, since=None, workloads=None):
    """(workload id, reason, team id, resource class id, start, end, open) of each stretch (see
    stretches_of_waiting), of the workloads `workloads` (a Q on the workload id's field) selects when
    given; `open`: it lasts until `now` (the workload still waits under that reason)."""
    # Filtering costs a join and two subqueries: only worth it when there is history before `since`.
    if workloads is None and since is not None and ExplanationChange.objects.filter(at__lt=since).exists():
        workloads = touched_since(since)
    exits = exits_from_waiting(workloads)
    changes = ExplanationChange.objects.all() if workloads is None else ExplanationChange.objects.filter(workloads)
    changes = fetch_rows(
        changes.order_by().values_list(
            "workload_id", "at", "id", "reason", "workload__state", "workload__team_id", "workload__resource_class_id"
        )
    )
    # Sorted here: PostgreSQL's sort of 40,000 joined rows spilled to disk and took longer.
    changes.sort(key=itemgetter(0, 1, 2))
    for workload_id, group in groupby(changes, key=itemgetter(0)):
        history = list(group)
        leaving = exits.get(workload_id, ())
        for index, (_, at, _, reason, state, team, resource_class) in enumerate(history):
            if reason in NOT_A_WAIT:
                continue
            ends = [history[index + 1][1]] if index + 1 < len(history) else []
            position = bisect_left(leaving, at)
            if position < len(leaving):
                ends.append(leaving[position])
            still_waiting = not ends and state in WAITING_STATES
            end = min(ends) if ends else (now if still_waiting else at)
            yield workload_id, reason, team, resource_class, at, end, still_waiting


def microseconds(duration):
    return duration // timedelta(microseconds=1)


def pending_us_by_reason(now, since=None):
    """{(reason, team id, resource class id): microseconds waited}, over all history or from `since` on."""
    totals = {}
    zero = timedelta(0)
    for reason, team, resource_class, start, end in stretches_of_waiting(now, since):
        if since is not None:
            if end <= since and start < since:
                continue  # all of it lies in the rolled-up hours
            start = max(start, since)
        # A stretch of no time still makes its series appear, at 0, as it always has.
        key = (reason, team, resource_class)
        totals[key] = totals.get(key, zero) + (end - start)
    return Counter({key: microseconds(total) for key, total in totals.items()})


def pending_us_by_hour(now, start, end):
    """{(hour, reason, team id, resource class id): microseconds waited within that hour}, for the whole
    hours of [start, end)."""
    hour = timedelta(hours=1)
    totals = Counter()
    for reason, team, resource_class, a, b in stretches_of_waiting(now, start):
        if start <= a < end and a == b:
            # No time, but its series exists from then on (see pending_us_by_reason).
            totals[(a.replace(minute=0, second=0, microsecond=0), reason, team, resource_class)] += 0
        a, b = max(a, start), min(b, end)
        while a < b:
            floor = a.replace(minute=0, second=0, microsecond=0)
            cut = min(b, floor + hour)
            totals[(floor, reason, team, resource_class)] += microseconds(cut - a)
            a = cut
    return totals


def rolled_pending_us(now):
    """(the rollup's {(reason, team id, resource class id): microseconds}, the moment it covers up to),
    or ({}, None) when nothing before `now` is rolled up."""
    until = PendingSecondsProgress.reached()
    if until is None or until > now:
        return {}, None
    rows = (
        PendingSecondsRollup.objects.filter(hour__lt=until)
        .values("reason", "team_id", "resource_class_id")
        .annotate(total=Sum("us"))
        .order_by()
    )
    return {(r["reason"], r["team_id"], r["resource_class_id"]): r["total"] for r in rows}, until


def pending_seconds_by_reason(now, rolled=True):
    """Seconds spent waiting under each reason code, by team and resource class, over all history. A
    reason stands from its ExplanationChange until the workload's next change, or until it left the
    queue, whichever came first; for a workload still waiting, until `now`.

    The whole hours the rollup covers (broker/metrics/rolling.py) are read from it, in exact
    microseconds; only the time since is walked here (`rolled=False`: all of it, as the rollup's tests
    compare). Each workload's changes and exits are walked in
    order: in SQL, the next change and the next exit were two correlated subqueries per change (1.06 s
    against 0.67 s for 40,000 changes)."""
    rolled, until = rolled_pending_us(now) if rolled else ({}, None)
    totals = Counter(rolled)
    totals.update(pending_us_by_reason(now, until))
    return seconds_rows(totals)


def seconds_rows(totals):
    """pending_seconds_by_reason's rows from {(reason, team id, resource class id): microseconds}."""
    teams, classes = label_names()
    named = Counter()
    for (reason, team, resource_class), us in totals.items():
        named[(reason, teams.get(team) or "", classes.get(resource_class) or "")] += us
    return [
        {
            "reason": reason,
            "team": team,
            "resource_class": resource_class,
            "seconds": seconds(timedelta(microseconds=total)),
        }
        for (reason, team, resource_class), total in sorted(named.items())
    ]


def workloads_pended_by_reason():
    """How often: the number of distinct workloads that ever waited under each reason code."""
    rows = (
        ExplanationChange.objects.exclude(reason__in=NOT_A_WAIT)
        .annotate(**workload_labels())
        .values("reason", "team", "resource_class")
        .annotate(count=Count("workload", distinct=True))
        .order_by("reason", "team", "resource_class")
    )
    return [dict(r) for r in rows]


# --- the wrong class ---------------------------------------------------------------------------------------


def fallbacks_used():
    """{(team, resource class): workloads admitted on a device class other than the first they asked for}.
    The first is their first pod set's own fallback list's head, else their resource class's (the lowest
    rank). Matched here over three flat reads: as correlated subqueries per workload it took 1.3 s for
    70,000 workloads on PostgreSQL."""
    teams, classes = label_names()
    counts = Counter()
    for _, team, resource_class in fallback_workloads(menu_heads()):
        counts[(teams.get(team, ""), classes.get(resource_class, ""))] += 1
    return counts


def menu_heads():
    """{resource class id: the name of its first device class (the lowest rank)}."""
    heads = {}
    for resource_class_id, name in ResourceClassDeviceClass.objects.order_by("-rank").values_list(
        "resource_class_id", "device_class__name"
    ):
        heads[resource_class_id] = name  # descending rank: the lowest is written last
    return heads


def fallback_workloads(heads, workloads=None):
    """(workload id, team id, resource class id) of each workload admitted on a device class other than
    the first it asked for (see fallbacks_used), given the menus' heads (menu_heads); only of the
    workloads `workloads` selects when given (an object whose on(field) is a Q on that field: the
    metrics checkpoint's touched workloads, broker/metrics/checkpoint.py)."""
    own_heads = {}
    # The list's head taken in SQL: decoding 50,000 JSON lists cost more than the rest of this together.
    pod_sets = PodSet.objects.filter(workload__chosen_device_class__isnull=False)
    if workloads is not None:
        pod_sets = pod_sets.filter(workloads.on("workload_id"))
    pod_sets = pod_sets.annotate(head=KeyTextTransform("0", "device_classes")).order_by("workload_id", "id")
    # Both read flat: Django's row iteration of 50,000 rows each cost more than the queries.
    for workload_id, head in fetch_rows(pod_sets.values_list("workload_id", "head")):
        own_heads.setdefault(workload_id, head)  # the first pod set only
    admitted = Workload.objects.filter(chosen_device_class__isnull=False)
    if workloads is not None:
        admitted = admitted.filter(workloads.on("pk"))
    admitted = admitted.values_list("id", "resource_class_id", "chosen_device_class__name", "team_id")
    for workload_id, resource_class_id, chosen, team in fetch_rows(admitted):
        first = own_heads.get(workload_id)
        if first is None:
            first = heads.get(resource_class_id)
        if first is not None and first != chosen:
            yield workload_id, team, resource_class_id


def reasons_by_workload(workloads=None):
    """(workload id, reason, team id, resource class id) of each reason other than a wait's end (Admitted)
    each workload was ever explained by, once each, of the workloads `workloads` selects when given."""
    rows = ExplanationChange.objects.exclude(reason__in=NOT_A_WAIT)
    if workloads is not None:
        rows = rows.filter(workloads)
    rows = (
        rows.order_by()
        .values_list("workload_id", "reason", "workload__team_id", "workload__resource_class_id")
        .distinct()
    )
    return fetch_rows(rows)


def wrong_class_requests(explained=None, fallbacks=None):
    """Requests for the wrong class, by kind, team and resource class:
    - InvalidRequest / NotEntitled: workloads ever explained so (it can never run; the team may not use it);
    - FallbackUsed: workloads admitted on a device class other than the first one they asked for;
    - FitsSmallerClass: the governance engine's `guidance.wrong_class` audit events about a workload.
    `explained` (rows of reason, team, resource_class, count) and `fallbacks` (fallbacks_used's shape)
    are the first two kinds when the caller has them already (broker/metrics/checkpoint.py)."""
    rows = []
    if explained is None:
        explained = (
            ExplanationChange.objects.filter(reason__in=WRONG_CLASS_REASONS)
            .annotate(**workload_labels())
            .values("reason", "team", "resource_class")
            .annotate(count=Count("workload", distinct=True))
            .order_by("reason", "team", "resource_class")
        )
    if fallbacks is None:
        fallbacks = fallbacks_used()
    rows += [
        {"kind": r["reason"], "team": r["team"], "resource_class": r["resource_class"], "count": r["count"]}
        for r in explained
    ]
    rows += [
        {"kind": FALLBACK_USED, "team": team, "resource_class": resource_class, "count": count}
        for (team, resource_class), count in sorted(fallbacks.items())
    ]
    rows += [{"kind": FITS_SMALLER_CLASS, **r} for r in wrong_class_guidance()]
    return rows


def wrong_class_guidance():
    """`guidance.wrong_class` audit events by the team and resource class of the workload they name."""

    def of_target(field):
        target = Workload.objects.filter(pk=Cast(OuterRef("target_id"), BigIntegerField())).values(field)[:1]
        # Only a workload's target_id is a workload key; the CASE keeps the cast away from other rows.
        return Coalesce(
            Case(When(target_type=Workload._meta.label_lower, then=Subquery(target, output_field=CharField()))),
            Value(""),
            output_field=CharField(),
        )

    return list(
        AuditEvent.objects.filter(action=WRONG_CLASS_GUIDANCE_ACTION)
        .annotate(team=of_target("team__name"), resource_class=of_target("resource_class__name"))
        .values("team", "resource_class")
        .annotate(count=Count("id"))
        .order_by("team", "resource_class")
    )


# --- stranded capacity -------------------------------------------------------------------------------------


def latest_capacity():
    """The latest capacity sample of each device class (a sample holds until the next one). Unhealthy and
    stranded count what shared devices leave in those states too (their shares' remainders), in devices."""
    latest = CapacitySample.objects.filter(device_class=OuterRef("device_class")).order_by("-at").values("at")[:1]
    rows = (
        CapacitySample.objects.filter(at=Subquery(latest))
        .values("device_class__name", "at", "total", "unhealthy", "reserved_unused", "stranded", "shared")
        .order_by("device_class__name")
    )
    return [
        {
            "device_class": r["device_class__name"],
            "at": r["at"],
            "total": r["total"],
            "unhealthy": r["unhealthy"] + shared_part(r["shared"], "unhealthy"),
            "reserved_unused": r["reserved_unused"],
            "stranded": r["stranded"] + shared_part(r["shared"], "stranded"),
        }
        for r in rows
    ]


def shared_part(shared, category):
    """Devices (a fraction of one, or more) that shared devices leave in `category`, from a sample's
    `shared` {category: millionths of a device}: an int when there are none."""
    millionths = (shared or {}).get(category, 0)
    return millionths / SHARE_SCALE if millionths else 0


def stranded_device_seconds(now):
    """{device class: stranded device-seconds since the first sample}. Each sample's stranded count holds
    until the class's next sample, the last one until `now`. SQL sums the time per (class, count); the
    multiplication by the count is done here so the SQL stays plain interval arithmetic."""
    following = (
        CapacitySample.objects.filter(device_class=OuterRef("device_class"), at__gt=OuterRef("at"), at__lte=now)
        .order_by("at")
        .values("at")[:1]
    )
    end = Coalesce(Subquery(following, output_field=DateTimeField()), Value(now, output_field=DateTimeField()))
    rows = (
        CapacitySample.objects.filter(at__lte=now)
        .annotate(held=interval(end, F("at")))
        .values("device_class__name", "stranded", "shared")
        .annotate(total=Sum("held"))
        .order_by("device_class__name")
    )
    out = {}
    for r in rows:
        name = r["device_class__name"]
        stranded = r["stranded"] + shared_part(r["shared"], "stranded")
        out[name] = out.get(name, 0.0) + stranded * seconds(r["total"])
    return out


# --- manual interventions ---------------------------------------------------------------------------------


def actor_role():
    """The actor's most privileged role; "system" for events no person made."""
    membership = get_user_model().groups.through.objects

    def holds(role):
        return Exists(membership.filter(user_id=OuterRef("actor_id"), group__name=role))

    # A user removed since keeps actor_name but loses actor: still a person, role unknown.
    return Case(
        When(actor__isnull=True, actor_name__in=[SYSTEM, ""], then=Value(SYSTEM)),
        When(actor__isnull=True, then=Value("unknown")),
        When(actor__is_superuser=True, then=Value(roles.ADMIN)),
        *[When(holds(role), then=Value(role)) for role in ROLE_ORDER],
        default=Value("none"),
        output_field=CharField(),
    )


def manual_interventions():
    """Audit events marked as a manual intervention, by action and the actor's role."""
    rows = (
        AuditEvent.objects.filter(manual_intervention=True)
        .annotate(role=actor_role())
        .values("action", "role")
        .annotate(count=Count("id"))
        .order_by("action", "role")
    )
    return [dict(r) for r in rows]


# --- placement topology and runtime ------------------------------------------------------------------------


def level_domain(level_name, depth):
    """The id of the allocated device's domain on `level_name`: the node's own domain or one of its
    ancestors, whichever sits on that level (nodes hang off the finest level, `depth` levels deep)."""
    whens = []
    path = "device__node__domain"
    for _ in range(depth):
        whens.append(When(**{f"{path}__level__name": level_name}, then=F(f"{path}_id")))
        path += "__parent"
    return Case(*whens, default=None, output_field=BigIntegerField())


def span_of_last_placement(level_name, depth):
    """Subquery: how many domains of the level the workload's latest placement covered. The latest
    placement is the allocations made at or after its last admission (a requeued workload had others)."""
    distinct = F("device__node_id") if level_name == NODE_LEVEL else level_domain(level_name, depth)
    spans = (
        Allocation.objects.filter(workload=OuterRef("pk"), allocated_at__gte=OuterRef("admitted_at"))
        .values("workload")
        .annotate(span=Count(distinct, distinct=True))
        .values("span")
    )
    return Subquery(spans, output_field=BigIntegerField())


def runtime_by_span():
    """Succeeded workloads by how many domains of each level their pods spanned: count and total runtime
    (started -> finished), so the mean runtime per span is sum / count."""
    levels = list(TopologyLevel.objects.order_by("order").values_list("name", flat=True))
    finished = Workload.objects.filter(
        state=State.SUCCEEDED, admitted_at__isnull=False, started_at__isnull=False, finished_at__isnull=False
    )
    out = []
    # The node is always the finest level, whether or not the inventory names it as one.
    for level_name in levels if NODE_LEVEL in levels else [*levels, NODE_LEVEL]:
        rows = (
            finished.annotate(span=span_of_last_placement(level_name, len(levels)))
            .filter(span__gt=0)
            .values("span")
            .annotate(count=Count("id"), total=Sum(interval(F("finished_at"), F("started_at"))))
            .order_by("span")
        )
        out += [
            {"level": level_name, "span": r["span"], "count": r["count"], "sum_seconds": seconds(r["total"])}
            for r in rows
        ]
    return out


# --- operational gauges ------------------------------------------------------------------------------------


def cycles():
    return SchedulingCycle.objects.filter(cluster=settings.CLUSTER_NAME)


def cycles_by_outcome():
    rows = cycles().values("outcome").annotate(count=Count("id")).order_by("outcome")
    return {r["outcome"]: r["count"] for r in rows}


def last_cycle():
    """The last finished cycle's timings (milliseconds, as stored), or None before the first."""
    return (
        cycles()
        .filter(finished_at__isnull=False)
        .order_by("-finished_at", "-id")
        .values("id", "outcome", "finished_at", "load_ms", "decide_ms", "commit_ms", "pending_count", "admitted_count")
        .first()
    )


def decide_time_totals():
    """Committed cycles: how many, and their decide time summed (milliseconds)."""
    committed = cycles().filter(outcome=SchedulingCycle.Outcome.COMMITTED)
    totals = committed.aggregate(count=Count("id"), ms=Sum("decide_ms"))
    return {"count": totals["count"], "sum_ms": totals["ms"] or 0.0}


def devices_by_health():
    rows = Device.objects.values("health").annotate(count=Count("id")).order_by("health")
    return {r["health"]: r["count"] for r in rows}


def workloads_by_state():
    rows = Workload.objects.values("state").annotate(count=Count("id")).order_by("state")
    return {r["state"]: r["count"] for r in rows}
