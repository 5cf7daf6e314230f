"""The workload state machine: which transitions are allowed, and which states are final."""

from django.db import models


class State(models.TextChoices):
    SUBMITTED = "Submitted"
    AWAITING_APPROVAL = "AwaitingApproval"
    PENDING = "Pending"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    PREEMPTED = "Preempted"
    CANCELLED = "Cancelled"
    # An approver said no: the request leaves the queue for good (a new submission is a new request).
    REJECTED = "Rejected"


TRANSITIONS = {
    State.SUBMITTED: {State.AWAITING_APPROVAL, State.PENDING, State.CANCELLED, State.FAILED},
    State.AWAITING_APPROVAL: {State.PENDING, State.CANCELLED, State.REJECTED},
    State.PENDING: {State.ADMITTED, State.CANCELLED, State.FAILED},
    State.ADMITTED: {State.RUNNING, State.PREEMPTED, State.CANCELLED, State.FAILED},
    State.RUNNING: {State.SUCCEEDED, State.FAILED, State.PREEMPTED, State.CANCELLED},
    # A preempted workload goes back to its queue, as Kueue requeues evicted workloads.
    State.PREEMPTED: {State.PENDING, State.CANCELLED},
    State.SUCCEEDED: set(),
    State.FAILED: set(),
    State.CANCELLED: set(),
    State.REJECTED: set(),
}

FINAL_STATES = frozenset(state for state, targets in TRANSITIONS.items() if not targets)
HOLDING_STATES = frozenset({State.ADMITTED, State.RUNNING})
WAITING_STATES = frozenset({State.SUBMITTED, State.AWAITING_APPROVAL, State.PENDING, State.PREEMPTED})


class InvalidTransition(Exception):
    def __init__(self, current, target):
        self.current = current
        self.target = target
        allowed = ", ".join(sorted(TRANSITIONS[State(current)])) or "none (final state)"
        super().__init__(f"A {current} workload cannot become {target}; allowed: {allowed}.")


def can_transition(current, target):
    return State(target) in TRANSITIONS[State(current)]
