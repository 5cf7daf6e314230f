"""Sockets through the real ASGI stack: the exact origin check, and sockets that close when their session
ends (logout, expiry), whatever the route."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from broker.asgi import application
from broker.sockets import SIGNED_OUT

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def signed_in_client(user):
    client = Client()
    client.force_login(user)
    return client


def socket(client, path="/ws/live/", origin=b"http://testserver", host=b"testserver"):
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    headers = [(b"cookie", cookie.encode()), (b"origin", origin), (b"host", host)]
    return WebsocketCommunicator(application, path, headers=headers)


def connects(client, **kwargs):
    async def go():
        communicator = socket(client, **kwargs)
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    return async_to_sync(go)()


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        (b"http://testserver", b"testserver", True),
        (b"http://testserver:80", b"testserver", True),
        (b"http://127.0.0.1:8000", b"127.0.0.1:8000", True),
        (b"http://127.0.0.1:8001", b"127.0.0.1:8000", False),  # same host, another port
        (b"http://testserver:8000", b"testserver", False),
        (b"https://testserver", b"testserver", False),  # another scheme
        (b"http://evil.example", b"testserver", False),
        (b"http://evil.example", b"evil.example", False),  # a host the site does not serve
        (b"null", b"testserver", False),
    ],
)
def test_it_accepts_only_the_exact_origin(cluster, alice, origin, host, allowed):
    assert connects(signed_in_client(alice), origin=origin, host=host) is allowed


def test_it_accepts_a_trusted_origin(cluster, alice, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://broker.example.com"]
    client = signed_in_client(alice)
    assert connects(client, origin=b"https://broker.example.com", host=b"testserver") is True
    assert connects(client, origin=b"https://broker.example.com:8443", host=b"testserver") is False


def cycle_event():
    return {"type": "cycle.committed", "cycle": 0, "admitted": [], "preempted": [], "explanations": []}


def end_session_then_expect_close(user, path, end):
    client = signed_in_client(user)

    async def go():
        communicator = socket(client, path=path)
        connected, _ = await communicator.connect()
        assert connected
        if path == "/ws/live/":
            assert (await communicator.receive_json_from(timeout=5))["type"] == "hello"
        await sync_to_async(end)(client)
        group = {"/ws/live/": "cycle", "/ws/costs/": "costs", "/ws/approvals/": "approvals"}[path]
        await get_channel_layer().group_send(group, cycle_event())
        message = await communicator.receive_output(timeout=5)
        assert message == {"type": "websocket.close", "code": SIGNED_OUT}
        await communicator.wait()

    async_to_sync(go)()


def log_out(client):
    assert client.post("/logout/").status_code == 302


def expire(client):
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))


@pytest.mark.parametrize("end", [log_out, expire], ids=["logout", "expiry"])
def test_the_live_socket_closes_when_its_session_ends(cluster, alice, end):
    end_session_then_expect_close(alice, "/ws/live/", end)


def test_a_live_socket_keeps_its_deltas_while_signed_in(cluster, alice):
    client = signed_in_client(alice)

    async def go():
        communicator = socket(client)
        await communicator.connect()
        await communicator.receive_json_from(timeout=5)
        await get_channel_layer().group_send("cycle", cycle_event())
        assert (await communicator.receive_json_from(timeout=5))["type"] == "delta"
        await communicator.disconnect()

    async_to_sync(go)()
