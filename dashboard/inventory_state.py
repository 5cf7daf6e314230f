"""Device states for the dashboard, aggregated in the database.

Every device is in exactly one state, first match wins:
  busy       an active allocation holds it, or another scheduler allocated it (outside the broker);
  unhealthy  not Healthy, tainted, or on a cordoned node: it takes no new work;
  reserved   free, but an active reservation of another team's holds it (device-id order, as the
             scheduler takes them);
  stranded   free, healthy, unreserved, wanted by pending work but unusable by it because of its shape:
             its node has fewer free devices of each wanted class than the smallest per-pod request among
             the pending workloads wanting that class, or the only work that wants it must stay in one
             domain and the node's domain has fewer free devices than that gang needs (issue 27); a
             device no pending workload wants is free;
  free       the rest.

The stranded rule and what counts as pending demand are the decision core's
(broker.scheduler.accounting, which the finance samples use): pending work is what the cycle loads
(Pending and AwaitingApproval workloads whose approval window is open), less the workloads the last cycle
explained with a reason that policy, not shape, holds them for (accounting.HELD_BY_POLICY).

One grouped query over devices (by node and device description) carries the whole cluster; everything
else (per class, per rack, per node) is summed from those few thousand rows. Device classes are CEL
selectors, so they are evaluated once per distinct device description, never per device.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter

from django.core.cache import cache
from django.db import connection
from django.db.models import BooleanField, Count, Exists, ExpressionWrapper, F, FilteredRelation, OuterRef, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from broker.flat_rows import fetch_rows
from broker.governance.models import ApprovalRequest
from broker.inventory.models import ClusterState, Device, Domain, Health, InventoryRevision, Node
from broker.policy.models import DeviceClass, Reservation, ResourceClassDeviceClass
from broker.scheduler import snapshot as snap
from broker.scheduler.accounting import (
    HELD_BY_POLICY,
    add_demand,
    add_gang,
    domain_totals,
    strands_by_shape,
    workload_classes,
)
from broker.scheduler.selectors import ClassMatcher
from broker.workloads.models import Allocation, Explanation, PodSet, Workload
from broker.workloads.states import State
from dashboard import live_health

log = logging.getLogger(__name__)

STATES = ("busy", "unhealthy", "reserved", "stranded", "free")
DEMAND_STATES = (State.PENDING, State.AWAITING_APPROVAL)  # what the cycle loads (broker.cycle.loader)


def unavailable_q(prefix=""):
    """Devices that take no new work whatever happens in the queue."""
    return (
        ~Q(**{f"{prefix}health": Health.HEALTHY})
        | ~Q(**{f"{prefix}taints": []})
        | Q(**{f"{prefix}node__cordoned": True})
    )


def held_outside_q():
    """Devices another scheduler allocated (their taint, broker.kube.mirror): busy, not the broker's.
    Matched in the taints' text, which both PostgreSQL and SQLite can search."""
    return Q(taints_text__contains=f'"{snap.HELD_OUTSIDE_TAINT}"')


def with_taints_text(devices):
    return devices.alias(taints_text=Cast("taints", TextField()))


def active_allocation_exists():
    return Exists(Allocation.objects.filter(device=OuterRef("pk"), released_at__isnull=True))


DESCRIPTION_TEXT = {
    "driver_text": F("driver"),
    "attributes_text": Cast("attributes", TextField()),
    "capacity_text": Cast("capacity", TextField()),
}


# A partition of a GPU (Device.parent): grouped apart, as the heatmap counts physical devices.
IS_PARTITION = ExpressionWrapper(Q(parent__isnull=False), BooleanField())


def description_key(driver, attributes, capacity):
    return json.dumps([driver, attributes or {}, capacity or {}], sort_keys=True)


