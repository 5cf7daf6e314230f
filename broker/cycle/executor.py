"""What happens to a workload after the cycle admits it.

The cycle only decides and records allocations; an executor makes admitted work run and reports when it
ends. The interface is three calls: `start` (admitted workloads begin), `advance(now)` (move the world
to `now`, return what started and completed) and `stop` (victims and cancellations shut down), plus
`wall_seconds` so the snapshot can put expected durations on the cycle's clock.

SimulatedExecutor is the one that exists: Admitted -> Running at once, Running -> Succeeded once the
workload has run `expected_duration_seconds` on a clock SIMULATION_SPEED times faster than the wall
clock, releasing its devices. It keeps no state of its own: completion is derived from `started_at`
in the database, so a restarted process picks up exactly where the last one stopped.

ExternalExecutor (EXECUTOR=external) is the seam the Kubernetes bridge (broker/kube/) uses; the design
it follows (settings.EXECUTOR selects an implementation):
- start: for each admitted workload create a scheduling.k8s.io PodGroup (minMember = gang size) and
  one resource.k8s.io/v1 ResourceClaim per pod whose `devices.requests[].exactly` names the chosen
  DeviceClass and whose status.allocation is pre-filled with the devices in the Allocation rows (the
  broker is the allocator), then the pods bound to the allocation's nodes; -> Running when the pods are.
- advance: watch the PodGroups; pods Succeeded/Failed -> Succeeded/Failed, release the allocations.
- stop: for each preemption victim (the cycle set `eviction_requested_at`, it still holds its devices)
  add the DisruptionTarget condition to its pods and delete the PodGroup with
  gracePeriodSeconds=EVICTION_GRACE_SECONDS; cancellations likewise.
- advance: once a victim's pods are gone (or the grace period has passed and they were killed) call
  `complete_evictions`: allocations released, Preempted, requeued Pending, audited with the rule.
- stop, for a shrunk victim (Pod disruption mode: allocations marked `eviction_requested_at`, the
  workload runs on): delete just those pods with the grace period, then `complete_pod_evictions`.

Graceful eviction here: `stop` only acknowledges; `advance` completes the eviction of every victim (and
of every shrunk victim's leaving pods) whose grace period (EVICTION_GRACE_SECONDS of simulated time) is
over. Until then the victim keeps its
devices, the cycle sees it as evicting and its preemptor waits with PreemptionPending.
- wall_seconds: durations are already wall-clock seconds there.
"""

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import Count, F
from django.db.models.sql import UpdateQuery

from broker import clock
from broker.cycle.bulk import Background, column_in, insert_rows, pk_in
from broker.events import request_cycle_after_commit
from broker.workloads.models import Allocation, Workload, WorkloadTransition
from broker.workloads.states import HOLDING_STATES, State, can_transition


@dataclass
class Progress:
    started: list = field(default_factory=list)
    completed: list = field(default_factory=list)
    evicted: list = field(default_factory=list)
    shrunk: list = field(default_factory=list)  # workloads some of whose pods stopped (Pod disruption mode)


class Executor(ABC):
    """The seam between the broker and whatever runs the pods."""

    @abstractmethod
    def start(self, workload_ids, now):
        """Begin running admitted workloads; returns the ids that started."""

    @abstractmethod
    def advance(self, now):
        """Bring running work up to `now`; returns Progress (started and completed ids)."""

    @abstractmethod
    def stop(self, workload_ids, now):
        """Shut down workloads that were preempted or cancelled; returns the ids stopped."""

    @abstractmethod
    def wall_seconds(self, duration):
        """Wall-clock seconds a run of `duration` seconds takes here (None stays None)."""


