"""A constructed history whose every figure is worked out by hand in the tests.

All times are offsets in seconds from T0, ten days ago. The small cluster: racks r1 (n1, n2) and r2 (n3, n4)
in block b1 of zone z1, 4 H100 per node.

- trainer (a, distributed-training): waits 0-1000 (InsufficientCapacity 60-600 and 800-1000,
  TopologyFragmented 600-800), runs 1000-4600 on n1 + n3 (two racks).
- infer (a, small-inference): waits 100-300 (Priority), runs 300-2100 on n2.
- requeued (b, distributed-training): waits 0-50, runs on n2 + n4 (two racks), is preempted at 2000
  (Preempted 2000-2100, Priority 2100-2500), runs 2500-3100 on n4 alone.
- denied (b, large-reserved-training): NotEntitled 3000-3500, then cancelled (its explanation row stays).
- batch (b, batch-inference = h100 then a100): waits 4000-4030, runs on a100: a fallback; governance says
  it would fit a smaller class.
- custom (a, distributed-training, its pod set asks a100 first): waits 4000-4100, runs on h100: a fallback.
- stuck (b, distributed-training): QuotaExceeded since 2000, still pending.
- toobig (a, distributed-training): InvalidRequest since 5000, still pending.
- fresh (a, small-inference): pending, not explained yet; big (a, large-reserved-training): awaiting approval.
- broken (a, small-inference): waits 200-300, fails after running 300-900: no runtime of finished work.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from broker.audit.models import AuditEvent, record
from broker.costs.models import CapacitySample
from broker.inventory.models import Device, Health
from broker.policy.models import DeviceClass
from broker.workloads.models import Allocation, Explanation, ExplanationChange, PodSet, SchedulingCycle
from broker.workloads.states import State
from tests.builders import make_resource_class, make_workload

A100_SELECTOR = 'device.attributes["gpu.example.com"].model == "A100"'


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@dataclass
class History:
    t0: datetime
    workloads: dict

    def at(self, offset):
        return self.t0 + timedelta(seconds=offset)

    def since(self, offset, now):
        """Seconds from T0+offset to `now`."""
        return (now - self.at(offset)).total_seconds()


def device(cluster, node, index):
    return Device.objects.get(node=cluster.nodes[node], name=str(index))


def hold(workload, devices, device_class, allocated, released=None):
    for pod_index, dev in enumerate(devices):
        Allocation.objects.create(
            workload=workload,
            device=dev,
            device_class=device_class,
            pod_set="main",
            pod_index=pod_index,
            allocated_at=allocated,
            released_at=released,
        )


def explain(workload, reason, at, current=False):
    ExplanationChange.objects.create(workload=workload, reason=reason, message=f"{reason} at {at}", at=at)
    if current:
        Explanation.objects.update_or_create(
            workload=workload,
            defaults={"reason": reason, "message": f"{reason} at {at}", "position_in_queue": 1, "updated_at": at},
        )


def submitted(queue, name, resource_class, at, state=State.PENDING):
    workload = make_workload(queue, name=name, resource_class=resource_class)
    workload.submitted_at = at
    workload.transition(state, at=at)
    return workload


def admit_and_run(workload, device_class, at):
    workload.chosen_device_class = device_class
    workload.transition(State.ADMITTED, at=at)
    workload.transition(State.RUNNING, at=at)
    ExplanationChange.objects.create(workload=workload, reason="Admitted", message="admitted", at=at)


@pytest.fixture
def history(cluster, olivia, adam, alice):
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=10)
    h = History(t0, {})
    at = h.at
    a100 = DeviceClass.objects.create(name="a100", selector=A100_SELECTOR, price_per_hour="2.00")
    batch_inference = make_resource_class("batch-inference", cluster.training.priority_class, [cluster.h100, a100])
    w = h.workloads

    w["trainer"] = trainer = submitted(cluster.queue_a, "trainer", cluster.training, at(0))
    explain(trainer, "InsufficientCapacity", at(60))
    explain(trainer, "TopologyFragmented", at(600))
    explain(trainer, "InsufficientCapacity", at(800))
    admit_and_run(trainer, cluster.h100, at(1000))
    hold(trainer, [device(cluster, n, i) for n in (0, 2) for i in range(4)], cluster.h100, at(1000), at(4600))
    trainer.transition(State.SUCCEEDED, at=at(4600))

    w["infer"] = infer = submitted(cluster.queue_a, "infer", cluster.inference, at(100))
    explain(infer, "Priority", at(100))
    admit_and_run(infer, cluster.h100, at(300))
    hold(infer, [device(cluster, 1, 0), device(cluster, 1, 1)], cluster.h100, at(300), at(2100))
    infer.transition(State.SUCCEEDED, at=at(2100))

    w["requeued"] = requeued = submitted(cluster.queue_b, "requeued", cluster.training, at(0))
    admit_and_run(requeued, cluster.h100, at(50))
    first = [device(cluster, 1, 2), device(cluster, 1, 3), device(cluster, 3, 0), device(cluster, 3, 1)]
    hold(requeued, first, cluster.h100, at(50), at(2000))
    requeued.transition(State.PREEMPTED, at=at(2000))
    requeued.transition(State.PENDING, at=at(2000))
    explain(requeued, "Preempted", at(2000))
    explain(requeued, "Priority", at(2100))
    admit_and_run(requeued, cluster.h100, at(2500))
    hold(requeued, [device(cluster, 3, 2), device(cluster, 3, 3)], cluster.h100, at(2500), at(3100))
    requeued.transition(State.SUCCEEDED, at=at(3100))

    w["denied"] = denied = submitted(cluster.queue_b, "denied", cluster.reserved, at(3000))
    explain(denied, "NotEntitled", at(3000), current=True)
    denied.transition(State.CANCELLED, at=at(3500))

    w["batch"] = batch = submitted(cluster.queue_b, "batch", batch_inference, at(4000))
    admit_and_run(batch, a100, at(4030))
    hold(batch, [device(cluster, 2, 0)], a100, at(4030))

    w["custom"] = custom = submitted(cluster.queue_a, "custom", cluster.training, at(4000))
    PodSet.objects.filter(workload=custom).update(device_classes=["a100", "h100"])
    admit_and_run(custom, cluster.h100, at(4100))
    hold(custom, [device(cluster, 2, 1)], cluster.h100, at(4100))

    w["stuck"] = stuck = submitted(cluster.queue_b, "stuck", cluster.training, at(2000))
    explain(stuck, "QuotaExceeded", at(2000), current=True)

    w["toobig"] = toobig = submitted(cluster.queue_a, "toobig", cluster.training, at(5000))
    explain(toobig, "InvalidRequest", at(5000), current=True)

    w["fresh"] = submitted(cluster.queue_a, "fresh", cluster.inference, at(6000))
    w["big"] = submitted(cluster.queue_a, "big", cluster.reserved, at(6000), state=State.AWAITING_APPROVAL)

    w["broken"] = broken = submitted(cluster.queue_a, "broken", cluster.inference, at(200))
    admit_and_run(broken, cluster.h100, at(300))
    hold(broken, [device(cluster, 0, 0)], cluster.h100, at(300), at(900))
    broken.transition(State.FAILED, at=at(900))

    # Governance: batch would have fitted a smaller class.
    record("guidance.wrong_class", batch, reason="fits small-inference")

    # Manual interventions (and one event that is not one).
    record("device.health", device(cluster, 3, 3), actor=olivia, manual_intervention=True)
    record("workload.priority", infer, actor=olivia, manual_intervention=True)
    record("workload.priority", trainer, actor=olivia, manual_intervention=True)
    record("queue.update", cluster.queue_a, actor=adam, manual_intervention=True)
    record("node.cordon", cluster.nodes[3], manual_intervention=True)
    record("workload.cancel", denied, actor=alice)
    # An operator since removed: the event keeps the name, not the user.
    AuditEvent.objects.create(
        actor=None, actor_name="gone", action="node.cordon", target_type="inventory.node", manual_intervention=True
    )

    # Capacity samples: h100 stranded 2 from T0, 0 from 1000, 3 from 2000 on; a100 never stranded.
    for offset, stranded in ((0, 2), (1000, 0), (2000, 3)):
        CapacitySample.objects.create(at=at(offset), device_class=cluster.h100, total=16, stranded=stranded)
    CapacitySample.objects.create(at=at(500), device_class=a100, total=0, unhealthy=0, stranded=0)

    Device.objects.filter(pk=device(cluster, 3, 3).pk).update(health=Health.UNHEALTHY)
    Device.objects.filter(pk=device(cluster, 3, 2).pk).update(health=Health.UNKNOWN)

    # Cycles: three committed, one refused, one failed, one still running, and another cluster's.
    outcome = SchedulingCycle.Outcome
    for offset, result, decide_ms in (
        (10, outcome.COMMITTED, 10.0),
        (20, outcome.REFUSED, 99.0),
        (30, outcome.COMMITTED, 20.0),
        (40, outcome.FAILED, 0.0),
        (50, outcome.COMMITTED, 30.0),
    ):
        SchedulingCycle.objects.create(
            started_at=at(offset),
            finished_at=at(offset + 1),
            outcome=result,
            load_ms=5.0,
            decide_ms=decide_ms,
            commit_ms=7.0 if result == outcome.COMMITTED else 0.0,
        )
    SchedulingCycle.objects.create(started_at=at(60), outcome=outcome.RUNNING)
    SchedulingCycle.objects.create(
        cluster="elsewhere", started_at=at(70), finished_at=at(71), outcome=outcome.COMMITTED, decide_ms=500.0
    )
    return h


@pytest.fixture(autouse=True)
def scraper_token(settings):
    """The metrics tests scrape as Prometheus does, with the bearer token (/metrics is closed otherwise)."""
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    settings.METRICS_PUBLIC = False
