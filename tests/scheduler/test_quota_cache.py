"""What the quota tree remembers between usage changes answers as a tree built fresh with that usage."""

import random

from broker.scheduler.quota import QuotaTree
from broker.scheduler.snapshot import Cohort, Queue

CLASSES = ("h100", "a100")


def world():
    cohorts = (Cohort("org"), Cohort("east", parent="org", lending_limit={"h100": 4}), Cohort("west"))
    queues = (
        Queue("a", team="a", cohort="east", quota={"h100": 8, "a100": 4}, borrowing_limit={"h100": 6}),
        Queue("b", team="b", cohort="east", quota={"h100": 4}, lending_limit={"h100": 2}),
        Queue("c", team="c", cohort="org", quota={"a100": 8}),
        Queue("d", team="d", cohort="west", quota={"h100": 16, "a100": 2}),
        Queue("e", team="e", cohort="west", quota={"h100": 0}),
    )
    return queues, cohorts


def test_it_answers_as_a_fresh_tree_after_every_change():
    queues, cohorts = world()
    chance = random.Random(7)
    kept = QuotaTree(queues, cohorts)
    usage = []
    for _ in range(300):
        queue, device_class = chance.choice(queues).name, chance.choice(CLASSES)
        amount = chance.randint(1, 5)
        kept.add_usage(queue, device_class, amount)
        usage.append((queue, device_class, amount))
        fresh = QuotaTree(queues, cohorts)
        for entry in usage:
            fresh.add_usage(*entry)
        for other in queues:
            for name in CLASSES:
                assert kept.available(other.name, name) == fresh.available(other.name, name), (other.name, name)
