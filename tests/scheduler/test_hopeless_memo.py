"""A request like one that got nothing earlier in the cycle is answered from memory: the same result as
deciding each on its own, whatever the preemption policies, reservations and evictions under way."""

import dataclasses

import pytest

from bench.saturated import saturated_snapshot
from broker.scheduler.cycle import Cycle, decide
from broker.scheduler.snapshot import Reservation, SchedulerConfig
from tests.scheduler.policies import every_preemption_policy


def crowded(seed):
    """A full cluster with more work than fits, every preemption policy, reservations, victims already
    being evicted (some for a waiting workload), and a per-queue preemption limit that is reached."""
    snapshot = saturated_snapshot(400, 2500, sizes=None, seed=seed)
    queues = every_preemption_policy(snapshot.queues)
    waiting = [workload.id for workload in snapshot.pending]
    running = list(snapshot.running)
    for index in range(0, len(running), 97):
        running[index] = dataclasses.replace(
            running[index], evicting=True, evicted_for=waiting[index % len(waiting)] if index % 2 else None
        )
    reservations = (
        Reservation("res-a", queues[1].team, "h100", 200, domain={"zone": "z1"}),
        Reservation("res-b", queues[4].team, "a100", 64),
    )
    return dataclasses.replace(
        snapshot,
        queues=queues,
        running=tuple(running),
        reservations=reservations,
        config=SchedulerConfig(preemptions_per_queue_per_cycle=40, preemption_search_limit=64),
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_it_decides_as_if_every_request_were_tried(seed, monkeypatch):
    snapshot = crowded(seed)
    remembered = decide(snapshot)

    monkeypatch.setattr(Cycle, "_hopeless_key", lambda self, request: None)
    tried = decide(snapshot)

    assert remembered == tried
    assert remembered.preemptions, "the scenario must exercise preemption"
    assert len(remembered.pending) > 300, "and leave many requests that get nothing"


def test_it_answers_most_of_a_long_hopeless_queue_from_memory(monkeypatch):
    snapshot = crowded(1)
    tried = []
    admit = Cycle._admit
    monkeypatch.setattr(Cycle, "_admit", lambda self, request: tried.append(request.id) or admit(self, request))

    decide(snapshot)

    # A third of the queues weigh submission times in preemption (every request its own key there).
    assert len(tried) < len(snapshot.pending) * 0.7
