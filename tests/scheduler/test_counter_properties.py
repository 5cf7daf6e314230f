"""Property tests over random clusters of partitionable devices (DRA counter sets): whatever the cycle
decides, no counter is ever exceeded, a whole device never runs beside its partitions, gangs stay
whole, claims for all partitions of a kind (allocationMode All) get every one of their node or none,
distinctAttribute holds; and the same after the next cycle on a state rebased from this one."""

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import (
    CounterSet,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
    Node,
    PendingWorkload,
    PodSet,
    Queue,
    RunningPod,
    RunningWorkload,
    SchedulerConfig,
    Snapshot,
)
from tests.scheduler.invariants import assert_valid_result

PROFILES = {"whole": 8, "4g": 4, "2g": 2, "1g": 1}  # memory slices each consumes of an 8-slice GPU
CLASSES = (
    DeviceClass("any", match={"model": "A100"}),
    *(DeviceClass(profile, match={"profile": profile}) for profile in PROFILES),
)
CONFIG = SchedulerConfig(rerun_verification_limit=5, preemption_search_limit=64)


@st.composite
def clusters(draw):
    nodes, devices, counter_sets = [], [], []
    for node_index in range(draw(st.integers(1, 3))):
        name = f"n{node_index}"
        nodes.append(Node(name, {"rack": f"r{node_index % 2}"}))
        for gpu in range(draw(st.integers(1, 2))):
            memory = draw(st.sampled_from((8, 8, 7)))  # 7: a set that cannot hold the whole device
            counter_sets.append(CounterSet(f"gpu-{gpu}", name, {"memory": memory}))
            cuts = draw(st.lists(st.sampled_from(("4g", "2g", "1g")), max_size=3, unique=True))
            for profile in ("whole", *cuts):
                for part in range(1 if profile == "whole" else 8 // PROFILES[profile]):
                    suffix = "" if profile == "whole" else f":{profile}#{part}"
                    devices.append(
                        Device(
                            f"{name}/{gpu}{suffix}",
                            name,
                            attributes={"model": "A100", "profile": profile},
                            healthy=draw(st.integers(0, 15)) != 0,
                            consumes_counters={f"gpu-{gpu}": {"memory": PROFILES[profile]}},
                        )
                    )
    return nodes, devices, counter_sets


def running_on(draw, devices, counter_sets):
    """Running work on devices that fit the counters together."""
    left = {(c.node, c.name): c.counters["memory"] for c in counter_sets}
    running = []
    for index, device in enumerate(draw(st.permutations(devices))[: draw(st.integers(0, 6))]):
        ((set_name, counters),) = device.consumes_counters.items()
        key = (device.node, set_name)
        if left[key] < counters["memory"]:
            continue
        left[key] -= counters["memory"]
        running.append(
            RunningWorkload(
                f"r{index}",
                "q",
                (RunningPod("main", 0, device.node, (device.id,)),),
                device.attributes["profile"],
                priority=draw(st.integers(0, 3)),
                expected_end=draw(st.sampled_from((None, 500.0, 900.0))),
            )
        )
    return tuple(running)


@st.composite
def snapshots(draw):
    nodes, devices, counter_sets = draw(clusters())
    pending = []
    for index in range(draw(st.integers(1, 6))):
        classes = tuple(draw(st.lists(st.sampled_from([c.name for c in CLASSES]), min_size=1, max_size=2, unique=True)))
        pods = draw(st.integers(1, 3))
        pod_set = PodSet("main", pods, draw(st.integers(1, pods)), draw(st.integers(1, 3)), classes)
        if draw(st.integers(0, 2)) == 0:
            # A claim: every partition of one profile on the node (All), or a count of them, and now and
            # then a second request of another profile with a profile distinct from the first's.
            mode = draw(st.sampled_from(("All", "ExactCount")))
            first = DeviceSubRequest("slices", classes[0], 1 if mode == "All" else draw(st.integers(1, 2)),
                                     allocation_mode=mode)  # fmt: skip
            requests = [DeviceRequest("slices", first)]
            constraints = ()
            if draw(st.booleans()):
                requests.append(
                    DeviceRequest("other", DeviceSubRequest("other", draw(st.sampled_from(tuple(PROFILES)))))
                )
                constraints = (DeviceConstraint(None, (), distinct_attribute="profile"),)
            pod_set = PodSet(
                "main", pods, draw(st.integers(1, pods)), requests=tuple(requests), constraints=constraints
            )
        pending.append(
            PendingWorkload(
                f"w{index}",
                "q",
                (pod_set,),
                priority=draw(st.integers(0, 5)),
                submitted=float(index),
                topology_required=draw(st.sampled_from((None, "rack"))),
            )
        )
    return Snapshot(
        levels=("rack",),
        nodes=tuple(nodes),
        devices=tuple(devices),
        counter_sets=tuple(counter_sets),
        device_classes=CLASSES,
        queues=(Queue("q", "t", within_queue="LowerPriority"),),
        running=running_on(draw, devices, counter_sets),
        pending=tuple(pending),
        now=100.0,
        config=CONFIG,
    )


BOUNDED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@BOUNDED
@given(snapshots())
def test_it_never_exceeds_a_counter_nor_splits_a_gang(snapshot):
    result = decide(snapshot)
    assert_valid_result(snapshot, result)


@BOUNDED
@given(snapshots())
def test_it_keeps_counters_on_a_rebased_state(snapshot):
    result = decide(snapshot)
    admitted = tuple(
        RunningWorkload(
            admission.workload_id,
            "q",
            tuple(RunningPod(pod.pod_set, pod.index, pod.node, pod.device_ids) for pod in admission.pods),
            admission.device_class,
        )
        for admission in result.admissions
    )
    # The next cycle: the same inventory (its state rebased from this one), the admissions running,
    # a running workload gone, and the rest still waiting.
    waiting = tuple(w for w in snapshot.pending if w.id not in {a.workload_id for a in result.admissions})
    following = dataclasses.replace(snapshot, running=snapshot.running[1:] + admitted, pending=waiting)
    assert_valid_result(following, decide(following))
