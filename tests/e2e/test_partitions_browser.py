"""The topology drill-down in a browser: a partitioned GPU is one cell marked with its partitions in use,
a NIC a cell marked NIC, and the node table lists the partitions under their GPU."""

import pytest

from broker.inventory.models import Device, Domain, Node
from tests.cycle.helpers import running
from tests.e2e.conftest import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def test_it_marks_partitioned_gpus_and_nics_in_the_rack_drill_down(stack, browser, cluster, olivia):
    base, _logs = stack
    rack = Domain.objects.get(name="r2")
    node = Node.objects.create(name="p1", domain=rack, shared_counters={"gpu-0": {"slices": 3}})
    whole = Device.objects.create(
        node=node, name="0", attributes={"model": "H100"}, consumes_counters={"gpu-0": {"slices": 3}}
    )
    parts = [
        Device.objects.create(
            node=node,
            name=f"0-1g-{index}",
            attributes={"profile": "1g"},
            parent=whole,
            consumes_counters={"gpu-0": {"slices": 1}},
        )
        for index in range(3)
    ]
    Device.objects.create(node=node, name="nic-0", driver="nic.example.com", attributes={"kind": "rdma"})
    running(cluster.queue_b, "slices", parts[:2], cluster.h100)
    page = log_in(browser, base, "olivia")

    page.goto(f"{base}/topology/?rack={rack.pk}&node={node.pk}")
    page.wait_for_selector("#drill .main-svg")
    page.wait_for_selector("#devices tbody tr[data-kind='partition']")

    marks = page.evaluate("document.getElementById('drill').layout.annotations.map(a => a.text)")
    assert sorted(marks) == ["2/3", "NIC"]
    rows = page.locator("#devices tbody tr")
    assert rows.nth(0).inner_text().startswith("p1/0 · 2/3 partitions used")
    assert page.locator("#devices tbody tr[data-kind='partition']").count() == 3
    assert page.locator("#devices tbody tr[data-kind='nic']").inner_text().startswith("p1/nic-0 (NIC)")


def test_it_offers_only_the_device_classes_of_the_chosen_resource_class(stack, browser, cluster, alice):
    from broker.policy.models import DeviceClass
    from tests.builders import make_resource_class

    base, _logs = stack
    selector = 'device.attributes["gpu.example.com"].profile == "{}"'
    profiles = [
        DeviceClass.objects.create(name=f"mig-{size}", selector=selector.format(size), price_per_hour="1.00")
        for size in ("1g", "2g")
    ]
    slices = make_resource_class("gpu-slice", cluster.inference.priority_class, profiles)
    page = log_in(browser, base, "alice")
    page.goto(f"{base}/submit/")

    def offered():
        return page.evaluate(
            "Array.from(document.querySelector('select[name=device_class]').options)"
            ".filter(o => !o.disabled && o.value).map(o => o.value)"
        )

    page.check(f'input[name="resource_class"][value="{slices.pk}"]')
    assert offered() == ["mig-1g", "mig-2g"]
    page.select_option('select[name="device_class"]', "mig-2g")
    page.check(f'input[name="resource_class"][value="{cluster.training.pk}"]')
    assert offered() == ["h100"]
    assert page.input_value('select[name="device_class"]') == "", "a class the new choice lacks is let go"
