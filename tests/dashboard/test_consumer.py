"""The live socket, over the real Redis channel layer, with Channels' WebsocketCommunicator."""

import asyncio
import json
import threading

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.test import Client

from broker.asgi import application
from broker.cycle.commit import CommitDelta
from broker.inventory.models import Device, Node
from broker.workloads.models import Allocation, Explanation, SchedulingCycle
from broker.workloads.states import State
from dashboard import broadcast
from dashboard.consumers import LiveConsumer

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

DELTA_KEYS = {
    "type",
    "cycle",
    "workloads",
    "rows_cut",
    "admitted",
    "hidden",
    "counters",
    "pending_by_reason",
    "capacity",
    "racks",
}


def communicator_for(user):
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    return communicator


def session_communicator(user):
    """Through the project's real ASGI stack: origin check, session cookie, auth middleware."""
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return WebsocketCommunicator(
        application,
        "/ws/live/",
        headers=[(b"cookie", cookie.encode()), (b"origin", b"http://testserver"), (b"host", b"testserver")],
    )


def admit_big_a(scene, cluster):
    """What a committed cycle would leave in the database: big-a admitted onto n2, secret-b re-explained."""
    workload = scene.a_wait
    workload.transition(State.ADMITTED)
    for index, device in enumerate(Device.objects.filter(node__name="n2").order_by("name")):
        Allocation.objects.create(
            workload=workload,
            device=device,
            device_class=cluster.h100,
            pod_set="main",
            pod_index=index,
            cycle=scene.cycle,
        )
    Explanation.objects.filter(workload=scene.b_wait).update(reason="InsufficientCapacity", message="cluster full")
    # The event exactly as the cycle commit broadcasts it.
    return CommitDelta(
        cycle=scene.cycle.pk, admitted=[scene.a_wait.pk], preempted=[], explanations=[scene.b_wait.pk]
    ).message()


async def receive_after_hello(communicator):
    hello = await communicator.receive_json_from(timeout=5)
    assert hello["type"] == "hello"


def test_it_rejects_an_anonymous_socket(scene):
    async def go():
        communicator = communicator_for(AnonymousUser())
        connected, code = await communicator.connect()
        assert connected is False
        assert code == 4401
        anonymous = WebsocketCommunicator(
            application, "/ws/live/", headers=[(b"origin", b"http://testserver"), (b"host", b"testserver")]
        )
        connected, _ = await anonymous.connect()
        assert connected is False

    async_to_sync(go)()


def test_it_accepts_a_logged_in_session_through_the_asgi_stack(scene, alice):
    communicator = session_communicator(alice)

    async def go():
        connected, _ = await communicator.connect()
        assert connected
        hello = await communicator.receive_json_from(timeout=5)
        # The last committed cycle: a page drawn at it has nothing to catch up.
        assert hello == {"type": "hello", "user": "alice", "cycle": scene.cycle.pk}
        await communicator.disconnect()

    async_to_sync(go)()


def test_it_sends_a_member_their_teams_details_and_only_counts_of_others(scene, cluster, alice):
    event = admit_big_a(scene, cluster)

    async def go():
        communicator = communicator_for(alice)
        assert (await communicator.connect())[0]
        await receive_after_hello(communicator)
        await get_channel_layer().group_send("cycle", event)
        delta = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return delta

    delta = async_to_sync(go)()
    assert set(delta) == DELTA_KEYS
    assert delta["type"] == "delta" and delta["cycle"] == scene.cycle.pk
    assert [row["name"] for row in delta["workloads"]] == ["big-a"]
    row = delta["workloads"][0]
    assert row["state"] == "Admitted" and row["reason"] == "" and row["where"] == "r1: n2 ×4"
    assert delta["admitted"] == [scene.a_wait.pk]
    assert delta["hidden"] == {"admitted": 0, "preempted": 0, "changed": 1}
    assert "secret-b" not in json.dumps(delta)
    assert "cluster full" not in json.dumps(delta)
    assert delta["counters"]["devices_busy"] == 10
    assert delta["counters"]["pending_mine"] == 0
    racks = {cell["id"]: cell for cell in delta["racks"]}
    assert set(racks) == {scene.r1.pk}
    assert racks[scene.r1.pk]["counts"]["busy"] == 8
    assert racks[scene.r1.pk]["teams"] == {"team-a": 8}
    assert delta["capacity"][0]["busy"] == 10


def test_it_sends_an_operator_every_teams_details(scene, cluster, olivia):
    event = admit_big_a(scene, cluster)

    async def go():
        communicator = communicator_for(olivia)
        assert (await communicator.connect())[0]
        await receive_after_hello(communicator)
        await get_channel_layer().group_send("cycle", event)
        delta = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return delta

    delta = async_to_sync(go)()
    rows = {row["name"]: row for row in delta["workloads"]}
    assert set(rows) == {"big-a", "secret-b"}
    assert rows["secret-b"]["reason"] == "InsufficientCapacity"
    assert rows["secret-b"]["message"] == "cluster full"
    assert delta["hidden"] == {"admitted": 0, "preempted": 0, "changed": 0}


