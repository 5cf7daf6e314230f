"""The live socket: one per open page, authenticated, filtered per user."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from dashboard import broadcast


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Joins the cycle and inventory groups; turns each event into this user's delta, read from the DB."""

    async def connect(self):
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

    async def receive_json(self, content, **kwargs):
        if content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def cycle_committed(self, event):
        delta = await database_sync_to_async(broadcast.cycle_delta)(self.scope["user"], event)
        await self.send_json(delta)

    async def inventory_changed(self, event):
        delta = await database_sync_to_async(broadcast.inventory_delta)(self.scope["user"], event)
        await self.send_json(delta)
