import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from broker.inventory.models import Device
from broker.workloads.models import Allocation
from tests.builders import make_workload


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
