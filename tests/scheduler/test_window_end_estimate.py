"""Estimated starts count the end of an open reservation window (issue 27): from its end its devices are
anyone's. The simulation that reaches it changes the devices' owners, so the state it leaves behind must
still rebase to the state a new build gives."""

import dataclasses

from broker.scheduler.capacity import InventoryIndex
from broker.scheduler.cycle import Cycle, decide
from broker.scheduler.scenario import load_scenario
from tests.scheduler.test_hopeless_memo import crowded
from tests.scheduler.test_state_reuse import built, fingerprint, for_cycle

TWO_RACKS = """
topology: [rack]
device_classes:
  h100: {match: {model: H100}}
nodes:
  - {name: n1, rack: r1, devices: 8, attributes: {model: H100}}
  - {name: n2, rack: r2, devices: 8, attributes: {model: H100}}
queues:
  - {name: research, team: research}
  - {name: vision, team: vision}
reservations:
  - {name: vision-r2, queue: vision, device_class: h100, count: 8, domain: {rack: r2}, start: 0, end: %(end)s}
running:
  - {name: r1-busy, queue: research, pods: [{node: n1, devices: 8}], expected_end: 5000}
pending:
  - {name: research-job, queue: research, device_class: h100, pods: 1, devices_per_pod: 8, duration: 100}
  - {name: vision-job, queue: vision, device_class: h100, pods: 1, devices_per_pod: 8, duration: 100,
     submitted: 1}
"""


def estimates(end):
    result = decide(load_scenario(TWO_RACKS % {"end": end}))
    return {decision.workload_id: decision.estimated_start for decision in result.pending}


def test_it_starts_other_teams_work_on_the_reserved_devices_once_the_window_ends():
    # vision-job takes its reservation now; research-job waits for r2's end (vision-job's end or the window's,
    # whichever is later), never for r1 at 5000.
    assert estimates(1000) == {"research-job": 1000.0}
    assert estimates(50) == {"research-job": 100.0}
    assert estimates(100_000) == {"research-job": 5000.0}


def test_it_rebases_after_a_simulation_that_ended_windows(monkeypatch):
    snapshot = crowded(1)
    now = snapshot.now
    ending = tuple(
        dataclasses.replace(reservation, start=now - 10, end=now + 60 * (index + 1))
        for index, reservation in enumerate(snapshot.reservations)
    )
    # Far enough for the simulation to get past the releases due now, to the windows' ends.
    config = dataclasses.replace(snapshot.config, estimate_horizon_events=4000)
    snapshot = dataclasses.replace(snapshot, reservations=ending, config=config)
    ended = []
    unreserve = Cycle.unreserve
    monkeypatch.setattr(Cycle, "unreserve", lambda self, slots: ended.append(len(slots)) or unreserve(self, slots))

    decide(snapshot)
    spare = InventoryIndex._last._spare[0]
    rebased = for_cycle(snapshot)

    assert ended and all(ended), "the simulation must reach the windows' ends"
    assert rebased is spare
    assert fingerprint(rebased) == fingerprint(built(snapshot))
    rebased.retire()
