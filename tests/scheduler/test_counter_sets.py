"""Partitionable devices (DRA counter sets): a whole device and its partitions consume the same shared
counters, and no decision of the core ever takes more of a counter than its set publishes."""

import dataclasses

from broker.scheduler.capacity import COUNTERS, CapacityState
from broker.scheduler.cycle import Cycle, decide
from broker.scheduler.scenario import load_scenario
from tests.scheduler.invariants import assert_valid_result
from tests.scheduler.test_state_reuse import built, fingerprint, for_cycle

CLUSTER = """
device_classes:
  any: {match: {model: A100}}
  whole: {match: {profile: whole}}
  half: {match: {profile: half}}
  quarter: {match: {profile: quarter}}
nodes:
  - name: n1
    devices: 2
    attributes: {model: A100}
    counters: {memory: 4}
    partitions:
      - {profile: half, count: 2, consumes: {memory: 2}}
      - {profile: quarter, count: 4, consumes: {memory: 1}}
queues:
  - {name: q, team: t, preemption: {within_queue: LowerPriority}}
"""


def scenario(extra: str):
    return load_scenario(CLUSTER + extra)


def placed(result):
    return {
        admission.workload_id: [device for pod in admission.pods for device in pod.device_ids]
        for admission in result.admissions
    }


def test_it_never_places_a_device_with_its_partitions_in_one_cycle():
    pending = "".join(f"  - {{name: w{i}, queue: q, device_class: any, priority: {9 - i}}}\n" for i in range(9))
    snapshot = scenario("pending:\n" + pending)
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    # Two whole devices hold every counter: nothing else starts.
    assert sorted(placed(result).values()) == [["n1/0"], ["n1/1"]]


def test_it_never_places_a_device_and_its_partition_in_one_pod():
    snapshot = scenario("pending:\n  - {name: w, queue: q, device_class: any, devices_per_pod: 3}\n")
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    # Whole n1/0, whole n1/1 and nothing left: three devices of this class never fit together.
    assert placed(result) == {}
    two = decide(scenario("pending:\n  - {name: w, queue: q, device_class: any, devices_per_pod: 2}\n"))
    assert placed(two) == {"w": ["n1/0", "n1/1"]}


def test_it_packs_partitions_of_several_profiles_onto_the_device_already_cut():
    snapshot = scenario(
        """
running:
  - {name: r, queue: q, device_class: quarter, pods: [{node: n1, devices: ["1:quarter#2"]}]}
pending:
  - {name: h, queue: q, device_class: half, priority: 3}
  - {name: q1, queue: q, device_class: quarter, priority: 2}
  - {name: w, queue: q, device_class: whole, priority: 1}
"""
    )
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    assert placed(result) == {"h": ["n1/1:half#0"], "q1": ["n1/1:quarter#0"], "w": ["n1/0"]}


def test_it_keeps_partitions_off_a_device_held_whole_and_says_so():
    snapshot = scenario(
        """
running:
  - {name: r, queue: q, device_class: whole, pods: [{node: n1, devices: 2}]}
pending:
  - {name: small, queue: q, device_class: quarter}
"""
    )
    result = decide(snapshot)
    assert placed(result) == {}
    assert result.pending[0].reason == "InsufficientCapacity"


def test_it_preempts_the_partition_user_to_start_the_whole_device():
    snapshot = scenario(
        """
running:
  - {name: low, queue: q, device_class: quarter, priority: 0, pods: [{node: n1, devices: ["0:quarter#0"]}]}
  - {name: big, queue: q, device_class: whole, priority: 5, pods: [{node: n1, devices: [1]}]}
pending:
  - {name: high, queue: q, device_class: whole, priority: 9}
"""
    )
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    assert [(p.victim_id, p.preemptor_id) for p in result.preemptions] == [("low", "high")]


def test_it_estimates_the_start_when_the_partition_user_ends():
    snapshot = scenario(
        """
now: 100
running:
  - {name: a, queue: q, device_class: quarter, pods: [{node: n1, devices: ["0:quarter#0"]}], expected_end: 700}
  - {name: b, queue: q, device_class: whole, pods: [{node: n1, devices: [1]}], expected_end: 5000}
pending:
  - {name: w, queue: q, device_class: whole, preemptible: false}
"""
    )
    result = decide(snapshot)
    assert placed(result) == {}
    assert result.pending[0].estimated_start == 700


def test_it_rebases_the_counters_onto_the_next_snapshot():
    first = scenario(
        """
running:
  - {name: r, queue: q, device_class: half, pods: [{node: n1, devices: ["0:half#1"]}]}
pending:
  - {name: w, queue: q, device_class: quarter}
"""
    )
    result = decide(first)
    assert placed(result) == {"w": ["n1/0:quarter#0"]}
    # The same inventory, the running partition gone and the admission running: the retired state is
    # rebased, and it must equal a new build, counters and all.
    running = dataclasses.replace(first.running[0], id="other", pods=())
    admitted = [
        dataclasses.replace(first.running[0], id="w", device_class="quarter", pods=(
            dataclasses.replace(first.running[0].pods[0], device_ids=("n1/0:quarter#0",)),))
    ]  # fmt: skip
    second = dataclasses.replace(first, running=(running, *admitted), pending=())
    state = for_cycle(second)
    assert fingerprint(state) == fingerprint(built(second))
    assert state.counter_left == built(second).counter_left == [3, 4]
    blocked = sorted(slot.id for slot in state.slots if slot.holder == COUNTERS)
    assert blocked == ["n1/0"]


def test_it_never_allocates_a_device_naming_a_counter_its_node_lacks():
    snapshot = dataclasses.replace(
        scenario("pending:\n  - {name: w, queue: q, device_class: whole}\n"),
        counter_sets=(),
    )
    # The devices still consume their sets, which no node publishes any more.
    result = decide(snapshot)
    assert placed(result) == {}


def test_it_keeps_the_whole_device_path_when_no_device_consumes_counters():
    snapshot = load_scenario(
        """
device_classes: {gpu: {}}
nodes: [{name: n1, devices: 4}]
queues: [{name: q}]
pending: [{name: w, queue: q, device_class: gpu, devices_per_pod: 2}]
"""
    )
    cycle = Cycle(snapshot)
    cycle.run()
    state = cycle.state
    assert not state.counted and not state.class_counted and isinstance(state, CapacityState)
