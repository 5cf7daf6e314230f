"""The finance page in a browser: the top workloads show fractional device-hours of shared devices to
the share, not rounded to a tenth (issue 26)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.inventory.models import Device
from broker.workloads.models import Allocation
from broker.workloads.states import State
from tests.costs.helpers import submit
from tests.e2e.conftest import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def test_it_shows_each_share_of_a_shared_gpu_in_device_hours(stack, browser, cluster, fiona):
    base, _logs = stack
    device = Device.objects.get(node=cluster.nodes[0], name="0")
    device.capacity = {"memory": "80Gi"}
    device.allow_multiple_allocations = True
    device.save()
    start = timezone.now().replace(microsecond=0) - timedelta(hours=5)
    for name, queue, memory in (("half", cluster.queue_a, "40Gi"), ("eighth", cluster.queue_b, "10Gi")):
        workload = submit(queue, name, start, state=State.SUCCEEDED)
        Allocation.objects.create(
            workload=workload,
            device=device,
            device_class=cluster.h100,
            pod_set="main",
            pod_index=0,
            allocated_at=start,
            # A minute: an hour on the simulated clock the stack bills on (SIMULATION_SPEED 60).
            released_at=start + timedelta(minutes=1),
            consumed_capacity={"memory": memory},
        )
    page = log_in(browser, base, "fiona")
    page.goto(f"{base}/finance/")
    page.wait_for_selector("#top-workloads[aria-busy='false']")
    bars = page.evaluate(
        "(() => { const d = document.getElementById('top-workloads').data[0];"
        " return Object.fromEntries(d.y.map((key, i) => [key, [d.x[i], d.text[i]]])); })()"
    )
    assert bars == {"team-a/half": [2, "0.5 device-h"], "team-b/eighth": [0.5, "0.125 device-h"]}
    assert page.console_errors == []
