"""Property tests over random small clusters with group claims (PodGroup resourceClaims, issue 26):
whatever the cycle decides, each group claim of an admitted gang is allocated exactly once (every request
once, of one of its ways, its constraints holding), no device is given twice, gangs stay whole and every
pod reaches every device of its gang's group claims; a running gang's group devices stay its own; and a
gang left waiting could not have been placed with its claims on what the cycle left free."""

from itertools import combinations_with_replacement

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler.cycle import decide
from broker.scheduler.selectors import ClassMatcher
from broker.scheduler.snapshot import (
    GROUP_POD_SET,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
    GroupClaim,
    Node,
    PendingWorkload,
    PodSet,
    Queue,
    RunningPod,
    RunningWorkload,
    SchedulerConfig,
    Snapshot,
)
from tests.scheduler.invariants import assert_preempted_only_what_it_needs, assert_valid_result, reaches

CLASSES = (
    DeviceClass("gpu", match={"kind": "gpu"}),
    DeviceClass("scratch", match={"kind": "scratch"}),
    DeviceClass("fast-scratch", match={"kind": "scratch", "speed": "fast"}),
)
CONFIG = SchedulerConfig(rerun_verification_limit=0, preemption_search_limit=64)
REACHES = (None, "rack", "zone", "cluster", "row")  # "row" is no level: node-local


@st.composite
def clusters(draw):
    nodes, devices = [], []
    for node_index in range(draw(st.integers(1, 5))):
        name = f"n{node_index}"
        nodes.append(Node(name, {"zone": f"z{node_index % 2}", "rack": f"r{node_index % 3}"}))
        for gpu in range(draw(st.integers(0, 4))):
            devices.append(Device(f"{name}/{gpu}", name, attributes={"kind": "gpu", "root": f"p{gpu % 2}"}))
        for volume in range(draw(st.integers(0, 2))):
            attributes = {"kind": "scratch", "speed": draw(st.sampled_from(("fast", "slow")))}
            reach = draw(st.sampled_from(REACHES))
            if reach is not None:
                attributes["reach"] = reach
            devices.append(Device(f"{name}/scratch-{volume}", name, attributes=attributes))
    return nodes, devices


@st.composite
def group_claims(draw):
    claims = []
    for position in range(draw(st.integers(1, 2))):
        # Now and then every volume its region reaches (allocationMode All), else one.
        mode = draw(st.sampled_from(("ExactCount", "ExactCount", "All")))
        volume = DeviceSubRequest("data", draw(st.sampled_from(("scratch", "fast-scratch"))), allocation_mode=mode)
        requests = [DeviceRequest("data", volume)]
        constraints = ()
        if draw(st.integers(0, 2)) == 0:
            requests.append(DeviceRequest("gpu", DeviceSubRequest("gpu", "gpu", draw(st.integers(1, 2)))))
            if draw(st.booleans()):
                constraints = (DeviceConstraint("root", ("gpu",)),)
            elif draw(st.booleans()):  # GPUs under distinct roots
                constraints = (DeviceConstraint(None, ("gpu",), distinct_attribute="root"),)
        if draw(st.integers(0, 3)) == 0:
            ways = (DeviceSubRequest("fast", "fast-scratch"), DeviceSubRequest("any", "scratch", 2))
            requests.append(DeviceRequest("extra", first_available=ways))
        claims.append(GroupClaim(f"claim{position}", tuple(requests), constraints))
    return tuple(claims)


