from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from broker.costs.models import DeviceClassPrice
from broker.costs.prices import EPOCH, set_price
from broker.costs.report import allocation_report
from broker.workloads.models import Allocation
from tests.builders import make_workload

NOV = datetime(2026, 11, 1, tzinfo=UTC)


def hold(workload, devices, device_class, start, end=None):
    return [
        Allocation.objects.create(
            workload=workload,
            device=device,
            device_class=device_class,
            pod_set="main",
            pod_index=index,
            allocated_at=start,
            released_at=end,
        )
        for index, device in enumerate(devices)
    ]


def test_it_records_the_first_price_of_a_class_for_all_time(cluster):
    [row] = DeviceClassPrice.objects.filter(device_class=cluster.h100)
    assert row.effective_from == EPOCH
    assert row.price_per_hour == Decimal("4.0000")


def test_it_records_a_new_row_when_the_class_price_is_edited(cluster):
    cluster.h100.price_per_hour = Decimal("5.50")
    cluster.h100.save()
    rows = list(DeviceClassPrice.objects.filter(device_class=cluster.h100))
    assert [r.price_per_hour for r in rows] == [Decimal("4.0000"), Decimal("5.5000")]
    assert rows[1].effective_from > EPOCH
    cluster.h100.description = "unchanged price"
    cluster.h100.save()
    assert DeviceClassPrice.objects.filter(device_class=cluster.h100).count() == 2


def test_it_refuses_to_change_a_price_backwards(cluster):
    set_price(cluster.h100, "6.00", at=NOV + timedelta(days=10))
    cluster.h100.refresh_from_db()
    assert cluster.h100.price_per_hour == Decimal("6.0000")
    with pytest.raises(ValidationError):
        set_price(cluster.h100, "1.00", at=NOV + timedelta(days=5))


def test_it_applies_a_price_change_from_its_date_never_retroactively(cluster):
    devices = list(cluster.nodes[0].devices.all()[:2])
    job = make_workload(cluster.queue_a, name="long-job")
    hold(job, devices, cluster.h100, NOV, NOV + timedelta(days=2))
    now = NOV + timedelta(days=30)
    before = allocation_report(NOV, NOV + timedelta(days=2), step="day", now=now)
    assert [s["allocations"]["team-a"]["cost"] for s in before["steps"]] == [Decimal("192.00")] * 2
    set_price(cluster.h100, "10.00", at=NOV + timedelta(days=1, hours=12))
    after = allocation_report(NOV, NOV + timedelta(days=2), step="day", now=now)
    # Day 1 is exactly what it was; day 2 is 12 h at 4.00 and 12 h at 10.00, on 2 devices.
    assert after["steps"][0]["allocations"]["team-a"]["cost"] == Decimal("192.00")
    assert after["steps"][1]["allocations"]["team-a"]["cost"] == Decimal("336.00")
    assert after["totals"]["total"]["cost"] == Decimal("528.00")
