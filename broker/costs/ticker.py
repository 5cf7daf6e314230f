"""The running-cost ticker: month to date, and what the cluster costs per hour right now."""

from decimal import Decimal

from django.db.models import Count
from django.utils import timezone

from broker.costs.models import CapacitySample
from broker.costs.report import allocation_report
from broker.costs.windows import month_start
from broker.policy.models import DeviceClass
from broker.workloads.models import Allocation

CATEGORIES = ("allocated", "idle", "stranded", "unhealthy", "reserved_unused", "total")


def running_cost(now=None):
    now = now or timezone.now()
    start = month_start(now)
    totals = allocation_report(start, now, step="month", now=now)["totals"] if now > start else None
    prices = dict(DeviceClass.objects.values_list("pk", "price_per_hour"))
    # Counted in SQL: one row per held device is 100,000 rows on a full large cluster.
    held = dict(
        Allocation.objects.filter(released_at__isnull=True)
        .order_by()
        .values("device_class_id")
        .annotate(devices=Count("id"))
        .values_list("device_class_id", "devices")
    )
    capacity = {}
    for class_id in prices:
        latest = CapacitySample.objects.filter(device_class_id=class_id, at__lte=now).order_by("-at").first()
        capacity[class_id] = max(latest.total if latest else 0, held.get(class_id, 0))
    allocated_rate = sum((prices[pk] * n for pk, n in held.items()), Decimal(0))
    capacity_rate = sum((prices[pk] * n for pk, n in capacity.items()), Decimal(0))
    return {
        "at": now,
        "month_start": start,
        "month_to_date": {name: (totals[name]["cost"] if totals else Decimal("0.00")) for name in CATEGORIES},
        "per_hour": {
            "allocated": allocated_rate.quantize(Decimal("0.01")),
            "capacity": capacity_rate.quantize(Decimal("0.01")),
        },
        "devices": {"allocated": sum(held.values()), "capacity": sum(capacity.values())},
    }
