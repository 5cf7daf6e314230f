"""ws/approvals/ over the real ASGI stack and Redis channel layer: approvers hear of each new request."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from broker.asgi import application
from broker.governance import approvals
from broker.workloads import services
from tests.governance.helpers import submit

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def communicator(user):
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return WebsocketCommunicator(
        application,
        "/ws/approvals/",
        headers=[(b"cookie", cookie.encode()), (b"origin", b"http://testserver"), (b"host", b"testserver")],
    )


def test_it_tells_approvers_of_a_new_request_and_its_decision(cluster, alice, april):
    socket = communicator(april)

    async def go():
        connected, _ = await socket.connect()
        assert connected
        assert (await socket.receive_json_from(timeout=5))["groups"] == ["approvals"]
        workload = await sync_to_async(submit)(cluster, alice)
        assert await socket.receive_json_from(timeout=5) == {"type": "approval.requested", "workload": workload.pk}
        await sync_to_async(services.approve_workload)(workload, april, "fine")
        assert await socket.receive_json_from(timeout=5) == {"type": "approval.decided", "workload": workload.pk}
        await socket.disconnect()

    async_to_sync(go)()


def test_it_tells_admins_but_not_approvers_of_an_escalation(cluster, alice, april, adam, settings):
    settings.APPROVAL_ESCALATION_SECONDS = 0
    approver, admin = communicator(april), communicator(adam)

    async def go():
        for socket in (approver, admin):
            assert (await socket.connect())[0]
            await socket.receive_json_from(timeout=5)
        workload = await sync_to_async(submit)(cluster, alice)
        for socket in (approver, admin):
            assert (await socket.receive_json_from(timeout=5))["type"] == "approval.requested"
        assert await sync_to_async(approvals.escalate_overdue)() == [workload.pk]
        received = [await admin.receive_json_from(timeout=5) for _ in range(2)]
        assert {"type": "approval.escalated", "workload": workload.pk} in received
        assert await approver.receive_json_from(timeout=5) == {"type": "approval.updated", "workload": workload.pk}
        assert await approver.receive_nothing(timeout=0.5)
        for socket in (approver, admin):
            await socket.disconnect()

    async_to_sync(go)()
