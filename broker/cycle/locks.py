"""Exactly one scheduling cycle per cluster at a time.

On PostgreSQL the guard is `pg_try_advisory_xact_lock`, taken as the first statement of the cycle's
REPEATABLE READ transaction: it holds across processes and machines, and it goes away with the
transaction, so a worker killed mid-cycle cannot leave it held. On SQLite (the embedded default, one
process) a process-wide lock keeps cycle threads apart, and SQLite's own write lock (the settings open
transactions IMMEDIATE) keeps any other writer out while the cycle runs.
"""

import hashlib
import threading
from contextlib import contextmanager

from django.conf import settings
from django.db import connection, transaction

_process_lock = threading.Lock()


def lock_key(cluster):
    """A stable signed 64-bit key per cluster (advisory locks take a bigint)."""
    digest = hashlib.blake2b(f"capacity-broker:cycle:{cluster}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def is_postgresql():
    return connection.vendor == "postgresql"


@contextmanager
def cycle_transaction(cluster=None):
    """Opens the cycle's transaction; yields True when this caller holds the cluster's cycle lock,
    False when another cycle is running (the caller should then do nothing)."""
    cluster = cluster or settings.CLUSTER_NAME
    if is_postgresql():
        outermost = not connection.in_atomic_block
        with transaction.atomic():
            with connection.cursor() as cursor:
                if outermost:
                    # Must come before any other statement: every read of the cycle sees one instant.
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [lock_key(cluster)])
                acquired = cursor.fetchone()[0]
            yield acquired
        return
    if not _process_lock.acquire(blocking=False):
        yield False
        return
    try:
        with transaction.atomic():
            yield True
    finally:
        _process_lock.release()


@contextmanager
def reading_snapshot():
    """A transaction that only reads, on one snapshot as a cycle does (REPEATABLE READ on PostgreSQL, when
    it is the outermost), without the cycle lock, and rolled back at the end whatever ran in it."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and is_postgresql():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield
        transaction.set_rollback(True)


@contextmanager
def excluding_cycles(cluster=None):
    """Opens a transaction no cycle of the cluster runs alongside: it waits for a running cycle to end,
    and a cycle that starts meanwhile finds the lock held and skips (the next tick runs it).

    For maintenance that rewrites rows a cycle may rewrite too (the retention's cleared references): a
    cycle's REPEATABLE READ commit that met such a concurrent update would fail instead of committing."""
    cluster = cluster or settings.CLUSTER_NAME
    if is_postgresql():
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key(cluster)])
            yield
        return
    with _process_lock, transaction.atomic():
        yield
