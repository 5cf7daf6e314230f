"""The per-inventory index the cycle keeps between snapshots that carry the same inventory tuples."""

import dataclasses
import random

import pytest

from broker.scheduler.capacity import InventoryIndex, _device_key
from broker.scheduler.cycle import Cycle, decide, warm
from broker.scheduler.snapshot import DeviceClass, Taint
from broker.scheduler.synthetic import synthetic_snapshot


def cold_decide(snapshot):
    InventoryIndex._last = None
    return decide(snapshot)


def test_it_decides_the_same_with_a_reused_index():
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    cold = cold_decide(snapshot)
    reused = InventoryIndex._last

    warm = decide(snapshot)

    assert InventoryIndex._last is reused
    assert warm == cold


def test_it_gives_one_pod_admissions_their_nodes_shared_read_only_domain():
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    first, second = cold_decide(snapshot), decide(snapshot)
    index = InventoryIndex._last
    one_node = [admission for admission in first.admissions if len({pod.node for pod in admission.pods}) == 1]
    assert one_node
    for admission, again in zip(first.admissions, second.admissions, strict=True):
        if admission not in one_node:
            continue
        node = index.node_index[admission.pods[0].node]
        assert admission.domain == {level: index.node_domains[position][node][-1] for position, level in
                                    enumerate(snapshot.levels)}  # fmt: skip
        assert again.domain is admission.domain, "made once per node and inventory, not per cycle"
        with pytest.raises(TypeError):
            admission.domain["rack"] = "elsewhere"


def test_it_reuses_the_index_for_new_work_on_the_same_inventory():
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    cold_decide(snapshot)
    reused = InventoryIndex._last
    fewer = dataclasses.replace(snapshot, pending=snapshot.pending[:100], now=snapshot.now + 60)

    result = decide(fewer)

    assert InventoryIndex._last is reused
    assert result == cold_decide(fewer)


def test_it_builds_a_new_index_for_an_equal_but_other_inventory():
    """Identity, not equality, is the key: an equal copy could hide a stale index's bugs and costs
    the comparison of 100k devices; it simply gets a fresh index."""
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    decide(snapshot)
    first = InventoryIndex._last
    copied = dataclasses.replace(snapshot, devices=tuple(list(snapshot.devices)))

    assert copied.devices is not snapshot.devices
    decide(copied)

    assert InventoryIndex._last is not first


def test_it_builds_a_new_index_when_a_device_changed():
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    decide(snapshot)
    broken = snapshot.devices[0]
    devices = (dataclasses.replace(broken, healthy=False), *snapshot.devices[1:])
    changed = dataclasses.replace(snapshot, devices=devices)

    result = decide(changed)

    used = {device_id for a in result.admissions for pod in a.pods for device_id in pod.device_ids}
    assert broken.id not in used
    assert result == cold_decide(changed)


def test_it_builds_a_new_index_when_the_device_classes_change():
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    decide(snapshot)
    first = InventoryIndex._last
    classes = (*snapshot.device_classes, DeviceClass(name="zz-everything", selector="true"))
    reclassed = dataclasses.replace(snapshot, device_classes=classes)

    decide(reclassed)

    assert InventoryIndex._last is not first
    assert "zz-everything" in InventoryIndex._last.class_names


def test_it_keeps_one_as_built_cluster_per_inventory_untouched_by_cycles():
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    cold_decide(snapshot)
    built = InventoryIndex._last.as_built()

    decide(snapshot)

    assert InventoryIndex._last.as_built() is built
    assert all(slot.holder is None for slot in built.slots), "no cycle holds the as-built cluster's devices"
    assert built.total_free == InventoryIndex._last.class_devices


def test_it_orders_devices_by_node_then_natural_device_id_whatever_the_input_order():
    snapshot = synthetic_snapshot(nodes=12, pending=0, seed=3)
    odd = [
        dataclasses.replace(snapshot.devices[0], id=f"{snapshot.devices[0].node}/{name}")
        for name in ("gpu10", "gpu2", "b", "a/3")
    ]
    devices = list(snapshot.devices) + odd + [dataclasses.replace(snapshot.devices[5], id="extra/1", node="n00100")]
    random.Random(4).shuffle(devices)
    snapshot = dataclasses.replace(snapshot, devices=tuple(devices))
    cycle = Cycle(snapshot)

    index = InventoryIndex(snapshot, cycle.matcher, cycle.class_names)

    expected = sorted(devices, key=lambda device: (index.node_index[device.node], _device_key(device.id)))
    assert index.device_ids == [device.id for device in expected]
    assert index.node_names[:3] == ["n00000", "n00001", "n00002"] and index.node_names[-1] == "n00100"


# --- patched for a change of what devices and nodes say of themselves ---------------------------------


