"""ws/approvals/: approvers hear of new, changed and decided requests; admins also of escalations.

Messages name a workload id only: the page fetches the row it shows, rendered for its user (a
request's own submitter gets no decision form), so nothing here decides what a user may see."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from broker.governance import notify
from broker.policy import roles


def groups_for(user):
    if not roles.is_approver(user):
        return []
    return [notify.APPROVERS, notify.ADMINS] if roles.is_admin(user) else [notify.APPROVERS]


class ApprovalsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.joined = await database_sync_to_async(groups_for)(user)
        if not self.joined:
            await self.close(code=4403)
            return
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "hello", "user": user.get_username(), "groups": self.joined})

    async def disconnect(self, code):
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        if content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def forward(self, event):
        await self.send_json({"type": event["type"], "workload": event["workload"]})

    approval_requested = forward
    approval_updated = forward
    approval_decided = forward
    approval_escalated = forward
