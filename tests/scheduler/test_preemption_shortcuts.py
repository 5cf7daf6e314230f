"""Victim searches that settle early (one victim, found walking the victims cheapest first) choose what
the full search chooses."""

from dataclasses import replace

import pytest

from broker.scheduler import preemption
from broker.scheduler.capacity import PLAIN, RESERVED, Access, CapacityState
from broker.scheduler.cycle import Cycle, decide
from broker.scheduler.snapshot import PodSet, Reservation, Toleration
from broker.scheduler.synthetic import synthetic_snapshot
from tests.scheduler.policies import every_preemption_policy


def preempting_snapshot(seed: int, sizes: tuple, search_limit: int, one_device_pods: bool):
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=seed, busy=0.95, sizes=sizes)
    queues = every_preemption_policy(snapshot.queues)
    pending = snapshot.pending
    if one_device_pods:  # several small victims may then do what one larger one does
        pending = tuple(
            replace(
                workload,
                pod_sets=(PodSet("main", workload.pod_sets[0].count * workload.pod_sets[0].devices_per_pod, None, 1),),
            )
            if workload.topology_required is None
            else workload
            for workload in pending
        )
    config = replace(snapshot.config, preemptions_per_queue_per_cycle=6, preemption_search_limit=search_limit)
    return replace(snapshot, queues=queues, pending=pending, config=config)


@pytest.mark.parametrize(
    ("seed", "sizes", "search_limit", "one_device_pods"),
    [
        (11, (1, 2, 4, 8), 4096, False),  # singles with room enough that do not fit: skipped
        (3, (2, 4, 8, 16), 4096, False),
        (7, (2, 4, 8), 2, True),  # the budget runs out before a single is found: greedy decides
        (3, (2, 4, 8), 1, True),
    ],
)
def test_it_chooses_the_single_victims_the_full_search_chooses(monkeypatch, seed, sizes, search_limit, one_device_pods):
    snapshot = preempting_snapshot(seed, sizes, search_limit, one_device_pods)
    settled = []
    cheapest_single = preemption._cheapest_single

    def counted(*args):
        found = cheapest_single(*args)
        settled.append(found is not preemption._UNDECIDED and found is not None and bool(found.victims))
        return found

    monkeypatch.setattr(preemption, "_cheapest_single", counted)
    shortcut = decide(snapshot)
    assert any(settled), "no search settled early: nothing tested"
    assert not all(settled), "every search settled early: the full search was not compared"
    monkeypatch.setattr(preemption, "_cheapest_single", lambda *_: preemption._UNDECIDED)
    assert decide(snapshot) == shortcut
    assert shortcut.preemptions


def test_it_counts_the_evicting_devices_a_fresh_look_counts(monkeypatch):
    snapshot = preempting_snapshot(7, (1, 2, 4, 8), 4096, False)
    pending_ids = [workload.id for workload in snapshot.pending]
    running = tuple(
        replace(workload, evicting=True, evicted_for=pending_ids[index % len(pending_ids)] if index % 2 else None)
        if index % 9 == 0
        else workload
        for index, workload in enumerate(snapshot.running)
    )
    snapshot = replace(snapshot, running=running)
    remembered = preemption._evicting_slots
    answers = []

    def checked(cycle, access, request_id=None):
        slots = remembered(cycle, access, request_id)
        assert slots == preemption._evicting_slots_now(cycle, access, request_id)
        answers.append((request_id in preemption._index(cycle).nominees, bool(slots)))
        return slots

    monkeypatch.setattr(preemption, "_evicting_slots", checked)
    result = decide(snapshot)
    assert (True, True) in answers and (False, True) in answers, "nominees and others both counted"
    assert result.preemptions, "no victims were claimed while evicting devices were counted"


def test_it_ranks_what_a_victim_frees_as_access_rank_does():
    snapshot = synthetic_snapshot(nodes=40, pending=20, seed=4, busy=0.95)
    reservations = (Reservation("held", "vc03", "h100", 24), Reservation("pinned", "vc07", "a100", 8))
    snapshot = replace(snapshot, reservations=reservations)
    cycle = Cycle(snapshot)
    cycle.state = CapacityState(snapshot, cycle.matcher, cycle.class_names)
    accesses = [
        Access("vc03"),
        Access("vc07", preemptible=True),
        Access("vc01", tolerations=(Toleration("maintenance", "true", "NoSchedule"),)),
        Access("vc01", healed=True, unreserved=True),
    ]
    categories = set()
    for workload in snapshot.running:
        held = [
            cycle.state.slot_by_id[device_id]
            for pod in workload.pods
            for device_id in pod.device_ids
            if cycle.state.slot_by_id[device_id].holder == workload.id
        ]
        categories.update(slot.category for slot in held)
        for access in accesses:
            expected = [(access.rank(slot), slot) for slot in held if access.rank(slot) is not None]
            assert preemption._freed_slots(cycle, workload, access) == expected
    assert categories >= {PLAIN, RESERVED}, "plain and reserved devices both met"


def test_it_puts_eligible_victims_in_victim_order_with_ties():
    running = synthetic_snapshot(nodes=30, pending=0, seed=6).running
    tied = [replace(workload, started=float(index % 3)) for index, workload in enumerate(running)]
    own, others = tied[::2], {workload.id: (workload, "ReclaimWithinCohort") for workload in tied[1::2]}
    eligible = preemption._Eligible(own, {tied[0].id}, others)

    ordered = list(eligible.in_victim_order())

    assert ordered == sorted(eligible.workloads(), key=preemption._victim_order)
    assert tied[0] not in ordered, "chosen ones are skipped"
