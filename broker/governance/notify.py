"""Channels groups for approvals: approvers learn of new and changed requests, admins of escalations.

The approval services announce each change through broker.events.approval_changed; the receiver here
(connected by broker.governance.apps) picks the group. Messages carry only a workload id; each consumer
reads what its user may see from the database, and the approvals page also lists everything on load, so
a lost message costs only the live update."""

from django.dispatch import receiver

from broker import events, live

APPROVERS = "approvals"
ADMINS = "approvals.admins"

# Escalations go to admins (they decide what nobody else did); everything else to the approvers.
GROUP_OF_KIND = {"approval.escalated": ADMINS}


def group_for(kind):
    return GROUP_OF_KIND.get(kind, APPROVERS)


@receiver(events.approval_changed, dispatch_uid="approvals-notify")
def approval_changed(sender, kind, workload_id, **kwargs):
    live.group_send(group_for(kind), {"type": kind, "workload": workload_id})
