"""Snapshot variations shared by the tests of the victim search and its shortcuts."""

from dataclasses import replace

WITHIN_QUEUE = ("LowerOrNewerEqualPriority", "LowerPriority", "Never")
RECLAIM = ("Any", "LowerPriority", "Never")


def every_preemption_policy(queues):
    """The queues with the within-queue and cohort-reclaim policies taken in turn, so that one cluster
    holds every pairing of them."""
    return tuple(
        replace(queue, within_queue=WITHIN_QUEUE[index % 3], reclaim_within_cohort=RECLAIM[index % 3 - 1])
        for index, queue in enumerate(queues)
    )
