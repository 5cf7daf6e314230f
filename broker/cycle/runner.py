"""One scheduling cycle (`run_once`), and what a process that runs cycles does before and between them.

A cycle is: take the cluster's cycle lock, load one snapshot, decide (pure), commit, all in one
transaction; the Celery task (broker.cycle.tasks) and the embedded default's loop
(broker.cycle.embedded) both call `run_once`.
"""

import gc
import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from broker.cycle.commit import DecisionFailed, StaleSnapshot, decide_and_commit
from broker.cycle.executor import get_executor
from broker.cycle.loader import INVENTORY_CACHE, PENDING_RECORDS, RUNNING_RECORDS, load_snapshot
from broker.cycle.locks import cycle_transaction, reading_snapshot
from broker.cycle.triggers import follow_up_requests, requests_so_far
from broker.events import request_cycle_after_commit
from broker.scheduler import heap
from broker.scheduler.cycle import decide, warm
from broker.workloads import changes
from broker.workloads.models import SchedulingCycle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CycleRun:
    cycle_id: int
    outcome: str
    admitted: tuple = ()
    preempted: tuple = ()


def run_once(now=None, decider=decide):
    """Run one cycle; returns CycleRun, or None when another cycle holds the lock. After a cycle that
    admitted or preempted many workloads, reads them back (`read_back`) once its hooks have run."""
    # No cyclic collection during the cycle: load, decide and commit already turn it off for themselves,
    # but between them (and in the after-commit hooks) the first allocation set off a pass over
    # everything the phase before had built and still held (the snapshot, the decisions): 100-400 ms a
    # cycle at 100k devices, for no garbage (what a cycle drops, reference counting frees). What the cycle
    # leaves behind is mostly what it found: the loader keeps its records, not equal new copies.
    try:
        with heap.collector_paused():
            run = _run_once(now, decider)
            if worth_reading_back(run):
                read_back()
            return run
    finally:
        keep_out_of_collections()


def worth_reading_back(run):
    """Whether `run` (a CycleRun or None) committed writes to enough workloads that the next cycle's load
    would spend a while building their records (CYCLE_READ_BACK_MIN_WORKLOADS)."""
    least = settings.CYCLE_READ_BACK_MIN_WORKLOADS
    return (
        run is not None
        and run.outcome == SchedulingCycle.Outcome.COMMITTED
        and 0 < least <= len(run.admitted) + len(run.preempted)
    )


def read_back(now=None):
    """Load the snapshot once more, in a transaction that only reads, right after a cycle's commit and
    its hooks (the executor has started the admitted workloads by then): the loader keeps what it built,
    so the next cycle's load finds the records of the workloads this one wrote, and patches only what
    changes from here on. A first cycle's 20,000 admissions are 20,000 running records that the next load
    built in 0.2-0.3 s at 100k devices; built here, between cycles, while the worker waits for the next
    beat. As kube-scheduler's informers keep its cache current between cycles rather than at their start.

    Returns the milliseconds it took, or None when it failed (logged; the next load reads them itself)."""
    started = time.perf_counter()
    try:
        with reading_snapshot():
            load_snapshot(now or timezone.now())
    except Exception:
        log.warning("reading back a cycle's writes failed; the next cycle reads them itself", exc_info=True)
        return None
    elapsed = (time.perf_counter() - started) * 1000
    log.debug("read back the cycle's writes in %.0f ms", elapsed)
    return elapsed


