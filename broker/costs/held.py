"""The allocations the top workloads' report reads, kept in this process from one report to the next
(issue 29: reports as fast as pages).

That report needs every workload's amount over the window, and at 100,000 devices grouping the window's
allocations per workload cost PostgreSQL about 100 ms a request, for groups nearly all equal to the last
request's. A process therefore keeps them (`Kept`) with the change log's Horizon of the snapshot they were
read in (broker.workloads.changes), and reads again only the allocations of the workloads written since,
as the cycle's loader does with its records.

A group is what the amount depends on: (device class, shared device, share, allocated at, released at),
times in microseconds (windows.to_us); the device and its share (report.SHARE_KEYS) only for an
allocation of a shared device. Its workloads hold some number of devices each under it, so its amount
over a window is computed once and multiplied.

Kept only for a report read in a transaction of its own (read-only: every row it sees is committed, and
stays so). Inside a caller's transaction, which may hold writes that are never committed (a test, a
caller's own writes), the groups are read whole and not kept; so are they on SQLite, which has no log,
and for a snapshot that misses a transaction the kept one saw (two reports at once in one process reach
the reading thread in another order than they took their snapshots; equal horizons do not tell which
came first, so the snapshots themselves are compared: `sees_all_of`).
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

from django.db import connection

from broker.costs.windows import to_us
from broker.workloads import changes

GROUPS_SQL = """
SELECT workload_id, device_class_id, CASE WHEN consumed_capacity IS NULL THEN NULL ELSE device_id END,
       COALESCE(share_millionths::text, consumed_capacity::text), allocated_at, released_at, count(*)
FROM workloads_allocation
WHERE (released_at IS NULL OR released_at > %(since)s) {only}
GROUP BY 1, 2, 3, 4, 5, 6
"""
ONLY_WORKLOADS = "AND workload_id = ANY(%(ids)s::bigint[])"
# Whether this transaction's snapshot sees every transaction the snapshot %(kept)s saw: none that ended
# before that one was taken (below its xmax, not in progress in it) is in progress in this one or after it.
SEES_ALL_OF_SQL = """
SELECT NOT EXISTS (
    SELECT FROM generate_series(pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
                                pg_snapshot_xmax(%(kept)s::pg_snapshot)::text::bigint - 1) AS x
    WHERE pg_visible_in_snapshot(x::text::xid8, %(kept)s::pg_snapshot)
      AND NOT pg_visible_in_snapshot(x::text::xid8, pg_current_snapshot()))
"""
# The kept groups of allocations released before a report's window start are dropped once it has moved
# this far past the earliest start they were kept for (a rolling window's start moves every request).
DROP_RELEASED_AFTER = timedelta(hours=6)


class Kept:
    """Groups of allocations held at or after `since`: `by_group` {group: {workload id: devices}} and,
    to replace a workload's, `by_workload` {workload id: (group, ...)}; read in the snapshot of
    `horizon`."""

    def __init__(self, horizon, since, rows, snapshot=None):
        self.horizon, self.since, self.snapshot = horizon, since, snapshot
        self.by_group, self.by_workload = {}, {}
        self._add(rows)

    def _add(self, rows):
        by_group, by_workload = self.by_group, self.by_workload
        for workload_id, group, devices in rows:
            holders = by_group.get(group)
            if holders is None:
                holders = by_group[group] = {}
            holders[workload_id] = holders.get(workload_id, 0) + devices
            by_workload[workload_id] = (*by_workload.get(workload_id, ()), group)

    def replace(self, workload_ids, rows, horizon, snapshot):
        """The groups of `workload_ids` as `rows` (read in `snapshot`, of `horizon`) say now."""
        for workload_id in workload_ids:
            for group in self.by_workload.pop(workload_id, ()):
                holders = self.by_group[group]
                holders.pop(workload_id, None)
                if not holders:
                    del self.by_group[group]
        self._add(rows)
        self.horizon, self.snapshot = horizon, snapshot

    def drop_released_before(self, since):
        since_us = to_us(since)
        for group in [group for group in self.by_group if group[4] is not None and group[4] <= since_us]:
            for workload_id in self.by_group.pop(group):
                left = tuple(kept for kept in self.by_workload[workload_id] if kept != group)
                if left:
                    self.by_workload[workload_id] = left
                else:
                    del self.by_workload[workload_id]
        self.since = since


def current_snapshot():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_snapshot()::text")
        return cursor.fetchone()[0]


def sees_all_of(snapshot):
    """Whether this transaction's snapshot sees every transaction `snapshot` (pg_snapshot text) saw."""
    with connection.cursor() as cursor:
        cursor.execute(SEES_ALL_OF_SQL, {"kept": snapshot})
        return cursor.fetchone()[0]


def read_rows(since, workload_ids=None):
    """[(workload id, group, devices)] of the allocations held at or after `since`, of `workload_ids`
    only when given, in this transaction's snapshot."""
    params = {"since": since}
    only = ""
    if workload_ids is not None:
        params["ids"] = "{" + ",".join(map(str, workload_ids)) + "}"
        only = ONLY_WORKLOADS
    with connection.cursor() as cursor:
        cursor.execute(GROUPS_SQL.format(only=only), params)
        rows = cursor.fetchall()
    return [
        (workload_id, (class_id, device, consumed, to_us(held_from), None if held_to is None else to_us(held_to)), n)
        for workload_id, class_id, device, consumed, held_from, held_to, n in rows
    ]


_KEPT = {"pid": None, "kept": None}
_LOCK = threading.Lock()


def groups(since, keep):
    """{group: {workload id: devices}} of the allocations held at or after `since`, in this transaction's
    snapshot; read mostly from what this process kept when `keep` (a transaction of the report's own, on
    PostgreSQL). The caller only reads the answer, and is done with it before the next call with `keep`
    may change it: that caller is the process's one pieces thread (report._beside), which runs one report
    at a time."""
    if not keep or connection.vendor != "postgresql":
        return Kept(None, since, read_rows(since)).by_group
    with _LOCK:
        if _KEPT["pid"] != os.getpid():  # a forked child has its parent's memory, not its connection's view
            _KEPT["pid"], _KEPT["kept"] = os.getpid(), None
        kept = _KEPT["kept"]
        horizon, snapshot = changes.current_horizon(), current_snapshot()
        newer = kept is None or sees_all_of(kept.snapshot)
        if newer and kept is not None and since >= kept.since:
            written = changes.written_since(kept.horizon, horizon)
            if written is not None:
                if written:
                    kept.replace(written, read_rows(kept.since, sorted(written)), horizon, snapshot)
                else:
                    kept.horizon, kept.snapshot = horizon, snapshot
                if since - kept.since > DROP_RELEASED_AFTER:
                    kept.drop_released_before(since)
                return kept.by_group
        fresh = Kept(horizon, since, read_rows(since), snapshot)
        if newer:
            _KEPT["kept"] = fresh  # else this snapshot misses what the kept one saw: the kept one stays
        return fresh.by_group


def forget():
    """Drop what this process kept (tests that rebuild the database under it)."""
    with _LOCK:
        _KEPT["kept"] = None