class SimulatedExecutor(Executor):
    def __init__(self, speed=None):
        self.speed = float(speed or clock.simulation_speed())

    def wall_seconds(self, duration):
        return None if duration is None else duration / self.speed

    def start(self, workload_ids, now):
        with transaction.atomic():
            ids = list(
                Workload.objects.select_for_update(skip_locked=True)
                .filter(**pk_in(workload_ids), state=State.ADMITTED, eviction_requested_at__isnull=True)
                .values_list("id", flat=True)
            )
            move(ids, State.ADMITTED, State.RUNNING, now, "simulated executor started it")
        return ids

    def advance(self, now):
        progress = Progress()
        progress.evicted = self.finish_evictions(now)
        progress.shrunk = self.finish_pod_evictions(now)
        admitted = Workload.objects.filter(state=State.ADMITTED).values_list("id", flat=True)
        progress.started = self.start(list(admitted), now)
        with transaction.atomic():
            # skip_locked: a cycle that is committing holds some of these rows; take them next time.
            running = (
                Workload.objects.select_for_update(skip_locked=True)
                .filter(state=State.RUNNING, expected_duration_seconds__isnull=False)
                .values_list("id", "started_at", "expected_duration_seconds")
            )
            done = [pk for pk, started, duration in running if self.finished(started, duration, now)]
            move(done, State.RUNNING, State.SUCCEEDED, now, "simulated run finished")
            Allocation.objects.filter(**column_in("workload", done), released_at__isnull=True).update(released_at=now)
        progress.completed = done
        if done:
            request_cycle_after_commit(f"{len(done)} workloads completed")
        return progress

    def finished(self, started, duration, now):
        return started is not None and started + timedelta(seconds=self.wall_seconds(duration)) <= now

    def stop(self, workload_ids, now):
        # Nothing runs outside the database here: a victim "shuts down" for EVICTION_GRACE_SECONDS of
        # simulated time, and `advance` completes its eviction after that (a cancellation's commit
        # already released its devices).
        return list(workload_ids)

    def grace_over(self, now):
        """Evictions requested at or before this have had their grace period (of simulated time)."""
        return now - timedelta(seconds=self.wall_seconds(settings.EVICTION_GRACE_SECONDS))

    def finish_evictions(self, now):
        """Victims whose grace period is over have stopped: complete their evictions."""
        with transaction.atomic():
            ids = list(
                Workload.objects.select_for_update(skip_locked=True)
                .filter(state__in=HOLDING_STATES, eviction_requested_at__lte=self.grace_over(now))
                .values_list("id", flat=True)
            )
            complete_evictions(ids, now)
        return ids

    def finish_pod_evictions(self, now):
        """Pods of shrunk workloads whose grace period is over have stopped: complete those evictions."""
        with transaction.atomic():
            rows = list(
                Allocation.objects.select_for_update(skip_locked=True)
                .filter(released_at__isnull=True, eviction_requested_at__lte=self.grace_over(now))
                .values_list("id", "workload_id", "pod_set", "pod_index")
            )
            return complete_pod_evictions(rows, now)


def lost_work(victim, devices):
    """What the preemption cost the victim, as a clause: its class's checkpoint-restart seconds of its
    devices (work since its last checkpoint, redone after the restart)."""
    seconds = victim.resource_class.checkpoint_restart_seconds if victim.resource_class else 0
    if not seconds or not devices:
        return ""
    return f"; the restart from its last checkpoint loses about {seconds} s of {devices} devices' work"


def complete_evictions(ids, now):
    """Victims that have stopped: devices released, Preempted, then requeued Pending, audited with the
    rule that allowed the preemption; a cycle is requested so the preemptor gets the devices."""
    if not ids:
        return []
    from broker.audit.models import record
    from broker.workloads.models import ExplanationChange

    victims = Workload.objects.select_related("team", "evicted_for__team", "resource_class").in_bulk(ids)
    ids = sorted(victims)
    devices = dict(
        Allocation.objects.filter(**column_in("workload", ids), released_at__isnull=True)
        .values_list("workload_id")
        .annotate(count=Count("id"))
    )
    for state in HOLDING_STATES:
        chosen = [pk for pk in ids if victims[pk].state == state]
        move(chosen, state, State.PREEMPTED, now, "evicted: stopped after its grace period")
    Allocation.objects.filter(**column_in("workload", ids), released_at__isnull=True).update(released_at=now)
    Workload.objects.filter(**pk_in(ids)).update(preemption_count=F("preemption_count") + 1)
    move(ids, State.PREEMPTED, State.PENDING, now, "requeued after preemption")
    history = []
    for pk in ids:
        victim = victims[pk]
        preemptor = victim.evicted_for
        record(
            "workload.evicted",
            victim,
            before={"state": victim.state, "evicting": True},
            after={
                "state": State.PENDING,
                "preemptor": preemptor.pk if preemptor else None,
                "rule": victim.eviction_rule,
            },
            reason=f"{victim.eviction_rule}: {victim.eviction_message}",
        )
        by = f" for {preemptor} (priority {preemptor.priority})" if preemptor else ""
        history.append(
            ExplanationChange(
                workload_id=pk,
                reason="Requeued",
                message=f"evicted{by} under rule {victim.eviction_rule}; its devices are released and it is "
                f"back in its queue at its place in line{lost_work(victim, devices.get(pk, 0))}",
                at=now,
            )
        )
    ExplanationChange.objects.bulk_create(history)
    request_cycle_after_commit(f"{len(ids)} victims evicted")
    return ids


def complete_pod_evictions(rows, now):
    """Pods of shrunk workloads that have stopped ((allocation id, workload id, pod set, pod index)
    rows): their devices are released, and each workload, running on with its other pods, is audited
    and told; a cycle is requested so the preemptor gets the devices. Returns the workload ids."""
    if not rows:
        return []
    from broker.audit.models import record
    from broker.workloads.models import ExplanationChange

    Allocation.objects.filter(**pk_in([row[0] for row in rows])).update(released_at=now)
    pods = {}
    for _, workload_id, pod_set, index in rows:
        pods.setdefault(workload_id, set()).add((pod_set, index))
    workloads = Workload.objects.select_related("team").in_bulk(list(pods))
    running_pods = (
        Allocation.objects.filter(**column_in("workload", list(pods)), released_at__isnull=True)
        .order_by()
        .values_list("workload_id", "pod_set", "pod_index")
        .distinct()
    )
    staying = Counter(workload_id for workload_id, _, _ in running_pods)
    history = []
    for pk in sorted(pods):
        workload = workloads[pk]
        gone = sorted(pods[pk])
        record(
            "workload.pods_evicted",
            workload,
            before={"state": workload.state, "pods": staying.get(pk, 0) + len(gone)},
            after={"state": workload.state, "pods": staying.get(pk, 0), "stopped": [list(pod) for pod in gone]},
            reason=f"{len(gone)} pods stopped after their grace period",
        )
        history.append(
            ExplanationChange(
                workload_id=pk,
                reason="PodsStopped",
                message=f"{len(gone)} preempted pods stopped and released their devices; it runs on with "
                f"{staying.get(pk, 0)} pods",
                at=now,
            )
        )
    ExplanationChange.objects.bulk_create(history)
    request_cycle_after_commit(f"pods of {len(pods)} shrunk workloads stopped")
    return sorted(pods)


