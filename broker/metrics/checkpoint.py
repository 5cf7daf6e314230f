"""The history-walking metrics from a checkpoint plus the workloads touched since (issue #29).

Four figures walk every workload's history: the wait histogram (transitions), the seconds by reason
since the hourly rollup (explanation changes and exits), the workloads ever pended or wrongly classed by
reason (explanation changes) and the fallbacks (admitted workloads and their pod sets). At 100,000 devices
they were most of a scrape's 0.6 s. Each is a sum over workloads of a part that depends only on that
workload's own rows, so `take` stores every workload's part and their sum (HistoryCheckpoint,
WorkloadCheckpoint), and `history` reads the sum, takes away the stored parts of the workloads touched
since (a change or a transition with a later id, or a workload submitted since) and adds their parts
computed afresh. A stretch still open at the checkpoint grows by the time since, the same for each.

The result is the direct computation's, to the microsecond, as long as the checkpoint holds (see
HistoryCheckpoint): otherwise, or before the first, `history` computes directly. Rows deleted, or
committed late with an id below the checkpoint's, change the counts it stored, so it stops holding
until the next one. What it assumes: a workload leaves or re-enters the queue, and is given the device
class it runs on, through a transition (Workload.transition and the cycle's commit write one), and its
team, resource class and pod sets stay as submitted.

`take` runs after the rollup's catch-up (broker/metrics/tasks.py: beat every ROLLUP_INTERVAL_SECONDS,
or the embedded default's loop), so a scrape computes at most that interval's worth of touched workloads.
When the last checkpoint holds, `take` brings it forward the same way and rewrites only the touched
workloads' parts; it starts afresh (about 2 s at 100,000 devices) when it does not hold, which the
rollup reaching a new hour also causes, once an hour.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from django.db import connection, transaction
from django.db.models import Count, Max, Q

from broker.metrics import queries
from broker.metrics.models import HistoryCheckpoint, PendingSecondsProgress, WorkloadCheckpoint
from broker.workloads.models import ExplanationChange, Workload, WorkloadTransition

BATCH = 5000
# Beyond this many touched workloads (a checkpoint long overdue), their ids are too many to pass as
# parameters (SQLite allows 32,766) and the direct computation costs about as much.
MOST_TOUCHED = 20_000
# Two processes taking a checkpoint at once would write the same workloads' parts: the second skips.
ADVISORY_LOCK = 0x6D657472  # "metr"


class Touched:
    """The workloads with history after a checkpoint: an explanation change or a transition with a later
    id, or a workload itself created after it (its pod sets come with it). Read as a list of ids first:
    as subqueries ORed together, every read of the parts scanned its whole table."""

    def __init__(self, checkpoint):
        changes = ExplanationChange.objects.filter(pk__gt=checkpoint.last_change_id)
        transitions = WorkloadTransition.objects.filter(pk__gt=checkpoint.last_transition_id)
        ids = set(changes.values_list("workload_id", flat=True))
        ids.update(transitions.values_list("workload_id", flat=True))
        ids.update(Workload.objects.filter(pk__gt=checkpoint.last_workload_id).values_list("pk", flat=True))
        self.ids = sorted(ids)

    def on(self, field):
        """A Q on `field` (a workload id) selecting the touched workloads."""
        return Q(**{f"{field}__in": self.ids})


def parts(now, since, heads, workloads=None):
    """{workload id: its part} of every workload with one, or of those `workloads` (a Touched) selects.

    A part is JSON: "s", the seconds by reason since `since` up to `now` ([reason, team id, class id,
    microseconds, stretches, open stretches], as pending_us_by_reason clips them); "w", its completed
    waits ([team id, class id, outcome, microseconds]); "r", the reasons it was ever explained by
    ([reason, team id, class id]); "f", [team id, class id] when it was admitted on a fallback."""
    only = None if workloads is None else workloads.on("workload_id")
    seconds = defaultdict(dict)
    for workload_id, reason, team, resource_class, start, end, still in queries.stretches_by_workload(now, since, only):
        if since is not None:
            if end <= since and start < since:
                continue  # all of it lies in the rolled-up hours
            start = max(start, since)
        entry = seconds[workload_id].setdefault((reason, team, resource_class), [0, 0, 0])
        entry[0] += queries.microseconds(end - start)
        entry[1] += 1
        entry[2] += still
    out = defaultdict(dict)
    for workload_id, keys in seconds.items():
        out[workload_id]["s"] = [[*key, *values] for key, values in keys.items()]
    for workload_id, team, resource_class, outcome, wait in queries.waits_by_workload(only):
        out[workload_id].setdefault("w", []).append([team, resource_class, outcome, queries.microseconds(wait)])
    for workload_id, reason, team, resource_class in queries.reasons_by_workload(only):
        out[workload_id].setdefault("r", []).append([reason, team, resource_class])
    for workload_id, team, resource_class in queries.fallback_workloads(heads, workloads):
        out[workload_id]["f"] = [team, resource_class]
    return out


class Totals:
    """The sum of parts, by label ids: seconds {(reason, team, class): [us, stretches, open]}, waits
    {(team, class, outcome): WaitGroup}, reasons and fallbacks Counters."""

    def __init__(self):
        self.seconds = {}
        self.waits = {}
        self.reasons = Counter()
        self.fallbacks = Counter()

    def add(self, part, sign=1, grown=0):
        """Add a part (sign -1: take it away); `grown`: microseconds its open stretches have grown since
        it was computed."""
        for reason, team, resource_class, us, stretches, still in part.get("s", ()):
            entry = self.seconds.setdefault((reason, team, resource_class), [0, 0, 0])
            entry[0] += sign * (us + still * grown)
            entry[1] += sign * stretches
            entry[2] += sign * still
        for team, resource_class, outcome, us in part.get("w", ()):
            self.waits.setdefault((team, resource_class, outcome), queries.WaitGroup()).add(us, sign)
        for reason, team, resource_class in part.get("r", ()):
            self.reasons[(reason, team, resource_class)] += sign
        if "f" in part:
            self.fallbacks[tuple(part["f"])] += sign

    def advance(self, us):
        """The open stretches `us` microseconds later."""
        for entry in self.seconds.values():
            entry[0] += entry[2] * us

    def as_json(self):
        return {
            "s": [[*key, *entry] for key, entry in self.seconds.items() if any(entry)],
            "w": [[*key, group.count, group.total_us, group.le] for key, group in self.waits.items() if group.count],
            "r": [[*key, count] for key, count in self.reasons.items() if count],
            "f": [[*key, count] for key, count in self.fallbacks.items() if count],
        }

    @classmethod
    def from_json(cls, data):
        totals = cls()
        for reason, team, resource_class, us, stretches, still in data.get("s", ()):
            totals.seconds[(reason, team, resource_class)] = [us, stretches, still]
        for team, resource_class, outcome, count, total_us, le in data.get("w", ()):
            totals.waits[(team, resource_class, outcome)] = queries.WaitGroup(count=count, total_us=total_us, le=le)
        for reason, team, resource_class, count in data.get("r", ()):
            totals.reasons[(reason, team, resource_class)] = count
        for team, resource_class, count in data.get("f", ()):
            totals.fallbacks[(team, resource_class)] = count
        return totals

    def figures(self, rolled):
        """The four figures as the collector and the JSON report want them; `rolled` is the rollup's
        {(reason, team id, class id): microseconds} of the whole hours before the checkpoint's since."""
        seconds = Counter(rolled)
        for key, (us, stretches, _) in self.seconds.items():
            if stretches:  # a series of no time still shows (pending_us_by_reason)
                seconds[key] += us
        teams, classes = queries.label_names()

        def named(team, resource_class):
            return teams.get(team, ""), classes.get(resource_class, "")

        waits = {(*named(team, rc), outcome): group for (team, rc, outcome), group in self.waits.items()}
        reasons = Counter()
        for (reason, team, rc), count in self.reasons.items():
            reasons[(reason, *named(team, rc))] += count
        pended = [
            {"reason": reason, "team": team, "resource_class": rc, "count": count}
            for (reason, team, rc), count in sorted(reasons.items())
            if count
        ]
        fallbacks = Counter()
        for (team, rc), count in self.fallbacks.items():
            fallbacks[named(team, rc)] += count
        return {
            "waits": queries.wait_rows(waits),
            "seconds_by_reason": queries.seconds_rows(seconds),
            "workloads_by_reason": pended,
            "wrong_class": queries.wrong_class_requests(
                explained=[row for row in pended if row["reason"] in queries.WRONG_CLASS_REASONS],
                fallbacks=+fallbacks,
            ),
        }