def keep_out_of_collections():
    """After a cycle (or warm-up, or what-if) that renewed much of what the process keeps: collect once,
    then freeze what is alive.

    The loader keeps the inventory and the running and pending work's records, the decision core its
    index, between cycles: up to a million long-lived objects, and containers of 20,000-100,000 entries,
    that every full pass of the cyclic collector walked, pausing pages and sockets of this process for
    50-300 ms each time. Frozen, they are left alone (reference counting still frees them when newer ones
    replace them; they hold no reference cycles). Collecting first keeps this cycle's own cyclic garbage
    out of the frozen set. The trigger is a large inventory read anew, or large record sets kept anew:
    any change in the running or pending work renews its whole set (a new dict and result of every
    record, most of them reused), so in a busy cluster that is most cycles, at the price of one pass
    over what is not frozen yet (20-40 ms at 100k devices, after the commit)."""
    devices = INVENTORY_CACHE.take_rebuilt()
    records = RUNNING_RECORDS.take_renewed() + PENDING_RECORDS.take_renewed()
    large_inventory = devices is not None and 0 < settings.GC_FREEZE_MIN_DEVICES <= devices
    large_records = 0 < settings.GC_FREEZE_MIN_RECORDS <= records
    if large_inventory or large_records:
        gc.collect()
        gc.freeze()


def _run_once(now, decider):
    seen = requests_so_far()
    with cycle_transaction() as acquired:
        if not acquired:
            return None
        now = now or timezone.now()
        transaction.on_commit(lambda: follow_up_requests(seen), robust=True)
        transaction.on_commit(lambda: changes.prune_when_due(now), robust=True)
        cycle = SchedulingCycle.objects.create(cluster=settings.CLUSTER_NAME, started_at=timezone.now())
        snapshot, loaded = load_snapshot(now)
        try:
            _, delta = decide_and_commit(decider, snapshot, loaded, cycle)
        except DecisionFailed as failure:
            # A crash in the core is a bug worth a row on the cycle-health page, not a silent gap.
            log.exception("cycle %s: the decision core failed", cycle.pk)
            cycle.outcome = SchedulingCycle.Outcome.FAILED
            cycle.finished_at = timezone.now()
            cycle.load_ms, cycle.generation, cycle.pending_count = (
                loaded.load_ms,
                loaded.generation,
                loaded.pending_count,
            )
            cycle.detail = f"decide: {failure}"
            cycle.save()
            return CycleRun(cycle.pk, cycle.outcome)
        except StaleSnapshot as error:
            log.info("cycle %s refused: %s", cycle.pk, error)
            # Decide again soon on a fresh snapshot rather than wait for the next tick.
            request_cycle_after_commit("previous cycle refused")
            return CycleRun(cycle.pk, cycle.outcome)
        except Exception:
            # The commit's savepoint is rolled back and the cycle row says Failed; keep that row.
            log.exception("cycle %s failed", cycle.pk)
            return CycleRun(cycle.pk, cycle.outcome)
        executor = get_executor()
        if delta.admitted:
            transaction.on_commit(lambda: executor.start(delta.admitted, timezone.now()))
        if delta.preempted:
            transaction.on_commit(lambda: executor.stop(delta.preempted, timezone.now()))
            request_cycle_after_commit("victims evicted")
        return CycleRun(cycle.pk, cycle.outcome, tuple(delta.admitted), tuple(delta.preempted))


def warm_up(now=None):
    """What a process that runs cycles does before its first one: read the inventory and the queued
    and running work, and decide once, in a transaction rolled back (nothing is written, no lock is
    taken), so that its first cycle finds the loader's records, the core's inventory index and the
    cluster as built (broker.scheduler.cycle.warm) kept, as every later cycle does. As kube-scheduler
    waits for its informers' caches to sync before it schedules: at 100k devices a cold cycle costs
    about a second more than a warm one.

    Returns the milliseconds it took, or None when it could not run (no database yet, say): the
    first cycle then reads everything itself."""
    started = time.perf_counter()
    try:
        with heap.collector_paused(), reading_snapshot():
            warm(load_snapshot(now or timezone.now())[0])
    except Exception:
        log.warning("warm-up before the first cycle failed; the first cycle reads everything", exc_info=True)
        return None
    finally:
        keep_out_of_collections()
    elapsed = (time.perf_counter() - started) * 1000
    log.info("warmed up for cycles in %.0f ms", elapsed)
    return elapsed
