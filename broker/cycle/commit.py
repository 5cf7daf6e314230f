"""Apply one CycleResult to the database, all of it or none of it.

`decide_and_commit` runs inside the cycle's transaction (broker.cycle.locks.cycle_transaction) and
opens its own savepoint before the decision (the admissions are written as they are made:
broker.cycle.admissions), so a refusal or a failure undoes every write it made while the cycle row
survives to say what happened. It refuses a result decided on a stale snapshot: the inventory generation
moved, an admitted device went unhealthy, got a new taint, sits on a cordoned node or is held by
someone else, or a workload left the state the decision assumed. On PostgreSQL the cycle reads at
REPEATABLE READ, so a row changed after the snapshot makes the locking reads below fail with a
serialization error, which is the same refusal; the unique index on active allocations is the last guard.
"""

import hashlib
import json
import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import NamedTuple

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from broker import events
from broker.audit.models import event, record_all
from broker.costs.sampling import capacity_rows, record_capacity_sample
from broker.cycle.admissions import HISTORY_COLUMNS, AdmissionWriter
from broker.cycle.bulk import JsonText, column_in, insert_rows, pk_in, update_rows, upsert_rows
from broker.cycle.loader import as_text, load_snapshot
from broker.cycle.refusals import StaleSnapshot
from broker.inventory import quantities
from broker.inventory.models import ClusterState, Device, Health, InventoryRevision
from broker.scheduler import heap
from broker.scheduler.accounting import capacity_by_class
from broker.scheduler.snapshot import CycleResult, PendingDecision
from broker.workloads.models import Allocation, Explanation, ExplanationChange, SchedulingCycle, Workload
from broker.workloads.states import HOLDING_STATES

log = logging.getLogger(__name__)

EVENT = "cycle.committed"
# PostgreSQL: serialization_failure, deadlock_detected, lock_not_available.
STALE_SQLSTATES = {"40001", "40P01", "55P03"}
EXPLANATION_FIELDS = (
    "reason",
    "secondary",
    "message",
    "details",
    "position_in_queue",
    "position_in_cluster",
    "estimated_start",
    "suggestions",
)

EXPLANATION_COLUMNS = ("workload_id", "cycle_id", "updated_at", *EXPLANATION_FIELDS)
STORED_EXPLANATION_COLUMNS = (*EXPLANATION_COLUMNS, "fingerprint")
FINGERPRINT_BYTES = 16  # 32 hex digits: Explanation.fingerprint
# One encoder for every fingerprint (json.dumps builds one per call); decisions are trees, no cycle check.
CANONICAL_JSON = json.JSONEncoder(sort_keys=True, default=str, check_circular=False)


class DecisionFailed(Exception):
    """The decision core raised (the error is this one's cause); nothing was written."""


@dataclass
class CommitDelta:
    """What changed, for the broadcast and the caller."""

    cycle: int
    admitted: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    explanations: list = field(default_factory=list)

    def message(self):
        return {
            "type": EVENT,
            "cycle": self.cycle,
            "admitted": self.admitted,
            "preempted": self.preempted,
            "explanations": self.explanations,
        }


def decide_and_commit(decider, snapshot, loaded, cycle):
    """Decide on `snapshot` (loaded as `loaded`) with `decider`, write its result and finish `cycle`;
    returns (the CycleResult, the CommitDelta). The admissions are written as the decider makes them
    (broker.cycle.admissions), so the commit's savepoint opens before the decision. Raises
    DecisionFailed (nothing written; the cycle row is the caller's to finish) when the decider raises,
    StaleSnapshot (cycle marked Refused, nothing else written) when the snapshot went stale."""
    # As while loading and deciding: nothing on the heap is garbage yet (broker.scheduler.heap).
    with heap.collector_paused():
        return write_result(decider, snapshot, loaded, cycle)


def commit_result(result, loaded, cycle, snapshot=None):
    """Write `result`, decided already on `loaded` (from `snapshot`), and finish `cycle`; returns the
    CommitDelta. Raises StaleSnapshot as decide_and_commit does."""
    return decide_and_commit(lambda _snapshot, **_options: result, snapshot, loaded, cycle)[1]


