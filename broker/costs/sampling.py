"""Capacity samples: what the free devices of each class were doing, recorded once per committed cycle.

Allocations are intervals in their own table; health, reservations and fragmentation are not, so the cycle
records them here. Every device is billed under exactly one class so nothing is counted twice when classes
overlap: an allocated device under the class its allocation claimed it through; a free device under its
*home* class, the most specific class that selects it (the one selecting the fewest devices, then by name).

A free device is, first match wins:
  unhealthy        not Healthy, tainted NoSchedule/NoExecute, or on a cordoned node: it takes no new work;
  reserved unused  held by an active reservation, taken as the scheduler takes them (reservations by name;
                   the owner's running devices count first, then free devices in node/device order);
  stranded         pending work is waiting, but none of it can use this device: no waiting pod set may use
                   any of its classes, or its node has fewer free devices of each such class than the
                   smallest per-pod request for it. This is the cost of fragmentation. With nothing
                   pending, free capacity is idle, not stranded: it waits for demand, not for a shape.
  idle             the rest (the ledger derives it: total minus everything else).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from broker.costs.models import CapacitySample
from broker.inventory.models import Device, Domain, Health
from broker.policy.models import DeviceClass, Reservation, ResourceClassDeviceClass
from broker.scheduler import snapshot as snap
from broker.scheduler.capacity import natural_key
from broker.scheduler.selectors import ClassMatcher
from broker.workloads.models import Allocation, PodSet
from broker.workloads.states import State

DEMAND_STATES = (State.SUBMITTED, State.PENDING, State.PREEMPTED)
SAMPLE_FIELDS = ("total", "unhealthy", "reserved_unused", "stranded", "reserved_by_team")


def record_cycle_capacity(now=None):
    """The one call the cycle commit makes: sample the cluster now and record what changed."""
    now = now or timezone.now()
    return record_capacity_sample(now, sample_capacity(now))


def record_capacity_sample(at, rows):
    """Store the rows of one sample taken at `at`; a class whose counts did not change since its last
    sample gets no new row (the last one still holds). Returns the number of rows written."""
    written = 0
    with transaction.atomic():
        for row in rows:
            counts = {name: row[name] for name in SAMPLE_FIELDS}
            latest = (
                CapacitySample.objects.filter(device_class_id=row["device_class_id"], at__lte=at)
                .order_by("-at")
                .first()
            )
            if latest is not None and {name: getattr(latest, name) for name in SAMPLE_FIELDS} == counts:
                continue
            CapacitySample.objects.update_or_create(device_class_id=row["device_class_id"], at=at, defaults=counts)
            written += 1
    return written


def sample_capacity(now):
    """One row per device class: {device_class_id, total, unhealthy, reserved_unused, stranded,
    reserved_by_team}."""
    classes = {dc.name: dc for dc in DeviceClass.objects.all()}
    devices = _devices(classes)
    home = _home_classes(devices)
    reserved = _reserved_free_devices(devices, classes, now)
    demand = pending_min_request()
    stranded = _stranded(devices, reserved, demand)
    rows = {dc.pk: _empty_row(dc.pk) for dc in classes.values()}
    for device in devices:
        if device["held_class"] is not None:
            rows[device["held_class"]]["total"] += 1
            continue
        name = home.get(device["id"])
        if name is None:
            continue  # no class selects it: it has no price and is not billed
        row = rows[classes[name].pk]
        row["total"] += 1
        if device["unavailable"]:
            row["unhealthy"] += 1
        elif device["id"] in reserved:
            row["reserved_unused"] += 1
            team = reserved[device["id"]]
            row["reserved_by_team"][team] = row["reserved_by_team"].get(team, 0) + 1
        elif device["id"] in stranded:
            row["stranded"] += 1
    return list(rows.values())


def _empty_row(class_id):
    return {
        "device_class_id": class_id,
        "total": 0,
        "unhealthy": 0,
        "reserved_unused": 0,
        "stranded": 0,
        "reserved_by_team": {},
    }


def _devices(classes):
    """Every device with its classes, holder and availability, in the scheduler's device order."""
    active = Allocation.objects.filter(device=OuterRef("pk"), released_at__isnull=True)
    rows = (
        Device.objects.order_by()
        .annotate(
            held_class=Subquery(active.values("device_class_id")[:1]),
            held_team=Subquery(active.values("workload__team__name")[:1]),
            held_preemptible=Subquery(active.values("workload__preemptible")[:1]),
        )
        .values(
            "id",
            "name",
            "node_id",
            "node__name",
            "node__domain_id",
            "node__cordoned",
            "driver",
            "attributes",
            "capacity",
            "health",
            "taints",
            "held_class",
            "held_team",
            "held_preemptible",
        )
    )
    matcher = ClassMatcher(tuple(snap.DeviceClass(name=dc.name, selector=dc.selector) for dc in classes.values()))
    out = []
    for row in rows:
        device = snap.Device(
            id=str(row["id"]),
            node=row["node__name"],
            driver=row["driver"],
            attributes=row["attributes"] or {},
            capacity=row["capacity"] or {},
        )
        blocking = [t for t in row["taints"] or [] if t.get("effect", "NoSchedule") in snap.NO_SCHEDULE_EFFECTS]
        row["classes"] = matcher.classes_of(device)
        row["unavailable"] = row["health"] != Health.HEALTHY or bool(blocking) or row["node__cordoned"]
        out.append(row)
    out.sort(key=lambda row: (natural_key(row["node__name"]), natural_key(row["name"])))
    return out


