"""Writing a cycle's admissions, as the core makes them.

Each admitted workload moves Pending -> Admitted (with its transition row, its chosen device class and
its nomination and eviction record cleared), its devices get allocation rows, its history an
"Admitted" line, and its last explanation goes.

On PostgreSQL those writes start while the core is still deciding. The core hands over each admission
as it makes it (`decide(..., on_admission=writer.add)`; an admission is final once made), and every
ADMISSION_BATCH of them (fewer in the first batches) go to the database in the background
(bulk.Background, one batch after another on the cycle's own connection, inside the commit's
savepoint). A first cycle admits 20,000 workloads: PostgreSQL then rewrites the first ones' rows, and
their six index entries each, on the second core while the first decides the rest, instead of all of it
after the last decision. `finish` writes what is left, waits for everything sent, and checks it: a
workload that left Pending since the snapshot is a refusal (StaleSnapshot), as is any database error the
background met, and the commit's savepoint rolls every batch back. What else makes the decisions stale
(the inventory, the preempted workloads) the commit checks after `finish`, as before: every write here
is undone by a refusal, whenever it ran.

The writes take the rows' locks earlier than a commit after the decision did: an API call that
changes an admitted workload meanwhile waits for the cycle (as it would for its commit), and a device
deletion is still refused or waited for (broker.workloads migration 0016): one that committed after
the snapshot makes the commit's locking read of the inventory revision fail, one that has not yet
committed holds that row, so the commit waits and then fails the same way.

Elsewhere (SQLite, the embedded default) nothing is written before the decision is done: `finish`
writes it all, with the ORM.
"""

import json
import time
from collections import defaultdict
from functools import lru_cache
from typing import NamedTuple

from django.db import connection

from broker.cycle.bulk import Background, column_in, insert_rows, is_postgresql, pk_in
from broker.cycle.executor import Moves, update_returning_sql
from broker.cycle.refusals import StaleSnapshot
from broker.scheduler import accounting
from broker.scheduler.snapshot import GROUP_POD_SET
from broker.workloads.models import Allocation, Explanation, ExplanationChange, Workload, WorkloadTransition
from broker.workloads.states import State

# Admissions per background batch: large enough that a batch's statements cost more than sending them.
ADMISSION_BATCH = 2000
# The first batches are smaller, doubling up to ADMISSION_BATCH, so the database starts as soon as the
# core admits anything and never waits for a batch after that: in a cycle of 20,000 admissions its work on
# them is the critical path, and the core makes admissions about three times as fast as it writes them.
FIRST_ADMISSION_BATCH = 250

ALLOCATION_COLUMNS = ("workload_id", "device_id", "device_class_id", "pod_set", "pod_index", "cycle_id", "allocated_at",
                      "released_at", "consumed_capacity", "share_millionths")  # fmt: skip
HISTORY_COLUMNS = ("workload_id", "cycle_id", "reason", "message", "at")
# An admitted workload's nomination and eviction record are done with. Set in the admission's own state
# UPDATE: a second pass over 20,000 just-rewritten rows (and their 17 indexes) cost as much as the first.
DONE_WITH_EVICTION = {
    "nominated_devices": [],
    "eviction_requested_at": None,
    "evicted_for": None,
    "eviction_rule": "",
    "eviction_message": "",
}


