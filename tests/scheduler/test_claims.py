"""Claims with several requests (DRA DeviceClaim) in the cycle: selectors, firstAvailable order, the
request an explanation names, and the InvalidRequest for a claim that can never be valid."""

import dataclasses

from broker.scheduler.claims import Claim
from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import (
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
    Node,
    PendingWorkload,
    PodSet,
    Queue,
    SchedulerConfig,
    Snapshot,
)
from tests.scheduler.invariants import assert_valid_result

SPEED = 'device.attributes["gpu.example.com"].speed >= 200'
CLASSES = (DeviceClass("h100", match={"model": "H100"}), DeviceClass("nic", match={"kind": "nic"}))


def cluster(*pending):
    devices = [Device(f"n1/{i}", "n1", attributes={"model": "H100", "root": f"p{i // 2}"}) for i in range(4)]
    devices += [
        Device("n1/nic-0", "n1", attributes={"kind": "nic", "root": "p0", "speed": 100}),
        Device("n1/nic-1", "n1", attributes={"kind": "nic", "root": "p1", "speed": 400}),
    ]
    return Snapshot(
        nodes=(Node("n1"),), devices=tuple(devices), device_classes=CLASSES, queues=(Queue("q", "t"),),
        pending=tuple(pending),
    )  # fmt: skip


def claim(name, *requests, constraints=(), count=1):
    return PendingWorkload(name, "q", (PodSet("main", count=count, requests=requests, constraints=constraints),))


def gpus(count):
    return DeviceRequest("gpu", DeviceSubRequest("gpu", "h100", count))


def test_it_places_a_nic_its_selector_allows_under_the_gpus_root():
    fast = DeviceRequest("net", DeviceSubRequest("net", "nic", 1, (SPEED,)))
    snapshot = cluster(claim("w", gpus(2), fast, constraints=(DeviceConstraint("root"),)))
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    (pod,) = result.admissions[0].pods
    assert pod.requests == (("gpu", ("n1/2", "n1/3")), ("net", ("n1/nic-1",)))


def test_it_names_the_request_that_cannot_be_met():
    fast = DeviceRequest("net", DeviceSubRequest("net", "nic", 1, (SPEED,)))
    snapshot = cluster(
        claim("first", gpus(2), fast, constraints=(DeviceConstraint("root"),)),
        claim("second", gpus(2), fast, constraints=(DeviceConstraint("root"),)),
    )
    result = decide(snapshot)
    assert [admission.workload_id for admission in result.admissions] == ["first"]
    (decision,) = result.pending
    assert "request net: no 1 nic with the same root as 2 h100 (request gpu) free on any node" in decision.message


def test_it_takes_the_first_available_way_that_fits_and_names_it():
    ways = (DeviceSubRequest("eight", "h100", 8), DeviceSubRequest("three", "h100", 3))
    snapshot = cluster(claim("w", DeviceRequest("acc", first_available=ways)))
    result = decide(snapshot)
    (pod,) = result.admissions[0].pods
    assert pod.requests == (("acc/three", ("n1/0", "n1/1", "n1/2")),)


def test_it_refuses_a_constraint_on_an_unknown_request():
    snapshot = cluster(claim("w", gpus(1), constraints=(DeviceConstraint("root", ("nic",)),)))
    (decision,) = decide(snapshot).pending
    assert decision.reason == "InvalidRequest"
    assert decision.message == "pod set 'main': constraint on root names unknown request 'nic'"


def test_it_passes_over_a_thousand_nodes_that_cannot_hold_the_pod():
    # Every node but the last has its GPU and its NIC under different roots: the search goes node by node
    # without recursing into each (a recursion per node would exceed Python's limit) and within budget.
    devices, nodes = [], []
    for index in range(1500):
        name = f"n{index}"
        nodes.append(Node(name))
        nic_root = "p0" if index == 1499 else "p1"
        devices.append(Device(f"{name}/0", name, attributes={"model": "H100", "root": "p0"}))
        devices.append(Device(f"{name}/nic-0", name, attributes={"kind": "nic", "root": nic_root}))
    nic = DeviceRequest("net", DeviceSubRequest("net", "nic"))
    snapshot = Snapshot(
        nodes=tuple(nodes), devices=tuple(devices), device_classes=CLASSES, queues=(Queue("q", "t"),),
        pending=(claim("w", gpus(1), nic, constraints=(DeviceConstraint("root"),)),),
    )  # fmt: skip
    (admission,) = decide(snapshot).admissions
    assert admission.pods[0].device_ids == ("n1499/0", "n1499/nic-0")


def test_it_calls_a_request_of_no_way_invalid_while_large_gangs_are_sized():
    # Only a claim written past the API has one; sizing the gangs for protection must not fail on it.
    snapshot = cluster(claim("w", DeviceRequest("empty"), gpus(1)))
    snapshot = dataclasses.replace(snapshot, config=SchedulerConfig(protected_large_gangs=2, large_gang_devices=1))
    (decision,) = decide(snapshot).pending
    assert decision.reason == "InvalidRequest"
    assert decision.message == "pod set 'main': request empty: give one device class or a firstAvailable list"


def test_it_counts_the_fewest_devices_of_each_request_and_none_for_a_request_of_no_way():
    ways = (DeviceSubRequest("eight", "h100", 8), DeviceSubRequest("three", "h100", 3))
    assert Claim((DeviceRequest("acc", first_available=ways), gpus(2))).fewest_devices() == 5
    assert Claim((DeviceRequest("empty"), gpus(2))).fewest_devices() == 2
