"""Property tests over random small clusters of GPUs and NICs with claims of several requests (DRA
DeviceClaim): whatever the cycle decides, every request gets one of its ways, every matchAttribute
constraint holds for every pod, no device is given twice and gangs stay whole; and no workload is left
pending that a brute-force search could place on the devices the cycle left free."""

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
from tests.scheduler.invariants import assert_valid_result

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
            root = draw(st.sampled_from(("p0", "p1")))
            devices.append(Device(f"{name}/{gpu}", name, attributes={"kind": "gpu", "model": model, "root": root}))
        for nic in range(draw(st.integers(0, 3))):
            root = draw(st.sampled_from(("p0", "p1")))
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
        requests.append(DeviceRequest("net", DeviceSubRequest("net", draw(st.sampled_from(("nic", "efa"))))))
    if draw(st.integers(0, 3)) == 0:
        requests.append(DeviceRequest("spare", DeviceSubRequest("spare", "gpu")))
    constraints = ()
    if draw(st.booleans()):
        names = draw(st.sampled_from(((), ("acc", "net"), ("acc",))))
        names = tuple(name for name in names if name in {request.name for request in requests})
        constraints = (DeviceConstraint("root", names),)
    return tuple(requests), constraints


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


def snapshot_of(nodes, devices, pending, running=()):
    return Snapshot(
        levels=("rack",),
        nodes=tuple(nodes),
        devices=tuple(devices),
        device_classes=CLASSES,
        queues=(Queue("q", "team"),),
        running=tuple(running),
        pending=pending,
        config=CONFIG,
    )


def brute_force_fits(workload, devices) -> bool:
    """Whether the workload's gang fits `devices` (free ones), by trying every node, way and device
    subset for every pod."""
    matcher = ClassMatcher(CLASSES)
    classes = {device.id: matcher.classes_of(device) for device in devices}
    by_node: dict[str, list] = {}
    for device in devices:
        by_node.setdefault(device.node, []).append(device)
    pods = [pod_set for pod_set in workload.pod_sets for _ in range(pod_set.gang_size)]

    def pick(pod_set, ways, pools, at, used, chosen):
        if at == len(ways):
            yield dict(chosen)
            return
        for subset in combinations([d for d in pools[at] if d.id not in used], ways[at].count):
            chosen[pod_set.requests[at].name] = subset
            yield from pick(pod_set, ways, pools, at + 1, used | {d.id for d in subset}, chosen)
            del chosen[pod_set.requests[at].name]

    def pod_options(pod_set, free):
        for ways in product(*(request.alternatives for request in pod_set.requests)):
            pools = [[d for d in free if way.device_class in classes[d.id]] for way in ways]
            for chosen in pick(pod_set, ways, pools, 0, frozenset(), {}):
                if all(_holds(constraint, chosen) for constraint in pod_set.constraints):
                    yield {device.id for subset in chosen.values() for device in subset}

    def place(at, used):
        if at == len(pods):
            return True
        for node_devices in by_node.values():
            free = [device for device in node_devices if device.id not in used]
            for taken in pod_options(pods[at], free):
                if place(at + 1, used | taken):
                    return True
        return False

    return place(0, frozenset())


def _holds(constraint, chosen) -> bool:
    names = constraint.requests or tuple(chosen)
    picked = [device for name in names for device in chosen[name]]
    if not all(constraint.match_attribute in device.attributes for device in picked):
        return False
    return len({device.attributes[constraint.match_attribute] for device in picked}) <= 1


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
            assert not brute_force_fits(workload, free), f"{workload.id} fits but was left pending"
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
