"""Property tests over random small clusters of GPUs and NICs with claims of several requests (DRA
DeviceClaim): whatever the cycle decides, every request gets one of its ways (allocationMode All: every
device of its kind on the pod's node), every matchAttribute and distinctAttribute constraint holds for
every pod, no device is given twice and gangs stay whole; and no workload is left pending that a
brute-force search could place on the devices the cycle left free."""

from itertools import combinations, product

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler.cycle import decide
from broker.scheduler.selectors import ClassMatcher
from broker.scheduler.snapshot import (
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
from tests.scheduler.invariants import assert_preempted_only_what_it_needs, assert_valid_result

CLASSES = (
    DeviceClass("h100", match={"model": "H100"}),
    DeviceClass("a100", match={"model": "A100"}),
    DeviceClass("gpu", match={"kind": "gpu"}),  # both models: overlaps the two above
    DeviceClass("nic", match={"kind": "nic"}),
    DeviceClass("efa", match={"kind": "nic", "type": "efa"}),
)
CONFIG = SchedulerConfig(rerun_verification_limit=0, preemption_search_limit=64)


@st.composite
def clusters(draw):
    nodes, devices = [], []
    for node_index in range(draw(st.integers(1, 3))):
        name = f"n{node_index}"
        nodes.append(Node(name, {"rack": f"r{node_index % 2}"}))
        model = draw(st.sampled_from(("H100", "A100")))
        for gpu in range(draw(st.integers(0, 6))):
            root = draw(st.sampled_from(("p0", "p1", "p2")))
            attributes = {"kind": "gpu", "model": model, "root": root}
            # Now and then a broken one: it takes no work, and makes an All request of its kind fail there.
            healthy = draw(st.integers(0, 7)) > 0
            devices.append(Device(f"{name}/{gpu}", name, attributes=attributes, healthy=healthy))
        for nic in range(draw(st.integers(0, 3))):
            root = draw(st.sampled_from(("p0", "p1", "p2")))
            attributes = {"kind": "nic", "type": draw(st.sampled_from(("efa", "eth"))), "root": root}
            devices.append(Device(f"{name}/nic-{nic}", name, attributes=attributes))
    return nodes, devices


@st.composite
def claims(draw):
    requests = []
    if draw(st.booleans()):
        requests.append(DeviceRequest("acc", DeviceSubRequest("acc", draw(st.sampled_from(("h100", "gpu"))),
                                                              draw(st.integers(1, 3)))))  # fmt: skip
    else:
        ways = (DeviceSubRequest("big", "h100", draw(st.integers(1, 2))), DeviceSubRequest("small", "a100", 2))
        requests.append(DeviceRequest("acc", first_available=ways))
    if draw(st.booleans()):
        mode = draw(st.sampled_from(("ExactCount", "ExactCount", "All")))  # All: every NIC of its kind on the node
        requests.append(DeviceRequest("net", DeviceSubRequest("net", draw(st.sampled_from(("nic", "efa"))),
                                                              allocation_mode=mode)))  # fmt: skip
    if draw(st.integers(0, 3)) == 0:
        requests.append(DeviceRequest("spare", DeviceSubRequest("spare", "gpu")))
    if draw(st.integers(0, 3)) == 0:  # every A100 of the node, or else two H100 (All in firstAvailable)
        ways = (DeviceSubRequest("all", "a100", allocation_mode="All"), DeviceSubRequest("two", "h100", 2))
        requests.append(DeviceRequest("whole", first_available=ways))
    constraints = []
    present = {request.name for request in requests}
    for _ in range(draw(st.integers(0, 2))):
        names = draw(st.sampled_from(((), ("acc", "net"), ("acc",), ("acc", "spare"), ("net", "whole"))))
        names = tuple(name for name in names if name in present)
        if draw(st.booleans()):
            constraints.append(DeviceConstraint("root", names))
        else:
            constraints.append(
                DeviceConstraint(None, names, distinct_attribute=draw(st.sampled_from(("root", "kind"))))
            )
    return tuple(requests), tuple(constraints)


@st.composite
def workloads(draw, count):
    pending = []
    for index in range(count):
        requests, constraints = draw(claims())
        pod_sets = [PodSet("main", count=draw(st.integers(1, 3)), requests=requests, constraints=constraints)]
        if draw(st.integers(0, 3)) == 0:
            pod_sets.append(PodSet("side", count=1, requests=(DeviceRequest("one", DeviceSubRequest("one", "gpu")),)))
        pending.append(
            PendingWorkload(f"w{index}", "q", tuple(pod_sets), priority=draw(st.integers(0, 3)), submitted=index)
        )
    return tuple(pending)


def snapshot_of(nodes, devices, pending, running=(), queue=None):
    return Snapshot(
        levels=("rack",),
        nodes=tuple(nodes),
        devices=tuple(devices),
        device_classes=CLASSES,
        queues=(queue or Queue("q", "team"),),
        running=tuple(running),
        pending=pending,
        config=CONFIG,
    )


def brute_force_fits(workload, devices, everything=None) -> bool:
    """Whether the workload's gang fits `devices` (the free ones; unhealthy ones take nothing), by trying
    every node, way and device subset for every pod; `everything`: every device of the cluster, which
    an All way must take in full on its node (default: `devices`)."""
    matcher = ClassMatcher(CLASSES)
    every = list(everything or devices)
    classes = {device.id: matcher.classes_of(device) for device in every}
    usable = {device.id for device in devices if device.healthy}
    by_node: dict[str, list] = {}
    for device in every:
        by_node.setdefault(device.node, []).append(device)
    pods = [pod_set for pod_set in workload.pod_sets for _ in range(pod_set.gang_size)]

    def pick(pod_set, ways, pools, at, used, chosen):
        if at == len(ways):
            yield dict(chosen)
            return
        if ways[at].takes_all:  # all of them, each free and usable, at least one
            subsets = [tuple(pools[at])] if pools[at] and all(d.id in usable for d in pools[at]) else []
        else:
            subsets = combinations([d for d in pools[at] if d.id in usable], ways[at].count)
        for subset in subsets:
            if any(d.id in used for d in subset):
                continue
            chosen[pod_set.requests[at].name] = subset
            yield from pick(pod_set, ways, pools, at + 1, used | {d.id for d in subset}, chosen)
            del chosen[pod_set.requests[at].name]

    def pod_options(pod_set, node_devices, used):
        for ways in product(*(request.alternatives for request in pod_set.requests)):
            pools = [[d for d in node_devices if way.device_class in classes[d.id]] for way in ways]
            for chosen in pick(pod_set, ways, pools, 0, used, {}):
                if all(_holds(constraint, chosen) for constraint in pod_set.constraints):
                    yield {device.id for subset in chosen.values() for device in subset}

    def place(at, used):
        if at == len(pods):
            return True
        for node_devices in by_node.values():
            for taken in pod_options(pods[at], node_devices, used):
                if place(at + 1, used | taken):
                    return True
        return False

    return place(0, frozenset())


def _holds(constraint, chosen) -> bool:
    names = constraint.requests or tuple(chosen)
    picked = [device for name in names for device in chosen[name]]
    attribute = constraint.attribute
    if not all(attribute in device.attributes for device in picked):
        return False
    values = [device.attributes[attribute] for device in picked]
    if constraint.match_attribute:
        return len(set(values)) <= 1
    return len(set(values)) == len(values)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.data())
