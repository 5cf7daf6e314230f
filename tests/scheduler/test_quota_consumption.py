"""Quota counts what an allocation consumes (issue 26): a partition its share of the GPU, a time-slice
its share of the capacity, a several-request claim's devices each under its request's class."""

from dataclasses import replace

from broker.scheduler.quota import Consumption
from broker.scheduler.snapshot import CounterSet, Device, RunningPod, RunningWorkload

GPU_SET = CounterSet("gpu-0", "n1", {"memory": 80, "compute": 7})


def test_it_counts_a_partition_by_the_largest_fraction_of_a_counter_it_takes():
    devices = (
        Device("n1/0", "n1", consumes_counters={"gpu-0": {"memory": 80, "compute": 7}}),
        Device("n1/0:1g", "n1", consumes_counters={"gpu-0": {"memory": 10, "compute": 1}}),
        Device("n1/0:3g", "n1", consumes_counters={"gpu-0": {"memory": 40, "compute": 3}}),
        Device("n2/0", "n2"),
    )
    consumption = Consumption(devices, (GPU_SET,))

    assert consumption.of("n1/0") == 1
    assert consumption.of("n1/0:1g") == 1 / 7  # compute binds: 1/7 > 10/80
    assert consumption.of("n1/0:3g") == 40 / 80  # memory binds: 1/2 > 3/7
    assert consumption.of("n2/0") == 1
    assert consumption.smallest == 1 / 7
    assert not consumption.whole


def test_it_counts_a_time_slice_by_its_share_of_the_capacity_and_a_claim_by_class():
    devices = (
        Device("n1/0", "n1", capacity={"memory": 80, "bandwidth": 100}, allow_multiple_allocations=True),
        Device("n1/nic", "n1"),
    )
    consumption = Consumption(devices, ())
    sliced = RunningWorkload(
        "w", "q", (RunningPod("main", 0, "n1", ("n1/0",), (("memory", 20), ("bandwidth", 50))),), "t4"
    )
    claim = RunningWorkload(
        "c", "q", (RunningPod("main", 0, "n1", ("n1/0", "n1/nic")),), "t4", device_classes=(("n1/nic", "nic"),)
    )

    assert consumption.of_running(sliced) == {"t4": 0.5}  # bandwidth binds: 50/100 > 20/80
    assert consumption.of_running(claim) == {"t4": 1, "nic": 1}
    assert Consumption((Device("n1/0", "n1"),), ()).whole


def test_it_keeps_each_running_records_charges_for_the_next_cycle_only_while_it_runs():
    """The loader hands a cycle the same record for work that did not change: its charges are kept from
    one cycle to the next, a new record (changed work) is charged anew, and a record gone is dropped."""
    devices = (Device("n1/0", "n1", consumes_counters={"gpu-0": {"memory": 10, "compute": 1}}), Device("n1/1", "n1"))
    consumption = Consumption(devices, (GPU_SET,))
    slice_holder = RunningWorkload("a", "q", (RunningPod("main", 0, "n1", ("n1/0",)),), "gpu")
    whole_holder = RunningWorkload("b", "q", (RunningPod("main", 0, "n1", ("n1/1",)),), "gpu")

    first = dict(consumption.of_every_running((slice_holder, whole_holder)))
    assert first == {slice_holder: {"gpu": 1 / 7}, whole_holder: {"gpu": 1}}
    changed = RunningWorkload("b", "q", (RunningPod("main", 0, "n1", ("n1/0", "n1/1")),), "gpu")
    second = dict(consumption.of_every_running((slice_holder, changed)))

    assert second[slice_holder] is first[slice_holder], "an unchanged record is not charged again"
    assert second[changed] == {"gpu": 1 + 1 / 7}
    assert consumption.of_running(changed) is second[changed]
    assert consumption.of_running(whole_holder) == {"gpu": 1}, "a record gone is charged from its devices"
    assert all(record is not whole_holder for record, _ in consumption._running.values())


def test_it_answers_a_changed_inventory_as_one_made_anew_keeping_what_its_kept_devices_said():
    """A health change swaps one device record and keeps the others: the new Consumption reads only the
    swapped one, and keeps the running records' charges while the shares stay."""
    devices = (
        Device("n1/0", "n1"),
        Device("n1/0:1g", "n1", consumes_counters={"gpu-0": {"memory": 10, "compute": 1}}),
        Device("n1/0:3g", "n1", consumes_counters={"gpu-0": {"memory": 40, "compute": 3}}),
        Device("n1/nic", "n1", capacity={"bandwidth": 100}, allow_multiple_allocations=True),
    )
    before = Consumption(devices, (GPU_SET,))
    holder = RunningWorkload("a", "q", (RunningPod("main", 0, "n1", ("n1/0:3g",)),), "gpu")
    [(_, charges)] = before.of_every_running((holder,))

    flapped = (devices[0], replace(devices[1], healthy=False), *devices[2:])
    after = Consumption(flapped, (GPU_SET,), before=before)
    assert (after.shares, after.capacities, after.smallest) == (before.shares, before.capacities, 1 / 7)
    [(_, kept)] = after.of_every_running((holder,))
    assert kept is charges, "the shares stayed: the running record is not charged again"

    # A swapped record that consumes another profile: its share is read anew, and the charges too.
    recut = (devices[0], devices[1], replace(devices[2], consumes_counters={"gpu-0": {"memory": 20}}), devices[3])
    again = Consumption(recut, (GPU_SET,), before=after)
    fresh = Consumption(recut, (GPU_SET,))
    assert (again.shares, again.capacities, again.smallest) == (fresh.shares, fresh.capacities, fresh.smallest)
    assert dict(again.of_every_running((holder,))) == {holder: {"gpu": 20 / 80}}

    # A device more (or fewer), or other counter sets: everything is read anew.
    grown = Consumption((*recut, Device("n2/0", "n2")), (GPU_SET,), before=again)
    assert grown.shares == fresh.shares and grown.of("n2/0") == 1
    bigger = CounterSet("gpu-0", "n1", {"memory": 160, "compute": 7})
    resized = Consumption(recut, (bigger,), before=again)
    assert resized.shares == Consumption(recut, (bigger,)).shares
    assert dict(resized.of_every_running((holder,))) == {holder: {"gpu": 20 / 160}}
