"""Sending to the live pages' Channels groups, from whichever thread announced the event.

The cycle and the services announce through broker.events; the receivers here (connected by
broker.cycle.apps) hand the news to the channel layer. In the embedded default the in-memory layer lives on
daphne's event loop (`manage.py serve` binds it here), so a send from the runner thread is handed to that
loop; elsewhere (Celery workers, the Redis layer) it is sent synchronously. A missing or broken layer
costs only the live update: the pages also catch up from the database.
"""

import asyncio
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.dispatch import receiver

from broker import events

log = logging.getLogger(__name__)

CYCLE_GROUP = "cycle"

_loop = {"loop": None}


def bind_event_loop(loop):
    """The ASGI server's event loop, for sends from the embedded runner's thread."""
    _loop["loop"] = loop


def event_loop():
    loop = _loop["loop"]
    return loop if loop is not None and loop.is_running() else None


def group_send(group, message):
    """Send `message` to `group`; returns False when it could not be sent (the failure is logged)."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        loop = event_loop()
        if loop is not None:
            asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
        else:
            async_to_sync(layer.group_send)(group, message)
    except Exception:
        log.warning("could not send %s to %s", message.get("type"), group, exc_info=True)
        return False
    return True


@receiver(events.cycle_committed, dispatch_uid="live-cycle-committed")
def cycle_committed(sender, message, **kwargs):
    group_send(CYCLE_GROUP, message)
