"""Deltas for the live socket, built from the database (the truth), filtered per user.

The cycle glue sends `{"type": "cycle.committed", "cycle": id, "admitted": [...], "preempted": [...],
"explanations": [...]}` (broker.cycle.commit.CommitDelta.message) to the "cycle" group after every
commit; operator actions here send `{"type": "inventory.changed", "racks": [...]}` to the "inventory"
group. Each consumer turns either into one delta for its user: full rows for workloads the user may
read, bare counts for the rest.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import transaction

from broker import live
from broker.workloads.models import Allocation, SchedulingCycle
from broker.workloads.states import WAITING_STATES
from dashboard import queries
from dashboard.inventory_state import state_key

log = logging.getLogger(__name__)

CYCLE_GROUP = live.CYCLE_GROUP
INVENTORY_GROUP = "inventory"
GROUPS = (CYCLE_GROUP, INVENTORY_GROUP)
MAX_ROWS = 500

# Work shared by every socket in this process for one event: computed once, not once per user.
_shared = {}


def inventory_changed(domain_ids):
    """Tell every socket that some racks changed by hand (after the transaction commits)."""
    racks = sorted({int(d) for d in domain_ids if d is not None})

    def send():
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(INVENTORY_GROUP, {"type": "inventory.changed", "racks": racks})
        except Exception:
            # The change is committed; with Redis down the pages say live updates are paused.
            log.warning("could not tell the sockets that racks %s changed", racks, exc_info=True)

    transaction.on_commit(send)


def last_cycle():
    """The last committed cycle's id: a page drawn after it needs no catch-up when its socket opens."""
    committed = SchedulingCycle.objects.filter(outcome=SchedulingCycle.Outcome.COMMITTED)
    return committed.values_list("pk", flat=True).first()


def fresh_user(user):
    """Roles and teams may change while a socket is open; read them again for every event."""
    return get_user_model().objects.get(pk=user.pk)


def _ids(values):
    out = []
    for value in values or ():
        try:
            out.append(int(value))
        except (TypeError, ValueError):
            continue
    return out


def shared_state(event_key, racks=None):
    """Device counters, capacity and heatmap cells for one event, once per event per process (not once
    per socket): the first socket to handle the event reads them (from the cache shared with the pages,
    computed once per change of the inventory state), the others reuse them. `racks`: a callable
    giving the ids of the racks whose cells the delta carries."""
    found = _shared.get(event_key)
    if found is None:
        key = state_key()
        summary = queries.shared_summary(key)
        found = {
            "summary": summary,
            "capacity": summary["capacity"],
            "racks": queries.rack_cells(set(racks()) if racks else set(), key),
        }
        _shared.clear()
        _shared[event_key] = found
    return found


def workload_rows(user, ids):
    """Full rows for the workloads among `ids` the user may read, in id order."""
    visible = queries.annotate_devices(
        queries.visible_workloads(user).filter(pk__in=ids[:MAX_ROWS]).select_related("team", "queue", "resource_class")
    ).order_by("id")
    explanations = {w.pk: getattr(w, "explanation", None) for w in visible.select_related("explanation")}
    rows = []
    for workload in visible:
        row = queries.workload_row(workload, explanation=explanations.get(workload.pk) or False)
        if workload.state not in WAITING_STATES:
            row["where"] = ""
        rows.append(row)
    if rows:
        where = queries.placement_summary([row["id"] for row in rows if row["state"] not in WAITING_STATES])
        for row in rows:
            if row["state"] not in WAITING_STATES:
                row["where"] = where.get(row["id"], "")
    return rows


def touched_racks(workload_ids):
    return set(
        Allocation.objects.filter(workload_id__in=workload_ids)
        .order_by()
        .values_list("device__node__domain_id", flat=True)
        .distinct()
    )


def counts_hidden(user, ids):
    if not ids:
        return 0
    visible = queries.visible_workloads(user).filter(pk__in=ids).count()
    return len(ids) - visible


def merge_events(events):
    """One event for several that queued for a socket, in order: the last cycle's, with the workloads of
    every cycle among them and the racks of every inventory change (`racks`), or one inventory change
    of all their racks when no cycle is among them."""
    cycles = [event for event in events if event.get("type") == "cycle.committed"]
    racks = sorted(
        {rack for event in events if event.get("type") == "inventory.changed" for rack in _ids(event.get("racks"))}
    )
    if not cycles:
        return {"type": "inventory.changed", "racks": racks}
    if len(cycles) == 1 and not racks:
        return cycles[0]
    merged = {"type": "cycle.committed", "cycle": cycles[-1].get("cycle")}
    for key in ("admitted", "preempted", "explanations"):
        merged[key] = list(dict.fromkeys(pk for event in cycles for pk in _ids(event.get(key))))
    merged["racks"] = racks
    return merged


def delta_for(user, events):
    """One user's delta for the events that queued for their socket (a list, oldest first)."""
    event = merge_events(events)
    if event["type"] == "cycle.committed":
        return cycle_delta(user, event)
    return inventory_delta(user, event)


def cycle_delta(user, event):
    """One user's view of a committed cycle (`racks`: more racks whose cells it carries, those of
    inventory changes merged into it)."""
    user = fresh_user(user)
    admitted, preempted, changed = (
        _ids(event.get("admitted")),
        _ids(event.get("preempted")),
        _ids(event.get("explanations")),
    )
    moved = list(dict.fromkeys([*admitted, *preempted, *changed]))
    more_racks = set(_ids(event.get("racks")))
    # Keyed by what the racks depend on: sockets that merged different events need different cells.
    key = ("cycle", event.get("cycle"), frozenset(admitted) | frozenset(preempted), frozenset(more_racks))
    shared = shared_state(key, racks=lambda: touched_racks([*admitted, *preempted]) | more_racks)
    return {
        "type": "delta",
        "cycle": event.get("cycle"),
        "workloads": workload_rows(user, moved),
        # More moved than a delta carries rows for: a page showing single workloads reads its own.
        "rows_cut": len(moved) > MAX_ROWS,
        "admitted": sorted(
            queries.visible_workloads(user).filter(pk__in=admitted[:MAX_ROWS]).values_list("id", flat=True)
        ),
        "hidden": {
            "admitted": counts_hidden(user, admitted),
            "preempted": counts_hidden(user, preempted),
            "changed": counts_hidden(user, changed),
        },
        "counters": queries.counters(user, shared["summary"]),
        "pending_by_reason": queries.pending_by_reason(user),
        "capacity": shared["capacity"],
        "racks": shared["racks"],
    }


def inventory_delta(user, event):
    user = fresh_user(user)
    racks = _ids(event.get("racks"))
    shared = shared_state(("inventory", tuple(racks), id(event)), racks=lambda: racks)
    return {
        "type": "delta",
        "cycle": None,
        "workloads": [],
        "rows_cut": False,
        "admitted": [],
        "hidden": {"admitted": 0, "preempted": 0, "changed": 0},
        "counters": queries.counters(user, shared["summary"]),
        "pending_by_reason": queries.pending_by_reason(user),
        "capacity": shared["capacity"],
        "racks": shared["racks"],
    }