def write_result(decider, snapshot, loaded, cycle):
    started = time.perf_counter()
    try:
        with transaction.atomic():
            writer = AdmissionWriter(loaded, cycle)
            deciding = time.perf_counter()
            try:
                result = decider(snapshot, on_admission=writer.add)
            except BaseException as error:
                writer.abandon()
                if isinstance(error, Exception):
                    raise DecisionFailed(f"{type(error).__name__}: {error}") from error
                raise
            # What `add` spent writing while the core decided is the commit's time, not the decision's.
            cycle.decide_ms = (time.perf_counter() - deciding - writer.seconds) * 1000
            started = time.perf_counter() - writer.seconds
            try:
                admitted = writer.finish(result.admissions)
                devices_held = check_fresh(result, loaded)
                if writer.devices and not devices_held:
                    check_devices(writer.devices, loaded)
                check_counters(writer.devices, loaded, devices_held)
                check_shares(writer.devices, writer.shares, loaded, devices_held)
                delta = apply(result, loaded, cycle, admitted)
                if delta.admitted or delta.preempted:
                    events.decisions_made.send(
                        sender=None, cycle_id=cycle.pk, admitted=delta.admitted, preempted=delta.preempted
                    )
                check_constraints_now()
            except IntegrityError as error:
                raise StaleSnapshot(
                    held_meanwhile(error, loaded) or f"the database refused a write: {first_line(error)}"
                ) from error
            except DatabaseError as error:
                if sqlstate(error) in STALE_SQLSTATES:
                    raise StaleSnapshot(f"rows changed after the snapshot: {first_line(error)}") from error
                raise
    except DecisionFailed:
        raise
    except StaleSnapshot as error:
        finish(cycle, SchedulingCycle.Outcome.REFUSED, started, loaded, detail=str(error))
        raise
    except Exception as error:
        finish(cycle, SchedulingCycle.Outcome.FAILED, started, loaded, detail=f"{type(error).__name__}: {error}")
        raise
    cycle.admitted_count = len(delta.admitted)
    cycle.preempted_count = len(delta.preempted)
    finish(
        cycle,
        SchedulingCycle.Outcome.COMMITTED,
        started,
        loaded,
        detail=(
            f"admitted {len(delta.admitted)}, preempted {len(delta.preempted)}, "
            f"{len(result.pending)} pending, {len(delta.explanations)} explanations changed"
        ),
    )
    transaction.on_commit(lambda: broadcast(delta.message()))
    # After commit, and only if it commits; a failed sample must not undo a cycle.
    transaction.on_commit(lambda: record_capacity(snapshot, result, loaded), robust=True)
    return result, delta


def check_constraints_now():
    """Run the foreign-key checks PostgreSQL defers to COMMIT (Django declares its constraints
    DEFERRABLE INITIALLY DEFERRED) inside the commit's savepoint: a row that refers to something deleted
    since the snapshot is then a refusal recorded on the cycle row, not a failed COMMIT that takes the
    cycle row with it; and their cost counts in commit_ms, where it belongs. (SQLite needs nothing: the
    cycle's write lock keeps every other writer out, so nothing the cycle refers to can go meanwhile.)"""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def record_capacity(snapshot, result, loaded):
    """The finance sample of the state this cycle leaves: computed from the snapshot and the decisions
    (broker.scheduler.accounting), no query but the sample's own; without the snapshot, from the database."""
    if snapshot is None:
        rows = sample_capacity(loaded.now)
    else:
        rows = capacity_rows(capacity_by_class(snapshot, result), loaded.device_class_pks)
    return record_capacity_sample(loaded.now, rows)


def sample_capacity(now):
    """The rows of a sample at `now`, outside a cycle: the core's definition over a freshly loaded
    snapshot. Nothing is decided here, so the pending workloads are taken as the last cycle left them:
    the ones it explained as InvalidRequest want nothing."""
    snapshot, loaded = load_snapshot(now)
    pending = {workload.id for workload in snapshot.pending}
    explained_invalid = Explanation.objects.filter(reason="InvalidRequest").values_list("workload_id", flat=True)
    invalid = sorted(str(pk) for pk in explained_invalid if str(pk) in pending)
    result = CycleResult(pending=tuple(PendingDecision(workload_id, "InvalidRequest") for workload_id in invalid))
    return capacity_rows(capacity_by_class(snapshot, result), loaded.device_class_pks)


def finish(cycle, outcome, started, loaded, detail=""):
    cycle.outcome = outcome
    cycle.generation = loaded.generation
    cycle.load_ms = loaded.load_ms
    cycle.pending_count = loaded.pending_count
    cycle.commit_ms = (time.perf_counter() - started) * 1000
    cycle.finished_at = timezone.now()
    cycle.detail = detail
    if outcome != SchedulingCycle.Outcome.COMMITTED:
        cycle.admitted_count = cycle.preempted_count = 0
    cycle.save()


def sqlstate(error):
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) or getattr(getattr(cause, "diag", None), "sqlstate", None)


def first_line(error):
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def pks(ids):
    return [int(workload_id) for workload_id in ids]


# --- 1. refuse stale decisions ------------------------------------------------------------------------