def test_it_keeps_every_claim_and_leaves_nothing_placeable_pending(cluster, data):
    nodes, devices = cluster
    pending = data.draw(workloads(data.draw(st.integers(1, 3))))
    snapshot = snapshot_of(nodes, devices, pending)
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    # Nothing else competes (no quota, no running work): what is still pending must not fit on what the
    # cycle left free, else the search missed a placement.
    taken = {device_id for admission in result.admissions for pod in admission.pods for device_id in pod.device_ids}
    free = [device for device in devices if device.id not in taken]
    admitted = {admission.workload_id for admission in result.admissions}
    for workload in pending:
        if workload.id not in admitted:
            assert not brute_force_fits(workload, free, devices), f"{workload.id} fits but was left pending"
        else:  # the brute force itself must see what the cycle placed
            assert brute_force_fits(workload, devices), f"{workload.id} was placed where nothing fits"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.data())
def test_it_keeps_claims_beside_running_work(cluster, data):
    nodes, devices = cluster
    held = data.draw(st.lists(st.sampled_from([d.id for d in devices]), unique=True, max_size=3)) if devices else []
    by_id = {device.id: device for device in devices}
    running = tuple(
        RunningWorkload(f"r{index}", "q", (RunningPod("main", 0, by_id[device_id].node, (device_id,)),), "gpu")
        for index, device_id in enumerate(held)
    )
    pending = data.draw(workloads(2))
    snapshot = snapshot_of(nodes, devices, pending, running)
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    given_out = {device_id for admission in result.admissions for pod in admission.pods for device_id in pod.device_ids}
    assert not given_out & set(held), "a running workload's device given to a claim"


@st.composite
def preemptors(draw):
    """A claim that fits most idle clusters (GPUs, now and then a NIC under their root), above most work."""
    requests = [DeviceRequest("acc", DeviceSubRequest("acc", "gpu", draw(st.integers(1, 2))))]
    constraints = ()
    if draw(st.booleans()):
        requests.append(DeviceRequest("net", DeviceSubRequest("net", "nic")))
        if draw(st.booleans()):
            constraints = (DeviceConstraint("root", ("acc", "net")),)
    pod_set = PodSet("main", count=draw(st.integers(1, 2)), requests=tuple(requests), constraints=constraints)
    return PendingWorkload("claim", "q", (pod_set,), priority=draw(st.integers(1, 4)), submitted=100)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.data())
def test_it_preempts_for_a_claim_only_lower_priority_work_and_only_what_it_needs(cluster, data):
    """A claim that does not fit may preempt lower-priority preemptible work of its queue (LowerPriority):
    its victims free room the brute force can place it in, none of them could be spared, and it
    preempts nobody when even every eligible victim would not make room."""
    nodes, devices = cluster
    healthy = [device.id for device in devices if device.healthy]
    # A busy cluster (most devices held) and a preemptor above most of the work: preemption is the rule.
    held = data.draw(st.lists(st.sampled_from(healthy), unique=True, min_size=len(healthy) // 2)) if healthy else []
    by_id = {device.id: device for device in devices}
    running = tuple(
        RunningWorkload(
            f"r{index}", "q", (RunningPod("main", 0, by_id[device_id].node, (device_id,)),), "gpu",
            priority=data.draw(st.integers(0, 3)), preemptible=data.draw(st.integers(0, 3)) > 0, started=index,
        )
        for index, device_id in enumerate(held)
    )  # fmt: skip
    preemptor = data.draw(preemptors())
    queue = Queue("q", "team", within_queue="LowerPriority")
    snapshot = snapshot_of(nodes, devices, (preemptor,), running, queue)
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    if result.admissions:
        return

    def fits_without(gone):
        kept = {d for workload in running if workload.id not in gone for pod in workload.pods for d in pod.device_ids}
        return brute_force_fits(preemptor, [device for device in devices if device.id not in kept], devices)

    assert_preempted_only_what_it_needs(running, preemptor, result, fits_without)