class AdmissionWriter:
    """Writes the admissions of one cycle, decided on `loaded`, for the cycle row `cycle`.

    `add(admission)` as the core makes each; then `finish(result.admissions)` (which also writes any
    admission of the result never added: a decider that does not stream still gets everything written),
    or `abandon()` on the way out of an error. `seconds` is the time `add` spent sending batches: the
    commit's work, though it ran while the core decided."""

    def __init__(self, loaded, cycle):
        self.loaded = loaded
        self.cycle = cycle
        self.now = loaded.now
        self.reason = f"admitted in cycle {cycle.pk}"
        self.streaming = is_postgresql()
        self.seconds = 0.0
        self.devices = []  # the allocated devices' pks, in the order written
        self.shares = defaultdict(list)  # Device pk -> what each share written of it consumes (time-sliced)
        self._unsent = []
        self._added = set()
        self._sent = []  # (ids by device class, the batch's Background)
        self._failure = None

    def add(self, admission):
        self._unsent.append(admission)
        self._added.add(admission.workload_id)
        batch = min(ADMISSION_BATCH, FIRST_ADMISSION_BATCH << len(self._sent))
        if self.streaming and self._failure is None and len(self._unsent) >= batch:
            started = time.perf_counter()
            try:
                self._send(self._unsent)
            except Exception as error:
                # The commit's failure, not the decision's: `finish` raises it, once every batch has ended.
                self._failure = error
            self._unsent = []
            self.seconds += time.perf_counter() - started

    def finish(self, admissions):
        """Write what is not written yet of `admissions` (the result's), wait for every batch and check
        it; returns the admitted workloads' pks, sorted. Raises StaleSnapshot, or the database error a
        batch met (as Django's)."""
        expected = {admission.workload_id for admission in admissions}
        if not self._added <= expected:
            self.abandon()
            raise RuntimeError("the core passed on admissions that its result does not hold")
        rest = self._unsent + [admission for admission in admissions if admission.workload_id not in self._added]
        self._unsent = []
        if not self.streaming:
            return self._write_now(rest)
        try:
            if rest and self._failure is None:
                self._send(rest)
        finally:
            self.abandon()  # every batch ended: the connection is this thread's again
        if self._failure is not None:
            raise self._failure
        if placed_twice(self.devices, self.shares):
            raise StaleSnapshot("the result places one device twice")
        admitted = []
        for by_class, batch in self._sent:
            for ids, moved in zip(by_class, batch.result(), strict=True):
                if len(moved) != len(ids):
                    refuse_left_pending(ids)
                admitted.extend(ids)
        return sorted(admitted)

    def abandon(self):
        """Wait until every batch sent has ended, whatever its outcome."""
        for _, batch in self._sent:
            batch.wait()

    def _by_class(self, admissions):
        by_class = defaultdict(list)
        class_pks = self.loaded.device_class_pks
        for admission in admissions:
            by_class[class_pks[admission.device_class]].append(int(admission.workload_id))
        return by_class

    def _fields(self, class_pk):
        return {"admitted_at": self.now, "chosen_device_class_id": class_pk, **DONE_WITH_EVICTION}

    def _send(self, admissions):
        """One batch, sent to the background after the batches before it: one statement that moves the
        workloads and writes every row of theirs. The rows go as a few arrays, made into their text here,
        for PostgreSQL to unnest: the helper thread then holds Python's lock for a moment per batch,
        where writing the rows one by one (110,000 of them for 20,000 admissions) held it as long as
        the core, deciding meanwhile, let it, and made each batch wait for it between network writes."""
        by_class = self._by_class(admissions)
        moves = [
            update_returning_sql(
                Workload.objects.filter(state=State.PENDING, **pk_in(ids)),
                {**self._fields(class_pk), "state": State.ADMITTED, "state_changed_at": self.now},
            )
            for class_pk, ids in by_class.items()
        ]
        columns = allocation_columns(admissions, self.loaded)
        self.devices.extend(columns.devices)
        for pk, amounts in columns.shares:
            self.shares[pk].append(amounts)
        sql, params = batch_statement(moves, columns, history_columns(admissions), self.cycle.pk, self.now, self.reason)

        def write(cursor):
            cursor.execute(sql, params)
            moved = [[] for _ in moves]
            for index, pk in cursor.fetchall():
                moved[index].append(pk)
            return moved

        previous = self._sent[-1][1] if self._sent else None
        self._sent.append((list(by_class.values()), Background(write, after=previous)))

    def _write_now(self, admissions):
        """Everything at once, with the ORM (SQLite): the cycle's write lock keeps the rows as read."""
        if not admissions:
            return []
        by_class = self._by_class(admissions)
        batches = [(ids, self._fields(class_pk)) for class_pk, ids in by_class.items()]
        moves = Moves(batches, State.PENDING, State.ADMITTED, self.now, self.reason)
        allocations = allocation_rows(admissions, self.loaded, self.cycle, self.now)
        self.devices.extend(row[1] for row in allocations)
        for row in allocations:
            if row[8] is not None:
                self.shares[row[1]].append(row[8])
        if placed_twice(self.devices, self.shares):
            moves.abandon()
            raise StaleSnapshot("the result places one device twice")
        admitted = []
        for (ids, _), moved in zip(batches, moves.finish(), strict=True):
            if len(moved) != len(ids):
                refuse_left_pending(ids)
            admitted.extend(ids)
        insert_rows(Allocation, ALLOCATION_COLUMNS, allocations)
        insert_rows(ExplanationChange, HISTORY_COLUMNS, history_rows(admissions, self.cycle, self.now))
        Explanation.objects.filter(**column_in("workload", admitted)).delete()
        return sorted(admitted)


