"""Requests resolved from one shape are copies that answer for their own workload."""

from dataclasses import replace

import pytest

from broker.scheduler.cycle import Cycle
from broker.scheduler.requests import resolve
from broker.scheduler.snapshot import Toleration
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


@pytest.mark.parametrize(
    "change",
    [
        {"name": "other"},
        {"count": 2},
        {"min_count": 1},
        {"devices_per_pod": 2},
        {"device_classes": ("a100",)},
        {"match_attribute": "island"},
        {"tolerations": (Toleration("maintenance", "true", "NoSchedule"),)},
    ],
    ids=lambda change: next(iter(change)),
)
def test_it_shares_a_shape_only_between_equal_pod_sets(change):
    snapshot = synthetic_snapshot(nodes=8, pending=1, seed=2)
    first = snapshot.pending[0]
    pod_set = replace(first.pod_sets[0], count=4, devices_per_pod=1)
    same = replace(first, id="same", pod_sets=(replace(pod_set),))
    other = replace(first, id="other", pod_sets=(replace(pod_set, **change),))
    assert other.pod_sets != same.pod_sets
    lookups = Cycle(snapshot).lookups
    memo = {}

    shape = resolve(replace(first, pod_sets=(pod_set,)), snapshot, lookups, memo)
    assert resolve(same, snapshot, lookups, memo).demands is shape.demands
    resolved = resolve(other, snapshot, lookups, memo)

    assert len({id(shape) for shape in memo.values()}) == 2, "a pod set differing in any field is a shape of its own"
    assert isinstance(resolved, str) or resolved.demands is not shape.demands


def test_it_resolves_gangs_that_share_pod_set_records_as_one_shape():
    snapshot = synthetic_snapshot(nodes=8, pending=1, seed=2)
    first = snapshot.pending[0]
    shared = first.pod_sets  # the loader hands gangs of one shape the very same records
    gangs = [replace(first, id=f"gang-{index}", pod_sets=tuple(shared)) for index in range(5)]
    other_queue = next(queue.name for queue in snapshot.queues if queue.name != first.queue)
    elsewhere = replace(first, id="elsewhere", queue=other_queue, pod_sets=tuple(shared))
    lookups = Cycle(snapshot).lookups
    memo = {}

    resolved = [resolve(gang, snapshot, lookups, memo) for gang in gangs]
    other = resolve(elsewhere, snapshot, lookups, memo)

    assert len({id(request.demands) for request in resolved}) == 1
    assert [request.id for request in resolved] == [gang.id for gang in gangs]
    assert other.queue.name == other_queue and all(request.queue.name == first.queue for request in resolved)
