"""The nodes a request may not take (held for protected gangs ahead, or for reservation windows it would
overrun) are remembered by where its expected run ends among the planned starts and window openings, not
by its exact duration: the same answer as asking every protection and window, at and around each mark."""

import dataclasses

import pytest

from bench.saturated import saturated_snapshot
from broker.scheduler.cycle import Cycle, decide
from broker.scheduler.snapshot import Reservation


def crowded_with_windows(seed):
    """A full cluster with more work than fits (so gangs ahead are protected) and two reservation windows
    of different teams opening later."""
    snapshot = saturated_snapshot(400, 2500, sizes=None, seed=seed)
    teams = sorted({queue.team for queue in snapshot.queues})
    racks = sorted({node.domains["rack"] for node in snapshot.nodes})
    now = snapshot.now
    reservations = (
        Reservation("soon", teams[0], "h100", 16, domain={"rack": racks[0]}, start=now + 100, end=now + 5000),
        Reservation("later", teams[1], "h100", 24, domain={"rack": racks[1]}, start=now + 1000, end=now + 9000),
    )
    return dataclasses.replace(snapshot, reservations=reservations)


def with_duration(request, duration):
    return dataclasses.replace(request, workload=dataclasses.replace(request.workload, expected_duration=duration))


@pytest.mark.parametrize("seed", [1, 2])
def test_it_excludes_what_every_protection_and_window_would_for_each_duration(seed):
    snapshot = crowded_with_windows(seed)
    cycle = Cycle(snapshot)
    cycle.run()
    assert cycle.protections and len(cycle.windows) == 2, "the scene must hold nodes for gangs and windows"
    now = snapshot.now
    marks = [p.planned_start for p in cycle.protections if p.planned_start is not None]
    marks += [window.reservation.start for window in cycle.windows]
    durations = [None] + sorted({max(0.0, mark - now + step) for mark in marks for step in (-0.5, 0.0, 0.5)})
    protected = [cycle.requests[p.workload_id] for p in cycle.protections]
    others = [cycle.requests[key] for key in sorted(cycle.requests)[:40]]
    answers = set()
    for request in protected + others:
        for duration in durations:
            variant = with_duration(request, duration)
            remembered = cycle.excluded_for(variant)
            assert remembered == cycle._excluded_now(variant), (request.id, duration)
            answers.add(remembered)
    assert len(answers) >= 3, "durations on either side of a mark must be answered differently"


@pytest.mark.parametrize("seed", [1, 2])
def test_it_decides_as_if_every_duration_were_asked_on_its_own(seed, monkeypatch):
    snapshot = crowded_with_windows(seed)
    answers = []
    excluded_for = Cycle.excluded_for
    monkeypatch.setattr(
        Cycle, "excluded_for", lambda self, request: answers.append(excluded_for(self, request)) or answers[-1]
    )
    remembered = decide(snapshot)

    monkeypatch.setattr(
        Cycle,
        "excluded_for",
        lambda self, request: self._excluded_now(request) if self.protections or self.windows else frozenset(),
    )
    asked = decide(snapshot)

    assert remembered == asked
    assert len(set(answers)) >= 3, "the scene must hold different nodes for different requests"
