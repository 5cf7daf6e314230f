"""Checks every cycle result must pass, shared by the scenario and property tests."""

from collections import Counter

from broker.scheduler.capacity import natural_key
from broker.scheduler.selectors import ClassMatcher, SelectorCache
from broker.scheduler.snapshot import NO_SCHEDULE_EFFECTS, REACH_ATTRIBUTE, REACH_CLUSTER


def assert_valid_result(snapshot, result):
    pending_ids = [workload.id for workload in snapshot.pending]
    decided = [admission.workload_id for admission in result.admissions] + [
        decision.workload_id for decision in result.pending
    ]
    assert Counter(decided) == Counter(pending_ids), "every pending workload decided exactly once"
    devices = {device.id: device for device in snapshot.devices}
    nodes = {node.name: node for node in snapshot.nodes}
    # Devices held alone, and capacity taken of shared ones (broker.scheduler.sharing).
    held = Counter(
        device_id for workload in snapshot.running for pod in workload.pods if not pod.consumed
        for device_id in pod.device_ids
    )  # fmt: skip
    taken: dict[str, Counter] = {}
    for workload in snapshot.running:
        for pod in workload.pods:
            for device_id in pod.device_ids if pod.consumed else ():
                taken.setdefault(device_id, Counter()).update(dict(pod.consumed))
    workloads = {workload.id: workload for workload in snapshot.pending}
    classes = {resource_class.name: resource_class for resource_class in snapshot.resource_classes}
    for admission in result.admissions:
        workload = workloads[admission.workload_id]
        amounts = shared_amounts(workload, classes)
        for pod in admission.pods:
            for device_id in pod.device_ids:
                if amounts:
                    assert devices[device_id].allow_multiple_allocations, f"{device_id} is not shared"
                    taken.setdefault(device_id, Counter()).update(amounts)
                else:
                    held[device_id] += 1
                device = devices[device_id]
                assert device.node == pod.node
                assert device.healthy, f"{device_id} is unhealthy"
                assert nodes[device.node].schedulable, f"{device.node} is cordoned"
                tolerations = {t for pod_set in workload.pod_sets for t in pod_set.tolerations}
                for taint in device.taints:
                    if taint.effect in NO_SCHEDULE_EFFECTS:
                        assert any(t.key == taint.key for t in tolerations), f"{device_id} is tainted"
        for _, device_ids in admission.group_requests:
            for device_id in device_ids:
                held[device_id] += 1
                assert devices[device_id].healthy, f"{device_id} is unhealthy"
        assert_gang_complete(workload, admission)
        assert_claims_hold(snapshot, workload, admission)
        assert_group_claims_hold(snapshot, workload, admission)
    doubled = [device_id for device_id, count in held.items() if count > 1]
    assert not doubled, f"devices allocated twice: {sorted(doubled, key=natural_key)}"
    for device_id, amounts in taken.items():
        assert not held[device_id], f"{device_id} is shared and held alone"
        capacity = devices[device_id].capacity
        over = {name: amount for name, amount in amounts.items() if amount > capacity.get(name, 0)}
        assert not over, f"{device_id}: {dict(amounts)} taken of {capacity}"
    assert_counters_hold(snapshot, held)
    assert_gangs_survive_shrinking(snapshot, result)


def shared_amounts(workload, classes) -> dict:
    """What each pod of a time-sliced workload takes of each device ({} when it holds them alone)."""
    resource_class = classes.get(workload.resource_class)
    if resource_class is None or resource_class.sharing != "TimeSliced":
        return {}
    return dict(next((pod_set.capacity for pod_set in workload.pod_sets if pod_set.capacity), ()))


def assert_gangs_survive_shrinking(snapshot, result):
    """A victim loses single pods only in Pod disruption mode, and keeps at least its gang minimum."""
    running = {workload.id: workload for workload in snapshot.running}
    for preemption in result.preemptions:
        if not preemption.pods:
            continue
        victim = running[preemption.victim_id]
        assert victim.disruption == "Pod", f"{victim.id} is evicted whole or not at all ({victim.disruption})"
        leaving = set(preemption.pods)
        assert len(leaving) == len(preemption.pods), f"{victim.id}: a pod named twice"
        pods = {(pod.pod_set, pod.index) for pod in victim.pods}
        assert leaving < pods, f"{victim.id}: shrinking must leave pods running, and only its own"
        minimum = dict(victim.min_counts)
        staying = Counter(pod_set for pod_set, index in pods - leaving)
        for pod_set, _ in leaving:
            assert pod_set in minimum, f"{victim.id}/{pod_set} has no gang minimum below its size"
            assert staying[pod_set] >= minimum[pod_set], f"{victim.id}/{pod_set} below its gang minimum"