def move(ids, source, target, now, reason, **also):
    """Bulk state change with one transition row each; the state machine still has the last word.
    `also`: more fields to set in the same UPDATE (one pass over the rows instead of two). Returns how
    many moved (a workload that had left `source` meanwhile stays where it is)."""
    return len(Moves([(ids, also)], source, target, now, reason).finish()[0])


class Moves:
    """Bulk state changes of batches of workloads from `source` to `target`, each batch with more fields
    of its own to set (`[(ids, {field: value})]`). On PostgreSQL the UPDATEs run in the background
    (bulk.Background) from here on, so the caller can build its next rows while the database rewrites
    these; it must not use the connection until `finish()`, which waits for them, writes a transition
    row for each workload that moved and returns the moved ids of each batch. `abandon()` instead, on
    the way out of an error: it waits and writes nothing more."""

    def __init__(self, batches, source, target, now, reason):
        if not can_transition(source, target):
            raise ValueError(f"{source} -> {target} is not a workload transition")
        self.source, self.target, self.now, self.reason = source, target, now, reason
        common = {"state": target, "state_changed_at": now}
        if target == State.RUNNING:
            common["started_at"] = now
        if target in (State.SUCCEEDED, State.FAILED):
            common["finished_at"] = now
        self.count = len(batches)
        updates = [(index, Workload.objects.filter(state=source, **pk_in(ids)), {**also, **common})
                   for index, (ids, also) in enumerate(batches) if ids]  # fmt: skip
        if updates and connection.vendor == "postgresql":  # nothing to move: no thread for it
            statements = [(index, update_returning_sql(moving, fields)) for index, moving, fields in updates]
            self._sent = Background(lambda cursor: {index: ids_updated(cursor, *sql) for index, sql in statements})
        else:
            self._sent = None
            # SQLite (the embedded default): the cycle's write lock keeps the rows as read until the UPDATE.
            self._moved = {}
            for index, moving, fields in updates:
                self._moved[index] = list(moving.values_list("pk", flat=True))
                Workload.objects.filter(**pk_in(self._moved[index])).update(**fields)

    def finish(self):
        moved = self._sent.result() if self._sent is not None else self._moved
        moved = [moved.get(index, []) for index in range(self.count)]
        # A row each for the workloads that moved, none for one that had left `source` meanwhile.
        insert_rows(
            WorkloadTransition,
            TRANSITION_COLUMNS,
            ((pk, self.source, self.target, self.now, self.reason) for ids in moved for pk in ids),
        )
        return moved

    def abandon(self):
        if self._sent is not None:
            self._sent.wait()


TRANSITION_COLUMNS = ("workload_id", "from_state", "to_state", "at", "reason")


def update_returning_sql(moving, fields):
    """(sql, params) of `moving.update(**fields)` returning the pks of the rows it updates."""
    query = moving.query.chain(UpdateQuery)
    query.add_update_values(fields)
    update, params = query.get_compiler(moving.db).as_sql()
    return f"{update} RETURNING {connection.ops.quote_name(Workload._meta.pk.column)}", params


def ids_updated(cursor, sql, params):
    cursor.execute(sql, params)
    return [row[0] for row in cursor.fetchall()]


class ExternalExecutor(Executor):
    """Work runs somewhere that reports back through the workloads' states (EXECUTOR=external): with the
    Kubernetes bridge, the applier binds an admitted workload's pods and marks it Running, evicts a victim's
    pods, and the sync ends a workload when its pods end and completes an eviction when its pods are gone
    (broker/kube/). The cycle's calls only acknowledge: what to do was written to the bridge's outbox in the
    cycle's own transaction, so it is done once even if this process dies right after the commit."""

    def wall_seconds(self, duration):
        return duration

    def start(self, workload_ids, now):
        return []

    def advance(self, now):
        return Progress()

    def stop(self, workload_ids, now):
        return list(workload_ids)


EXECUTORS = {"simulated": SimulatedExecutor, "external": ExternalExecutor}


def get_executor():
    try:
        return EXECUTORS[settings.EXECUTOR]()
    except KeyError:
        raise ImproperlyConfigured(
            f"EXECUTOR={settings.EXECUTOR!r}; the executors are: {', '.join(sorted(EXECUTORS))}"
        ) from None
