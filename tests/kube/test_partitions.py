"""Partitions synced from a cluster are never double-booked: a GPU published whole and cut in two halves,
all consuming its shared counter set, is given out either whole or as halves, never both."""

from broker.cycle.runner import run_once
from broker.kube.applier import Applier
from broker.kube.sync import WORK
from broker.workloads.states import HOLDING_STATES, State
from tests.kube.helpers import bound_nodes, held, submit

PODS = next(resource for resource in WORK if resource.name == "pods")


def test_it_gives_a_gpu_whole_or_as_halves_never_both(sync, mig):
    whole = submit(sync, mig, "whole", "training", "h100")
    assert whole.state == State.RUNNING and held(whole) == ["gpu-0"]
    half = submit(sync, mig, "half", "inference", "h100-half")
    assert half.state == State.PENDING, "the GPU's memory is all taken by the whole device"
    assert not bound_nodes(mig, "half-")["half-0"]
    assert not (mig.get("ResourceClaim", "half-0-gpus", "ml").get("status") or {}).get("allocation")

    # The whole GPU's pod ends: the halves are free, both of them.
    mig.delete("Pod", "whole-0", "ml")
    sync.watch_once(PODS, sync.cursor(PODS))
    run_once()
    Applier().drain()
    half.refresh_from_db()
    assert half.state in HOLDING_STATES and len(held(half)) == 1
    other = submit(sync, mig, "other-half", "inference", "h100-half")
    assert other.state in HOLDING_STATES and held(half) + held(other) == ["gpu-0-half-0", "gpu-0-half-1"]
    again = submit(sync, mig, "whole-again", "training", "h100")
    assert again.state == State.PENDING, "the halves hold the GPU's memory"