def test_it_tells_sockets_of_a_cordon_with_the_racks_new_cells(scene, cluster, olivia, bob):
    async def go():
        watcher = communicator_for(bob)
        assert (await watcher.connect())[0]
        await receive_after_hello(watcher)
        await get_channel_layer().group_send("inventory", {"type": "inventory.changed", "racks": [scene.r2.pk]})
        delta = await watcher.receive_json_from(timeout=10)
        await watcher.disconnect()
        return delta

    Node.objects.filter(name="n4").update(cordoned=True)
    delta = async_to_sync(go)()
    assert set(delta) == DELTA_KEYS
    (cell,) = delta["racks"]
    assert cell["id"] == scene.r2.pk
    assert cell["counts"]["unhealthy"] == 4
    assert delta["workloads"] == []


def test_it_broadcasts_when_an_operator_cordons_on_the_page(scene, cluster, olivia):
    client = Client()
    client.force_login(olivia)
    node = Node.objects.get(name="n2")

    async def go():
        communicator = communicator_for(olivia)
        assert (await communicator.connect())[0]
        await receive_after_hello(communicator)
        response = await sync_to_async(client.post)(f"/nodes/{node.pk}/cordon/", {"cordoned": "true"})
        assert response.status_code == 302
        delta = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return delta

    delta = async_to_sync(go)()
    assert delta["racks"][0]["id"] == scene.r1.pk
    assert delta["racks"][0]["counts"]["unhealthy"] == 4


def test_it_merges_queued_events_into_the_last_cycles_with_every_workload_and_rack():
    events = [
        {"type": "cycle.committed", "cycle": 7, "admitted": [1, 2], "preempted": [], "explanations": [3]},
        {"type": "inventory.changed", "racks": [40]},
        {"type": "cycle.committed", "cycle": 8, "admitted": [4], "preempted": [2], "explanations": [3, 5]},
        {"type": "inventory.changed", "racks": [41, 40]},
    ]
    assert broadcast.merge_events(events) == {
        "type": "cycle.committed",
        "cycle": 8,
        "admitted": [1, 2, 4],
        "preempted": [2],
        "explanations": [3, 5],
        "racks": [40, 41],
    }
    assert broadcast.merge_events([events[1], events[3]]) == {"type": "inventory.changed", "racks": [40, 41]}
    assert broadcast.merge_events(events[:1]) is events[0]


def test_it_sends_a_socket_that_fell_behind_one_delta_for_the_events_that_queued(scene, cluster, olivia, monkeypatch):
    """While one delta is read, two more events arrive: the next delta covers both, at the last cycle,
    with the workloads of each, instead of two deltas one after the other."""
    reading = threading.Event()
    release = threading.Event()
    calls = []
    real_delta_for = broadcast.delta_for

    def slow_delta_for(user, events):
        calls.append([event.get("cycle") for event in events])
        if len(calls) == 1:
            reading.set()
            release.wait(10)
        return real_delta_for(user, events)

    monkeypatch.setattr(broadcast, "delta_for", slow_delta_for)
    first = admit_big_a(scene, cluster)
    later = SchedulingCycle.objects.create(outcome=SchedulingCycle.Outcome.COMMITTED)
    second = CommitDelta(cycle=later.pk, admitted=[], preempted=[], explanations=[scene.b_wait.pk]).message()

    async def go():
        communicator = communicator_for(olivia)
        assert (await communicator.connect())[0]
        await receive_after_hello(communicator)
        layer = get_channel_layer()
        await layer.group_send("cycle", first)
        await sync_to_async(reading.wait, thread_sensitive=False)(10)
        await layer.group_send("inventory", {"type": "inventory.changed", "racks": [scene.r2.pk]})
        await layer.group_send("cycle", second)
        await asyncio.sleep(0.5)  # both reach the consumer while the first delta is still being read
        release.set()
        deltas = [await communicator.receive_json_from(timeout=10) for _ in range(2)]
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
        return deltas

    first_delta, merged = async_to_sync(go)()
    assert calls == [[scene.cycle.pk], [None, later.pk]]
    assert first_delta["cycle"] == scene.cycle.pk
    assert merged["cycle"] == later.pk
    assert {row["name"] for row in merged["workloads"]} == {"secret-b"}
    assert {cell["id"] for cell in merged["racks"]} == {scene.r2.pk}


def test_it_says_when_a_delta_left_rows_out(scene, cluster, olivia, monkeypatch):
    """A page that shows single workloads reads its own rows when a delta could not carry them all."""
    event = admit_big_a(scene, cluster)
    assert broadcast.cycle_delta(olivia, event)["rows_cut"] is False
    monkeypatch.setattr(broadcast, "MAX_ROWS", 1)
    delta = broadcast.cycle_delta(olivia, event)
    assert delta["rows_cut"] is True
    assert len(delta["workloads"]) == 1
    assert broadcast.inventory_delta(olivia, {"racks": [scene.r1.pk]})["rows_cut"] is False
