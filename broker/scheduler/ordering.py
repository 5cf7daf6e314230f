"""The order in which pending workloads are considered.

Between queues: fair share. The next workload comes from the queue with the lowest dominant resource
share (max over device classes of usage / nominal quota, divided by the queue's weight), recomputed after
every admission, so a queue that just got devices steps back. Inside a queue: priority (high first), then
submission time (old first), then id. Queues with unlimited or zero nominal quota for a class are measured
against the cluster's capacity of that class instead.
"""

from __future__ import annotations

import heapq

from broker.scheduler.snapshot import PendingWorkload, Queue


def within_queue_key(workload: PendingWorkload) -> tuple:
    return (-workload.priority, workload.submitted, workload.id)


class ShareBook:
    """Usage per queue and device class, and the dominant resource share it gives."""

    def __init__(self, queues: tuple[Queue, ...], class_capacity: dict[str, int]):
        self._queues = {queue.name: queue for queue in queues}
        self._capacity = class_capacity
        self._usage: dict[str, dict[str, int]] = {}

    def add(self, queue: str, device_class: str, amount: int) -> None:
        usage = self._usage.setdefault(queue, {})
        usage[device_class] = usage.get(device_class, 0) + amount

    def share(self, queue_name: str) -> float:
        queue = self._queues.get(queue_name)
        usage = self._usage.get(queue_name, {})
        if queue is None or not usage:
            return 0.0
        quota = queue.quota or {}
        dominant = 0.0
        for device_class, used in usage.items():  # a maximum: the order of the classes cannot change it
            base = quota.get(device_class) or self._capacity.get(device_class) or 1
            share = used / base
            if share > dominant:
                dominant = share
        return dominant / (queue.weight if queue.weight > 0 else 1e-9)


class FairShareOrder:
    """Hands out pending workloads one at a time; call `requeue` after deciding each one."""

    def __init__(self, by_queue: dict[str, list[PendingWorkload]], book: ShareBook):
        self._book = book
        self._queues = {name: sorted(items, key=within_queue_key) for name, items in by_queue.items()}
        self._next = dict.fromkeys(self._queues, 0)
        self._heap = [(book.share(name), name) for name in sorted(self._queues)]
        heapq.heapify(self._heap)

    def pop(self) -> PendingWorkload | None:
        if not self._heap:
            return None
        _, queue = heapq.heappop(self._heap)
        position = self._next[queue]
        self._next[queue] = position + 1
        return self._queues[queue][position]

    def requeue(self, queue: str) -> None:
        if self._next[queue] < len(self._queues[queue]):
            heapq.heappush(self._heap, (self._book.share(queue), queue))

    def __iter__(self):
        while True:
            workload = self.pop()
            if workload is None:
                return
            yield workload
            self.requeue(workload.queue)