def check_fresh(result, loaded):
    """Refuse a stale snapshot (StaleSnapshot); returns whether the admitted devices are known to be as
    the snapshot saw them and held so until the commit (no inventory write since: inventory_unchanged)."""
    generation = (
        ClusterState.objects.select_for_update().filter(name=settings.CLUSTER_NAME).values_list("generation", flat=True)
    )
    current = generation.first()
    if current is not None and current != loaded.generation:
        raise StaleSnapshot(f"the inventory changed (generation {loaded.generation} -> {current})")
    # Admitted workloads are checked by the admission's own UPDATE (broker.cycle.admissions), their
    # devices by the unique index on active allocations, and looked at (check_devices) only when an
    # inventory write landed since the snapshot: no lock pass first.
    check_workloads(pks({p.victim_id for p in result.preemptions}), HOLDING_STATES, "preempted")
    check_workloads(pks({e.workload_id for e in result.evictions}), HOLDING_STATES, "evicted")
    return bool(result.admissions) and inventory_unchanged(loaded)


def inventory_unchanged(loaded):
    """Whether no write to the inventory tables landed since the snapshot. Locking the revision row
    also makes an inventory write that starts now wait for this commit (its trigger updates the row),
    so the devices stay as the decisions saw them; one that committed since the snapshot fails the lock
    at REPEATABLE READ (a serialization error: stale) or shows a new token."""
    if loaded.inventory_token is None:
        return False
    return InventoryRevision.current(lock=True) == loaded.inventory_token


def check_workloads(ids, allowed, verb):
    if not ids:
        return
    states = dict(Workload.objects.select_for_update().filter(**pk_in(ids)).values_list("id", "state"))
    for pk in ids:
        if states.get(pk) not in allowed:
            raise StaleSnapshot(f"workload {pk} was {verb} but is now {states.get(pk, 'gone')}")


def check_devices(wanted, loaded):
    wanted = set(wanted)  # a shared device may be admitted to several pods
    rows = (
        Device.objects.select_for_update(no_key=True, of=("self",))
        .filter(**pk_in(wanted))
        .values_list("id", "node__name", "name", "health", as_text("taints"), "node__cordoned")
    )
    taint_texts = {}
    seen = set()
    for pk, node, name, health, taints, cordoned in rows:
        seen.add(pk)
        if health != Health.HEALTHY:
            raise StaleSnapshot(f"device {node}/{name} is now {health}")
        if taints not in taint_texts:
            # A handful of distinct taint lists among tens of thousands of devices: decode each once.
            taint_texts[taints] = json.loads(taints) if taints is not None else None
        if taint_texts[taints] != loaded.device_taints.get(pk):
            raise StaleSnapshot(f"device {node}/{name} has new taints")
        if cordoned:
            raise StaleSnapshot(f"node {node} was cordoned")
    if len(seen) != len(wanted):
        raise StaleSnapshot("an admitted device was removed")


def check_counters(admitted, loaded, inventory_held):
    """Refuse admissions that take more of a shared counter (DRA counter sets) than its set publishes,
    counting every active allocation on the nodes concerned, the ones just written included: the
    unique index guards a device against a second holder, this its partitions and its whole. Counters
    are as loaded, so an inventory write since the snapshot refuses admissions of counted devices."""
    counters = loaded.counters
    if not admitted or counters is None or not counters.consumed:
        return
    consumed = counters.consumed
    nodes = {key[0] for pk in admitted for key, _ in consumed.get(pk, ())}
    if not nodes:
        return
    if not inventory_held:
        raise StaleSnapshot("the inventory changed since the snapshot under devices that consume shared counters")
    held = Allocation.objects.filter(released_at__isnull=True, device__node__name__in=nodes).values_list(
        "device_id", flat=True
    )
    used = defaultdict(int)
    for pk in held:
        for key, amount in consumed.get(pk, ()):
            used[key] += amount
    for key, amount in sorted(used.items()):
        value = counters.values.get(key, 0)
        if amount > value:
            node, counter_set, counter = key
            raise StaleSnapshot(
                f"counter {counter} of counter set {counter_set} on node {node} would be over-consumed "
                f"({amount} of {value})"
            )


