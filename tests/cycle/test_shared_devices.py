"""Devices shared by several allocations end to end (loader -> decide -> commit, issue 26): time-sliced
work takes amounts of a device's capacity (DRA allowMultipleAllocations, consumedCapacity), the amounts
never sum past it, and the database keeps a device whole to one holder and never whole and shared."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.cycle.commit import StaleSnapshot, commit_result
from broker.cycle.loader import forget_everything_loaded, load_snapshot
from broker.cycle.runner import run_once
from broker.inventory.models import Device, Node
from broker.inventory.quantities import quantity
from broker.policy.models import DeviceClass, SharingRule
from broker.scheduler.cycle import decide
from broker.workloads.models import Allocation, PodSet, SchedulingCycle
from broker.workloads.states import State
from tests.builders import make_resource_class
from tests.cycle.helpers import pending

GIB = 2**30
T4_SELECTOR = 'device.attributes["gpu.example.com"].model == "T4"'


def shared_gpus(cluster, memories=("80Gi",)):
    """Node s with one T4 per entry of `memories`, each allowing several allocations of that much memory;
    a class `t4` and a time-sliced resource class `notebooks` of it; queue_a without quota."""
    node = Node.objects.create(name="s", domain=cluster.nodes[0].domain)
    devices = [
        Device.objects.create(
            node=node,
            name=f"s{index}",
            attributes={"model": "T4"},
            capacity={"memory": memory},
            allow_multiple_allocations=True,
        )
        for index, memory in enumerate(memories)
    ]
    t4 = DeviceClass.objects.create(name="t4", selector=T4_SELECTOR, price_per_hour="1.00")
    notebooks = make_resource_class("notebooks", cluster.training.priority_class, [t4], sharing=SharingRule.TIME_SLICED)
    for queue in (cluster.queue_a, cluster.queue_b):
        queue.nominal_quota = None
        queue.save()
    return devices, t4, notebooks


def notebook(cluster, name, memory, notebooks, queue=None, **fields):
    workload = pending(queue or cluster.queue_a, name, resource_class=notebooks, **fields)
    PodSet.objects.filter(workload=workload).update(capacity={"memory": memory})
    return workload


def share(workload, device, device_class, memory):
    return Allocation.objects.create(
        workload=workload,
        device=device,
        device_class=device_class,
        pod_set="main",
        pod_index=0,
        consumed_capacity={"memory": memory},
    )


def used_memory(device):
    """The memory the active shares of `device` take, in bytes."""
    rows = Allocation.objects.filter(device=device, released_at__isnull=True)
    return sum(quantity(consumed["memory"]) for consumed in rows.values_list("consumed_capacity", flat=True))


def test_it_shares_one_gpu_between_two_time_sliced_workloads_and_the_third_waits(cluster):
    (gpu,), _, notebooks = shared_gpus(cluster)
    first = notebook(cluster, "first", "30Gi", notebooks, minutes_ago=3)
    second = notebook(cluster, "second", "40Gi", notebooks, minutes_ago=2)
    third = notebook(cluster, "third", "20Gi", notebooks, minutes_ago=1)

    run_once()
    run_once()  # the next cycle reads the shares back and gives the third nothing more

    active = Allocation.objects.filter(released_at__isnull=True, device=gpu).order_by("workload__name")
    assert [(a.workload.name, quantity(a.consumed_capacity["memory"])) for a in active] == [
        ("first", 30 * GIB),
        ("second", 40 * GIB),
    ]
    # What each bills as, fixed by the commit against the 80Gi the device publishes now.
    assert [a.share_millionths for a in active] == [375_000, 500_000]
    for workload in (first, second):
        workload.refresh_from_db()
        assert workload.state == State.ADMITTED
    third.refresh_from_db()
    assert third.state == State.PENDING
    assert third.explanation.reason == "InsufficientCapacity"
    assert used_memory(gpu) == 70 * GIB


def test_it_keeps_exclusive_work_off_a_shared_gpu_in_use(cluster):
    (gpu,), t4, notebooks = shared_gpus(cluster)
    notebook(cluster, "notebook", "10Gi", notebooks)
    exclusive = make_resource_class("t4-training", cluster.training.priority_class, [t4])
    whole = pending(cluster.queue_b, "whole", resource_class=exclusive, minutes_ago=-1)

    run_once()
    run_once()

    holders = Allocation.objects.filter(released_at__isnull=True, device=gpu).values_list("workload__name", flat=True)
    assert list(holders) == ["notebook"]
    whole.refresh_from_db()
    assert whole.state == State.PENDING


def test_it_refuses_a_stale_result_whose_share_would_exceed_the_capacity(cluster):
    (gpu,), t4, notebooks = shared_gpus(cluster)
    workload = notebook(cluster, "late", "50Gi", notebooks)
    snapshot, loaded = load_snapshot(timezone.now())
    result = decide(snapshot)
    assert [pod.consumed for admission in result.admissions for pod in admission.pods] == [(("memory", 50 * GIB),)]
    # Meanwhile someone else's share of 40 GiB landed (the snapshot does not know).
    share(pending(cluster.queue_b, "meanwhile", state=State.RUNNING), gpu, t4, "40Gi")
    cycle = SchedulingCycle.objects.create()

    with pytest.raises(StaleSnapshot, match=r"capacity memory of device s/s0 would be over-consumed"):
        commit_result(result, loaded, cycle)

    workload.refresh_from_db()
    assert workload.state == State.PENDING
    assert not Allocation.objects.filter(workload=workload).exists()
    assert used_memory(gpu) == 40 * GIB


def test_it_refuses_a_stale_result_that_shares_a_gpu_taken_whole_meanwhile(cluster):
    (gpu,), t4, notebooks = shared_gpus(cluster)
    workload = notebook(cluster, "late", "10Gi", notebooks)
    snapshot, loaded = load_snapshot(timezone.now())
    result = decide(snapshot)
    Allocation.objects.create(
        workload=pending(cluster.queue_b, "whole", state=State.RUNNING),
        device=gpu,
        device_class=t4,
        pod_set="main",
        pod_index=0,
    )
    cycle = SchedulingCycle.objects.create()

    with pytest.raises(StaleSnapshot, match="s/s0"):
        commit_result(result, loaded, cycle)

    workload.refresh_from_db()
    assert workload.state == State.PENDING


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the sharing triggers are PostgreSQL's")
def test_it_lets_the_database_refuse_whole_and_shared_allocations_of_one_device(cluster):
    (gpu,), t4, _ = shared_gpus(cluster)
    plain = Device.objects.filter(node=cluster.nodes[0]).first()
    holder = pending(cluster.queue_b, "holder", state=State.RUNNING)
    share(holder, gpu, t4, "10Gi")
    share(holder, gpu, t4, "10Gi")  # shares stand side by side

    def whole(device):
        Allocation.objects.create(workload=holder, device=device, device_class=t4, pod_set="main", pod_index=1)

    with pytest.raises(IntegrityError, match="a whole allocation of a shared device"), transaction.atomic():
        whole(gpu)
    with pytest.raises(IntegrityError, match="allows no multiple allocations"), transaction.atomic():
        share(holder, plain, t4, "10Gi")
    whole(plain)
    with pytest.raises(IntegrityError, match="allocation_one_whole_per_device"), transaction.atomic():
        whole(plain)


CAPACITIES = st.lists(st.integers(10, 80), min_size=1, max_size=3)


@st.composite
def sharing_cases(draw):
    capacities = draw(CAPACITIES)
    # Shares already running: (device, amount), kept within each device's capacity.
    running, left = [], list(capacities)
    for device, amount in draw(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 40)), max_size=4)):
        if device < len(left) and amount <= left[device]:
            left[device] -= amount
            running.append((device, amount))
    asked = draw(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 2)), min_size=1, max_size=6))
    meddling = draw(st.none() | st.tuples(st.integers(0, 2), st.integers(1, 40)))
    return capacities, running, asked, meddling


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=sharing_cases())
def test_it_never_lets_shares_exceed_a_capacity_through_the_commit(cluster, case):
    """Random capacities, running shares and time-sliced work (one or two pods, one GPU each), and
    maybe a share written between the snapshot and the commit: whatever the commit keeps, no device's
    shares sum past its memory, and a refused commit changes nothing."""
    capacities, running, asked, meddling = case
    forget_everything_loaded()
    try:
        with transaction.atomic():
            devices, t4, notebooks = shared_gpus(cluster, [f"{memory}Gi" for memory in capacities])
            holder = pending(cluster.queue_b, "holder", state=State.RUNNING)
            for device, amount in running:
                share(holder, devices[device], t4, f"{amount}Gi")
            for index, (amount, pods) in enumerate(asked):
                notebook(cluster, f"w{index}", f"{amount}Gi", notebooks, replicas=pods, minutes_ago=len(asked) - index)
            snapshot, loaded = load_snapshot(timezone.now())
            result = decide(snapshot)
            if meddling is not None and meddling[0] < len(devices):
                device, amount = devices[meddling[0]], meddling[1]
                if used_memory(device) + amount * GIB <= capacities[meddling[0]] * GIB:  # a writer that checks
                    share(holder, device, t4, f"{amount}Gi")
            before = sorted(Allocation.objects.values_list("id", flat=True))
            try:
                commit_result(result, loaded, SchedulingCycle.objects.create())
            except StaleSnapshot:
                assert sorted(Allocation.objects.values_list("id", flat=True)) == before
            for device, memory in zip(devices, capacities, strict=True):
                assert used_memory(device) <= memory * GIB
                assert not Allocation.objects.filter(
                    device=device, released_at__isnull=True, consumed_capacity__isnull=True
                ).exists()
            transaction.set_rollback(True)
    finally:
        forget_everything_loaded()


def test_it_takes_a_time_sliced_submission_through_the_api_to_a_share(cluster, api_client, alice):
    from tests.api.base import signed_in

    (gpu,), _, _ = shared_gpus(cluster)
    client = signed_in(api_client, alice)
    pod_sets = [{"name": "main", "replicas": 1, "devices_per_pod": 1, "capacity": {"memory": "20Gi"}}]

    response = client.post("/api/workloads/", {"name": "nb", "resource_class": "notebooks", "pod_sets": pod_sets},
                           format="json")  # fmt: skip
    assert response.status_code == 201, response.data
    assert response.data["pod_sets"][0]["capacity"] == {"memory": "20Gi"}
    run_once()

    (held,) = Allocation.objects.filter(workload_id=response.data["id"], released_at__isnull=True)
    assert (held.device_id, quantity(held.consumed_capacity["memory"])) == (gpu.pk, 20 * GIB)
    (listed,) = client.get("/api/allocations/", {"active": "true"}).json()["results"]
    assert (listed["id"], listed["consumed_capacity"], listed["share"]) == (held.pk, {"memory": 20 * GIB}, 0.25)


def test_it_refuses_capacity_amounts_a_class_cannot_share(cluster, api_client, alice):
    from tests.api.base import signed_in

    shared_gpus(cluster)
    client = signed_in(api_client, alice)
    exclusive = [{"name": "main", "replicas": 1, "devices_per_pod": 1, "capacity": {"memory": "20Gi"}}]
    negative = [{"name": "main", "replicas": 1, "devices_per_pod": 1, "capacity": {"memory": "-1Gi"}}]

    for name, resource_class, pod_sets, problem in (
        ("whole", "small-inference", exclusive, "shares no devices (sharing: TimeSliced)"),
        ("negative", "notebooks", negative, "Capacity 'memory' must be a positive quantity"),
    ):
        body = {"name": name, "resource_class": resource_class, "pod_sets": pod_sets}
        response = client.post("/api/workloads/", body, format="json")
        assert response.status_code == 400, response.data
        assert problem in str(response.data)
    assert not PodSet.objects.filter(workload__name__in=["whole", "negative"]).exists()


def test_it_preempts_a_lower_priority_share_and_then_takes_its_memory(cluster, settings):
    """`batch` (priority 1) holds 60Gi of the 80Gi GPU: a notebook of priority 100 asking 50Gi preempts
    it through the database, waits while it leaves, then shares the GPU with what is left."""
    from datetime import timedelta

    from broker.cycle.executor import SimulatedExecutor
    from broker.workloads.models import Explanation, Workload
    from tests.cycle.helpers import preempting_within

    settings.EVICTION_GRACE_SECONDS = 60  # one second of wall time at 60x
    (gpu,), t4, notebooks = shared_gpus(cluster)
    preempting_within(cluster.queue_a)
    batch = pending(cluster.queue_a, "batch", resource_class=notebooks, state=State.RUNNING, priority=1)
    share(batch, gpu, t4, "60Gi")
    small = notebook(cluster, "small", "10Gi", notebooks, priority=1)
    wanted = notebook(cluster, "wanted", "50Gi", notebooks, priority=100)
    start = timezone.now()

    first = run_once(now=start)

    assert first.preempted == (batch.pk,)
    assert first.admitted == (small.pk,), "the 10Gi notebook fits beside the leaving share, as before"
    explanation = Explanation.objects.get(workload=wanted)
    assert explanation.reason == "PreemptionPending"
    assert f"{batch} (WithinQueue, priority 1)" in explanation.message

    SimulatedExecutor(speed=60).advance(start + timedelta(seconds=1))
    second = run_once(now=start + timedelta(seconds=2))

    assert second.admitted == (wanted.pk,)
    assert Workload.objects.get(pk=batch.pk).state == State.PENDING
    assert used_memory(gpu) == 60 * GIB  # small's 10Gi and the notebook's 50Gi
