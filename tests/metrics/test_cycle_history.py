"""The figures read what a real cycle and the simulated executor write, not only hand-made rows."""

from datetime import timedelta

from django.utils import timezone

from broker.cycle.executor import SimulatedExecutor
from broker.cycle.runner import run_once
from broker.workloads.models import SchedulingCycle
from broker.workloads.states import State
from tests.cycle.helpers import pending
from tests.metrics.test_prometheus import DT, key, scrape, series


def test_it_reads_a_committed_cycle_and_a_finished_run(cluster, client):
    training = cluster.training
    fits = pending(cluster.queue_a, "fits", 2, 4, resource_class=training, expected_duration_seconds=600)
    pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=cluster.training)
    run = run_once()
    assert run.admitted == (fits.pk,)
    executor = SimulatedExecutor(speed=1)
    started = timezone.now()
    executor.start([fits.pk], started)
    executor.advance(started + timedelta(seconds=601))
    fits.refresh_from_db()
    assert fits.state == State.SUCCEEDED

    samples = scrape(client)

    assert series(samples, "capacity_broker_workloads_pending") == {
        key(reason="InvalidRequest", team="team-b", resource_class=DT): 1
    }
    assert series(samples, "capacity_broker_wrong_class_requests_total") == {
        key(kind="InvalidRequest", team="team-b", resource_class=DT): 1
    }
    waited = (fits.admitted_at - fits.submitted_at).total_seconds()
    assert series(samples, "capacity_broker_pending_wait_seconds_sum") == {
        key(team="team-a", resource_class=DT, outcome="Admitted"): waited
    }
    # Two pods of four on one rack's two nodes: one rack, two nodes.
    runtime = (fits.finished_at - fits.started_at).total_seconds()
    counts = series(samples, "capacity_broker_workload_runtime_seconds_count")
    sums = series(samples, "capacity_broker_workload_runtime_seconds_sum")
    assert counts[key(level="rack", span="1")] == 1
    assert counts[key(level="node", span="2")] == 1
    assert sums[key(level="node", span="2")] == runtime
    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert series(samples, "capacity_broker_cycles_total") == {key(outcome="Committed"): 1}
    assert samples[("capacity_broker_last_cycle_seconds", key(phase="decide"))] == cycle.decide_ms / 1000
    assert series(samples, "capacity_broker_workloads") == {key(state="Succeeded"): 1, key(state="Pending"): 1}