def check_shares(admitted, shares, loaded, inventory_held):
    """Refuse admissions that share a device (time-sliced) past a capacity of it, share a device that
    allows no shares or is held whole, or take whole a device that shares use; counting every active
    allocation of the devices concerned, the ones just written included. `shares`: Device pk -> the
    amounts each new share of it takes. The unique index keeps a device to one whole holder, and on
    PostgreSQL triggers refuse the mixes too (workloads migration 0022); the capacities' sums are
    checked here only. Capacities are as loaded, so an inventory write since the snapshot refuses
    admissions of shared devices, as of counted ones."""
    shared_capacity = loaded.shared_capacity
    concerned = set(shares)
    if shared_capacity:
        concerned.update(pk for pk in admitted if pk in shared_capacity)
    if not concerned:
        return
    if not inventory_held:
        raise StaleSnapshot("the inventory changed since the snapshot under shared devices")
    rows = Allocation.objects.filter(released_at__isnull=True, **column_in("device", sorted(concerned)))
    used = defaultdict(lambda: defaultdict(float))
    whole, shared = defaultdict(int), defaultdict(int)
    for pk, consumed in rows.values_list("device_id", as_text("consumed_capacity")):
        if consumed is None:
            whole[pk] += 1
            continue
        shared[pk] += 1
        for name, amount in quantities.numbers(json.loads(consumed)).items():
            used[pk][name] += amount
    for pk in sorted(concerned):
        device = loaded.devices_by_pk[pk][0]
        if shared[pk] and pk not in shared_capacity:
            raise StaleSnapshot(f"device {device} allows no shares")
        if whole[pk] and shared[pk]:
            raise StaleSnapshot(f"device {device} is held whole and shared")
        capacity = shared_capacity.get(pk, {})
        for name, amount in sorted(used[pk].items()):
            total = capacity.get(name, 0)
            if amount > total * (1 + 1e-9):
                raise StaleSnapshot(
                    f"capacity {name} of device {device} would be over-consumed ({amount:g} of {total:g})"
                )


# An admitted device already held is refused by the unique index on active allocations, not looked for
# first: a query over the 25,000 devices of a large admission cost 25 ms of every such commit to find,
# on PostgreSQL's REPEATABLE READ snapshot, only what the snapshot (and so the decision) already knew.
# The key as PostgreSQL details it: "Key (device_id, (CASE ... END))=(12, 0) already exists." (the
# index's expression spans lines), or the sharing trigger's "Key (device_id)=(12) is held whole."
HELD_KEY = re.compile(r"Key \(device_id.*?\)=\((\d+)", re.DOTALL)


def held_meanwhile(error, loaded):
    """The refusal's reason when `error` is the unique index on active allocations refusing a device
    (PostgreSQL names the key); None for any other refusal."""
    diag = getattr(error.__cause__, "diag", None)
    if getattr(diag, "constraint_name", None) not in ("allocation_one_whole_per_device", "allocation_whole_or_shared"):
        return None
    key = HELD_KEY.search(diag.message_detail or "")
    device = loaded.devices_by_pk.get(int(key.group(1))) if key else None
    return f"device {device[0] if device else 'of the admission'} was allocated meanwhile"


# --- 2. apply -----------------------------------------------------------------------------------------


def apply(result, loaded, cycle, admitted):
    """Everything but the admissions (written already: `admitted`, their workloads' pks)."""
    now = loaded.now
    delta = CommitDelta(cycle=cycle.pk)
    delta.preempted = evict(result.preemptions, cycle, now)
    # Work stopped on a failed device leaves as a victim does: the pages refresh it alike.
    delta.preempted = sorted(set(delta.preempted) | set(evict_failed(result.evictions, cycle, now)))
    delta.admitted = admitted
    renominate(result, loaded, delta.admitted)
    delta.explanations = explain(result.pending, delta.admitted, cycle, now)
    return delta


def evict(preemptions, cycle, now):
    """Victims are asked to leave, not removed: each keeps its state and its devices, marked evicting
    for its preemptor with the rule and message, until the executor has stopped it gracefully
    (executor.complete_evictions releases the devices and requeues it). The preemptor is nominated
    for the victims' devices, so the cycle that sees them free holds them for it until its turn."""
    by_victim = {}
    for preemption in preemptions:
        by_victim.setdefault(int(preemption.victim_id), preemption)
    if not by_victim:
        return []
    victims = Workload.objects.select_related("team").in_bulk(list(by_victim))
    preemptors = Workload.objects.select_related("team").in_bulk({int(p.preemptor_id) for p in by_victim.values()})
    shrunk = sorted(pk for pk, preemption in by_victim.items() if preemption.pods)
    nominated = defaultdict(set)
    audited = []
    history = [shrink(victims[pk], preemptors, by_victim[pk], cycle, now, nominated, audited) for pk in shrunk]
    ids = sorted(by_victim.keys() - set(shrunk))
    asked = []
    for pk in ids:
        preemption, victim = by_victim[pk], victims[pk]
        preemptor = preemptors[int(preemption.preemptor_id)]
        audited.append(
            event(
                "workload.preempt",
                victim,
                before={"state": victim.state},
                after={"state": victim.state, "evicting": True, "preemptor": preemptor.pk, "rule": preemption.rule},
                reason=f"{preemption.rule}: {preemption.message}",
            )
        )
        asked.append((pk, now, preemptor.pk, preemption.rule, preemption.message))
        history.append(
            ExplanationChange(
                workload_id=pk, cycle=cycle, reason="Preempted", message=preempted_text(preemptor, preemption), at=now
            )
        )
    update_rows(Workload, EVICTION_FIELDS, asked)
    record_all(audited)
    ExplanationChange.objects.bulk_create(history)
    held = Allocation.objects.filter(**column_in("workload", ids), released_at__isnull=True)
    for workload_id, device_pk in held.values_list("workload_id", "device_id"):
        nominated[int(by_victim[workload_id].preemptor_id)].add(device_pk)
    for pk, devices in nominated.items():
        preemptor = preemptors[pk]
        Workload.objects.filter(pk=pk).update(nominated_devices=sorted(set(preemptor.nominated_devices) | devices))
    return sorted(by_victim)