def direct(now):
    """The four figures computed over the whole history (what `history` gives when no checkpoint holds)."""
    return {
        "waits": queries.wait_durations(),
        "seconds_by_reason": queries.pending_seconds_by_reason(now),
        "workloads_by_reason": queries.workloads_pended_by_reason(),
        "wrong_class": queries.wrong_class_requests(),
    }


def history(now, attempts=2):
    """The four figures at `now`: from the checkpoint and the workloads touched since when it holds,
    else directly."""
    for _ in range(attempts):
        checkpoint = HistoryCheckpoint.objects.filter(pk=HistoryCheckpoint.ROW).first()
        rolled, until = queries.rolled_pending_us(now)
        if checkpoint is None or not holds(checkpoint, now, until):
            break
        touched = Touched(checkpoint)
        if len(touched.ids) > MOST_TOUCHED:
            break
        totals, _ = brought_forward(checkpoint, now, until, touched)
        # A checkpoint taken meanwhile may have rewritten the parts read: they are the one read first's
        # only if it is still the one stored.
        if HistoryCheckpoint.objects.filter(pk=HistoryCheckpoint.ROW, taken_at=checkpoint.taken_at).exists():
            return totals.figures(rolled)
    return direct(now)


def brought_forward(checkpoint, now, until, touched):
    """(the checkpoint's totals at `now`, {workload id: part at `now`} of the workloads touched since)."""
    totals = Totals.from_json(checkpoint.totals)
    found = {}
    if touched.ids:
        stored = WorkloadCheckpoint.objects.filter(touched.on("pk")).values_list("part", "taken_at")
        for part, taken_at in stored:
            totals.add(part, sign=-1, grown=queries.microseconds(checkpoint.taken_at - taken_at))
    totals.advance(queries.microseconds(now - checkpoint.taken_at))
    if touched.ids:
        found = parts(now, until, queries.menu_heads(), touched)
        for part in found.values():
            totals.add(part)
    return totals, found


