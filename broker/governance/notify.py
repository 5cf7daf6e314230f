"""Channels groups for approvals: approvers learn of new and changed requests, admins of escalations.

Messages carry only a workload id; each consumer reads what its user may see from the database."""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

APPROVERS = "approvals"
ADMINS = "approvals.admins"


def send(group, kind, workload_id):
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": kind, "workload": workload_id}
    try:
        from broker.cycle import runner

        loop = runner.event_loop()
        if loop is not None:
            # The embedded server's in-memory layer lives on daphne's loop (as in cycle.commit.broadcast).
            import asyncio

            asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
        else:
            async_to_sync(layer.group_send)(group, message)
    except Exception:
        # The approvals page also lists everything on load: a lost message costs only the live update.
        log.warning("could not send %s for workload %s", kind, workload_id, exc_info=True)


def after_commit(group, kind, workload_id):
    transaction.on_commit(lambda: send(group, kind, workload_id))
