"""Estimated starts: a placement that failed since the last release is not tried again for another
queue's workload of the same shape, and the estimates are the ones trying every time gives."""

import pytest

from broker.scheduler import estimate
from broker.scheduler.cycle import decide
from broker.scheduler.synthetic import synthetic_snapshot


@pytest.mark.parametrize("seed", [3, 8])
def test_it_estimates_as_if_every_placement_were_tried(monkeypatch, seed):
    sizes = (1, 1, 2, 4, 8, 16, 32, 64)
    snapshot = synthetic_snapshot(nodes=64, pending=1500, seed=seed, busy=0.9, sizes=sizes)
    skipped = []
    key_of = estimate._placement_key

    def counted_key(cycle, request, class_name, excluded):
        key = key_of(cycle, request, class_name, excluded)
        return skipped.append(key) or key

    monkeypatch.setattr(estimate, "_placement_key", counted_key)
    remembered = decide(snapshot)
    assert len(skipped) > len(set(skipped)), "no placement was asked twice: nothing tested"
    monkeypatch.setattr(estimate, "_placement_key", lambda *_: None)
    assert decide(snapshot) == remembered
    assert any(decision.estimated_start is not None for decision in remembered.pending)
