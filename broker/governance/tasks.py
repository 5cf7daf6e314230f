"""The governance clock: escalate undecided approvals, close approval windows that passed.

Beat runs `governance_tick` (settings.CELERY_BEAT_SCHEDULE); the embedded runner calls `tick` each step."""

from celery import shared_task
from django.utils import timezone

from broker.governance import approvals


def tick(now=None):
    now = now or timezone.now()
    return {"escalated": approvals.escalate_overdue(now), "expired": approvals.expire_windows(now)}


@shared_task(name="broker.governance.tasks.governance_tick", ignore_result=True)
def governance_tick():
    done = tick()
    return {name: len(ids) for name, ids in done.items()}
