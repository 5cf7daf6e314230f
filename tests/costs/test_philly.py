"""A slice of the Philly trace, replayed as allocation intervals on a cluster just large enough never to
make a job wait, reconciles with device-hours computed straight from the CSV rows."""

import csv
import heapq
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.conf import settings

from broker.costs.exports import chargeback_rows
from broker.costs.sampling import record_capacity_sample
from broker.costs.statement import monthly_statement
from broker.cycle.commit import sample_capacity
from broker.inventory.models import Device, Node
from broker.policy.models import Team
from broker.workloads.models import Allocation, PodSet, Workload
from broker.workloads.states import State

MONTH = datetime(2017, 10, 1, tzinfo=UTC)
NEXT = datetime(2017, 11, 1, tzinfo=UTC)
SLICE = 400
PER_NODE = 8


def trace_slice():
    path = settings.TRACES_DIR / "philly" / "philly.csv"
    if not path.exists():
        pytest.fail(f"the Philly trace is missing at {path}", pytrace=False)
    with path.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["timestamp"].startswith("2017-10") and int(r["num_gpus"]) <= 8]
    rows.sort(key=lambda r: (r["timestamp"], r["duration"], r["num_gpus"]))
    jobs = []
    for index, row in enumerate(rows[:SLICE]):
        start = datetime.fromisoformat(row["timestamp"]).replace(tzinfo=UTC)
        end = start + timedelta(seconds=float(row["duration"]))
        team = "team-a" if row["cluster"] == "6214e9" else "team-b"
        jobs.append((start, end, int(row["num_gpus"]), team, f"philly-{index}"))
    return jobs


def independent_device_hours(jobs):
    """From the raw rows only: GPUs x the part of each job's duration inside the month."""
    out = {"team-a": Decimal(0), "team-b": Decimal(0)}
    for start, end, gpus, team, _ in jobs:
        seconds = (min(end, NEXT) - max(start, MONTH)).total_seconds()
        out[team] += Decimal(gpus) * Decimal(str(max(seconds, 0))) / 3600
    return out


def peak_gpus(jobs):
    events = sorted(
        [(s, g) for s, _, g, _, _ in jobs] + [(e, -g) for _, e, g, _, _ in jobs], key=lambda x: (x[0], x[1])
    )
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def replay(cluster, jobs):
    """Place every job at its submission time on the lowest-numbered free devices."""
    Device.objects.all().delete()
    Node.objects.all().delete()
    nodes = -(-peak_gpus(jobs) // PER_NODE) + 1
    for n in range(nodes):
        node = Node.objects.create(name=f"philly-{n}")
        for d in range(PER_NODE):
            Device.objects.create(node=node, name=str(d), attributes={"model": "H100", "memory": 80})
    free = list(Device.objects.order_by("id").values_list("id", flat=True))
    heapq.heapify(free)
    teams = {team.name: team for team in Team.objects.all()}
    queues = {"team-a": cluster.queue_a, "team-b": cluster.queue_b}
    running = []  # (end, device ids)
    allocations = []
    for start, end, gpus, team, name in jobs:
        while running and running[0][0] <= start:
            _, ids = heapq.heappop(running)
            for device_id in ids:
                heapq.heappush(free, device_id)
        ids = [heapq.heappop(free) for _ in range(gpus)]
        workload = Workload.objects.create(
            name=name,
            team=teams[team],
            queue=queues[team],
            submitted_at=start,
            state=State.SUCCEEDED,
            resource_class=cluster.training,
            trace_id=name,
        )
        PodSet.objects.create(workload=workload, replicas=1, devices_per_pod=gpus)
        allocations += [
            Allocation(
                workload=workload,
                device_id=device_id,
                device_class=cluster.h100,
                pod_set="main",
                pod_index=0,
                allocated_at=start,
                released_at=end,
            )
            for device_id in ids
        ]
        heapq.heappush(running, (end, ids))
    Allocation.objects.bulk_create(allocations)
    record_capacity_sample(MONTH, sample_capacity(MONTH))
    return nodes * PER_NODE


def test_it_reconciles_a_philly_month_with_the_device_hours_of_the_raw_rows(cluster):
    jobs = trace_slice()
    assert len(jobs) == SLICE
    assert min(independent_device_hours(jobs).values()) > 100  # both teams really ran
    devices = replay(cluster, jobs)
    expected = independent_device_hours(jobs)
    rows = {row["line"]: row for row in chargeback_rows(MONTH, NEXT)}
    for team in ("team-a", "team-b"):
        statement = monthly_statement(Team.objects.get(name=team), MONTH, NEXT)
        hours = statement["allocated"]["device_hours"]
        assert abs(hours - expected[team]) <= Decimal("0.0001")
        assert abs(statement["allocated"]["cost"] - expected[team] * 4) <= Decimal("0.01")
        assert statement["charge"] == rows[team]["charge"]
        assert sum(row["device_hours"] for row in statement["by_workload"].values()) == hours
    capacity = Decimal(devices * 31 * 24 * 4)
    assert rows["total"]["charge"] == capacity
    assert rows["team-a"]["charge"] + rows["team-b"]["charge"] + rows["idle"]["charge"] == capacity
    assert rows["stranded"]["charge"] == rows["unhealthy"]["charge"] == 0