def assert_gang_complete(workload, admission):
    per_set = Counter(pod.pod_set for pod in admission.pods)
    for pod_set in workload.pod_sets:
        placed = per_set.get(pod_set.name, 0)
        assert pod_set.gang_size <= placed <= pod_set.count, f"{workload.id}/{pod_set.name}: {placed} pods"
        for pod in admission.pods:
            if pod.pod_set == pod_set.name and not pod_set.requests:
                assert len(pod.device_ids) == pod_set.devices_per_pod


def assert_claims_hold(snapshot, workload, admission):
    """A pod of a several-request claim got, for every request, the count of one of its ways, all of
    the way's class and selectors, no device twice, and every matchAttribute constraint holds."""
    pod_sets = {pod_set.name: pod_set for pod_set in workload.pod_sets}
    if not any(pod_set.requests for pod_set in workload.pod_sets):
        assert not any(pod.requests for pod in admission.pods), f"{workload.id}: requests without a claim"
        return
    devices = {device.id: device for device in snapshot.devices}
    matcher = ClassMatcher(snapshot.device_classes)
    selectors = SelectorCache()
    for pod in admission.pods:
        pod_set = pod_sets[pod.pod_set]
        given = dict(pod.requests)
        assert len(given) == len(pod.requests) == len(pod_set.requests), f"{workload.id}: {pod.requests}"
        served = [device_id for _, device_ids in pod.requests for device_id in device_ids]
        assert sorted(served) == sorted(pod.device_ids), f"{workload.id}: devices and requests disagree"
        assert len(set(served)) == len(served), f"{workload.id}: a device given to two requests"
        by_request = {}
        for request in pod_set.requests:
            labels = [label for label in given if label.split("/", 1)[0] == request.name]
            assert len(labels) == 1, f"{workload.id}: request {request.name} served {len(labels)} times"
            label = labels[0]
            way = request.exactly
            if way is None:
                way = next(way for way in request.first_available if label == f"{request.name}/{way.name}")
            ids = given[label]
            if way.takes_all:  # every device of the way's class and selectors on the pod's node, in any state
                every = {
                    device.id
                    for device in snapshot.devices
                    if device.node == pod.node
                    and way.device_class in matcher.classes_of(device)
                    and (not way.selectors or selectors.matches(way.selectors, device.attributes))
                }
                assert every and set(ids) == every, f"{workload.id}: request {label} got {ids} of all {sorted(every)}"
            else:
                assert len(ids) == way.count, f"{workload.id}: request {label} got {len(ids)} of {way.count}"
            for device_id in ids:
                device = devices[device_id]
                assert way.device_class in matcher.classes_of(device), f"{device_id} is no {way.device_class}"
                assert not way.selectors or selectors.matches(way.selectors, device.attributes), device_id
            by_request[request.name] = ids
        assert_constraints_hold(workload, pod_set.constraints, by_request, devices)


def assert_constraints_hold(workload, constraints, by_request, devices):
    """Every matchAttribute constraint: one value over the devices of the requests it names; every
    distinctAttribute one: a value of its own on each of them. Either way every device carries it."""
    for constraint in constraints:
        attribute = constraint.attribute
        names = constraint.requests or tuple(by_request)
        ids = [device_id for name in names for device_id in by_request[name.split("/", 1)[0]]]
        assert all(attribute in devices[device_id].attributes for device_id in ids), f"{workload.id}: {attribute}"
        values = [str(devices[device_id].attributes[attribute]) for device_id in ids]
        if constraint.match_attribute:
            assert len(set(values)) == 1, f"{workload.id}: {attribute} differs across {ids}"
        else:
            assert len(set(values)) == len(values), f"{workload.id}: {attribute} repeats across {ids}: {values}"


def reaches(snapshot, device, node_name) -> bool:
    """Whether the pods of node `node_name` can use `device` (broker.scheduler.group_claims)."""
    level = device.attributes.get(REACH_ATTRIBUTE)
    if level == REACH_CLUSTER:
        return True
    if level not in snapshot.levels:
        return device.node == node_name
    nodes = {node.name: node for node in snapshot.nodes}
    path = snapshot.levels[: snapshot.levels.index(level) + 1]
    return all(nodes[device.node].domains.get(lv) == nodes[node_name].domains.get(lv) for lv in path)


def reach_path(snapshot, device) -> tuple:
    """The domain path (coarse to fine, the node last) from every node of which `device` is reachable:
    () for the whole cluster."""
    level = device.attributes.get(REACH_ATTRIBUTE)
    if level == REACH_CLUSTER:
        return ()
    node = next(node for node in snapshot.nodes if node.name == device.node)
    levels = list(snapshot.levels)
    if level in levels:
        return tuple(node.domains.get(name) for name in levels[: levels.index(level) + 1])
    return (*(node.domains.get(name) for name in levels), node.name)


