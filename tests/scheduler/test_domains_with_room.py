"""Domains with room for a gang come tightest first (fewest free devices, then by key), as a sort of the
view's free counts by domain gives them, whatever the view excludes or adds."""

import random

import pytest

from broker.scheduler.capacity import PLAIN, RANK_PLAIN, CapacityState, View
from broker.scheduler.cycle import Cycle
from broker.scheduler.placement import domains_with_room
from broker.scheduler.synthetic import synthetic_snapshot


def busy_state(seed: int) -> CapacityState:
    snapshot = synthetic_snapshot(nodes=96, pending=0, seed=seed)
    cycle = Cycle(snapshot)
    return CapacityState(snapshot, cycle.matcher, cycle.class_names)


def by_sorting(view: View, level_index: int, needed: int, within: tuple) -> list[tuple]:
    counts = view.domain_counts(level_index)
    fitting = [(count, key) for key, count in counts.items() if count >= needed and key[: len(within)] == within]
    return [key for _, key in sorted(fitting)]


@pytest.mark.parametrize("seed", range(8))
def test_it_gives_the_domains_a_full_sort_gives(seed):
    chance = random.Random(seed)
    state = busy_state(seed)
    nodes = range(len(state.node_names))
    held = [(RANK_PLAIN, slot) for slot in state.slots if slot.holder is not None]
    for step in range(60):
        class_index = chance.randrange(len(state.class_names))
        excluded = frozenset(chance.sample(nodes, chance.choice((0, 0, 3, 12))))
        extra = chance.sample(held, chance.choice((0, 0, 10, 80)))
        view = View(state, class_index, extra, excluded)
        level_index = chance.randrange(len(state.levels))
        within = ()
        if level_index and chance.random() < 0.5:
            within = chance.choice(state.domain_keys[level_index - 1])
        needed = chance.choice((1, 2, 4, 8, 16, 24, 40, 64))
        assert domains_with_room(view, level_index, needed, within) == by_sorting(view, level_index, needed, within)
        free = [slot for slot in state.slots if slot.holder is None and slot.category == PLAIN]
        if free:  # the cluster fills as the cycle goes on
            taken = chance.choice(free)
            state.hold([taken], f"w{step}")