def request_class_pks(admission, pod, class_pks):
    """{device id: DeviceClass pk} of a several-request claim's pod: each request's devices under its
    own class (quota and cost count them there); empty for any other pod (the admission's class)."""
    if not admission.request_classes or not pod.requests:
        return {}
    by_label = dict(admission.request_classes)
    return {
        device_id: class_pks[by_label[label]]
        for label, device_ids in pod.requests
        if label in by_label
        for device_id in device_ids
    }


def placed_twice(devices, shares):
    """Whether admissions hold one device twice: whole twice, or whole and shared (several shares of a
    device are fine: the commit checks what they take against its capacity)."""
    whole = [pk for pk in devices if pk not in shares] if shares else devices
    return len(set(whole)) != len(whole)


class GroupPod(NamedTuple):
    """A group claim's device as its allocation row names it: pod set GROUP_POD_SET + the claim's name,
    an index per device; the loader reads it back as the RunningWorkload's pseudo-pod."""

    pod_set: str
    index: int
    device_ids: tuple
    requests: tuple = ()
    consumed: tuple = ()


def allocated_pods(admission):
    """The admission's pods, then its group claims' devices (allocated once for the gang) as GroupPods."""
    group = admission.group_requests
    if not group:
        return admission.pods
    held = list(admission.pods)
    position: dict[str, int] = {}
    for label, device_ids in group:
        pod_set = GROUP_POD_SET + label.split("/", 1)[0]
        for device_id in device_ids:
            index = position[pod_set] = position.get(pod_set, -1) + 1
            held.append(GroupPod(pod_set, index, (device_id,)))
    return held


def allocation_rows(admissions, loaded, cycle, now):
    """The ALLOCATION_COLUMNS rows of the admissions' devices. A share's part of its device is fixed
    against the capacity loaded, which the commit holds to (commit.check_shares)."""
    rows = []
    device_pks = loaded.device_pks
    class_pks = loaded.device_class_pks
    capacity = loaded.shared_capacity
    for admission in admissions:
        workload_id = int(admission.workload_id)
        class_pk = class_pks[admission.device_class]
        for pod in allocated_pods(admission):
            consumed = dict(pod.consumed) if pod.consumed else None
            classes = request_class_pks(admission, pod, class_pks)
            for device_id in pod.device_ids:
                pk = device_pks[device_id]
                device_class = classes.get(device_id, class_pk)
                share = None if consumed is None else accounting.share_millionths(capacity.get(pk, {}), consumed)
                rows.append(
                    (workload_id, pk, device_class, pod.pod_set, pod.index, cycle.pk, now, None, consumed, share)
                )
    return rows