def evict_failed(evictions, cycle, now):
    """Running work on failed devices (the core's Evictions) is asked to leave for nobody: the whole
    workload, or in Pod mode only the pods on failed devices. As for a victim, it keeps its devices until
    the executor has stopped it (executor.complete_evictions releases them and requeues it Pending, its
    priority and submission time, so its place in line, unchanged). Returns the workloads' pks."""
    if not evictions:
        return []
    by_pk = {int(eviction.workload_id): eviction for eviction in evictions}
    workloads = Workload.objects.select_related("team").in_bulk(list(by_pk))
    shrunk = sorted(pk for pk, eviction in by_pk.items() if eviction.pods)
    pods_held = defaultdict(list)  # Pod mode: workload pk -> [(allocation pk, pod)] of what it holds
    if shrunk:
        held = Allocation.objects.filter(**column_in("workload", shrunk), released_at__isnull=True)
        for allocation_id, workload_id, pod_set, pod_index in held.values_list(
            "id", "workload_id", "pod_set", "pod_index"
        ):
            pods_held[workload_id].append((allocation_id, (pod_set, pod_index)))
    leaving, asked, audited, history = [], [], [], []
    for pk in sorted(by_pk):
        eviction, workload = by_pk[pk], workloads[pk]
        if eviction.pods:
            wanted = set(eviction.pods)
            leaving.extend(allocation_id for allocation_id, pod in pods_held[pk] if pod in wanted)
            action, reason = "workload.shrink", "Shrunk"
        else:
            asked.append((pk, now, None, eviction.reason, eviction.message))
            action, reason = "workload.evict", "Evicted"
        audited.append(event(
            action,
            workload,
            before={"state": workload.state},
            after={"state": workload.state, "evicting": True, "rule": eviction.reason,
                   "pods": [list(pod) for pod in eviction.pods]},
            reason=f"{eviction.reason}: {eviction.message}",
        ))  # fmt: skip
        message = f"{eviction.message}; it keeps its devices while it shuts down, then goes back to its queue"
        if eviction.pods:
            message = f"{eviction.message}; those pods keep their devices while they shut down"
        history.append(ExplanationChange(workload_id=pk, cycle=cycle, reason=reason, message=message, at=now))
    if leaving:
        Allocation.objects.filter(**pk_in(leaving)).update(eviction_requested_at=now, evicted_for=None)
    update_rows(Workload, EVICTION_FIELDS, asked)
    record_all(audited)
    ExplanationChange.objects.bulk_create(history)
    return sorted(by_pk)


# What asking a workload to leave writes on it, for hundreds at once (update_rows).
EVICTION_FIELDS = ("eviction_requested_at", "evicted_for_id", "eviction_rule", "eviction_message")


def shrink(victim, preemptors, preemption, cycle, now, nominated, audited):
    """A Pod-mode victim gives up the pods the core named (those above its gang minimum): their
    allocations are marked evicting for the preemptor, which is nominated for their devices; the
    workload itself runs on. Stale if a named pod no longer holds devices or is already leaving.
    Returns the victim's history row; its audit event is added to `audited`."""
    preemptor = preemptors[int(preemption.preemptor_id)]
    wanted = set(preemption.pods)
    rows = list(
        Allocation.objects.select_for_update()
        .filter(workload=victim, released_at__isnull=True)
        .values_list("id", "pod_set", "pod_index", "device_id", "eviction_requested_at")
    )
    leaving = [row for row in rows if (row[1], row[2]) in wanted]
    found = {(row[1], row[2]) for row in leaving}
    if found != wanted or any(row[4] is not None for row in leaving):
        raise StaleSnapshot(f"workload {victim.pk}: the pods chosen to leave changed since the snapshot")
    staying = {(row[1], row[2]) for row in rows} - wanted
    Allocation.objects.filter(**pk_in([row[0] for row in leaving])).update(
        eviction_requested_at=now, evicted_for=preemptor
    )
    nominated[preemptor.pk].update(row[3] for row in leaving)
    pods = sorted(wanted)
    audited.append(event(
        "workload.shrink",
        victim,
        before={"state": victim.state, "pods": len(staying) + len(wanted)},
        after={"state": victim.state, "pods": len(staying), "leaving": [list(pod) for pod in pods],
               "preemptor": preemptor.pk, "rule": preemption.rule},
        reason=f"{preemption.rule}: {preemption.message}",
    ))  # fmt: skip
    why = preemption.message.split("): ", 1)[-1]
    return ExplanationChange(
        workload=victim,
        cycle=cycle,
        reason="Shrunk",
        message=(
            f"{len(pods)} of its pods preempted by {preemptor} (priority {preemptor.priority}) under rule "
            f"{preemption.rule}: {why}; they keep their devices while they shut down, and it runs on with "
            f"{len(staying)} pods"
        ),
        at=now,
    )


