"""Pod disruption mode through the database: a cycle shrinks an elastic victim to its gang minimum
instead of stopping it, the executor stops just those pods, and the preemptor gets their devices."""

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.audit.models import AuditEvent
from broker.cycle.commit import StaleSnapshot, commit_result
from broker.cycle.executor import SimulatedExecutor
from broker.cycle.loader import load_snapshot
from broker.cycle.runner import run_once
from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import leaving_id
from broker.workloads.models import (
    Allocation,
    DisruptionMode,
    Explanation,
    ExplanationChange,
    PodSet,
    SchedulingCycle,
    Workload,
)
from broker.workloads.states import State
from tests.cycle.helpers import pending, preempting_within, rack_devices, running

pytestmark = pytest.mark.django_db


def elastic(queue, name, devices, device_class, min_count, **fields):
    """A Running Pod-mode workload with one pod per device and a gang minimum of `min_count`."""
    workload = Workload.objects.create(
        name=name, team=queue.team, queue=queue, state=State.RUNNING, disruption_mode=DisruptionMode.POD, **fields
    )
    PodSet.objects.create(workload=workload, name="main", replicas=len(devices), min_count=min_count, devices_per_pod=1)
    for index, device in enumerate(devices):
        Allocation.objects.create(
            workload=workload, device=device, device_class=device_class, pod_set="main", pod_index=index
        )
    return workload


@pytest.fixture
def shrinkable(cluster, settings):
    """Rack r1 held by an elastic workload (8 one-device pods, gang minimum 4), rack r2 by work that
    may not be preempted, and a claimant that needs one node's four devices."""
    settings.EVICTION_GRACE_SECONDS = 60  # one second of wall time at 60x
    preempting_within(cluster.queue_a)
    rack_1, rack_2 = rack_devices("r1"), rack_devices("r2")
    stretchy = elastic(cluster.queue_a, "stretchy", rack_1, cluster.h100, min_count=4, priority=1)
    running(cluster.queue_a, "steady", rack_2, cluster.h100, priority=500, preemptible=False)
    claimant = pending(
        cluster.queue_a, "claimant", replicas=1, devices_per_pod=4, resource_class=cluster.training, priority=100
    )
    return stretchy, claimant, rack_1


def test_it_shrinks_an_elastic_victim_and_gives_its_pods_devices_to_the_preemptor(shrinkable):
    stretchy, claimant, rack_1 = shrinkable
    leaving_devices = {device.pk for device in rack_1[4:]}  # pods 4..7: the second node of r1
    start = timezone.now()

    # 1. The cycle shrinks it: pods 4..7 are asked to leave, the workload itself is not evicting.
    run = run_once(now=start)

    assert run.preempted == (stretchy.pk,)
    stretchy.refresh_from_db()
    assert stretchy.state == State.RUNNING and not stretchy.evicting
    marked = Allocation.objects.filter(workload=stretchy, released_at__isnull=True, eviction_requested_at__isnull=False)
    assert sorted(marked.values_list("pod_index", flat=True)) == [4, 5, 6, 7]
    assert set(marked.values_list("evicted_for", flat=True)) == {claimant.pk}
    event = AuditEvent.objects.get(action="workload.shrink", target_id=str(stretchy.pk))
    assert (event.before["pods"], event.after["pods"], event.after["preemptor"]) == (8, 4, claimant.pk)
    told = ExplanationChange.objects.get(workload=stretchy, reason="Shrunk").message
    assert told.startswith("4 of its pods preempted by team-a/claimant (priority 100) under rule WithinQueue: ")
    assert told.endswith("it runs on with 4 pods")
    claimant.refresh_from_db()
    assert set(claimant.nominated_devices) == leaving_devices
    explanation = Explanation.objects.get(workload=claimant)
    assert explanation.reason == "PreemptionPending"
    assert f"{stretchy} (4 pods, WithinQueue, priority 1)" in explanation.message

    # 2. The next snapshot splits it: the pods staying, and the pods leaving, held for the claimant.
    snapshot, _ = load_snapshot(start + timedelta(milliseconds=500))
    records = {workload.id: workload for workload in snapshot.running}
    staying, going = records[str(stretchy.pk)], records[leaving_id(str(stretchy.pk))]
    assert [pod.index for pod in staying.pods] == [0, 1, 2, 3] and not staying.evicting
    assert staying.surplus_pods == ()  # at its gang minimum: it cannot shrink again
    assert (going.evicting, going.evicted_for, going.part_of) == (True, str(claimant.pk), str(stretchy.pk))
    second = run_once(now=start + timedelta(milliseconds=500))
    assert (second.preempted, second.admitted) == ((), ())
    assert f"{stretchy} (4 pods being evicted)" in Explanation.objects.get(workload=claimant).message

    # 3. The executor stops those pods after the grace period; the workload runs on with the others.
    executor = SimulatedExecutor(speed=60)
    assert executor.advance(start + timedelta(milliseconds=900)).shrunk == []
    progress = executor.advance(start + timedelta(seconds=1))
    assert (progress.shrunk, progress.evicted) == ([stretchy.pk], [])
    stretchy.refresh_from_db()
    assert stretchy.state == State.RUNNING
    active = Allocation.objects.filter(workload=stretchy, released_at__isnull=True)
    assert sorted(active.values_list("pod_index", flat=True)) == [0, 1, 2, 3]
    stopped = AuditEvent.objects.get(action="workload.pods_evicted", target_id=str(stretchy.pk))
    assert (stopped.before["pods"], stopped.after["pods"]) == (8, 4)
    assert ExplanationChange.objects.filter(workload=stretchy, reason="PodsStopped").exists()

    # 4. The claimant is admitted on the devices its victim's pods gave up.
    third = run_once(now=start + timedelta(seconds=2))
    assert third.admitted == (claimant.pk,)
    assert set(Allocation.objects.filter(workload=claimant).values_list("device_id", flat=True)) == leaving_devices


def test_it_refuses_a_shrink_whose_pods_stopped_since_the_snapshot(shrinkable):
    stretchy, claimant, _ = shrinkable
    snapshot, loaded = load_snapshot(timezone.now())
    result = decide(snapshot)
    assert [preemption.pods for preemption in result.preemptions] == [tuple(("main", i) for i in range(4, 8))]
    Allocation.objects.filter(workload=stretchy, pod_index=7).update(released_at=timezone.now())
    cycle = SchedulingCycle.objects.create()

    with pytest.raises(StaleSnapshot, match="the pods chosen to leave changed"):
        commit_result(result, loaded, cycle)

    cycle.refresh_from_db()
    assert cycle.outcome == SchedulingCycle.Outcome.REFUSED
    assert not Allocation.objects.filter(eviction_requested_at__isnull=False).exists()
    assert not AuditEvent.objects.filter(action="workload.shrink").exists()


def test_it_evicts_a_podgroup_mode_workload_of_the_same_shape_whole(shrinkable):
    stretchy, claimant, _ = shrinkable
    Workload.objects.filter(pk=stretchy.pk).update(disruption_mode=DisruptionMode.POD_GROUP)

    run_once()

    stretchy.refresh_from_db()
    assert stretchy.evicting
    assert not Allocation.objects.filter(eviction_requested_at__isnull=False).exists()