class AllocationColumns:
    """The allocation rows of some admissions, column by column: each column's array text for
    PostgreSQL ('{1,2,3}'), and the device pks in order. Pod sets go as indexes into `pod_sets` (a few
    distinct names among tens of thousands of pods); what time-sliced pods consume likewise, with the
    share of its device that makes (against `capacity`, Device pk -> the capacity loaded), as indexes
    into `consumed` and `share_millionths` (0: the device whole), and only when some pod shares
    (`consumed` is then non-empty)."""

    def __init__(
        self, workloads, devices, classes, pod_set_indexes, pod_indexes, pod_sets, consumed=None, capacity=None
    ):
        self.devices = devices
        self.arrays = [array_text(column) for column in (workloads, devices, classes, pod_set_indexes, pod_indexes)]
        self.pod_sets = pod_sets
        self.consumed = []  # the distinct amounts pods take, as JSON texts
        self.share_millionths = []  # the share of its device each of those takes there
        self.consumed_indexes = None  # array text of each row's 1-based index into them (0: whole)
        self.shares = []  # (Device pk, amounts) of every share
        if consumed is not None and any(consumed):
            capacity = capacity or {}
            distinct = {}
            indexes = []
            for pk, amounts in zip(devices, consumed, strict=True):
                if amounts:
                    share = accounting.share_millionths(capacity.get(pk, {}), amounts)
                    indexes.append(distinct.setdefault((amounts, share), len(distinct) + 1))
                    self.shares.append((pk, dict(amounts)))
                else:
                    indexes.append(0)
            self.consumed = [json.dumps(dict(amounts)) for amounts, _ in distinct]
            self.share_millionths = [share for _, share in distinct]
            self.consumed_indexes = array_text(indexes)


def array_text(values):
    return "{" + ",".join(map(str, values)) + "}"


def allocation_columns(admissions, loaded):
    device_pks = loaded.device_pks
    class_pks = loaded.device_class_pks
    workloads, devices, classes, pod_set_indexes, pod_indexes, consumed = [], [], [], [], [], []
    pod_sets = {}
    for admission in admissions:
        workload_id = int(admission.workload_id)
        class_pk = class_pks[admission.device_class]
        for pod in allocated_pods(admission):
            pod_set = pod_sets.setdefault(pod.pod_set, len(pod_sets) + 1)  # PostgreSQL counts from 1
            request_classes = request_class_pks(admission, pod, class_pks)
            for device_id in pod.device_ids:
                workloads.append(workload_id)
                devices.append(device_pks[device_id])
                classes.append(request_classes.get(device_id, class_pk) if request_classes else class_pk)
                pod_set_indexes.append(pod_set)
                pod_indexes.append(pod.index)
                consumed.append(pod.consumed)
    return AllocationColumns(
        workloads, devices, classes, pod_set_indexes, pod_indexes, list(pod_sets), consumed, loaded.shared_capacity
    )


def history_columns(admissions):
    """(workload pks, 1-based indexes into the distinct messages, the messages) of their history rows."""
    messages = {}
    workloads, indexes = [], []
    for admission in admissions:
        workloads.append(int(admission.workload_id))
        indexes.append(messages.setdefault(admitted_message(admission), len(messages) + 1))
    return workloads, indexes, list(messages)


