"""The bucketed plan of a simple request is the plan the general placement finds, nodes excluded or not."""

import random

from broker.scheduler.capacity import CapacityState, View
from broker.scheduler.cycle import Cycle
from broker.scheduler.placement import PodDemand, place_gang
from broker.scheduler.synthetic import synthetic_snapshot


def busy_cycle():
    snapshot = synthetic_snapshot(nodes=64, pending=0, seed=7)
    cycle = Cycle(snapshot)
    cycle.state = CapacityState(snapshot, cycle.matcher, cycle.class_names)
    return cycle


def test_it_plans_as_place_gang_with_nodes_excluded():
    cycle = busy_cycle()
    state = cycle.state
    chance = random.Random(3)
    nodes = range(len(state.node_names))
    busy_nodes = [node for node in nodes if 0 < state.node_free[state.class_index["h100"]][node] < 8]
    compared = 0
    for _ in range(300):
        class_index = chance.randrange(len(state.class_names))
        demand = PodDemand("main", count := chance.choice((1, 1, 2, 3, 6, 20)), count, chance.choice((1, 2, 3, 4, 8)))
        excluded = frozenset(chance.sample(busy_nodes, chance.randrange(1, 6)) + chance.sample(nodes, 3))
        expected = place_gang(View(state, class_index, excluded=excluded), (demand,), None, None)
        assert cycle._simple_plan(class_index, demand, excluded) == expected
        compared += expected is not None
    assert compared > 50, "most of the cases should have a plan to compare"


def test_it_plans_as_place_gang_with_nothing_excluded_while_the_cluster_fills():
    cycle = busy_cycle()
    state = cycle.state
    chance = random.Random(4)
    compared = 0
    for step in range(300):
        class_index = chance.randrange(len(state.class_names))
        count = chance.choice((1, 1, 1, 2, 3))
        demand = PodDemand("main", count, count, chance.choice((1, 1, 2, 3, 4, 8)))
        expected = place_gang(View(state, class_index), (demand,), None, None)
        plan = cycle._simple_plan(class_index, demand)
        assert plan == expected
        if plan is not None:
            compared += 1
            state.hold(list(plan.slots()), f"w{step}")
    assert compared > 40, "the cluster should take many plans before it is full"


def test_it_never_places_a_pod_on_an_excluded_node():
    cycle = busy_cycle()
    state = cycle.state
    class_index = state.class_index["h100"]
    demand = PodDemand("main", 1, 1, 1)
    first = cycle._simple_plan(class_index, demand)
    assert first is not None

    plan = cycle._simple_plan(class_index, demand, frozenset({first.pods[0].node}))

    assert plan is not None and plan.pods[0].node != first.pods[0].node


def test_it_fails_when_only_excluded_nodes_have_room():
    cycle = busy_cycle()
    state = cycle.state
    class_index = state.class_index["h100"]
    roomy = frozenset(node for node, count in enumerate(state.node_free[class_index]) if count >= 4)
    assert roomy

    assert cycle._simple_plan(class_index, PodDemand("main", 1, 1, 4), roomy) is None
    assert place_gang(View(state, class_index, excluded=roomy), (PodDemand("main", 1, 1, 4),), None, None) is None
