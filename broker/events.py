"""The hooks through which a lower layer announces an event to the layers above it.

Services and the cycle never import the code that reacts to what they did (the cycle's trigger, the live
pages, the approvers' socket): they send one of these signals once their transaction commits, and the
layer above connects its receivers when its app is ready (broker.cycle.apps, broker.governance.apps).

- `cycle_wanted(reason)`: a committed change needs a scheduling cycle soon (a submission, a cancellation,
  a completion, an inventory change). The cycle's trigger debounces them (broker.cycle.triggers).
- `cycle_committed(message)`: a cycle committed; `message` is the compact delta for the live pages.
- `decisions_made(cycle_id, admitted, preempted)`: sent by the cycle's commit *inside* its transaction,
  after its decisions are written and before it commits, so a receiver's writes (the Kubernetes bridge's
  outbox of decisions to apply, broker.kube.outbox) commit or roll back with them. A receiver that raises
  fails the commit: a decision is never committed without what must follow it.
- `approval_changed(kind, workload_id)`: an approval request was opened, decided, escalated or updated
  (`kind`: "approval.requested", "approval.decided", "approval.updated", "approval.escalated").
"""

import threading
from contextlib import contextmanager

from django.db import transaction
from django.dispatch import Signal

cycle_wanted = Signal()
cycle_committed = Signal()
decisions_made = Signal()
approval_changed = Signal()


_batch = threading.local()


def request_cycle_after_commit(reason=""):
    """Ask for a cycle once the current transaction commits (never for a rolled-back change)."""
    reasons = getattr(_batch, "reasons", None)
    if reasons is not None:
        reasons.append(reason)
        return
    transaction.on_commit(lambda: cycle_wanted.send(sender=None, reason=reason))


@contextmanager
def one_cycle_request():
    """Within it, every change that asks for a cycle adds its reason to one request, asked once the
    transaction commits: a batch of changes (the Kubernetes sync's watch events) asks once, not once per
    change. Used inside the transaction; nothing is asked if the block raises (a change rolled back to a
    savepoint within it still counts: that cycle merely finds nothing new)."""
    outer = getattr(_batch, "reasons", None)
    _batch.reasons = reasons = [] if outer is None else outer
    try:
        yield
    finally:
        _batch.reasons = outer
    if outer is None and reasons:
        named = list(dict.fromkeys(reason for reason in reasons if reason))
        reason = named[0] if named else ""
        if len(named) > 1:
            reason += f" (and {len(named) - 1} more changes)"
        request_cycle_after_commit(reason)


def approval_changed_after_commit(kind, workload_id):
    transaction.on_commit(lambda: approval_changed.send(sender=None, kind=kind, workload_id=workload_id))
