"""Messages say a cycle's times as UTC times: a cycle runs on epoch seconds, and "planned to start at
1.79642e+09" (what the claims bench's refill said before) told a reader nothing. A what-if's clock starts
at 0 and its times read "t=100 s"."""

from dataclasses import replace
from pathlib import Path

import pytest

from broker.scheduler.cycle import decide
from broker.scheduler.scenario import load_scenario
from broker.scheduler.snapshot import moment, span

SCENARIOS = Path(__file__).parent.parent / "scenarios"
EPOCH = 1_796_420_000.0  # a cycle's now: 2026-12-04 21:33:20 UTC


def at_epoch(snapshot):
    """The scenario as a cycle at EPOCH would see it: every time moved by the same amount."""
    pending = tuple(replace(w, submitted=w.submitted + EPOCH) for w in snapshot.pending)
    running = tuple(
        replace(w, started=w.started + EPOCH, expected_end=None if w.expected_end is None else w.expected_end + EPOCH)
        for w in snapshot.running
    )
    reservations = tuple(replace(r, start=r.start + EPOCH, end=r.end + EPOCH) for r in snapshot.reservations)
    return replace(snapshot, now=snapshot.now + EPOCH, pending=pending, running=running, reservations=reservations)


def messages(path):
    result = decide(at_epoch(load_scenario((SCENARIOS / path).read_text())))
    return {decision.workload_id: decision.message for decision in result.pending}


def test_it_says_when_a_held_rack_is_planned_to_start_in_utc():
    said = messages("backfill_with_durations.yaml")
    held = "rack r1 is held for big (priority 10, ahead in line), planned to start at 2026-12-04 21:35 UTC"
    assert said["small-long"].endswith(held)


def test_it_says_when_a_reservation_opens_in_utc():
    said = messages("reservation_window_ahead.yaml")
    assert "which opens at 2026-12-04 21:35 UTC, and it would run 500 s, past its start" in said["long"]


def test_it_says_the_same_planned_start_a_cycle_later():
    # An explanation is rewritten when its message changes: the plan's words must not move with now.
    snapshot = at_epoch(load_scenario((SCENARIOS / "backfill_with_durations.yaml").read_text()))
    now = decide(snapshot).pending
    later = decide(replace(snapshot, now=snapshot.now + 30)).pending
    assert [d.message for d in now] == [d.message for d in later]


def test_it_never_prints_the_clock():
    for path in ("backfill_with_durations.yaml", "backfill_depth.yaml", "reservation_window_ahead.yaml"):
        for message in messages(path).values():
            assert "e+09" not in message and "179642" not in message, message


def test_it_says_held_nodes_in_the_plural_and_one_node_in_the_singular():
    said = messages("claims_backfill_without_durations_nodes.yaml")
    assert "nodes n3, n4 are held for big" in said["four"]


@pytest.mark.parametrize(("at", "said"), [(0, "t=0 s"), (100, "t=100 s"), (1e9, "2001-09-09 01:46 UTC")])
def test_it_says_a_moment_on_the_clock_it_is_on(at, said):
    assert moment(at) == said


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(-3, "0 s"), (45, "45 s"), (599, "599 s"), (600, "10 min"), (3599, "60 min"), (3600, "1.0 h"), (5400, "1.5 h")],
)
def test_it_says_a_span_in_the_unit_a_reader_expects(seconds, said):
    assert span(seconds) == said
