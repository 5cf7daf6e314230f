"""Requests resolved from one shape are copies that answer for their own workload."""

from dataclasses import replace

from broker.scheduler.cycle import Cycle
from broker.scheduler.requests import resolve
from broker.scheduler.synthetic import synthetic_snapshot


def test_it_gives_each_copy_its_own_id_even_after_the_shape_was_asked():
    snapshot = synthetic_snapshot(nodes=8, pending=1, seed=2)
    first = snapshot.pending[0]
    twins = [replace(first, id=f"twin-{index}") for index in range(3)]
    lookups = Cycle(snapshot).lookups
    memo = {}

    shape = resolve(first, snapshot, lookups, memo)
    assert shape.id == first.id  # asked before any copy is made from it
    copies = [resolve(twin, snapshot, lookups, memo) for twin in twins]

    assert [copy.id for copy in copies] == [twin.id for twin in twins]
    assert [copy.workload for copy in copies] == twins
    assert all(copy.demands is shape.demands for copy in copies), "the shape's parts are shared"
    assert resolve(first, snapshot, lookups, memo) is shape
