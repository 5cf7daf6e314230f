"""Messages cite workloads by name, never by id (issue 29: "held for 5950" told nobody anything)."""

from dataclasses import replace
from pathlib import Path

from broker.scheduler.cycle import decide
from broker.scheduler.scenario import load_scenario

SCENARIOS = Path(__file__).parent.parent / "scenarios"


def with_ids_and_names(snapshot, team="ml"):
    """The scenario's workloads with database-like ids ("1001", ...) and "team/name" names."""
    ids = {}
    for number, workload in enumerate((*snapshot.pending, *snapshot.running), start=1001):
        ids[workload.id] = str(number)

    def renamed(workload):
        return replace(workload, id=ids[workload.id], name=f"{team}/{workload.id}")

    pending = tuple(renamed(workload) for workload in snapshot.pending)
    running = tuple(renamed(workload) for workload in snapshot.running)
    return replace(snapshot, pending=pending, running=running), ids


def messages(path):
    snapshot, ids = with_ids_and_names(load_scenario((SCENARIOS / path).read_text()))
    result = decide(snapshot)
    by_id = {decision.workload_id: decision.message for decision in result.pending}
    by_id |= {preemption.victim_id: preemption.message for preemption in result.preemptions}
    return {name: by_id.get(pk) for name, pk in ids.items()}, ids


def test_it_names_the_gang_a_rack_is_held_for():
    said, ids = messages("backfill_with_durations.yaml")
    assert "rack r1 is held for ml/big (priority 10, ahead in line)" in said["small-long"]
    assert ids["big"] not in said["small-long"]


def test_it_names_the_victims_a_gang_waits_for_and_the_preemptor_they_leave_for():
    said, ids = messages("preemption_one_rack.yaml")
    assert "waiting for 1 victim to leave: ml/leaving (being evicted)" in said["next"]
    assert "ml/x (WithinQueue, priority 1)" in said["big"]
    assert said["x"].startswith("preempted for ml/big (WithinQueue)")
    assert not any(ids[name] in said[name] for name in ("next", "big", "x"))
