"""Pending work of one queue is handed out in within_queue_key order, however it is sorted."""

import random
from dataclasses import replace

from broker.scheduler.ordering import _in_queue_order, within_queue_key
from broker.scheduler.synthetic import synthetic_snapshot


def test_it_orders_as_within_queue_key_with_many_ties():
    chance = random.Random(5)
    pending = synthetic_snapshot(nodes=4, pending=400, seed=9).pending
    # Few distinct priorities and submission times, so the later keys decide often.
    tied = [
        replace(workload, priority=chance.choice((-1, 0, 5)), submitted=float(chance.choice((0, 10, 20))))
        for workload in pending
    ]
    chance.shuffle(tied)

    assert _in_queue_order(tied) == sorted(tied, key=within_queue_key)
    assert [w.id for w in _in_queue_order(tied)] != [w.id for w in sorted(tied, key=lambda w: w.id)]