class Classifier:
    """Which device classes each distinct device description belongs to."""

    def __init__(self):
        classes = list(DeviceClass.objects.all())
        self.classes = classes
        self.prices = {dc.name: float(dc.price_per_hour) for dc in classes}
        self._matcher = ClassMatcher(
            tuple(
                snap.DeviceClass(name=dc.name, selector=dc.selector, price_per_hour=float(dc.price_per_hour))
                for dc in classes
            )
        )
        self._cache = {}

    def classes_of(self, driver, attributes, capacity):
        key = description_key(driver, attributes, capacity)
        found = self._cache.get(key)
        if found is None:
            device = snap.Device(id="?", node="?", driver=driver, attributes=attributes or {}, capacity=capacity or {})
            found = self._matcher.classes_of(device)
            self._cache[key] = found
        return found

    def descriptions_q(self, class_name, prefix=""):
        """A filter for devices of `class_name`: an OR over the matching distinct descriptions."""
        query = Q(pk__in=[])
        rows = Device.objects.order_by().values_list("driver", "attributes", "capacity").distinct()
        for driver, attributes, capacity in rows:
            if class_name in self.classes_of(driver, attributes, capacity):
                query |= Q(
                    **{f"{prefix}driver": driver, f"{prefix}attributes": attributes, f"{prefix}capacity": capacity}
                )
        return query


@dataclass
class Group:
    """Devices of one node sharing one description."""

    node_id: int
    key: str
    classes: frozenset
    counts: dict = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    partition: bool = False  # partitions of a GPU (Device.parent): not physical devices of their own


@dataclass
class InventoryState:
    groups: list
    node_domain: dict  # node id -> finest domain id (None when the node has no topology)
    reserved_ids: set
    stranded_nodes: dict  # node id -> set of classes stranded there
    min_request: dict  # device class -> smallest pending per-pod request
    classifier: Classifier
    node_free: dict = field(default_factory=dict)  # node id -> {class: free healthy unreserved devices}
    # The stranded rule's other inputs (accounting.strands_by_shape): pending work with no required level
    # by class, work bound to one domain, free devices per node's domains and per class in the cluster.
    plain: dict = field(default_factory=dict)
    gangs: dict = field(default_factory=dict)
    domain_free: dict = field(default_factory=dict)
    class_free: dict = field(default_factory=dict)

    def by_class(self):
        out = {dc.name: dict.fromkeys(STATES, 0) for dc in self.classifier.classes}
        for group in self.groups:
            for name in group.classes:
                for state in STATES:
                    out[name][state] += group.counts[state]
        return out

    def by_domain(self, physical=False):
        """{domain id: {state: devices}}; with `physical`, partitions left out (the heatmap counts GPUs)."""
        out = defaultdict(lambda: dict.fromkeys(STATES, 0))
        for group in self.groups:
            if physical and group.partition:
                continue
            cell = out[self.node_domain.get(group.node_id)]
            for state in STATES:
                cell[state] += group.counts[state]
        return dict(out)

    def by_node(self, node_ids):
        out = {node_id: dict.fromkeys(STATES, 0) for node_id in node_ids}
        for group in self.groups:
            if group.node_id in out:
                for state in STATES:
                    out[group.node_id][state] += group.counts[state]
        return out

    def device_is_stranded(self, node_id, classes):
        return strands_by_shape(
            classes,
            self.node_free.get(node_id, {}),
            self.plain,
            self.gangs,
            self.domain_free.get(node_id, {}),
            self.class_free,
        )


def pending_min_request(now=None):
    """{device class: smallest devices_per_pod among pending workloads that may use it}, as
    broker.scheduler.accounting.pending_demand counts it."""
    return pending_min_request_of(*pending_demand_shapes(now))


def pending_demand_shapes(now=None):
    """(plain, gangs) as broker.scheduler.accounting.demand_shapes counts them: work with no required
    level by its smallest per-pod request, work bound to one domain by (level, per pod, devices needed)."""
    now = now or timezone.now()
    ordered = defaultdict(list)
    for rc_id, name in ResourceClassDeviceClass.objects.order_by("rank").values_list(
        "resource_class_id", "device_class__name"
    ):
        ordered[rc_id].append(name)
    invalid = Explanation.objects.filter(reason__in=HELD_BY_POLICY).values("workload_id")
    rows = (
        PodSet.objects.filter(workload__state__in=DEMAND_STATES)
        .exclude(workload_id__in=invalid)
        .exclude(workload_id__in=ApprovalRequest.objects.outside_window(now))
        .order_by("workload_id", "id")
        .values_list(
            "workload_id",
            Cast("device_classes", TextField()),
            "workload__resource_class_id",
            "devices_per_pod",
            "workload__topology_required",
            "replicas",
            "min_count",
        )
    )
    # Plain tuples (fetch_rows): 20,000 pending gangs' pod sets, and the workloads' shapes repeat, so each
    # distinct (resource class, level, ((classes text, per pod, gang size), ...)) is resolved once. The
    # workload's level is its effective one (submission stores the class's default in it).
    shapes = set()
    for _, group in groupby(fetch_rows(rows), key=itemgetter(0)):
        pod_sets = [
            (rc_id, level, text, per_pod, minimum or replicas)
            for _, text, rc_id, per_pod, level, replicas, minimum in group
        ]
        rc_id, level = pod_sets[0][0], pod_sets[0][1]
        shapes.add((rc_id, level or None, tuple((text, per_pod, size) for _, _, text, per_pod, size in pod_sets)))
    decoded = {}  # a few distinct class lists among thousands of pod sets: decode each once
    plain, gangs = {}, {}
    for rc_id, level, pod_sets in shapes:
        declared = []
        for text, _, _ in pod_sets:
            classes = decoded.get(text)
            if classes is None:
                classes = decoded[text] = tuple(json.loads(text) or ()) if text else ()
            declared.append(classes)
        classes = workload_classes(declared, tuple(ordered.get(rc_id, ())))
        per_pod = min(n for _, n, _ in pod_sets)
        if level:
            add_gang(gangs, classes, level, per_pod, sum(n * size for _, n, size in pod_sets))
        else:
            add_demand(plain, classes, per_pod)
    return plain, gangs


