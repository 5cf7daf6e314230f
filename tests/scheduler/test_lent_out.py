"""What lent_out says of cohort borrowers, from running work grouped once per cycle, is what a scan of
all running work for every question says."""

from dataclasses import replace

import pytest

from broker.scheduler import preemption
from broker.scheduler.cycle import Cycle
from broker.scheduler.synthetic import synthetic_snapshot


def borrowing_cycle(seed: int) -> Cycle:
    snapshot = synthetic_snapshot(nodes=40, pending=400, seed=seed, busy=0.95)
    queues = tuple(
        replace(
            queue,
            quota={"h100": 12, "a100": 4} if queue.quota is not None else None,  # small: many borrow above it
            reclaim_within_cohort=("Any", "LowerPriority", "Never")[index % 3],
        )
        for index, queue in enumerate(snapshot.queues)
    )
    cycle = Cycle(replace(snapshot, queues=queues))
    cycle.run()
    return cycle


def scanned_borrowers(cycle, request, class_name) -> list[dict]:
    """The borrowers by scanning every running workload (the specification of the grouping)."""
    quota, queue = cycle.quota, request.queue
    roots = preemption._cohort_roots(cycle.snapshot)
    borrowers = []
    for other in sorted(roots):
        nominal = quota.nominal(other, class_name)
        if other == queue.name or roots.get(other) != roots.get(queue.name) or nominal is None:
            continue
        over = quota.usage(other, class_name) - nominal
        if over > 0:
            held = [w for w in cycle.snapshot.running if w.device_class == class_name and w.queue == other]
            held.sort(key=lambda w: (-w.priority, w.id))
            borrowers.append({"queue": other, "over": over, "workloads": [w.id for w in held]})
    return borrowers


@pytest.mark.parametrize("seed", [1, 2])
def test_it_names_the_borrowers_a_scan_of_all_running_work_names(seed):
    cycle = borrowing_cycle(seed)
    lent = 0
    for request in cycle.requests.values():
        for class_name in request.classes:
            found = preemption.lent_out(cycle, request, class_name)
            if found is not None:
                lent += 1
                assert found["borrowers"] == scanned_borrowers(cycle, request, class_name)
    assert lent > 100, "few requests see their quota lent out: nothing tested"


def test_it_gives_every_answer_its_own_list_of_workloads():
    cycle = borrowing_cycle(1)
    answers = [
        preemption.lent_out(cycle, request, class_name)
        for request in cycle.requests.values()
        for class_name in request.classes
    ]
    lists = [borrower["workloads"] for answer in answers if answer for borrower in answer["borrowers"]]
    assert len({id(workloads) for workloads in lists}) == len(lists)
