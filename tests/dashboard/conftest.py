"""A small scene on the `cluster` fixture: running and pending work of both teams, a reservation, an
unhealthy device and one committed cycle.

Devices (4 H100 per node, $4/h):
  rack r1: n1 all 4 busy (team-a train-a); n2 2 reserved for team-b, 2 stranded (the smallest pending
           per-pod request is 3, and only 2 are left free on n2)
  rack r2: n3 2 busy (team-b serve-b), 2 stranded; n4 1 unhealthy, 3 free
"""

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from broker.inventory.models import Device, Domain, Health
from broker.policy.models import Reservation
from broker.workloads.models import Allocation, Explanation, ExplanationChange, SchedulingCycle, Workload
from broker.workloads.states import State
from tests.builders import make_workload


@dataclass
class Scene:
    cycle: SchedulingCycle
    a_run: Workload
    b_run: Workload
    a_wait: Workload
    b_wait: Workload
    r1: Domain
    r2: Domain


def run(workload, devices, cycle, hours_ago):
    at = timezone.now() - timedelta(hours=hours_ago)
    workload.transition(State.PENDING, at=at)
    workload.transition(State.ADMITTED, at=at)
    workload.transition(State.RUNNING, at=at)
    for index, device in enumerate(devices):
        Allocation.objects.create(
            workload=workload,
            device=device,
            device_class=workload.chosen_device_class,
            pod_set="main",
            pod_index=index,
            cycle=cycle,
            allocated_at=at,
        )
    # As the cycle's commit writes an admission: its allocations and its history row.
    ExplanationChange.objects.create(
        workload=workload, cycle=cycle, reason="Admitted", message=f"admitted: {len(devices)} devices", at=at
    )


def wait(workload, cycle, reason, message, position):
    workload.transition(State.PENDING)
    Explanation.objects.create(
        workload=workload,
        cycle=cycle,
        reason=reason,
        message=message,
        position_in_queue=1,
        position_in_cluster=position,
        suggestions=[
            {
                "kind": "ShrinkGang",
                "description": "Ask for 1 pod fewer and it starts now.",
                "change": {"pod_sets": {"main": {"count": 1, "min_count": 1}}},
            }
        ],
        details={"needed": 8, "free": 3},
    )
    ExplanationChange.objects.create(workload=workload, cycle=cycle, reason=reason, message=message)


@pytest.fixture
def scene(cluster, alice, bob):
    now = timezone.now()
    cycle = SchedulingCycle.objects.create(
        started_at=now - timedelta(seconds=5),
        finished_at=now - timedelta(seconds=4),
        outcome=SchedulingCycle.Outcome.COMMITTED,
        admitted_count=2,
        pending_count=2,
        load_ms=10,
        decide_ms=20,
        commit_ms=5,
    )
    n1, n2, n3, n4 = cluster.nodes
    a_run = make_workload(
        cluster.queue_a,
        "train-a",
        replicas=1,
        devices_per_pod=4,
        resource_class=cluster.training,
        submitted_by=alice,
        chosen_device_class=cluster.h100,
    )
    b_run = make_workload(
        cluster.queue_b,
        "serve-b",
        replicas=2,
        devices_per_pod=1,
        resource_class=cluster.inference,
        submitted_by=bob,
        chosen_device_class=cluster.h100,
    )
    run(a_run, list(n1.devices.order_by("name")), cycle, hours_ago=2)
    run(b_run, list(n3.devices.order_by("name")[:2]), cycle, hours_ago=1)
    a_wait = make_workload(
        cluster.queue_a, "big-a", replicas=2, devices_per_pod=4, resource_class=cluster.training, submitted_by=alice
    )
    b_wait = make_workload(
        cluster.queue_b, "secret-b", replicas=1, devices_per_pod=3, resource_class=cluster.training, submitted_by=bob
    )
    wait(
        a_wait, cycle, "TopologyFragmented", "Needs 8 devices in one rack; the largest free rack block is r2 with 3.", 1
    )
    wait(b_wait, cycle, "QuotaExceeded", "secret-b needs 3 more h100 than team-b's quota.", 2)
    Device.objects.filter(node=n4, name="0").update(health=Health.UNHEALTHY)
    r1, r2 = Domain.objects.get(name="r1"), Domain.objects.get(name="r2")
    Reservation.objects.create(
        name="b-hold",
        team=cluster.team_b,
        device_class=cluster.h100,
        count=2,
        domain=r1,
        start=now - timedelta(hours=1),
        end=now + timedelta(hours=1),
    )
    return Scene(cycle, a_run, b_run, a_wait, b_wait, r1, r2)
