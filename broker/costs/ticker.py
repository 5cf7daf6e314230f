"""The running-cost ticker: month to date, and what the cluster costs per hour right now."""

from collections import defaultdict
from decimal import Decimal

from django.db.models import Count
from django.utils import timezone

from broker.costs import ledger
from broker.costs.models import CapacitySample
from broker.costs.report import SHARE_KEYS, Shares, allocation_report
from broker.costs.windows import month_start
from broker.flat_rows import fetch_rows
from broker.policy.models import DeviceClass
from broker.workloads.models import Allocation

CATEGORIES = ("allocated", "idle", "stranded", "unhealthy", "reserved_unused", "total")


def running_cost(now=None):
    now = now or timezone.now()
    start = month_start(now)
    totals = allocation_report(start, now, step="month", now=now)["totals"] if now > start else None
    prices = dict(DeviceClass.objects.values_list("pk", "price_per_hour"))
    # Counted in SQL: one row per held device is 100,000 rows on a full large cluster. An allocation of a
    # shared device counts for its share (report.SHARE_KEYS keeps them apart).
    rows = fetch_rows(
        Allocation.objects.filter(released_at__isnull=True)
        .order_by()
        .annotate(**SHARE_KEYS)
        .values("device_class_id", *SHARE_KEYS)
        .annotate(devices=Count("id"))
        .values_list("device_class_id", *SHARE_KEYS, "devices")
    )
    shares = Shares(row[1] for row in rows)
    held = defaultdict(int)
    for class_id, device, consumed, devices in rows:
        held[class_id] += shares.devices(devices, device, consumed)
    capacity = {}
    for class_id in prices:
        latest = CapacitySample.objects.filter(device_class_id=class_id, at__lte=now).order_by("-at").first()
        total = ledger.from_millionths(latest.total, (latest.shared or {}).get("over", 0)) if latest else 0
        capacity[class_id] = max(total, held.get(class_id, 0))
    allocated_rate = sum((prices[pk] * as_decimal(n) for pk, n in held.items()), Decimal(0))
    capacity_rate = sum((prices[pk] * as_decimal(n) for pk, n in capacity.items()), Decimal(0))
    return {
        "at": now,
        "month_start": start,
        "month_to_date": {name: (totals[name]["cost"] if totals else Decimal("0.00")) for name in CATEGORIES},
        "per_hour": {
            "allocated": allocated_rate.quantize(Decimal("0.01")),
            "capacity": capacity_rate.quantize(Decimal("0.01")),
        },
        "devices": {"allocated": as_number(sum(held.values())), "capacity": as_number(sum(capacity.values()))},
    }


def as_decimal(devices):
    """An int, or a Fraction in millionths of a device (shares), as an exact Decimal."""
    if isinstance(devices, int):
        return Decimal(devices)
    return Decimal(devices.numerator) / Decimal(devices.denominator)


def as_number(devices):
    """Devices as shown: an int when whole, else a Decimal to the millionth."""
    if devices == int(devices):
        return int(devices)
    return as_decimal(devices).quantize(Decimal("0.000001"))
