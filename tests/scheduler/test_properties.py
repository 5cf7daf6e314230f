"""Property tests on small random clusters: the invariants of issue 3 and the explanation and preemption
contracts of issues 4 and 5, each checked against a naive recomputation."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler.cycle import decide
from broker.scheduler.explanation import apply_suggestion
from broker.scheduler.snapshot import REASON_CODES, PendingWorkload, PodSet, Queue, Reservation, SchedulerConfig
from tests.scheduler.invariants import assert_valid_result
from tests.scheduler.strategies import (
    QUIET,
    free_devices,
    inventories,
    naive_cheapest_victims,
    naive_fits,
    naive_primary,
    pending_work,
    running_work,
    snapshots,
)
from tests.scheduler.strategies import cost_key as naive_cost_key

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(snapshots())
def test_it_never_double_allocates_and_keeps_gangs_whole(snapshot):
    assert_valid_result(snapshot, decide(snapshot))


@FAST
@given(snapshots())
def test_it_respects_required_topology(snapshot):
    nodes = {node.name: node for node in snapshot.nodes}
    workloads = {workload.id: workload for workload in snapshot.pending}
    for admission in decide(snapshot).admissions:
        level = workloads[admission.workload_id].topology_required
        if level:
            assert len({nodes[pod.node].domains[level] for pod in admission.pods}) == 1


@FAST
@given(snapshots())
def test_it_passes_on_each_admission_as_made_and_final(snapshot):
    """What a caller writes while the core decides (decide's on_admission) is the result's admissions:
    each one once, as the result holds it, and the decisions are the same as without a listener."""
    passed = []

    result = decide(snapshot, on_admission=passed.append)

    assert sorted(passed, key=lambda admission: admission.workload_id) == list(result.admissions)
    assert all(any(a is b for b in result.admissions) for a in passed)
    assert result == decide(snapshot)


@FAST
@given(snapshots(config=SchedulerConfig()), st.randoms(use_true_random=False))
def test_it_decides_the_same_whatever_the_input_order(snapshot, chance):
    first = decide(snapshot)
    shuffled = replace(
        snapshot,
        nodes=tuple(chance.sample(snapshot.nodes, len(snapshot.nodes))),
        devices=tuple(chance.sample(snapshot.devices, len(snapshot.devices))),
        pending=tuple(chance.sample(snapshot.pending, len(snapshot.pending))),
        running=tuple(chance.sample(snapshot.running, len(snapshot.running))),
    )
    assert decide(snapshot) == first
    assert decide(shuffled) == first


@st.composite
def reserved_snapshots(draw):
    """Snapshots with one or two reservations over their broken and tainted hardware: two pooled
    reasons (DeviceUnhealthy, Reserved) to share out among the waiting workloads."""
    snapshot = draw(snapshots())
    # Busier than most draws, so that pools run out: the case that demotes a workload twice.
    running = draw(running_work(snapshot.devices, chance=0.85))
    reservations = tuple(
        Reservation(
            name=f"res{index}",
            team=draw(st.sampled_from(("team1", "team2"))),
            device_class=draw(st.sampled_from(("h100", "a100"))),
            count=draw(st.integers(1, 6)),
            domain=draw(st.sampled_from((None, {"rack": "r0"}, {"rack": "r1"}))),
        )
        for index in range(draw(st.integers(1, 2)))
    )
    return replace(snapshot, running=running, pending=draw(pending_work(count_range=(2, 6))), reservations=reservations)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reserved_snapshots())
def test_it_decides_and_explains_under_reservations(snapshot):
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    for decision in result.pending:
        assert decision.reason in REASON_CODES
        assert decision.reason not in decision.secondary, f"{decision.workload_id}: primary also secondary"
        assert len(set(decision.secondary)) == len(decision.secondary)


def single(snapshot, workload):
    return replace(snapshot, pending=(workload,))


@FAST
@given(snapshots(quotas=False))
def test_it_honours_the_fallback_order(snapshot):
    for workload in snapshot.pending:
        alone = single(snapshot, replace(workload, resource_class=None, approved=True))
        admitted = decide(alone).admissions
        if not admitted:
            continue
        classes = workload.pod_sets[0].device_classes
        chosen = classes.index(admitted[0].device_class)
        for earlier in classes[:chosen]:
            restricted = replace(
                alone.pending[0], pod_sets=(replace(alone.pending[0].pod_sets[0], device_classes=(earlier,)),)
            )
            assert not decide(single(alone, restricted)).admissions, f"{earlier} was available first"


@FAST
@given(snapshots(quotas=False))
def test_it_picks_the_tightest_domain_that_fits(snapshot):
    for workload in snapshot.pending:
        level = workload.topology_required
        alone = single(snapshot, replace(workload, resource_class=None, approved=True))
        admitted = decide(alone).admissions
        if not level or not admitted:
            continue
        pod_set = workload.pod_sets[0]
        device_class = admitted[0].device_class
        counts = free_devices(alone, tolerations=pod_set.tolerations)
        free_in = {}
        fitting_in = {}
        for node in alone.nodes:
            domain = node.domains[level]
            free_in[domain] = free_in.get(domain, 0) + counts.get((device_class, node.name), 0)
            pods = counts.get((device_class, node.name), 0) // pod_set.devices_per_pod
            fitting_in[domain] = fitting_in.get(domain, 0) + pods
        fitting = sorted((free_in[d], d) for d in free_in if fitting_in[d] >= pod_set.count)
        assert admitted[0].domain[level] == fitting[0][1]


@FAST
@given(snapshots())
def test_it_explains_with_the_primary_code_a_brute_force_finds(snapshot):
    result = decide(snapshot)
    workloads = {workload.id: workload for workload in snapshot.pending}
    pools = {}  # what healing would free is shared out in cluster order
    in_order = sorted(result.pending, key=lambda decision: decision.position_in_cluster or 0)
    for decision in in_order:
        expected = naive_primary(snapshot, result, workloads[decision.workload_id], pools)
        assert decision.reason == expected, (decision.workload_id, decision.message)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_it_only_suggests_what_does_start(snapshot):
    result = decide(snapshot)
    for decision in result.pending:
        for suggestion in decision.suggestions:
            changed = decide(apply_suggestion(snapshot, decision.workload_id, suggestion))
            assert decision.workload_id in {a.workload_id for a in changed.admissions}, suggestion


@st.composite
def preemption_cases(draw):
    nodes, devices = draw(inventories(max_racks=3, max_nodes_per_rack=2, max_devices=3))
    running = draw(running_work(devices, queues=("q1",), chance=0.9))
    # Work on a failed device is evicted for the failure, not preempted (tests/cycle/test_counter_sets.py,
    # tests/scheduler/test_counter_sets.py): here every held device works, so victims are chosen by cost.
    held = {device_id for workload in running for pod in workload.pods for device_id in pod.device_ids}
    devices = tuple(
        replace(device, healthy=True, taints=tuple(taint for taint in device.taints if taint.effect != "NoExecute"))
        if device.id in held
        else device
        for device in devices
    )
    workload = draw(pending_work(count_range=(1, 1), queues=("q1",)))[0]
    workload = replace(workload, resource_class=None, priority=draw(st.integers(1, 4)), approved=True)
    snapshot = single(
        replace(
            draw(snapshots(quotas=False)),
            nodes=nodes,
            devices=devices,
            running=running,
            queues=(Queue("q1", "team1", within_queue="LowerPriority"),),
            config=SchedulerConfig(enable_backfill_protection=False),
        ),
        workload,
    )
    return snapshot


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preemption_cases())
def test_it_chooses_victims_no_brute_force_beats(snapshot):
    workload = snapshot.pending[0]
    result = decide(snapshot)
    chosen_ids = {p.victim_id for p in result.preemptions}
    running = {r.id: r for r in snapshot.running}
    best = naive_cheapest_victims(snapshot, workload)
    if result.admissions:
        assert best == ()
        return
    if best is None:
        assert not chosen_ids
        return
    chosen = tuple(_as_chosen(running[p.victim_id], p.pods) for p in result.preemptions)
    assert naive_cost_key(chosen) == naive_cost_key(best)
    shrunk = {p.victim_id for p in result.preemptions if p.pods}
    assert shrunk == {victim.id for victim in best if victim.partial}, "shrinking first, whole only if it fails"
    for victim in chosen:
        assert victim.priority < workload.priority, "never preempt higher or equal priority here"


def _as_chosen(victim, pods):
    """A victim as the brute force names it: a shrunk one as the record of its leaving pods."""
    if not pods:
        return victim
    leaving = set(pods)
    return replace(victim, pods=tuple(pod for pod in victim.pods if (pod.pod_set, pod.index) in leaving), partial=True)


def test_it_preempts_whole_podgroups_only():
    from broker.scheduler.snapshot import Device, DeviceClass, Node, RunningPod, RunningWorkload, Snapshot

    nodes = (Node("a", {"rack": "r1"}), Node("b", {"rack": "r1"}))
    devices = tuple(Device(f"{node}/{i}", node, attributes={"model": "H100"}) for node in "ab" for i in range(2))
    victim = RunningWorkload(
        "gang",
        "q",
        (RunningPod("main", 0, "a", ("a/0", "a/1")), RunningPod("main", 1, "b", ("b/0", "b/1"))),
        "h100",
        priority=0,
        disruption="PodGroup",
    )
    snapshot = Snapshot(
        levels=("rack",),
        nodes=nodes,
        devices=devices,
        device_classes=(DeviceClass("h100", match={"model": "H100"}),),
        queues=(Queue("q", "t", within_queue="LowerPriority"),),
        running=(victim,),
        pending=(PendingWorkload("urgent", "q", (PodSet("main", 1, 1, 2, ("h100",)),), priority=5),),
    )
    result = decide(snapshot)
    assert [p.victim_id for p in result.preemptions] == ["gang"]
    assert result.pending[0].reason == "PreemptionPending"


def test_it_finds_naive_fit_helper_sane():
    # The brute-force helpers themselves: 2 nodes of 3 free fit two pods of 3 in one rack, not one of 4.
    from broker.scheduler.snapshot import Node, Snapshot

    snapshot = Snapshot(nodes=(Node("a", {"rack": "r"}), Node("b", {"rack": "r"})))
    counts = {("h100", "a"): 3, ("h100", "b"): 3}
    assert naive_fits(snapshot, counts, "h100", 2, 3, "rack")
    assert not naive_fits(snapshot, counts, "h100", 1, 4, "rack")
    assert QUIET.enable_backfill_protection is False


@FAST
@given(snapshots(quotas=False), st.data())
def test_it_keeps_devices_freed_for_a_nominated_preemptor_until_its_turn(snapshot, data):
    """Nominate a workload for the devices it would get alone: whatever else waits, and whatever the
    fair-share order, nobody ordered before it takes them, so it starts (issue 5, graceful eviction)."""
    from hypothesis import assume

    nominee = data.draw(st.sampled_from(snapshot.pending))
    alone = decide(replace(snapshot, pending=(nominee,)))
    assume(alone.admissions)
    devices = tuple(device for pod in alone.admissions[0].pods for device in pod.device_ids)
    crowded = replace(
        snapshot,
        pending=tuple(
            replace(workload, nominated_devices=devices) if workload.id == nominee.id else workload
            for workload in snapshot.pending
        ),
    )
    result = decide(crowded)
    assert_valid_result(crowded, result)
    assert nominee.id in {admission.workload_id for admission in result.admissions}