def index_fields(index):
    return (
        index.levels,
        index.class_names,
        index.node_names,
        index.node_schedulable,
        index.node_domains,
        index.domain_nodes,
        index.device_ids,
        index.device_rows,
        index.class_alias,
        index.class_devices,
    )


def new_build(snapshot):
    cycle = Cycle(snapshot)
    return InventoryIndex(snapshot, cycle.matcher, cycle.class_names)


def changed_inventory(snapshot, seed):
    """`snapshot` with a few devices changed in place (health, taints, attributes that move a device to
    another class) and a node cordoned or uncordoned; every other record the very same object."""
    chance = random.Random(seed)
    devices = list(snapshot.devices)
    for position in chance.sample(range(len(devices)), 6):
        device = devices[position]
        change = chance.choice(("health", "taint", "attributes"))
        if change == "health":
            devices[position] = dataclasses.replace(device, healthy=not device.healthy)
        elif change == "taint":
            taints = () if device.taints else (Taint("maintenance", "true", "NoSchedule"),)
            devices[position] = dataclasses.replace(device, taints=taints)
        else:
            model = "A100" if device.attributes["model"] == "H100" else "H100"
            devices[position] = dataclasses.replace(device, attributes={**device.attributes, "model": model})
    nodes = list(snapshot.nodes)
    position = chance.randrange(len(nodes))
    nodes[position] = dataclasses.replace(nodes[position], schedulable=not nodes[position].schedulable)
    return dataclasses.replace(snapshot, devices=tuple(devices), nodes=tuple(nodes))


@pytest.mark.parametrize("seed", range(6))
def test_it_patches_the_index_for_changed_health_taints_attributes_and_cordons(seed):
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    cold_decide(snapshot)
    decide(snapshot)  # leaves a spare set of device records to move over
    first = InventoryIndex._last
    changed = changed_inventory(snapshot, seed)

    result = decide(changed)

    patched = InventoryIndex._last
    assert patched is not first and patched.device_ids is first.device_ids, "patched, not built anew"
    assert index_fields(patched) == index_fields(new_build(changed))
    assert result == cold_decide(changed)


def test_it_decides_a_sequence_of_changes_as_new_builds_do():
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=12)
    cold_decide(snapshot)
    for step in range(5):
        snapshot = changed_inventory(snapshot, 100 + step)
        snapshot = dataclasses.replace(snapshot, now=snapshot.now + 60)
        patched = decide(snapshot)
        spare = InventoryIndex._last
        assert patched == cold_decide(snapshot), f"step {step}"
        InventoryIndex._last = spare  # back to the patched chain


def test_it_keeps_the_as_built_cluster_when_no_device_changed_class():
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    cold_decide(snapshot)
    built = InventoryIndex._last.as_built()
    devices = list(snapshot.devices)
    devices[3] = dataclasses.replace(devices[3], healthy=not devices[3].healthy)

    decide(dataclasses.replace(snapshot, devices=tuple(devices)))

    assert InventoryIndex._last.as_built() is built
    fresh = new_build(dataclasses.replace(snapshot, devices=tuple(devices))).as_built()
    assert [(s.id, s.classes, s.category, s.taints) for s in built.slots] == [
        (s.id, s.classes, s.category, s.taints) for s in fresh.slots
    ]


@pytest.mark.parametrize(
    "change",
    ["rename a device", "move a device", "add a device", "move a node", "rename a node"],
)
def test_it_builds_anew_when_the_inventory_structure_changed(change):
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=11)
    cold_decide(snapshot)
    first = InventoryIndex._last
    devices, nodes = list(snapshot.devices), list(snapshot.nodes)
    if change == "rename a device":
        devices[0] = dataclasses.replace(devices[0], id=devices[0].node + "/renamed")
    elif change == "move a device":
        devices[0] = dataclasses.replace(devices[0], node=nodes[1].name, id=nodes[1].name + "/moved")
    elif change == "add a device":
        devices.append(dataclasses.replace(devices[0], id=devices[0].node + "/extra"))
    elif change == "move a node":
        nodes[0] = dataclasses.replace(nodes[0], domains={**nodes[0].domains, "rack": "elsewhere"})
    else:
        nodes[0] = dataclasses.replace(nodes[0], name="renamed")
    changed = dataclasses.replace(snapshot, devices=tuple(devices), nodes=tuple(nodes))

    result = decide(changed)

    assert InventoryIndex._last.device_ids is not first.device_ids, "built anew"
    assert index_fields(InventoryIndex._last) == index_fields(new_build(changed))
    assert result == cold_decide(changed)


def test_it_warms_up_with_the_cluster_as_built_made_and_the_same_decisions_after():
    snapshot = synthetic_snapshot(nodes=32, pending=40, seed=11)
    InventoryIndex._last = None

    warm(snapshot)

    assert InventoryIndex._last._as_built is not None, "made before any cycle asks"
    assert decide(snapshot) == cold_decide(snapshot)