def finest_domains_under(domain_id):
    """Ids of the domains at or below `domain_id` (the tree is small: thousands of rows at most)."""
    children = defaultdict(list)
    for pk, parent in Domain.objects.order_by().values_list("id", "parent_id"):
        children[parent].append(pk)
    out, stack = set(), [domain_id]
    while stack:
        current = stack.pop()
        out.add(current)
        stack.extend(children.get(current, ()))
    return out


def reserved_device_ids(classifier, now=None):
    """Free devices held by active reservations, taken in device-id order as the scheduler does."""
    now = now or timezone.now()
    taken = set()
    for reservation in Reservation.objects.filter(start__lte=now, end__gt=now).select_related("device_class"):
        class_q = classifier.descriptions_q(reservation.device_class.name)
        scope = Q()
        if reservation.domain_id:
            scope = Q(node__domain_id__in=finest_domains_under(reservation.domain_id))
        used = Allocation.objects.filter(
            released_at__isnull=True,
            workload__team_id=reservation.team_id,
            device_class_id=reservation.device_class_id,
            device__in=Device.objects.filter(scope),
        ).count()
        remaining = reservation.count - used
        if remaining <= 0:
            continue
        ids = (
            Device.objects.order_by("id")
            .filter(scope & class_q)
            .exclude(unavailable_q())
            .exclude(pk__in=taken)
            .annotate(busy=active_allocation_exists())
            .filter(busy=False)
            .values_list("id", flat=True)[:remaining]
        )
        taken.update(ids)
    return taken


