"""Capacity accounting of shared devices (issue 26): each allocation counts for the share of the device
it consumes, and what the shares leave of a device is free capacity, placed by the free-device rules."""

from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings

from broker.scheduler.accounting import SHARE_SCALE, capacity_by_class, device_share
from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import (
    Admission,
    CycleResult,
    Device,
    DeviceClass,
    Node,
    PendingWorkload,
    PodPlacement,
    PodSet,
    Queue,
    ResourceClass,
    RunningPod,
    RunningWorkload,
    Snapshot,
    Taint,
)
from tests.scheduler.test_sharing_properties import scenarios as sharing_scenarios

GPU = DeviceClass("gpu", match={"model": "H100"})
MEMORY = {"memory": 80, "compute": 100}


@pytest.mark.parametrize(
    ("consumed", "share"),
    [
        ({"memory": 40}, Fraction(1, 2)),
        ({"memory": 20, "compute": 50}, Fraction(1, 2)),  # the capacity that dominates: compute
        ({"memory": 60, "compute": 10}, Fraction(3, 4)),  # here memory
        ({"memory": 100}, Fraction(1)),  # never more than the device
        ({"bandwidth": 5}, Fraction(1)),  # takes nothing the device publishes: held whole, as quota says
        ({"memory": 80 / 3}, Fraction(333_333, SHARE_SCALE)),  # rounded down to a millionth
        ({"memory": 0.5, "encoders": 1}, Fraction(1, 160)),  # a capacity the device lacks counts for nothing
    ],
)
def test_it_counts_an_allocation_by_the_capacity_it_takes_most_of(consumed, share):
    assert device_share(MEMORY, consumed) == share
    assert device_share(MEMORY, tuple(consumed.items())) == share


def shared_scene(pods, healthy=True, taints=(), pending=(), admissions=(), schedulable=True):
    """n1: n1/0 shared (80 memory, 100 compute), n1/1 and n1/2 whole; `pods`: running pods' consumed
    amounts on n1/0, one workload each."""
    devices = (
        Device(
            "n1/0",
            "n1",
            attributes={"model": "H100"},
            capacity=dict(MEMORY),
            allow_multiple_allocations=True,
            healthy=healthy,
            taints=taints,
        ),
        Device("n1/1", "n1", attributes={"model": "H100"}),
        Device("n1/2", "n1", attributes={"model": "H100"}),
    )
    running = tuple(
        RunningWorkload(f"run-{index}", "q1", (RunningPod("main", 0, "n1", ("n1/0",), tuple(amounts.items())),), "gpu")
        for index, amounts in enumerate(pods)
    )
    snapshot = Snapshot(
        nodes=(Node("n1", schedulable=schedulable),),
        devices=devices,
        device_classes=(GPU,),
        queues=(Queue("q1", "team1"),),
        resource_classes=(ResourceClass("sliced", ("gpu",), sharing="TimeSliced"),),
        running=running,
        pending=tuple(pending),
    )
    [row] = capacity_by_class(snapshot, CycleResult(admissions=tuple(admissions)))
    return row


def billed(row):
    """What the class bills once its allocations' shares are known: the sample's whole devices, with the
    excess of over-counted shared devices."""
    return row.total + row.shared.get("over", 0)


def test_it_counts_a_device_two_halves_use_once_with_nothing_left():
    row = shared_scene([{"memory": 40}, {"memory": 40}])
    assert (row.total, row.busy, row.idle) == (3, 1, 2)
    assert row.shared == {}


def test_it_counts_what_one_share_leaves_of_a_healthy_device_as_idle():
    row = shared_scene([{"memory": 20}])
    assert (row.total, row.busy, row.idle) == (3, 1, 2)
    assert row.shared == {"idle": Fraction(3, 4)}


def test_it_counts_an_admitted_share_as_running_ones():
    admission = Admission("new", "gpu", (PodPlacement("main", 0, "n1", ("n1/0",), consumed=(("memory", 60),)),))
    row = shared_scene([{"memory": 10}], admissions=[admission])
    assert row.shared == {"idle": Fraction(1, 8)}


@pytest.mark.parametrize(
    ("fields", "node_schedulable"),
    [
        ({"healthy": False}, True),
        ({"taints": (Taint("xid", effect="NoSchedule"),)}, True),
        ({}, False),  # cordoned node
    ],
)
def test_it_counts_what_is_left_of_a_device_that_takes_no_new_work_as_unhealthy(fields, node_schedulable):
    row = shared_scene([{"memory": 20}], schedulable=node_schedulable, **fields)
    assert row.shared == {"unhealthy": Fraction(3, 4)}


def waiting(amounts):
    pod_set = PodSet(devices_per_pod=1, capacity=tuple(amounts.items()))
    return PendingWorkload("waits", "q1", (pod_set,), resource_class="sliced")


def test_it_counts_a_remainder_too_small_for_every_waiting_slice_as_stranded():
    row = shared_scene([{"memory": 50}], pending=[waiting({"memory": 40})])
    assert row.shared == {"stranded": Fraction(3, 8)}


def test_it_counts_a_remainder_a_waiting_slice_fits_as_idle():
    row = shared_scene([{"memory": 50}], pending=[waiting({"memory": 40}), waiting({"memory": 30})])
    assert row.shared == {"idle": Fraction(3, 8)}


def test_it_bills_shares_dominated_by_different_capacities_past_one_device_as_over():
    row = shared_scene([{"memory": 48, "compute": 10}, {"memory": 8, "compute": 80}])
    assert row.shared == {"over": Fraction(2, 5)}  # 0.6 + 0.8 of one device
    assert billed(row) == 3 + Fraction(2, 5)


def allocated_charge(snapshot, result):
    """What the ledger bills as allocated once `result` applies: 1 per device held alone, each share of
    a shared device its share (every pod of running work and of the admissions)."""
    capacity = {device.id: device.capacity for device in snapshot.devices}
    pods = [pod for workload in snapshot.running for pod in workload.pods]
    pods += [pod for admission in result.admissions for pod in admission.pods]
    alone = {device_id for pod in pods if not pod.consumed for device_id in pod.device_ids}
    shares = sum(
        (
            device_share(capacity[device_id], pod.consumed)
            for pod in pods
            if pod.consumed
            for device_id in pod.device_ids
        ),
        Fraction(0),
    )
    return len(alone) + shares


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sharing_scenarios())
def test_it_bills_every_shared_device_once_split_between_its_shares_and_what_they_leave(snapshot):
    result = decide(snapshot)
    [row] = capacity_by_class(snapshot, result)
    assert set(row.shared) <= {"over", "unhealthy", "stranded", "idle"}
    assert all(amount > 0 and (amount * SHARE_SCALE).denominator == 1 for amount in row.shared.values())
    free = row.unhealthy + row.reserved_unused + row.stranded + row.idle
    remainders = sum(amount for category, amount in row.shared.items() if category != "over")
    # The ledger's split: allocated shares, plus the free devices and what shares leave of theirs, is
    # the capacity billed (the sample's total and what shares bill beyond one device).
    assert allocated_charge(snapshot, result) + free + remainders == billed(row)
    assert row.total == len(snapshot.devices)
