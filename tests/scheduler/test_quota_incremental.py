"""The quota tree and the share book keep their answers up to date as usage changes (cohort usage summed
up the tree, per-tree caches of what is available, each queue's dominant share): after any sequence of
usage changes, given back too, they must answer as a from-scratch computation of Kueue's arithmetic."""

import random

import pytest

from broker.scheduler.ordering import FairShareOrder, ShareBook
from broker.scheduler.quota import QuotaCheck, QuotaTree
from broker.scheduler.snapshot import Cohort, PendingWorkload, Queue

# "t4" is named by no quota or limit anywhere: it still has answers (nothing guaranteed, all borrowed).
CLASSES = ("h100", "a100", "t4")


def limits(chance, classes=("h100", "a100"), empty=0.5):
    if chance.random() < empty:
        return None
    return {name: chance.randint(0, 12) for name in classes if chance.random() < 0.7}


def random_world(chance):
    cohorts = []
    for index in range(chance.randint(1, 6)):
        parent = chance.choice([None, *(cohort.name for cohort in cohorts)])
        cohorts.append(
            Cohort(
                f"c{index}",
                parent=parent,
                quota=limits(chance, empty=0.6) or {},
                borrowing_limit=limits(chance) if parent else None,
                lending_limit=limits(chance) if parent else None,
            )
        )
    # A queue may name a cohort nobody declared: it exists implicitly, with no quota of its own.
    cohort_names = [None, "implicit", *(cohort.name for cohort in cohorts)]
    queues = tuple(
        Queue(
            f"q{index}",
            team=f"t{index}",
            cohort=chance.choice(cohort_names),
            quota=None if chance.random() < 0.15 else (limits(chance, empty=0) or {}),
            borrowing_limit=limits(chance),
            lending_limit=limits(chance),
        )
        for index in range(chance.randint(2, 9))
    )
    return queues, tuple(cohorts)


class Reference:
    """Kueue's quota arithmetic computed from scratch, recursively, from the usage of each queue."""

    def __init__(self, queues, cohorts, usage):
        self.usage = usage  # (queue, class) -> devices
        self.parent = {}
        self.spec = {}
        self.children = {}
        for cohort in cohorts:
            self.spec["cohort:" + cohort.name] = (cohort.quota or {}, cohort.borrowing_limit, cohort.lending_limit)
            if cohort.parent:
                self.parent["cohort:" + cohort.name] = "cohort:" + cohort.parent
        for queue in queues:
            if queue.quota is None:
                continue
            self.spec[queue.name] = (queue.quota, queue.borrowing_limit, queue.lending_limit)
            if queue.cohort:
                self.parent[queue.name] = "cohort:" + queue.cohort
                self.spec.setdefault("cohort:" + queue.cohort, ({}, None, None))
        for child, parent in self.parent.items():
            self.children.setdefault(parent, []).append(child)

    def subtree(self, node, name):
        own = self.spec[node][0].get(name, 0)
        return own + sum(self.subtree(c, name) - self.guaranteed(c, name) for c in self.children.get(node, ()))

    def guaranteed(self, node, name):
        limit = (self.spec[node][2] or {}).get(name)
        return 0 if limit is None else max(0, self.subtree(node, name) - limit)

    def used(self, node, name):
        if node.startswith("cohort:"):
            return sum(max(0, self.used(c, name) - self.guaranteed(c, name)) for c in self.children.get(node, ()))
        return self.usage.get((node, name), 0)

    def available(self, node, name):
        used, subtree = self.used(node, name), self.subtree(node, name)
        parent = self.parent.get(node)
        if parent is None:
            return subtree - used
        guaranteed = self.guaranteed(node, name)
        from_parent = self.available(parent, name)
        limit = (self.spec[node][1] or {}).get(name)
        if limit is not None:
            from_parent = min(from_parent, subtree - guaranteed - max(0, used - guaranteed) + limit)
        return max(0, guaranteed - used) + from_parent

    def potential(self, node, name):
        parent = self.parent.get(node)
        if parent is None:
            return self.subtree(node, name)
        potential = self.guaranteed(node, name) + self.potential(parent, name)
        limit = (self.spec[node][1] or {}).get(name)
        return potential if limit is None else min(potential, self.subtree(node, name) + limit)

    def check(self, queue, name, requested):
        if queue not in self.spec:
            return QuotaCheck(queue, name, 0, None, 0, None, None, requested)
        used = self.usage.get((queue, name), 0)
        nominal = self.spec[queue][0].get(name, 0)
        available = max(0, self.available(queue, name))
        borrowable = max(0, available - max(0, nominal - used))
        return QuotaCheck(queue, name, used, nominal, borrowable, available, self.potential(queue, name), requested)


def assert_answers(tree, queues, cohorts, usage, asked):
    reference = Reference(queues, cohorts, usage)
    for queue, name, requested in asked:
        expected = reference.check(queue, name, requested)
        assert tree.available(queue, name) == expected.available, (queue, name, usage)
        assert tree.fits(queue, name, requested) == expected.fits, (queue, name, requested, usage)
        assert tree.check(queue, name, requested) == expected, (queue, name, usage)
        assert tree.usage(queue, name) == (usage.get((queue, name), 0) if queue in reference.spec else 0)


