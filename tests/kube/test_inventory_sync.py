"""Inventory in: the real client lists and watches a mock API server; the mirror writes the inventory."""

import pytest
from kubernetes.client.rest import ApiException

from broker.inventory.models import Device, Domain, Health, Node
from broker.kube.models import Cluster, MirroredSlice, WatchCursor
from broker.kube.sync import INVENTORY, RESOURCES, Sync
from broker.policy.models import DeviceClass
from broker.workloads.models import Allocation
from tests.builders import build_small_cluster, make_workload
from tests.kube import objects
from tests.kube_apiserver import ShapeError, to_dict

NODES, SLICES, CLASSES, RULES = (
    next(r for r in RESOURCES if r.name == n) for n in ("nodes", "resourceslices", "deviceclasses", "devicetaintrules")
)


def watch(sync, resource):
    """One watch request from the resource's cursor, until the server's timeout."""
    return sync.watch_once(resource, sync.cursor(resource))


@pytest.fixture
def four_nodes(apiserver):
    for i in range(4):
        apiserver.create(objects.node(f"k{i}", rack=f"r{i // 2}"))
        apiserver.create(objects.resource_slice(f"k{i}"))
    apiserver.create(objects.device_class())


def test_it_lists_nodes_slices_and_classes_into_the_inventory(sync, four_nodes):
    sync.list_all(INVENTORY)
    assert Node.objects.count() == 4
    assert Device.objects.count() == 32
    gpu = Device.objects.get(node__name="k0", name="gpu-3")
    assert (gpu.driver, gpu.pool) == (objects.DRIVER, "k0")
    assert gpu.attributes == {"model": "H100", "index": 3, "pcie.example.com/root": "pci0"}
    assert gpu.capacity == {"memory": 80 * 2**30}
    assert gpu.health == Health.HEALTHY
    n3 = Node.objects.get(name="k3")
    assert n3.domain.path() == {"rack": "r1", "block": "b1"}
    assert n3.kube.cluster.name == "lab"
    assert Domain.objects.filter(level__name="rack").count() == 2
    h100 = DeviceClass.objects.get(name="h100")
    assert h100.selector == f'(device.driver == "{objects.DRIVER}") && ({objects.H100})'
    mirrored = Cluster.objects.get(name="lab")
    assert mirrored.last_listed_at is not None and mirrored.healthy()


def test_it_lets_the_broker_select_mirrored_devices_with_the_cluster_selector(sync, four_nodes):
    from broker.scheduler.selectors import ClassMatcher
    from broker.scheduler.snapshot import Device as CoreDevice
    from broker.scheduler.snapshot import DeviceClass as CoreClass

    sync.list_all(INVENTORY)
    row = Device.objects.first()
    matcher = ClassMatcher((CoreClass(name="h100", selector=DeviceClass.objects.get(name="h100").selector),))
    core = CoreDevice(id=str(row.pk), node="k0", driver=row.driver, attributes=row.attributes, capacity=row.capacity)
    assert matcher.classes_of(core) == frozenset({"h100"})


def test_it_watches_cordons_health_and_deletes(sync, apiserver, four_nodes):
    sync.list_all(INVENTORY)
    apiserver.apply(objects.node("k1", unschedulable=True))
    apiserver.set_status("Node", "k2", to_dict(objects.node("k2", ready="False").status))
    apiserver.delete("ResourceSlice", "k3-gpu.example.com")
    watch(sync, NODES)
    watch(sync, SLICES)
    assert Node.objects.get(name="k1").cordoned
    assert set(Device.objects.filter(node__name="k2").values_list("health", flat=True)) == {Health.UNHEALTHY}
    assert not Device.objects.filter(node__name="k3").exists()
    assert not MirroredSlice.objects.filter(name="k3-gpu.example.com").exists()
    apiserver.delete("Node", "k3")
    watch(sync, NODES)
    assert not Node.objects.filter(name="k3").exists()


def test_it_resumes_from_its_cursor_without_applying_an_event_twice(sync, apiserver, four_nodes):
    sync.list_all(INVENTORY)
    apiserver.apply(objects.node("k1", unschedulable=True))
    watch(sync, NODES)
    applied = Cluster.objects.get(name="lab").events_applied
    restarted = Sync(timeout_seconds=1)
    watch(restarted, NODES)  # nothing new: the cursor is past every event
    assert Cluster.objects.get(name="lab").events_applied == applied
    apiserver.apply(objects.node("k1"))
    watch(restarted, NODES)
    assert Cluster.objects.get(name="lab").events_applied == applied + 1
    assert not Node.objects.get(name="k1").cordoned


def test_it_moves_its_cursor_with_bookmarks(sync, apiserver, four_nodes):
    sync.list_all(INVENTORY)
    apiserver.create(objects.device_class("other", 'device.attributes["gpu.example.com"].model == "A100"'))
    before = WatchCursor.objects.get(resource="nodes").resource_version
    watch(sync, NODES)  # no node changed; the bookmark carries the newer version
    assert int(WatchCursor.objects.get(resource="nodes").resource_version) > int(before)


