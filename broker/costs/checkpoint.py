"""The rollups' checkpoint inside the current hour (issue 29: reports as fast as pages).

The hourly rollup (rollup.py) stops at the last whole hour past LATE_WRITES; a report computed
everything after it from the history, and at 100k devices that is 100,000 held allocations and the
histories of 20,000 waiting workloads read on every request. The periodic task (rolling.checkpoint)
therefore also stores, for the stretch from the rollup's `until` (the checkpoint's `base`) to a recent
instant `until`:

- the exact amounts of [base, until), per hour and group, as the rollup stores whole hours
  (CostCheckpointRow, PendingCheckpointRow);
- what was open at `until`, per group: the devices held, or requested by waiting work, with the reason
  it waits for (CheckpointOpen). Shares of shared devices make these Fractions in millionths of a
  device (ledger.py): stored, as the rollups store amounts, as whole devices plus millionths.

A report then computes directly only the tail [until, now): the open groups billed on from `until`, and
for the workloads whose history has a row stamped at or after `until` (found through the BRIN indexes
of costs migration 0004), their own open part at `until` taken out again and their tail computed from
their history. Everything is exact (integers, or millionths with shares) and the ledger is linear in
its intervals, so the sum is the direct computation's (report.py and pending.py say how,
test_checkpoint.py holds it). One exception, as for a rolled-up hour: waiting work's requested shares
are read against the devices' capacities as published (pending.RequestedShares), and the checkpoint
keeps those of when it was taken, so a shared device republished with another capacity shows in the
cost of pending work only from the next checkpoint on. An allocation's share is fixed when it is made
(Allocation.share_millionths), so held shares read the same either way.

That needs every row stamped before `until` to be committed when the checkpoint reads the history:
`until` is taken before the oldest transaction open on the database then, less STAMP_LEAD (a writer
takes its time stamp a moment before it begins its transaction: the executor, a submission), and the
checkpoint is computed afterwards. SQLite has no view of other transactions: there `until` is
LATE_WRITES back, as for the hourly rollup.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Q

from broker import clock
from broker.costs import ledger, rollup
from broker.costs.models import Checkpoint, CheckpointOpen
from broker.workloads.models import Allocation, ExplanationChange, Workload, WorkloadTransition

STAMP_LEAD = timedelta(seconds=2)


def safe_until(now, late_writes):
    """The latest instant before which every row is committed, as far as this database tells: `now`, or
    the start of the oldest transaction open elsewhere on it if earlier, less STAMP_LEAD (on SQLite,
    `late_writes` before `now`)."""
    if connection.vendor != "postgresql":
        return now - late_writes
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # read the activity as it is now, not cached
        cursor.execute(
            "SELECT min(xact_start) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
        )
        oldest = cursor.fetchone()[0]
    return min(now, oldest or now) - STAMP_LEAD


def replace(name, base, until, open_groups):
    """Record the checkpoint `name` at [base, until) with `open_groups` {(device class id, team id, queue
    id, resource class id, reason): devices}; the caller has written its rows (in the same transaction).
    Devices are whole, or with shares of shared devices Fractions in millionths of one (ledger.py)."""
    CheckpointOpen.objects.bulk_create(
        CheckpointOpen(
            kind=name,
            device_class_id=class_id,
            team_id=team_id,
            queue_id=queue_id,
            resource_class_id=resource_class_id,
            reason=reason,
            devices=whole,
            devices_millionths=millionths,
        )
        for (class_id, team_id, queue_id, resource_class_id, reason), devices in open_groups.items()
        if devices
        for whole, millionths in (ledger.whole_and_millionths(devices),)
    )
    Checkpoint.objects.update_or_create(name=name, defaults={"base": base, "until": until})


def usable(name, start, end, now):
    """The Checkpoint `name` when a report may read it for its direct piece [start, end) at `now`: the
    piece begins where the hourly rollup ends, which is the checkpoint's base, and reaches past its
    `until`; else None. Not on a fractional billing scale, which floors every stretch: there only the
    history's own stretches bill as the history does."""
    if clock.billing_scale().denominator != 1:
        return None
    found = Checkpoint.objects.filter(name=name).first()
    if found is None or found.base != start or found.until > min(end, now) or found.base >= found.until:
        return None
    if rollup.rolled_until(name) != found.base:
        return None  # the hourly rollup moved on since: its `until` is no longer this base
    return found


def open_groups(name, team_ids=None):
    """[(device class id, team id, queue id, resource class id, reason, devices)] open at the checkpoint;
    devices as replace() was given them (an int, or a Fraction with shares)."""
    rows = CheckpointOpen.objects.filter(kind=name)
    if team_ids is not None:
        rows = rows.filter(team_id__in=team_ids)
    fields = ("device_class_id", "team_id", "queue_id", "resource_class_id", "reason")
    return [
        (*group, ledger.from_millionths(whole, millionths))
        for *group, whole, millionths in rows.values_list(*fields, "devices", "devices_millionths")
    ]


def holders_changed_since(until):
    """The ids of the workloads whose allocations have a time stamp at or after `until`."""
    rows = Allocation.objects.filter(Q(allocated_at__gte=until) | Q(released_at__gte=until))
    return set(rows.values_list("workload_id", flat=True).distinct().order_by())


def waiters_changed_since(until):
    """The ids of the workloads submitted, moved or explained anew at or after `until`."""
    found = set(Workload.objects.filter(submitted_at__gte=until).values_list("pk", flat=True).order_by())
    for model in (WorkloadTransition, ExplanationChange):
        found.update(model.objects.filter(at__gte=until).values_list("workload_id", flat=True).distinct().order_by())
    return found


@contextmanager
def one_snapshot():
    """Read a report in one snapshot on PostgreSQL (REPEATABLE READ): the checkpoint is rewritten every
    minute, and its rows must be those of the Checkpoint read. Inside a transaction already (a test, a
    request in one), its own isolation stands."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield
