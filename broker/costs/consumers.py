"""The live running-cost ticker over Channels: ws/costs/ pushes the month-to-date cost every few seconds."""

import asyncio
import contextlib
import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder

from broker.costs.ticker import running_cost
from broker.policy import roles

TICK_SECONDS = getattr(settings, "COST_TICKER_SECONDS", 5)


def may_read_costs(user):
    return roles.is_finance(user) or roles.is_operator(user)


class CostTickerConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not await database_sync_to_async(may_read_costs)(user):
            await self.close(code=4403)
            return
        await self.accept()
        self.ticking = asyncio.create_task(self.tick())

    async def disconnect(self, code):
        task = getattr(self, "ticking", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def tick(self):
        while True:
            payload = await database_sync_to_async(running_cost)()
            await self.send_json({"type": "cost.tick", **payload})
            await asyncio.sleep(TICK_SECONDS)

    @classmethod
    async def encode_json(cls, content):
        # Decimals and datetimes, as the REST API renders them.
        return json.dumps(content, cls=DjangoJSONEncoder)
