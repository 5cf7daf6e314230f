"""The snapshot names each workload as people know it, "team/name", for the core's messages (issue 29)."""

from django.utils import timezone

from broker.cycle.loader import load_snapshot
from broker.workloads.states import State
from tests.costs.helpers import hold, submit


def test_it_loads_pending_and_running_work_with_team_and_name(cluster):
    now = timezone.now()
    waiting = submit(cluster.queue_a, name="train-7", devices_per_pod=2, resource_class=cluster.training, at=now)
    waiting.transition(State.PENDING, at=now)
    running = submit(cluster.queue_b, name="serve-2", resource_class=cluster.inference, at=now)
    running.transition(State.PENDING, at=now)
    running.transition(State.ADMITTED, at=now)
    hold(running, list(cluster.nodes[0].devices.order_by("name")[:1]), cluster.h100, now)
    running.transition(State.RUNNING, at=now)

    snapshot, _ = load_snapshot(now)

    assert [(w.id, w.name) for w in snapshot.pending] == [(str(waiting.pk), "team-a/train-7")]
    assert [(w.id, w.name) for w in snapshot.running] == [(str(running.pk), "team-b/serve-2")]
