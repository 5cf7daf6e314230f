from collections import Counter
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from broker.demo import inventory as demo
from broker.inventory.models import ClusterState, Device, Domain, Node
from broker.policy.models import DeviceClass, Queue, ResourceClass, Team


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    # Nineteen demo users at full PBKDF2 cost would dominate these tests.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def seed(*args):
    out = StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def counts():
    return {
        model.__name__: model.objects.count()
        for model in (Node, Device, Domain, DeviceClass, Queue, ResourceClass, Team, User)
    }


@pytest.mark.django_db
def test_it_builds_the_philly_cluster_from_the_machine_list():
    output = seed()

    assert Node.objects.count() == 552
    gpus = Device.objects.filter(driver=demo.DRIVER, parent__isnull=True)
    assert gpus.count() == 2490
    assert Counter(gpus.values_list("attributes__model", flat=True)) == {"gpu-24gb": 1848, "gpu-12gb": 642}
    racks = Domain.objects.filter(level__name="rack")
    assert racks.count() == 70
    for rack in racks:
        types = set(rack.nodes.values_list("labels__machine-type", flat=True))
        assert len(types) == 1 and rack.nodes.count() <= 8
    assert Domain.objects.filter(level__name="block").count() == 10
    assert set(Domain.objects.filter(level__name="zone").values_list("name", flat=True)) == {"zone-a", "zone-b"}
    assert Node.objects.get(name="m0").domain.path() == {"rack": "rack-30", "block": "block-05", "zone": "zone-a"}
    assert "operator" in output and "member-6214e9" in output


@pytest.mark.django_db
def test_it_shares_quota_by_vc_node_counts_and_makes_the_menu():
    seed()

    assert Team.objects.count() == 15, "11 VCs with quota and 4 that appear only in the trace"
    quotas = dict(Queue.objects.values_list("name", "nominal_quota"))
    assert sum(q["gpu-24gb"] for q in quotas.values()) == 1848
    assert sum(q["gpu-12gb"] for q in quotas.values()) == 642
    assert quotas["6214e9"]["gpu-24gb"] == 336  # 64 of the 352 VC nodes
    assert quotas["23dbec"] == {"gpu-12gb": 0, "gpu-24gb": 0, "mig-1g": 0, "mig-2g": 0, "rdma-nic": 0}
    # Quota counts a 1g slice as its quarter of the GPU: one unit per partitioned GPU (4 nodes of 8).
    assert sum(q["mig-1g"] for q in quotas.values()) == 4 * 8
    assert sum(q["rdma-nic"] for q in quotas.values()) == 8 * 2
    assert set(Queue.objects.values_list("cohort__name", flat=True)) == {"shared"}
    assert set(ResourceClass.objects.values_list("name", flat=True)) == {
        "small-inference",
        "batch-inference",
        "interactive-experiment",
        "distributed-training",
        "large-reserved-training",
        "gpu-slice",
        "networked-training",
    }
    reserved = ResourceClass.objects.get(name="large-reserved-training")
    assert reserved.approval_required and not reserved.preemptible and reserved.topology_required == "block"
    assert ResourceClass.objects.get(name="distributed-training").topology_required == "rack"
    assert DeviceClass.objects.get(name="gpu-24gb").selector == 'device.attributes["gpu.example.com"].memory >= 24'
    assert User.objects.get(username="admin").is_superuser
    assert User.objects.get(username="member-6214e9").check_password("member-6214e9")


@pytest.mark.django_db
def test_it_is_idempotent():
    seed()
    before = counts()
    generation = ClusterState.current_generation()

    output = seed()

    assert counts() == before
    assert ClusterState.current_generation() == generation
    assert "nothing changed" in output
    assert "nothing seeded" in seed("--if-empty")


@pytest.mark.django_db
def test_it_refuses_to_mix_inventories():
    seed()
    with pytest.raises(CommandError, match="already holds philly"):
        seed("--inventory", "alibaba-2026")


def test_it_lays_out_the_alibaba_inventory_with_real_models():
    machines = demo.machines_for("alibaba-2026")
    placed = demo.place(machines)

    assert len(placed) == 4278
    assert sum(p.machine.devices for p in placed) == 10412
    assert {p.machine.attributes["model"] for p in placed} >= {"A10", "A100-SXM4-80GB", "H800"}
    by_rack = {}
    for p in placed:
        by_rack.setdefault(p.rack, set()).add(p.machine.type_key)
    assert all(len(types) == 1 for types in by_rack.values())
    assert placed == demo.place(list(reversed(machines))), "the layout does not depend on the file's order"


@pytest.mark.django_db
def test_it_makes_the_demo_fleet_look_like_a_real_one():
    from broker.policy.models import Reservation

    seed()

    unhealthy = Device.objects.filter(health="Unhealthy", parent__isnull=True).count()
    assert 2490 // 97 <= unhealthy <= 2490 // 97 + 1
    assert Device.objects.exclude(taints=[]).count() >= 9
    assert list(Node.objects.filter(cordoned=True).values_list("name", flat=True)) == ["m99"]
    reservation = Reservation.objects.get()
    assert (reservation.team.name, reservation.device_class.name, reservation.count) == ("ee9e8c", "gpu-24gb", 16)
    assert reservation.domain.level.name == "rack"
    assert set(reservation.domain.nodes.values_list("devices__attributes__model", flat=True)) == {"gpu-24gb"}


