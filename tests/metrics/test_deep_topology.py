"""The reports that follow a node's domains up every topology level, at the deepest topology the
inventory accepts (inventory.models.MAX_TOPOLOGY_LEVELS): on SQLite one join more per level, and at most 64
tables in a join."""

from datetime import timedelta

from django.utils import timezone

from broker.inventory.models import MAX_TOPOLOGY_LEVELS, Device, Domain, Node, TopologyLevel
from broker.metrics import queries
from broker.workloads.states import State
from tests.cycle.helpers import running


def test_it_counts_spans_at_the_deepest_topology(cluster):
    parent = Domain.objects.get(level__name="rack", name="r1")
    for index in range(TopologyLevel.objects.count(), MAX_TOPOLOGY_LEVELS):
        level = TopologyLevel.objects.create(name=f"extra-{index}", order=100 + index)
        parent = Domain.objects.create(level=level, name=f"d{index}", parent=parent)
    node = Node.objects.create(name="deep", domain=parent)
    devices = [Device.objects.create(node=node, name=str(index)) for index in range(2)]
    now = timezone.now()
    hour_ago = now - timedelta(hours=1)
    running(
        cluster.queue_a, "deep-job", devices, cluster.h100,
        state=State.SUCCEEDED, admitted_at=hour_ago, started_at=hour_ago, finished_at=now,
    )  # fmt: skip

    spans = {(row["level"], row["span"]): (row["count"], row["sum_seconds"]) for row in queries.runtime_by_span()}

    deepest = f"extra-{MAX_TOPOLOGY_LEVELS - 1}"
    assert TopologyLevel.objects.count() == MAX_TOPOLOGY_LEVELS
    assert spans[(deepest, 1)] == (1, 3600)
    assert spans[("zone", 1)] == (1, 3600)
    assert spans[("node", 1)] == (1, 3600)