def inventory_state(node_ids=None):
    """The state counts of every (node, description) group, optionally only for some nodes."""
    classifier = Classifier()
    reserved = reserved_device_ids(classifier)
    devices = Device.objects.order_by()
    nodes = Node.objects.order_by()
    if node_ids is not None:
        devices = devices.filter(node_id__in=node_ids)
        nodes = nodes.filter(id__in=node_ids)
    # A join on the active allocations rather than EXISTS per device, and the descriptions grouped and
    # read as text (jsonb's text is canonical): hashed, never decoded per row. A shared device has several
    # active allocations (time-slices): devices are counted distinct.
    rows = (
        with_taints_text(devices)
        .alias(active=FilteredRelation("allocations", condition=Q(allocations__released_at__isnull=True)))
        .annotate(**DESCRIPTION_TEXT, partition=IS_PARTITION)
        .values("node_id", *DESCRIPTION_TEXT, "partition")
        .annotate(
            total=Count("id", distinct=True),
            busy_n=Count("id", distinct=True, filter=Q(active__id__isnull=False)),
            outside_n=Count("id", distinct=True, filter=Q(active__id__isnull=True) & held_outside_q()),
            unavailable_n=Count(
                "id", distinct=True, filter=Q(active__id__isnull=True) & unavailable_q() & ~held_outside_q()
            ),
        )
        .values_list("node_id", *DESCRIPTION_TEXT, "partition", "total", "busy_n", "outside_n", "unavailable_n")
    )
    reserved_by_group = defaultdict(int)
    if reserved:
        for row in (
            Device.objects.order_by()
            .filter(id__in=reserved)
            .annotate(**DESCRIPTION_TEXT, partition=IS_PARTITION)
            .values("node_id", *DESCRIPTION_TEXT, "partition")
            .annotate(n=Count("id"))
        ):
            key = (row["node_id"], *(row[name] for name in DESCRIPTION_TEXT), row["partition"])
            reserved_by_group[key] = row["n"]
    plain, gangs = pending_demand_shapes()
    min_request = pending_min_request_of(plain, gangs)
    groups = []
    free_per_node_class = defaultdict(int)
    described = {}  # (driver, attributes text, capacity text) -> (description key, classes)
    # Plain tuples (fetch_rows): one row per node and description, 12,500 at 100k devices.
    for node_id, driver, attributes_text, capacity_text, partition, total, busy, outside, unavailable in fetch_rows(
        rows
    ):
        busy += outside
        text = (driver, attributes_text, capacity_text)
        found = described.get(text)
        if found is None:
            attributes, capacity = json.loads(attributes_text or "{}"), json.loads(capacity_text or "{}")
            found = described[text] = (
                description_key(driver, attributes, capacity),
                classifier.classes_of(driver, attributes, capacity),
            )
        key, classes = found
        reserved_n = reserved_by_group.get((node_id, *text, partition), 0)
        free = total - busy - unavailable - reserved_n
        counts = {"busy": busy, "unhealthy": unavailable, "reserved": reserved_n, "stranded": 0, "free": free}
        groups.append(Group(node_id, key, classes, counts, bool(partition)))
        for name in classes:
            free_per_node_class[(node_id, name)] += free
    node_free = defaultdict(dict)
    for (node_id, name), free in free_per_node_class.items():
        node_free[node_id][name] = free
    domain_free, class_free = {}, {}
    if gangs:
        # A gang's domain counts every node of it: from the whole cluster's free devices when this state
        # covers only some nodes.
        whole = node_free if node_ids is None else current_state().node_free
        domain_free, class_free = domain_totals(whole, node_domain_paths())

    def stranded(classes, node_id):
        return strands_by_shape(classes, node_free[node_id], plain, gangs, domain_free.get(node_id, {}), class_free)

    stranded_nodes = defaultdict(set)
    for (node_id, name), free in free_per_node_class.items():
        if free > 0 and stranded((name,), node_id):
            stranded_nodes[node_id].add(name)
    for group in groups:
        if group.counts["free"] and stranded(group.classes, group.node_id):
            group.counts["stranded"] = group.counts["free"]
            group.counts["free"] = 0
    node_domain = dict(nodes.values_list("id", "domain_id"))
    return InventoryState(
        groups, node_domain, reserved, dict(stranded_nodes), min_request, classifier, dict(node_free),
        plain, gangs, domain_free, class_free,
    )  # fmt: skip


def pending_min_request_of(plain, gangs):
    out = dict(plain)
    for name, shapes in gangs.items():
        for _, per_pod, _ in shapes:
            add_demand(out, (name,), per_pod)
    return out


def node_domain_paths():
    """node id -> {level name: the id of its domain there, "node": the node}: each node's domains on
    every level, for gangs bound to one (accounting.domain_totals)."""
    domains = {
        pk: (level, parent) for pk, level, parent in Domain.objects.values_list("id", "level__name", "parent_id")
    }
    finest = dict(Node.objects.order_by().values_list("id", "domain_id"))

    def paths_of(node_id):
        paths = {"node": node_id}
        domain = finest.get(node_id)
        while domain is not None and domain in domains:
            level, parent = domains[domain]
            paths[level] = domain
            domain = parent
        return paths

    return paths_of


# --- computed once per change, shared by every request and socket ------------------------------------------


def _table(model):
    return connection.ops.quote_name(model._meta.db_table)