def test_it_lists_again_after_410_gone_and_forgets_what_was_deleted_meanwhile(sync, apiserver, four_nodes):
    sync.list_all(INVENTORY)
    apiserver.delete("ResourceSlice", "k0-gpu.example.com")
    apiserver.delete("Node", "k0")
    apiserver.compact()
    with pytest.raises(ApiException) as gone:
        watch(sync, NODES)
    assert gone.value.status == 410
    sync.relist(NODES)
    sync.relist(SLICES)
    assert not Node.objects.filter(name="k0").exists()
    assert Device.objects.count() == 24


def test_it_taints_devices_from_slices_and_taint_rules(sync, apiserver, four_nodes):
    from kubernetes import client

    apiserver.apply(
        objects.resource_slice("k0", taints=[client.V1DeviceTaint(key="example.com/hot", effect="NoSchedule")])
    )
    apiserver.create(objects.taint_rule("broken-n1", pool="k1", device_name="gpu-2"))
    sync.list_all(INVENTORY)
    assert Device.objects.get(node__name="k0", name="gpu-0").taints == [
        {"key": "example.com/hot", "value": "", "effect": "NoSchedule"}
    ]
    assert Device.objects.get(node__name="k1", name="gpu-2").taints == [
        {"key": "example.com/broken", "value": "ecc", "effect": "NoExecute", "rule": "broken-n1"}
    ]
    apiserver.delete("DeviceTaintRule", "broken-n1")
    watch(sync, RULES)
    assert Device.objects.get(node__name="k1", name="gpu-2").taints == []


def test_it_keeps_a_held_device_that_vanished_tainted_until_it_is_free(sync, apiserver, four_nodes):
    small = build_small_cluster(racks=1, nodes_per_rack=1, devices_per_node=1)
    sync.list_all(INVENTORY)
    workload = make_workload(small.queue_a, resource_class=small.training, state="Running")
    gpu = Device.objects.get(node__name="k0", name="gpu-0")
    Allocation.objects.create(workload=workload, device=gpu, device_class=small.h100, pod_set="main", pod_index=0)
    apiserver.delete("ResourceSlice", "k0-gpu.example.com")
    watch(sync, SLICES)
    gpu.refresh_from_db()
    assert gpu.health == Health.UNHEALTHY
    assert {"key": "broker.capacity.io/gone", "value": "deleted in the cluster", "effect": "NoExecute"} in gpu.taints
    assert Device.objects.filter(node__name="k0").count() == 1


def test_it_refuses_to_serve_a_shape_the_client_does_not_know(apiserver):
    with pytest.raises(ShapeError, match="unschedulabel"):
        apiserver.create(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}, "spec": {"unschedulabel": True}}
        )


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_runs_the_sync_command_once(kube_settings, apiserver, four_nodes):
    from django.core.management import call_command

    call_command("kube_sync", "--once")
    assert Device.objects.count() == 32


def test_it_refuses_to_run_with_the_bridge_off(db):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="KUBE_ENABLED"):
        call_command("kube_sync", "--once")


def test_it_maps_shared_counters_and_their_consumption(sync, apiserver):
    apiserver.create(objects.node("mig"))
    apiserver.create(objects.counter_slice("mig"))
    apiserver.create(objects.partitioned_slice("mig"))
    sync.list_all(INVENTORY)
    node = Node.objects.get(name="mig")
    assert node.shared_counters == {"gpu.example.com/gpu-0": {"memory": "80Gi"}}
    consumed = dict(Device.objects.filter(node=node).values_list("name", "consumes_counters"))
    assert consumed == {
        "gpu-0": {"gpu.example.com/gpu-0": {"memory": "80Gi"}},
        "gpu-0-half-0": {"gpu.example.com/gpu-0": {"memory": "40Gi"}},
        "gpu-0-half-1": {"gpu.example.com/gpu-0": {"memory": "40Gi"}},
    }
    node.full_clean()
    for device in Device.objects.filter(node=node):
        device.full_clean()
    apiserver.delete("ResourceSlice", "mig-gpu.example.com-counters")
    watch(sync, SLICES)
    assert Node.objects.get(name="mig").shared_counters is None, "the sets go with the slice that published them"


def test_it_keeps_the_counter_sets_of_two_drivers_apart(sync, apiserver):
    from kubernetes import client

    apiserver.create(objects.node("mig"))
    apiserver.create(objects.counter_slice("mig"))
    nic = objects.counter_slice("mig", memory="1Gi")
    nic.metadata.name, nic.spec.driver = "mig-nic.example.com-counters", "nic.example.com"
    nic.spec.pool = client.V1ResourcePool(name="nics", generation=1, resource_slice_count=1)
    apiserver.create(nic)
    sync.list_all(INVENTORY)
    assert Node.objects.get(name="mig").shared_counters == {
        "gpu.example.com/gpu-0": {"memory": "80Gi"},
        "nic.example.com/nics/gpu-0": {"memory": "1Gi"},
    }


def test_it_serves_no_slice_with_both_devices_and_counters(apiserver):
    both = objects.partitioned_slice("mig")
    both.spec.shared_counters = objects.counter_slice("mig").spec.shared_counters
    with pytest.raises(ShapeError, match="only one of devices and sharedCounters"):
        apiserver.create(both)
