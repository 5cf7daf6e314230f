"""Replay of the Microsoft Philly trace (../shared/data/traces/philly/philly.csv) onto the demo cluster.

Jobs are submitted in trace order (by submit time) on a clock SIMULATION_SPEED times faster than the
wall clock, through the same service the API uses, as the demo member of the job's team:

- `cluster` (the Philly virtual cluster) -> the team and its queue of the same name;
- `num_gpus` -> one pod of up to 8 devices, or ceil(n / 8) pods sharing n out equally (16 -> 2 x 8,
  12 -> 2 x 6), all of them one gang (min_count = pods);
- `duration` -> expected_duration_seconds, which the simulated executor runs on the same clock;
- the resource class by size, since the trace has no job types: >= 64 GPUs large-reserved-training
  (needs approval), > 2 distributed-training, a single GPU for <= 5 min small-inference, <= 1 h
  interactive-experiment, the rest batch-inference.

Philly kept only ~15% of its GPUs busy on average (374 of 2,490), so the demo submits jobs
REPLAY_DENSITY times more often than the trace did (the arrival clock runs SIMULATION_SPEED x
REPLAY_DENSITY) while each job still runs its real duration at SIMULATION_SPEED: the same job mix, a
cluster busy enough that queues, quotas and fragmentation show.

Restart-safe without state of its own: each workload records its trace row (trace_id "philly:000123")
and is stamped with the wall time its trace time maps to, so the last replayed workload fixes the clock.
"""

import csv
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from broker.audit.models import replaying
from broker.policy.models import Queue, ResourceClass
from broker.workloads import services
from broker.workloads.models import Workload

log = logging.getLogger(__name__)

TRACE_PREFIX = "philly:"
MAX_DEVICES_PER_POD = 8
MAX_PER_TICK = 200
# After a pause longer than this (the server was down), pick up where it stopped instead of catching up.
MAX_GAP = timedelta(minutes=10)
# The trace's first 20 days hold 74 jobs (collection was ramping up); it turns dense at 14:00 on
# 24 Sep 2017 (501 jobs in that hour), so the demo starts there rather than idling for hours.
REPLAY_START = datetime(2017, 9, 24, 14)


@dataclass(frozen=True)
class TraceJob:
    index: int
    submitted: datetime  # naive: the trace's own clock
    duration: int
    num_gpus: int
    cluster: str

    @property
    def trace_id(self):
        return f"{TRACE_PREFIX}{self.index:06d}"

    @property
    def name(self):
        return f"philly-{self.index:06d}"


def trace_path():
    return Path(settings.TRACES_DIR) / "philly" / "philly.csv"


@lru_cache(maxsize=4)
def load_jobs(path, start=REPLAY_START):
    """Every job with a cluster from `start` on, ordered by submit time (the file is not), then by row."""
    rows = []
    with open(path, newline="") as handle:
        for row_number, row in enumerate(csv.DictReader(handle)):
            if not row.get("timestamp") or not (row.get("cluster") or "").strip():
                continue
            submitted = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S")
            if start is not None and submitted < start:
                continue
            rows.append((submitted, row_number, row))
    rows.sort(key=lambda item: (item[0], item[1]))
    return tuple(
        TraceJob(
            index=index,
            submitted=submitted,
            duration=max(1, round(float(row["duration"]))),
            num_gpus=int(row["num_gpus"]),
            cluster=row["cluster"].strip(),
        )
        for index, (submitted, _, row) in enumerate(rows)
    )


def pod_shape(num_gpus):
    """(pods, devices per pod): one pod up to a node's 8 devices, else equal pods of at most 8."""
    if num_gpus <= MAX_DEVICES_PER_POD:
        return 1, num_gpus
    pods = math.ceil(num_gpus / MAX_DEVICES_PER_POD)
    return pods, math.ceil(num_gpus / pods)


def resource_class_for(num_gpus, duration):
    if num_gpus >= 64:
        return "large-reserved-training"
    if num_gpus > 2:
        return "distributed-training"
    if num_gpus == 1 and duration <= 300:
        return "small-inference"
    if duration <= 3600:
        return "interactive-experiment"
    return "batch-inference"