def fingerprint():
    """The last id and the row count of each table the parts are read from."""
    out = {}
    for model, last, count in (
        (ExplanationChange, "last_change_id", "changes"),
        (WorkloadTransition, "last_transition_id", "transitions"),
        (Workload, "last_workload_id", "workloads"),
    ):
        row = model.objects.aggregate(last=Max("pk"), count=Count("pk"))
        out[last], out[count] = row["last"] or 0, row["count"]
    return out


def rows_up_to(checkpoint):
    """The checkpoint's fingerprint as the tables hold it now: the rows up to its last ids."""
    return {
        "changes": ExplanationChange.objects.filter(pk__lte=checkpoint.last_change_id).count(),
        "transitions": WorkloadTransition.objects.filter(pk__lte=checkpoint.last_transition_id).count(),
        "workloads": Workload.objects.filter(pk__lte=checkpoint.last_workload_id).count(),
    }


def heads_json(heads):
    return sorted([resource_class, name] for resource_class, name in heads.items())


def holds(checkpoint, now, until):
    """Whether the checkpoint still describes the history before it (see HistoryCheckpoint)."""
    if now < checkpoint.taken_at or until != checkpoint.rolled_until:
        return False
    stored = {"changes": checkpoint.changes, "transitions": checkpoint.transitions, "workloads": checkpoint.workloads}
    return rows_up_to(checkpoint) == stored and heads_json(queries.menu_heads()) == checkpoint.menu_heads


def take(now):
    """Store the checkpoint at `now`: when the last one holds, its totals brought forward and the parts
    of the workloads touched since (a minute's worth on a running broker), else every workload's part
    and their sum. Returns how many parts it wrote, or None when another process is taking one or the
    rollup reaches past `now`."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                if outermost:
                    # Every read below sees one snapshot, so the fingerprint names exactly the rows read.
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK])
                if not cursor.fetchone()[0]:
                    return None
        until = PendingSecondsProgress.reached()
        if until is not None and until >= now:
            return None
        marks = fingerprint()
        heads = queries.menu_heads()
        last = HistoryCheckpoint.objects.filter(pk=HistoryCheckpoint.ROW).first()
        touched = Touched(last) if last is not None and holds(last, now, until) else None
        if touched is not None and len(touched.ids) <= MOST_TOUCHED:
            totals, found = brought_forward(last, now, until, touched)
            WorkloadCheckpoint.objects.filter(touched.on("pk")).delete()
        else:
            found = parts(now, until, heads)
            totals = Totals()
            for part in found.values():
                totals.add(part)
            WorkloadCheckpoint.objects.all().delete()
        WorkloadCheckpoint.objects.bulk_create(
            (
                WorkloadCheckpoint(workload_id=workload_id, taken_at=now, part=part)
                for workload_id, part in found.items()
            ),
            batch_size=BATCH,
        )
        HistoryCheckpoint.objects.update_or_create(
            pk=HistoryCheckpoint.ROW,
            defaults={
                "taken_at": now,
                "rolled_until": until,
                "menu_heads": heads_json(heads),
                "totals": totals.as_json(),
                **marks,
            },
        )
    return len(found)


def forget():
    """Drop the checkpoint: every figure is computed directly until the next one."""
    with transaction.atomic():
        WorkloadCheckpoint.objects.all().delete()
        HistoryCheckpoint.objects.all().delete()