def preempted_text(preemptor, preemption):
    """What the victim is told: who, at what priority, under which rule and why."""
    why = preemption.message.split("): ", 1)[-1]  # the core's "preempted for <id> (<rule>): <why>"
    return (
        f"Preempted by {preemptor} (priority {preemptor.priority}) under rule {preemption.rule}: {why}; "
        "it keeps its devices while it shuts down, then goes back to its queue"
    )


def renominate(result, loaded, admitted):
    """A pending workload keeps its nomination only while it is still PreemptionPending (kube-scheduler
    clears a nomination that no longer helps); an admitted one's was cleared by its admission. Which
    ones carry a nomination the load saw (only a commit sets one, and commits take turns), rather than a
    scan of every pending row's JSON (15-20 ms a cycle at 20,000 pending)."""
    waiting = {int(d.workload_id) for d in result.pending if d.reason == "PreemptionPending"}
    stale = sorted(loaded.nominated_pending - waiting - set(admitted))
    if stale:
        Workload.objects.filter(**pk_in(stale)).update(nominated_devices=[])


# --- 3. explanations ------------------------------------------------------------------------------------


def plain(value):
    """JSON-shaped copy (tuples become lists) so what we compare is what the database gives back."""
    return json.loads(json.dumps(value, default=str))


def explanation_content(decision, shared=None):
    """The decision as the Explanation's fields, JSON values still as the core made them (tuples).
    `shared`: the commit's SharedTexts, which hands decisions of one shape one suggestions list."""
    estimated = None
    if decision.estimated_start is not None:
        # Whole seconds: the estimate moves by fractions every cycle and that is not news.
        estimated = datetime.fromtimestamp(round(decision.estimated_start), tz=UTC)
    return {
        "reason": decision.reason,
        "secondary": decision.secondary,
        "message": decision.message,
        "details": decision.details,
        "position_in_queue": decision.position_in_queue,
        "position_in_cluster": decision.position_in_cluster,
        "estimated_start": estimated,
        "suggestions": (
            suggestion_dicts(decision.suggestions) if shared is None else shared.suggestions(decision.suggestions)
        ),
    }


def suggestion_dicts(suggestions):
    return [{"kind": s.kind, "description": s.description, "change": s.change} for s in suggestions]


def stored_row(pk, cycle_pk, now, content, encoded=None, json_text=JsonText):
    """The STORED_EXPLANATION_COLUMNS row of `content`: each JSON field as the text `encode_explanation`
    gives (tuples as lists; keys sorted, which a jsonb column does not keep anyway), as `json_text` wraps
    it for the COPY. `encoded`: what `encode_explanation` gave for it."""
    texts, digest = encoded or encode_explanation(content)
    return (
        pk, cycle_pk, now, content["reason"], json_text(texts["secondary"]), content["message"],
        json_text(texts["details"]), content["position_in_queue"], content["position_in_cluster"],
        content["estimated_start"], json_text(texts["suggestions"]), digest,
    )  # fmt: skip


DIGITS = re.compile(r"\d+")


@lru_cache(maxsize=1024)
def without_numbers(note):
    """The estimate's note as compared between cycles: it ("unknown: 1566 running workload(s) have no
    expected duration") counts work elsewhere in the cluster and moves with every start and eviction, so
    its numbers are not news; its wording is. A handful of distinct notes per cycle, each shared by
    thousands of decisions."""
    return DIGITS.sub("#", note)


def fingerprint(content):
    """A digest of everything `unchanged` compares but the estimated start (compared with a tolerance,
    so stored beside it): two contents have the same fingerprint when their JSON is equal, keys in any
    order, tuples as lists, the estimate note's numbers left out. Stored with each Explanation so a cycle
    compares 20,000 explanations without reading and decoding their JSON."""
    return encode_explanation(content)[1]


FIELD_SEPARATOR = "\x1f"  # never in JSON text: it would be escaped there