def _home_classes(devices):
    """{device id: class name} for devices no allocation holds: the most specific class selecting it."""
    selected = Counter(name for device in devices for name in device["classes"])
    return {
        device["id"]: min(device["classes"], key=lambda name: (selected[name], name))
        for device in devices
        if device["classes"]
    }


def _reserved_free_devices(devices, classes, now):
    """{device id: reserving team} for the free, available devices active reservations hold."""
    owned, free_reserved = set(), {}
    domain_nodes = _nodes_under_domains()
    for reservation in (
        Reservation.objects.filter(start__lte=now, end__gt=now).select_related("team", "device_class").order_by("name")
    ):
        scope = domain_nodes.get(reservation.domain_id) if reservation.domain_id else None
        candidates = [
            device
            for device in devices
            if device["id"] not in owned
            and reservation.device_class.name in device["classes"]
            and not (device["health"] != Health.HEALTHY or device["node__cordoned"])
            and (scope is None or device["node_id"] in scope)
        ]

        def tier(device, team=reservation.team.name):
            # As the scheduler ranks them: the owner's own running work first, then free devices, then
            # devices other teams hold with preemptible work; never non-preemptible work of others.
            if device["held_class"] is None:
                return 1
            if device["held_team"] == team:
                return 0
            return 2 if device["held_preemptible"] else 3

        ranked = sorted((d for d in candidates if tier(d) < 3), key=tier)
        for device in ranked[: reservation.count]:
            owned.add(device["id"])
            if device["held_class"] is None and not device["unavailable"]:
                free_reserved[device["id"]] = reservation.team.name
    return free_reserved


def _nodes_under_domains():
    """{domain id: set of node ids in it or below it}."""
    from broker.inventory.models import Node

    children = defaultdict(list)
    for pk, parent in Domain.objects.order_by().values_list("id", "parent_id"):
        children[parent].append(pk)
    nodes_of = defaultdict(set)
    for node_id, domain_id in Node.objects.order_by().values_list("id", "domain_id"):
        nodes_of[domain_id].add(node_id)
    out = {}
    for domain_id in [pk for pks in children.values() for pk in pks]:
        stack, found = [domain_id], set()
        while stack:
            current = stack.pop()
            found |= nodes_of.get(current, set())
            stack.extend(children.get(current, ()))
        out[domain_id] = found
    return out


def pending_min_request():
    """{device class name: smallest per-pod request among waiting pod sets that may use it}."""
    ordered = defaultdict(list)
    for rc_id, name in ResourceClassDeviceClass.objects.order_by("rank").values_list(
        "resource_class_id", "device_class__name"
    ):
        ordered[rc_id].append(name)
    out = {}
    for names, rc_id, per_pod in PodSet.objects.filter(workload__state__in=DEMAND_STATES).values_list(
        "device_classes", "workload__resource_class_id", "devices_per_pod"
    ):
        for name in names or ordered.get(rc_id, []):
            out[name] = min(out.get(name, per_pod), per_pod)
    return out


def _stranded(devices, reserved, demand):
    """Ids of the free, available, unreserved devices no waiting pod set can use (empty when nothing waits)."""
    if not demand:
        return set()
    free = [d for d in devices if d["held_class"] is None and not d["unavailable"] and d["id"] not in reserved]
    free_per_node = Counter((d["node_id"], name) for d in free for name in d["classes"])
    return {
        d["id"]
        for d in free
        if not any(name in demand and free_per_node[(d["node_id"], name)] >= demand[name] for name in d["classes"])
    }
