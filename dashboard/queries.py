"""What the dashboard pages and their JSON endpoints show, computed with aggregate queries.

Functions take the requesting user where visibility matters: operators and approvers read every team's
workloads; everybody else reads their own teams' workloads and sees the rest only as counts.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, Exists, ExpressionWrapper, F, Max, Min, OuterRef, Q, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from broker.inventory.models import Device, Domain, Health, Node, TopologyLevel
from broker.inventory.quantities import quantity
from broker.kube.models import Cluster as KubeCluster
from broker.kube.models import MirroredNode, MirroredPodGroup, MirroredSlice
from broker.policy.models import Queue, ResourceClass, Team
from broker.policy.roles import sees_all_workloads, team_ids
from broker.scheduler.snapshot import HELD_OUTSIDE_TAINT, REASON_CODES
from broker.workloads.models import (
    Allocation,
    Explanation,
    ExplanationChange,
    PodSet,
    SchedulingCycle,
    Workload,
    WorkloadTransition,
)
from broker.workloads.states import HOLDING_STATES, WAITING_STATES, State
from dashboard.inventory_state import STATES, cached, current_state, held_outside_q, inventory_state, with_taints_text

QUEUE_PAGE_SIZE = 100
# One colour per team, from its id: the same on every load, in the rack map, the drill-down and the
# legend (an index into the teams present moved colours whenever a team started or stopped running).
TEAM_PALETTE = ("#2f6feb", "#12b76a", "#0e9384", "#7a2e0e", "#66c61c", "#0086c9", "#c11574", "#444ce7", "#b54708")
NATURAL_PARTS = re.compile(r"(\d+)")


def natural_key(name):
    """Sort key putting m2 before m10 (names as people number them)."""
    return tuple(int(part) if part.isdigit() else part for part in NATURAL_PARTS.split(name or ""))


def team_colors():
    return {name: TEAM_PALETTE[pk % len(TEAM_PALETTE)] for pk, name in Team.objects.values_list("pk", "name")}


# --- visibility ------------------------------------------------------------------------------------------


def visible_workloads(user):
    workloads = Workload.objects.all()
    if sees_all_workloads(user):
        return workloads
    return workloads.filter(team_id__in=team_ids(user))


def can_see(user, team_id):
    return sees_all_workloads(user) or team_id in team_ids(user)


# --- overview --------------------------------------------------------------------------------------------


def shared_summary(key=None):
    """The part of the overview no user changes (capacity per class, device totals): computed once
    per change of the inventory state and shared by every page, JSON call and socket."""
    return cached("summary", _summary, key)


def _summary(key):
    state = current_state(key)
    totals = dict.fromkeys(STATES, 0)
    for group in state.groups:
        for key in STATES:
            totals[key] += group.counts[key]
    return {"capacity": capacity_by_class(state), "totals": totals}


def capacity_by_class(state=None):
    if state is None:
        return shared_summary()["capacity"]
    rows = []
    for name, counts in sorted(state.by_class().items()):
        total = sum(counts.values())
        price = state.classifier.prices.get(name, 0.0)
        rows.append(
            {
                "device_class": name,
                "price_per_hour": price,
                "total": total,
                **counts,
                "idle_cost_per_hour": round((counts["free"] + counts["stranded"] + counts["reserved"]) * price, 2),
                "min_pending_request": state.min_request.get(name),
            }
        )
    return rows


def pending_by_reason(user):
    """Pending workloads per reason code: every team's as counts, plus the user's own teams'."""
    waiting = Workload.objects.filter(state__in=WAITING_STATES)
    rows = waiting.order_by().values("explanation__reason").annotate(n=Count("id"))
    mine = dict(
        waiting.filter(team_id__in=team_ids(user))
        .order_by()
        .values("explanation__reason")
        .annotate(n=Count("id"))
        .values_list("explanation__reason", "n")
    )
    counts = {row["explanation__reason"] or "NotYetExplained": row["n"] for row in rows}
    mine = {(reason or "NotYetExplained"): n for reason, n in mine.items()}
    order = [*REASON_CODES, "NotYetExplained"]
    ordered = sorted(counts, key=lambda code: order.index(code) if code in order else len(order))
    return [{"reason": code, "count": counts[code], "mine": mine.get(code, 0)} for code in ordered]


