"""Partitionable devices end to end (loader -> decide -> commit): a GPU and its partitions are never
handed out together, whether the inventory states DRA counters or only each partition's parent."""

import pytest
from django.utils import timezone

from broker.cycle.commit import StaleSnapshot, commit_result
from broker.cycle.loader import load_snapshot
from broker.cycle.runner import run_once
from broker.inventory.models import Device, Node
from broker.scheduler.cycle import decide
from broker.workloads.models import Allocation, SchedulingCycle
from broker.workloads.states import State
from tests.cycle.helpers import pending, running

MIG = 'device.attributes["gpu.example.com"].model == "MIG"'


def one_gpu_node(cluster, counters):
    """Node g with whole device g0 and partitions g0-mig-a, g0-mig-b (both H100 by the class's selector)."""
    node = Node.objects.create(name="g", domain=cluster.nodes[0].domain)
    Device.objects.filter(node__in=cluster.nodes).update(health="Unhealthy")  # only g's devices are free
    if counters:
        node.shared_counters = {"gpu-0": {"memory": "80Gi"}}
        node.save()
    whole = Device.objects.create(
        node=node,
        name="g0",
        attributes={"model": "H100"},
        consumes_counters={"gpu-0": {"memory": "80Gi"}} if counters else None,
    )
    partitions = [
        Device.objects.create(
            node=node,
            name=f"g0-mig-{suffix}",
            attributes={"model": "H100"},
            parent=whole,
            consumes_counters={"gpu-0": {"memory": "40Gi"}} if counters else None,
        )
        for suffix in "ab"
    ]
    return whole, partitions


@pytest.mark.parametrize("counters", [False, True], ids=["parent-only", "counter-sets"])
def test_it_never_allocates_a_device_together_with_its_partitions(cluster, counters):
    one_gpu_node(cluster, counters)
    for index in range(3):
        pending(cluster.queue_a, f"one-{index}", resource_class=cluster.inference)

    run_once()

    held = sorted(Allocation.objects.filter(released_at__isnull=True).values_list("device__name", flat=True))
    assert held == ["g0"]
    admitted = cluster.queue_a.workloads.filter(state=State.ADMITTED).count()
    assert admitted == 1


def test_it_places_both_partitions_once_the_whole_device_is_taken_by_nobody(cluster):
    whole, partitions = one_gpu_node(cluster, counters=True)
    # A running holder of one partition: the whole device is out, the other partition is free.
    running(cluster.queue_b, "slice", [partitions[0]], cluster.h100)
    for index in range(2):
        pending(cluster.queue_a, f"one-{index}", resource_class=cluster.inference)

    run_once()

    held = sorted(Allocation.objects.filter(released_at__isnull=True).values_list("device__name", flat=True))
    assert held == ["g0-mig-a", "g0-mig-b"]


def test_it_refuses_a_stale_result_that_would_over_consume_a_counter(cluster):
    whole, partitions = one_gpu_node(cluster, counters=True)
    workload = pending(cluster.queue_a, "slice", resource_class=cluster.inference)
    Device.objects.filter(pk=whole.pk).update(health="Unhealthy")  # the result takes a partition
    snapshot, loaded = load_snapshot(timezone.now())
    result = decide(snapshot)
    assert [pod.device_ids for admission in result.admissions for pod in admission.pods] == [("g/g0-mig-a",)]
    # Meanwhile the whole device went to someone else (the snapshot does not know).
    Allocation.objects.create(
        workload=pending(cluster.queue_b, "w", state=State.RUNNING),
        device=whole,
        device_class=cluster.h100,
        pod_set="main",
        pod_index=0,
    )
    cycle = SchedulingCycle.objects.create()

    with pytest.raises(StaleSnapshot, match="counter memory of counter set gpu-0 on node g would be over-consumed"):
        commit_result(result, loaded, cycle)

    workload.refresh_from_db()
    assert workload.state == State.PENDING
    assert not Allocation.objects.filter(workload=workload).exists()


