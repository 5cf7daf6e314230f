"""The demo's clocks agree (issue 29): under the simulated executor a job that runs its expected 6 h costs
6 h of its devices, though it held them for 90 s of wall-clock time at SIMULATION_SPEED=240."""

from datetime import timedelta
from decimal import Decimal

from broker.costs.pending import pending_report
from broker.costs.report import allocation_report
from broker.cycle.executor import SimulatedExecutor
from broker.workloads.models import Allocation, Workload
from broker.workloads.states import State
from tests.costs.helpers import NOV, hold, submit
from tests.costs.test_lifecycle import devices

SIX_HOURS = 6 * 3600


def six_hour_job(cluster):
    """Waits 30 s of wall time (2 simulated hours), then runs 6 simulated hours on 4 devices."""
    job = submit(
        cluster.queue_a,
        name="six-hours",
        devices_per_pod=4,
        resource_class=cluster.training,
        at=NOV,
        expected_duration_seconds=SIX_HOURS,
    )
    job.transition(State.PENDING, at=NOV)
    admitted = NOV + timedelta(seconds=30)
    job.transition(State.ADMITTED, at=admitted)
    hold(job, devices(cluster, 0, 4), cluster.h100, admitted)
    return job, admitted


def test_it_bills_the_simulated_hours_the_executor_ran(cluster, settings):
    settings.EXECUTOR = "simulated"
    settings.SIMULATION_SPEED = 240
    job, admitted = six_hour_job(cluster)
    executor = SimulatedExecutor()
    executor.start([job.pk], admitted)
    assert executor.advance(admitted + timedelta(seconds=89)).completed == []
    assert executor.advance(admitted + timedelta(seconds=90)).completed == [job.pk]
    assert Workload.objects.get(pk=job.pk).state == State.SUCCEEDED
    assert Allocation.objects.filter(workload=job, released_at=admitted + timedelta(seconds=90)).count() == 4

    window = (NOV, NOV + timedelta(hours=1))
    bill = allocation_report(*window, step="hour", now=NOV + timedelta(days=1))
    # 4 devices x 6 h x 4.00 an hour, as the executor ran it; not 4 x 90 s.
    assert bill["totals"]["allocations"]["team-a"] == {"device_hours": Decimal("24.0000"), "cost": Decimal("96.00")}
    waited = pending_report(*window, step="hour", now=NOV + timedelta(days=1))
    assert waited["totals"]["pending"]["team-a"] == {"device_hours": Decimal("8.0000"), "cost": Decimal("32.00")}


def test_it_bills_the_wall_clock_under_a_real_executor(cluster, settings):
    settings.EXECUTOR = "external"
    settings.SIMULATION_SPEED = 240
    six_hour_job(cluster)
    Allocation.objects.update(released_at=NOV + timedelta(hours=6, seconds=30))
    bill = allocation_report(NOV, NOV + timedelta(hours=7), step="day", now=NOV + timedelta(days=1))
    assert bill["totals"]["allocations"]["team-a"]["device_hours"] == Decimal("24.0000")