def cycle_series(limit=200):
    cycles = list(
        SchedulingCycle.objects.filter(outcome=SchedulingCycle.Outcome.COMMITTED).values(
            "id",
            "started_at",
            "admitted_count",
            "preempted_count",
            "pending_count",
            "load_ms",
            "decide_ms",
            "commit_ms",
        )[:limit]
    )
    cycles.reverse()
    return {
        "at": [c["started_at"].isoformat() for c in cycles],
        "admitted": [c["admitted_count"] for c in cycles],
        "preempted": [c["preempted_count"] for c in cycles],
        "pending": [c["pending_count"] for c in cycles],
        "duration_ms": [round(c["load_ms"] + c["decide_ms"] + c["commit_ms"], 1) for c in cycles],
    }


def cycle_health():
    since = timezone.now() - timedelta(hours=1)
    outcomes = dict(
        SchedulingCycle.objects.filter(started_at__gte=since)
        .order_by()
        .values("outcome")
        .annotate(n=Count("id"))
        .values_list("outcome", "n")
    )
    return {"last_hour": outcomes}


def workload_row(workload, explanation=None, visible=True):
    """One workload as the queue table and the live deltas carry it."""
    row = {
        "id": workload.pk,
        "team": workload.team.name,
        "state": workload.state,
        "visible": visible,
    }
    if not visible:
        return row
    explanation = explanation if explanation is not None else getattr(workload, "explanation", None)
    row.update(
        {
            "name": workload.name,
            "queue": workload.queue.name,
            "resource_class": workload.resource_class.name if workload.resource_class_id else "",
            "priority": workload.priority,
            "devices": workload_devices(workload),
            "submitted_at": workload.submitted_at.isoformat(),
            "admitted_at": workload.admitted_at.isoformat() if workload.admitted_at else None,
            "reason": explanation.reason if explanation and workload.state in WAITING_STATES else "",
            "message": explanation.message if explanation and workload.state in WAITING_STATES else "",
            "position_in_queue": explanation.position_in_queue if explanation else None,
            "position_in_cluster": explanation.position_in_cluster if explanation else None,
            "estimated_start": (
                explanation.estimated_start.isoformat() if explanation and explanation.estimated_start else None
            ),
            "url": f"/workloads/{workload.pk}/",
        }
    )
    return row


def workload_devices(workload):
    cached = getattr(workload, "device_total", None)
    if cached is not None:
        return cached
    return sum(p.replicas * p.devices_per_pod for p in workload.pod_sets.all())


def last_cycle_changes(user, cycle=None):
    """What the last committed cycle admitted, preempted and re-explained."""
    cycle = cycle or SchedulingCycle.objects.filter(outcome=SchedulingCycle.Outcome.COMMITTED).first()
    if cycle is None:
        return None
    window_end = cycle.finished_at or timezone.now()
    preempted = WorkloadTransition.objects.filter(
        to_state=State.PREEMPTED, at__gte=cycle.started_at, at__lte=window_end + timedelta(seconds=1)
    )
    # Its history rows, one per admitted workload (an allocation row is one per device).
    history = ExplanationChange.objects.filter(cycle=cycle)
    admitted = history.filter(reason="Admitted")
    return {
        "cycle": cycle,
        "admitted": split_visible(user, admitted.values("workload_id")),
        "preempted": split_visible(user, preempted.values("workload_id")),
        "changed": split_visible(user, history.exclude(reason="Admitted").values("workload_id")),
    }


def split_visible(user, workload_ids, limit=20):
    """The first `limit` workloads of `workload_ids` (a `values("workload_id")` queryset) this user may
    see, how many more they may see, and how many they may not. Counted by the database: a cycle that
    admitted 20,000 workloads made this page load 20,000 rows to show 20 of them (2 s)."""
    workloads = Workload.objects.filter(pk__in=workload_ids)
    total = workloads.count()
    visible = workloads if sees_all_workloads(user) else workloads.filter(team_id__in=team_ids(user))
    count = total if visible is workloads else visible.count()
    shown = list(visible.select_related("team")[:limit]) if count else []
    return {"shown": shown, "more": max(0, count - limit), "hidden": total - count}


def overview(user):
    summary = shared_summary()
    return {
        "capacity": summary["capacity"],
        "pending": pending_by_reason(user),
        "series": cycle_series(),
        "health": cycle_health(),
        "counters": counters(user, summary),
    }


def counters(user, summary=None):
    """The headline numbers; the same keys the live socket patches. `summary`: shared_summary()."""
    totals = (summary or shared_summary())["totals"]
    workloads = Workload.objects.order_by().values("state").annotate(n=Count("id"))
    by_state = {row["state"]: row["n"] for row in workloads}
    mine = visible_workloads(user).filter(state__in=WAITING_STATES).count()
    last = SchedulingCycle.objects.filter(outcome=SchedulingCycle.Outcome.COMMITTED).first()
    return {
        "devices": sum(totals.values()),
        **{f"devices_{key}": value for key, value in totals.items()},
        "pending": sum(by_state.get(s, 0) for s in WAITING_STATES),
        "pending_mine": mine,
        "running": sum(by_state.get(s, 0) for s in HOLDING_STATES),
        "last_cycle": last.pk if last else None,
        "last_cycle_ms": round(last.duration_ms, 1) if last else None,
    }