class PhillyReplay:
    def __init__(self, jobs, speed, next_index, anchor_trace, anchor_wall):
        self.jobs = jobs
        self.speed = float(speed)
        self.next_index = next_index
        self.anchor_trace = anchor_trace
        self.anchor_wall = anchor_wall
        self._queues = {}
        self._classes = {}
        self._actors = {}

    @classmethod
    def resume(cls, path=None, speed=None, now=None, start=REPLAY_START):
        """Continue after the last replayed workload in the database, or start at the trace's beginning."""
        jobs = load_jobs(str(path or trace_path()), start)
        speed = speed or settings.SIMULATION_SPEED * settings.REPLAY_DENSITY
        now = now or timezone.now()
        last = (
            Workload.objects.filter(trace_id__startswith=TRACE_PREFIX)
            .order_by("-trace_id")
            .values_list("trace_id", "submitted_at")
            .first()
        )
        if last is None or not jobs:
            return cls(jobs, speed, 0, jobs[0].submitted if jobs else None, now)
        index = int(last[0].removeprefix(TRACE_PREFIX))
        anchor_wall = max(last[1], now - MAX_GAP)
        return cls(jobs, speed, index + 1, jobs[min(index, len(jobs) - 1)].submitted, anchor_wall)

    def trace_now(self, now):
        return self.anchor_trace + (now - self.anchor_wall) * self.speed

    def wall_time(self, job):
        return self.anchor_wall + (job.submitted - self.anchor_trace) / self.speed

    def due(self, now):
        """Jobs whose trace time has come, at most MAX_PER_TICK of them."""
        if self.anchor_trace is None:
            return []
        horizon = self.trace_now(now)
        due = []
        index = self.next_index
        while index < len(self.jobs) and len(due) < MAX_PER_TICK and self.jobs[index].submitted <= horizon:
            due.append(self.jobs[index])
            index += 1
        return due

    def tick(self, now):
        """Submit every job that is due; returns how many were submitted."""
        submitted = 0
        for job in self.due(now):
            self.next_index = job.index + 1
            if self.submit(job):
                submitted += 1
        return submitted

    def submit(self, job):
        queue = self.queue(job.cluster)
        if queue is None:
            return False
        actor = self.actor(queue)
        resource_class = self.resource_class(resource_class_for(job.num_gpus, job.duration))
        if actor is None or resource_class is None:
            return False
        pods, per_pod = pod_shape(job.num_gpus)
        submission = services.Submission(
            name=job.name,
            queue=queue,
            resource_class=resource_class,
            pod_sets=(services.PodSetRequest(name="main", replicas=pods, devices_per_pod=per_pod, min_count=pods),),
            expected_duration_seconds=job.duration,
        )
        try:
            with replaying():  # the audit log says the replay did it, not the member it acts for
                workload = services.submit_workload(submission, actor)
        except services.InvalidSubmission as error:
            log.info("replay: skipped %s: %s", job.trace_id, error.errors)
            return False
        Workload.objects.filter(pk=workload.pk).update(trace_id=job.trace_id, submitted_at=self.wall_time(job))
        return True

    def queue(self, name):
        if name not in self._queues:
            self._queues[name] = Queue.objects.select_related("team").filter(name=name).first()
        return self._queues[name]

    def resource_class(self, name):
        if name not in self._classes:
            self._classes[name] = ResourceClass.objects.select_related("priority_class").filter(name=name).first()
        return self._classes[name]

    def actor(self, queue):
        """The team's demo member (seed_demo's member-<team>), else any member, else a superuser."""
        if queue.team_id not in self._actors:
            members = queue.team.members.order_by("username")
            self._actors[queue.team_id] = (
                members.filter(username=f"member-{queue.team.name}").first()
                or members.first()
                or User.objects.filter(is_superuser=True).order_by("pk").first()
            )
        return self._actors[queue.team_id]