def encode_explanation(content, shared=None):
    """({JSON field: its text}, fingerprint), every JSON value encoded once: the texts are what is stored,
    and the fingerprint is made of them. The details' estimate note goes in with its numbers blanked
    (see without_numbers) and is added back to the stored details text, so the largest value is not
    encoded twice. `shared`: a SharedTexts for one commit (workloads of one shape share their values)."""
    details, secondary, suggestions = content["details"], content["secondary"], content["suggestions"]
    try:
        if shared is not None:
            rest_text, details_text, comparable_note = shared.details_texts(details)
            secondary, suggestions = shared.encode(secondary), shared.encode(suggestions)
        else:
            rest_text, details_text, comparable_note = details_texts(details, CANONICAL_JSON.encode)
            secondary, suggestions = CANONICAL_JSON.encode(secondary), CANONICAL_JSON.encode(suggestions)
    except TypeError:  # keys of mixed types cannot be sorted; as JSON they are all strings
        rest_text, details_text, comparable_note = details_texts(
            details, lambda value: CANONICAL_JSON.encode(plain(value))
        )
        secondary, suggestions = (CANONICAL_JSON.encode(plain(value)) for value in (secondary, suggestions))
    text = shared.text if shared is not None else CANONICAL_JSON.encode
    scalars = (content["reason"], content["message"], content["position_in_queue"], content["position_in_cluster"])
    scalars = "[" + ", ".join([text(value) for value in scalars]) + "]"
    # The shape's texts first, hashed once per shape when shared; the workload's own scalars after them.
    shape = (secondary, rest_text, comparable_note, suggestions)
    hasher = (shape_hasher(shape) if shared is None else shared.hasher(shape)).copy()
    hasher.update((FIELD_SEPARATOR + scalars).encode())
    return {"secondary": secondary, "details": details_text, "suggestions": suggestions}, hasher.hexdigest()


def shape_hasher(shape):
    """The fingerprint's hash fed with the texts a shape's decisions share (most of every digest's bytes)."""
    return hashlib.blake2b(FIELD_SEPARATOR.join(shape).encode(), digest_size=FINGERPRINT_BYTES)


def details_texts(details, encode, text=CANONICAL_JSON.encode):
    """(the details without their estimate note as `encode` writes them, the stored details text, the
    note as compared: its numbers blanked)."""
    note = details.get("estimate") if isinstance(details, dict) else None
    if not isinstance(note, str):
        rest_text = encode(details)
        return rest_text, rest_text, text(None)
    rest = {key: value for key, value in details.items() if key != "estimate"}
    rest_text = encode(rest)
    details_text = rest_text[:-1] + (", " if rest else "") + '"estimate": ' + text(note) + "}"
    return rest_text, details_text, text(without_numbers(note))


class SharedTexts:
    """CANONICAL_JSON texts kept for one commit. The core gives the workloads of one shape the very same
    value objects (the gang's needs, the quota numbers, the largest free domain, the secondary codes), so
    a dict made of the same objects has the same text: it is looked up by the identities of its values.
    Those values are kept referenced, so no identity can be reused by another object meanwhile."""

    def __init__(self):
        self._texts = {}
        self._suggestions = {}
        self._scalars = {}
        self._json = {}
        self._details = {}
        self._hashers = {}

    def hasher(self, shape):
        """`shape_hasher(shape)`, one per tuple of the very same texts: this commit's texts are shared per
        shape (the methods above), so 20,000 decisions hash a few hundred shapes' texts, not their own."""
        key = tuple(map(id, shape))
        known = self._hashers.get(key)
        if known is None:
            # The texts are kept, so no identity in the key can be reused meanwhile.
            known = self._hashers[key] = (shape, shape_hasher(shape))
        return known[1]

    def json_text(self, text: str) -> JsonText:
        """`text` as the COPY's JsonText, one per distinct text: a few hundred among 20,000 rows, each of
        which copied its 500-character details text into a new one."""
        known = self._json.get(text)
        if known is None:
            known = self._json[text] = JsonText(text)
        return known

    def stored_row(self, pk, cycle_pk, now, content, encoded):
        """`stored_row` with this commit's shared JsonText values."""
        return stored_row(pk, cycle_pk, now, content, encoded, self.json_text)

    def text(self, value) -> str:
        """CANONICAL_JSON text of a scalar: the reason, message and estimate notes repeat across a
        shape's decisions, so their texts are kept by value; numbers are written as JSON writes them."""
        if type(value) is int:
            return int.__repr__(value)
        key = value if type(value) is str else (type(value), value)  # 1 == 1.0 == True, not as JSON
        known = self._scalars.get(key)
        if known is None:
            known = self._scalars[key] = CANONICAL_JSON.encode(value)
        return known

    def suggestions(self, suggestions: tuple) -> list:
        """`suggestion_dicts(suggestions)`, one list per tuple the core shares between the decisions of a
        shape (its text is then encoded once too); never changed after it is made."""
        known = self._suggestions.get(id(suggestions))
        if known is None:
            known = self._suggestions[id(suggestions)] = (suggestions, suggestion_dicts(suggestions))
        return known[1]

    def details_texts(self, details):
        """`details_texts(details)`, kept by the identities of the details' values: decisions of one shape
        have equal details made of the same objects, note included (a handful of distinct notes)."""
        if type(details) is not dict:
            return details_texts(details, self.encode, self.text)
        key = (tuple(details), tuple(map(id, details.values())))
        known = self._details.get(key)
        if known is None:
            # As in `encode`: the values are kept, so no identity in the key can be reused meanwhile.
            known = self._details[key] = (tuple(details.values()), details_texts(details, self.encode, self.text))
        return known[1]

    def encode(self, value):
        if type(value) is dict:
            key = (tuple(value), tuple(map(id, value.values())))
        elif type(value) is tuple or type(value) is list:  # lists: the suggestions above, never changed
            key = (None, id(value))
        else:
            return CANONICAL_JSON.encode(value)
        known = self._texts.get(key)
        if known is None:
            # The value itself (a new dict per workload) is not kept: its values are, by the key's ids.
            known = self._texts[key] = (
                tuple(value.values()) if type(value) is dict else value,
                CANONICAL_JSON.encode(value),
            )
        return known[1]