# --- queue -----------------------------------------------------------------------------------------------


def annotate_devices(workloads):
    return workloads.annotate(device_total=Sum(F("pod_sets__replicas") * F("pod_sets__devices_per_pod")))


def page_of(ordered, start, size, related):
    """One page of `ordered` workloads: the ids sorted on narrow rows first, then only that page's rows
    read with their related rows (sorting thousands of joined wide rows costs more than the page)."""
    ids = list(ordered.values_list("id", flat=True)[start : start + size])
    by_id = Workload.objects.select_related(*related).in_bulk(ids)
    return [by_id[pk] for pk in ids if pk in by_id]


def with_device_totals(workloads):
    """Set `device_total` on a page of workloads with one grouped query over their pod sets only (an
    annotation would group the whole filtered queue before sorting and slicing it)."""
    workloads = list(workloads)
    totals = dict(
        PodSet.objects.filter(workload_id__in=[w.pk for w in workloads])
        .order_by()
        .values("workload_id")
        .annotate(n=Sum(F("replicas") * F("devices_per_pod")))
        .values_list("workload_id", "n")
    )
    for workload in workloads:
        workload.device_total = totals.get(workload.pk)
    return workloads


# --- a member's history (as Slurm's sacct): finished work too, sortable -----------------------------------

HISTORY_SORTS = {
    "submitted": "submitted_at",
    "started": "started_at",
    "finished": "finished_at",
    "name": "name",
    "state": "state",
    "priority": "priority",
}
HISTORY_SCOPES = ("mine", "team")


def history_params(params):
    """(scope, sort) from the query string; anything unknown falls back to the default, newest first."""
    scope = params.get("scope", "mine")
    sort = params.get("sort", "-submitted")
    if sort.lstrip("-") not in HISTORY_SORTS:
        sort = "-submitted"
    return (scope if scope in HISTORY_SCOPES else "mine"), sort


