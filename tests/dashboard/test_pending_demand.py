"""The smallest pending per-pod request per device class, as the dashboard reads it from the database
(dashboard.inventory_state.pending_min_request), is the core's (broker.scheduler.accounting)."""

from broker.policy.models import DeviceClass
from broker.workloads.models import Explanation, PodSet
from broker.workloads.states import State
from dashboard.inventory_state import pending_min_request
from tests.builders import H100_SELECTOR, make_resource_class, make_workload


def test_it_takes_each_pending_gangs_smallest_pod_for_the_classes_it_may_use(cluster):
    a100 = DeviceClass.objects.create(name="a100", selector=H100_SELECTOR, price_per_hour="2.00")
    both = make_resource_class("either", cluster.training.priority_class, [a100, cluster.h100])
    # Two pod sets: the smaller pod counts, for the classes of the resource class (none declared).
    two_sets = make_workload(cluster.queue_a, "two-sets", devices_per_pod=8, resource_class=both, state=State.PENDING)
    PodSet.objects.create(workload=two_sets, name="workers", replicas=2, devices_per_pod=3)
    # A later pod set declaring a class: the workload's fallback list is that class alone.
    declared = make_workload(cluster.queue_a, "declared", devices_per_pod=4, resource_class=both, state=State.PENDING)
    PodSet.objects.create(workload=declared, name="extra", replicas=1, devices_per_pod=2, device_classes=["h100"])
    # Many of one shape, and work that wants nothing: admitted, or held by policy.
    for index in range(5):
        make_workload(cluster.queue_b, f"same-{index}", devices_per_pod=6, resource_class=both, state=State.PENDING)
    make_workload(cluster.queue_a, "running", devices_per_pod=1, resource_class=both, state=State.RUNNING)
    held = make_workload(cluster.queue_b, "held", devices_per_pod=1, resource_class=both, state=State.PENDING)
    Explanation.objects.create(workload=held, reason="QuotaExceeded", message="over quota")

    assert pending_min_request() == {"a100": 3, "h100": 2}


def test_it_wants_nothing_without_pending_work(cluster):
    make_workload(cluster.queue_a, "done", devices_per_pod=1, resource_class=cluster.training, state=State.SUCCEEDED)

    assert pending_min_request() == {}
