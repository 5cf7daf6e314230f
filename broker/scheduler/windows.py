"""Reservation windows that have not opened yet, seen ahead in time (Slurm's rule for advanced
reservations, issue 27).

A reservation is materialised on concrete devices only while its window is open (capacity._reserve).
Before that, the nodes it will take are known: the devices it would take if it opened now (the owner's
running work first, then free devices, then other teams' preemptible work, in device order). Work of
another team that is not preemptible may not be placed on those nodes when its expected run overlaps
the window (it starts now and would end after the window opens, or its duration is unknown): it would
hold the reserved devices when their team comes for them. Preemptible work may, and is evicted when the
window opens (ReservationReclaim). Like Slurm, windows hold whole nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.scheduler.capacity import BLOCKED, _reservation_tier
from broker.scheduler.snapshot import Reservation, moment


@dataclass(frozen=True)
class Window:
    reservation: Reservation
    nodes: frozenset

    def blocks(self, team: str, preemptible: bool, duration: float | None, now: float) -> bool:
        """Whether work of `team` starting now would overrun the window on these nodes."""
        if preemptible or team == self.reservation.team:
            return False
        return duration is None or now + duration > self.reservation.start

    def describe(self, level_names) -> str:
        reservation = self.reservation
        domain = reservation.domain or {}
        where = ", ".join(f"{level} {domain[level]}" for level in level_names if level in domain)
        return (
            f"reservation {reservation.name} (team {reservation.team}, {reservation.count} {reservation.device_class}"
            f"{' in ' + where if where else ''}), which opens at {moment(reservation.start)}"
        )


def future_windows(state, snapshot) -> list[Window]:
    """The windows opening after now (and before the end of time), by name, with the nodes they take."""
    now = snapshot.now
    upcoming = [r for r in snapshot.reservations if now < r.start and math.isfinite(r.start) and r.count > 0]
    if not upcoming:
        return []
    team_of_queue = {queue.name: queue.team for queue in snapshot.queues}
    team_of_holder = {workload.id: team_of_queue.get(workload.queue) for workload in snapshot.running}
    preemptible = {workload.id for workload in snapshot.running if workload.preemptible}
    windows = []
    for reservation in sorted(upcoming, key=lambda r: r.name):
        class_index = state.class_index.get(reservation.device_class)
        if class_index is None:
            continue
        tiers = sorted(
            (
                (_reservation_tier(slot, reservation.team, team_of_holder, preemptible), slot.order, slot)
                for slot in state.slots
                if slot.owner is None
                and class_index in slot.classes
                and slot.category != BLOCKED
                and state._in_domain(slot.node, reservation.domain)
            ),
            key=lambda entry: entry[:2],
        )
        chosen = [slot for tier, _, slot in tiers if tier < 3][: reservation.count]
        if chosen:
            windows.append(Window(reservation, frozenset(slot.node for slot in chosen)))
    return windows
