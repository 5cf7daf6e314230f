"""Property tests over random small clusters of shared devices (DRA consumable capacity): whatever the
cycle decides, no device gives more of a capacity than it has, a device held alone is never shared and
a shared one never held alone, gangs stay whole; and a one-device time-sliced request is left pending
only when no device has its amounts left."""

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import (
    Device,
    DeviceClass,
    Node,
    PendingWorkload,
    PodSet,
    Queue,
    ResourceClass,
    RunningPod,
    RunningWorkload,
    SchedulerConfig,
    Snapshot,
)
from tests.scheduler.invariants import assert_preempted_only_what_it_needs, assert_valid_result

CLASSES = (DeviceClass("gpu", match={"model": "A100"}),)
RESOURCE_CLASSES = (
    ResourceClass("notebooks", ("gpu",), sharing="TimeSliced"),
    ResourceClass("training", ("gpu",)),
    ResourceClass("slices", ("gpu",), sharing="Partitioned"),
)
CONFIG = SchedulerConfig(rerun_verification_limit=0, preemption_search_limit=64)


@st.composite
def scenarios(draw):
    nodes, devices, running = [], [], []
    for node_index in range(draw(st.integers(1, 3))):
        name = f"n{node_index}"
        nodes.append(Node(name, {"rack": f"r{node_index % 2}"}))
        for gpu in range(draw(st.integers(1, 3))):
            device_id = f"{name}/{gpu}"
            shared = draw(st.booleans())
            memory = draw(st.sampled_from((40, 80)))
            devices.append(
                Device(device_id, name, attributes={"model": "A100"}, capacity={"memory": memory},
                       allow_multiple_allocations=shared)
            )  # fmt: skip
            use = draw(st.sampled_from(("idle", "idle", "alone", "shared")))
            if use == "alone":
                running.append(
                    RunningWorkload(f"r-{device_id}", "q", (RunningPod("main", 0, name, (device_id,)),), "gpu")
                )
            elif use == "shared" and shared:
                for index in range(draw(st.integers(1, 2))):
                    amount = draw(st.sampled_from((10, 20)))
                    pod = RunningPod("main", 0, name, (device_id,), (("memory", amount),))
                    running.append(RunningWorkload(f"r-{device_id}-{index}", "q", (pod,), "gpu"))
    pending = []
    for index in range(draw(st.integers(1, 5))):
        resource_class = draw(st.sampled_from(("notebooks", "notebooks", "training", "slices")))
        count = draw(st.integers(1, 3))
        capacity = (("memory", draw(st.sampled_from((10, 30, 50, 90)))),) if resource_class == "notebooks" else ()
        pod_set = PodSet(
            "main",
            count=count,
            min_count=draw(st.integers(1, count)),
            devices_per_pod=draw(st.integers(1, 2)),
            capacity=capacity,
        )
        pending.append(
            PendingWorkload(
                f"w{index}", "q", (pod_set,), resource_class=resource_class, priority=draw(st.integers(0, 3))
            )
        )
    return Snapshot(
        levels=("rack",), nodes=tuple(nodes), devices=tuple(devices), device_classes=CLASSES,
        queues=(Queue("q", "team"),), resource_classes=RESOURCE_CLASSES, running=tuple(running),
        pending=tuple(pending), config=CONFIG,
    )  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_it_never_gives_more_capacity_than_a_shared_device_has(snapshot):
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    # What is left once the result applies: a one-device time-sliced request left pending must not fit.
    alone = {d for w in snapshot.running for p in w.pods if not p.consumed for d in p.device_ids}
    taken = {device.id: Counter() for device in snapshot.devices}
    for workload in snapshot.running:
        for pod in workload.pods:
            for device_id in pod.device_ids:
                taken[device_id].update(dict(pod.consumed))
    workloads = {workload.id: workload for workload in snapshot.pending}
    for admission in result.admissions:
        pod_set = workloads[admission.workload_id].pod_sets[0]
        for pod in admission.pods:
            for device_id in pod.device_ids:
                if pod_set.capacity and workloads[admission.workload_id].resource_class == "notebooks":
                    taken[device_id].update(dict(pod_set.capacity))
                else:
                    alone.add(device_id)
    for decision in result.pending:
        pod_set = workloads[decision.workload_id].pod_sets[0]
        if workloads[decision.workload_id].resource_class != "notebooks" or pod_set.min_count != 1:
            continue
        if pod_set.devices_per_pod != 1:
            continue
        ((name, amount),) = pod_set.capacity
        fitting = [
            device.id
            for device in snapshot.devices
            if device.allow_multiple_allocations and device.id not in alone
            and device.capacity[name] - taken[device.id][name] >= amount
        ]  # fmt: skip
        assert not fitting, f"{decision.workload_id} fits {fitting} but waits: {decision.message}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_it_preempts_for_a_time_slice_only_lower_priority_work_and_only_what_it_needs(data):
    """A one-device time-sliced request that finds no room may preempt lower-priority preemptible work
    of its queue: its victims leave some shared device with its amount, none could be spared, and it
    preempts nobody when even every eligible victim would not leave one."""
    snapshot = data.draw(scenarios())
    running = tuple(
        RunningWorkload(
            workload.id, workload.queue, workload.pods, workload.device_class,
            priority=data.draw(st.integers(0, 3)), preemptible=data.draw(st.integers(0, 3)) > 0, started=index,
        )
        for index, workload in enumerate(snapshot.running)
    )  # fmt: skip
    amount = data.draw(st.sampled_from((10, 30, 50)))
    notebook = PendingWorkload(
        "notebook", "q", (PodSet("main", 1, 1, 1, capacity=(("memory", amount),)),), resource_class="notebooks",
        priority=data.draw(st.integers(1, 4)),
    )  # fmt: skip
    snapshot = Snapshot(
        **{**snapshot.__dict__, "running": running, "pending": (notebook,),
           "queues": (Queue("q", "team", within_queue="LowerPriority"),)}
    )  # fmt: skip
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    if result.admissions:
        return

    def fits_without(gone):
        for device in snapshot.devices:
            if not device.allow_multiple_allocations:
                continue
            pods = [pod for w in running if w.id not in gone for pod in w.pods if device.id in pod.device_ids]
            if any(not pod.consumed for pod in pods):
                continue  # held alone
            if device.capacity["memory"] - sum(dict(pod.consumed)["memory"] for pod in pods) >= amount:
                return True
        return False

    assert_preempted_only_what_it_needs(running, notebook, result, fits_without)