def estimate_unchanged(old, new, tolerance):
    """Whether an estimated start moved by less than `tolerance` seconds (a known one never matches an
    unknown one)."""
    if old == new:
        return True
    return old is not None and new is not None and abs((new - old).total_seconds()) < tolerance


class Stored(NamedTuple):
    """What `explain` reads of a stored explanation: not the JSON columns, whose decoding for every
    pending workload cost more than all the rest of the comparison."""

    fingerprint: str
    estimated_start: datetime | None
    reason: str
    message: str


def still_says(stored, digest, estimated_start, tolerance):
    """Whether the `stored` explanation (a Stored, or None) still says what content with fingerprint
    `digest` and `estimated_start` says: an estimate that moved by less than `tolerance` seconds is no
    news. An empty stored fingerprint (a row from before fingerprints, or saved by another writer)
    never matches."""
    return (
        stored is not None
        and stored.fingerprint == digest
        and estimate_unchanged(stored.estimated_start, estimated_start, tolerance)
    )


def unchanged(before, values, tolerance):
    """`still_says` for two contents: every field equal, except an estimated start that moved by less
    than `tolerance` seconds and the numbers in the estimate note."""
    if before is None:
        return False
    stored = Stored(fingerprint(before), before["estimated_start"], before["reason"], before["message"])
    return still_says(stored, fingerprint(values), values["estimated_start"], tolerance)


def explain(decisions, admitted, cycle, now):
    """Upsert one Explanation per pending workload whose content changed (see `still_says`); history
    only when the reason or message did. Returns the workload ids whose explanation changed."""
    skip = set(admitted)
    decisions = [d for d in decisions if int(d.workload_id) not in skip]
    if not decisions:
        return []
    rows = Explanation.objects.filter(**column_in("workload", [int(d.workload_id) for d in decisions]))
    existing = {row[0]: Stored(*row[1:]) for row in rows.values_list("workload_id", *Stored._fields)}
    tolerance = settings.EXPLANATION_ESTIMATE_TOLERANCE_SECONDS
    shared = SharedTexts()
    inserted = []
    updates = []
    history = []

    def new_rows():
        """The rows to insert, made as the COPY takes them: PostgreSQL stores the rows already sent while
        the next ones are encoded. The rewritten rows and the history are kept for after it."""
        for decision in decisions:
            pk = int(decision.workload_id)
            content = explanation_content(decision, shared)
            encoded = encode_explanation(content, shared)
            before = existing.get(pk)
            if still_says(before, encoded[1], content["estimated_start"], tolerance):
                continue
            row = shared.stored_row(pk, cycle.pk, now, content, encoded)
            if before is None or (before.reason, before.message) != (content["reason"], content["message"]):
                history.append((pk, cycle.pk, content["reason"], content["message"], now))
            if before is None:
                inserted.append(pk)
                yield row
            else:
                updates.append(row)

    # New rows straight in; only the rewritten ones need the upsert's merge. A row another writer
    # inserted since the read makes the insert fail (the refusal's unique violation) or the upsert's
    # REPEATABLE READ fail, the same stale snapshot either way.
    insert_rows(Explanation, STORED_EXPLANATION_COLUMNS, new_rows())
    upsert_rows(
        Explanation,
        STORED_EXPLANATION_COLUMNS,
        updates,
        unique_fields=["workload_id"],
        update_fields=STORED_EXPLANATION_COLUMNS[1:],
    )
    insert_rows(ExplanationChange, HISTORY_COLUMNS, history)
    return sorted([*inserted, *(row[0] for row in updates)])


# --- 4. tell the dashboards ------------------------------------------------------------------------------


def broadcast(message):
    """Announce the committed cycle's compact delta to the live pages (broker.events.cycle_committed;
    broker.live sends it to their channel group)."""
    events.cycle_committed.send(sender=None, message=message)
