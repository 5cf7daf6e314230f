"""The order in which pending workloads are considered.

Between queues: fair share. The next workload comes from the queue with the lowest dominant resource
share (max over device classes of usage / nominal quota, divided by the queue's weight), recomputed after
every admission, so a queue that just got devices steps back. Inside a queue: priority (high first), then
submission time (old first), then id. Queues with unlimited or zero nominal quota for a class are measured
against the cluster's capacity of that class instead.

With `SchedulerConfig.shortest_first_aging_seconds` set, equal-priority work of a queue is ordered by its
expected device-time instead of its age, shortest first (as SRTF serves short jobs), on a log scale from
which every `aging` seconds of waiting subtract one: a job ten times longer than another overtakes it
after 2.3 × aging seconds more waiting, so none waits forever behind a stream of shorter ones.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from operator import attrgetter

from broker.scheduler.snapshot import PendingWorkload, Queue


def within_queue_key(workload: PendingWorkload) -> tuple:
    return (-workload.priority, workload.submitted, workload.id)


# A workload of unknown duration ranks as if it ran this long: after known short work, before known long work.
UNKNOWN_DURATION_SECONDS = 86400.0


def expected_device_seconds(workload: PendingWorkload) -> float:
    devices = sum(pod_set.count * pod_set.devices_per_pod for pod_set in workload.pod_sets)
    duration = workload.expected_duration if workload.expected_duration else UNKNOWN_DURATION_SECONDS
    return max(1, devices) * max(1.0, duration)


def shortest_first_key(now: float, aging: float) -> Callable[[PendingWorkload], tuple]:
    """The within-queue key of shortest-first order with aging (see the module's docstring)."""

    def key(workload: PendingWorkload) -> tuple:
        waited = max(0.0, now - workload.submitted)
        rank = math.log(expected_device_seconds(workload)) - waited / aging
        return (-workload.priority, rank, workload.submitted, workload.id)

    return key


def _in_queue_order(workloads: list[PendingWorkload]) -> list[PendingWorkload]:
    """`sorted(workloads, key=within_queue_key)` as three stable sorts, least significant key first, on
    attribute getters: no key tuple is built for each of the tens of thousands of pending workloads."""
    ordered = sorted(workloads, key=attrgetter("id"))
    ordered.sort(key=attrgetter("submitted"))
    ordered.sort(key=attrgetter("priority"), reverse=True)  # reverse keeps equal ones in order
    return ordered


class ShareBook:
    """Usage per queue and device class, and the dominant resource share it gives."""

    def __init__(self, queues: tuple[Queue, ...], class_capacity: dict[str, int]):
        self._capacity = class_capacity
        self._usage: dict[str, dict[str, int]] = {}
        # Fair share asks for a queue's share after every admission: it is kept up to date as usage is added
        # instead of being recomputed over all the queue's classes each time.
        self._terms = {queue.name: (queue.quota or {}, queue.weight if queue.weight > 0 else 1e-9) for queue in queues}
        self._dominant: dict[str, float] = {}
        self._shares: dict[str, float] = {}

    def add(self, queue: str, device_class: str, amount: int) -> None:
        usage = self._usage.get(queue)
        if usage is None:
            usage = self._usage[queue] = {}
        used = usage[device_class] = usage.get(device_class, 0) + amount
        terms = self._terms.get(queue)
        if terms is None:
            return
        quota, weight = terms
        if amount < 0:
            # Usage given back may lower the dominant class's share: only a full recount finds the new maximum.
            dominant = 0.0
            for name, held in usage.items():  # a maximum: the order of the classes cannot change it
                share = held / (quota.get(name) or self._capacity.get(name) or 1)
                if share > dominant:
                    dominant = share
        else:
            # Only this class's share grew: the maximum is the old one or this share.
            dominant = self._dominant.get(queue, 0.0)
            share = used / (quota.get(device_class) or self._capacity.get(device_class) or 1)
            if share > dominant:
                dominant = share
        self._dominant[queue] = dominant
        self._shares[queue] = dominant / weight

    def share(self, queue_name: str) -> float:
        return self._shares.get(queue_name, 0.0)


class FairShareOrder:
    """Hands out pending workloads one at a time, by iteration: the next one is chosen only after the
    caller decided the previous one, so an admission's usage already counts in its queue's share."""

    def __init__(self, by_queue: dict[str, list[PendingWorkload]], book: ShareBook, within_queue=None):
        """`within_queue`: a key function ordering a queue's work (None: priority, then age)."""
        self._book = book
        if within_queue is None:
            self._queues = {name: _in_queue_order(items) for name, items in by_queue.items()}
        else:
            self._queues = {name: sorted(items, key=within_queue) for name, items in by_queue.items()}
        self._next = dict.fromkeys(self._queues, 0)
        self._heap = [(book.share(name), name) for name in sorted(self._queues)]
        heapq.heapify(self._heap)

    def __iter__(self):
        heap = self._heap
        queues = self._queues
        positions = self._next
        share = self._book.share
        while heap:
            _, queue = heapq.heappop(heap)
            position = positions[queue]
            positions[queue] = position + 1
            yield queues[queue][position]
            if position + 1 < len(queues[queue]):
                heapq.heappush(heap, (share(queue), queue))