def state_key(now=None):
    """A fingerprint of everything inventory_state() reads, cheap enough to take on every request.

    Watermarks, not a counter: bulk updates (the commit, the executor) send no signal, so the key is
    read from the rows themselves, with indexed or small queries only: the inventory generation (every
    inventory service, API and admin change moves it); the nodes (how many, which are cordoned, where;
    a small table); the largest device id; the inventory revision token (triggers move it on every
    inventory write, bulk ones included); the active allocations (how many, the largest id: an
    admission adds rows, a release shrinks the count); the workloads waiting for capacity (how many,
    which); which of them the last explanations say policy holds (HELD_BY_POLICY: they want no
    devices); and, because they depend on the clock, the active reservations and the approval windows
    closed now. The database's own identity comes first, so a recreated database never reads another
    one's entries.

    Not the last cycle itself: a cycle that admits, evicts or moves work in or out of what policy holds
    moves the key through those rows, and one that changes none of them (a steady queue's every beat)
    leaves the state as it was. With the cycle in the key, every cycle's live delta rebuilt the whole
    state (0.4-0.7 s at 100k devices) to find the same counts.
    """
    now = now or timezone.now()
    demand_states = [str(s) for s in DEMAND_STATES]
    placeholders = ", ".join(["%s"] * len(demand_states))
    held_reasons = sorted(HELD_BY_POLICY)
    held = ", ".join(["%s"] * len(held_reasons))
    identity = "(SELECT oid FROM pg_database WHERE datname = current_database())"
    if connection.vendor != "postgresql":
        identity = "0"
    sql = f"""
        SELECT {identity},
            (SELECT coalesce(sum(generation), 0) FROM {_table(ClusterState)}),
            (SELECT count(*) || ':' || coalesce(sum(workload_id), 0) || ':'
                || coalesce(sum((workload_id %% 1000003) * (workload_id %% 1000003)), 0)
                FROM {_table(Explanation)} WHERE reason IN ({held})),
            (SELECT count(*) || ':' || coalesce(max(id), 0) || ':' || coalesce(sum(domain_id), 0)
                || ':' || coalesce(sum(CASE WHEN cordoned THEN id ELSE 0 END), 0) FROM {_table(Node)}),
            (SELECT max(id) FROM {_table(Device)}),
            (SELECT token FROM {_table(InventoryRevision)}),
            (SELECT max(id) FROM {_table(Allocation)}),
            (SELECT count(*) FROM {_table(Allocation)} WHERE released_at IS NULL),
            (SELECT count(*) || ':' || coalesce(sum(id), 0) FROM {_table(Workload)} WHERE state IN ({placeholders}))
    """
    params = [*held_reasons, *demand_states]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        watermarks = list(cursor.fetchone())
    policy = [
        list(DeviceClass.objects.order_by("id").values_list("id", "name", "selector", "price_per_hour")),
        list(
            ResourceClassDeviceClass.objects.order_by("id").values_list("resource_class_id", "device_class_id", "rank")
        ),
        list(
            Reservation.objects.filter(start__lte=now, end__gt=now)
            .order_by("id")
            .values_list("id", "team_id", "device_class_id", "count", "domain_id")
        ),
        sorted(ApprovalRequest.objects.outside_window(now).values_list("workload_id", flat=True)),
    ]
    blob = json.dumps([watermarks, policy], default=str, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()


_local = {}  # process-local copies: {(name, key): value}; a handful, replaced as keys move
_local_lock = threading.Lock()
CACHE_SECONDS = 3600


def cached(name, build, key=None):
    """`build()` once per state key: from this process's copy, else the shared cache, else computed
    (and stored in both). Every page, JSON call and socket in every process shares the result."""
    key = key or state_key()
    local_key = (name, key)
    found = _local.get(local_key)
    if found is not None:
        return found
    cache_key = f"dashboard:{name}:{key}"
    found = shared_get(cache_key)
    if found is None:
        found = build(key)
        shared_set(cache_key, found)
    return _keep(local_key, found)


def shared_get(cache_key):
    """The shared cache's copy, or None; an unreachable Redis is a miss (the page computes it from the
    database) and pauses live updates rather than answering 500."""
    try:
        return cache.get(cache_key)
    except Exception:
        log.warning("the shared cache cannot be read; computing %s from the database", cache_key, exc_info=True)
        live_health.note(False)
        return None


def shared_set(cache_key, found):
    try:
        cache.set(cache_key, found, CACHE_SECONDS)
    except Exception:
        log.warning("the shared cache cannot be written (%s)", cache_key, exc_info=True)
        live_health.note(False)


def current_state(key=None):
    """inventory_state() of the whole cluster, once per state key in this process (the builders of the
    shared summaries read it; it holds compiled selectors, so it stays out of the shared cache)."""
    key = key or state_key()
    found = _local.get(("state", key))
    return found if found is not None else _keep(("state", key), inventory_state())


def _keep(local_key, found):
    name = local_key[0]
    with _local_lock:
        for old in [k for k in _local if k[0] == name]:
            del _local[old]
        _local[local_key] = found
    return found
