import importlib

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from broker.cycle.bulk import insert_rows
from broker.inventory.models import Device
from broker.workloads.models import Allocation
from tests.builders import make_workload

COLUMNS = ("workload_id", "device_id", "device_class_id", "pod_set", "pod_index", "allocated_at")


def allocate(workload, device, device_class):
    return Allocation.objects.create(
        workload=workload, device=device, device_class=device_class, pod_set="main", pod_index=0
    )


def test_it_refuses_a_second_active_allocation_in_the_database(cluster):
    device = Device.objects.first()
    first = make_workload(cluster.queue_a, name="first")
    second = make_workload(cluster.queue_b, name="second")
    allocate(first, device, cluster.h100)
    with pytest.raises(IntegrityError), transaction.atomic():
        # bulk_create skips model validation: only the partial unique index can refuse this.
        Allocation.objects.bulk_create(
            [Allocation(workload=second, device=device, device_class=cluster.h100, pod_set="main", pod_index=0)]
        )
    assert Allocation.objects.filter(device=device).count() == 1


def test_it_allows_a_new_allocation_after_release(cluster):
    device = Device.objects.first()
    first = make_workload(cluster.queue_a, name="first")
    second = make_workload(cluster.queue_b, name="second")
    held = allocate(first, device, cluster.h100)
    held.released_at = timezone.now()
    held.save()
    allocate(second, device, cluster.h100)
    assert Allocation.objects.filter(device=device, released_at__isnull=True).get().workload == second


def test_it_refuses_a_release_before_the_allocation(cluster):
    device = Device.objects.first()
    held = allocate(make_workload(cluster.queue_a), device, cluster.h100)
    held.released_at = held.allocated_at - timezone.timedelta(seconds=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        held.save()


def raw(sql, params=()):
    """A statement as any writer might send it, past the ORM's PROTECT."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def insert_allocation(workload_id, device_id, device_class):
    raw(
        "INSERT INTO workloads_allocation (workload_id, device_id, device_class_id, pod_set, pod_index, allocated_at) "
        "VALUES (%s, %s, %s, 'main', 0, %s)",
        [workload_id, device_id, device_class.pk, timezone.now()],
    )


@pytest.mark.parametrize("missing", ["workload", "device"])
def test_it_refuses_an_allocation_of_a_missing_workload_or_device_in_the_database(cluster, missing):
    workload = make_workload(cluster.queue_a)
    device = Device.objects.first()
    ids = {"workload": workload.pk, "device": device.pk, missing: 10**9}

    with pytest.raises(IntegrityError, match="does not exist"), transaction.atomic():
        insert_allocation(ids["workload"], ids["device"], cluster.h100)

    assert not Allocation.objects.exists()


def test_it_checks_every_row_of_a_bulk_insert_in_the_database(cluster):
    workload = make_workload(cluster.queue_a)
    first, second = Device.objects.order_by("pk")[:2]
    rows = [(workload.pk, first.pk), (workload.pk, 10**9), (workload.pk, second.pk)]

    expected = f"device {10**9}, which does not exist" if connection.vendor == "postgresql" else "does not exist"
    with pytest.raises(IntegrityError, match=expected), transaction.atomic():
        insert_rows(Allocation, COLUMNS, [(*row, cluster.h100.pk, "main", 0, timezone.now()) for row in rows])

    assert not Allocation.objects.exists()


def test_it_refuses_moving_an_allocation_to_a_missing_device_in_the_database(cluster):
    held = allocate(make_workload(cluster.queue_a), Device.objects.first(), cluster.h100)

    with pytest.raises(IntegrityError, match="does not exist"), transaction.atomic():
        raw("UPDATE workloads_allocation SET device_id = %s WHERE id = %s", [10**9, held.pk])
    raw("UPDATE workloads_allocation SET released_at = %s WHERE id = %s", [timezone.now(), held.pk])

    held.refresh_from_db()
    assert held.device_id == Device.objects.first().pk and held.released_at is not None


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="SQLite leaves deletions to Django's PROTECT")
@pytest.mark.parametrize("table", ["inventory_device", "workloads_workload"])
def test_it_refuses_deleting_an_allocated_workload_or_device_in_the_database(cluster, table):
    workload = make_workload(cluster.queue_a)
    device = Device.objects.first()
    held = allocate(workload, device, cluster.h100)
    held.released_at = timezone.now()
    held.save()  # released, still named: as with the foreign key, history keeps its rows
    doomed = device.pk if table == "inventory_device" else workload.pk

    with pytest.raises(IntegrityError, match=f"{table} {doomed} is named by allocations"), transaction.atomic():
        raw(f"DELETE FROM {table} WHERE id = %s", [doomed])
    with pytest.raises(IntegrityError, match="is named by allocations"), transaction.atomic():
        raw(f"UPDATE {table} SET id = %s WHERE id = %s", [10**9, doomed])

    other = Device.objects.exclude(pk=device.pk).first()
    raw("DELETE FROM inventory_device WHERE id = %s", [other.pk])  # one nothing names goes
    assert Allocation.objects.get().device == device
    assert not Device.objects.filter(pk=other.pk).exists()


def shared(device, capacity):
    device.capacity = capacity
    device.allow_multiple_allocations = True
    device.save()
    return device


def test_it_fixes_the_share_of_a_share_saved_by_hand_against_its_device_s_capacity(cluster):
    device = shared(Device.objects.first(), {"memory": "80Gi", "bandwidth": "100"})
    held = Allocation.objects.create(
        workload=make_workload(cluster.queue_a, name="sliced"), device=device, device_class=cluster.h100,
        pod_set="main", pod_index=0, consumed_capacity={"memory": "20Gi", "bandwidth": "50"},
    )  # fmt: skip
    whole = allocate(make_workload(cluster.queue_b, name="whole"), Device.objects.last(), cluster.h100)
    # The largest fraction among the capacities it takes (bandwidth's half); a whole device has none.
    assert (held.share_millionths, whole.share_millionths) == (500_000, None)


def test_it_fixes_the_shares_written_before_they_were_kept(cluster):
    from django.apps import apps

    migration = importlib.import_module("broker.workloads.migrations.0025_allocation_share_millionths")
    device = shared(Device.objects.first(), {"memory": "80Gi"})
    workload = make_workload(cluster.queue_a, name="sliced")
    rows = [
        Allocation(workload=workload, device=device, device_class=cluster.h100, pod_set="main", pod_index=index,
                   consumed_capacity={"memory": memory})
        for index, memory in enumerate(("10Gi", "30Gi"))
    ]  # fmt: skip
    Allocation.objects.bulk_create(rows)  # no save(): no share, as rows written before the migration
    assert set(Allocation.objects.values_list("share_millionths", flat=True)) == {None}

    migration.fix_shares(apps, None)

    assert sorted(Allocation.objects.values_list("share_millionths", flat=True)) == [125_000, 375_000]
