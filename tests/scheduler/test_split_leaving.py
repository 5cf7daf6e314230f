"""A running workload whose pods are being evicted (Pod disruption mode), as the snapshot sees it."""

from broker.scheduler.snapshot import RunningPod, RunningWorkload, leaving_id, split_leaving


def elastic():
    pods = tuple(RunningPod("main", index, "n1", (f"n1/{index}",)) for index in range(4))
    return RunningWorkload("w", "q", pods, "h100", disruption="Pod", min_counts=(("main", 2),))


def test_it_splits_the_leaving_pods_off_as_an_evicting_record_held_for_the_preemptor():
    staying, going = split_leaving(elastic(), {("main", 2), ("main", 3)}, "p")
    assert (staying.id, [pod.index for pod in staying.pods], staying.evicting) == ("w", [0, 1], False)
    assert (going.id, going.part_of, going.workload_id) == (leaving_id("w"), "w", "w")
    assert ([pod.index for pod in going.pods], going.evicting, going.evicted_for) == ([2, 3], True, "p")
    assert staying.surplus_pods == () and going.surplus_pods == ()  # at its minimum; leaving pods never shrink


def test_it_keeps_a_workload_with_no_leaving_pods_as_it_is():
    workload = elastic()
    assert split_leaving(workload, set(), "p") == (workload,)
    assert [pod.index for pod in workload.surplus_pods] == [2, 3]


def test_it_makes_a_workload_whose_every_pod_leaves_an_evicting_whole():
    (whole,) = split_leaving(elastic(), {("main", index) for index in range(4)}, "p")
    assert (whole.id, len(whole.pods), whole.evicting, whole.evicted_for, whole.part_of) == ("w", 4, True, "p", None)
