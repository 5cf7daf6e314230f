"""Free counts per domain are summed when first asked for and kept up to date from the node changes
logged since: whatever was held, released and asked in between, they are what summing the nodes'
free counts at that moment gives."""

import random

import pytest

from broker.scheduler.capacity import PLAIN, CapacityState
from broker.scheduler.cycle import Cycle
from broker.scheduler.synthetic import synthetic_snapshot


def fresh_state(seed: int) -> CapacityState:
    snapshot = synthetic_snapshot(nodes=64, pending=0, seed=seed)
    cycle = Cycle(snapshot)
    return CapacityState(snapshot, cycle.matcher, cycle.class_names)


def summed(state: CapacityState, class_index: int, level_index: int) -> dict:
    totals = dict.fromkeys(state.domain_nodes[level_index], 0)
    for key, count in zip(state.node_domains[level_index], state.node_free[class_index], strict=True):
        totals[key] += count
    return totals


@pytest.mark.parametrize("seed", range(12))
def test_it_gives_what_summing_the_nodes_gives_at_every_moment(seed):
    chance = random.Random(seed)
    state = fresh_state(seed)
    classes, levels = range(len(state.class_names)), range(len(state.levels))
    held: list = []
    for step in range(300):
        free = [slot for slot in state.slots if slot.holder is None and slot.category == PLAIN]
        if held and (not free or chance.random() < 0.3):
            chance.shuffle(held)
            count = chance.randrange(1, 9)
            state.release(held[:count])
            del held[:count]
        elif free:
            node = chance.choice(free).node
            on_node = [slot for slot in free if slot.node == node]
            taken = on_node[: chance.randrange(1, len(on_node) + 1)]
            state.hold(taken, f"w{step}")
            held.extend(taken)
        if chance.random() < 0.4:  # levels are asked at different times, some never
            class_index, level_index = chance.choice(classes), chance.choice(levels)
            expected = summed(state, class_index, level_index)
            assert state.domain_totals(class_index, level_index) == expected
            scope = chance.choice(list(expected))
            assert state.domain_total(class_index, scope) == expected[scope]
        if chance.random() < 0.4:  # and whether a domain has room, answered from the last maximum found
            class_index, level_index = chance.choice(classes), chance.choice(levels)
            most = max(summed(state, class_index, level_index).values())
            needed = chance.choice((1, most, most + 1, chance.randrange(1, 80)))
            assert state.has_room_for(class_index, level_index, needed) == (most >= needed)
            assert state.most_free_in_a_domain(class_index, level_index) >= most
    for class_index in classes:
        for level_index in levels:
            assert state.domain_totals(class_index, level_index) == summed(state, class_index, level_index)


def test_it_logs_nothing_until_a_class_is_asked_for():
    state = fresh_state(1)
    free = [slot for slot in state.slots if slot.holder is None and slot.category == PLAIN]
    state.hold(free[:1], "first")
    assert state._domain_log == [None] * len(state.class_names)
    class_index = free[1].classes[0]
    state.domain_totals(class_index, 0)
    state.hold(free[1:2], "second")
    own = state.class_alias[class_index]
    assert [log is not None for log in state._domain_log] == [index == own for index in range(len(state.class_names))]
    assert state.domain_totals(class_index, 0) == summed(state, own, 0)
