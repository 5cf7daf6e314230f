from datetime import timedelta

from django.utils import timezone

from broker.cycle.executor import SimulatedExecutor
from broker.cycle.runner import run_once
from broker.workloads.models import Allocation
from broker.workloads.states import State
from tests.cycle.helpers import pending


def test_it_runs_admitted_work_for_its_duration_on_the_fast_clock_then_releases_it(cluster):
    job = pending(
        cluster.queue_a,
        "job",
        replicas=1,
        devices_per_pod=4,
        resource_class=cluster.training,
        expected_duration_seconds=600,
    )
    open_ended = pending(cluster.queue_b, "open-ended", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    run_once()
    executor = SimulatedExecutor(speed=60)
    start = timezone.now()

    progress = executor.advance(start)
    assert sorted(progress.started) == sorted([job.pk, open_ended.pk])
    job.refresh_from_db()
    assert job.state == State.RUNNING and job.started_at == start

    # 600 s of work at 60x is 10 s of wall time.
    assert executor.advance(start + timedelta(seconds=9)).completed == []
    progress = executor.advance(start + timedelta(seconds=10))
    assert progress.completed == [job.pk]
    job.refresh_from_db()
    assert job.state == State.SUCCEEDED and job.finished_at == start + timedelta(seconds=10)
    assert not Allocation.objects.filter(workload=job, released_at__isnull=True).exists()
    assert Allocation.objects.filter(workload=job).count() == 4
    open_ended.refresh_from_db()
    assert open_ended.state == State.RUNNING, "no expected duration: it runs until cancelled"


def test_it_derives_completion_from_the_database_so_a_restart_loses_nothing(cluster):
    job = pending(
        cluster.queue_a,
        "job",
        replicas=1,
        devices_per_pod=4,
        resource_class=cluster.training,
        expected_duration_seconds=120,
    )
    run_once()
    start = timezone.now()
    SimulatedExecutor(speed=60).advance(start)

    restarted = SimulatedExecutor(speed=60)
    assert restarted.advance(start + timedelta(seconds=2)).completed == [job.pk]


def test_it_frees_the_devices_for_the_next_cycle(cluster):
    first = pending(
        cluster.queue_a,
        "first",
        replicas=4,
        devices_per_pod=4,
        resource_class=None,
        expected_duration_seconds=60,
        priority=10,
    )
    second = pending(cluster.queue_a, "second", replicas=4, devices_per_pod=4, resource_class=None)
    first.pod_sets.update(device_classes=["h100"])
    second.pod_sets.update(device_classes=["h100"])
    cluster.queue_a.nominal_quota = None
    cluster.queue_a.save()
    assert run_once().admitted == (first.pk,)
    start = timezone.now()
    executor = SimulatedExecutor(speed=60)
    executor.advance(start)
    executor.advance(start + timedelta(seconds=1))

    assert run_once().admitted == (second.pk,)
