"""Capacity samples: what the devices of each class were doing, recorded once per committed cycle.

Allocations are intervals in their own table; health, reservations and fragmentation are not, so the cycle
records them here. What the counts mean (every device once, under one class; unhealthy, reserved unused,
stranded, idle) is defined in one place, the pure core: broker.scheduler.accounting.capacity_by_class. The
cycle computes it from the snapshot it decided on and the decisions it committed, or from a freshly loaded
snapshot outside a cycle (broker.cycle.commit.sample_capacity), and stores the rows through this module.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import OuterRef, Subquery

from broker.costs.models import CapacitySample
from broker.policy.models import DeviceClass
from broker.scheduler.accounting import SHARE_SCALE

SAMPLE_FIELDS = ("total", "unhealthy", "reserved_unused", "stranded", "reserved_by_team", "shared")


def capacity_rows(capacities, class_pks):
    """CapacitySample rows ({device_class_id, total, unhealthy, reserved_unused, stranded,
    reserved_by_team}, and shared when the class has shared devices) from the core's ClassCapacity
    tuples; `class_pks`: {class name: DeviceClass pk}."""
    return [
        {
            "device_class_id": class_pks[row.device_class],
            "total": row.total,
            "unhealthy": row.unhealthy,
            "reserved_unused": row.reserved_unused,
            "stranded": row.stranded,
            "reserved_by_team": dict(row.reserved_unused_by_team),
        }
        | ({"shared": millionths(row.shared)} if row.shared else {})
        for row in capacities
        if row.device_class in class_pks
    ]


def millionths(parts):
    """{category: millionths of a device} of a ClassCapacity's shared parts (Fractions in millionths)."""
    out = {}
    for category, amount in sorted(parts.items()):
        units = amount * SHARE_SCALE
        if units:
            if units.denominator != 1:
                raise ValueError(f"{category} {amount} is not a whole number of millionths")
            out[category] = int(units)
    return out


def record_capacity_sample(at, rows):
    """Store the rows of one sample taken at `at`; a class whose counts did not change since its last
    sample gets no new row (the last one still holds). Returns the number of rows written.
    One query reads the latest sample of every class; only changed classes are written."""
    written = 0
    with transaction.atomic():
        latest = {sample.device_class_id: sample for sample in latest_samples(at)}
        for row in rows:
            counts = {name: row[name] for name in SAMPLE_FIELDS if name != "shared"} | {"shared": row.get("shared", {})}
            before = latest.get(row["device_class_id"])
            if before is not None and {name: getattr(before, name) for name in SAMPLE_FIELDS} == counts:
                continue
            CapacitySample.objects.update_or_create(device_class_id=row["device_class_id"], at=at, defaults=counts)
            written += 1
    return written


def latest_samples(at):
    """The latest sample at or before `at` of every class that has one, in one query."""
    latest = CapacitySample.objects.filter(device_class_id=OuterRef("pk"), at__lte=at).order_by("-at").values("pk")[:1]
    per_class = DeviceClass.objects.order_by().annotate(latest=Subquery(latest)).values("latest")
    return CapacitySample.objects.filter(pk__in=per_class)
