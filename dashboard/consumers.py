"""The live socket: one per open page, authenticated, filtered per user.

A socket that falls behind gets one delta for everything that queued while it was busy. Deltas are read
on the server's one thread for synchronous work, the thread that also draws the pages; during a burst
of cycles each socket's delta (its user's rows, counts and reasons) took longer to read than the next
cycle took to commit, so every socket sent a backlog of stale deltas, one after another, and the pages
showed the cluster seconds late and read their regions again for each. Each delta carries the full
current values, read when it is built, so the merged one is as true as the last event's would be, and
carries the workloads and racks of all of them (broadcast.merge_events).
"""

import asyncio
import contextlib
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from dashboard import broadcast

log = logging.getLogger(__name__)

# The channel layer's events that become deltas (a group message's type names its handler).
DELTA_EVENTS = ("cycle.committed", "inventory.changed")


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Joins the cycle and inventory groups; turns each event into this user's delta, read from the DB."""

    async def connect(self):
        self.waiting = []
        self.sender = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.joined = []
        for group in broadcast.GROUPS:
            await self.channel_layer.group_add(group, self.channel_name)
            self.joined.append(group)
        await self.accept()
        cycle = await database_sync_to_async(broadcast.last_cycle)()
        await self.send_json({"type": "hello", "user": user.get_username(), "cycle": cycle})

    async def disconnect(self, code):
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        sender = getattr(self, "sender", None)
        if sender is not None and not sender.done():
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender

    async def receive_json(self, content, **kwargs):
        if content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def dispatch(self, message):
        # Channels runs close_old_connections on the thread for synchronous work before each handler,
        # so an event could not even be queued while that thread reads a delta (or a page): the events
        # are queued here without it (delta_for, on that thread, closes old connections itself).
        if message.get("type") in DELTA_EVENTS:
            self.queue_delta(message)
            return
        await super().dispatch(message)

    def queue_delta(self, event):
        """Returns at once, so the channel layer hands over the next event while a delta is read."""
        self.waiting.append(event)
        if self.sender is None or self.sender.done():
            self.sender = asyncio.create_task(self.send_waiting())

    async def send_waiting(self):
        try:
            while self.waiting:
                events, self.waiting = self.waiting, []
                delta = await database_sync_to_async(broadcast.delta_for)(self.scope["user"], events)
                await self.send_json(delta)
        except Exception:
            # As when a handler fails: the socket closes, and the page reconnects and catches up.
            log.exception("could not send a live delta")
            await self.close(code=1011)
