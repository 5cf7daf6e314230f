"""Workloads of one shape share one decision: the result is the one explaining each alone gives."""

from dataclasses import replace

import pytest

from broker.scheduler.cycle import decide
from broker.scheduler.explanation import Assessor
from broker.scheduler.snapshot import SchedulerConfig
from broker.scheduler.synthetic import synthetic_snapshot


def crowded_snapshot(seed: int):
    """Saturated, a head of the line holding nodes, workloads of one queue in different classes or teams,
    quota suggestions verified without re-runs: many workloads of one shape, decided in different ways."""
    # One protected head: deeper backfill splits shapes by which heads a duration lets them pass.
    config = SchedulerConfig(rerun_verification_limit=0, backfill_depth=1)
    sizes = (1, 1, 2, 4, 8, 16, 32, 64)
    snapshot = synthetic_snapshot(nodes=64, pending=1500, seed=seed, busy=0.9, sizes=sizes, config=config)
    pending = tuple(varied(workload, index) for index, workload in enumerate(snapshot.pending))
    return replace(snapshot, pending=pending)


def varied(workload, index: int):
    """Workloads differing from others of their queue and resource class only in classes or team."""
    if index % 7 == 0:
        return replace(workload, resource_class=None, pod_sets=with_classes(workload.pod_sets, "big-memory"))
    if index % 7 == 1 and workload.resource_class == "batch":
        return replace(workload, pod_sets=with_classes(workload.pod_sets, "a100"))
    if index % 7 == 2:
        return replace(workload, team="guests")
    return workload


def with_classes(pod_sets, *classes):
    return tuple(replace(pod_set, device_classes=classes) for pod_set in pod_sets)


@pytest.mark.parametrize("seed", [11, 13])
def test_it_explains_workloads_of_one_shape_as_each_alone(monkeypatch, seed):
    snapshot = crowded_snapshot(seed)
    shared = decide(snapshot)
    made = []
    decide_one = Assessor._decide
    monkeypatch.setattr(Assessor, "_decide", lambda self, outcome: made.append(1) or decide_one(self, outcome))
    decide(snapshot)
    assert len(made) < len(shared.pending) * 0.75, "too few workloads of one shape to test sharing"
    monkeypatch.setattr(Assessor, "shape_decision", lambda self, outcome: decide_one(self, outcome))
    assert decide(snapshot) == shared