def assert_group_claims_hold(snapshot, workload, admission):
    """Each group claim is allocated exactly once for the gang: every request of it served once with
    the count of one of its ways, of its class, each constraint holding; every pod reaches every device."""
    labels = [label for label, _ in admission.group_requests]
    assert len(set(labels)) == len(labels), f"{workload.id}: a group request allocated twice: {labels}"
    if not workload.group_claims:
        assert not labels, f"{workload.id}: group requests without group claims"
        return
    devices = {device.id: device for device in snapshot.devices}
    matcher = ClassMatcher(snapshot.device_classes)
    given = dict(admission.group_requests)
    pod_devices = {device_id for pod in admission.pods for device_id in pod.device_ids}
    for claim in workload.group_claims:
        by_request = {}
        for request in claim.requests:
            mine = [label for label in given if label.split("/")[:2] == [claim.name, request.name]]
            assert len(mine) == 1, f"{workload.id}: {claim.name}/{request.name} allocated {len(mine)} times"
            way = request.exactly or next(
                way for way in request.first_available if mine[0] == f"{claim.name}/{request.name}/{way.name}"
            )
            ids = given[mine[0]]
            if way.takes_all:
                # At least one; and whatever their state, every device of the kind whose reach covers the
                # finest reach among them (the gang's region is at least that fine): the whole cluster's,
                # its zone's, ... A device of the kind with a coarser reach left out was not "all".
                assert ids, f"{workload.id}: {mine[0]} got nothing"
                finest = max((reach_path(snapshot, devices[device_id]) for device_id in ids), key=len)
                covering = {
                    device.id
                    for device in snapshot.devices
                    if way.device_class in matcher.classes_of(device)
                    and finest[: len(reach_path(snapshot, device))] == reach_path(snapshot, device)
                }
                assert covering <= set(ids), f"{workload.id}: {mine[0]} got {ids}, not all of {sorted(covering)}"
            else:
                assert len(ids) == way.count, f"{workload.id}: {mine[0]} got {ids}"
            for device_id in ids:
                assert way.device_class in matcher.classes_of(devices[device_id]), (
                    f"{device_id} is no {way.device_class}"
                )
                assert device_id not in pod_devices, f"{workload.id}: {device_id} both a pod's and the group's"
                for pod in admission.pods:
                    assert reaches(snapshot, devices[device_id], pod.node), f"{pod.node} cannot reach {device_id}"
            by_request[request.name] = ids
        assert_constraints_hold(workload, claim.constraints, by_request, devices)
    served = {"/".join(label.split("/")[:2]) for label in given}
    asked = {f"{claim.name}/{request.name}" for claim in workload.group_claims for request in claim.requests}
    assert served == asked, f"{workload.id}: group requests {sorted(served)} for {sorted(asked)}"


def assert_counters_hold(snapshot, held):
    """No shared counter (DRA counter set) is consumed beyond its value by the devices held once the
    result applies: a whole device never together with its partitions."""
    value = {
        (counter_set.node, counter_set.name, counter): amount
        for counter_set in snapshot.counter_sets
        for counter, amount in counter_set.counters.items()
    }
    used = Counter()
    devices = {device.id: device for device in snapshot.devices}
    for device_id in held:
        device = devices.get(device_id)
        if device is None:
            continue
        for set_name, counters in device.consumes_counters.items():
            for counter, amount in counters.items():
                used[(device.node, set_name, counter)] += amount
    over = {key: amount for key, amount in used.items() if amount > value.get(key, 0)}
    assert not over, f"counters exceeded: {over}"


def assert_preempted_only_what_it_needs(running, preemptor, result, fits_without=None):
    """For one pending `preemptor` under a LowerPriority queue: every victim is preemptible and below its
    priority; and, with `fits_without(gone ids)` an oracle of whether it fits once those leave, its victims
    make room, none of them could be spared, and it preempts nobody when even every eligible victim would
    not make room. Hypothesis events say which case an example was."""
    from hypothesis import event

    holders = {workload.id: workload for workload in running}
    victims = {preemption.victim_id for preemption in result.preemptions}
    for victim_id in victims:
        victim = holders[victim_id]
        assert victim.preemptible and victim.priority < preemptor.priority, f"{victim_id} may not be preempted"
    if fits_without is None:
        return
    if victims:
        event("preempted")
        assert fits_without(victims), "its victims do not make room"
        for victim_id in victims:
            assert not fits_without(victims - {victim_id}), f"{victim_id} was preempted but not needed"
    else:
        event("pending, no victims")
        eligible = {w.id for w in running if w.preemptible and w.priority < preemptor.priority}
        assert not fits_without(eligible), "it could have made room"