def batch_statement(moves, allocations, history, cycle_pk, now, reason):
    """(sql, params) of one statement that runs `moves` (UPDATE ... RETURNING id statements, one per
    device class), writes a transition row for each workload they moved, the allocation and history rows,
    and deletes the workloads' explanations; it returns (index of the move, id) for each moved workload.
    (PostgreSQL runs every data-modifying part of a WITH once, to completion, on one snapshot.)"""
    quote = connection.ops.quote_name

    def table(model):
        return quote(model._meta.db_table)

    def column(model, name):
        return quote(model._meta.get_field(name).column)

    parts, params = [], []
    for index, (update, update_params) in enumerate(moves):
        parts.append(f"moved_{index} AS ({update})")
        params.extend(update_params)
    moved = " UNION ALL ".join(f"SELECT {index} AS move, id FROM moved_{index}" for index in range(len(moves)))
    transition = WorkloadTransition
    parts.append(
        f"transitions AS (INSERT INTO {table(transition)} ({column(transition, 'workload')}, "
        f"{column(transition, 'from_state')}, {column(transition, 'to_state')}, {column(transition, 'at')}, "
        f"{column(transition, 'reason')}) SELECT id, %s, %s, %s, %s FROM moved)"
    )
    params.extend([State.PENDING, State.ADMITTED, now, reason])
    by_attname = {field.attname: field.column for field in Allocation._meta.concrete_fields}
    allocation_names = ", ".join(quote(by_attname[name]) for name in ALLOCATION_COLUMNS)
    if allocations.consumed_indexes is None:  # every device whole
        parts.append(
            f"allocations AS (INSERT INTO {table(Allocation)} ({allocation_names}) "
            "SELECT w, d, c, (%s::text[])[s], i, %s, %s, NULL, NULL, NULL "
            "FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::int[], %s::int[]) AS a(w, d, c, s, i))"
        )
        params.extend([allocations.pod_sets, cycle_pk, now, *allocations.arrays])
    else:  # an index past the array (0) reads NULL: a whole device
        parts.append(
            f"allocations AS (INSERT INTO {table(Allocation)} ({allocation_names}) "
            "SELECT w, d, c, (%s::text[])[s], i, %s, %s, NULL, (%s::jsonb[])[k], (%s::int[])[k] "
            "FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::int[], %s::int[], %s::int[]) "
            "AS a(w, d, c, s, i, k))"
        )
        params.extend([allocations.pod_sets, cycle_pk, now, allocations.consumed, allocations.share_millionths])
        params.extend(allocations.arrays)
        params.append(allocations.consumed_indexes)
    workloads, indexes, messages = history
    change = ExplanationChange
    parts.append(
        f"history AS (INSERT INTO {table(change)} ({column(change, 'workload')}, {column(change, 'cycle')}, "
        f"{column(change, 'reason')}, {column(change, 'message')}, {column(change, 'at')}) "
        "SELECT w, %s, 'Admitted', (%s::text[])[m], %s FROM unnest(%s::bigint[], %s::int[]) AS h(w, m))"
    )
    params.extend([cycle_pk, messages, now, array_text(workloads), array_text(indexes)])
    parts.append(
        f"forgotten AS (DELETE FROM {table(Explanation)} WHERE {column(Explanation, 'workload')} = ANY(%s::bigint[]))"
    )
    params.append(array_text(workloads))
    sql = f"WITH {', '.join(parts[: len(moves)])}, moved AS ({moved}), {', '.join(parts[len(moves) :])} "
    return sql + "SELECT move, id FROM moved", params


def history_rows(admissions, cycle, now):
    return [(int(a.workload_id), cycle.pk, "Admitted", admitted_message(a), now) for a in admissions]


def refuse_left_pending(ids):
    """The UPDATE moves only workloads still Pending (and locks them, so none leaves Pending before this
    commit): one that moved on since the snapshot makes the decisions stale. Cheaper than locking 20k
    rows first just to look at them."""
    states = dict(Workload.objects.filter(**pk_in(ids)).values_list("id", "state"))
    for pk in ids:
        if states.get(pk) != State.ADMITTED:
            raise StaleSnapshot(f"workload {pk} was admitted but is now {states.get(pk, 'gone')}")
    raise StaleSnapshot("an admitted workload left Pending meanwhile")


def admitted_message(admission):
    pods = admission.pods
    devices = len(pods[0].device_ids) if len(pods) == 1 else sum(len(pod.device_ids) for pod in pods)
    devices += sum(len(device_ids) for _, device_ids in admission.group_requests)
    return admitted_text(len(pods), devices, admission.device_class, tuple(admission.domain.items()))


@lru_cache(maxsize=8192)
def admitted_text(pods, devices, device_class, domain):
    """A few thousand distinct texts among a large cycle's 20,000 admissions (shape by rack)."""
    where = ", ".join(f"{level} {name}" for level, name in domain) or "the cluster"
    return f"admitted: {pods} pods, {devices} {device_class} devices in {where}"
