"""The per-inventory index the cycle keeps between snapshots that carry the same inventory tuples."""

import dataclasses
import random

from broker.scheduler.capacity import InventoryIndex, _device_key
from broker.scheduler.cycle import Cycle, decide
from broker.scheduler.snapshot import DeviceClass
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
