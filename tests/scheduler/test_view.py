"""A View extended step by step answers as one built with all its extra devices at once."""

import copy

from broker.scheduler.capacity import RANK_PLAIN, CapacityState, View
from broker.scheduler.cycle import Cycle
from broker.scheduler.scenario import load_scenario
from broker.scheduler.synthetic import synthetic_snapshot


def busy_state():
    snapshot = synthetic_snapshot(nodes=64, pending=0, seed=5)
    cycle = Cycle(snapshot)
    return CapacityState(snapshot, cycle.matcher, cycle.class_names)


def held(state, count):
    return [(RANK_PLAIN, slot) for slot in state.slots if slot.holder is not None][:count]


def answers(view, state):
    counts = [dict(view.domain_counts(level)) for level in range(len(state.levels))]
    for by_key in counts:  # one domain at a time, as by key
        assert {key: view.domain_count(key) for key in by_key} == by_key
    return (view.total(), [view.node_count(node) for node in range(len(state.node_names))], counts)


def test_it_answers_as_a_view_built_at_once_whatever_was_asked_in_between():
    state = busy_state()
    class_index = state.class_index["h100"]
    extra = held(state, 90)
    before = copy.deepcopy(state.domain_free)
    grown = View(state, class_index)
    answers(grown, state)  # caches the state's own counts while the view is still plain

    for start in range(0, len(extra), 30):
        grown.extend(extra[start : start + 30])
        answers(grown, state)

    assert answers(grown, state) == answers(View(state, class_index, extra), state)
    assert state.domain_free == before, "extending a view must not change the state's counts"


def test_it_stays_plain_when_nothing_it_can_use_is_added():
    state = busy_state()
    other_class = next(slot for slot in state.slots if state.class_index["h100"] not in slot.classes)
    view = View(state, state.class_index["h100"])

    view.extend([(RANK_PLAIN, other_class)])

    assert view.plain
    assert view.extra_count == 0


TAINTED = """
device_classes: {h100: {match: {model: H100}}}
nodes:
  - {name: n1, devices: 4, attributes: {model: H100},
     taints: [{key: maintenance, value: "true", effect: NoSchedule}]}
queues: [{name: research}]
pending:
  - {name: tolerant, queue: research, device_class: h100, devices_per_pod: 8, tolerations: [{key: maintenance}]}
"""


def test_it_reads_the_free_extras_again_once_a_hold_or_release_changed_them():
    cycle = Cycle(load_scenario(TAINTED))
    cycle.run()
    access = cycle.requests["tolerant"].default_access

    def free_extras():
        return sorted(slot.id for _, slot in cycle.extras_for(access))

    tainted = ["n1/0", "n1/1", "n1/2", "n1/3"]
    assert free_extras() == tainted
    taken = [cycle.state.slot_by_id["n1/1"]]
    cycle.state.hold(taken, "someone")
    assert free_extras() == ["n1/0", "n1/2", "n1/3"]
    cycle.state.release(taken)
    assert free_extras() == tainted