@pytest.mark.parametrize("seed", range(40))
def test_it_answers_as_kueue_from_scratch_after_random_usage_changes(seed):
    chance = random.Random(seed)
    queues, cohorts = random_world(chance)
    tree = QuotaTree(queues, cohorts)
    usage: dict = {}
    for _ in range(60):
        queue, name = chance.choice(queues).name, chance.choice(CLASSES)
        held = usage.get((queue, name), 0)
        # Given back as preemption and start-time estimates do: never more than the queue holds.
        amount = chance.randint(-held, 8) if chance.random() < 0.4 else chance.randint(0, 8)
        tree.add_usage(queue, name, amount)
        if tree.is_limited(queue):
            usage[(queue, name)] = held + amount
        # A few questions between changes, so that some answers are kept and some trees are left stale.
        asked = [
            (chance.choice(queues).name, chance.choice(CLASSES), chance.randint(0, 20))
            for _ in range(chance.randint(0, 4))
        ]
        assert_answers(tree, queues, cohorts, usage, asked)
    everything = [(queue.name, name, chance.randint(0, 20)) for queue in queues for name in CLASSES]
    assert_answers(tree, queues, cohorts, usage, everything)


@pytest.mark.parametrize("seed", range(20))
def test_it_checks_released_usage_as_if_given_back_and_keeps_its_state(seed):
    chance = random.Random(1000 + seed)
    queues, cohorts = random_world(chance)
    tree = QuotaTree(queues, cohorts)
    usage: dict = {}
    for _ in range(40):
        queue, name = chance.choice(queues).name, chance.choice(CLASSES)
        amount = chance.randint(0, 8)
        tree.add_usage(queue, name, amount)
        if tree.is_limited(queue):
            usage[(queue, name)] = usage.get((queue, name), 0) + amount
    limited = [queue.name for queue in queues if tree.is_limited(queue.name)]
    for _ in range(30):
        queue, name = chance.choice(queues).name, chance.choice(CLASSES)
        tree.available(queue, name)  # an answer kept from before must not survive the release
        released = {other: chance.randint(0, usage.get((other, name), 0)) for other in limited if chance.random() < 0.5}
        given_back = dict(usage)
        for other, amount in released.items():
            given_back[(other, name)] = given_back.get((other, name), 0) - amount
        requested = chance.randint(0, 20)
        assert tree.check(queue, name, requested, released) == Reference(queues, cohorts, given_back).check(
            queue, name, requested
        )
        everything = [(queue.name, name, 1) for queue in queues for name in CLASSES]
        assert_answers(tree, queues, cohorts, usage, everything)


def reference_share(queue, usage, capacity):
    if queue is None or not usage:
        return 0.0
    quota = queue.quota or {}
    dominant = max(0.0, *(used / (quota.get(name) or capacity.get(name) or 1) for name, used in usage.items()))
    return dominant / (queue.weight if queue.weight > 0 else 1e-9)


def share_queues(chance):
    return tuple(
        Queue(
            f"q{index}",
            team=f"t{index}",
            quota=None if chance.random() < 0.2 else {name: chance.randint(0, 30) for name in CLASSES[:2]},
            weight=chance.choice([0.0, 0.5, 1.0, 2.0, 3.0]),
        )
        for index in range(chance.randint(1, 7))
    )


@pytest.mark.parametrize("seed", range(40))
def test_it_keeps_each_dominant_share_as_a_recount_would(seed):
    chance = random.Random(2000 + seed)
    queues = share_queues(chance)
    capacity = {"h100": chance.randint(1, 100), "a100": chance.randint(0, 100)}  # t4: no capacity either
    book = ShareBook(queues, capacity)
    usage: dict = {}
    names = [queue.name for queue in queues] + ["unknown"]
    for _ in range(80):
        queue, name = chance.choice(names), chance.choice(CLASSES)
        held = usage.setdefault(queue, {}).get(name, 0)
        amount = chance.randint(-held, 10) if chance.random() < 0.3 else chance.randint(0, 10)
        book.add(queue, name, amount)
        usage[queue][name] = held + amount
        by_name = {queue.name: queue for queue in queues}
        for other in names:
            expected = reference_share(by_name.get(other), usage.get(other, {}), capacity)
            assert book.share(other) == expected, (other, usage)


@pytest.mark.parametrize("seed", range(20))
def test_it_hands_out_the_lowest_share_first_as_usage_is_charged(seed):
    chance = random.Random(3000 + seed)
    queues = share_queues(chance)
    capacity = {"h100": 64, "a100": 32}
    by_queue = {
        queue.name: [
            PendingWorkload(f"{queue.name}-{index}", queue.name, (), priority=chance.randint(0, 2))
            for index in range(chance.randint(1, 12))  # the cycle hands over queues with work only
        ]
        for queue in queues
    }
    charges = {
        workload.id: (chance.choice(CLASSES), chance.randint(0, 8)) for items in by_queue.values() for workload in items
    }
    book = ShareBook(queues, capacity)
    order = []
    for workload in FairShareOrder(by_queue, book):
        order.append(workload.id)
        book.add(workload.queue, *charges[workload.id])
    # By hand: the queue with the lowest share (then name) next, its share recounted after each charge.
    by_name = {queue.name: queue for queue in queues}
    usage: dict = {}
    left = {name: sorted(items, key=lambda w: (-w.priority, w.submitted, w.id)) for name, items in by_queue.items()}
    expected = []
    while any(left.values()):
        queue = min(
            (name for name, items in left.items() if items),
            key=lambda name: (reference_share(by_name[name], usage.get(name, {}), capacity), name),
        )
        workload = left[queue].pop(0)
        expected.append(workload.id)
        name, amount = charges[workload.id]
        usage.setdefault(queue, {})[name] = usage.get(queue, {}).get(name, 0) + amount
    assert order == expected