@pytest.mark.django_db
def test_it_leaves_operator_changes_alone_on_a_second_run():
    seed()
    Device.objects.update(health="Healthy")
    seed()
    assert not Device.objects.filter(health="Unhealthy").exists()


@pytest.mark.django_db
def test_it_leaves_standing_requests_that_show_the_reasons_from_the_first_cycle():
    from broker.cycle.runner import run_once
    from broker.workloads.models import Workload

    seed()
    run_once()

    reasons = {
        workload.name: getattr(workload, "explanation", None) and workload.explanation.reason
        for workload in Workload.objects.filter(trace_id="").select_related("explanation")
    }
    assert reasons["llm-pretrain-256"] == "AwaitingApproval"
    assert reasons["borrowed-ambition"] == "NotEntitled"
    assert reasons["one-pod-16-gpus"] == "InvalidRequest"
    assert Workload.objects.get(name="rack-sized-gang").state == "Admitted"
    # Elastic: admitted with at least its gang minimum, and shrinkable later (Pod disruption mode).
    elastic = Workload.objects.get(name="elastic-embeddings")
    assert (elastic.disruption_mode, elastic.state) == ("Pod", "Admitted")
    assert elastic.pod_sets.get().min_count == 4
    assert 4 <= elastic.allocations.order_by().values("pod_index").distinct().count() <= 16


@pytest.mark.django_db
def test_it_publishes_partitioned_gpus_and_nics_on_a_few_nodes():
    seed()

    partitioned = Node.objects.exclude(shared_counters=None)
    assert partitioned.count() == demo.PARTITIONED_NODES
    assert len({node.domain_id for node in partitioned}) == 1, "one rack of partitioned nodes"
    node = partitioned.first()
    whole = node.devices.get(name="0")
    assert whole.consumes_counters == {"gpu-0": {"memory": "24Gi", "slices": 4}}
    slices = whole.partitions.order_by("name")
    assert [device.name for device in slices] == ["0-1g-0", "0-1g-1", "0-1g-2", "0-1g-3", "0-2g-0", "0-2g-1"]
    assert slices[0].consumes_counters == {"gpu-0": {"memory": "6Gi", "slices": 1}}
    assert "model" not in slices[0].attributes, "a partition must not fall in the whole GPU's class"
    for device in Device.objects.filter(parent__isnull=False).select_related("parent"):
        assert device.health == device.parent.health, "a partition fails with its GPU"
    nics = Device.objects.filter(driver=demo.NIC_DRIVER)
    assert nics.count() == demo.NETWORKED_NODES * 2
    nic = nics.get(node__name=nics.first().node.name, name="nic-1")
    gpu = nic.node.devices.get(name="4")
    assert nic.attributes["pcie_root"] == gpu.attributes["pcie_root"] == "pci-1"
    assert nic.attributes["networkIsland"] == gpu.attributes["networkIsland"] == nic.node.domain.name
    assert DeviceClass.objects.get(name="rdma-nic").selector.startswith('device.driver == "nic.example.com"')


@pytest.mark.django_db
def test_it_places_the_partition_and_claim_workloads_without_a_gpu_beside_its_partitions():
    from broker.cycle.runner import run_once
    from broker.workloads.models import Allocation, Workload

    seed()
    run_once()

    held = Allocation.objects.filter(released_at__isnull=True)
    for name, profile in (("notebook-slices", "1g"), ("eval-slices", "2g")):
        workload = Workload.objects.get(name=name)
        assert workload.state == "Admitted", name
        profiles = set(held.filter(workload=workload).values_list("device__attributes__profile", flat=True))
        assert profiles == {profile}
    for name, gpus_per_pod, attribute in (("allreduce-rdma", 4, "pcie_root"), ("island-finetune", 8, "networkIsland")):
        workload = Workload.objects.get(name=name)
        assert workload.state == "Admitted", name
        pods = {}
        for pod, driver, attributes in held.filter(workload=workload).values_list(
            "pod_index", "device__driver", "device__attributes"
        ):
            pods.setdefault(pod, []).append((driver, attributes))
        assert len(pods) == workload.pod_sets.get().replicas
        for devices in pods.values():
            drivers = Counter(driver for driver, _ in devices)
            assert drivers == {demo.DRIVER: gpus_per_pod, demo.NIC_DRIVER: 1}
            assert len({attributes[attribute] for _, attributes in devices}) == 1, f"{name}: one {attribute}"
    # The gang owning a group claim: the rack's scratch volume once, and both pods in that rack.
    gang = Workload.objects.get(name="shared-dataset-prep")
    assert gang.state == "Admitted"
    mine = held.filter(workload=gang)
    (volume,) = mine.filter(pod_set="podgroup:dataset")
    assert volume.device.driver == demo.STORAGE_DRIVER and volume.device.attributes["reach"] == "rack"
    racks = set(mine.exclude(pod_set="podgroup:dataset").values_list("device__node__domain__name", flat=True))
    assert racks == {volume.device.node.domain.name}
    assert mine.count() == 2 * demo.GPUS_PER_PCIE_ROOT + 1
    taken = set(held.values_list("device_id", flat=True))
    parents_of_taken = set(Device.objects.filter(pk__in=taken).exclude(parent=None).values_list("parent_id", flat=True))
    assert parents_of_taken, "the partitions are in use"
    assert not parents_of_taken & taken, "never a whole GPU together with its partitions"