def test_it_rejects_a_partition_consuming_a_counter_its_node_lacks(cluster):
    from django.core.exceptions import ValidationError

    node = Node.objects.create(name="g", shared_counters={"gpu-0": {"memory": 8}})
    device = Device(node=node, name="p", consumes_counters={"gpu-0": {"compute": 1}})
    with pytest.raises(ValidationError, match="Counter 'compute' is not in counter set 'gpu-0'"):
        device.full_clean()
    device.consumes_counters = {"gpu-9": {"memory": 1}}
    with pytest.raises(ValidationError, match="Counter set 'gpu-9' is not published"):
        device.full_clean()


def test_it_evicts_work_on_a_failed_device_once_and_requeues_it_in_its_place(cluster):
    from broker.workloads.models import ExplanationChange, Workload

    devices = list(Device.objects.filter(node=cluster.nodes[0]).order_by("name"))
    gang = running(cluster.queue_a, "gang", devices[:2], cluster.h100)
    calm = running(cluster.queue_a, "calm", devices[2:3], cluster.h100)
    Device.objects.filter(pk=devices[1].pk).update(taints=[{"key": "xid", "value": "79", "effect": "NoExecute"}])
    Device.objects.filter(pk=devices[2].pk).update(taints=[{"key": "drain", "effect": "NoSchedule"}])

    run_once()
    run_once()

    gang.refresh_from_db()
    assert gang.eviction_requested_at is not None and gang.evicted_for is None
    assert gang.eviction_rule == "DeviceFailed"
    assert gang.eviction_message == "evicted: device n1/1 failed (xid 79)"
    (change,) = ExplanationChange.objects.filter(workload=gang)
    assert change.reason == "Evicted" and change.message.startswith("evicted: device n1/1 failed (xid 79)")
    calm.refresh_from_db()
    assert calm.eviction_requested_at is None, "NoSchedule keeps running work"
    assert Workload.objects.get(pk=gang.pk).submitted_at == gang.submitted_at


def test_it_evicts_only_the_pods_on_a_failed_device_in_pod_mode(cluster):
    from broker.workloads.models import ExplanationChange, PodSet

    devices = [Device.objects.filter(node=node).order_by("name").first() for node in cluster.nodes[:3]]
    elastic = running(cluster.queue_a, "elastic", devices, cluster.h100, disruption_mode="Pod")
    PodSet.objects.filter(workload=elastic).update(min_count=2)
    Device.objects.filter(pk=devices[2].pk).update(health="Unhealthy")

    run_once()

    elastic.refresh_from_db()
    assert elastic.eviction_requested_at is None, "it runs on with its other pods"
    leaving = Allocation.objects.filter(workload=elastic, eviction_requested_at__isnull=False)
    assert list(leaving.values_list("device_id", flat=True)) == [devices[2].pk]
    (change,) = ExplanationChange.objects.filter(workload=elastic)
    assert change.reason == "Shrunk"
    assert change.message.startswith(f"evicted: device {devices[2].node.name}/{devices[2].name} failed (unhealthy)")