def history_rows(user, scope, sort, page=1, now=None):
    """The user's own workloads (scope "mine") or their teams' ("team"), any state, sorted by `sort`."""
    now = now or timezone.now()
    workloads = Workload.objects.filter(submitted_by=user)
    if scope == "team":
        workloads = Workload.objects.filter(team_id__in=team_ids(user))
    field = F(HISTORY_SORTS[sort.lstrip("-")])
    order = field.desc(nulls_last=True) if sort.startswith("-") else field.asc(nulls_last=True)
    ordered = workloads.order_by(order, "-id")
    total = ordered.count()
    start = (page - 1) * QUEUE_PAGE_SIZE
    shown = with_device_totals(page_of(ordered, start, QUEUE_PAGE_SIZE, ("team", "resource_class")))
    rows = []
    for workload in shown:
        began, ended = workload.started_at or workload.admitted_at, workload.finished_at
        rows.append(
            {
                "workload": workload,
                "devices": workload.device_total,
                # Waited: until it started, or until now while it waits; ran: until it ended, or until now.
                "waited": ((began or ended or now) - workload.submitted_at).total_seconds(),
                "ran": ((ended or now) - began).total_seconds() if began else None,
            }
        )
    by_state = dict(workloads.order_by().values("state").annotate(n=Count("id")).values_list("state", "n"))
    pages = max(1, -(-total // QUEUE_PAGE_SIZE))
    return {"rows": rows, "total": total, "page": page, "pages": pages, "by_state": dict(sorted(by_state.items()))}


def queue_filters(params):
    return {
        "team": params.get("team", ""),
        "resource_class": params.get("resource_class", ""),
        "reason": params.get("reason", ""),
    }


def apply_filters(workloads, filters):
    if filters["team"]:
        workloads = workloads.filter(team__name=filters["team"])
    if filters["resource_class"]:
        workloads = workloads.filter(resource_class__name=filters["resource_class"])
    if filters["reason"]:
        workloads = workloads.filter(explanation__reason=filters["reason"])
    return workloads


def pending_rows(user, filters, page=1):
    """Visible waiting workloads, in a stable order: cluster position, then age, then id."""
    workloads = apply_filters(visible_workloads(user).filter(state__in=WAITING_STATES), filters)
    total = workloads.count()
    ordered = workloads.order_by(F("explanation__position_in_cluster").asc(nulls_last=True), "submitted_at", "id")
    start = (page - 1) * QUEUE_PAGE_SIZE
    shown = page_of(ordered, start, QUEUE_PAGE_SIZE, ("team", "queue", "resource_class", "explanation"))
    rows = [workload_row(w) for w in with_device_totals(shown)]
    return {"rows": rows, "total": total, "page": page, "pages": max(1, -(-total // QUEUE_PAGE_SIZE))}


def hidden_pending(user):
    """Other teams' waiting work as counts per reason, for users who may not read it."""
    if sees_all_workloads(user):
        return None
    rows = (
        Workload.objects.filter(state__in=WAITING_STATES)
        .exclude(team_id__in=team_ids(user))
        .order_by()
        .values("explanation__reason")
        .annotate(n=Count("id"))
    )
    by_reason = {(row["explanation__reason"] or "NotYetExplained"): row["n"] for row in rows}
    return {"total": sum(by_reason.values()), "by_reason": dict(sorted(by_reason.items()))}


def running_rows(user, filters, limit=200):
    workloads = apply_filters(visible_workloads(user).filter(state__in=HOLDING_STATES), filters)
    total = workloads.count()
    page = with_device_totals(
        page_of(workloads.order_by("admitted_at", "id"), 0, limit, ("team", "queue", "resource_class"))
    )
    where = placement_summary([w.pk for w in page])
    rows = []
    for workload in page:
        row = workload_row(workload, explanation=False)
        row["where"] = where.get(workload.pk, "")
        row["since"] = (workload.started_at or workload.admitted_at or workload.state_changed_at).isoformat()
        rows.append(row)
    return {"rows": rows, "total": total}


def placement_summary(workload_ids):
    """{workload id: "rack r1: n1 ×4, n2 ×4"} from active allocations, grouped in the database."""
    rows = (
        Allocation.objects.filter(workload_id__in=workload_ids, released_at__isnull=True)
        .order_by()
        .values("workload_id", "device__node__name", "device__node__domain__name", "device_class__name")
        .annotate(n=Count("id"))
        .order_by("workload_id", "device__node__domain__name", "device__node__name")
    )
    grouped = defaultdict(lambda: defaultdict(list))
    for row in rows:
        domain = row["device__node__domain__name"] or "-"
        grouped[row["workload_id"]][domain].append(f"{row['device__node__name']} ×{row['n']}")
    return {
        wid: "; ".join(f"{domain}: {', '.join(nodes)}" for domain, nodes in domains.items())
        for wid, domains in grouped.items()
    }


def filter_choices(user):
    teams = Team.objects.all() if sees_all_workloads(user) else Team.objects.filter(id__in=team_ids(user))
    return {
        "teams": list(teams.values_list("name", flat=True)),
        "resource_classes": list(ResourceClass.objects.values_list("name", flat=True)),
        "reasons": list(REASON_CODES),
    }


# --- workload detail -------------------------------------------------------------------------------------


def cost_so_far(workload, now=None):
    """Device-hours held times the price of the class each device was allocated under."""
    now = now or timezone.now()
    held = ExpressionWrapper(Coalesce("released_at", Value(now)) - F("allocated_at"), output_field=DurationField())
    rows = (
        workload.allocations.order_by()
        .values("device_class__name", "device_class__price_per_hour")
        .annotate(held=Sum(held), devices=Count("id"))
    )
    lines = []
    for row in rows:
        hours = (row["held"] or timedelta()).total_seconds() / 3600
        price = float(row["device_class__price_per_hour"])
        lines.append(
            {
                "device_class": row["device_class__name"],
                "devices": row["devices"],
                "device_hours": round(hours, 3),
                "price_per_hour": price,
                "cost": round(hours * price, 2),
            }
        )
    return {"lines": lines, "total": round(sum(line["cost"] for line in lines), 2)}


def leaving_pods(active):
    """Pods of a shrunk workload still shutting down, per preemptor: [{"for": name, "pods": n}]."""
    rows = (
        active.filter(eviction_requested_at__isnull=False)
        .order_by()
        .values("evicted_for__team__name", "evicted_for__name")
        .annotate(pods=Count("pod_index", distinct=True))
        .order_by("evicted_for__name")
    )
    return [
        {"for": f"{row['evicted_for__team__name']}/{row['evicted_for__name']}" if row["evicted_for__name"] else "",
         "pods": row["pods"]}
        for row in rows
    ]  # fmt: skip


def kube_cluster_of(node):
    """The Kubernetes cluster a node is mirrored from, or "" for one the broker holds itself."""
    return MirroredNode.objects.filter(node=node).values_list("cluster__name", flat=True).first() or ""


def kube_clusters(now=None):
    """The mirrored clusters and the health of their sync, for the topology page."""
    now = now or timezone.now()
    rows = []
    for cluster in KubeCluster.objects.annotate(node_count=Count("nodes", distinct=True)):
        rows.append(
            {
                "name": cluster.name,
                "server": cluster.server,
                "last_synced_at": cluster.last_synced_at,
                "last_listed_at": cluster.last_listed_at,
                "healthy": cluster.healthy(now, settings.KUBE_SYNC_STALE_SECONDS),
                "last_error": cluster.last_error if cluster.last_error_at else "",
                "events_applied": cluster.events_applied,
                "relists": cluster.relists,
                "nodes": cluster.node_count,
                "devices": Device.objects.filter(node__kube__cluster=cluster).count(),
                "pools": MirroredSlice.objects.filter(cluster=cluster).values("pool").distinct().count(),
            }
        )
    return rows


def workload_detail(workload):
    explanation = Explanation.objects.filter(workload=workload).first()
    allocations = workload.allocations.order_by()
    active = allocations.filter(released_at__isnull=True)
    shown = active if active.exists() else allocations
    racks = list(
        shown.values("device__node__domain_id", "device__node__domain__name")
        .annotate(n=Count("id"))
        .order_by("device__node__domain__name")
    )
    nodes = list(
        shown.values("device__node__name", "device__node__domain__name")
        .annotate(n=Count("id"), since=Min("allocated_at"), until=Max("released_at"))
        .order_by("device__node__name")
    )
    return {
        "workload": workload,
        "pod_group": MirroredPodGroup.objects.filter(workload=workload).select_related("cluster").first(),
        "pod_sets": list(workload.pod_sets.all()),
        "transitions": list(workload.transitions.select_related("actor")),
        "explanation": explanation,
        "history": list(workload.explanation_history.order_by("-at", "-id")[:50]),
        "placement_racks": [
            {"id": r["device__node__domain_id"], "name": r["device__node__domain__name"], "devices": r["n"]}
            for r in racks
        ],
        "placement_nodes": nodes,
        "placement_active": active.exists(),
        "leaving": leaving_pods(active),
        "cost": cost_so_far(workload),
        "row": workload_row(annotate_devices(Workload.objects.filter(pk=workload.pk)).get()),
    }


# --- topology heatmap ------------------------------------------------------------------------------------


def domain_paths():
    """{domain id: (name, parent id, level name)} for every domain; the tree is small."""
    return {
        pk: (name, parent, level)
        for pk, name, parent, level in Domain.objects.order_by().values_list("id", "name", "parent_id", "level__name")
    }


def path_of(domain_id, domains):
    parts = []
    current = domain_id
    while current is not None and current in domains:
        name, parent, _level = domains[current]
        parts.append(name)
        current = parent
    return "/".join(reversed(parts))


def heatmap_racks(key=None):
    """One cell per finest-level domain (rack): device state counts and busy devices per team.

    Rows are the racks' parent domains (blocks), columns the racks in name order, so a 100,000-device
    cluster is a few thousand cells. The same for every user: computed once per change of the
    inventory state (dashboard.inventory_state.cached).
    """
    return cached("heatmap", _heatmap_racks, key)


def physical_counts(state, domain_ids=None):
    """{domain id: {state: physical devices}}: a GPU's partitions are parts of it, not devices of their
    own, and a GPU not allocated itself but in use through its partitions counts busy (taken from its
    free count, then stranded, reserved, unhealthy: its own state is not told apart in the groups)."""
    counts = state.by_domain(physical=True)
    active = Allocation.objects.filter(released_at__isnull=True)
    through_parts = (
        Device.objects.filter(parent=None)
        .filter(Exists(active.filter(device__parent=OuterRef("pk"))))
        .exclude(Exists(active.filter(device=OuterRef("pk"))))
    )
    if domain_ids is not None:
        through_parts = through_parts.filter(node__domain_id__in=domain_ids)
    for domain_id, n in (
        through_parts.order_by().values("node__domain_id").annotate(n=Count("id")).values_list("node__domain_id", "n")
    ):
        cell = counts.get(domain_id)
        if cell is None:
            continue
        for source in ("free", "stranded", "reserved", "unhealthy"):
            moved = min(n, cell[source])
            cell[source] -= moved
            cell["busy"] += moved
            n -= moved
    return counts


def teams_by_domain(domain_ids=None):
    """{domain id: {team: physical devices it holds all or part of}}: partitions count as their GPU, and
    a GPU several teams share (partitions, time-slices) counts once for each."""
    allocations = Allocation.objects.filter(released_at__isnull=True)
    if domain_ids is not None:
        allocations = allocations.filter(device__node__domain_id__in=domain_ids)
    out = defaultdict(dict)
    for row in (
        allocations.order_by()
        .values("device__node__domain_id", "workload__team__name")
        .annotate(n=Count(Coalesce("device__parent_id", "device_id"), distinct=True))
    ):
        out[row["device__node__domain_id"]][row["workload__team__name"]] = row["n"]
    return out


def _heatmap_racks(key):
    state = current_state(key)
    by_domain = physical_counts(state)
    domains = domain_paths()
    teams = teams_by_domain()
    held_outside = with_taints_text(Device.objects.order_by()).filter(held_outside_q())
    for domain_id, n in (
        held_outside.values("node__domain_id")
        .annotate(n=Count(Coalesce("parent_id", "id"), distinct=True))
        .values_list("node__domain_id", "n")
    ):
        teams[domain_id][OUTSIDE_THE_BROKER] = n
    node_counts = dict(
        Node.objects.order_by().values("domain_id").annotate(n=Count("id")).values_list("domain_id", "n")
    )
    kinds = device_kinds_by_domain()
    rows = {}
    cells = []
    for domain_id, counts in by_domain.items():
        if domain_id is None:
            name, parent = "unplaced", None
        else:
            name, parent, _level = domains[domain_id]
        row_label = path_of(parent, domains) if parent else "(no parent)"
        rows.setdefault(row_label, parent)
        cells.append(
            {
                "id": domain_id,
                "name": name,
                "row": row_label,
                "nodes": node_counts.get(domain_id, 0),
                "total": sum(counts.values()),
                "counts": counts,
                "teams": teams.get(domain_id, {}),
                **kinds.get(domain_id, {}),
            }
        )
    cells.sort(key=lambda cell: (natural_key(cell["row"]), natural_key(cell["name"])))
    levels = list(TopologyLevel.objects.values_list("name", flat=True))
    teams = sorted({team for cell in cells for team in cell["teams"]})
    return {
        "level": "rack",
        "levels": [*levels, "node"],
        "rows": sorted(rows, key=natural_key),
        "cells": cells,
        "teams": teams,
        "team_colors": team_colors(),
    }


def device_kinds_by_domain():
    """{domain id: {"partitions", "partitions_busy", "nics", "shared", "shared_busy", "share_use"}} for
    the racks that have partitions, NICs or devices several allocations share, so a rack cell can say
    what its GPUs are cut into and how much of them is in use: `share_use` is the fraction of the shared
    devices' capacity the active time-slices take (each device by its most used capacity)."""
    out = defaultdict(dict)
    for row in (
        Device.objects.exclude(parent=None)
        .order_by()
        .values("node__domain_id")
        .annotate(
            # distinct: the join yields a device once per allocation it ever had.
            n=Count("id", distinct=True),
            busy=Count("id", distinct=True, filter=Q(allocations__released_at__isnull=True, allocations__isnull=False)),
        )
    ):
        out[row["node__domain_id"]] |= {"partitions": row["n"], "partitions_busy": row["busy"]}
    nics = (
        Device.objects.filter(parent=None)
        .exclude(driver=GPU_DRIVER)
        .order_by()
        .values("node__domain_id")
        .annotate(n=Count("id"))
    )
    for row in nics:
        out[row["node__domain_id"]]["nics"] = row["n"]
    shared = {
        pk: (domain_id, capacity)
        for pk, domain_id, capacity in Device.objects.filter(allow_multiple_allocations=True).values_list(
            "id", "node__domain_id", "capacity"
        )
    }
    if shared:
        taken = defaultdict(lambda: defaultdict(float))
        for pk, consumed in Allocation.objects.filter(
            released_at__isnull=True, device_id__in=list(shared), consumed_capacity__isnull=False
        ).values_list("device_id", "consumed_capacity"):
            for name, value in (consumed or {}).items():
                taken[pk][name] += quantity(value) or 0
        for pk, (domain_id, capacity) in shared.items():
            cell = out[domain_id]
            cell["shared"] = cell.get("shared", 0) + 1
            cell["shared_busy"] = cell.get("shared_busy", 0) + int(pk in taken)
            fractions = [
                amount / total
                for name, amount in taken.get(pk, {}).items()
                if (total := quantity((capacity or {}).get(name)))
            ]
            cell["share_taken"] = cell.get("share_taken", 0) + min(1.0, max(fractions, default=0))
        for cell in out.values():
            if "shared" in cell:
                cell["share_use"] = round(cell.pop("share_taken") / cell["shared"], 3)
    return dict(out)


# Who holds a device another scheduler allocated, where the dashboard names a device's team.
OUTSIDE_THE_BROKER = "outside the broker"


def held_outside(device):
    return any(taint.get("key") == HELD_OUTSIDE_TAINT for taint in device["taints"] or ())


def unavailable(device):
    """Takes no new work: failed, tainted (by more than another scheduler's allocation) or cordoned."""
    blocking = [taint for taint in device["taints"] or () if taint.get("key") != HELD_OUTSIDE_TAINT]
    return bool(device["health"] != Health.HEALTHY or blocking or device["node__cordoned"])


def device_state(device, busy_team, reserved_ids, stranded):
    if busy_team is not None:
        return "busy"
    if unavailable(device):
        return "unhealthy"
    if device["id"] in reserved_ids:
        return "reserved"
    if stranded:
        return "stranded"
    return "free"


def _devices_with_state(user, devices, highlight=None):
    devices = list(
        devices.order_by("node__name", "id").values(
            "id",
            "name",
            "node_id",
            "node__name",
            "node__cordoned",
            "health",
            "taints",
            "driver",
            "pool",
            "attributes",
            "capacity",
            "parent_id",
        )
    )
    node_ids = {d["node_id"] for d in devices}
    state = inventory_state(node_ids=node_ids)
    holders = {
        row["device_id"]: row
        for row in Allocation.objects.filter(device_id__in=[d["id"] for d in devices], released_at__isnull=True)
        .order_by()
        .values(
            "device_id", "workload_id", "workload__name", "workload__team_id", "workload__team__name", "allocated_at"
        )
    }
    devices.sort(key=lambda device: (natural_key(device["node__name"]), device["id"]))
    out = []
    for device in devices:
        holder = holders.get(device["id"])
        team = holder["workload__team__name"] if holder else OUTSIDE_THE_BROKER if held_outside(device) else None
        classes = state.classifier.classes_of(device["driver"], device["attributes"], device["capacity"])
        stranded = state.device_is_stranded(device["node_id"], classes)
        item = {
            "id": device["id"],
            "name": device["name"],
            "node": device["node__name"],
            "node_id": device["node_id"],
            "state": device_state(device, team, state.reserved_ids, stranded),
            "health": device["health"],
            "taints": device["taints"],
            "cordoned": device["node__cordoned"],
            # Busy but failed, tainted or cordoned: its work runs on (or is being moved off) a device that
            # takes nothing new; drawn as such at once, not only once the work has left it.
            "unavailable": unavailable(device),
            "classes": sorted(classes),
            "driver": device["driver"],
            "pool": device["pool"],
            "attributes": device["attributes"],
            "team": team,
            "workload": None,
            "highlight": bool(holder and highlight and holder["workload_id"] == highlight),
            "kind": device_kind(device),
            "parent": device["parent_id"],
        }
        if holder and can_see(user, holder["workload__team_id"]):
            item["workload"] = {
                "id": holder["workload_id"],
                "name": holder["workload__name"],
                "since": holder["allocated_at"].isoformat(),
                "url": f"/workloads/{holder['workload_id']}/",
            }
        out.append(item)
    return with_partitions_nested(out)


GPU_DRIVER = Device._meta.get_field("driver").default


def device_kind(device):
    """ "partition" (cut from a device), "gpu" (an accelerator of the GPU driver), or "nic": every other
    driver publishes the devices that go beside the GPUs, network interfaces in this product."""
    if device["parent_id"] is not None:
        return "partition"
    return "gpu" if device["driver"] == GPU_DRIVER else "nic"


def with_partitions_nested(items):
    """The whole devices and NICs, each partitioned device carrying its partitions and how many are in
    use: a GPU cut into seven slices is one cell that says "3/7 partitions used", not eight cells. A
    whole device none of whose own allocations hold it is busy while any of its partitions is, as the
    counters it shares with them are taken."""
    by_parent = defaultdict(list)
    for item in items:
        if item["parent"] is not None:
            by_parent[item["parent"]].append(item)
    ids = {item["id"] for item in items}
    # A partition whose device is not in the list (a query of partitions alone) stays at the top.
    top = [item for item in items if item["parent"] is None or item["parent"] not in ids]
    for item in top:
        partitions = by_parent.get(item["id"])
        if not partitions:
            continue
        partitions.sort(key=lambda part: natural_key(part["name"]))
        used = [part for part in partitions if part["team"] is not None]
        item["partitions"] = partitions
        item["partitions_used"] = len(used)
        teams = Counter(part["team"] for part in used)
        item["partition_teams"] = dict(sorted(teams.items()))
        if used and item["team"] is None and item["state"] != "unhealthy":
            item["state"] = "busy"
            item["team"] = teams.most_common(1)[0][0]
            item["highlight"] = any(part["highlight"] for part in used)
    return top


def heatmap_rack(user, rack_id, highlight=None):
    """Nodes of one rack as rows and their devices as columns, each device with its state."""
    domain = Domain.objects.select_related("level").get(pk=rack_id)
    nodes = sorted(
        Node.objects.filter(domain_id=rack_id).values("id", "name", "cordoned"), key=lambda n: natural_key(n["name"])
    )
    devices = _devices_with_state(user, Device.objects.filter(node__domain_id=rack_id), highlight=highlight)
    return {
        "level": "node",
        "rack": {"id": domain.pk, "name": domain.name, "path": path_of(domain.pk, domain_paths())},
        "nodes": nodes,
        "devices": devices,
        "team_colors": team_colors(),
    }


def heatmap_node(user, node_id):
    node = Node.objects.select_related("domain").get(pk=node_id)
    devices = _devices_with_state(user, Device.objects.filter(node_id=node_id))
    return {
        "level": "device",
        "node": {
            "id": node.pk,
            "name": node.name,
            "cordoned": node.cordoned,
            "rack": node.domain_id,
            "path": path_of(node.domain_id, domain_paths()) if node.domain_id else "",
            "labels": node.labels,
            "cluster": kube_cluster_of(node),
        },
        "devices": devices,
    }


def rack_cells(domain_ids, key=None):
    """Heatmap cells of some racks, for live deltas (from the inventory state this process shares)."""
    if not domain_ids:
        return []
    by_domain = physical_counts(current_state(key), domain_ids)
    teams = teams_by_domain(domain_ids)
    return [
        {"id": domain_id, "counts": counts, "total": sum(counts.values()), "teams": teams.get(domain_id, {})}
        for domain_id, counts in by_domain.items()
        if domain_id in domain_ids
    ]


# --- teams and quotas ------------------------------------------------------------------------------------


def quota_usage():
    """Per queue and device class: nominal, in use, borrowed (use above nominal) and pending demand."""
    used = defaultdict(int)
    for row in (
        Allocation.objects.filter(released_at__isnull=True)
        .order_by()
        .values("workload__queue_id", "device_class__name")
        .annotate(n=Count("id"))
    ):
        used[(row["workload__queue_id"], row["device_class__name"])] = row["n"]
    pending = dict(
        Workload.objects.filter(state__in=WAITING_STATES)
        .order_by()
        .values("queue_id")
        .annotate(n=Sum(F("pod_sets__replicas") * F("pod_sets__devices_per_pod")))
        .values_list("queue_id", "n")
    )
    queues = []
    for queue in Queue.objects.select_related("team", "cohort"):
        classes = sorted(set(queue.nominal_quota or {}) | {c for (q, c) in used if q == queue.pk})
        lines = []
        for name in classes:
            nominal = (queue.nominal_quota or {}).get(name) if queue.nominal_quota is not None else None
            in_use = used.get((queue.pk, name), 0)
            borrowed = max(0, in_use - nominal) if nominal is not None else 0
            limit = (queue.borrowing_limit or {}).get(name)
            lines.append(
                {
                    "device_class": name,
                    "nominal": nominal,
                    "used": in_use,
                    "borrowed": borrowed,
                    "borrowing_limit": limit,
                    "percent": round(100 * in_use / nominal) if nominal else None,
                }
            )
        queues.append(
            {"queue": queue, "team": queue.team, "lines": lines, "pending_devices": pending.get(queue.pk) or 0}
        )
    return queues


def usage_over_time(hours=24, points=48):
    """Devices held per team at `points` instants over the last `hours`, from allocation intervals."""
    now = timezone.now()
    start = now - timedelta(hours=hours)
    instants = [start + (now - start) * i / (points - 1) for i in range(points)]
    overlapping = Allocation.objects.filter(Q(released_at__isnull=True) | Q(released_at__gt=start)).filter(
        allocated_at__lte=now
    )
    aggregates = {
        f"t{i}": Count("id", filter=Q(allocated_at__lte=t) & (Q(released_at__isnull=True) | Q(released_at__gt=t)))
        for i, t in enumerate(instants)
    }
    series = {}
    for row in overlapping.order_by().values("workload__team__name").annotate(**aggregates):
        series[row["workload__team__name"]] = [row[f"t{i}"] for i in range(points)]
    nominal = defaultdict(int)
    for queue in Queue.objects.select_related("team"):
        for amount in (queue.nominal_quota or {}).values():
            nominal[queue.team.name] += amount
    return {"at": [t.isoformat() for t in instants], "teams": series, "nominal": dict(nominal)}


def pod_sets_summary(workload):
    return list(PodSet.objects.filter(workload=workload).values("name", "replicas", "min_count", "devices_per_pod"))
