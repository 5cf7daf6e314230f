"""The embedded default's background loop: what Celery beat and workers do in production, in one thread.

It exists only for `manage.py serve` on the embedded default: it is started there and nowhere else (not on
import, not in tests, migrations or Celery), and it runs the trace replay, the simulated executor, the
governance clock, a cycle every CYCLE_INTERVAL_SECONDS (or sooner when a cycle is requested), the hourly
rollups' catch-up every ROLLUP_INTERVAL_SECONDS, and once a day the retention pass.
"""

import logging
import threading
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from broker.costs import tasks as cost_tasks
from broker.cycle import retention
from broker.cycle.executor import get_executor
from broker.cycle.runner import run_once, warm_up
from broker.cycle.triggers import wait_for_request
from broker.governance.tasks import tick as governance_tick
from broker.metrics import tasks as metrics_tasks

log = logging.getLogger(__name__)

RETENTION_PERIOD = timedelta(days=1)


class Runner(threading.Thread):
    """The embedded default's background loop: replay, executor, cycle, the rollups' catch-up, and once a
    day the retention pass that beat runs in production; one step at a time."""

    def __init__(self, interval=None, replay=None):
        super().__init__(name="capacity-broker-runner", daemon=True)
        self.interval = interval or settings.CYCLE_INTERVAL_SECONDS
        self.replay = replay
        self.stopping = threading.Event()
        self.next_retention = None  # the first step prunes what an earlier run left behind
        self.next_rollup = None  # the first step catches up what the rollups missed while stopped

    def stop(self):
        self.stopping.set()

    def run(self):
        executor = get_executor()
        if settings.CYCLE_WARM_UP:
            warm_up()
        while not self.stopping.is_set():
            close_old_connections()
            self.step(executor)
            wait_for_request(self.interval)
        close_old_connections()

    def step(self, executor):
        now = timezone.now()
        for name, action in (
            ("replay", lambda: self.replay.tick(now) if self.replay else None),
            ("executor", lambda: executor.advance(now)),
            ("governance", lambda: governance_tick(now)),
            ("cycle", run_once),
            ("rollups", lambda: self.roll_up_when_due(now)),
            ("retention", lambda: self.prune_when_due(now)),
        ):
            try:
                action()
            except Exception:
                # One bad step must not stop the demo; the next tick tries again.
                log.exception("runner step %s failed", name)

    def prune_when_due(self, now):
        """retention.prune_history's counts when a day has passed since the last pass (or none ran yet),
        else None. The next pass is due a day on even when this one fails: the log says why, and
        retrying every tick would repeat the failure 28,800 times a day."""
        if self.next_retention is not None and now < self.next_retention:
            return None
        self.next_retention = now + RETENTION_PERIOD
        return retention.prune_history(now)

    def roll_up_when_due(self, now):
        """What beat's rollup tasks do, when ROLLUP_INTERVAL_SECONDS have passed since the last time (or
        none ran yet): {"costs": {kind: hours}, "pending_seconds": hours}, else None. One failing rollup
        does not keep the other from running; the log says why."""
        if self.next_rollup is not None and now < self.next_rollup:
            return None
        self.next_rollup = now + timedelta(seconds=settings.ROLLUP_INTERVAL_SECONDS)
        done = {}
        for name, roll_up in (("costs", cost_tasks.roll_up), ("pending_seconds", metrics_tasks.roll_up)):
            try:
                done[name] = roll_up()
            except Exception:
                log.exception("rollup %s failed", name)
        return done