@pytest.mark.parametrize("gangs", [2, 8])
def test_it_asks_every_workload_on_failed_devices_to_leave_in_a_few_statements(
    cluster, gangs, django_assert_max_num_queries
):
    """A failure under hundreds of gangs (a rack's power, a switch) stops them all in one cycle: the same
    statements for 2 gangs as for 8, whole gangs and Pod-mode gangs mixed, each audited and explained."""
    from broker.audit.models import AuditEvent
    from broker.cycle.commit import evict_failed
    from broker.scheduler.snapshot import Eviction
    from broker.workloads.models import ExplanationChange, PodSet

    free = list(Device.objects.order_by("node__name", "name"))
    whole, elastic = [], []
    for index in range(gangs):
        if index % 2:
            pair = [free.pop(0), free.pop(3)]  # two nodes: one pod each
            workload = running(cluster.queue_a, f"elastic-{index}", pair, cluster.h100, disruption_mode="Pod")
            PodSet.objects.filter(workload=workload).update(min_count=1)
            elastic.append(workload)
        else:
            whole.append(running(cluster.queue_b, f"whole-{index}", [free.pop(0)], cluster.h100))
    evictions = [Eviction(str(w.pk), "DeviceFailed", f"evicted: device of {w.name} failed (xid 79)") for w in whole]
    evictions += [
        Eviction(str(w.pk), "DeviceFailed", f"evicted: device of {w.name} failed (unhealthy)", pods=(("main", 1),))
        for w in elastic
    ]
    cycle = SchedulingCycle.objects.create()
    now = timezone.now()

    with django_assert_max_num_queries(6):
        stopped = evict_failed(evictions, cycle, now)

    assert stopped == sorted(w.pk for w in whole + elastic)
    for workload in whole:
        workload.refresh_from_db()
        assert (workload.eviction_requested_at, workload.evicted_for) == (now, None)
        assert workload.eviction_message == f"evicted: device of {workload.name} failed (xid 79)"
        assert workload.eviction_rule == "DeviceFailed"
        (audit,) = AuditEvent.objects.filter(target_id=str(workload.pk))
        assert (audit.action, audit.reason) == ("workload.evict", f"DeviceFailed: {workload.eviction_message}")
        assert ExplanationChange.objects.get(workload=workload).reason == "Evicted"
    for workload in elastic:
        workload.refresh_from_db()
        assert workload.eviction_requested_at is None, "it runs on with its other pod"
        leaving = Allocation.objects.filter(workload=workload, eviction_requested_at=now)
        assert list(leaving.values_list("pod_index", flat=True)) == [1]
        (audit,) = AuditEvent.objects.filter(target_id=str(workload.pk))
        assert audit.action == "workload.shrink" and audit.after["pods"] == [["main", 1]]
        assert ExplanationChange.objects.get(workload=workload).reason == "Shrunk"


@pytest.mark.parametrize("victims", [2, 8])
def test_it_asks_every_victim_to_leave_in_a_few_statements(cluster, victims, django_assert_max_num_queries):
    """Whole victims of one cycle's preemptions: the same statements for 2 as for 8, each marked for its
    preemptor, audited and explained, and the preemptor nominated for all their devices."""
    from broker.audit.models import AuditEvent
    from broker.cycle.commit import evict
    from broker.scheduler.snapshot import Preemption
    from broker.workloads.models import ExplanationChange, Workload

    free = list(Device.objects.order_by("node__name", "name"))
    held = [running(cluster.queue_b, f"victim-{index}", [free[index]], cluster.h100) for index in range(victims)]
    preemptor = pending(cluster.queue_a, "urgent", replicas=victims, priority=1000)
    preemptions = [Preemption(str(w.pk), str(preemptor.pk), "WithinQueue", f"{w.name} is below it") for w in held]
    cycle = SchedulingCycle.objects.create()
    now = timezone.now()

    with django_assert_max_num_queries(9):
        asked = evict(preemptions, cycle, now)

    assert asked == sorted(w.pk for w in held)
    for victim in held:
        victim.refresh_from_db()
        assert (victim.eviction_requested_at, victim.evicted_for_id) == (now, preemptor.pk)
        assert (victim.eviction_rule, victim.eviction_message) == ("WithinQueue", f"{victim.name} is below it")
        (audit,) = AuditEvent.objects.filter(target_id=str(victim.pk))
        assert audit.action == "workload.preempt" and audit.after["preemptor"] == preemptor.pk
        assert ExplanationChange.objects.get(workload=victim).reason == "Preempted"
    nominated = Workload.objects.get(pk=preemptor.pk).nominated_devices
    assert sorted(nominated) == sorted(device.pk for device in free[:victims])