@st.composite
def snapshots(draw):
    nodes, devices = draw(clusters())
    gpus = [device for device in devices if device.attributes["kind"] == "gpu"]
    volumes = [device for device in devices if device.attributes["kind"] == "scratch"]
    running = []
    if gpus and volumes and draw(st.booleans()):
        # A running gang holding a volume through its group claim, and a GPU beside it.
        running.append(
            RunningWorkload(
                "holder",
                "q",
                (
                    RunningPod("main", 0, gpus[0].node, (gpus[0].id,)),
                    RunningPod(GROUP_POD_SET + "data", 0, volumes[0].node, (volumes[0].id,)),
                ),
                "gpu",
            )
        )
    pending = []
    for index in range(draw(st.integers(1, 4))):
        pods = draw(st.integers(1, 3))
        pending.append(
            PendingWorkload(
                f"w{index}",
                "q",
                (PodSet("main", pods, None if draw(st.booleans()) else 1, draw(st.integers(1, 2)), ("gpu",)),),
                topology_required=draw(st.sampled_from((None, None, "rack", "zone"))),
                submitted=float(index),
                group_claims=draw(group_claims()) if draw(st.integers(0, 3)) else (),
            )
        )
    return Snapshot(
        levels=("zone", "rack"),
        nodes=tuple(nodes),
        devices=tuple(devices),
        device_classes=CLASSES,
        queues=(Queue("q", "team"),),
        running=tuple(running),
        pending=tuple(pending),
        config=CONFIG,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_it_allocates_each_group_claim_once_where_every_pod_reaches_it(snapshot):
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    devices = {device.id: device for device in snapshot.devices}
    held_by_running = {
        device_id for workload in snapshot.running for pod in workload.pods for device_id in pod.device_ids
    }
    workloads = {workload.id: workload for workload in snapshot.pending}
    for admission in result.admissions:
        workload = workloads[admission.workload_id]
        wanted = {f"{claim.name}/{request.name}" for claim in workload.group_claims for request in claim.requests}
        served = ["/".join(label.split("/")[:2]) for label, _ in admission.group_requests]
        assert sorted(served) == sorted(wanted), admission
        pods_placed = {pod.pod_set: 0 for pod in admission.pods}
        for pod in admission.pods:
            pods_placed[pod.pod_set] += 1
        for pod_set in workload.pod_sets:
            assert pods_placed.get(pod_set.name, 0) >= pod_set.gang_size, f"{workload.id}: gang cut"
        for _, device_ids in admission.group_requests:
            for device_id in device_ids:
                assert device_id not in held_by_running, f"{device_id} is held by running work"
                for pod in admission.pods:
                    assert reaches(snapshot, devices[device_id], pod.node), f"{pod.node} cannot reach {device_id}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_it_keeps_a_waiting_group_gang_waiting_only_when_it_cannot_fit_alone(snapshot):
    """Each waiting gang with group claims, given the cluster alone (no other pending work), is
    admitted exactly when some region holds its claims and its gang: if the lone cycle admits it, it is
    valid; if not, no node or domain offers the claims' devices with the gang beside them."""
    for workload in snapshot.pending:
        if not workload.group_claims:
            continue
        alone = Snapshot(**{**snapshot.__dict__, "pending": (workload,)})
        result = decide(alone)
        assert_valid_result(alone, result)
        if result.admissions:
            continue
        assert not _brute_force_fits(alone, workload), f"{workload.id} waits but fits: {result.pending[0].message}"


def _brute_force_fits(snapshot, workload) -> bool:
    """A single-pod-set gang with group claims of one request each, checked the slow way: some node set
    (within one domain if required) takes the gang's pods on free GPUs, and each claim gets a free
    device of its class reachable from all of them, none taken twice. Only judged for claims of plain
    single requests; others are skipped (returns False)."""
    if any(len(claim.requests) != 1 or claim.constraints or claim.requests[0].exactly is None
           or claim.requests[0].exactly.takes_all for claim in workload.group_claims):  # fmt: skip
        return False
    matcher = ClassMatcher(snapshot.device_classes)
    held = {device_id for running in snapshot.running for pod in running.pods for device_id in pod.device_ids}
    free = [device for device in snapshot.devices if device.id not in held]
    nodes = {node.name: node for node in snapshot.nodes}
    pod_set = workload.pod_sets[0]
    per_pod, pods = pod_set.devices_per_pod, pod_set.gang_size
    gpus_on = {}
    for device in free:
        if "gpu" in matcher.classes_of(device):
            gpus_on.setdefault(device.node, []).append(device)
    level = workload.topology_required
    # Every multiset of nodes for the pods: a small cluster keeps this small.
    names = sorted(gpus_on)
    for chosen in _multisets(names, pods):
        if any(chosen.count(name) * per_pod > len(gpus_on[name]) for name in set(chosen)):
            continue
        # A domain is its path from the top level down (rack r0 of zone z0 is not rack r0 of zone z1).
        if level and len({_path(nodes[name], snapshot.levels, level) for name in chosen}) != 1:
            continue
        used = {device.id for name in set(chosen) for device in gpus_on[name][: chosen.count(name) * per_pod]}
        taken = set(used)
        ok = True
        for claim in workload.group_claims:
            way = claim.requests[0].exactly
            options = [
                device
                for device in free
                if device.id not in taken
                and way.device_class in matcher.classes_of(device)
                and all(reaches(snapshot, device, name) for name in chosen)
            ]
            if len(options) < way.count:
                ok = False
                break
            taken.update(device.id for device in options[: way.count])
        if ok:
            return True
    return False


def _path(node, levels, level) -> tuple:
    return tuple(node.domains[name] for name in levels[: levels.index(level) + 1])


def _multisets(names, size):
    return (list(chosen) for chosen in combinations_with_replacement(names, size))


@st.composite
def plain_group_claims(draw):
    """One or two claims of one volume each, as the brute force judges them."""
    classes = draw(st.lists(st.sampled_from(("scratch", "fast-scratch")), min_size=1, max_size=2))
    return tuple(
        GroupClaim(f"claim{position}", (DeviceRequest("data", DeviceSubRequest("data", name)),))
        for position, name in enumerate(classes)
    )


def _simple(workload) -> bool:
    """What _brute_force_fits judges: group claims of one plain request each."""
    return all(
        len(claim.requests) == 1
        and not claim.constraints
        and claim.requests[0].exactly is not None
        and not claim.requests[0].exactly.takes_all
        for claim in workload.group_claims
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.data())
def test_it_preempts_for_a_group_gang_only_lower_priority_work_and_only_what_it_needs(cluster, data):
    """A gang with group claims that does not fit may preempt lower-priority preemptible work of its queue:
    its victims make room the brute force finds, none could be spared, and it preempts nobody when even
    every eligible victim would not make room."""
    nodes, devices = cluster
    ids = [device.id for device in devices]
    held = data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=len(ids) * 2 // 3)) if ids else []
    node_of = {device.id: device.node for device in devices}
    running = tuple(
        RunningWorkload(
            f"r{index}", "q", (RunningPod("main", 0, node_of[device_id], (device_id,)),), "gpu",
            priority=data.draw(st.integers(0, 3)), preemptible=data.draw(st.integers(0, 3)) > 0, started=index,
        )
        for index, device_id in enumerate(held)
    )  # fmt: skip
    pods = data.draw(st.integers(1, 2))
    gang = PendingWorkload(
        "gang", "q", (PodSet("main", pods, pods, data.draw(st.integers(1, 2)), ("gpu",)),),
        priority=data.draw(st.integers(1, 4)), submitted=100.0,
        topology_required=data.draw(st.sampled_from((None, "rack"))), group_claims=data.draw(plain_group_claims()),
    )  # fmt: skip
    snapshot = Snapshot(
        levels=("zone", "rack"), nodes=tuple(nodes), devices=tuple(devices), device_classes=CLASSES,
        queues=(Queue("q", "team", within_queue="LowerPriority"),), running=running, pending=(gang,), config=CONFIG,
    )  # fmt: skip
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    if result.admissions:
        return
    if not _simple(gang):
        assert_preempted_only_what_it_needs(running, gang, result)
        return

    def fits_without(gone):
        left = tuple(workload for workload in running if workload.id not in gone)
        return _brute_force_fits(Snapshot(**{**snapshot.__dict__, "running": left}), gang)

    assert_preempted_only_what_it_needs(running, gang, result, fits_without)
