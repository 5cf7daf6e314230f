"""Which workloads were written since an earlier load's snapshot (PostgreSQL's change log).

Triggers log every statement that writes a workload, its pod sets, its allocations or its approval
request, with the writing transaction's id (workloads migration 0018). A load notes where it stands
(`Horizon`): the oldest transaction its snapshot may not have seen. Every write that snapshot missed
was made by a transaction at or past that point, so the next load reads the log rows from there on
(`written_since`), and then only the rows of those workloads. Some of what it reads was seen already
(transactions that had committed between the horizon and the snapshot): read again, it is read equal.

The answer is None, "read everything", on SQLite (no log), for a first load, for a horizon from another
database's log, once the log was pruned past the horizon (a worker idle for longer than KEPT_FOR), and
after a write that may have changed every workload (a TRUNCATE; a queue, team or resource class
renamed).
"""

import threading
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction

KEPT_FOR = timedelta(minutes=10)  # a worker that loaded within this reads only what changed
PRUNE_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class Horizon:
    token: str  # the log's, with its database's oid and the server's start: each database has its own
    xid: int


def current_horizon():
    """The Horizon of this transaction's snapshot (read before any row it is the horizon of), or None
    without a log. This transaction's own writes count as unseen too: a test's, or a load after writes
    in one transaction, must find them in the next load."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        # The log's token names its database; with the database's oid and the server's start, a copy
        # restored elsewhere (token and all, but other transaction ids) is another log too.
        cursor.execute(
            "SELECT concat_ws('/', token, (SELECT oid FROM pg_database WHERE datname = current_database()),"
            " pg_postmaster_start_time()),"
            " least(pg_snapshot_xmin(pg_current_snapshot()), pg_current_xact_id_if_assigned())::text::bigint"
            " FROM workloads_change_log_state"
        )
        token, xid = cursor.fetchone()
    return Horizon(token, xid)


def written_since(since, now_at):
    """The ids of the workloads written since the Horizon `since`, as seen from the Horizon `now_at` of
    this transaction (current_horizon): a frozenset, or None when everything must be read."""
    if since is None or now_at is None or since.token != now_at.token:
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pruned_below::text::bigint <= %s FROM workloads_change_log_state",
            [since.xid],
        )
        if not cursor.fetchone()[0]:
            return None
        cursor.execute("SELECT workload_ids FROM workloads_change_log WHERE xid >= %s::text::xid8", [str(since.xid)])
        written = set()
        for (ids,) in cursor.fetchall():
            if ids is None:
                return None
            written.update(ids)
    return frozenset(written)


_pruning = {"due": None, "lock": threading.Lock()}


def prune(now):
    """Delete the log rows older than KEPT_FOR, and raise `pruned_below` past them, in one transaction;
    returns how many went. A worker whose horizon is below `pruned_below` then reads everything."""
    if connection.vendor != "postgresql":
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "WITH gone AS (DELETE FROM workloads_change_log WHERE written_at < %s RETURNING xid::text::bigint AS xid) "
            "UPDATE workloads_change_log_state SET pruned_below = greatest("
            "  pruned_below, coalesce((SELECT max(xid) + 1 FROM gone), 0)::text::xid8"
            ") RETURNING (SELECT count(*) FROM gone)",
            [now - KEPT_FOR],
        )
        return cursor.fetchone()[0]


def prune_when_due(now):
    """prune(now) once every PRUNE_EVERY in this process (the cycle calls it after each commit); the
    count, or None when not due."""
    with _pruning["lock"]:
        if _pruning["due"] is not None and now < _pruning["due"]:
            return None
        _pruning["due"] = now + PRUNE_EVERY
    return prune(now)
