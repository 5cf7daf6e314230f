"""The topology heatmap's JSON for partitioned GPUs and NICs: a partitioned GPU is one cell that says
how many of its partitions are in use, and a NIC is told apart from the GPUs."""

import pytest
from django.urls import reverse

from broker.inventory.models import Device, Node
from broker.workloads.models import Allocation
from tests.builders import make_workload
from tests.dashboard.conftest import run


@pytest.fixture
def partitioned(scene, cluster, alice):
    """Node p1 in rack r2: GPU 0 cut into three partitions (two held by team-a), GPU 1 whole, one NIC."""
    node = Node.objects.create(
        name="p1", domain=scene.r2, shared_counters={"gpu-0": {"slices": 3}, "gpu-1": {"slices": 3}}
    )
    whole = Device.objects.create(
        node=node, name="0", attributes={"model": "H100"}, consumes_counters={"gpu-0": {"slices": 3}}
    )
    Device.objects.create(node=node, name="1", attributes={"model": "H100"}, consumes_counters={"gpu-1": {"slices": 3}})
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
    slices = make_workload(
        cluster.queue_a,
        "slices-a",
        replicas=2,
        devices_per_pod=1,
        resource_class=cluster.inference,
        submitted_by=alice,
        chosen_device_class=cluster.h100,
    )
    run(slices, parts[:2], scene.cycle, hours_ago=1)
    return node


def test_it_nests_partitions_under_their_gpu_and_counts_those_in_use(client, partitioned, alice):
    client.force_login(alice)

    devices = client.get(reverse("dashboard:api-heatmap-node", args=[partitioned.pk])).json()["devices"]

    assert [(d["name"], d["kind"]) for d in devices] == [("0", "gpu"), ("1", "gpu"), ("nic-0", "nic")]
    cut, whole, nic = devices
    assert [(p["name"], p["kind"], p["state"]) for p in cut["partitions"]] == [
        ("0-1g-0", "partition", "busy"),
        ("0-1g-1", "partition", "busy"),
        ("0-1g-2", "partition", "free"),
    ]
    assert cut["partitions_used"] == 2 and cut["partition_teams"] == {"team-a": 2}
    # Its counters are taken by the partitions: not free for a whole-device request.
    assert (cut["state"], cut["team"]) == ("busy", "team-a")
    assert "partitions" not in whole and whole["state"] != "busy"
    assert "partitions" not in nic


def test_it_drills_a_rack_into_partitioned_gpus_and_nics(client, partitioned, alice):
    client.force_login(alice)

    data = client.get(reverse("dashboard:api-heatmap-rack", args=[partitioned.domain_id])).json()

    mine = [d for d in data["devices"] if d["node"] == "p1"]
    assert [(d["name"], d["kind"], len(d.get("partitions", []))) for d in mine] == [
        ("0", "gpu", 3),
        ("1", "gpu", 0),
        ("nic-0", "nic", 0),
    ]


def test_it_says_what_a_rack_cell_is_made_of(client, partitioned, alice):
    client.force_login(alice)

    cells = {cell["name"]: cell for cell in client.get(reverse("dashboard:api-heatmap")).json()["cells"]}

    assert (cells["r2"]["partitions"], cells["r2"]["partitions_busy"], cells["r2"]["nics"]) == (3, 2, 1)
    assert "partitions" not in cells["r1"] and "nics" not in cells["r1"]


def test_it_counts_physical_devices_in_a_rack_cell(client, scene, partitioned, alice):
    """p1's two GPUs and NIC are three devices, not six: GPU 0 counts busy once through its two held
    partitions, and team-a holds part of one device."""
    client.force_login(alice)
    others = Device.objects.filter(node__domain=scene.r2).exclude(node=partitioned).count()

    cells = {cell["name"]: cell for cell in client.get(reverse("dashboard:api-heatmap")).json()["cells"]}
    r2 = cells["r2"]

    assert r2["total"] == others + 3
    assert sum(r2["counts"].values()) == r2["total"]
    p1_busy = 1  # GPU 0, through its partitions
    others_busy = Allocation.objects.filter(
        released_at__isnull=True, device__node__domain=scene.r2, device__parent=None
    ).exclude(device__node=partitioned)
    assert r2["counts"]["busy"] == others_busy.values("device").distinct().count() + p1_busy


def test_it_shows_how_much_of_a_time_sliced_gpu_is_taken(client, scene, cluster, alice):
    node = Node.objects.create(name="s1", domain=scene.r2)
    gpu = Device.objects.create(
        node=node, name="0", attributes={"model": "T4"}, capacity={"memory": "80Gi"}, allow_multiple_allocations=True
    )
    Device.objects.create(
        node=node, name="1", attributes={"model": "T4"}, capacity={"memory": "80Gi"}, allow_multiple_allocations=True
    )
    for name, memory in (("nb-1", "20Gi"), ("nb-2", "40Gi")):
        workload = make_workload(cluster.queue_a, name, state="Running", submitted_by=alice)
        Allocation.objects.create(
            workload=workload, device=gpu, device_class=cluster.h100, pod_set="main", pod_index=0,
            consumed_capacity={"memory": memory},
        )  # fmt: skip
    client.force_login(alice)

    r2 = {cell["name"]: cell for cell in client.get(reverse("dashboard:api-heatmap")).json()["cells"]}["r2"]

    assert (r2["shared"], r2["shared_busy"], r2["share_use"]) == (2, 1, 0.375)  # (60 of 80 + 0) / 2
    assert r2["teams"]["team-a"] >= 1
